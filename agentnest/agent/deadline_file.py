"""Runs in a Docker sandbox as root: write or read the moved deadline that ``Sandbox.extend`` records.

Shipped as source on the command line by :mod:`agentnest.runtime.docker.deadline`
through the engine (``docker exec --user 0``)::

    python3 -I -S -c SOURCE write PATH SECONDS   # write it atomically, never through a link
    python3 -I -S -c SOURCE read PATH            # print it, only from a root-owned regular file

``PATH`` is :data:`agentnest.runtime.bootstrap.DEADLINE_FILE`.  Sandbox code
runs as another user without capabilities: it cannot write a root-owned
file, but it may plant one of its own or a link first.  ``write`` creates
its temporary name exclusively and without following links (anything in the
way makes it fail, and the host keeps the old deadline: fail closed);
``read`` prints nothing for a file that root does not own.
"""

from __future__ import annotations

import os
import stat
import sys


def write(path: str, value: str) -> None:
    fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.write(fd, value.encode())
    os.close(fd)
    try:
        os.rename(path + ".new", path)
    except OSError:
        os.unlink(path + ".new")
        raise


def read(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise SystemExit(0) from None
    st = os.fstat(fd)
    if st.st_uid == 0 and stat.S_ISREG(st.st_mode):
        print(os.read(fd, 64).decode("ascii", "replace").strip())


if sys.argv[1] == "write":
    write(sys.argv[2], sys.argv[3])
elif sys.argv[1] == "read":
    read(sys.argv[2])
else:
    raise SystemExit("usage: write PATH SECONDS | read PATH")
