"""The hasher: lists and hashes the workspace files a pattern matches (runs inside the sandbox).

Not part of the agent's bundle: the host (:mod:`agentnest.state.programs`)
reads this file's source and runs it through the agent channel as
``python3 -I -S -c SOURCE ARGS_JSON``.  ``-I`` keeps the workspace off
``sys.path`` (a planted ``hashlib.py`` is not imported) and ignores
``PYTHON*`` variables; ``-S`` skips site-packages.  So it imports nothing but
the stdlib, not even the agent's other modules, and keeps Python 3.8 syntax
(it runs on the image's Python).  It never follows a symlink: every
directory is opened with ``O_NOFOLLOW`` from its parent's descriptor.

Prints one JSON line ``[path, size, sha256]`` per regular file below
``A["base"]`` whose workspace-relative path matches ``A["regex"]``, at most
``A["max_files"]`` of them; structured errors go to stderr as one line
``agentnest-state: {json}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys

# Not `from typing import ...`: importing typing costs milliseconds of every
# listing, and the annotations are only read by mypy.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Pattern, Tuple

    from ._prelude import CH, DIRF, RESERVED, Refused, listdir, opendir, oserror, report

#: The host's arguments: JSON in ``sys.argv[1]``, read when run as a script.
A: Dict[str, Any]


#: Compiled from ``A["regex"]`` when run as a script.
RX: Pattern[str]
found = [0]


def digest(dfd: int, name: str) -> Optional[Tuple[int, str]]:
    fd = os.open(name, DIRF, dir_fd=dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        h = hashlib.sha256()
        size = 0
        while True:
            buf = os.read(fd, CH)
            if not buf:
                return size, h.hexdigest()
            size += len(buf)
            h.update(buf)
    finally:
        os.close(fd)


def walk(dfd: int, rel: str) -> None:
    for name in sorted(listdir(dfd)):
        if not rel and name.startswith(RESERVED):
            continue
        path = rel + "/" + name if rel else name
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                fd = opendir(name, dfd)
                try:
                    walk(fd, path)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode) and RX.fullmatch(path):
                got = digest(dfd, name)
                if got is None:
                    continue
                found[0] += 1
                if found[0] > A["max_files"]:
                    limit = A["max_files"]
                    raise Refused("entries", path, "more than %d files match; narrow the pattern" % limit)
                sys.stdout.write(json.dumps([path, got[0], got[1]]) + "\n")
        except FileNotFoundError:
            pass


def main() -> None:
    fd = opendir(A["root"])
    rel = ""
    for p in [p for p in A["base"].split("/") if p]:
        try:
            fd = opendir(p, fd)
        except (FileNotFoundError, NotADirectoryError):
            sys.exit(0)
        rel = rel + "/" + p if rel else p
    walk(fd, rel)
    sys.stdout.flush()


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    A = json.loads(sys.argv[1])
    RX = re.compile(A["regex"], re.S)
    try:
        main()
    except Refused as exc:
        sys.stdout.flush()
        report(exc.rule, exc.member, exc.message)
    except OSError as exc:
        rule, message = oserror(exc)
        report(rule, None, message)
