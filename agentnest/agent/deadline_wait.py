"""Runs in a pod after ``extend()``: wait for the kubelet to show the new deadline, then tell the keeper.

The host patched the pod's ``agentnest.io/deadline`` annotation; the kubelet
copies it into the pod's downwardAPI volume (read-only, root-owned) a moment
later.  This waits, at most ``TIMEOUT`` seconds, until that copy reads at
least ``WANTED`` (epoch seconds), then sends SIGUSR1 to PID 1, the keeper,
which re-arms its timer from the file (``agentnest.runtime.bootstrap``).  It
runs as the sandbox's user, as PID 1 does, so the signal is allowed; sandbox
code can send it too, to no effect: the keeper trusts only the kubelet's file.

Shipped as source on the command line: ``python3 -I -S -c SOURCE PATH WANTED
TIMEOUT``.  Prints what the file said last; exit 0 once it showed the new
deadline, 3 if it did not within the timeout.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def read(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read(64))
    except (OSError, ValueError):
        return None


def main() -> int:
    path, wanted, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    end = time.monotonic() + timeout
    while True:
        seen = read(path)
        if seen is not None and seen >= wanted:
            os.kill(1, signal.SIGUSR1)
            print(seen)
            return 0
        if time.monotonic() >= end:
            print(seen)
            return 3
        # The kubelet rewrites the file on its own schedule; nothing to wait on but time.
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
