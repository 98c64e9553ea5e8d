"""The bridge: one host connection to a pod's agent (runs inside the sandbox).

Not part of the agent's bundle: the Kubernetes backend runs this file's
source as ``python3 -I -S -c SOURCE SOCKET_PATH`` through the pod's exec
endpoint, and its stdin and stdout become the agent channel: it relays bytes
between them and the agent's unix socket (``agent.loop.listen``), and exits
when either side closes.  The agent lives on in the pod's main process, so a
dropped exec stream loses no command or session; the host connects again.

Stdlib only, Python 3.8 syntax (it runs on the image's Python).  ``-I``
keeps the workspace off ``sys.path``.  It holds nothing of its own: every
byte it relays is the host's or the agent's, and both check what they get.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import time

CHUNK = 1 << 20


def relay(path: str, wait: float = 0.0) -> int:
    # A new pod's keeper may still be starting its agent: wait for the socket
    # up to ``wait`` seconds (no inotify in the stdlib: a short poll).
    deadline = time.monotonic() + wait
    # "@name": an abstract socket (argv cannot carry its leading NUL byte).
    address = "\0" + path[1:] if path.startswith("@") else path
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address)
            break
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            if time.monotonic() >= deadline:
                sys.stderr.write("agentnest-bridge: cannot reach the agent at %s: %s\n" % (path, exc))
                return 3
            time.sleep(0.05)
        except OSError as exc:
            sock.close()
            sys.stderr.write("agentnest-bridge: cannot reach the agent at %s: %s\n" % (path, exc))
            return 3
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    out = sock.fileno()
    # poll, not select: under gVisor with the runtime's default seccomp
    # profile (--oci-seccomp) select(2) fails with EPERM.
    poller = select.poll()
    for fd in (stdin, out):
        poller.register(fd, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == stdin:
                data = os.read(stdin, CHUNK)
                if not data:
                    return 0  # the host is done (or the exec stream was closed)
                sock.sendall(data)
            else:
                data = sock.recv(CHUNK)
                if not data:
                    return 0  # the agent closed this connection (another host took over)
                view = memoryview(data)
                while view:
                    view = view[os.write(stdout, view) :]


if __name__ == "__main__":
    sys.exit(relay(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0))
