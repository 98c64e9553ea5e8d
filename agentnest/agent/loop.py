"""The agent's event loop: one thread, one selector, frames in and out.

The agent reads frames from fd 0 and writes frames to fd 1.  It trusts the
host (the host is the one that started it); the host does not trust it.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from . import exec as execmod
from . import files, wire

AGENT_VERSION = "0.4.0"
#: "session-names": session.open takes a name (and attaches to the session that has
#: it), session.list lists the live sessions; the registry lives here, in the agent.
#: "reconnect": a "reconnect" frame (a new host connection on the same stdin, after a
#: checkpoint restore) is answered with a fresh hello; the agent's state is kept.
#: "move": a "move" request renames a workspace path ("path" to "to"); an agent
#: without it (restored from an older checkpoint) answers "unknown".
CAPABILITIES = [
    "exec",
    "stream",
    "stdin",
    "files",
    "tree-kill",
    "session",
    "session-names",
    "pty",
    "reconnect",
    "move",
]
#: While commands or session runs are active, the agent sends at least one
#: frame this often, so the host can tell a busy agent from a stalled channel.
HEARTBEAT = 1.0
#: Largest body the agent puts in one output frame.
OUT_CHUNK = 256 * 1024
#: Bytes of listing entries per frame body.
LIST_CHUNK = 256 * 1024
#: Largest file read served, unless the request asks for less.
DEFAULT_MAX_READ = 64 * 1024 * 1024


class Agent:
    def __init__(
        self, rfd: int = 0, wfd: int = 1, listen: Optional[str] = None, linger: Optional[str] = None
    ) -> None:
        self.rfd = rfd
        self.wfd = wfd
        # Listen mode (Kubernetes: see listen()): hosts connect through a unix
        # socket at this path, one at a time; the agent outlives each of them.
        # Linger mode (Docker: see main()): the first host is on stdio, and
        # the agent also listens at ``linger``, so that when that stream is
        # lost (the engine restarted) a host reaches this same agent again,
        # its commands and sessions with it.
        self.listen_path = listen or linger
        self._stdio = listen is None
        self._listener: Any = None
        self._conn: Any = None
        self.decoder = wire.Decoder(max_body_bytes=16 * 1024 * 1024)
        self.sel = selectors.DefaultSelector()
        self.commands: Dict[int, execmod.Command] = {}
        self.by_pid: Dict[int, execmod.Command] = {}
        self.fd_owner: Dict[int, execmod.Command] = {}
        self.workspace = files.Workspace(os.environ.get("AGENTNEST_WORKSPACE", os.getcwd()))
        # os.urandom, not the secrets module: that one pulls in OpenSSL (~4 MB RSS).
        self.token = os.urandom(6).hex()
        self.running = True
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTNEST_")}
        self.subreaper = False
        self.undumpable = False
        self.last_sent = time.monotonic()
        self._wake_r, self._wake_w = os.pipe()
        # Long file operations in progress, by request id (see _step_jobs).
        self.jobs: Dict[int, Any] = {}
        # Sessions are loaded on first use: the sessions module is large,
        # and an idle sandbox's memory and start-up time are counted.
        self._sessions: Any = None

    # -- output ----------------------------------------------------------

    def send(self, header: Dict[str, Any], body: bytes = b"") -> None:
        self.last_sent = time.monotonic()
        if self.wfd < 0:
            return  # listen mode, no host connected: nobody to tell
        data = memoryview(wire.encode(header, body))
        while data:
            try:
                n = os.write(self.wfd, data)
            except (BlockingIOError, InterruptedError):
                # stdin and stdout may share one non-blocking file description
                # (a socket): wait until the host drains.  poll, not select:
                # under gVisor with the runtime's default seccomp profile
                # (--oci-seccomp) select(2) fails with EPERM.
                waiter = select.poll()
                waiter.register(self.wfd, select.POLLOUT)
                waiter.poll(1000)
                continue
            except (BrokenPipeError, ConnectionResetError):
                self._host_gone()
                return
            data = data[n:]

    def _host_gone(self) -> None:
        """The host's side closed: end (stdio), or wait for the next host (listen and linger modes)."""
        if self.listen_path is None:
            self.running = False
            return
        if self.rfd >= 0:
            try:
                self.sel.unregister(self.rfd)
            except (KeyError, ValueError):
                pass
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        elif self._stdio and self.rfd >= 0:
            # The first host's stdio: let go of the engine's pipes (nothing
            # more is read from or written to them).
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in {self.rfd, self.wfd}:
                os.dup2(devnull, fd)
            os.close(devnull)
        self.rfd = self.wfd = -1

    def _accept(self) -> None:
        """A new host connected (listen mode): it replaces the previous one, if any.

        It speaks first, with a ``reconnect`` frame (its request ids continue
        above the ones it used before), and gets a hello; commands and
        sessions of the previous connection live on (their frames for old
        ids are dropped by the new host).
        """
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self._host_gone()
        conn.setblocking(False)
        self._conn = conn
        self.rfd = self.wfd = conn.fileno()
        self.decoder = wire.Decoder(max_body_bytes=16 * 1024 * 1024)
        self.sel.register(self.rfd, selectors.EVENT_READ, "host")

    def error(self, rid: Optional[int], code: str, message: str) -> None:
        self.send({"t": "error", "id": rid, "code": code, "message": message[:4000]})

    # -- main loop -------------------------------------------------------

    def run(self) -> None:
        hardened = execmod.harden()
        self.subreaper = hardened["subreaper"]
        self.undumpable = hardened["undumpable"]
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        # SIGUSR2: "look at your stdin again".  After a gVisor checkpoint
        # restore the host file behind fd 0 is a new one and the selector's
        # old registration never fires (checked with runsc 20221219): the host
        # sends this signal after the reconnect frame (see _drain_wake).
        signal.signal(signal.SIGUSR2, lambda *_: None)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self.listen_path is not None:
            try:
                self._listener = _listen(self.listen_path)
            except OSError:
                if not self._stdio:
                    raise
                self.listen_path = None  # linger is a bonus: serve stdio without it
            else:
                self.sel.register(self._listener, selectors.EVENT_READ, "listen")
        if not self._stdio:
            self.rfd = self.wfd = -1
        else:
            os.set_blocking(self.rfd, False)
            self.sel.register(self.rfd, selectors.EVENT_READ, "host")
            self._hello()
        try:
            self._serve()
        finally:
            # However the loop ends (host gone, or a bug), leave no command running.
            for cmd in list(self.commands.values()):
                execmod.kill_tree(cmd.pid, cmd.marker, cmd.status is None)
            if self._sessions is not None:
                self._sessions.kill_all()

    def _hello(self) -> None:
        self.send(
            {
                "t": "hello",
                "v": wire.PROTOCOL_VERSION,
                "agent": AGENT_VERSION,
                "pid": os.getpid(),
                "uid": os.getuid(),
                "gid": os.getgid(),
                "python": "%d.%d.%d" % sys.version_info[:3],
                "workspace": self.workspace.root,
                "subreaper": self.subreaper,
                "undumpable": self.undumpable,
                "caps": CAPABILITIES,
            }
        )

    @property
    def sessions(self) -> Any:
        if self._sessions is None:
            self._sessions = _sessions_module().Sessions(
                self.send, self.sel, execmod.kill_tree, self.base_env, self.workspace.root, self.token
            )
        return self._sessions

    def _serve(self) -> None:
        while self.running:
            timeout = self._next_timeout()
            for key, _mask in self.sel.select(timeout):
                tag = key.data
                if tag == "host":
                    self._read_host()
                elif tag == "listen":
                    self._accept()
                elif tag == "wake":
                    self._drain_wake()
                elif tag == "session":
                    self.sessions.event(key.fd)
                elif tag == "stdin":
                    # An earlier event of this batch may have closed it.
                    owner = self.fd_owner.get(key.fd)
                    if owner is not None:
                        self._pump_stdin(owner)
                else:
                    self._read_output(key.fd)
            self._step_jobs()
            self._reap()
            self._check_deadlines()
            if self._sessions is not None:
                self._sessions.tick()
            if self._busy() and time.monotonic() - self.last_sent >= HEARTBEAT:
                self.send({"t": "beat"})

    def _busy(self) -> bool:
        """Whether the host waits on something here (then heartbeats flow)."""
        return (
            bool(self.commands) or bool(self.jobs) or (self._sessions is not None and self._sessions.busy())
        )

    def _step_jobs(self, budget: float = 0.05) -> None:
        """Advance the long file operations for up to ``budget`` seconds each; reply to finished ones."""
        for rid in list(self.jobs):
            job = self.jobs[rid]
            until = time.monotonic() + budget
            try:
                while time.monotonic() < until:
                    next(job)
            except StopIteration:
                del self.jobs[rid]
                self.send({"t": "done", "id": rid})
            except files.FileError as exc:
                del self.jobs[rid]
                self.error(rid, exc.code, exc.message)
            except Exception as exc:  # one bad operation must not kill the agent
                del self.jobs[rid]
                self.error(rid, "internal", "%s: %s" % (type(exc).__name__, exc))
            if self._busy() and time.monotonic() - self.last_sent >= HEARTBEAT:
                self.send({"t": "beat"})

    def _next_timeout(self) -> Optional[float]:
        if self.jobs:
            return 0.0  # more to do: do not wait for input
        now = time.monotonic()
        best = self._sessions.next_timeout() if self._sessions is not None else None
        if self._busy():
            beat = max(0.0, self.last_sent + HEARTBEAT - now)
            best = beat if best is None else min(best, beat)
        for cmd in self.commands.values():
            for when in (cmd.deadline, cmd.exited_at and cmd.exited_at + execmod.DRAIN_GRACE):
                if when:
                    wait = max(0.0, when - now)
                    best = wait if best is None else min(best, wait)
        return best

    def _drain_wake(self) -> None:
        got = b""
        try:
            while True:
                chunk = os.read(self._wake_r, 4096)
                if not chunk:
                    break
                got += chunk[:64]
        except (BlockingIOError, InterruptedError):
            pass
        if bytes([signal.SIGUSR2]) in got and self.rfd >= 0:
            # Register fd 0 anew (the registration binds the host file it had),
            # and read what may already wait there.
            self.sel.unregister(self.rfd)
            self.sel.register(self.rfd, selectors.EVENT_READ, "host")
            self._read_host()

    def _read_host(self) -> None:
        try:
            data = os.read(self.rfd, 4 * 1024 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._host_gone()
            return
        self.decoder.feed(data)
        try:
            frames = self.decoder.frames()
        except wire.WireError as exc:
            self.error(None, "protocol", str(exc))
            self.running = False
            return
        for header, body in frames:
            try:
                self.handle(header, body)
            except files.FileError as exc:
                self.error(header.get("id"), exc.code, exc.message)
            except Exception as exc:  # keep serving: one bad request must not kill the agent
                self.error(header.get("id"), "internal", "%s: %s" % (type(exc).__name__, exc))

    # -- requests --------------------------------------------------------

    def handle(self, h: Dict[str, Any], body: bytes) -> None:
        kind = h["t"]
        rid = h.get("id")
        if kind == "exec":
            self._exec(h)
        elif kind == "stdin":
            cmd = self.commands.get(rid or -1)
            if cmd is not None and cmd.stdin_fd is not None:
                if (
                    body
                    and cmd.terminal
                    and execmod.needs_terminal_signals(body, sys.executable or "python3")
                ):
                    body = execmod.terminal_input(cmd, body)
                if body:
                    cmd.stdin_queue.append(memoryview(body))
                if h.get("eof"):
                    cmd.stdin_eof = True
                self._pump_stdin(cmd)
        elif kind == "resize":
            cmd = self.commands.get(rid or -1)
            window = _window_size(h)
            if cmd is not None and cmd.pty_fd is not None and window is not None:
                try:
                    execmod.set_window_size(cmd.pty_fd, window[0], window[1])
                except OSError:
                    pass
        elif kind == "cancel":
            cmd = self.commands.get(rid or -1)
            if cmd is not None and cmd.status is None:
                cmd.killed = True
                execmod.kill_tree(cmd.pid, cmd.marker)
        elif kind == "signal":
            cmd = self.commands.get(rid or -1)
            sig = h.get("sig")
            if cmd is not None and cmd.status is None and isinstance(sig, int):
                try:
                    os.killpg(cmd.pid, sig)
                except OSError:
                    pass
        elif kind == "write":
            if not h.get("first") and not self.workspace.writing(rid or 0):
                return  # the first chunk failed and was reported; drop the rest
            written = self.workspace.write_chunk(
                rid or 0,
                h.get("path", ""),
                int(h.get("mode", 0o644)),
                body,
                bool(h.get("first")),
                bool(h.get("last")),
            )
            if h.get("last"):
                self.send({"t": "done", "id": rid, "size": written})
        elif kind == "abort":
            self.workspace.abort_write(rid or 0)
        elif kind == "read":
            limit = int(h.get("max_bytes", DEFAULT_MAX_READ))
            total = 0
            for chunk in self.workspace.read(h.get("path", ""), limit):
                total += len(chunk)
                self.send({"t": "data", "id": rid}, chunk)
            self.send({"t": "done", "id": rid, "size": total})
        elif kind == "list":
            entries, truncated = self.workspace.list(
                h.get("path", ""), bool(h.get("recursive")), int(h.get("max_entries", 10000))
            )
            # Entries go in frame bodies, one JSON line each, a bounded chunk at
            # a time: a crowded directory must not overflow one frame header.
            lines: List[bytes] = []
            size = 0
            for entry in entries:
                line = json.dumps(entry, separators=(",", ":")).encode("ascii") + b"\n"
                if size + len(line) > LIST_CHUNK and lines:
                    self.send({"t": "data", "id": rid}, b"".join(lines))
                    lines, size = [], 0
                lines.append(line)
                size += len(line)
            if lines:
                self.send({"t": "data", "id": rid}, b"".join(lines))
            self.send({"t": "done", "id": rid, "count": len(entries), "truncated": truncated})
        elif kind == "stat":
            self.send({"t": "done", "id": rid, "entry": self.workspace.stat(h.get("path", ""))})
        elif kind == "mkdir":
            self.workspace.mkdir(h.get("path", ""), bool(h.get("parents")))
            self.send({"t": "done", "id": rid})
        elif kind == "move":
            self.workspace.move(h.get("path", ""), h.get("to", ""))
            self.send({"t": "done", "id": rid})
        elif kind == "remove":
            # A tree is removed a step at a time between turns of this loop:
            # a large one must not stall every other stream (or the heartbeats).
            self.jobs[rid or 0] = self.workspace.removing(h.get("path", ""), bool(h.get("recursive")))
            self._step_jobs()
        elif kind.startswith("session."):
            self.sessions.handle(kind, h, body)
        elif kind == "ping":
            self.send({"t": "pong", "id": rid})
        elif kind == "shutdown":
            self.running = False
        elif kind == "reconnect":
            # A new host side after a checkpoint restore (or a live fork's
            # child): its requests get new ids; frames this agent still sends
            # for the old ones are dropped there.  Writes in progress belong to
            # the old side and are abandoned.
            for wid in list(self.workspace._writes):
                self.workspace.abort_write(wid)
            self._hello()
        else:
            self.error(rid, "unknown", "unknown request type %r" % kind)

    def _exec(self, h: Dict[str, Any]) -> None:
        rid = h["id"]
        if rid in self.commands:
            self.error(rid, "protocol", "request id %d is already running" % rid)
            return
        argv = h.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            self.error(rid, "invalid", "argv must be a non-empty list of strings")
            return
        env = dict(self.base_env)
        env.update({str(k): str(v) for k, v in (h.get("env") or {}).items()})
        cwd = h.get("cwd") or self.workspace.root
        limit = int(h.get("max_output", 1 << 62))
        pty = None
        if h.get("pty") is not None:
            pty = _window_size(h["pty"])
            if pty is None:
                self.error(rid, "invalid", 'pty must be {"rows": 1..65535, "cols": 1..65535}')
                return
        timeout = h.get("timeout")
        seconds = float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None
        try:
            # A command that can time out is made a child subreaper, so its
            # tree's orphans stay attributable to it (see exec.py).
            cmd = execmod.spawn(
                rid,
                argv,
                env,
                cwd,
                bool(h.get("stdin")),
                limit,
                self.token,
                pty,
                subreaper=seconds is not None,
            )
        except OSError as exc:
            # Report like a shell would: 127 not found, 126 not executable.
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            what = exc.filename if exc.filename else argv[0]
            msg = "agentnest: %s: %s\n" % (what, exc.strerror or exc)
            if isinstance(exc, FileNotFoundError) and exc.filename == cwd:
                msg = "agentnest: working directory %s does not exist\n" % cwd
            self.send({"t": "out", "id": rid, "fd": 2}, msg.encode())
            self.send(
                {
                    "t": "exit",
                    "id": rid,
                    "code": code,
                    "signal": None,
                    "timed_out": False,
                    "truncated": False,
                    "duration": 0.0,
                    "spawn_error": True,
                }
            )
            return
        if seconds is not None:
            cmd.deadline = cmd.started + seconds
        self.commands[rid] = cmd
        self.by_pid[cmd.pid] = cmd
        for fd in cmd.fds:
            self.fd_owner[fd] = cmd
            self.sel.register(fd, selectors.EVENT_READ, "out")
        if cmd.stdin_fd is not None:
            self.fd_owner[cmd.stdin_fd] = cmd

    def _pump_stdin(self, cmd: execmod.Command) -> None:
        fd = cmd.stdin_fd
        if fd is None:
            return
        while cmd.stdin_queue:
            chunk = cmd.stdin_queue[0]
            try:
                n = os.write(fd, chunk)
            except BlockingIOError:
                break
            except OSError:  # reader went away
                cmd.stdin_queue.clear()
                cmd.stdin_eof = True
                break
            if n < len(chunk):
                cmd.stdin_queue[0] = chunk[n:]
            else:
                cmd.stdin_queue.pop(0)
        registered = fd in self.sel.get_map()
        if cmd.stdin_queue and not registered:
            self.sel.register(fd, selectors.EVENT_WRITE, "stdin")
        elif not cmd.stdin_queue:
            if registered:
                self.sel.unregister(fd)
            if cmd.stdin_eof:
                self._close_stdin(cmd)

    def _close_stdin(self, cmd: execmod.Command) -> None:
        fd = cmd.stdin_fd
        if fd is None:
            return
        if fd in self.sel.get_map():
            self.sel.unregister(fd)
        self.fd_owner.pop(fd, None)
        cmd.stdin_fd = None
        if cmd.terminal:
            # A terminal's writer is our own dup of its master (and never the
            # reader itself): closing it does not end the output.
            try:
                os.close(fd)
            except OSError:
                pass
        elif cmd.proc.stdin is not None:
            try:
                cmd.proc.stdin.close()
            except OSError:
                pass

    def _read_output(self, fd: int) -> None:
        cmd = self.fd_owner.get(fd)
        if cmd is None:
            return
        try:
            data = os.read(fd, OUT_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_output(cmd, fd)
            return
        out = cmd.take(data)
        if out:
            self.send({"t": "out", "id": cmd.id, "fd": cmd.fds[fd]}, out)

    def _close_output(self, cmd: execmod.Command, fd: int) -> None:
        try:
            self.sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        self.fd_owner.pop(fd, None)
        cmd.fds.pop(fd, None)
        if fd == cmd.pty_fd:
            cmd.pty_fd = None
            os.close(fd)
            return
        for stream in (cmd.proc.stdout, cmd.proc.stderr):
            if stream is not None and not stream.closed and stream.fileno() == fd:
                stream.close()

    # -- process lifecycle -------------------------------------------------

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            cmd = self.by_pid.pop(pid, None)
            if cmd is None:
                if self._sessions is not None:
                    self._sessions.reaped(pid, status)
            else:
                cmd.status = status
                cmd.exited_at = time.monotonic()
                cmd.proc.returncode = status  # tell Popen it is reaped
                if cmd.stdin_fd is not None:
                    self._close_stdin(cmd)
            # Any other pid is an orphan reparented to us: reaping it is the point.
        for cmd in list(self.commands.values()):
            if cmd.done():
                self._finish(cmd)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for cmd in list(self.commands.values()):
            if cmd.deadline is not None and now >= cmd.deadline and not cmd.timed_out:
                cmd.timed_out = True
                # The top may have exited already, its output still draining:
                # then its pid is no longer its own.
                execmod.kill_tree(cmd.pid, cmd.marker, cmd.status is None)
                # Whatever escaped the kill must not hold the reply back.
                cmd.deadline = None

    def _finish(self, cmd: execmod.Command) -> None:
        for fd in list(cmd.fds):
            # Drain what is already buffered, then let go of pipes that
            # background processes may still hold.
            while fd in cmd.fds:
                before = cmd.sent
                self._read_output(fd)
                if fd in cmd.fds and cmd.sent == before:
                    self._close_output(cmd, fd)
        code, sig = cmd.exit_fields()
        del self.commands[cmd.id]
        self.send(
            {
                "t": "exit",
                "id": cmd.id,
                "code": code,
                "signal": sig,
                "timed_out": cmd.timed_out,
                "cancelled": cmd.killed,
                "truncated": cmd.truncated,
                "duration": time.monotonic() - cmd.started,
            }
        )


def _window_size(h: Any) -> Optional[Tuple[int, int]]:
    """``(rows, cols)`` from ``{"rows": R, "cols": C}``, or None if they are not sane."""
    if not isinstance(h, dict):
        return None
    rows, cols = h.get("rows"), h.get("cols")
    if type(rows) is not int or type(cols) is not int:  # bool is an int subclass: not a size
        return None
    if not (0 < rows <= 0xFFFF and 0 < cols <= 0xFFFF):
        return None
    return rows, cols


def _sessions_module() -> Any:
    """The sessions module (:mod:`.sessions`), compiled on first use.

    Shipped by the bootstrap, it is defined from the bundle's sources by the
    bootstrap's own loader; from a package on disk (tests), imported.
    """
    mod = sys.modules.get((__package__ or "") + ".sessions")
    if mod is not None:
        return mod
    define = getattr(sys.modules.get(__package__ or ""), "define", None)
    if define is None:
        from . import sessions

        return sessions
    return define("sessions")


def main() -> None:
    # Docker sets AGENTNEST_REATTACH, an abstract unix socket name ("@..."):
    # it lives in the sandbox's own network namespace and leaves no file in
    # it.  See Agent's linger mode.  A process that connects there is as
    # trusted as any process of the sandbox, which runs as the agent's own
    # user: it can kill or impersonate the agent anyway, and the host treats
    # every byte it reads as untrusted (DESIGN.md).
    Agent(linger=os.environ.get("AGENTNEST_REATTACH") or None).run()


def listen(path: str) -> None:
    """The agent of a pod (Kubernetes): serve hosts that connect to the unix socket ``path``.

    The pod's main process runs the agent, so that its commands and Python
    sessions outlive any one connection: each host connection is an exec of
    ``agent/bridge.py`` relaying its stdin and stdout to the socket (an
    ``attach`` to the main process would have the node's container runtime
    log every byte of the stream, secrets included).
    """
    Agent(listen=path).run()


def _listen(path: str) -> Any:
    """A listening unix socket at ``path``; ``@name`` is an abstract one (no file: see main())."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if path.startswith("@"):
        try:
            sock.bind("\0" + path[1:])
        except OSError:
            sock.close()
            raise
        sock.listen(4)
        sock.setblocking(False)
        return sock
    try:
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
    except OSError:
        pass  # bind() below says what is wrong
    try:
        os.unlink(path)  # a previous agent's, in the same sandbox
    except FileNotFoundError:
        pass
    old = os.umask(0o077)  # the socket: this user's only
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.listen(4)
    sock.setblocking(False)
    return sock
