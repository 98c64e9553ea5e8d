"""Ship the agent into a sandbox over its own stdin.

A backend starts ``python3 -S -c BOOTSTRAP MODE [SECONDS]`` inside the
sandbox with stdin/stdout connected to the host, then writes
:func:`.launch.bundle` to it.  The bootstrap loads the agent's modules from
that bundle straight into memory: nothing is written to the sandbox's
filesystem, so a read-only root and a remote engine both work, and the
sandbox cannot plant a modified agent for the next start.  This module
keeps PID 1, its deadline and :func:`command`, the argv of every mode;
packing the bundle, the pod's argv that carries it and those of the other
shipped programs are :mod:`.launch`'s plumbing, which imports from here.

Modes:

``keeper SECONDS``
    Used as the container's main process (PID 1).  It forks the agent (which
    keeps the host's stream), then waits: it reaps orphans like an init, and
    exits when its timer fires at the deadline, which stops the container
    whether or not the host is still alive.  On SIGUSR1 it re-arms the timer
    from the root-owned deadline file that ``Sandbox.extend`` writes (see
    :mod:`agentnest.runtime.docker.deadline`).  Signals without a handler do not
    reach PID 1 from inside its namespace, so sandbox code cannot kill it.
    The engine does not end an attach stream while the container runs, so
    when the agent dies PID 1 writes :data:`AGENT_EXITED` to stderr and the
    host treats that as the end of the stream; the backend then starts a new
    agent in ``agent`` mode (whose exec stream ends when it exits).
``agent``
    Just the agent (restarts, and backends that keep the lifetime elsewhere).
``listen SECONDS SOCKET BUNDLE``
    The keeper of a Kubernetes pod: the bundle comes in the argv (base64),
    the agent listens on the unix socket ``SOCKET`` for hosts that connect
    through ``agent/bridge.py`` (see :func:`.launch.listen_command`), and a
    dead agent is started again.
"""

from __future__ import annotations

from .unpack import UNPACK

PACKAGE = "agentnest_agent"
#: What PID 1 writes to the container's stderr when the first agent exits.
AGENT_EXITED = b"\x00AGENTNEST-AGENT-EXITED\x00"
#: A moved deadline (epoch seconds), written by the host as root; see ``rearm`` below.
DEADLINE_FILE = "/tmp/.agentnest-deadline"
#: A pod's deadline (epoch seconds) as the kubelet writes it from the pod's
#: ``agentnest.io/deadline`` annotation (a downwardAPI volume: read-only,
#: root-owned); a listening keeper reads it instead of :data:`DEADLINE_FILE`.
PODINFO_DEADLINE = "/etc/agentnest/podinfo/deadline"
#: Open files per process in a sandbox (RLIMIT_NOFILE, hard and soft).
NOFILE = 4096

