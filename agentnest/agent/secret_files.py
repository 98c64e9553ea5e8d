"""Write ``Secret(..., as_file=True)`` values (a JSON object on stdin) into the secret directory.

Runs in the sandbox as ``python3 -I -S -c <this file> <directory>``: a private
directory and 0400 files, no link followed, each written then renamed.
Standard library only.
"""

from __future__ import annotations

import json
import os
import stat
import sys


def main() -> None:
    d = sys.argv[1]
    os.umask(0o077)
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        sys.exit("refusing " + d + ": not our own directory")
    for name, value in json.load(sys.stdin).items():
        path = os.path.join(d, name)
        fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o400)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        os.replace(path + ".new", path)


if __name__ == "__main__":
    main()
