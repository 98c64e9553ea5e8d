"""``agentnest audit``: read, filter and follow the JSONL audit log."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from ._output import Commands, add_command, error, positive_float

_EPILOG = """\
Reads the log JsonLogObserver writes, rotated files included (oldest first).
Default file: $AGENTNEST_AUDIT_LOG, else $XDG_STATE_HOME/agentnest/audit.jsonl
(~/.local/state/agentnest/audit.jsonl).  TIME is ISO 8601 (2026-01-31T12:00,
UTC unless it carries an offset), Unix seconds, or an age such as 30s, 15m,
2h, 1d.  Malformed lines are reported on stderr and skipped.

examples:
  agentnest audit                              # every recorded event
  agentnest audit --sandbox 3f2a --since 1h    # one sandbox, the last hour
  agentnest audit --type exec.started --type policy.denied
  agentnest audit --follow --json | jq .       # new events as they come

With --server URL it reads the history of an `agentnest serve` manager
instead (its database; --token or $AGENTNEST_REMOTE_TOKEN): every tenant's
with an admin token, else the token's own tenant's.

  agentnest audit --server http://127.0.0.1:8700 --tenant team-a --since 1h
  agentnest audit --server http://127.0.0.1:8700 --follow --type admission.rejected
  agentnest audit --server http://127.0.0.1:8700 --usage --since 1d
"""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(commands: Commands) -> None:
    """Add ``audit`` to the command line."""
    parser = add_command(
        commands,
        "audit",
        "show (and follow) the audit log of sandbox events",
        "Print the audit events recorded in the JSONL log, filtered.",
        _EPILOG,
    )
    parser.add_argument("--file", type=Path, help="the log file (default: see below)")
    parser.add_argument("--sandbox", help="only this sandbox id (or a prefix of it)")
    parser.add_argument(
        "--type",
        dest="types",
        action="append",
        metavar="TYPE",
        help="only this event type, e.g. exec.started (repeatable)",
    )
    parser.add_argument("--since", type=parse_time, metavar="TIME", help="only events at or after TIME")
    parser.add_argument("--until", type=parse_time, metavar="TIME", help="only events before TIME")
    parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new events until interrupted"
    )
    parser.add_argument("--json", action="store_true", help="print each event as its JSON line")
    parser.add_argument(
        "--interval",
        type=positive_float,
        default=0.5,
        metavar="SECONDS",
        help="how often --follow polls the file (default 0.5)",
    )
    parser.add_argument("--server", metavar="URL", help="read an agentnest serve manager's history")
    parser.add_argument("--token", help="with --server: the bearer token (default $AGENTNEST_REMOTE_TOKEN)")
    parser.add_argument("--tenant", help="with --server: only this tenant (admin tokens)")
    parser.add_argument(
        "--usage",
        action="store_true",
        help="with --server: usage per tenant over --since/--until (default the last day)",
    )
    # For tests and scripts: stop --follow after this many printed events.
    parser.add_argument("--max-events", type=int, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def parse_time(text: str, *, now: float | None = None) -> float:
    """argparse type: ISO 8601, Unix seconds, or an age (``15m``) -> Unix seconds."""
    text = text.strip()
    if text and text[-1] in _UNITS:
        try:
            amount = float(text[:-1])
        except ValueError:
            pass
        else:
            return (time.time() if now is None else now) - amount * _UNITS[text[-1]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: use ISO 8601, Unix seconds or an age like 15m"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


@dataclass(frozen=True)
class Filter:
    """Which events to show."""

    sandbox: str | None = None
    types: frozenset[str] | None = None
    since: float | None = None
    until: float | None = None

    def __call__(self, event: dict[str, Any]) -> bool:
        if self.sandbox is not None and not str(event.get("sandbox_id", "")).startswith(self.sandbox):
            return False
        if self.types is not None and event.get("type") not in self.types:
            return False
        moment = event.get("time")
        if not isinstance(moment, (int, float)):
            return self.since is None and self.until is None
        if self.since is not None and moment < self.since:
            return False
        return self.until is None or moment < self.until


def parse_line(raw: bytes, where: str) -> dict[str, Any] | None:
    """One event, or ``None`` (reported on stderr) when the line is not one."""
    if not raw.strip():
        return None
    try:
        event = json.loads(raw)
    except ValueError as exc:
        error(f"{where}: malformed line skipped ({exc})")
        return None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        error(f"{where}: not an audit event, skipped")
        return None
    return event


def read_events(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every event of the files in order; malformed lines are reported and skipped."""
    for path in paths:
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            continue  # rotated away between listing and opening
        with handle:
            for number, raw in enumerate(handle, 1):
                event = parse_line(raw, f"{path}:{number}")
                if event is not None:
                    yield event


