"""``agentnest serve``: the authenticated HTTP API, and ``agentnest serve token`` to manage its tokens."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..config import parse_size
from ..errors import ConfigurationError
from ._output import Commands, add_command, int_in, positive_float, print_table

_EPILOG = """\
Every call needs `Authorization: Bearer <token>`.  A token's ceiling bounds what
it may ask for (backends, images, memory, CPUs, PIDs, lifetime, network,
number of sandboxes); asking for more is refused (HTTP 403), never clamped.
Sandboxes belong to their token: another token gets 404.  The server binds
127.0.0.1 unless told otherwise, and refuses any other address without TLS
(--tls-cert/--tls-key) or an explicit --insecure-bind.  Needs the server
extra: pip install 'agentnest[server]'.  Details: docs/server.md.

examples:
  agentnest serve token create --name ci --max-memory 1g --max-sandboxes 8
  agentnest serve                                   # http://127.0.0.1:8700
  agentnest serve --backend docker --backend gvisor --port 9000
  agentnest serve --host 0.0.0.0 --tls-cert cert.pem --tls-key key.pem
  agentnest serve --openapi > openapi.json          # the spec, without serving
  agentnest serve token list
  agentnest serve token revoke ci
"""


def register(commands: Commands) -> None:
    """Add ``serve`` (and ``serve token``) to the command line."""
    parser = add_command(
        commands,
        "serve",
        "serve sandboxes over an authenticated HTTP API (bearer tokens)",
        "Run the AgentNest HTTP API: sandboxes for clients holding a token, within its ceiling.",
        _EPILOG,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8700, help="port (default 8700)")
    _tokens_option(parser)
    parser.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help="a backend tokens may be granted (repeat it; the first is the default; default: docker)",
    )
    parser.add_argument("--image", help="the default image (default: the base image)")
    parser.add_argument(
        "--max-sandboxes",
        type=_count,
        default=64,
        metavar="N",
        help="live sandboxes, all tokens (default 64)",
    )
    parser.add_argument(
        "--capacity-memory",
        metavar="SIZE",
        help="memory all sandboxes may hold together (default: what the backend reports, e.g. docker info)",
    )
    parser.add_argument(
        "--capacity-cpus",
        type=positive_float,
        metavar="N",
        help="CPUs all sandboxes may hold together (default: what the backend reports)",
    )
    parser.add_argument(
        "--aging",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="a queued create moves up one priority band after this long (default 30)",
    )
    parser.add_argument(
        "--max-queue",
        type=_count,
        default=4096,
        metavar="N",
        help="creates waiting at once, all tenants (default 4096)",
    )
    parser.add_argument(
        "--pools",
        type=Path,
        metavar="FILE",
        help='warm pools, a JSON (or YAML) file: {"pools": [{"name": "py", "min": 2, "max": 8}]}',
    )
    parser.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this certificate")
    parser.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's private key")
    parser.add_argument(
        "--insecure-bind",
        action="store_true",
        help="allow plain HTTP on an address other than loopback (tokens then cross the network in clear)",
    )
    parser.add_argument("--audit-log", type=Path, metavar="PATH", help="the JSONL audit log")
    parser.add_argument("--no-audit-log", action="store_true", help="do not write the JSONL audit log")
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="server log lines: text, or one JSON object per line for log shippers (default text)",
    )
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info", help="(default info)"
    )
    _database_option(parser)
    parser.add_argument(
        "--no-database",
        action="store_true",
        help="keep no audit and usage database (/v1/audit and /v1/usage then answer 409)",
    )
    parser.add_argument(
        "--retention",
        type=_days,
        default=30.0,
        metavar="DAYS",
        help="days of audit and usage history the database keeps; 0 keeps everything (default 30)",
    )
    parser.add_argument(
        "--server-timeout",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="a server sharing the database silent this long counts as gone: its sandboxes are "
        "ended in the history and removed from the backend where reachable (default 60)",
    )
    parser.add_argument(
        "--leader-lease",
        type=positive_float,
        default=15.0,
        metavar="SECONDS",
        help="replicas sharing PostgreSQL elect a leader (it sweeps gone servers and applies the "
        "retention); a successor takes over within this time (default 15)",
    )
    parser.add_argument(
        "--advertise-url",
        default=os.environ.get("AGENTNEST_ADVERTISE_URL") or None,
        metavar="URL",
        help="where the other replicas sharing PostgreSQL reach this server (http://POD_IP:8700); "
        "requests for its sandboxes that reach them are forwarded here (default: "
        "$AGENTNEST_ADVERTISE_URL, else http://HOST:PORT when --host is a specific address)",
    )
    parser.add_argument(
        "--approvals",
        default=None,
        metavar="RULES.yaml",
        help="approval rules asked before every operation in every sandbox, whichever API it came "
        "through ({default, rules: [{kind, match, action}]}; docs/guard.md); the raw agent channel "
        "(the remote backend) is then refused",
    )
    parser.add_argument(
        "--no-e2b",
        action="store_true",
        help="do not serve the E2B-compatible API on this port (docs/e2b.md); it is on by default",
    )
    parser.add_argument(
        "--e2b-template",
        action="append",
        default=None,
        metavar="NAME=WHAT",
        help="what an E2B template name means here: NAME=pool:POOL, NAME=image:IMAGE[@BACKEND], "
        "NAME=profile:PROFILE (from $AGENTNEST_PROFILE_FILE or ./agentnest.yaml) or NAME=default "
        "(repeatable; default: base and code-interpreter-v1 on the default image)",
    )
    parser.add_argument(
        "--e2b-domain",
        default=None,
        metavar="DOMAIN",
        help="answer E2B host names {port}-{id}.DOMAIN too (E2B_DOMAIN clients, behind a TLS proxy)",
    )
    parser.add_argument(
        "--no-migrate",
        action="store_true",
        help="do not migrate the database at start; refuse to serve until `serve db upgrade` has",
    )
    parser.add_argument(
        "--no-tracing",
        action="store_true",
        help="make no OpenTelemetry spans (by default requests, admissions and starts are spans "
        "where opentelemetry-api is installed; run under opentelemetry-instrument to export them)",
    )
    parser.add_argument("--openapi", action="store_true", help="print the OpenAPI document and exit")
    parser.set_defaults(handler=handle)

    sub = parser.add_subparsers(dest="serve_command", metavar="token|tenant|db", title="management")
    token = sub.add_parser(
        "token",
        help="create, list or revoke tokens",
        description="Manage the server's bearer tokens (stored hashed in the token file).",
        epilog=_TOKENS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)

    create = _action(actions, "create", "create a token and print its secret once", _CREATE_EPILOG)
    _tokens_option(create)
    create.add_argument("--name", required=True, help="a name for people (unique)")
    create.add_argument(
        "--backend", action="append", default=[], metavar="NAME", help="a backend it may use (repeat)"
    )
    create.add_argument(
        "--image", action="append", default=[], metavar="PATTERN", help="an image glob it may use (repeat)"
    )
    create.add_argument(
        "--max-sandboxes", type=_count_or_zero, metavar="N", help="live sandboxes (default 4)"
    )
    create.add_argument("--max-memory", metavar="SIZE", help="memory per sandbox, e.g. 1g (default 512m)")
    create.add_argument("--max-cpus", type=positive_float, metavar="N", help="CPUs per sandbox (default 1)")
    create.add_argument("--max-pids", type=_count, metavar="N", help="processes per sandbox (default 256)")
    create.add_argument(
        "--max-timeout", type=positive_float, metavar="SECONDS", help="longest lifetime (default 3600)"
    )
    create.add_argument(
        "--network",
        action="append",
        default=[],
        choices=("denied", "allowlist", "open"),
        help="a network mode it may ask for (repeat; default: denied only)",
    )
    create.add_argument(
        "--domain",
        action="append",
        default=[],
        metavar="PATTERN",
        help="allowlist domains it may name (repeat)",
    )
    create.add_argument("--writable-root", action="store_true", help="it may ask for a writable root")
    create.add_argument("--expires-in", type=positive_float, metavar="SECONDS", help="the token expires then")
    create.add_argument(
        "--tenant", default="default", metavar="NAME", help="the tenant it belongs to (default: default)"
    )
    create.add_argument(
        "--admin", action="store_true", help="it may manage tenants over the HTTP API (/v1/tenants)"
    )
    create.add_argument("--json", action="store_true", help="print the token as JSON")
    create.set_defaults(handler=handle_create)

    listing = _action(
        actions,
        "list",
        "list the tokens (never their secrets)",
        "examples:\n  agentnest serve token list\n  agentnest serve token list --json | jq '.[].name'\n",
    )
    _tokens_option(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=handle_list)

    revoke = _action(
        actions,
        "revoke",
        "remove a token (a running server notices at once)",
        "examples:\n  agentnest serve token revoke ci          # by name\n"
        "  agentnest serve token revoke k3v9x2m1q8zd  # by id\n",
    )
    _tokens_option(revoke)
    revoke.add_argument("token", metavar="ID_OR_NAME")
    revoke.set_defaults(handler=handle_revoke)

    _register_tenants(sub)
    _register_db(sub)


_TENANTS_HELP = """\
A tenant is a team or an application sharing the server.  Each token belongs
to one (`default` unless `token create --tenant` says otherwise); a tenant's
caps bound what all its tokens hold together, its weight is its share when
tenants compete, and its band (high, normal, low) orders the admission queue.
Tenants live in the token file; a running server applies changes at once.

