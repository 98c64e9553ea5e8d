"""The agent's half of Python sessions: one interpreter child per session, supervised.

:class:`Sessions` starts one interpreter child per session, feeds it code as
wire frames over a pipe, relays its output, display items and results to
the host under the host's request id, interrupts it (SIGINT) at a run's
deadline and kills it if it does not stop within
:data:`~.limits.INTERRUPT_GRACE`; it keeps the sessions' names and ids (the
host's keys), so that any host channel to this agent lists them
(``session.list``) and attaches to one by name (``session.open`` with a name).

The child is a fresh ``python3`` (the agent's own interpreter), started with
:data:`CHILD_BOOT`.  Unlike the agent it runs with ``site`` enabled, so the
image's installed packages import as usual.  It receives :mod:`.repl` (the
code it runs), :mod:`.limits` and :mod:`.wire` as source over its request
pipe and loads them into memory, as the agent itself is loaded: nothing is
written to the sandbox's filesystem.

File descriptors of an interpreter child::

    0     /dev/null: input() gets EOF instead of hanging
    1, 2  pipes the agent reads: print(), subprocesses and C code all land there
    N, M  request pipe (frames from the agent) and reply pipe (frames to it)

The frame pipes are deliberately *not* fd 0/1: a subprocess or a C library
writing to stdout must not be able to corrupt the frame stream by accident.
They are non-inheritable in the child, so ``os.system`` and ``subprocess``
children never hold them.  Code in the session can still reach them on
purpose (it runs as the agent's user); the agent therefore checks what the
child sends, and the host checks everything again.

This module is stdlib-only and imports nothing outside ``agent/``.  The
agent compiles it on the first session request (the bootstrap's ``LAZY``):
an idle sandbox's memory is counted.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import wire
from .exec import default_signals
from .limits import (
    CHILD_PACKAGE,
    DISPLAY_ITEM_LIMIT,
    DISPLAY_MIMES,
    INTERRUPT_GRACE,
    MAX_CODE_BYTES,
    MAX_DISPLAY_ITEMS,
    MAX_SESSIONS,
    VALUE_MAX_BYTES,
    valid_key,
    valid_name,
)

#: Display data is relayed to the host in pieces of this size (the host's
#: frame bodies are bounded at 2 MiB).
DISPLAY_CHUNK = 1024 * 1024
#: How long an interpreter may take to start and say it is ready.
START_TIMEOUT = 30.0
#: Output a session writes between runs (background threads, processes) is
#: held for the next run up to this many bytes; the rest is dropped.
HOLD_LIMIT = 64 * 1024
#: After the reply pipe closes, how long to wait for the exit status.
EOF_WAIT = 1.0
#: Environment marker of a session's processes (the same one commands carry),
#: so that killing a session takes its background processes too.
MARKER = "AGENTNEST_EXEC"
#: Modules the interpreter child loads, in load order.
CHILD_MODULES = ("wire", "limits", "repl")

#: The child's ``-c`` program: argv is ``[-c, REQUEST_FD, REPLY_FD]``.  It
#: takes the working directory off ``sys.path`` while it loads (a workspace
#: file named ``json.py`` must not replace the stdlib module it needs), reads
#: the length-prefixed, compressed sources from the request pipe and runs
#: :func:`.repl.child_main`.
CHILD_BOOT = r"""
import sys
_cwd = bool(sys.path) and sys.path[0] == ""
if _cwd:
    del sys.path[0]
def _load():
    import json, os, types, zlib
    fd = int(sys.argv[1])
    def take(n):
        out = b""
        while len(out) < n:
            got = os.read(fd, n - len(out))
            if not got:
                os._exit(3)
            out += got
        return out
    head = b""
    while not head.endswith(b"\n"):
        head += take(1)
    mods = json.loads(zlib.decompress(take(int(head))))
    pkg = types.ModuleType("%(pkg)s"); pkg.__path__ = []; pkg.__package__ = "%(pkg)s"
    sys.modules["%(pkg)s"] = pkg
    for name, src in mods:
        m = types.ModuleType("%(pkg)s." + name); m.__package__ = "%(pkg)s"
        m.__file__ = "<%(pkg)s/" + name + ".py>"
        sys.modules[m.__name__] = m; setattr(pkg, name, m)
        exec(compile(src, m.__file__, "exec", dont_inherit=True), m.__dict__)
    return sys.modules["%(pkg)s.repl"]
