"""The host's side of :meth:`Sandbox.download`: a tree the sandbox sent, written below a host
directory and never outside it.

Members are checked first (``state.rules.TarRules``: no absolute path, ``..``, link, device;
bounded sizes).  Here each directory is opened relative to its parent with ``O_NOFOLLOW`` (a
symlink in the destination is refused, not followed), a file is written under a temporary name
and renamed over the target (a rename replaces a link, never writes through one), and no mode
beyond ``0o755`` reaches the host.  The only code that writes bytes a sandbox chose to the host.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tarfile
from pathlib import Path
from typing import IO, cast

from ..errors import FileAccessError
from .rules import MiB, _refuse


class HostTree:
    """Writes validated members below a host directory, never outside it (see the module)."""

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
    """Copy exactly ``n`` bytes of a member to ``fd``; fewer is a truncated archive."""
    while n:
        data = src.read(min(MiB, n))
        if not data:
            raise _refuse(member, "truncated", "the member's data is truncated")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        n -= len(data)


def _host_error(exc: OSError, where: str) -> FileAccessError:
    """A host-side failure as the file error of the member it was writing."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FileAccessError(
            f"{where!r}: a symlink or a file is in the way in the destination; it is not followed",
            path=where,
            code="symlink",
        )
    return FileAccessError(f"{where!r}: {exc.strerror or exc}", path=where, code="io")
