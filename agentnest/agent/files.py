"""File operations inside the sandbox, confined to the workspace.

Every path is walked one component at a time from a descriptor of the
workspace root with ``O_NOFOLLOW``: a symlink anywhere on the way is refused
rather than followed, and because each step opens relative to the previous
descriptor, swapping a directory for a symlink between a check and a use (the
classic TOCTOU race) cannot redirect the operation.  The final open adds
``O_NONBLOCK`` so that a planted FIFO cannot hang the agent, and the opened
object must be a regular file.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, Iterator, List, Optional, Tuple

# No O_DIRECTORY: some kernels (gVisor 2022) follow a final symlink when
# O_DIRECTORY is combined with O_NOFOLLOW.  Open without it, then check.
_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

CHUNK = 1024 * 1024


class FileError(Exception):
    """A refused or failed file operation; ``code`` is a stable wire code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def split(rel: str) -> List[str]:
    """Validate a workspace-relative path; return its components.

    The host already normalises paths; the agent checks again because the
    protocol must be safe on its own.
    """
    if not isinstance(rel, str) or "\x00" in rel:
        raise FileError("invalid_path", "path must be a string without NUL bytes")
    if rel in ("", "."):
        return []
    if rel.startswith("/"):
        raise FileError("outside_workspace", f"{rel!r} is absolute")
    parts = rel.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise FileError("outside_workspace", f"{rel!r} is not a normalised path")
        if len(part.encode("utf-8", "surrogateescape")) > 255:
            raise FileError("invalid_path", f"a component of {rel!r} is longer than 255 bytes")
    return parts


def _oserror(exc: OSError, rel: str) -> FileError:
    import errno

    code = {
        errno.ENOENT: "not_found",
        errno.ELOOP: "symlink",
        errno.ENOTDIR: "not_directory",
        errno.EISDIR: "is_directory",
        errno.EEXIST: "exists",
        errno.ENOTEMPTY: "not_empty",
        errno.EACCES: "permission",
        errno.EPERM: "permission",
        errno.ENOSPC: "no_space",
        errno.EDQUOT: "no_space",
        errno.EFBIG: "too_large",
        errno.ENXIO: "not_regular",
        errno.ENAMETOOLONG: "invalid_path",
        errno.EROFS: "permission",
    }.get(exc.errno or 0, "io")
    if code == "symlink":
        return FileError(code, f"{rel!r}: a symlink is on the path; the file API does not follow links")
    if exc.errno == errno.EDQUOT:
        return FileError(
            code,
            f"{rel!r}: the workspace is full, its quota (disk=) is used up (Disk quota exceeded); "
            "delete files in it, or make the sandbox with a larger disk=",
        )
    if exc.errno == errno.ENOSPC:
        return FileError(
            code,
            f"{rel!r}: the workspace is full (No space left on device); delete files in it, or make "
            "the sandbox with more room (workspace_size= in memory, disk= on disk; a disk workspace "
            "below its disk= means the host's storage pool is full: `agentnest prune`)",
        )
    return FileError(code, f"{rel!r}: {os.strerror(exc.errno or 0)}")