examples:
  agentnest serve tenant create team-a --weight 2 --max-sandboxes 20 --max-memory 16g
  agentnest serve token create --name a-ci --tenant team-a
  agentnest serve tenant update team-a --rate 10 --burst 20
  agentnest serve tenant list
  agentnest serve tenant delete team-a
"""


def _tenant_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weight", type=positive_float, help="its share when tenants compete (default 1)")
    parser.add_argument("--priority", choices=("high", "normal", "low"), help="its band (default normal)")
    parser.add_argument("--max-sandboxes", type=_count_or_zero, metavar="N", help="held at once (default 16)")
    parser.add_argument("--max-memory", metavar="SIZE", help="memory held at once (default 16g)")
    parser.add_argument("--max-cpus", type=positive_float, metavar="N", help="CPUs held at once (default 16)")
    parser.add_argument(
        "--max-lifetime", type=positive_float, metavar="SECONDS", help="longest sandbox (default 86400)"
    )
    parser.add_argument("--rate", type=positive_float, metavar="N", help="creates per second (default 5)")
    parser.add_argument(
        "--burst", type=_count, metavar="N", help="creates at once after a pause (default 10)"
    )
    parser.add_argument("--max-queued", type=_count_or_zero, metavar="N", help="waiting at once (default 64)")
    parser.add_argument(
        "--default-wait",
        type=_seconds,
        metavar="SECONDS",
        help="queue wait when a create names none (default 30)",
    )
    parser.add_argument(
        "--max-wait",
        type=_seconds,
        metavar="SECONDS",
        help="the longest wait a create may ask for (default 300)",
    )


_TENANT_FIELDS = (
    "weight",
    "priority",
    "max_sandboxes",
    "max_memory",
    "max_cpus",
    "max_lifetime",
    "rate",
    "burst",
    "max_queued",
    "default_wait",
    "max_wait",
)


def _register_tenants(sub: Any) -> None:
    tenant = sub.add_parser(
        "tenant",
        help="create, list, update or delete tenants",
        description="Manage the server's tenants (stored in the token file).",
        epilog=_TENANTS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = tenant.add_subparsers(dest="tenant_command", metavar="ACTION", required=True)
    create = _action(actions, "create", "create a tenant", _TENANTS_HELP)
    _tokens_option(create)
    create.add_argument("name", help="lowercase letters, digits and '-' (a DNS label)")
    _tenant_options(create)
    create.set_defaults(handler=handle_tenant_create)
    update = _action(actions, "update", "change some of a tenant's settings", _TENANTS_HELP)
    _tokens_option(update)
    update.add_argument("name")
    _tenant_options(update)
    update.set_defaults(handler=handle_tenant_update)
    listing = _action(actions, "list", "list the tenants", _TENANTS_HELP)
    _tokens_option(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=handle_tenant_list)
    delete = _action(actions, "delete", "delete a tenant no token belongs to", _TENANTS_HELP)
    _tokens_option(delete)
    delete.add_argument("name")
    delete.set_defaults(handler=handle_tenant_delete)


_DB_HELP = """\
The manager's audit history and usage live in one database: a SQLite file by
default ($XDG_STATE_HOME/agentnest/manager.db), or PostgreSQL for replicas
(--database postgresql://USER:PASS@HOST:5432/DB, or $AGENTNEST_DATABASE_URL).
`agentnest serve` migrates it at start unless --no-migrate; `db upgrade` does
it ahead of a rollout, `db current` shows where it is.

examples:
  agentnest serve db current
  agentnest serve db upgrade --database postgresql://agentnest@db:5432/agentnest
"""


def _register_db(sub: Any) -> None:
    db = sub.add_parser(
        "db",
        help="migrate the audit and usage database, or show its migration",
        description="Manage the server's audit and usage database schema.",
        epilog=_DB_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    upgrade = _action(actions, "upgrade", "migrate the database to this version's schema", _DB_HELP)
    _database_option(upgrade)
    upgrade.set_defaults(handler=handle_db_upgrade)
    current = _action(actions, "current", "print the database's migration and this version's", _DB_HELP)
    _database_option(current)
    current.set_defaults(handler=handle_db_current)


def _database_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database",
        metavar="URL",
        help="sqlite:///PATH or postgresql://USER:PASS@HOST:PORT/DB "
        "(default: $AGENTNEST_DATABASE_URL, else $XDG_STATE_HOME/agentnest/manager.db)",
    )


def _database(args: argparse.Namespace) -> Any:
    from ..server.db import Database, default_database_url

    return Database(args.database or default_database_url())


def handle_db_upgrade(args: argparse.Namespace) -> int:
    db = _database(args)
    try:
        before, after = db.upgrade()
    finally:
        db.close()
    if before == after:
        print(f"{db.display}: already at {after}", file=sys.stderr)
    else:
        print(f"{db.display}: migrated from {before or 'nothing'} to {after}", file=sys.stderr)
    return 0


def handle_db_current(args: argparse.Namespace) -> int:
    db = _database(args)
    try:
        current, head = db.revision(), db.head()
    finally:
        db.close()
    state = "up to date" if current == head else "needs `agentnest serve db upgrade`"
    print(f"{db.display}: at {current or 'nothing'}, this version needs {head} ({state})")
    return 0 if current == head else 1


def _tenant_changes(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in _TENANT_FIELDS if getattr(args, name) is not None}


def handle_tenant_create(args: argparse.Namespace) -> int:
    from ..server.tenants import Tenant

    tenant = _store(args).create_tenant(Tenant.from_dict({"name": args.name, **_tenant_changes(args)}))
    print(f"tenant {tenant.name}: {tenant.describe()}", file=sys.stderr)
    return 0


def handle_tenant_update(args: argparse.Namespace) -> int:
    changes = _tenant_changes(args)
    if not changes:
        raise ConfigurationError("nothing to change: pass at least one option (see --help)")
    tenant = _store(args).update_tenant(args.name, changes)
    print(f"tenant {tenant.name}: {tenant.describe()}", file=sys.stderr)
    return 0


def handle_tenant_list(args: argparse.Namespace) -> int:
    store = _store(args)
    tenants = store.tenants()
    if args.json:
        print(json.dumps([t.to_dict() for t in tenants], indent=1))
        return 0
    tokens: dict[str, int] = {}
    for token in store.list():
        tokens[token.tenant] = tokens.get(token.tenant, 0) + 1
    print_table(
        ["NAME", "TOKENS", "SETTINGS"], [[t.name, str(tokens.get(t.name, 0)), t.describe()] for t in tenants]
    )
    return 0


def handle_tenant_delete(args: argparse.Namespace) -> int:
    tenant = _store(args).delete_tenant(args.name)
    print(f"deleted tenant {tenant.name}", file=sys.stderr)
    return 0


_TOKENS_HELP = """\
Tokens live in the token file (--tokens, $AGENTNEST_TOKEN_FILE, else
~/.config/agentnest/tokens.json), hashed; a secret is shown once, at creation.

examples:
  agentnest serve token create --name ci --max-memory 1g --max-sandboxes 8
  agentnest serve token list
  agentnest serve token revoke ci
"""

_CREATE_EPILOG = """\
The secret is printed once on stdout; store it then.  Every --max-* is the
most the token may ask for; without one, the default in parentheses holds.

examples:
  agentnest serve token create --name ci
  agentnest serve token create --name agents --backend gvisor --max-memory 2g --expires-in 86400
  agentnest serve token create --name web --network allowlist --domain pypi.org --json
"""


def _action(commands: Any, name: str, summary: str, epilog: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=summary[:1].upper() + summary[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _tokens_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokens",
        type=Path,
        metavar="PATH",
        help="the token file (default: $AGENTNEST_TOKEN_FILE, ~/.config/agentnest/tokens.json)",
    )


#: Port (0: any free one) and count option types.
_port = int_in(0, 65535, "a port number")
_count = int_in(1, 100_000)


def _seconds(text: str) -> float:
    """A queue wait: 0 to 600 seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 600:
        raise argparse.ArgumentTypeError(f"{text!r} is not from 0 to 600 seconds")
    return value


def _days(text: str) -> float:
    """A retention in days; 0 keeps everything."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not 0 <= value <= 36_500:
        raise argparse.ArgumentTypeError(f"{text!r} is not from 0 to 36500 days")
    return value


def _count_or_zero(text: str) -> int:
    return 0 if text.strip() == "0" else _count(text)


def _store(args: argparse.Namespace) -> Any:
    from ..server.auth import TokenStore, default_token_file

    return TokenStore(args.tokens or default_token_file())


def check_bind(host: str, tls: bool, insecure: bool) -> None:
    """Refuse plain HTTP on an address other than loopback unless ``--insecure-bind``.

    Bearer tokens in clear text on a network are as good as published; on
    loopback only local processes see them.
    """
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not tls and not insecure:
        raise ConfigurationError(
            f"--host {host}: refusing plain HTTP on an address other than loopback (tokens would cross "
            "the network in clear text); pass --tls-cert and --tls-key, put a TLS proxy in front of a "
            "loopback server, or pass --insecure-bind on a network you trust"
        )


def settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~agentnest.server.app.ServerSettings` the options describe."""
    from ..audit import JsonLogObserver
    from ..profiles import load_rules
    from ..server.app import ServerSettings
    from ..server.pools import load_pools

    observers = []
    if not args.no_audit_log:
        observers.append(JsonLogObserver(args.audit_log))
    elif args.audit_log is not None:
        raise ConfigurationError("pass either --audit-log PATH or --no-audit-log, not both")
    names = args.backend or ["docker"]
    if len(set(names)) != len(names):
        raise ConfigurationError("each --backend may be given once")
    return ServerSettings(
        tokens=_store(args),
        backends={name: name for name in names},
        image=args.image,
        max_sandboxes=args.max_sandboxes,
        observers=tuple(observers),
        capacity_memory=None
        if args.capacity_memory is None
        else parse_size(args.capacity_memory, "--capacity-memory"),
        capacity_cpus=args.capacity_cpus,
        aging=args.aging,
        max_queue=args.max_queue,
        pools=() if args.pools is None else tuple(load_pools(args.pools)),
        database=_database_url(args),
        retention=args.retention * 86400 if args.retention else None,
        migrate=not args.no_migrate,
        tracing=not args.no_tracing,
        server_timeout=args.server_timeout,
        leader_lease=args.leader_lease,
        advertise_url=_advertise_url(args),
        approvals=None if args.approvals is None else load_rules(args.approvals),
        e2b=not args.no_e2b,
        e2b_templates=_e2b_templates(args.e2b_template),
        e2b_domain=args.e2b_domain,
    )


def _e2b_templates(given: list[str] | None) -> dict[str, Any]:
    from ..profiles import find_profile_file, load_profiles
    from ..server.e2b import DEFAULT_TEMPLATES, E2BTemplate

    if not given:
        return dict(DEFAULT_TEMPLATES)

    def profile(name: str) -> Any:
        path = find_profile_file()
        if path is None:
            raise ConfigurationError(
                f"--e2b-template names profile {name!r}, but there is no profile file: set "
                "$AGENTNEST_PROFILE_FILE or put agentnest.yaml in the working directory"
            )
        return load_profiles(path).get(name)

    templates = dict(E2BTemplate.parse(text, profile) for text in given)
    if len(templates) != len(given):
        raise ConfigurationError("each --e2b-template NAME may be given once")
    return templates


def _advertise_url(args: argparse.Namespace) -> str | None:
    """``--advertise-url``, else this server's own address when it is one the others can use."""
    if args.advertise_url:
        return str(args.advertise_url)
    if args.host in ("0.0.0.0", "::", ""):  # noqa: S104 - a comparison, nothing is bound here
        return None  # every address: which one the others reach is unknown; say it with the flag
    scheme = "https" if getattr(args, "tls_cert", None) else "http"
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"{scheme}://{host}:{args.port}"


def _database_url(args: argparse.Namespace) -> str | None:
    from ..server.db import default_database_url, parse_url

    if args.no_database:
        if args.database is not None:
            raise ConfigurationError("pass either --database URL or --no-database, not both")
        return None
    url = args.database or default_database_url()
    parse_url(url)  # a bad URL is an error now, not a log line once serving
    return str(url)


def handle(args: argparse.Namespace) -> int:
    """Serve until interrupted (every sandbox is destroyed on the way out)."""
    from ..server.app import create_app, openapi_document

    if args.openapi:
        from ..server.app import ServerSettings
        from ..server.auth import TokenStore

        # The spec depends on neither the tokens nor the engine (nothing is read or started).
        spec = ServerSettings(tokens=TokenStore("/nonexistent/agentnest-tokens.json"), image="IMAGE")
        sys.stdout.write(openapi_document(create_app(spec)))
        return 0
    tls = args.tls_cert is not None or args.tls_key is not None
    if tls and (args.tls_cert is None or args.tls_key is None):
        raise ConfigurationError("--tls-cert and --tls-key go together")
    check_bind(args.host, tls, args.insecure_bind)
    settings = settings_from_args(args)
    if not settings.tokens.list():
        print(
            f"warning: no tokens in {settings.tokens.path}; create one with "
            "`agentnest serve token create --name NAME`",
            file=sys.stderr,
        )
    import uvicorn

    from ..server.logs import configure

    log_config = configure(args.log_format, args.log_level)
    app = create_app(settings)
    scheme = "https" if tls else "http"
    print(
        f"agentnest serve: {scheme}://{args.host}:{args.port} (tokens: {settings.tokens.path})",
        file=sys.stderr,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        ssl_certfile=str(args.tls_cert) if tls else None,
        ssl_keyfile=str(args.tls_key) if tls else None,
        log_level=args.log_level,
        log_config=log_config,
        # Our own websocket limit: agent frames are at most ~2 MiB (protocol.py).
        ws_max_size=4 * 1024 * 1024,
        ws_per_message_deflate=False,
        server_header=False,
    )
    return 0


def handle_create(args: argparse.Namespace) -> int:
    from ..server.token_admin import describe_ceiling, parse_ceiling_options

    ceiling = parse_ceiling_options(
        backends=args.backend,
        images=args.image,
        max_sandboxes=args.max_sandboxes,
        max_memory=args.max_memory,
        max_cpus=args.max_cpus,
        max_pids=args.max_pids,
        max_timeout=args.max_timeout,
        network=args.network,
        domains=args.domain,
        writable_root=args.writable_root,
    )
    store = _store(args)
    token, secret = store.create(
        args.name, ceiling, expires_in=args.expires_in, tenant=args.tenant, admin=args.admin
    )
    from ..server.e2b import e2b_key

    if args.json:
        print(json.dumps({**token.to_dict(), "secret": secret, "e2b_api_key": e2b_key(secret)}, indent=1))
    else:
        print(secret)
        print(
            f"token {token.id} ({token.name}, tenant {token.tenant}{', admin' if token.admin else ''}) "
            f"stored hashed in {store.path}; the secret above is shown only now.  "
            f"Ceiling: {describe_ceiling(ceiling)}\n"
            # Every E2B SDK takes this form (2.25 to 2.45 take no other); the secret works from 2.46.
            f"For E2B SDKs: E2B_API_KEY={e2b_key(secret)}",
            file=sys.stderr,
        )
    return 0


def handle_list(args: argparse.Namespace) -> int:
    from ..server.token_admin import describe_ceiling

    tokens = _store(args).list()
    if args.json:
        print(json.dumps([t.to_dict() for t in tokens], indent=1))
        return 0
    now = time.time()
    rows = []
    for t in tokens:
        if t.expires is None:
            expires = "never"
        elif t.expired(now):
            expires = "EXPIRED"
        else:
            expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(t.expires))
        rows.append(
            [t.id, t.name, t.tenant + (" (admin)" if t.admin else ""), expires, describe_ceiling(t.ceiling)]
        )
    print_table(["ID", "NAME", "TENANT", "EXPIRES", "CEILING"], rows)
    return 0


def handle_revoke(args: argparse.Namespace) -> int:
    token = _store(args).revoke(args.token)
    print(f"revoked token {token.id} ({token.name})", file=sys.stderr)
    return 0
