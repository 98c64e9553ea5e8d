"""Running commands: spawn, collect output, time out, kill whole process trees.

Each command runs in its own session (``setsid``), so its process group is
its own.  The agent is a child subreaper, so orphaned descendants are
reparented to it and reaped (no zombies pile up).  Every command's
environment carries a marker, ``AGENTNEST_EXEC``; a tree kill takes every
process that descends from the command, shares its session or process group,
or carries its marker -- which catches the double-forked daemon that called
``setsid`` and was reparented away.  Killing is SIGKILL, repeated until a scan
finds nothing: SIGTERM could be ignored and the command has already had its
time.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from typing import Dict, List, Optional, Set, Tuple

MARKER = "AGENTNEST_EXEC"
#: After the main process exits, how long to keep reading output that its
#: still-running background children may hold open before reporting.
DRAIN_GRACE = 0.1


def harden() -> Dict[str, bool]:
    """Process attributes the agent sets on itself (Linux; best effort).

    * child subreaper: orphaned descendants are reparented to the agent and
      reaped, and stay attributable to their command;
    * not dumpable: processes of the same UID (the sandboxed code) cannot
      open ``/proc/<agent>/fd/*`` or ptrace it, so they cannot inject bytes
      into its channel.  (Code can still kill the agent; the host restarts it.)
    """
    done = {"subreaper": False, "undumpable": False}
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        done["subreaper"] = libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
        done["undumpable"] = libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
        # Give the heap that loading the agent used back to the system: an
        # idle sandbox should cost as little memory as possible.
        import gc

        gc.collect()
        trim = getattr(libc, "malloc_trim", None)
        if trim is not None:
            trim(0)
    except Exception:  # noqa: S110 - non-Linux or no ctypes: run without them
        pass
    return done


class Command:
    """One running command and the bookkeeping to report it."""

    __slots__ = (
        "deadline",
        "exited_at",
        "fds",
        "id",
        "killed",
        "limit",
        "marker",
        "pid",
        "proc",
        "pty_fd",
        "pty_name",
        "sent",
        "started",
        "status",
        "stdin_eof",
        "stdin_fd",
        "stdin_queue",
        "terminal",
        "timed_out",
        "truncated",
    )

    def __init__(self, cid: int, proc: "subprocess.Popen[bytes]", marker: str, limit: int) -> None:
        self.id = cid
        self.proc = proc
        self.pid = proc.pid
        self.fds: Dict[int, int] = {}
        self.stdin_fd: Optional[int] = None
        # The master side of the command's pseudo-terminal, if it has one
        # (output is read from it; stdin and resizes go to it).
        self.pty_fd: Optional[int] = None
        self.pty_name: Optional[str] = None
        self.terminal = False
        # memoryviews: a partial pipe write advances a view instead of copying
        # the rest of the chunk (which made large stdin quadratic).
        self.stdin_queue: List[memoryview] = []
        self.stdin_eof = False
        self.deadline: Optional[float] = None
        self.limit = limit
        self.sent = 0
        self.truncated = False
        self.timed_out = False
        self.killed = False
        self.started = time.monotonic()
        self.status: Optional[int] = None
        self.exited_at: Optional[float] = None
        self.marker = marker

    def done(self) -> bool:
        if self.status is None:
            return False
        if not self.fds:
            return True
        return self.exited_at is not None and time.monotonic() - self.exited_at >= DRAIN_GRACE

    def take(self, data: bytes) -> bytes:
        """Apply the output budget; return the part that may be sent."""
        room = self.limit - self.sent
        if room <= 0:
            self.truncated = True
            return b""
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        self.sent += len(data)
        return data

    def exit_fields(self) -> Tuple[Optional[int], Optional[int]]:
        status = self.status if self.status is not None else 0
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return 128 + sig, sig
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status), None
        return -1, None


def spawn(
    cid: int,
    argv: List[str],
    env: Dict[str, str],
    cwd: str,
    want_stdin: bool,
    limit: int,
    token: str,
    pty: Optional[Tuple[int, int]] = None,
) -> Command:
    """Start a command in a new session with piped output (or on a new pseudo-terminal)."""
    marker = "%s-%d" % (token, cid)
    full_env = dict(env)
    full_env[MARKER] = marker
    if pty is not None:
        return _spawn_pty(cid, argv, full_env, cwd, limit, marker, pty)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if want_stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=full_env,
        start_new_session=True,
        close_fds=True,
    )
    cmd = Command(cid, proc, marker, limit)
    assert proc.stdout is not None and proc.stderr is not None
    for stream, fd_no in ((proc.stdout, 1), (proc.stderr, 2)):
        fd = stream.fileno()
        os.set_blocking(fd, False)
        _grow_pipe(fd)
        cmd.fds[fd] = fd_no
    if proc.stdin is not None:
        cmd.stdin_fd = proc.stdin.fileno()
        os.set_blocking(cmd.stdin_fd, False)
        _grow_pipe(cmd.stdin_fd)
    return cmd


def _spawn_pty(
    cid: int,
    argv: List[str],
    env: Dict[str, str],
    cwd: str,
    limit: int,
    marker: str,
    size: Tuple[int, int],
) -> Command:
    """Start a command whose stdin, stdout and stderr are a new pseudo-terminal.

    The command leads a new session (``setsid``) and takes the terminal's
    slave side as its controlling terminal (``TIOCSCTTY``), so job control,
    ^C and window-size changes work as in a real terminal.  The agent keeps
    the master side: reading it is the command's output (fd 1 on the wire,
    stdout and stderr are one stream on a terminal), writing it is typing.
    The tree kill is unchanged: the session is the command's own.
    """
    master, slave = os.openpty()
    try:
        set_window_size(slave, size[0], size[1])
        name = os.ttyname(slave)
        proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
            # preexec_fn is unsafe with threads; the agent has one.
            preexec_fn=_take_terminal,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        # Only the command holds the slave side now: when it (and whatever it
        # started on the terminal) is gone, reading the master ends with EIO.
        os.close(slave)
    cmd = Command(cid, proc, marker, limit)
    os.set_blocking(master, False)
    cmd.pty_fd = master
    cmd.pty_name = name
    cmd.terminal = True
    cmd.fds[master] = 1
    # A second descriptor for writing: the selector keys registrations by fd,
    # and the master is already registered for reading.
    cmd.stdin_fd = os.dup(master)
    return cmd


# -- terminal signals ------------------------------------------------------------------------
#
# On Linux, ^C, ^\ and ^Z typed into a terminal become SIGINT, SIGQUIT and
# SIGTSTP for its foreground process group (the line discipline's ISIG).
# gVisor (2022 releases) passes them through as plain input instead, so ^C
# could not stop anything in ``agentnest shell``.  The agent probes once, on
# its first terminal, which kind of kernel it has, and where the kernel does
# not, it does what the line discipline would for the three characters.

_TTY_SIGNALS: Optional[bool] = None
_CONTROL = re.compile(b"[\\x00-\\x1f\\x7f]")

_PROBE = (
    "import os, signal, termios\n"
    "signal.signal(signal.SIGINT, lambda *a: os._exit(42))\n"
    "t = termios.tcgetattr(0); t[3] &= ~termios.ICANON; t[6][termios.VMIN] = 1\n"
    "termios.tcsetattr(0, termios.TCSANOW, t)\n"
    "os.write(1, b'r')\n"
    "os._exit(7 if os.read(0, 1) else 8)\n"
)


def kernel_sends_tty_signals(python: str) -> bool:
    """Whether this kernel turns a typed ^C into SIGINT (probed once, with ``python``)."""
    global _TTY_SIGNALS
    if _TTY_SIGNALS is None:
        _TTY_SIGNALS = _probe_tty_signals(python)
    return _TTY_SIGNALS


def _probe_tty_signals(python: str) -> bool:
    # A child on a new terminal, with ISIG on and ICANON off, is sent ^C: a
    # kernel that signals ends it with 42; one that does not lets it read the
    # byte (7).  Either answer comes at once; anything else counts as Linux.
    master, slave = os.openpty()
    ready_r, ready_w = os.pipe()
    try:
        try:
            proc = subprocess.Popen(
                [python, "-S", "-c", _PROBE],
                stdin=slave,
                stdout=ready_w,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                preexec_fn=_take_terminal,
            )
        except OSError:
            return True
        os.close(ready_w)
        ready_w = -1
        try:
            os.read(ready_r, 1)  # its handler and terminal mode are set
            os.write(master, b"\x03")
            code = proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
            return True
        return code != 7
    finally:
        for fd in (master, slave, ready_r, ready_w):
            if fd >= 0:
                os.close(fd)


def needs_terminal_signals(data: bytes, python: str) -> bool:
    """Whether keystrokes ``data`` need :func:`terminal_input` on this kernel."""
    # Signal characters are control characters (or DEL) in practice: plain
    # typing does not pay for a look at the terminal's settings.
    return _CONTROL.search(data) is not None and not kernel_sends_tty_signals(python)


def terminal_input(cmd: Command, data: bytes) -> bytes:
    """Act on the signal characters in keystrokes for ``cmd``'s terminal, as Linux would.

    Returns the bytes still to be written to the terminal.  Called only
    where the kernel does not do this itself (see :func:`kernel_sends_tty_signals`).
    """
    if cmd.pty_name is None:
        return data
    import termios

    try:
        fd = os.open(cmd.pty_name, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return data
    try:
        attrs = termios.tcgetattr(fd)
        if not attrs[3] & termios.ISIG:
            return data
        cc = attrs[6]
        chars: Dict[int, int] = {}
        for index, number in (
            (termios.VINTR, signal.SIGINT),
            (termios.VQUIT, signal.SIGQUIT),
            (termios.VSUSP, signal.SIGTSTP),
        ):
            c = cc[index]
            value = c[0] if isinstance(c, bytes) else c
            if value:  # 0 (_POSIX_VDISABLE) switches it off
                chars[value] = number
        out = bytearray()
        for byte in data:
            sig = chars.get(byte)
            if sig is None:
                out.append(byte)
                continue
            if not attrs[3] & termios.NOFLSH:
                # The keystrokes not yet read are discarded, as a signal
                # character does on Linux (what precedes it in this chunk too).
                del out[:]
                cmd.stdin_queue.clear()
                try:
                    termios.tcflush(fd, termios.TCIFLUSH)
                except termios.error:
                    pass
            for group in _foreground_groups(fd, cmd.pid):
                try:
                    os.killpg(group, sig)
                except OSError:
                    pass
        return bytes(out)
    except termios.error:
        return data
    finally:
        os.close(fd)


def _foreground_groups(fd: int, session: int) -> List[int]:
    """The terminal's foreground process group, or the best guess where the kernel hides it.

    gVisor answers ``TIOCGPGRP`` only to members of the terminal's session
    and leaves ``tpgid`` out of ``/proc/<pid>/stat``; the agent is not in the
    session.  Then the guess is the session's process groups other than its
    leader's (a shell's jobs: under job control the foreground job is one of
    them), or the leader's own group if it has started none.  Background jobs
    of a shell are hit too there, where Linux would spare them.
    """
    try:
        return [os.tcgetpgrp(fd)]
    except OSError:
        pass
    groups = set()
    for pid in _pids():
        st = _proc_stat(pid)
        if st is not None and st[2] == session:
            groups.add(st[1])
    jobs = sorted(groups - {session})
    return jobs or [session]


def _take_terminal() -> None:
    """In a child after ``setsid()``: make its stdin, a terminal, the controlling one."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def set_window_size(fd: int, rows: int, cols: int) -> None:
    """Set a terminal's size (the kernel signals SIGWINCH to its foreground group)."""
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _grow_pipe(fd: int) -> None:
    # Bigger pipes mean fewer wakeups and frames for bulk output.
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, 1024 * 1024)  # F_SETPIPE_SZ
    except OSError:
        pass


def _pids() -> List[str]:
    """The process ids in /proc (as strings), or none if it cannot be read."""
    try:
        return [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _proc_stat(pid: str) -> Optional[Tuple[int, int, int]]:
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        if fields[0] in (b"Z", b"X"):
            return None  # already dead; the main loop reaps it
        return int(fields[1]), int(fields[2]), int(fields[3])  # ppid, pgrp, session
    except (IndexError, ValueError):
        return None


def _has_marker(pid: str, marker: bytes) -> bool:
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            return marker in f.read().split(b"\x00")
    except OSError:
        return False


def tree(root: int, marker: str) -> Set[int]:
    """Every live process that belongs to the command rooted at ``root``."""
    me = os.getpid()
    needle = ("%s=%s" % (MARKER, marker)).encode()
    parents: Dict[int, int] = {}
    members: Set[int] = set()
    for p in _pids():
        pid = int(p)
        if pid in (me, 1):
            continue
        st = _proc_stat(p)
        if st is None:
            continue
        ppid, pgrp, sid = st
        parents[pid] = ppid
        if pid == root or pgrp == root or sid == root or _has_marker(p, needle):
            members.add(pid)
    # Descendants of any member (a child that cleared its environment and
    # started a new session is still below its parent until that exits).
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if pid not in members and ppid in members:
                members.add(pid)
                changed = True
    return members


def kill_tree(root: int, marker: str) -> int:
    """SIGKILL the command's whole tree; return how many processes were hit."""
    hit = 0
    try:
        os.killpg(root, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(50):
        members = tree(root, marker)
        if not members:
            break
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
                hit += 1
            except OSError:
                pass
    return hit
