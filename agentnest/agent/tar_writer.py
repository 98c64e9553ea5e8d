"""The tar writer: streams a workspace tree to stdout as tar members (runs inside the sandbox).

Not part of the agent's bundle: the host (:mod:`agentnest.state.programs`)
reads this file's source and runs it through the agent channel as
``python3 -I -S -c SOURCE ARGS_JSON``.  ``-I`` keeps the workspace off
``sys.path`` (a planted ``tarfile.py`` is not imported) and ignores
``PYTHON*`` variables; ``-S`` skips site-packages.  So it imports nothing but
the stdlib, not even the agent's other modules, and keeps Python 3.8 syntax
(it runs on the image's Python).  It never follows a symlink: every
directory is opened with ``O_NOFOLLOW`` from its parent's descriptor.

Writes the tree at ``A["sub"]`` (below ``A["root"]``) to stdout as tar
members named below ``A["prefix"]``, without the end-of-archive marker (the
host adds it).  Sparse files become GNU sparse 1.0 members holding only their
data.  With ``A["budget"]`` it gives up (rule ``budget``) once the members
hold more data than that.  With ``A["wait"]`` it first waits for a ``g`` on stdin.  Structured
errors, and the list of skipped names at the end, go to stderr as one line
``agentnest-state: {json}``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tarfile

# Not `from typing import ...`: importing typing costs milliseconds of every
# snapshot, fork and download, and the annotations are only read by mypy.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from ._prelude import CH, DIRF, OUT, RESERVED, Refused, listdir, opendir, oserror, report

#: The host's arguments: JSON in ``sys.argv[1]``, read when run as a script.
A: Dict[str, Any]


BLK = 65536
ZERO = bytes(CH)
ZB = bytes(BLK)
SEEK: List[Optional[bool]] = [None]
SENDFILE = [True]
totals = {"bytes": 0, "entries": 0}
skipped: List[str] = []


def out(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(OUT, view) :]


def pad(n: int) -> None:
    if n % 512:
        out(bytes(512 - n % 512))


def count(arc: str, nbytes: int) -> None:
    totals["entries"] += 1
    totals["bytes"] += nbytes
    if totals["entries"] > A["max_entries"]:
        raise Refused("entries", arc, "the workspace has more than %d entries" % A["max_entries"])
    if totals["bytes"] > A["max_bytes"]:
        raise Refused("size", arc, "the workspace holds more than %d bytes" % A["max_bytes"])
    if A.get("budget") and totals["bytes"] > A["budget"]:
        # The host reads a frozen live workspace only while it is small; past
        # this it stops and starts again on a copy-on-write snapshot.
        raise Refused("budget", arc, "more than %d bytes: read a snapshot instead" % A["budget"])


def header(info: tarfile.TarInfo, pax: Optional[Dict[str, str]] = None) -> None:
    if pax:
        info.pax_headers = pax
    out(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))


def seek_map(fd: int, size: int) -> List[Tuple[int, int]]:
    segs: List[Tuple[int, int]] = []
    off = 0
    while off < size:
        try:
            data = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break
            raise
        if data >= size:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        segs.append((data, hole - data))
        off = hole
    return segs


def zero_map(fd: int, size: int) -> List[Tuple[int, int]]:
    # Without SEEK_HOLE (gVisor reports every block allocated) find the holes
    # by reading: reading a hole costs no copy from storage, only zero pages.
    segs: List[Tuple[int, int]] = []
    start: Optional[int] = None
    off = 0
    while off < size:
        buf = os.pread(fd, min(CH, size - off), off)
        if not buf:
            break
        n = len(buf)
        if buf == ZERO[:n]:
            if start is not None:
                segs.append((start, off - start))
                start = None
        else:
            view = memoryview(buf)
            for i in range(0, n, BLK):
                blk = view[i : i + BLK]
                if blk == ZB[: len(blk)]:
                    if start is not None:
                        segs.append((start, off + i - start))
                        start = None
                elif start is None:
                    start = off + i
        off += n
    if start is not None:
        segs.append((start, off - start))
    return segs


def data_map(fd: int, st: os.stat_result) -> Optional[List[Tuple[int, int]]]:
    size = st.st_size
    if size < 2 * BLK:
        return None
    if SEEK[0] is None:
        try:
            os.lseek(fd, 0, os.SEEK_HOLE)
            SEEK[0] = True
        except (OSError, AttributeError):
            SEEK[0] = False
    if SEEK[0]:
        if st.st_blocks * 512 >= size:
            return None
        segs = seek_map(fd, size)
    else:
        segs = zero_map(fd, size)
    if segs == [(0, size)] or len(segs) > 4096:
        return None
    return segs


def copy(fd: int, off: int, n: int) -> None:
    end = off + n
    while off < end:
        k = 0
        if SENDFILE[0]:
            try:
                k = os.sendfile(OUT, fd, off, min(4 * CH, end - off))
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                SENDFILE[0] = False
                continue
        else:
            buf = os.pread(fd, min(CH, end - off), off)
            k = len(buf)
            out(buf)
        if not k:
            # The file shrank while we read it: keep the promised size.
            while off < end:
                z = min(CH, end - off)
                out(bytes(z))
                off += z
            return
        off += k


def emit_file(dfd: int, name: str, arc: str) -> None:
    fd = os.open(name, DIRF, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            skipped.append(arc)
            return
        size = st.st_size
        segs = data_map(fd, st)
        info = tarfile.TarInfo(arc)
        info.mode = st.st_mode & 0o777
        info.mtime = int(st.st_mtime)
        if segs is None:
            count(arc, size)
            info.size = size
            header(info)
            copy(fd, 0, size)
            pad(size)
            return
        stored = sum(n for _, n in segs)
        count(arc, stored)
        entries = list(segs)
        if not entries or entries[-1][0] + entries[-1][1] < size:
            entries.append((size, 0))  # GNU tar marks a trailing hole this way
        smap = ("%d\n" % len(entries) + "".join("%d\n%d\n" % e for e in entries)).encode()
        smap += bytes(-len(smap) % 512)
        head, _, tail = arc.rpartition("/")
        fake = head + "/GNUSparseFile.0/" + tail
        info.name = fake
        info.size = len(smap) + stored
        # "path" first: tarfile applies PAX records in order, and
        # GNU.sparse.name must win over the placeholder name.
        pax = {
            "path": fake,
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": arc,
            "GNU.sparse.realsize": str(size),
        }
        header(info, pax)
        out(smap)
        for off, n in segs:
            copy(fd, off, n)
        pad(stored)
    finally:
        os.close(fd)


def visit(dfd: int, name: str, arc: str, top: bool = False) -> None:
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        count(arc, 0)
        info = tarfile.TarInfo(arc)
        info.type = tarfile.DIRTYPE
        info.mode = st.st_mode & 0o777
        info.mtime = int(st.st_mtime)
        header(info)
        fd = opendir(name, dfd)
        try:
            walk(fd, arc, top)
        finally:
            os.close(fd)
    elif stat.S_ISREG(st.st_mode):
        emit_file(dfd, name, arc)
    elif stat.S_ISLNK(st.st_mode):
        count(arc, 0)
        info = tarfile.TarInfo(arc)
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(name, dir_fd=dfd)
        info.mtime = int(st.st_mtime)
        header(info)
    else:
        skipped.append(arc)


def walk(fd: int, arc: str, top: bool = False) -> None:
    for name in sorted(listdir(fd)):
        if top and name.startswith(RESERVED):
            continue
        try:
            visit(fd, name, arc + "/" + name)
        except FileNotFoundError:
            pass  # removed while we walked


def main() -> None:
    # The host's in-process runner opens the directory for us (its thread
    # cannot pass through the host's private directories above it).  Every
    # descriptor is closed before returning: in-process, nothing else would.
    root = os.dup(A["root_fd"]) if "root_fd" in A else opendir(A["root"])
    opened = [root]
    try:
        parts = [p for p in A["sub"].split("/") if p]
        if not parts:
            st = os.fstat(root)
            count(A["prefix"], 0)
            info = tarfile.TarInfo(A["prefix"])
            info.type = tarfile.DIRTYPE
            info.mode = st.st_mode & 0o777
            info.mtime = int(st.st_mtime)
            header(info)
            walk(root, A["prefix"], top=True)
            return
        dfd = root
        for p in parts[:-1]:
            dfd = opendir(p, dfd)
            opened.append(dfd)
        visit(dfd, parts[-1], A["prefix"])
    finally:
        for fd in opened:
            os.close(fd)


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    A = json.loads(sys.argv[1])
    if A.get("wait") and sys.stdin.buffer.read(1) != b"g":
        report("aborted", None, "the host called the stream off", code=4)
    try:
        main()
    except Refused as exc:
        report(exc.rule, exc.member, exc.message)
    except OSError as exc:
        rule, message = oserror(exc)
        report(rule, A["sub"] or None, message)
    note = {"skipped": skipped[:1000], "nskipped": len(skipped)}
    sys.stderr.write("agentnest-state: " + json.dumps(note) + "\n")
