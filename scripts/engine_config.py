#!/usr/bin/env python3
"""The Docker daemon settings AgentNest needs, merged into ``/etc/docker/daemon.json``.

Run by ``scripts/setup-engine.sh`` (``make engine``) with the system python3,
before any venv exists: standard library only, Python 3.7 compatible.

What is merged in, everything else in the file kept as it is (keys, values, order):

- ``runtimes.runsc`` and ``runtimes.runsc-host``: gVisor, network off / host network,
  with ``--oci-seccomp`` (gVisor applies the container's seccomp profile inside too);
- ``"experimental": true``: Docker 20.10's checkpoint API (gVisor pause to disk, live fork);
- ``"live-restore": true``: containers, so sandboxes, keep running while dockerd restarts.
  Not set on a swarm node (dockerd refuses live-restore in swarm mode), nor when the
  running dockerd gets ``--live-restore`` on its command line (dockerd refuses a directive
  given both as a flag and in the file).  A ``"live-restore": false`` the admin wrote is
  respected, with a note saying what it costs and how to change it.

A file that is not valid JSON, whose top level is not an object, or whose ``runtimes`` is
not an object is never overwritten: :class:`ConfigError` names the file, the parse error
(line, column) and the fix.  Command line exit codes: 0 done (changed or not), 1 the file
could not be read or written, 2 bad arguments, 3 the file was refused as it stands.
On success stdout is one line, ``changed=yes|no live-restore=on|off|unset``
(``on``: the file asks for it, so the engine should report it after a reload).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NamedTuple

DEFAULT_PATH = "/etc/docker/daemon.json"
RERUN = "then rerun `make engine`"

EXIT_OK = 0
EXIT_IO = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3


class ConfigError(Exception):
    """The daemon configuration cannot be merged as it stands; the message says why and the fix."""


class Plan(NamedTuple):
    """What :func:`plan` decided: the text to write and what to tell the operator."""

    text: str
    changed: bool
    live_restore: str  # "on", "off" (the file says false) or "unset"
    notes: list[str]


def wanted_runtimes(runsc: str) -> dict[str, Any]:
    """The runtime entries AgentNest registers (gVisor with its network off, and on the host's)."""
    return {
        "runsc": {"path": runsc, "runtimeArgs": ["--network=none", "--oci-seccomp"]},
        "runsc-host": {"path": runsc, "runtimeArgs": ["--network=host", "--oci-seccomp"]},
    }


def parse(text: str | None, path: str = DEFAULT_PATH) -> dict[str, Any]:
    """The configuration as a dict: ``{}`` for a missing or blank file (dockerd reads those as empty)."""
    if text is None:
        return {}
    if text.startswith("\ufeff"):  # a UTF-8 byte order mark: newer dockerd strips it too
        text = text[1:]
    if not text.strip():
        return {}
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}; it was left "
            f"untouched. Fix the file (or move it aside, e.g. `mv {path} {path}.bak`), {RERUN}."
        ) from None
    if not isinstance(cfg, dict):
        raise ConfigError(
            f"{path} must hold a JSON object ({{...}}) at its top level, not {_kind(cfg)}; it was "
            f"left untouched. Fix the file (or move it aside), {RERUN}."
        )
    runtimes = cfg.get("runtimes")
    if runtimes is not None and not isinstance(runtimes, dict):
        raise ConfigError(
            f'{path}: "runtimes" must be a JSON object (name -> {{"path": ...}}), not '
            f"{_kind(runtimes)}; it was left untouched. Fix the file (or move it aside), {RERUN}."
        )
    live = cfg.get("live-restore")
    if live is not None and not isinstance(live, bool):
        raise ConfigError(
            f'{path}: "live-restore" must be true or false, not {json.dumps(live)} ({_kind(live)}); '
            f"dockerd would refuse it too. It was left untouched. Fix the file, {RERUN}."
        )
    return cfg


