"""What the in-sandbox programs share: prepended to each one's source by the host.

The tar writer, the extractor and the hasher run as ``python3 -I -S -c SOURCE``: no
imports of their own beyond the stdlib, so the host
(:func:`agentnest.state.programs._source`) sends this file's text in front of each
program's.  The programs name these definitions under ``if TYPE_CHECKING`` only, for
mypy; at run time they are already defined above them.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, NoReturn, Optional, Tuple

CH = 1 << 20
#: Where a program writes its output: stdout when it runs as a script; the
#: host's in-process runner (agentnest.state.host) sets its own pipe instead.
OUT = 1
DIRF = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
RESERVED = (".agentnest-restore-", ".agentnest-old-")


class Refused(Exception):
    def __init__(self, rule: str, member: Optional[str], message: str) -> None:
        Exception.__init__(self, message)
        self.rule, self.member, self.message = rule, member, message


def report(rule: str, member: Optional[str], message: str, code: int = 3) -> NoReturn:
    note = {"rule": rule, "member": member, "message": message}
    sys.stderr.write("agentnest-state: " + json.dumps(note) + "\n")
    sys.stderr.flush()
    os._exit(code)


def listdir(fd: int) -> List[str]:
    """The names in directory ``fd``, as they are now.

    Rewound first: btrfs fixes what a directory descriptor lists when it is
    rewound (which os.listdir does after reading), so a descriptor listed
    before would miss entries made since.
    """
    os.lseek(fd, 0, os.SEEK_SET)
    return os.listdir(fd)


def opendir(name: str, dfd: Optional[int] = None) -> int:
    # No O_DIRECTORY: gVisor (2022) follows a final symlink when it is combined
    # with O_NOFOLLOW.  Open, then check.
    fd = os.open(name, DIRF, dir_fd=dfd)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.ENOTDIR, "not a directory (or a symlink)", name)
    return fd


def oserror(exc: OSError) -> Tuple[str, str]:
    code = {
        errno.ENOENT: "not_found",
        errno.ENOSPC: "no_space",
        errno.EDQUOT: "no_space",
        errno.ENOTDIR: "not_directory",
        errno.ELOOP: "symlink",
        errno.EACCES: "permission",
        errno.EPERM: "permission",
    }.get(exc.errno or 0, "io")
    return code, "%s: %s" % (exc.filename or "", exc.strerror or exc)