_main = _load()
if _cwd:
    sys.path.insert(0, "")
_main.child_main(int(sys.argv[1]), int(sys.argv[2]))
""".replace("%(pkg)s", CHILD_PACKAGE)

_bundle_cache: List[bytes] = []


def child_bundle() -> bytes:
    """The sources the child loads, compressed and length-prefixed (cached)."""
    if not _bundle_cache:
        # Loaded by the bootstrap, the agent's package keeps its sources in
        # memory (there are no files); loaded from a checkout, read them.
        pkg = sys.modules.get(__package__ or "")
        sources = getattr(pkg, "sources", None) or {}
        mods = []
        for name in CHILD_MODULES:
            src = sources.get(name)
            if src is None:
                path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
                with open(path, encoding="utf-8") as f:
                    src = f.read()
            mods.append([name, src])
        blob = zlib.compress(json.dumps(mods).encode("utf-8"), 6)
        _bundle_cache.append(b"%d\n" % len(blob) + blob)
    return _bundle_cache[0]


def describe_status(status: int) -> str:
    """Explain a wait status the way a user can act on."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "signal %d" % sig
        hint = ""
        if sig == signal.SIGKILL:
            hint = "; killed from outside, e.g. by the kernel when the sandbox ran out of memory"
        elif sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
            hint = "; it crashed (see stderr for the fault report)"
        return "the Python interpreter was killed by signal %d (%s%s)" % (sig, name, hint)
    if os.WIFEXITED(status):
        return "the Python interpreter exited with status %d (os._exit(), or a thread ended it)" % (
            os.WEXITSTATUS(status)
        )
    return "the Python interpreter ended (wait status %d)" % status


STARTING, IDLE, RUNNING, DEAD = "starting", "idle", "running", "dead"
_ROLE_REQUEST, _ROLE_REPLY = 0, 3  # 1 and 2 are the child's stdout and stderr


class Run(object):
    """One piece of code running in a session."""

    __slots__ = (
        "deadline",
        "displays",
        "grace",
        "interrupted",
        "limit",
        "rid",
        "sent",
        "started",
        "timed_out",
        "truncated",
    )

    def __init__(self, rid: int, limit: int) -> None:
        self.rid = rid
        self.limit = limit
        self.started = time.monotonic()
        self.deadline: Optional[float] = None
        self.grace: Optional[float] = None
        self.timed_out = False
        self.interrupted = False
        self.sent = 0
        self.truncated = False
        self.displays = 0

    def take(self, data: bytes) -> bytes:
        """Apply the output budget (stdout, stderr and display share it)."""
        room = self.limit - self.sent
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        self.sent += len(data)
        return data