BOOTSTRAP = UNPACK + (
    r"""
import os, sys
LAZY = ("sessions", "repl")  # compiled by the agent on first use (repl: only by a session)
def load(blob=None):
    if blob is None:
        b = sys.stdin.buffer
        n = int(b.readline())
        blob = b.read(n)
    pkg, define, mods = unpack("%(pkg)s", blob, LAZY)
    # Python sessions start from these (there are no files); keep only what
    # they need, an idle sandbox's memory is counted.
    pkg.sources = dict((k, v) for k, v in mods if k in ("wire", "limits", "sessions", "repl"))
    pkg.define = lambda name: define(name, pkg.sources[name])  # lazy modules
    del mods
    return sys.modules["%(pkg)s.loop"]
if sys.argv[1] in ("keeper", "listen"):
    import signal
    LISTEN = sys.argv[1] == "listen"
    if LISTEN:
        import base64
        BLOB = base64.b64decode(sys.argv[4])
        # A pod has no ulimit field: the keeper lowers its own limits (hard
        # and soft) before anything else runs, so every process of the
        # sandbox inherits them and none can raise them back (no
        # CAP_SYS_RESOURCE).  The Docker backend sets the same as ulimits.
        import resource
        for res, value in ((resource.RLIMIT_NOFILE, %(nofile)s), (resource.RLIMIT_CORE, 0)):
            try:
                soft, hard = resource.getrlimit(res)
                value = value if hard < 0 else min(value, hard)
                resource.setrlimit(res, (value, value))
            except (OSError, ValueError):
                pass
    # PID 1 runs as the sandbox's UID: made non-dumpable, code of that UID
    # cannot open /proc/1/mem (or ptrace it) to rewrite the deadline away.
    try:
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except Exception:
        pass
    # Every catchable signal is ignored (Python's own SIGINT handler too):
    # sandbox code must not end its sandbox early.  gVisor delivers signals
    # to PID 1 even without a handler, so ignoring is the only protection there.
    KEEP = (signal.SIGALRM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGKILL, signal.SIGSTOP,
            signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)
    IGNORED = []
    for sig in range(1, signal.NSIG):
        if sig not in KEEP:
            try:
                signal.signal(sig, signal.SIG_IGN)
                IGNORED.append(sig)
            except (OSError, RuntimeError, ValueError):
                pass
    def rearm(*a):
        # A moved deadline (Sandbox.extend): only from a root-owned regular
        # file, which sandbox code (uid 65532, no capabilities) cannot write.
        # In a pod, the kubelet's copy of the deadline annotation (it swaps
        # a symlink to update it, so the link is followed there); a True
        # return means the timer now runs to a later deadline.
        try:
            if LISTEN:
                fd = os.open("%(podinfo)s", os.O_RDONLY | os.O_NONBLOCK)
            else:
                fd = os.open("%(deadline)s", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if st.st_uid != 0 or st.st_mode & 0o170000 != 0o100000:
                return False
            import time
            left = float(os.read(fd, 64)) - time.time()
        except (OSError, ValueError):
            return False
        finally:
            os.close(fd)
        if left == left:  # not NaN
            if left <= 0:
                os._exit(0)
            signal.setitimer(signal.ITIMER_REAL, left)
            return True
        return False
    def expire(*a):
        # The deadline: PID 1 exits and the container stops.  A pod's keeper
        # first reads the kubelet's copy: extend() may have moved it while
        # its signal was on the way.
        if not (LISTEN and rearm()):
            os._exit(0)
    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, float(sys.argv[2]))
    signal.signal(signal.SIGUSR1, rearm)
    # Objects made so far are shared with the agent after the fork; frozen,
    # the agent's garbage collections do not touch (and so copy) their pages.
    import gc
    gc.freeze()
    def start_agent():
        agent = os.fork()
        if agent == 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            for sig in IGNORED:  # ignored dispositions survive exec: not for commands
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if LISTEN:
                load(BLOB).listen(sys.argv[3])
            else:
                load().main()
            os._exit(0)
        return agent
    agent = start_agent()
    started = os.times()[4]
    fd = os.open("/dev/null", os.O_RDWR)
    os.dup2(fd, 0); os.dup2(fd, 1)
    # PID 1 reaps every orphan.  When the agent dies: in listen mode (a pod)
    # it starts a new one on the socket (hosts reconnect; sessions are lost),
    # at most once a second; otherwise it says so on stderr, which the host
    # reads as the end of this agent's stream.
    while True:
        try:
            pid, _ = os.wait()
        except ChildProcessError:
            signal.pause()
            continue
        if pid == agent:
            if LISTEN:
                left = 1.0 - (os.times()[4] - started)
                if left > 0:
                    import time
                    time.sleep(left)  # a crash loop stays a slow one
                agent = start_agent()
                started = os.times()[4]
            else:
                os.write(2, b"\n\x00AGENTNEST-AGENT-EXITED\x00\n")
else:
    load().main()
""".replace("%(pkg)s", PACKAGE)
    .replace("%(deadline)s", DEADLINE_FILE)
    .replace("%(podinfo)s", PODINFO_DEADLINE)
    .replace("%(nofile)s", str(NOFILE))
)


def command(mode: str, python: str = "python3", lifetime: float | None = None, *args: str) -> list[str]:
    """The argv that starts the bootstrap in ``mode``, then ``args``.

    The keepers (``keeper``, ``listen``) need the ``lifetime``: their timer
    runs at least a second.  ``listen``'s ``args`` are the socket and the
    bundle (:func:`.launch.listen_command`).
    """
    argv = [python, "-S", "-c", BOOTSTRAP, mode]
    if mode in ("keeper", "listen"):
        if lifetime is None:
            raise ValueError(f"{mode} mode needs a lifetime")
        argv.append(f"{max(1.0, lifetime):.3f}")
    return [*argv, *args]
