"""Files out of the workspace: :meth:`Sandbox.artifacts` (hashed in the sandbox) and
:meth:`Sandbox.download` (a tree written safely below a host directory)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Artifact
from ..errors import ChannelError, ConfigurationError, FileAccessError, SnapshotError
from ..events import EventType
from ..runtime.hostfs import host_workspace as _host_workspace
from .archive import _Gate
from .host import _start_hasher, _start_writer
from .hosttree import HostTree
from .programs import _read_program, _writer_args
from .rules import (
    _HEX64,
    MAX_ARTIFACTS,
    MAX_NAME_BYTES,
    PAYLOAD_PREFIX,
    TarRules,
    _is_count,
    _nbytes,
    glob_parts,
)

if TYPE_CHECKING:
    from .._core import SandboxCore


def artifacts(sandbox: SandboxCore, pattern: str = "**/*") -> tuple[Artifact, ...]:
    """Regular files matching ``pattern``, hashed in the sandbox.  See :meth:`Sandbox.artifacts`."""
    workdir = sandbox.config.workdir.rstrip("/")
    if isinstance(pattern, str) and pattern.startswith("/"):
        if pattern != workdir and not pattern.startswith(workdir + "/"):
            raise ConfigurationError(f"the pattern {pattern!r} is outside the workspace {workdir}")
        pattern = pattern[len(workdir) :].lstrip("/") or "**"
    base, regex = glob_to_regex(pattern)
    sandbox.link()
    sandbox.guard.approve("file.list", {"pattern": pattern})
    return tuple(_artifacts(sandbox, base, regex, pattern))


def glob_to_regex(pattern: str) -> tuple[str, str]:
    """Translate a workspace glob into ``(literal base directory, regex)``.

    ``*`` and ``?`` match within one path component, ``[...]`` is a class
    (``[!...]`` negated), ``**`` matches any number of components (zero
    included).  Dotfiles match like any other name.  The regex is meant for
    ``re.fullmatch`` on workspace-relative paths.

    The checks (empty, overlong, ``..``) are :func:`~agentnest.state.rules.glob_parts`'s:
    the base directory is a prefix of the parts it returns, so the walk stays inside.

    Raises:
        ConfigurationError: the pattern is empty, too long or climbs out with ``..``.
    """
    parts = glob_parts(pattern)
    base: list[str] = []
    for part in parts[:-1]:
        if any(c in part for c in "*?["):
            break
        base.append(part)
    regex = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
        else:
            regex += _glob_component(part) + ("" if last else "/")
    return "/".join(base), regex


def _glob_component(part: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = part.find("]", i + 2)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = part[i + 1 : j]
                negate = body.startswith("!")
                if negate:
                    body = body[1:]
                # Escape everything but ranges: no nested sets or set operations.
                inner = "".join(ch if ch == "-" else re.escape(ch) for ch in body)
                out.append(f"[^/{inner}]" if negate else f"[{inner}]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _artifacts(sandbox: SandboxCore, base: str, regex: str, pattern: str) -> Iterator[Artifact]:
    compiled = re.compile(regex, re.S)
    # Fast path: on the host, over the live workspace (as the sandbox's UID,
    # through descriptors that never follow a link: see _LocalProgram).
    program = _start_hasher(sandbox, base, regex, _host_workspace(sandbox))
    buffer = bytearray()
    count = 0
    try:
        while True:
            chunk = program.pull()
            if not chunk:
                break
            buffer += chunk
            while True:
                end = buffer.find(b"\n")
                if end < 0:
                    break
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                count += 1
                if count > MAX_ARTIFACTS:
                    raise FileAccessError(f"more than {MAX_ARTIFACTS} files match", code="too_many")
                found = _artifact(line, compiled)
                # File names come from the sandbox: they may spell a secret.
                yield dataclasses.replace(found, path=sandbox.guard.redact(found.path))
            if len(buffer) > 3 * MAX_NAME_BYTES + 200:
                raise ChannelError("the hasher sent an overlong line")
        try:
            program.check("listing artifacts")
        except SnapshotError as exc:
            raise FileAccessError(str(exc), path=exc.member, code=exc.rule) from None
        if buffer:
            raise ChannelError("the hasher's output ended mid-line")
    finally:
        program.cancel()
    sandbox.guard.emit(EventType.FILE_READ, {"pattern": pattern, "files": count})


def _artifact(line: bytes, compiled: re.Pattern[str]) -> Artifact:
    """Parse and check one line of the hasher's output (untrusted)."""
    try:
        path, size, sha = json.loads(line)
    except (ValueError, TypeError):
        raise ChannelError("the hasher sent an invalid line") from None
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or "\x00" in path
        or _nbytes(path) > MAX_NAME_BYTES
        or any(p in ("", ".", "..") for p in path.split("/"))
        or not compiled.fullmatch(path)
        or not _is_count(size)
        or not isinstance(sha, str)
        or not _HEX64.fullmatch(sha)
    ):
        raise ChannelError("the hasher sent an invalid entry")
    return Artifact(path, size, sha)


def download(sandbox: SandboxCore, path: str, dest: str | os.PathLike[str]) -> Path:
    """Copy a workspace file or tree into a host directory.  See :meth:`Sandbox.download`."""
    guard = sandbox.guard
    rel = guard.workspace_path(path)
    target_dir = Path(os.fspath(dest))
    sandbox.link()
    guard.approve("file.read", {"path": guard.absolute(rel), "dest": str(target_dir)})
    name = rel.rsplit("/", 1)[-1]
    prefix = name or PAYLOAD_PREFIX
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        tree = HostTree(target_dir, strip=not name)
    except OSError as exc:
        raise FileAccessError(
            f"cannot use {str(target_dir)!r} as the destination: {exc}", code="io"
        ) from None
    try:
        args = _writer_args(sandbox, sub=rel, prefix=prefix)
        writer = _start_writer(sandbox, args, _host_workspace(sandbox))  # fast path: as _artifacts
        try:
            rules = TarRules(
                max_bytes=sandbox.config.limits.workspace, prefix=prefix, symlinks=False, root_file=True
            )
            _read_program(writer, _Gate(writer.pull, None), rules, on_member=tree.add)
            writer.check(f"downloading {rel or '.'!r}")
        except BaseException:
            writer.cancel()
            raise
    except SnapshotError as exc:
        raise FileAccessError(str(exc), path=exc.member or path, code=exc.rule) from None
    finally:
        tree.close()
    guard.emit(EventType.FILE_READ, {"path": rel, "size": rules.size, "files": rules.files})
    return target_dir / name if name else target_dir
