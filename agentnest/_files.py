"""A sandbox's workspace files, through the guard: the file operations of ``SandboxCore``.

This module decides how a file operation goes: its path is made a workspace
path and approved (``file.read``, ``file.write``, ``file.list``,
``file.remove``) before anything moves; sizes are held to the policy; what
comes back is redacted (names too: sandbox code can name a file after a
secret) and audited; a local disk workspace is read and written from the
host (:mod:`agentnest.runtime.hostfs`), anything else through the agent
channel, with a deadline that grows with the size.  ``SandboxCore`` keeps the
methods' names and calls these functions with itself (see :class:`Target`).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from .channel.client import STALL_AFTER, Channel
from .config import FileInfo
from .errors import (
    ChannelError,
    ConfigurationError,
    FileAccessError,
    FileTooLargeError,
    UnsupportedCapabilityError,
)
from .events import EventType
from .guard import Guard
from .runtime import hostfs
from .runtime.base import HostTarget

#: Base time allowed for a file operation, plus time per MiB.
_FILE_BASE_WAIT = 30.0
_FILE_WAIT_PER_MIB = 0.5
#: Longest recursive remove; the agent's heartbeats show it is still at work.
_REMOVE_WAIT = 3600.0


class Target(HostTarget, Protocol):
    """What the file operations need of a sandbox (``SandboxCore``): its guard and its agent link."""

    @property
    def guard(self) -> Guard: ...
    def link(self) -> Channel: ...
    def lost(self, exc: ChannelError) -> Exception: ...


def _deadline(size: int = 0) -> float:
    return time.monotonic() + _FILE_BASE_WAIT + _FILE_WAIT_PER_MIB * size / 2**20


def write_file(
    core: Target, path: str, content: str | bytes, encoding: str = "utf-8", mode: int = 0o644
) -> None:
    rel = core.guard.workspace_path(path)
    if isinstance(content, str):
        try:
            payload = content.encode(encoding)
        except LookupError:
            raise ConfigurationError(f"unknown encoding {encoding!r}") from None
        except UnicodeEncodeError as exc:
            raise ConfigurationError(f"content cannot be encoded as {encoding}: {exc.reason}") from None
    elif isinstance(content, (bytes, bytearray, memoryview)):
        payload = bytes(content)
    else:
        raise ConfigurationError(f"content must be str or bytes, not {type(content).__name__}")
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ConfigurationError(f"mode={mode!r} must be permission bits such as 0o644")
    limit = core.guard.policy.max_file_bytes
    if len(payload) > limit:
        raise FileTooLargeError(
            f"{path!r}: {len(payload)} bytes exceeds max_file_bytes={limit}; raise it in the SecurityPolicy",
            path=path,
        )
    core.guard.approve("file.write", {"path": core.guard.absolute(rel), "size": len(payload)})
    try:
        channel = core.link()
        # Fast path: a local disk workspace is written from the host (runtime.hostfs).
        if not hostfs.write(core, rel, payload, mode):
            channel.write_file(rel, payload, mode, _deadline(len(payload)))
    except ChannelError as exc:
        raise core.lost(exc) from None
    core.guard.emit(EventType.FILE_WRITTEN, {"path": rel, "size": len(payload)})


def read_file(core: Target, path: str, encoding: str | None = "utf-8") -> str | bytes:
    rel = core.guard.workspace_path(path)
    core.guard.approve("file.read", {"path": core.guard.absolute(rel)})
    limit = core.guard.policy.read_limit
    try:
        channel = core.link()
        # Fast path: a local disk workspace is read from the host (runtime.hostfs).
        data = hostfs.read(core, rel, limit)
        if data is None:
            data = channel.read_file(rel, limit, _deadline(limit))
    except ChannelError as exc:
        raise core.lost(exc) from None
    core.guard.emit(EventType.FILE_READ, {"path": rel, "size": len(data)})
    if encoding is None:
        return data
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise FileAccessError(
            f"{path!r} is not valid {encoding} (byte {exc.start}); pass encoding=None to get bytes",
            path=path,
            code="decode",
        ) from None
    except LookupError:
        raise ConfigurationError(f"unknown encoding {encoding!r}") from None
    return core.guard.redact(text)


def list_files(
    core: Target, path: str = ".", recursive: bool = False, max_entries: int = 10000
) -> list[FileInfo]:
    rel = core.guard.workspace_path(path)
    core.guard.approve("file.list", {"path": core.guard.absolute(rel)})
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or not 0 <= max_entries <= 10**6:
        raise ConfigurationError(f"max_entries={max_entries!r} must be 0 to 1000000")
    try:
        entries, _ = core.link().list_entries(rel, bool(recursive), max_entries, _deadline(max_entries * 256))
    except ChannelError as exc:
        raise core.lost(exc) from None
    # File names come from the sandbox: sandbox code can name a file after a secret.
    return [core.guard.redact_info(_file_info(e)) for e in entries]


def stat(core: Target, path: str) -> FileInfo:
    rel = core.guard.workspace_path(path)
    core.guard.approve("file.list", {"path": core.guard.absolute(rel)})
    entry = _file_info(request(core, {"t": "stat", "path": rel}).get("entry"))
    # The name is the one asked for (the agent's echo is not needed), redacted:
    # sandbox code can name a file after a secret.
    info = FileInfo(rel or ".", entry.type, entry.size, entry.mode, entry.mtime)
    return core.guard.redact_info(info)


def exists(core: Target, path: str) -> bool:
    try:
        stat(core, path)
    except FileAccessError as exc:
        if exc.code == "not_found":
            return False
        raise
    return True


def rename(core: Target, source: str, destination: str) -> None:
    src = core.guard.workspace_path(source)
    dst = core.guard.workspace_path(destination)
    for rel, given in ((src, source), (dst, destination)):
        if not rel:
            raise FileAccessError(
                f"{given!r} is the workspace root, which cannot be moved or replaced",
                path=given,
                code="invalid_path",
            )
    abs_src, abs_dst = core.guard.absolute(src), core.guard.absolute(dst)
    # Both ends asked about: a rule on the destination alone (no writes below
    # .git/, say) must not be sidestepped by writing elsewhere and moving.
    core.guard.approve("file.remove", {"path": abs_src, "to": abs_dst})
    core.guard.approve("file.write", {"path": abs_dst, "from": abs_src})
    try:
        channel = core.link()
        # Fail closed on what the agent announced: an older agent (a restored
        # checkpoint) would answer "unknown", which reads like a broken channel.
        if channel.hello is not None and "move" not in channel.hello.capabilities:
            raise UnsupportedCapabilityError(
                f"this sandbox's agent ({channel.hello.agent}) is too old for rename; recreate the sandbox"
            )
        channel.request({"t": "move", "path": src, "to": dst}, _deadline())
    except ChannelError as exc:
        raise core.lost(exc) from None
    core.guard.emit(EventType.FILE_MOVED, {"path": src, "to": dst})


def mkdir(core: Target, path: str, parents: bool = True) -> None:
    rel = core.guard.workspace_path(path)
    core.guard.approve("file.write", {"path": core.guard.absolute(rel), "directory": True})
    request(core, {"t": "mkdir", "path": rel, "parents": parents})


def remove_file(core: Target, path: str, recursive: bool = False) -> None:
    rel = core.guard.workspace_path(path)
    core.guard.approve("file.remove", {"path": core.guard.absolute(rel), "recursive": recursive})
    try:
        # A large tree takes a while: the agent removes it between turns of its
        # loop and sends heartbeats meanwhile, so the wait is bounded by silence.
        core.link().request(
            {"t": "remove", "path": rel, "recursive": bool(recursive)},
            time.monotonic() + _REMOVE_WAIT,
            stall=STALL_AFTER,
        )
    except ChannelError as exc:
        raise core.lost(exc) from None
    core.guard.emit(EventType.FILE_REMOVED, {"path": rel})


def upload_file(core: Target, source: str | os.PathLike[str], destination: str | None = None) -> None:
    local = Path(source)
    try:
        data = local.read_bytes()
    except OSError as exc:
        raise FileAccessError(
            f"cannot read {str(local)!r} on the host: {exc.strerror}", path=str(local)
        ) from None
    write_file(core, destination if destination is not None else local.name, data)


def download_file(core: Target, source: str, destination: str | os.PathLike[str]) -> None:
    data = read_file(core, source, encoding=None)
    assert isinstance(data, bytes)
    target = Path(destination)
    target.parent.mkdir(parents=True, exist_ok=True)  # as 0.3.0 did
    tmp = target.with_name(f".{target.name}.agentnest-{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(target)


def request(core: Target, header: dict[str, Any]) -> dict[str, Any]:
    """One request to the agent with the file operations' deadline."""
    try:
        return dict(core.link().request(header, _deadline()))
    except ChannelError as exc:
        raise core.lost(exc) from None


def _file_info(entry: Any) -> FileInfo:
    try:
        path, kind, size, mode, mtime = entry
        # The agent runs inside the sandbox: its entries are untrusted, and a negative size, a
        # mode past 16 bits, a bool for a number or a NaN/infinite time is refused, not shown.
        if not (
            isinstance(path, str)
            and kind in ("file", "dir", "symlink", "other")
            and type(size) is int
            and size >= 0
            and type(mode) is int
            and 0 <= mode <= 0o177777
            and type(mtime) in (int, float)
            and math.isfinite(mtime)
        ):
            raise ValueError
    except (TypeError, ValueError):
        raise ChannelError("the agent sent an invalid file entry") from None
    return FileInfo(path[:4096], kind, size, mode, float(mtime))