def render(event: dict[str, Any]) -> str:
    """``time  type  sandbox  key=value ...`` on one line."""
    moment = event.get("time")
    if isinstance(moment, (int, float)):
        stamp = datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="milliseconds")
        stamp = stamp.replace("+00:00", "Z")
    else:
        stamp = "-"
    data = event.get("data")
    pairs = data.items() if isinstance(data, dict) else []
    compact = " ".join(f"{k}={_compact(v)}" for k, v in pairs)
    return "  ".join(
        part for part in (stamp, str(event["type"]), str(event.get("sandbox_id", "-")), compact) if part
    )


def _compact(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    text = text.replace("\n", "\\n")
    return text if len(text) <= 80 else text[:77] + "..."


def handle(args: argparse.Namespace) -> int:
    """Print the matching events; with ``--follow`` keep going."""
    from ..audit import default_audit_path, rotated_paths

    show: Callable[[dict[str, Any]], str] = (
        (lambda e: json.dumps(e, separators=(",", ":"))) if args.json else render
    )
    if args.server is not None:
        if args.file is not None:
            error("pass either --file or --server, not both")
            return 2
        from .audit_server import handle_server

        return handle_server(args, show)
    if args.tenant is not None or args.usage or args.token is not None:
        error("--tenant, --usage and --token go with --server URL")
        return 2
    path: Path = args.file.expanduser() if args.file is not None else default_audit_path()
    keep = Filter(
        sandbox=args.sandbox,
        types=frozenset(args.types) if args.types else None,
        since=args.since,
        until=args.until,
    )
    limit: int | None = args.max_events
    printed = 0

    def emit(event: dict[str, Any]) -> bool:
        """Print ``event`` if it matches; ``False`` once ``--max-events`` is reached."""
        nonlocal printed
        if keep(event):
            print(show(event), flush=args.follow)
            printed += 1
        return limit is None or printed < limit

    paths = rotated_paths(path)
    if not paths and not args.follow:
        error(f"no audit log at {path} (set --file or $AGENTNEST_AUDIT_LOG)")
        return 1
    if not args.follow:
        for event in read_events(paths):
            if not emit(event):
                break
        return 0
    for event in read_events(p for p in paths if p != path):
        if not emit(event):
            return 0
    follow(path, emit, interval=args.interval)
    return 0


def follow(
    path: Path,
    emit: Callable[[dict[str, Any]], bool],
    *,
    interval: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print ``path``'s events, then new ones as they are appended, until ``emit`` says stop.

    Polls every ``interval`` seconds.  When the file is rotated (a new inode at
    ``path``) or truncated, the rest of the old file is read and then the new
    one from its start.  A partial last line waits for its newline.
    """
    handle: BinaryIO | None = None
    inode: int | None = None
    number = 0
    pending = b""
    try:
        while True:
            if handle is None:
                try:
                    handle = path.open("rb")
                except FileNotFoundError:
                    sleep(interval)
                    continue
                inode, number, pending = os.fstat(handle.fileno()).st_ino, 0, b""
            chunk = handle.read()
            if chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    number += 1
                    event = parse_line(raw, f"{path}:{number}")
                    if event is not None and not emit(event):
                        return
                continue
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is None or current.st_ino != inode or current.st_size < handle.tell():
                handle.close()  # rotated or truncated: what was left has been read above
                handle = None
                continue
            sys.stdout.flush()
            sleep(interval)
    finally:
        if handle is not None:
            handle.close()