def open_dir(name: str, dir_fd: Optional[int] = None) -> int:
    """Open a directory without following a symlink; refuse anything else."""
    import errno

    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd) if dir_fd is not None else os.open(name, _DIR_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISDIR(mode):
        os.close(fd)
        if stat.S_ISLNK(mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    return fd


class Workspace:
    """The workspace root and the operations on paths below it."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._root_fd: Optional[int] = None
        self._writes: Dict[int, Tuple[int, int, str, str, int]] = {}

    def root_fd(self) -> int:
        if self._root_fd is None:
            self._root_fd = open_dir(self.root)
        return self._root_fd

    def _walk(self, parts: List[str], rel: str, create: bool = False) -> int:
        """Open the directory holding ``parts[-1]``; the caller closes it."""
        fd = os.dup(self.root_fd())
        try:
            for part in parts[:-1]:
                try:
                    nfd = open_dir(part, fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    nfd = open_dir(part, fd)
                os.close(fd)
                fd = nfd
        except OSError as exc:
            os.close(fd)
            raise _oserror(exc, rel) from None
        return fd

    # -- reads -----------------------------------------------------------

    def read(self, rel: str, max_bytes: int) -> Iterator[bytes]:
        """Yield the file's contents in chunks; refuse more than max_bytes."""
        parts = split(rel)
        if not parts:
            raise FileError("is_directory", "the workspace root is a directory")
        pfd = self._walk(parts, rel)
        try:
            try:
                fd = os.open(parts[-1], _READ_FLAGS, dir_fd=pfd)
            except OSError as exc:
                raise _oserror(exc, rel) from None
        finally:
            os.close(pfd)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise FileError("is_directory", f"{rel!r} is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise FileError("not_regular", f"{rel!r} is not a regular file")
            if st.st_size > max_bytes:
                raise FileError("too_large", f"{rel!r} is {st.st_size} bytes, over the limit of {max_bytes}")
            os.set_blocking(fd, True)
            total = 0
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:
                    # The file grew while we read it.
                    raise FileError("too_large", f"{rel!r} grew past the limit of {max_bytes}")
                yield chunk
        finally:
            os.close(fd)

    def stat(self, rel: str) -> List[Any]:
        parts = split(rel)
        if not parts:
            st = os.fstat(self.root_fd())
            return _entry(".", st)
        pfd = self._walk(parts, rel)
        try:
            st = os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False)
        except OSError as exc:
            raise _oserror(exc, rel) from None
        finally:
            os.close(pfd)
        return _entry(rel, st)

    def list(self, rel: str, recursive: bool, max_entries: int) -> Tuple[List[List[Any]], bool]:
        parts = split(rel)
        if parts:
            pfd = self._walk(parts, rel)
            try:
                dfd = open_dir(parts[-1], pfd)
            except OSError as exc:
                raise _oserror(exc, rel) from None
            finally:
                os.close(pfd)
        else:
            dfd = os.dup(self.root_fd())
        out: List[List[Any]] = []
        prefix = rel + "/" if parts else ""
        try:
            truncated = self._list_fd(dfd, prefix, recursive, max_entries, out)
        finally:
            os.close(dfd)
        return out, truncated

    def _list_fd(
        self, dfd: int, prefix: str, recursive: bool, max_entries: int, out: List[List[Any]]
    ) -> bool:
        # Rewound first: btrfs fixes what a directory descriptor lists when it
        # is rewound (scandir does so on close), and the workspace's root
        # descriptor lives as long as the agent.
        os.lseek(dfd, 0, os.SEEK_SET)
        with os.scandir(dfd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if len(out) >= max_entries:
                return True
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            path = prefix + entry.name
            out.append(_entry(path, st))
            if recursive and stat.S_ISDIR(st.st_mode):
                try:
                    sub = open_dir(entry.name, dfd)
                except OSError:
                    continue
                try:
                    if self._list_fd(sub, path + "/", True, max_entries, out):
                        return True
                finally:
                    os.close(sub)
        return False

    # -- writes ----------------------------------------------------------

    def write_chunk(self, wid: int, rel: str, mode: int, data: bytes, first: bool, last: bool) -> int:
        """Write a file in chunks, atomically: a temp file renamed into place.

        Returns the number of bytes written so far.
        """
        if first:
            self.abort_write(wid)
            parts = split(rel)
            if not parts:
                raise FileError("is_directory", "the workspace root is a directory")
            pfd = self._walk(parts, rel, create=True)
            tmp = ".%s.agentnest-%d.tmp" % (parts[-1][:200], wid)
            try:
                fd = os.open(tmp, _TMP_FLAGS, 0o600, dir_fd=pfd)
            except OSError as exc:
                os.close(pfd)
                raise _oserror(exc, rel) from None
            self._writes[wid] = (pfd, fd, tmp, parts[-1], 0)
        if wid not in self._writes:
            raise FileError("protocol", "write chunk for a write that was not opened")
        pfd, fd, tmp, name, written = self._writes[wid]
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            written += len(data)
            self._writes[wid] = (pfd, fd, tmp, name, written)
            if last:
                os.fchmod(fd, mode & 0o7777 & ~0o6000)  # never setuid/setgid
                os.close(fd)
                fd = -1
                os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
                del self._writes[wid]
                os.close(pfd)
        except OSError as exc:
            self.abort_write(wid)
            raise _oserror(exc, rel) from None
        return written

    def writing(self, wid: int) -> bool:
        return wid in self._writes

    def abort_write(self, wid: int) -> None:
        state = self._writes.pop(wid, None)
        if state is None:
            return
        pfd, fd, tmp, _name, _ = state
        try:
            os.close(fd)
        except OSError:
            pass
        try:
            os.unlink(tmp, dir_fd=pfd)
        except OSError:
            pass
        try:
            os.close(pfd)
        except OSError:
            pass

    def mkdir(self, rel: str, parents: bool) -> None:
        parts = split(rel)
        if not parts:
            return
        pfd = self._walk(parts, rel, create=parents)
        try:
            os.mkdir(parts[-1], 0o755, dir_fd=pfd)
        except FileExistsError:
            if not parents:
                raise FileError("exists", f"{rel!r} already exists") from None
        except OSError as exc:
            raise _oserror(exc, rel) from None
        finally:
            os.close(pfd)

    def move(self, src_rel: str, dst_rel: str) -> None:
        """Rename ``src_rel`` to ``dst_rel`` (a file, link or directory); parents of the
        destination are created.

        POSIX ``rename`` otherwise: an existing destination file (or link, or empty
        directory) is replaced, a non-empty directory is not.  Both parents are
        walked like every other path, so a link on either way is refused; the final
        components are names in those directories, and rename never follows them
        (a link is moved or replaced as the link itself).
        """
        sparts = split(src_rel)
        dparts = split(dst_rel)
        if not sparts:
            raise FileError("invalid_path", "refusing to move the workspace root")
        if not dparts:
            raise FileError("invalid_path", "refusing to move onto the workspace root")
        # Checked on the names, before any parent is created: no link is ever
        # followed, so a path below the source's names lies inside it.
        if len(dparts) > len(sparts) and dparts[: len(sparts)] == sparts:
            raise FileError("invalid_path", f"cannot move {src_rel!r} into itself ({dst_rel!r})")
        spfd = self._walk(sparts, src_rel)
        try:
            # The source must exist before the destination's parents are created.
            try:
                os.stat(sparts[-1], dir_fd=spfd, follow_symlinks=False)
            except OSError as exc:
                raise _oserror(exc, src_rel) from None
            dpfd = self._walk(dparts, dst_rel, create=True)
            try:
                os.rename(sparts[-1], dparts[-1], src_dir_fd=spfd, dst_dir_fd=dpfd)
            except OSError as exc:
                raise _move_error(exc, src_rel, dst_rel) from None
            finally:
                os.close(dpfd)
        finally:
            os.close(spfd)

    def remove(self, rel: str, recursive: bool) -> None:
        for _ in self.removing(rel, recursive):
            pass

    def removing(self, rel: str, recursive: bool) -> Iterator[None]:
        """Remove ``rel``, yielding every few hundred entries of a tree (the agent's loop
        goes on between them: heartbeats and other commands' output keep flowing)."""
        parts = split(rel)
        if not parts:
            raise FileError("invalid_path", "refusing to remove the workspace root")
        pfd = self._walk(parts, rel)
        try:
            st = os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if not recursive:
                    try:
                        os.rmdir(parts[-1], dir_fd=pfd)
                    except OSError as exc:
                        raise _oserror(exc, rel) from None
                    return
                count = [0]
                for _ in _rmtree_at(pfd, parts[-1], count):
                    yield
            else:
                os.unlink(parts[-1], dir_fd=pfd)
        except OSError as exc:
            raise _oserror(exc, rel) from None
        finally:
            os.close(pfd)


def _move_error(exc: OSError, src_rel: str, dst_rel: str) -> FileError:
    """Why a rename failed, in words that name the side at fault."""
    import errno

    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
        # rename(2) answers either for a destination directory that has entries.
        return FileError("not_empty", f"{dst_rel!r} is a directory that is not empty; remove it first")
    if exc.errno == errno.EISDIR:
        return FileError("is_directory", f"{dst_rel!r} is a directory and {src_rel!r} is not")
    if exc.errno == errno.ENOTDIR:
        return FileError("not_directory", f"{src_rel!r} is a directory and {dst_rel!r} is not")
    if exc.errno == errno.EXDEV:
        return FileError("io", f"{src_rel!r} and {dst_rel!r} are on different filesystems")
    reason = os.strerror(exc.errno or 0)
    if exc.errno in (errno.EINVAL, errno.EBUSY):
        return FileError("invalid_path", f"{src_rel!r} cannot be moved to {dst_rel!r}: {reason}")
    return FileError(_oserror(exc, src_rel).code, f"moving {src_rel!r} to {dst_rel!r}: {reason}")


#: Entries a recursive remove takes between two turns of the agent's loop.
REMOVE_STEP = 256


def _rmtree_at(pfd: int, name: str, count: List[int]) -> Iterator[None]:
    """Remove a directory tree through descriptors only, never following links."""
    dfd = open_dir(name, pfd)
    try:
        os.lseek(dfd, 0, os.SEEK_SET)  # see _list_fd
        with os.scandir(dfd) as it:
            entries = list(it)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                for _ in _rmtree_at(dfd, entry.name, count):
                    yield
            else:
                os.unlink(entry.name, dir_fd=dfd)
            count[0] += 1
            if count[0] % REMOVE_STEP == 0:
                yield
    finally:
        os.close(dfd)
    os.rmdir(name, dir_fd=pfd)


def _entry(path: str, st: os.stat_result) -> List[Any]:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        kind = "dir"
    elif stat.S_ISREG(mode):
        kind = "file"
    elif stat.S_ISLNK(mode):
        kind = "symlink"
    else:
        kind = "other"
    return [path, kind, st.st_size, stat.S_IMODE(mode), st.st_mtime]
