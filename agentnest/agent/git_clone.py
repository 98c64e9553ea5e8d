"""Runs in the sandbox: ``git clone`` with credentials read from stdin, never from argv or the environment.

Shipped as source on the command line by :meth:`agentnest.git.GitWorkspace.clone`
(``python3 -I -S -c SOURCE <git argv...>``); its stdin is git's credential
format (``username=...\\npassword=...\\n``).  /tmp is mounted noexec, so no
askpass program can live there: a shell credential helper (``!...``, run by
git with ``sh -c``) ``cat``s a file that only this user can read instead, so
the value is in no argv either.  The file lives in a fresh 0700 directory and
is removed when git exits.  Exits with git's status.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

answer = sys.stdin.read()
os.umask(0o077)
home = tempfile.mkdtemp(prefix=".agentnest-git-", dir="/tmp")
try:
    path = os.path.join(home, "credential")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    with os.fdopen(fd, "w") as f:
        f.write(answer)
    del answer
    argv = sys.argv[1:]
    # After the "credential.helper=" that empties the list, so ours is the only one;
    # it answers "get" only, so nothing is ever stored.
    at = argv.index("credential.helper=") + 1
    helper = "credential.helper=!f() { test \"$1\" = get && cat '%s'; }; f" % path
    argv[at:at] = ["-c", helper]
    code = subprocess.call(argv, stdin=subprocess.DEVNULL)
finally:
    shutil.rmtree(home, ignore_errors=True)
sys.exit(code)