def plan(
    text: str | None,
    runsc: str,
    swarm: bool,
    *,
    live_restore_flag: bool = False,
    path: str = DEFAULT_PATH,
) -> Plan:
    """Merge AgentNest's settings into ``text`` (None: no file yet); raises :class:`ConfigError`.

    ``swarm``: the engine is a swarm node, so live-restore is not added.
    ``live_restore_flag``: the running dockerd has ``--live-restore`` on its command line,
    so the file must not repeat it.  When nothing needs to change, ``text`` comes back as is.
    """
    cfg = parse(text, path)
    notes: list[str] = []
    changed = text is None or not text.strip()
    runtimes = cfg.get("runtimes")
    if runtimes is None:
        runtimes = cfg["runtimes"] = {}
        changed = True
    for name, spec in wanted_runtimes(runsc).items():
        if runtimes.get(name) != spec:
            runtimes[name] = spec
            changed = True
    if cfg.get("experimental") is not True:
        cfg["experimental"] = True
        changed = True

    live = cfg.get("live-restore")
    if swarm:
        if live is True:
            notes.append(
                f'{path} sets "live-restore": true, but this engine is a swarm node: dockerd refuses '
                "live-restore in swarm mode. Left as it is; remove it or leave the swarm "
                "(`docker swarm leave`)."
            )
        else:
            notes.append(
                "live-restore not enabled: this engine is in swarm mode, and dockerd refuses "
                "live-restore in swarm mode. Sandboxes will not survive a restart of dockerd "
                "(they are stopped with it); to have them survive, leave the swarm "
                "(`docker swarm leave`) and rerun `make engine`."
            )
    elif live_restore_flag:
        if live is not None:
            notes.append(
                f'{path} sets "live-restore" and dockerd also gets --live-restore on its command line: '
                "dockerd refuses to start with a directive given both ways. Remove one of them."
            )
        else:
            notes.append(
                "live-restore: dockerd gets --live-restore on its command line; not added to the file."
            )
    elif live is False:
        notes.append(
            f'{path} sets "live-restore": false, kept as the admin chose: sandboxes will not survive a '
            'restart of dockerd (they are stopped with it). To have them survive, set "live-restore": '
            "true there and reload dockerd (`kill -HUP $(pidof dockerd)`), or delete the line and "
            "rerun `make engine`."
        )
    elif live is None:
        cfg["live-restore"] = True
        changed = True
    live = cfg.get("live-restore")
    state = "on" if live is True and not swarm else "off" if live is False else "unset"

    if not changed:
        assert text is not None
        return Plan(text, False, state, notes)
    return Plan(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", True, state, notes)


def merge(text: str | None, runsc: str, swarm: bool, *, path: str = DEFAULT_PATH) -> str:
    """The new daemon.json text for ``text`` (None: a missing file); raises :class:`ConfigError`."""
    return plan(text, runsc, swarm, path=path).text


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid JSON: it is not UTF-8 text (byte {hex(data[exc.start])} at offset "
            f"{exc.start}); it was left untouched. Fix the file (or move it aside), {RERUN}."
        ) from None


def _write(path: str, text: str) -> None:
    """Write ``text`` next to ``path`` and rename it over: a crash leaves the old file or the new one."""
    path = os.path.realpath(path)  # a symlinked daemon.json stays a symlink
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".agentnest-tmp"
    mode = 0o644
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        pass
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Merge AgentNest's Docker settings (runsc runtimes, experimental, live-restore) "
        "into daemon.json, keeping every other setting."
    )
    parser.add_argument(
        "--file", default=DEFAULT_PATH, help="the daemon.json to merge into (default: %(default)s)"
    )
    parser.add_argument("--runsc", required=True, help="path of the runsc binary to register")
    parser.add_argument("--swarm", action="store_true", help="the engine is a swarm node: no live-restore")
    parser.add_argument(
        "--live-restore-flag",
        action="store_true",
        help="the running dockerd has --live-restore on its command line: do not repeat it in the file",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the merged file on stdout instead of writing it"
    )
    args = parser.parse_args(argv)
    try:
        result = plan(
            _read(args.file),
            args.runsc,
            args.swarm,
            live_restore_flag=args.live_restore_flag,
            path=args.file,
        )
    except ConfigError as exc:
        print(f"engine: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:
        print(f"engine: cannot read {args.file}: {exc}", file=sys.stderr)
        return EXIT_IO
    for note in result.notes:
        print(f"engine: note: {note}", file=sys.stderr)
    if args.dry_run:
        sys.stdout.write(result.text)
        return EXIT_OK
    if result.changed:
        try:
            _write(args.file, result.text)
        except OSError as exc:
            print(f"engine: cannot write {args.file}: {exc}", file=sys.stderr)
            return EXIT_IO
        print(f"engine: updated {args.file} (every other setting kept)", file=sys.stderr)
    print(f"changed={'yes' if result.changed else 'no'} live-restore={result.live_restore}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
