"""``agentnest audit --server URL``: the manager's audit history and usage over its HTTP API.

Plain ``urllib`` (no extra needed on the reading side).  ``--follow`` is a
loop of long polls (``GET /v1/audit?after=CURSOR&wait=20``): each answers as
soon as a newer event is written, so nothing is missed between pages and no
event is printed twice.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError
from ._output import error, print_table

#: Seconds each long poll of --follow waits on the server.
_LONG_POLL = 20.0
#: Events per page.
_PAGE = 500
#: Largest answer read (a page of 500 events is far below it).
_MAX_BODY = 32 * 1024 * 1024


class ServerError(Exception):
    """The server answered with an error, or could not be reached."""


def _request(base: str, token: str, path: str, params: list[tuple[str, str]], timeout: float) -> Any:
    url = f"{base.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    req = urllib.request.Request(  # noqa: S310 (the scheme is http or https: _target checks it)
        url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:  # noqa: S310 (http/https checked)
            body = answer.read(_MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read(64 * 1024)).get("error", {}).get("message") or exc.reason
        except (ValueError, AttributeError):
            detail = exc.reason
        raise ServerError(f"{base} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ServerError(f"cannot reach {base}: {reason}") from None
    if len(body) > _MAX_BODY:
        raise ServerError(f"{base} sent more than {_MAX_BODY} bytes")
    try:
        return json.loads(body)
    except ValueError:
        raise ServerError(f"{base} sent something that is not JSON") from None


def _target(args: argparse.Namespace) -> tuple[str, str]:
    base = str(args.server)
    if urllib.parse.urlsplit(base).scheme not in ("http", "https"):
        raise ConfigurationError(f"--server {base!r}: give the server's http:// or https:// URL")
    token = args.token or os.environ.get("AGENTNEST_REMOTE_TOKEN")
    if not token:
        raise ConfigurationError("--server needs a token: pass --token or set AGENTNEST_REMOTE_TOKEN")
    return base, token


def handle_server(
    args: argparse.Namespace,
    show: Callable[[dict[str, Any]], str],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the server's events (or usage) matching the options; ``--follow`` keeps going."""
    base, token = _target(args)
    if args.usage:
        return _usage(args, base, token)
    params: list[tuple[str, str]] = []
    if args.tenant:
        params.append(("tenant", args.tenant))
    if args.sandbox:
        params.append(("sandbox", args.sandbox))
    for kind in args.types or ():
        params.append(("type", kind))
    if args.since is not None:
        params.append(("since", repr(args.since)))
    if args.until is not None:
        params.append(("until", repr(args.until)))
    limit: int | None = args.max_events
    printed = 0
    after = 0
    failures = 0
    while True:
        wait = _LONG_POLL if args.follow else 0.0
        try:
            page = _request(
                base,
                token,
                "/v1/audit",
                [*params, ("after", str(after)), ("limit", str(_PAGE)), ("wait", str(wait))],
                timeout=wait + 30.0,
            )
            events, cursor = _page(base, page, after)
        except ServerError as exc:
            if not args.follow or failures >= 5:
                error(str(exc))
                return 1
            failures += 1  # a restarting server: retry a few times before giving up
            sleep(min(2.0**failures, 10.0))
            continue
        failures = 0
        for event in events:
            print(show(event), flush=args.follow)
            printed += 1
            if limit is not None and printed >= limit:
                return 0
        after = cursor
        if not events and not args.follow:
            return 0


def _page(base: str, page: Any, after: int) -> tuple[list[dict[str, Any]], int]:
    """A page of ``/v1/audit``, checked (the server is another program: its answer is untrusted)."""
    events = page.get("events") if isinstance(page, dict) else None
    cursor = page.get("next") if isinstance(page, dict) else None
    if (
        not isinstance(events, list)
        or not all(isinstance(e, dict) for e in events)
        or not isinstance(cursor, int)
        or isinstance(cursor, bool)
        or (events and cursor <= after)
    ):
        raise ServerError(f"{base} sent a page that is not an audit page (is it an agentnest server?)")
    return events, cursor


def _usage(args: argparse.Namespace, base: str, token: str) -> int:
    params: list[tuple[str, str]] = []
    if args.tenant:
        params.append(("tenant", args.tenant))
    if args.since is not None:
        params.append(("since", repr(args.since)))
    if args.until is not None:
        params.append(("until", repr(args.until)))
    try:
        answer = _request(base, token, "/v1/usage", params, timeout=30.0)
        rows = _usage_rows(base, answer)
    except ServerError as exc:
        error(str(exc))
        return 1
    if args.json:
        print(json.dumps(answer, separators=(",", ":")))
        return 0
    print_table(["TENANT", "CREATES", "SANDBOX-H", "CPU-H", "MEMORY-GIB-H", "REJECTED"], rows)
    return 0


_USAGE_NUMBERS = ("creates", "sandbox_seconds", "cpu_seconds", "memory_gib_seconds", "rejections")


def _usage_rows(base: str, answer: Any) -> list[list[str]]:
    """The table of a ``/v1/usage`` answer, checked (untrusted, like every answer)."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, list) or not all(
        isinstance(row, dict)
        and isinstance(row.get("tenant"), str)
        and all(
            isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool) for k in _USAGE_NUMBERS
        )
        for row in usage
    ):
        raise ServerError(f"{base} sent an answer that is not a usage report (is it an agentnest server?)")
    return [
        [
            row["tenant"],
            str(row["creates"]),
            f"{row['sandbox_seconds'] / 3600:.3f}",
            f"{row['cpu_seconds'] / 3600:.3f}",
            f"{row['memory_gib_seconds'] / 3600:.3f}",
            str(row["rejections"]),
        ]
        for row in usage
    ]
