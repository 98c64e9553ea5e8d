"""Files out of the workspace: :meth:`Sandbox.artifacts` (hashed in the sandbox) and
:meth:`Sandbox.download` (a tree written safely below a host directory)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from ..config import Artifact
from ..errors import ChannelError, ConfigurationError, FileAccessError, SnapshotError
from ..events import EventType
from ..runtime.hostfs import host_workspace as _host_workspace
from .archive import _Gate
from .host import _start_hasher, _start_writer
from .programs import _read_program, _writer_args
from .rules import (
    _HEX64,
    MAX_ARTIFACTS,
    MAX_NAME_BYTES,
    PAYLOAD_PREFIX,
    MiB,
    TarRules,
    _is_count,
    _nbytes,
    _refuse,
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
        tree = _HostTree(target_dir, strip=not name)
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


class _HostTree:
    """Writes validated members below a host directory, never outside it.

    Every directory is opened relative to its parent with ``O_NOFOLLOW``,
    so a symlink already in the destination is refused, not followed; files
    are written to a temporary name and renamed over the target (a rename
    replaces a link, it never writes through one).  Modes keep at most
    ``0o755``: no setuid, setgid, sticky or world-writable file reaches the host.
    """

    _DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def __init__(self, dest: Path, *, strip: bool) -> None:
        self._strip = strip
        self._root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._parts: tuple[str, ...] = ()
        self._fd = self._root

    def close(self) -> None:
        if self._fd != self._root:
            os.close(self._fd)
        os.close(self._root)
        self._fd = self._root = -1

    def _parent(self, parts: list[str]) -> int:
        want = tuple(parts[:-1])
        if want == self._parts:
            return self._fd
        if self._fd != self._root:
            os.close(self._fd)
        self._parts, self._fd = (), self._root
        fd = self._root
        try:
            for part in want:
                try:
                    nfd = os.open(part, self._DIR, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    nfd = os.open(part, self._DIR, dir_fd=fd)
                if fd != self._root:
                    os.close(fd)
                fd = nfd
        except OSError as exc:
            if fd != self._root:
                os.close(fd)
            raise _host_error(exc, "/".join(parts)) from None
        self._parts, self._fd = want, fd
        return fd

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: list[str], kind: str) -> None:
        parts = rel if self._strip else [member.name.split("/", 1)[0], *rel]
        if not parts:
            return
        pfd = self._parent(parts)
        name = parts[-1]
        if kind == "dir":
            try:
                os.mkdir(name, 0o755, dir_fd=pfd)
            except FileExistsError:
                try:
                    os.close(os.open(name, self._DIR, dir_fd=pfd))
                except OSError as exc:
                    raise _host_error(exc, "/".join(parts)) from None
            except OSError as exc:
                raise _host_error(exc, "/".join(parts)) from None
            return
        tmp = f".{name[:200]}.agentnest-{os.getpid()}-{os.urandom(4).hex()}.tmp"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd
            )
        except OSError as exc:
            raise _host_error(exc, "/".join(parts)) from None
        try:
            try:
                src = cast(IO[bytes], tar.fileobj)
                sparse = cast("list[tuple[int, int]] | None", member.sparse)
                if sparse is None:
                    _copy_out(src, fd, member.size, member.name)
                else:
                    for offset, length in sparse:
                        os.lseek(fd, offset, os.SEEK_SET)
                        _copy_out(src, fd, length, member.name)
                    os.ftruncate(fd, member.size)
                os.fchmod(fd, member.mode & 0o755)
                os.utime(fd, (member.mtime, member.mtime))
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pfd)
            if isinstance(exc, OSError):
                raise _host_error(exc, "/".join(parts)) from None
            raise


def _copy_out(src: IO[bytes], fd: int, n: int, member: str) -> None:
    while n:
        data = src.read(min(MiB, n))
        if not data:
            raise _refuse(member, "truncated", "the member's data is truncated")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        n -= len(data)


def _host_error(exc: OSError, where: str) -> FileAccessError:
    import errno

    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FileAccessError(
            f"{where!r}: a symlink or a file is in the way in the destination; it is not followed",
            path=where,
            code="symlink",
        )
    return FileAccessError(f"{where!r}: {exc.strerror or exc}", path=where, code="io")
