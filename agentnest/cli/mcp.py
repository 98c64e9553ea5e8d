"""``agentnest mcp``: serve sandboxes to an MCP client over stdio or streamable HTTP."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ._output import Commands, add_command, add_profile_options, int_in, positive_float, profile_from_args

_EPILOG = """\
Tools: create_sandbox, exec_shell, exec_python, session_run, read_file,
write_file, list_files, fork, snapshot, restore, destroy, list_sandboxes.
Resources: agentnest://audit, agentnest://sandboxes/{id}/audit.

The server's settings are the ceiling: a client may ask for less memory,
fewer CPUs or a shorter lifetime, never more, and only for images the policy
allows (without allowed_images in the profile: only the server's image).
Every sandbox is destroyed when the server stops, and stops by itself at the
end of its lifetime even if the server is killed.  Events go to the audit
log ($AGENTNEST_AUDIT_LOG or ~/.local/state/agentnest/audit.jsonl) unless
--no-audit-log.  HTTP has no authentication: it binds to loopback only.
Needs the MCP SDK: pip install 'agentnest[mcp]'.  Details: docs/mcp.md.

examples:
  agentnest mcp                                     # stdio, for Claude Code, Cursor, Claude Desktop
  claude mcp add agentnest -- agentnest mcp --backend gvisor
  agentnest mcp --transport http --port 8765        # http://127.0.0.1:8765/mcp
  agentnest mcp --profile strict --max-sandboxes 4
  agentnest mcp --allow-preset browser              # create_sandbox(preset="browser") and browse
"""


def register(commands: Commands) -> None:
    """Add ``mcp`` to the command line."""
    parser = add_command(
        commands,
        "mcp",
        "serve sandboxes as MCP tools (stdio or streamable HTTP)",
        "Run a Model Context Protocol server whose tools create and use sandboxes.",
        _EPILOG,
    )
    parser.add_argument(
        "--transport", choices=("stdio", "http"), default="stdio", help="stdio (default) or streamable HTTP"
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address, loopback only (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--backend", help="docker (runc) or gvisor (runsc), or a plug-in (default: docker)")
    parser.add_argument("--image", help="image of every sandbox (default: the profile's or the base image)")
    add_profile_options(parser, "settings and policy (the ceiling)")
    parser.add_argument(
        "--max-sandboxes", type=_count, default=8, metavar="N", help="live sandboxes at once (default 8)"
    )
    parser.add_argument(
        "--lifetime",
        type=positive_float,
        metavar="SECONDS",
        help="default lifetime of a sandbox (default: the profile's timeout, else 600)",
    )
    parser.add_argument(
        "--max-lifetime",
        type=positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="the longest lifetime a client may ask for (default 3600)",
    )
    parser.add_argument(
        "--allow-preset",
        action="append",
        choices=("browser",),
        default=[],
        metavar="NAME",
        help="let clients create sandboxes of this preset (browser: Chromium, and the browse tool)",
    )
    parser.add_argument("--audit-log", type=Path, metavar="PATH", help="the JSONL audit log (see below)")
    parser.add_argument("--no-audit-log", action="store_true", help="do not write the JSONL audit log")
    parser.add_argument(
        "--snapshot-dir",
        type=Path,
        metavar="DIR",
        help="keep snapshots here (default: a private directory removed when the server stops)",
    )
    parser.set_defaults(handler=handle)


#: Port and sandbox-count option types.
_port = int_in(1, 65535, "a port number")
_count = int_in(1, 1000)


def check_host(host: str) -> str:
    """Refuse an HTTP address other than loopback: the server has no authentication.

    Exactly the addresses for which the MCP SDK turns on its DNS-rebinding
    protection (Host and Origin checks), so that a web page the user opens
    cannot reach the server through a name that resolves to 127.0.0.1.
    """
    if host not in _LOOPBACK:
        raise ConfigurationError(
            f"--host {host}: agentnest mcp has no authentication, so it serves loopback only "
            f"({', '.join(_LOOPBACK)}); for remote clients use `agentnest serve` (bearer tokens) "
            "or an authenticating proxy in front of a loopback server"
        )
    return host


_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~agentnest.mcp.ServerSettings` the options describe."""
    from ..audit import JsonLogObserver
    from ..mcp import DEFAULT_LIFETIME, ServerSettings
    from ..policy import SecurityPolicy

    kwargs: dict[str, Any] = {}
    policy = SecurityPolicy()
    backend = "docker"
    lifetime = DEFAULT_LIFETIME
    profile = profile_from_args(args)
    if profile is not None:
        kwargs = profile.sandbox_kwargs()
        policy = kwargs.pop("security_policy")
        backend = kwargs.pop("backend", backend)
        lifetime = kwargs.pop("timeout", lifetime)
    if args.backend:
        backend = args.backend
    if args.image:
        kwargs["image"] = args.image
    if args.lifetime is not None:
        lifetime = args.lifetime
    observers = []
    if not args.no_audit_log:
        observers.append(JsonLogObserver(args.audit_log))
    elif args.audit_log is not None:
        raise ConfigurationError("pass either --audit-log PATH or --no-audit-log, not both")
    return ServerSettings(
        backend=backend,
        policy=policy,
        sandbox_kwargs=kwargs,
        lifetime=lifetime,
        max_lifetime=max(args.max_lifetime, lifetime) if args.lifetime is None else args.max_lifetime,
        max_sandboxes=args.max_sandboxes,
        snapshot_dir=args.snapshot_dir,
        observers=tuple(observers),
        presets=tuple(dict.fromkeys(args.allow_preset)),
    )


def handle(args: argparse.Namespace) -> int:
    """Serve until the client goes away (stdio) or the process is interrupted (HTTP)."""
    from ..mcp import run

    if args.transport == "http":
        check_host(args.host)
    settings = settings_from_args(args)
    run(settings, args.transport, host=args.host, port=args.port)
    return 0