class Session(object):
    """The agent's bookkeeping for one interpreter child."""

    __slots__ = (
        "decoder",
        "eof_at",
        "held",
        "held_bytes",
        "held_cut",
        "key",
        "marker",
        "name",
        "outq",
        "outs",
        "pid",
        "proc",
        "python",
        "reason",
        "rep_fd",
        "req_fd",
        "run",
        "sid",
        "start_deadline",
        "started",
        "state",
        "waiting",
    )

    def __init__(self, sid: int, proc: "subprocess.Popen[bytes]", marker: str, req_fd: int, rep_fd: int):
        self.sid = sid
        self.proc = proc
        self.pid = proc.pid
        self.marker = marker
        self.req_fd: Optional[int] = req_fd
        self.rep_fd: Optional[int] = rep_fd
        self.outs: Dict[int, int] = {}
        # The child is untrusted: bounded frames, like the host's decoder.
        self.decoder = wire.Decoder(max_body_bytes=DISPLAY_ITEM_LIMIT + 1024)
        self.outq: List[bytes] = []
        self.state = STARTING
        # Requests waiting for "ready": the one that started it, then any
        # that attached by name while it started.
        self.waiting: List[int] = []
        self.name: Optional[str] = None
        self.key = ""
        self.started = time.time()
        self.run: Optional[Run] = None
        self.held: List[Tuple[int, bytes]] = []
        self.held_bytes = 0
        self.held_cut = False
        self.python = ""
        self.reason = ""
        self.eof_at: Optional[float] = None
        self.start_deadline = time.monotonic() + START_TIMEOUT


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGKILL if the agent dies.

    An interpreter whose agent is gone can never be reached again (the host
    starts a new agent and reports the session lost), so it must not keep
    running code -- an infinite loop would burn the sandbox's CPU until its
    deadline.  It also starts with default signal handling, as a command
    does (:func:`.exec.default_signals`): code in a session and what it
    runs see ^C and SIGQUIT as from a login shell.
    """

    def setup() -> None:
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: S110 - best effort: without it the child still exits on EOF
            pass
        if os.getppid() != parent:  # the agent died before the prctl took hold
            os._exit(1)
        default_signals()

    return setup


class Sessions(object):
    """Every session of one agent, driven by the agent's selector loop."""

    def __init__(
        self,
        send: Callable[..., None],
        sel: selectors.BaseSelector,
        kill_tree: Callable[[int, str], int],
        env: Dict[str, str],
        cwd: str,
        token: str,
    ) -> None:
        self._send = send
        self._sel = sel
        self._kill_tree = kill_tree
        self._env = env
        self._cwd = cwd
        self._token = token
        self.by_sid: Dict[int, Session] = {}
        self.by_pid: Dict[int, Session] = {}
        self._fds: Dict[int, Tuple[Session, int]] = {}
        # Session ids are the agent's own, never a host's request id: another
        # channel to this agent (a live-forked child's) numbers its requests anew.
        self._next_sid = 0

    # -- requests from the host -------------------------------------------------------

    def error(self, rid: Optional[int], code: str, message: str) -> None:
        self._send({"t": "error", "id": rid, "code": code, "message": message[:4000]})

    def handle(self, kind: str, h: Dict[str, Any], body: bytes) -> None:
        rid = h.get("id")
        if kind == "session.interrupt":
            s = self.by_sid.get(_int(h.get("session")))
            if s is not None and s.run is not None and s.run.grace is None:
                s.run.interrupted = True
                self._interrupt(s, s.run)
            return
        if not isinstance(rid, int):
            self.error(None, "invalid", "%s needs a request id" % kind)
            return
        if kind == "session.list":
            live = [self._summary(s) for s in self.by_sid.values() if s.state != DEAD]
            self._send({"t": "done", "id": rid, "sessions": live})
            return
        if kind == "session.open":
            name, key = h.get("name"), h.get("key")
            if (name is not None and not valid_name(name)) or (key is not None and not valid_key(key)):
                self.error(rid, "invalid", "session.open: invalid name or key")
                return
            named = self._named(name) if name is not None else None
            if named is not None and named.state != DEAD and h.get("fresh") is not True:
                self._attach(named, rid)
            elif named is not None:
                # Ended (or a fresh one wanted): a new interpreter under the
                # same name and id, as a reset; a fresh one takes the asker's key.
                self._dead(named, "the session was reset")
                self._unlist(named)
                fresh_key = key if key is not None and h.get("fresh") is True else None
                self._start(named.sid, rid, named.name, fresh_key or named.key)
            elif len(self.by_sid) >= MAX_SESSIONS:
                self.error(
                    rid,
                    "too_many_sessions",
                    "this sandbox already has %d Python sessions, the most it allows; "
                    "close() sessions you no longer need" % MAX_SESSIONS,
                )
            else:
                self._next_sid += 1
                self._start(self._next_sid, rid, name, key or os.urandom(6).hex())
            return
        s = self.by_sid.get(_int(h.get("session")))
        if s is None:
            self.error(rid, "no_session", "there is no session %r in this agent" % (h.get("session"),))
        elif kind == "session.run":
            self._run(s, rid, h, body)
        elif kind == "session.reset":
            self._dead(s, "the session was reset")
            self._unlist(s)
            self._start(s.sid, rid, s.name, s.key)
        elif kind == "session.close":
            self._dead(s, "the session was closed")
            self._unlist(s)
            self._send({"t": "done", "id": rid})
        else:
            self.error(rid, "unknown", "unknown request type %r" % kind)

    def _start(self, sid: int, rid: int, name: Optional[str], key: str) -> None:
        try:
            s = self._spawn(sid)
        except (OSError, subprocess.SubprocessError) as exc:
            self.error(rid, "spawn", "could not start the Python interpreter %s: %s" % (sys.executable, exc))
            return
        s.waiting = [rid]
        s.name, s.key = name, key
        self.by_sid[sid] = s

    def _named(self, name: str) -> Optional[Session]:
        for s in self.by_sid.values():
            if s.name == name:
                return s
        return None

    def _attach(self, s: Session, rid: int) -> None:
        """Answer ``session.open`` by name with the session that has it."""
        if s.state == STARTING:
            s.waiting.append(rid)  # answered when it is ready
        else:
            self._send(self._opened(s, rid, attached=True))

    def _opened(self, s: Session, rid: int, attached: bool) -> Dict[str, Any]:
        reply = self._summary(s)
        reply.update({"t": "done", "id": rid, "attached": attached})
        return reply

    def _summary(self, s: Session) -> Dict[str, Any]:
        return {
            "session": s.sid,
            "pid": s.pid,
            "python": s.python,
            "name": s.name,
            "key": s.key,
            "started": s.started,
            "state": s.state,
        }

    def _spawn(self, sid: int) -> Session:
        marker = "%s-s%d" % (self._token, sid)
        env = dict(self._env)
        env[MARKER] = marker
        # Figures render off-screen; pyplot is otherwise unchanged.
        env.setdefault("MPLBACKEND", "Agg")
        home = env.get("HOME") or "/"
        if "MPLCONFIGDIR" not in env and not os.access(home, os.W_OK):
            # A read-only home makes matplotlib warn on stderr at every start.
            env["MPLCONFIGDIR"] = os.path.join(env.get("TMPDIR") or "/tmp", "agentnest-matplotlib")
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable or "python3", "-c", CHILD_BOOT, str(req_r), str(rep_w)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self._cwd,
                env=env,
                pass_fds=(req_r, rep_w),
                close_fds=True,
                # Its own session and process group: a tree kill takes
                # everything the session started, and nothing else.
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),  # the agent is single-threaded, so this is safe
            )
        except BaseException:
            for fd in (req_w, rep_r):
                os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        s = Session(sid, proc, marker, req_w, rep_r)
        assert proc.stdout is not None and proc.stderr is not None
        for fd, role in ((req_w, _ROLE_REQUEST), (rep_r, _ROLE_REPLY)):
            os.set_blocking(fd, False)
            self._fds[fd] = (s, role)
        for stream, which in ((proc.stdout, 1), (proc.stderr, 2)):
            fd = stream.fileno()
            os.set_blocking(fd, False)
            s.outs[fd] = which
            self._fds[fd] = (s, which)
            self._sel.register(fd, selectors.EVENT_READ, "session")
        self._sel.register(rep_r, selectors.EVENT_READ, "session")
        self.by_pid[s.pid] = s
        s.outq.append(child_bundle())
        self._pump(s)
        return s

    def _run(self, s: Session, rid: int, h: Dict[str, Any], body: bytes) -> None:
        if s.state == DEAD:
            self.error(rid, "session_lost", s.reason)
            return
        if s.state != IDLE:
            self.error(
                rid, "busy", "session %d is %s; it runs one piece of code at a time" % (s.sid, s.state)
            )
            return
        if len(body) > MAX_CODE_BYTES:
            self.error(
                rid, "invalid", "code of %d bytes is over the limit of %d" % (len(body), MAX_CODE_BYTES)
            )
            return
        limit = h.get("max_output")
        run = Run(rid, limit if isinstance(limit, int) and limit >= 0 else 1 << 62)
        timeout = h.get("timeout")
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
            run.deadline = run.started + float(timeout)
        s.run = run
        s.state = RUNNING
        # What the session printed between runs comes first.
        held, s.held, s.held_bytes = s.held, [], 0
        if s.held_cut:
            run.truncated = True
            s.held_cut = False
        for which, data in held:
            self._output(s, which, data)
        s.outq.append(wire.encode({"t": "run"}, body))
        self._pump(s)

    # -- events from the children ------------------------------------------------------

    def event(self, fd: int) -> None:
        entry = self._fds.get(fd)
        if entry is None:
            return
        s, role = entry
        if role == _ROLE_REQUEST:
            self._pump(s)
        elif role == _ROLE_REPLY:
            self._read_replies(s)
        else:
            self._read_output(s, fd, role)

    def _pump(self, s: Session) -> None:
        fd = s.req_fd
        if fd is None:
            return
        while s.outq:
            chunk = s.outq[0]
            try:
                n = os.write(fd, chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the child is gone; its exit status will say why
                s.outq = []
                break
            if n < len(chunk):
                s.outq[0] = chunk[n:]
            else:
                s.outq.pop(0)
        registered = fd in self._sel.get_map()
        if s.outq and not registered:
            self._sel.register(fd, selectors.EVENT_WRITE, "session")
        elif not s.outq and registered:
            self._sel.unregister(fd)

    def _read_output(self, s: Session, fd: int, which: int) -> None:
        try:
            data = os.read(fd, 256 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._forget_fd(s, fd)
            return
        self._output(s, which, data)

    def _output(self, s: Session, which: int, data: bytes) -> None:
        run = s.run
        if run is None:
            room = HOLD_LIMIT - s.held_bytes
            if len(data) > room:
                s.held_cut = True
                data = data[: max(room, 0)]
            if data:
                s.held.append((which, data))
                s.held_bytes += len(data)
            return
        data = run.take(data)
        if data:
            self._send({"t": "out", "id": run.rid, "fd": which}, data)

    def _drain_output(self, s: Session) -> None:
        """Read what the child's stdout and stderr already hold (bounded)."""
        for fd in list(s.outs):
            for _ in range(64):
                if fd not in s.outs:
                    break
                try:
                    data = os.read(fd, 256 * 1024)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    data = b""
                if not data:
                    self._forget_fd(s, fd)
                    break
                self._output(s, s.outs[fd], data)

    def _read_replies(self, s: Session) -> None:
        fd = s.rep_fd
        if fd is None:
            return
        try:
            data = os.read(fd, 1024 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._forget_fd(s, fd)
            if s.state != DEAD and s.eof_at is None:
                # The exit status follows in a moment (SIGCHLD); wait for it
                # to say why, but not forever (the child may live on without
                # its reply pipe).
                s.eof_at = time.monotonic()
            return
        s.decoder.feed(data)
        try:
            frames = s.decoder.frames()
        except wire.WireError as exc:
            self._dead(s, "the interpreter sent an invalid frame (%s); it was killed" % exc)
            return
        for header, body in frames:
            if s.state == DEAD:
                return
            self._reply(s, header, body)

    def _reply(self, s: Session, h: Dict[str, Any], body: bytes) -> None:
        kind = h["t"]
        if kind == "ready" and s.state == STARTING:
            s.state = IDLE
            python = h.get("python")
            s.python = python[:40] if isinstance(python, str) else ""
            for i, waiter in enumerate(s.waiting):
                self._send(self._opened(s, waiter, attached=i > 0))
            s.waiting = []
            return
        run = s.run
        if kind == "display":
            # Outside a run (a background thread called display()) there is
            # no request to attach the item to: it is dropped.
            if run is not None:
                self._display(run, h.get("mime"), body, h.get("main") is True)
            return
        if run is None:
            self._dead(s, "the interpreter sent an unexpected %r frame; it was killed" % kind[:40])
        elif kind == "value":
            name = h.get("name")
            if name in ("result", "error") and len(body) <= VALUE_MAX_BYTES:
                self._send({"t": "value", "id": run.rid, "name": name}, body)
            else:
                self._dead(s, "the interpreter sent an invalid value frame; it was killed")
        elif kind == "ran":
            self._drain_output(s)
            s.run = None
            s.state = IDLE
            self._send(
                {
                    "t": "ran",
                    "id": run.rid,
                    "timed_out": run.timed_out,
                    "interrupted": run.interrupted,
                    "truncated": run.truncated or h.get("truncated") is True,
                    "duration": time.monotonic() - run.started,
                }
            )
        else:
            self._dead(s, "the interpreter sent an unknown %r frame; it was killed" % kind[:40])

    def _display(self, run: Run, mime: Any, body: bytes, main: bool = False) -> None:
        if mime not in DISPLAY_MIMES or run.displays >= MAX_DISPLAY_ITEMS or len(body) > run.limit - run.sent:
            run.truncated = True
            return
        run.displays += 1
        run.sent += len(body)
        n = len(body)
        for off in range(0, max(n, 1), DISPLAY_CHUNK):
            last = off + DISPLAY_CHUNK >= n
            header = {"t": "display", "id": run.rid, "mime": mime, "final": last}  # type: Dict[str, Any]
            if main:
                header["main"] = True
            self._send(header, body[off : off + DISPLAY_CHUNK])

    # -- processes, deadlines, cleanup ---------------------------------------------------

    def reaped(self, pid: int, status: int) -> bool:
        """The agent reaped ``pid``; True if it was a session's interpreter."""
        s = self.by_pid.pop(pid, None)
        if s is None:
            return False
        s.proc.returncode = status  # tell Popen it is reaped
        if s.state != DEAD:
            # Frames it sent just before it died still count (a result, say).
            for _ in range(64):
                if s.rep_fd is None or s.state == DEAD:
                    break
                before = s.decoder.buffered
                self._read_replies(s)
                if s.rep_fd is not None and s.decoder.buffered == before:
                    break
            self._dead(s, describe_status(status))
        return True

    def _interrupt(self, s: Session, run: Run) -> None:
        # SIGINT raises KeyboardInterrupt in the running code; the namespace
        # survives.  Only the interpreter gets it, not its subprocesses (a
        # subprocess.run() it waits on is killed by subprocess itself).
        run.grace = time.monotonic() + INTERRUPT_GRACE
        try:
            os.kill(s.pid, signal.SIGINT)
        except OSError:
            pass

    def tick(self) -> None:
        now = time.monotonic()
        for s in list(self.by_sid.values()):
            run = s.run
            if s.state == STARTING and now >= s.start_deadline:
                self._dead(s, "the Python interpreter did not start within %.0f s" % START_TIMEOUT)
            elif run is not None:
                if run.deadline is not None and now >= run.deadline and run.grace is None:
                    run.timed_out = True
                    self._interrupt(s, run)
                elif run.grace is not None and now >= run.grace:
                    self._dead(
                        s,
                        "the code did not stop within %.0f s of the interrupt (it caught or ignored "
                        "KeyboardInterrupt, or is stuck in C code); the interpreter was killed"
                        % INTERRUPT_GRACE,
                    )
            if s.state != DEAD and s.eof_at is not None and now >= s.eof_at + EOF_WAIT:
                self._dead(s, "the Python interpreter closed its channel; it was killed")

    def next_timeout(self) -> Optional[float]:
        now = time.monotonic()
        best: Optional[float] = None
        for s in self.by_sid.values():
            whens = [s.eof_at + EOF_WAIT if s.eof_at is not None else None]
            if s.state == STARTING:
                whens.append(s.start_deadline)
            if s.run is not None:
                whens.append(s.run.grace if s.run.grace is not None else s.run.deadline)
            for when in whens:
                if when is not None:
                    wait = max(0.0, when - now)
                    best = wait if best is None else min(best, wait)
        return best

    def busy(self) -> bool:
        """True while any session runs code or starts (the host is waiting)."""
        return any(s.state in (STARTING, RUNNING) for s in self.by_sid.values())

    def _forget_fd(self, s: Session, fd: int) -> None:
        if fd in self._sel.get_map():
            self._sel.unregister(fd)
        self._fds.pop(fd, None)
        s.outs.pop(fd, None)
        if fd == s.rep_fd:
            s.rep_fd = None
        if fd == s.req_fd:
            s.req_fd = None
            s.outq = []
        for stream in (s.proc.stdout, s.proc.stderr):
            if stream is not None and not stream.closed and stream.fileno() == fd:
                stream.close()
                return
        try:
            os.close(fd)
        except OSError:
            pass

    def _dead(self, s: Session, reason: str) -> None:
        """End a session's interpreter for ``reason`` and tell whoever waits."""
        if s.state == DEAD:
            return
        s.state = DEAD
        s.reason = reason
        # Everything the session started goes with it.
        self._kill_tree(s.pid, s.marker)
        self._drain_output(s)
        for fd in [s.req_fd, s.rep_fd, *s.outs]:
            if fd is not None:
                self._forget_fd(s, fd)
        if s.waiting:
            tail = b"".join(d for w, d in s.held if w == 2)[-1500:].decode("utf-8", "replace")
            for waiter in s.waiting:
                self.error(
                    waiter,
                    "spawn",
                    "the Python interpreter did not start: %s%s"
                    % (reason, "; stderr: " + tail if tail else ""),
                )
            s.waiting = []
        run, s.run = s.run, None
        if run is not None:
            self._send(
                {
                    "t": "ran",
                    "id": run.rid,
                    "timed_out": run.timed_out,
                    "interrupted": run.interrupted,
                    "truncated": run.truncated,
                    "duration": time.monotonic() - run.started,
                    "lost": True,
                    "reason": reason[:1000],
                }
            )
        s.held, s.held_bytes = [], 0

    def _unlist(self, s: Session) -> None:
        if self.by_sid.get(s.sid) is s:
            del self.by_sid[s.sid]

    def kill_all(self) -> None:
        for s in list(self.by_sid.values()):
            self._kill_tree(s.pid, s.marker)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
