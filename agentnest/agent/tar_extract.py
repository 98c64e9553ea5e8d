"""The safe extractor: restores a tar stream into the workspace (runs inside the sandbox).

Not part of the agent's bundle: the host (:mod:`agentnest.state.programs`)
reads this file's source and runs it through the agent channel as
``python3 -I -S -c SOURCE ARGS_JSON``.  ``-I`` keeps the workspace off
``sys.path`` (a planted ``tarfile.py`` is not imported) and ignores
``PYTHON*`` variables; ``-S`` skips site-packages.  So it imports nothing but
the stdlib, not even the agent's other modules, and keeps Python 3.8 syntax
(it runs on the image's Python).  It never follows a symlink: every
directory is opened with ``O_NOFOLLOW`` from its parent's descriptor.

Reads a tar stream from stdin (length-prefixed chunks, a zero length at the
end, then one decision byte: ``C`` commit, anything else abort), or, on the
host-side fast path, from a snapshot file open as ``A["file_fd"]`` up to its
member ``A["stop_at"]`` (then it prints ``staged`` and reads the decision
byte from stdin), validates
every member with its own copy of the rules (the host checked them too:
:class:`agentnest.state.TarRules`), writes it into a staging directory and,
on commit, swaps the staging directory's contents in for the workspace's.
Prints ``a N`` acknowledgements (N raw bytes consumed) and a final JSON line
on stdout; structured errors go to stderr as one line ``agentnest-state: {json}``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import sys
import tarfile

# Not `from typing import ...`: importing typing costs milliseconds of every
# restore and fork, and the annotations are only read by mypy.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from ._prelude import CH, RESERVED, Refused, listdir, opendir, oserror, report

#: The host's arguments: JSON in ``sys.argv[1]``, read when run as a script.
A: Dict[str, Any]


NEWF = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Set from ``A`` when run as a script: the members' top directory, and the
#: names of the staging and trash directories (their pid lets a later restore
#: sweep what a killed one left).
PREFIX: str
STAGE: str
TRASH: str


class Feed:
    # tarfile reads this in "r:" mode: read() returns exactly what it asks
    # for, seek() only goes forward, and file data is copied with piece()
    # straight from the frames (no re-buffering).
    def __init__(self) -> None:
        self.inp = sys.stdin.buffer
        self.left = 0
        self.done = False
        self.raw = 0
        self.acked = 0
        self.pos = 0

    def exact(self, n: int) -> bytes:
        data = self.inp.read(n)
        if len(data) != n:
            raise Refused("truncated", None, "the stream from the host ended early")
        self.raw += n
        if self.raw - self.acked >= A["ack"]:
            self.acked = self.raw
            os.write(1, b"a %d\n" % self.raw)
        return data

    def piece(self, n: int) -> bytes:
        if self.done or n <= 0:
            return b""
        if not self.left:
            (self.left,) = struct.unpack(">I", self.exact(4))
            if not self.left:
                self.done = True
                return b""
        data = self.exact(min(n, self.left))
        self.left -= len(data)
        self.pos += len(data)
        return data

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = 1 << 62
        parts = []
        while n > 0:
            data = self.piece(n)
            if not data:
                break
            parts.append(data)
            n -= len(data)
        return b"".join(parts)

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence != 0 or pos < self.pos:
            raise OSError(errno.ESPIPE, "the stream only seeks forward")
        while self.pos < pos and self.piece(min(CH, pos - self.pos)):
            pass
        return self.pos

    def tell(self) -> int:
        return self.pos


class FileFeed:
    # The same interface over a snapshot file the host opened for us (the
    # host-side fast path, A["file_fd"]): a plain file that seeks, whose
    # members' data is copied into place by the kernel (sendfile), not read
    # into this process.  The host checks the file's checksum and metadata
    # at the same time and confirms only if they hold.
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pos = 0
        self.done = False

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = 1 << 30
        data = os.pread(self.fd, n, self.pos)
        self.pos += len(data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence != 0 or pos < 0:
            raise OSError(errno.ESPIPE, "seek only to an absolute position")
        self.pos = pos
        return pos

    def tell(self) -> int:
        return self.pos

    def copy_to(self, fd: int, offset: int, n: int, member: str) -> None:
        while n:
            try:
                k = os.sendfile(fd, self.fd, offset, min(n, 1 << 30))
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
                data = os.pread(self.fd, min(n, CH), offset)
                k = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            if not k:
                raise Refused("truncated", member, "the member's data is truncated")
            offset += k
            n -= k


def nbytes(s: str) -> int:
    return len(s.encode("utf-8", "surrogateescape"))


def link_ok(rel: List[str], target: str) -> bool:
    if not target or "\x00" in target or target.startswith("/") or nbytes(target) > 4096:
        return False
    parts = target.split("/")
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    return ".." not in parts[up:] and up <= len(rel) - 1


class Rules:
    def __init__(self) -> None:
        self.kinds: Dict[str, str] = {}
        self.entries = self.files = self.stored = 0

    def more(self, name: str) -> None:
        self.entries += 1
        if self.entries > A["max_entries"]:
            raise Refused("entries", name, "more than %d entries" % A["max_entries"])

    def check(self, m: tarfile.TarInfo, span: int) -> Tuple[List[str], str]:
        name = m.name
        self.more(name)
        if not name or "\x00" in name:
            raise Refused("name", name, "empty name or NUL byte")
        if nbytes(name) > 4096:
            raise Refused("name_length", name[:200], "name longer than 4096 bytes")
        if m.isdir():
            name = name.rstrip("/") or name
        if name.startswith("/"):
            raise Refused("absolute", name, "absolute paths are refused")
        parts = name.split("/")
        if ".." in parts:
            raise Refused("dotdot", name, "'..' components are refused")
        if "" in parts or "." in parts:
            raise Refused("name", name, "not a normalised path")
        if any(nbytes(p) > 255 for p in parts):
            raise Refused("name_length", name, "a component is longer than 255 bytes")
        if parts[0] != PREFIX:
            raise Refused("prefix", name, "every member must be below %r" % (PREFIX + "/"))
        rel = parts[1:]
        if rel and rel[0].startswith(RESERVED):
            raise Refused("reserved", name, "reserved name")
        if m.islnk():
            raise Refused("hardlink", name, "hardlinks are refused")
        if m.ischr() or m.isblk():
            raise Refused("device", name, "device nodes are refused")
        if m.isfifo():
            raise Refused("fifo", name, "FIFOs are refused")
        if m.isdir():
            kind = "dir"
        elif m.issym():
            if not link_ok(rel, m.linkname):
                raise Refused("symlink", name, "symlink target may point outside the workspace")
            kind = "symlink"
        elif m.isreg():
            kind = "file"
        else:
            raise Refused("type", name, "member type %r is not supported" % m.type)
        if not rel and kind != "dir":
            raise Refused("root", name, "the top member must be a directory")
        for i in range(1, len(rel)):
            p = "/".join(rel[:i])
            seen = self.kinds.get(p)
            if seen is None:
                self.kinds[p] = "implicit"
                self.more(name)
            elif seen not in ("dir", "implicit"):
                raise Refused("parent", name, "%r is a %s" % (p, seen))
        key = "/".join(rel)
        seen = self.kinds.get(key)
        if seen is not None and not (seen == "implicit" and kind == "dir"):
            raise Refused("duplicate", name, "duplicate member")
        self.kinds[key] = kind
        if kind == "file":
            if m.size < 0 or m.size > A["max_file"]:
                raise Refused("file_size", name, "file size out of range")
            stored = m.size
            # typeshed says bytes; tarfile keeps a list of (offset, size) pairs.
            sparse: Optional[List[Tuple[int, int]]] = m.sparse  # type: ignore[assignment]
            if sparse is not None:
                end = stored = 0
                if len(sparse) > 65536:
                    raise Refused("sparse", name, "too many sparse segments")
                for off, n in sparse:
                    if off < end or n < 0 or off + n > m.size:
                        raise Refused("sparse", name, "bad sparse map")
                    end = off + n
                    stored += n
            if not 0 <= span - stored < 512:
                raise Refused("corrupt", name, "data does not match the header")
            self.files += 1
            self.stored += stored
            if self.stored > A["max_bytes"]:
                raise Refused("size", name, "more than %d bytes of file data" % A["max_bytes"])
        return rel, kind


class Tree:
    def __init__(self, sfd: int) -> None:
        self.sfd = sfd
        self.parts: Tuple[str, ...] = ()
        self.fd = sfd
        self.dirs: List[Tuple[List[str], int, float]] = []
        self.top: List[Tuple[str, int, float]] = []

    def parent(self, rel: List[str]) -> int:
        parts = tuple(rel[:-1])
        if parts == self.parts:
            return self.fd
        if self.fd != self.sfd:
            os.close(self.fd)
        self.parts, self.fd = (), self.sfd
        fd = self.sfd
        for p in parts:
            try:
                nfd = opendir(p, fd)
            except FileNotFoundError:
                os.mkdir(p, 0o755, dir_fd=fd)
                nfd = opendir(p, fd)
            if fd != self.sfd:
                os.close(fd)
            fd = nfd
        self.parts, self.fd = parts, fd
        return fd

    def add(self, tar: tarfile.TarFile, m: tarfile.TarInfo, rel: List[str], kind: str) -> None:
        if not rel:
            return
        pfd = self.parent(rel)
        name = rel[-1]
        if kind == "dir":
            try:
                os.mkdir(name, 0o700, dir_fd=pfd)
            except FileExistsError:
                os.close(opendir(name, pfd))  # an implied directory: must be a real one
            self.dirs.append((rel, m.mode & 0o777, m.mtime))
        elif kind == "symlink":
            os.symlink(m.linkname, name, dir_fd=pfd)
        else:
            fd = os.open(name, NEWF, 0o600, dir_fd=pfd)
            try:
                src = tar.fileobj  # the Feed or FileFeed main() opened it on
                # typeshed says bytes; tarfile keeps a list of (offset, size) pairs.
                sparse: Optional[List[Tuple[int, int]]] = m.sparse  # type: ignore[assignment]
                segments = [(0, m.size)] if sparse is None else sparse
                if isinstance(src, FileFeed):
                    at = m.offset_data
                    for off, n in segments:
                        os.lseek(fd, off, os.SEEK_SET)
                        src.copy_to(fd, at, n, m.name)
                        at += n
                else:
                    feed: Feed = src  # type: ignore[assignment]
                    if feed.tell() != m.offset_data:
                        raise Refused("corrupt", m.name, "stream out of step")
                    for off, n in segments:
                        os.lseek(fd, off, os.SEEK_SET)
                        self.copy(feed, fd, n, m.name)
                if sparse is not None:
                    os.ftruncate(fd, m.size)
                os.fchmod(fd, m.mode & 0o777)
                os.utime(fd, (m.mtime, m.mtime))
            finally:
                os.close(fd)

    def copy(self, src: Feed, fd: int, n: int, member: str) -> None:
        while n:
            data = src.piece(min(CH, n))
            if not data:
                raise Refused("truncated", member, "the member's data is truncated")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            n -= len(data)

    def finish(self) -> None:
        # Directory modes last (a read-only directory must not stop its own
        # extraction), deepest first.  Top-level ones stay writable until the
        # swap: moving a directory to another parent needs write access to it.
        if self.fd != self.sfd:
            os.close(self.fd)
        self.parts, self.fd = (), self.sfd
        for rel, mode, mtime in sorted(self.dirs, key=lambda d: -len(d[0])):
            fd = self.sfd
            opened = []
            try:
                for p in rel:
                    fd = opendir(p, fd)
                    opened.append(fd)
                if len(rel) == 1:
                    self.top.append((rel[0], mode, mtime))
                    mode |= 0o700
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                for o in opened:
                    os.close(o)

    def settle(self, rootfd: int) -> None:
        for name, mode, mtime in self.top:
            fd = opendir(name, rootfd)
            try:
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)


def rmtree(name: str, dfd: int) -> None:
    try:
        fd = opendir(name, dfd)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        os.fchmod(fd, 0o700)
        for entry in listdir(fd):
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                rmtree(entry, fd)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


def sweep(rootfd: int) -> None:
    # Staging left by a restore whose extractor was killed: its pid is gone.
    for name in listdir(rootfd):
        if name.startswith(RESERVED) and name not in (STAGE, TRASH):
            try:
                pid = int(name.split("-")[2])
                if pid <= 0:
                    continue
                os.kill(pid, 0)
                continue
            except (ValueError, IndexError):
                continue
            except ProcessLookupError:
                pass
            except OSError:
                continue
            rmtree(name, rootfd)


def writable(name: str, rootfd: int, undo: List[Tuple[str, int]]) -> None:
    # An old top-level directory without owner write access cannot be moved
    # away: grant it for the move (undone if the swap is rolled back).
    fd = opendir(name, rootfd)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if not mode & 0o200:
            os.fchmod(fd, mode | 0o700)
            undo.append((name, mode))
    finally:
        os.close(fd)


def swap(rootfd: int, sfd: int) -> None:
    olds = [n for n in listdir(rootfd) if not n.startswith(RESERVED)]
    os.mkdir(TRASH, 0o700, dir_fd=rootfd)
    tfd = opendir(TRASH, rootfd)
    moved: List[str] = []
    placed: List[str] = []
    undo: List[Tuple[str, int]] = []
    try:
        for n in olds:
            if stat.S_ISDIR(os.stat(n, dir_fd=rootfd, follow_symlinks=False).st_mode):
                writable(n, rootfd, undo)
            os.rename(n, n, src_dir_fd=rootfd, dst_dir_fd=tfd)
            moved.append(n)
        for n in listdir(sfd):
            os.rename(n, n, src_dir_fd=sfd, dst_dir_fd=rootfd)
            placed.append(n)
    except OSError:
        for n in placed:
            os.rename(n, n, src_dir_fd=rootfd, dst_dir_fd=sfd)
        for n in moved:
            os.rename(n, n, src_dir_fd=tfd, dst_dir_fd=rootfd)
        for n, mode in undo:
            fd = opendir(n, rootfd)
            os.fchmod(fd, mode)
            os.close(fd)
        os.close(tfd)
        rmtree(TRASH, rootfd)
        raise
    os.close(tfd)
    try:
        rmtree(TRASH, rootfd)
    except OSError:
        pass  # the new contents are in place; old files we cannot remove stay hidden


def main() -> None:
    try:
        # A bigger stdin pipe: the agent writes our input in fewer, whole pieces.
        import fcntl

        fcntl.fcntl(0, 1031, CH)  # F_SETPIPE_SZ
    except (ImportError, OSError):
        pass
    rootfd = opendir(A["root"])
    sweep(rootfd)
    os.mkdir(STAGE, 0o700, dir_fd=rootfd)
    sfd = opendir(STAGE, rootfd)
    rules = Rules()
    direct = isinstance(A.get("file_fd"), int)
    try:
        feed = FileFeed(A["file_fd"]) if direct else Feed()
        tree = Tree(sfd)
        try:
            # tarfile only reads, seeks and tells a file object it is given
            # (it neither writes nor closes one): Feed has just those.  Left
            # open on purpose: the process ends with the stream.
            tar = tarfile.open(  # type: ignore[call-overload]  # noqa: SIM115
                fileobj=feed, mode="r:", encoding="utf-8", errors="surrogateescape"
            )
            while True:
                m = tar.next()
                if m is None:
                    break
                if direct and m.name == A["stop_at"]:
                    # The snapshot's metadata and end: the host reads those.
                    feed.done = True
                    break
                tar.members = []
                if tar.pax_headers:
                    raise Refused("global_header", m.name, "global PAX headers are refused")
                rel, kind = rules.check(m, tar.offset - m.offset_data)
                tree.add(tar, m, rel, kind)
            while isinstance(feed, Feed):  # a stream: only zeros may follow the archive
                rest = feed.piece(CH)
                if not rest:
                    break
                if rest.count(0) != len(rest):
                    raise Refused("corrupt", None, "data after the end of the archive")
        except (tarfile.TarError, EOFError, ValueError, struct.error) as exc:
            text = str(exc)
            rule = "truncated" if "unexpected end" in text else "corrupt"
            raise Refused(rule, None, "the archive is %s (%s)" % (rule, text[:300])) from None
        if not feed.done:
            raise Refused("corrupt", None, "the stream did not end where the archive ends")
        tree.finish()
        if direct:
            # Staged: the host now decides, once its own check of the file is done.
            os.write(1, b"staged\n")
        if sys.stdin.buffer.read(1) != b"C":
            raise Refused("aborted", None, "the host did not confirm the stream; nothing was changed")
        swap(rootfd, sfd)
        tree.settle(rootfd)
    except BaseException:
        try:
            rmtree(STAGE, rootfd)
        except OSError:
            pass
        raise
    os.rmdir(STAGE, dir_fd=rootfd)
    print(json.dumps({"ok": True, "files": rules.files, "entries": rules.entries, "bytes": rules.stored}))


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    A = json.loads(sys.argv[1])
    PREFIX = A["prefix"]
    STAGE = ".agentnest-restore-%d-%s" % (os.getpid(), A["token"])
    TRASH = ".agentnest-old-%d-%s" % (os.getpid(), A["token"])
    try:
        main()
    except Refused as exc:
        report(exc.rule, exc.member, exc.message)
    except OSError as exc:
        rule, message = oserror(exc)
        if rule == "no_space":
            message = (
                "the workspace is full: a restore holds the old and the new files at once "
                "while it stages (%s)" % message
            )
        report(rule, None, message)
