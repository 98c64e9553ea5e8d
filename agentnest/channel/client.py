"""The host's end of the agent channel (blocking).

One :class:`Channel` talks to one agent over one :class:`ByteStream`.  A
reader thread decodes frames and hands each to the request that owns its id,
so many commands, streams and file transfers interleave on one channel and
threads may share it.

Nothing the agent sends is trusted, and nothing it sends is judged here:
frames are size-bounded by the decoder, and every check (each field, the
frames a request accepts, the output budget, the bounds of a read or a
listing, the deadline and heartbeat of every wait) is a call into
:mod:`.protocol`.  This module moves bytes, routes frames to the request
that owns their id, and applies the verdicts: a :class:`ProtocolViolation`
closes the channel (the agent is treated as gone; the owner starts a new
one), and an error from a check fails its request.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..errors import ChannelError
from .protocol import (
    Collected,
    ExecFrames,
    Frame,
    Header,
    Hello,
    ProtocolViolation,
    RawDisplay,
    RawExit,
    RawSessionRun,
    RawValue,
    RunFrames,
    SessionInfo,
    WireError,
    check_opened,
    check_written,
    encode,
    new_decoder,
    parse_hello,
    parse_session_list,
    raise_if_error,
    session_reply,
    wait_time,
)

# Raised by protocol.session_error; importable from here as before.
from .protocol import SessionBusy as SessionBusy
from .streams import ByteStream

__all__ = ["Channel", "ExecHandle", "RawExit", "SessionRunHandle"]

#: Size of one file-data frame sent to the agent.
WRITE_CHUNK = 1024 * 1024
_HELLO = 0
_QUEUE_DEPTH = 256
#: While a command runs the agent sends a frame at least every second (a
#: heartbeat).  No complete frame for this long means the channel is stuck,
#: e.g. sandbox code wrote half a frame into it (judged by protocol.wait_time).
STALL_AFTER = 10.0


class _Pending:
    __slots__ = ("q", "rid")

    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.q: queue.Queue[Frame | None] = queue.Queue(maxsize=_QUEUE_DEPTH)


class Channel:
    """A live connection to one agent.  Use :meth:`connect`."""

    def __init__(self, stream: ByteStream, first_id: int = 1) -> None:
        self._stream = stream
        self._decoder = new_decoder()
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self._ids = itertools.count(first_id)
        self._broken: str | None = None
        self._reader: threading.Thread | None = None
        self.hello: Hello | None = None
        self._last_frame = time.monotonic()
        # Set while the sandbox is paused (Sandbox.pause): a frozen agent sends
        # no heartbeats, so calls in flight wait (to their own deadlines)
        # instead of taking the silence for a stuck channel.
        self._held = False

    @classmethod
    def connect(
        cls,
        stream: ByteStream,
        bundle: bytes | None,
        timeout: float = 30.0,
        *,
        after: Channel | int | None = None,
    ) -> Channel:
        """Send the agent bundle (if the far end waits for one) and await hello.

        With ``after`` (the channel this one replaces), the far end is an
        agent that already runs (restored from a checkpoint): it gets a
        ``reconnect`` frame instead of the bundle and answers with a fresh
        hello.  Request ids continue after ``after``'s, so the frames the
        agent still sends for the old side's requests match nothing here
        and are dropped.  An int ``after`` is that first id itself (a live
        fork's child: its agent is a copy of the parent's).
        """
        first = 1 if after is None else after if isinstance(after, int) else after.next_id()
        ch = cls(stream, first_id=max(1, first))
        waiter = ch._register(_HELLO)
        ch._reader = threading.Thread(target=ch._read_loop, name="agentnest-channel", daemon=True)
        ch._reader.start()
        try:
            if after is not None:
                with ch._wlock:
                    stream.write(encode({"t": "reconnect"}))
            elif bundle:
                with ch._wlock:
                    stream.write(bundle)
            item = ch._get(waiter, time.monotonic() + timeout, "the agent's hello")
            ch.hello = parse_hello(item[0])
        except (OSError, ProtocolViolation, ChannelError) as exc:
            diag = stream.diagnostics().strip()
            ch.close()
            hint = f"; agent stderr: {diag[-800:]}" if diag else ""
            raise ChannelError(f"could not start the in-sandbox agent: {exc}{hint}") from None
        finally:
            ch._unregister(waiter)
        return ch

    # -- plumbing ----------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._broken is None

    @property
    def broken_reason(self) -> str | None:
        return self._broken

    def diagnostics(self) -> str:
        return self._stream.diagnostics()

    def next_id(self) -> int:
        """A request id above every one this channel used (for the channel that replaces it)."""
        with self._lock:
            return next(self._ids) + 1

    def hold(self, held: bool) -> None:
        """Suspend (``True``) or restart (``False``) stall detection, for a pause of the sandbox."""
        self._last_frame = time.monotonic()
        self._held = held

    def close(self, reason: str = "channel closed") -> None:
        self._fail(reason)
        self._stream.close()

    def _read_loop(self) -> None:
        reason = "the agent closed the channel"
        try:
            while True:
                data = self._stream.read(1024 * 1024)
                if not data:
                    break
                self._decoder.feed(data)
                for frame in self._decoder.frames():
                    self._dispatch(frame)
        except WireError as exc:
            reason = f"the agent sent an invalid frame ({exc})"
        except OSError as exc:
            reason = f"the channel failed ({exc})"
        self._fail(reason)
        self._stream.close()

    def _dispatch(self, frame: Frame) -> None:
        self._last_frame = time.monotonic()
        header = frame[0]
        rid = _HELLO if header["t"] == "hello" else header.get("id")
        if rid is None:
            return  # unsolicited (e.g. a log line): nothing to route
        with self._lock:
            pending = self._pending.get(rid)
        while pending is not None:
            try:
                pending.q.put(frame, timeout=0.5)
                return
            except queue.Full:
                # Backpressure: the consumer is slow.  Give up only if the
                # request was abandoned meanwhile.
                with self._lock:
                    if self._pending.get(rid) is not pending:
                        return

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = reason
            waiting = list(self._pending.values())
        for p in waiting:
            while True:
                try:
                    p.q.put_nowait(None)
                    break
                except queue.Full:
                    try:
                        p.q.get_nowait()
                    except queue.Empty:
                        pass

    def _register(self, rid: int | None = None) -> _Pending:
        with self._lock:
            if self._broken is not None:
                raise ChannelError(f"the agent channel is closed: {self._broken}")
            if rid is None:
                rid = next(self._ids)
            p = _Pending(rid)
            self._pending[rid] = p
        return p

    def _unregister(self, p: _Pending) -> None:
        with self._lock:
            if self._pending.get(p.rid) is p:
                del self._pending[p.rid]

    def send(self, header: Header, body: bytes = b"") -> None:
        data = encode(header, body)
        try:
            with self._wlock:
                self._stream.write(data)
        except OSError as exc:
            self._fail(f"writing to the agent failed ({exc})")
            raise ChannelError(f"the agent channel is closed: {self._broken}") from None

    def _get(
        self,
        p: _Pending,
        deadline: float | None,
        what: str,
        stall: float | None = None,
        since: float = 0.0,
    ) -> Frame:
        while True:
            now = time.monotonic()
            # Quiet since the last frame, or since the request was sent
            # (an idle channel has no heartbeats before it).
            quiet = now - max(self._last_frame, since)
            left = None if deadline is None else deadline - now
            try:
                wait = wait_time(left, quiet, stall, self._held, what)
            except ProtocolViolation as exc:
                raise self._violated(exc) from None
            try:
                item = p.q.get(timeout=wait)
            except queue.Empty:
                continue
            if item is None:
                raise ChannelError(f"the agent channel is closed: {self._broken or 'request abandoned'}")
            return item

    def _violated(self, exc: ProtocolViolation) -> ChannelError:
        """Apply a violation's verdict: close the channel; the error for the caller to raise."""
        self.close(exc.reason)
        return ChannelError(exc.error)

    # -- requests ----------------------------------------------------------

    def request(
        self, header: dict[str, Any], deadline: float | None, *, stall: float | None = None
    ) -> Header:
        """Send a one-shot request; return its ``done``/``pong`` reply header.

        With ``stall``, also give up when the agent sends nothing (not even a
        heartbeat) for that long: for requests that may take a while.
        """
        p = self._register()
        since = time.monotonic()
        try:
            header["id"] = p.rid
            self.send(header)
            reply, _ = self._get(p, deadline, f"a reply to {header['t']!r}", stall=stall, since=since)
            raise_if_error(reply, header.get("path"))
            return reply
        finally:
            self._unregister(p)

    def start_exec(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str | None,
        timeout: float | None,
        max_output: int,
        stdin: bytes | None = None,
        keep_stdin_open: bool = False,
        pty: tuple[int, int] | None = None,
    ) -> ExecHandle:
        """Start ``argv``; read its output and result from the returned handle.

        ``pty=(rows, cols)`` runs it on a new pseudo-terminal of that size
        inside the sandbox (its controlling terminal): its output, stdout and
        stderr alike, comes as fd 1; send keystrokes with
        :meth:`ExecHandle.write_stdin` and size changes with
        :meth:`ExecHandle.resize`.  Needs an agent with the ``pty`` capability.
        """
        if pty is not None:
            rows, cols = _window(pty)
            if self.hello is not None and "pty" not in self.hello.capabilities:
                raise ChannelError("the in-sandbox agent does not support terminals (no 'pty' capability)")
        p = self._register()
        handle = ExecHandle(self, p, max_output)
        header: dict[str, Any] = {
            "t": "exec",
            "id": p.rid,
            "argv": argv,
            "env": env,
            "cwd": cwd,
            "timeout": timeout,
            "max_output": max_output,
            "stdin": stdin is not None or keep_stdin_open,
        }
        if pty is not None:
            header["pty"] = {"rows": rows, "cols": cols}
        try:
            self.send(header)
            if stdin:
                for i in range(0, len(stdin), WRITE_CHUNK):
                    self.send({"t": "stdin", "id": p.rid}, stdin[i : i + WRITE_CHUNK])
            if stdin is not None and not keep_stdin_open:
                self.send({"t": "stdin", "id": p.rid, "eof": True})
        except BaseException:
            self._unregister(p)
            raise
        return handle

    # -- Python sessions ------------------------------------------------------

    def session_call(self, header: dict[str, Any], deadline: float | None) -> Header:
        """Send ``session.open``/``reset``/``close``; return the ``done`` reply.

        Raises:
            SessionLostError: the agent has no such session, or its
                interpreter could not start.
            ChannelError: the agent is gone or broke the protocol.
        """
        p = self._register()
        try:
            header["id"] = p.rid
            self.send(header)
            reply, _ = self._get(p, deadline, f"a reply to {header['t']!r}")
            try:
                return session_reply(reply, header["t"])
            except ProtocolViolation as exc:
                raise self._violated(exc) from None
        finally:
            self._unregister(p)

    def open_session(
        self,
        deadline: float | None,
        *,
        reset: int | None = None,
        name: str | None = None,
        key: str | None = None,
        fresh: bool = False,
    ) -> SessionInfo:
        """Start a Python session (or restart session ``reset``) and wait until it is ready.

        With ``name`` (agent capability ``session-names``), the agent attaches
        to the live session of that name if it has one (``info.attached``;
        ``fresh`` restarts it instead) and starts one under that name if not.
        ``key`` is the host's id for a new session, which the agent keeps.
        """
        header: dict[str, Any] = {"t": "session.open"}
        if name is not None:
            header["name"] = name
            if fresh:
                header["fresh"] = True
        if key is not None:
            header["key"] = key
        if reset is not None:
            header = {"t": "session.reset", "session": reset}
        reply = self.session_call(header, deadline)
        try:
            return check_opened(reply, reset=reset, name=name)
        except ProtocolViolation as exc:
            raise self._violated(exc) from None

    def list_sessions(self, deadline: float | None) -> tuple[SessionInfo, ...]:
        """The agent's live Python sessions (capability ``session-names``)."""
        reply = self.session_call({"t": "session.list"}, deadline)
        try:
            return parse_session_list(reply)
        except ProtocolViolation as exc:
            raise self._violated(exc) from None

    def start_session_run(
        self, session: int, code: bytes, *, timeout: float | None, max_output: int
    ) -> SessionRunHandle:
        """Send ``code`` to run in ``session``; read the outcome from the handle."""
        p = self._register()
        handle = SessionRunHandle(self, p, max_output, session)
        header = {
            "t": "session.run",
            "id": p.rid,
            "session": session,
            "timeout": timeout,
            "max_output": max_output,
        }
        try:
            self.send(header, code)
        except BaseException:
            self._unregister(p)
            raise
        return handle

    def interrupt_session(self, session: int) -> None:
        """Raise KeyboardInterrupt in the session's running code (no reply)."""
        if self.alive:
            try:
                self.send({"t": "session.interrupt", "session": session})
            except ChannelError:
                pass

    def write_file(self, path: str, data: bytes, mode: int, deadline: float | None) -> int:
        p = self._register()
        try:
            view = memoryview(data)
            n = len(view)
            offsets = list(range(0, n, WRITE_CHUNK)) or [0]
            for i, off in enumerate(offsets):
                self.send(
                    {
                        "t": "write",
                        "id": p.rid,
                        "path": path,
                        "mode": mode,
                        "first": i == 0,
                        "last": i == len(offsets) - 1,
                    },
                    bytes(view[off : off + WRITE_CHUNK]),
                )
                if i % 8 == 7 and not p.q.empty():
                    break  # an early error: stop sending
            reply, _ = self._get(p, deadline, f"the write of {path!r}")
            check_written(reply, path, n)
            return n
        finally:
            self._unregister(p)

    def _collect(self, header: dict[str, Any], collected: Collected, deadline: float | None) -> Header:
        """Send a request answered by ``data`` frames and a ``done``; ``collected`` judges each.

        Returns the ``done`` header.  A violation (more than the request's bound) closes
        the channel: the agent is not trusted.
        """
        p = self._register()
        try:
            header["id"] = p.rid
            self.send(header)
            while True:
                reply, body = self._get(p, deadline, collected.what)
                try:
                    done = collected.receive(reply, body)
                except ProtocolViolation as exc:
                    raise self._violated(exc) from None
                if done is not None:
                    return done
        finally:
            self._unregister(p)

    def read_file(self, path: str, max_bytes: int, deadline: float | None) -> bytes:
        request = {"t": "read", "path": path, "max_bytes": max_bytes}
        collected = Collected(f"the contents of {path!r}", path, max_bytes)
        self._collect(request, collected, deadline)
        return b"".join(collected.chunks)

    def list_entries(
        self, path: str, recursive: bool, max_entries: int, deadline: float | None
    ) -> tuple[list[Any], bool]:
        """A directory listing: raw entries (validated by the caller) and whether it was cut."""
        request = {"t": "list", "path": path, "recursive": recursive, "max_entries": max_entries}
        # The listing's byte bound follows from max_entries (protocol.Collected).
        collected = Collected(f"the listing of {path or '.'!r}", path, 0, max_entries=max_entries)
        done = self._collect(request, collected, deadline)
        return collected.entries, bool(done["truncated"])


#: The largest terminal dimension (the kernel's ``struct winsize`` holds 16 bits).
MAX_WINDOW = 0xFFFF


def _window(size: tuple[int, int]) -> tuple[int, int]:
    """Check a terminal size ``(rows, cols)``: whole numbers in 1..65535."""
    try:
        rows, cols = size
    except (TypeError, ValueError):
        raise ValueError(f"a terminal size is (rows, cols), not {size!r:.40}") from None
    for value in (rows, cols):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_WINDOW:
            raise ValueError(f"terminal size {size!r:.40} must be two integers in 1..{MAX_WINDOW}")
    return rows, cols


class ExecHandle:
    """A running command: its output events, stdin and cancellation."""

    def __init__(self, channel: Channel, pending: _Pending, max_output: int) -> None:
        self._channel = channel
        self._pending = pending
        self._frames = ExecFrames(max_output)
        self._since = time.monotonic()
        #: How results and events name the command (set by the caller).
        self.label = ""

    @property
    def id(self) -> int:
        return self._pending.rid

    @property
    def result(self) -> RawExit | None:
        return self._frames.result

    @property
    def truncated(self) -> bool:
        return self._frames.truncated

    def next_event(self, deadline: float | None) -> tuple[int, bytes] | RawExit:
        """The next ``(fd, bytes)`` of output, or the :class:`RawExit` at the end."""
        while True:
            header, body = self._channel._get(
                self._pending, deadline, "the command's result", stall=STALL_AFTER, since=self._since
            )
            try:
                event = self._frames.receive(header, body)
            except ProtocolViolation as exc:
                raise self._channel._violated(exc) from None
            finally:
                if self._frames.ended:  # its outcome or an error reply: stop listening
                    self._channel._unregister(self._pending)
            if event is not None:
                return event

    def events(self, deadline: float | None) -> Iterator[tuple[int, bytes] | RawExit]:
        while self.result is None:
            yield self.next_event(deadline)

    def write_stdin(self, data: bytes, eof: bool = False) -> None:
        for i in range(0, max(len(data), 1), WRITE_CHUNK):
            last = i + WRITE_CHUNK >= len(data)
            self._channel.send({"t": "stdin", "id": self.id, "eof": eof and last}, data[i : i + WRITE_CHUNK])

    def resize(self, rows: int, cols: int) -> None:
        """Set the size of the command's terminal (started with ``pty=``); no reply."""
        rows, cols = _window((rows, cols))
        if self.result is None:
            self._channel.send({"t": "resize", "id": self.id, "rows": rows, "cols": cols})

    def cancel(self) -> None:
        """Kill the command's whole process tree (the result still arrives)."""
        if self.result is None and self._channel.alive:
            try:
                self._channel.send({"t": "cancel", "id": self.id})
            except ChannelError:
                pass

    def abandon(self) -> None:
        """Stop listening (after cancel, when the result no longer matters).

        A thread still blocked in :meth:`next_event` (an awaiting task of
        ``AsyncSandbox`` that was cancelled) wakes up with ``ChannelError``
        instead of waiting out its deadline.
        """
        self._channel._unregister(self._pending)
        try:
            self._pending.q.put_nowait(None)
        except queue.Full:
            pass  # the waiter has frames to read: it is not blocked


class SessionRunHandle:
    """Code running in a Python session: its output, display items, values and outcome.

    Every frame is judged by :class:`~.protocol.RunFrames`: output and display data
    share the caller's ``max_output`` budget, display items are reassembled and
    bounded, and the result and error texts are bounded by the protocol.
    """

    def __init__(self, channel: Channel, pending: _Pending, max_output: int, session: int) -> None:
        self._channel = channel
        self._pending = pending
        self._frames = RunFrames(max_output)
        self.session = session
        self._since = time.monotonic()

    @property
    def id(self) -> int:
        return self._pending.rid

    @property
    def result(self) -> RawSessionRun | None:
        return self._frames.result

    @property
    def truncated(self) -> bool:
        return self._frames.truncated

    def next_event(self, deadline: float | None) -> tuple[int, bytes] | RawDisplay | RawValue | RawSessionRun:
        """The next output ``(fd, bytes)``, display item or value; the :class:`RawSessionRun` last."""
        while True:
            header, body = self._channel._get(
                self._pending, deadline, "the session's result", stall=STALL_AFTER, since=self._since
            )
            try:
                event = self._frames.receive(header, body)
            except ProtocolViolation as exc:
                raise self._channel._violated(exc) from None
            finally:
                if self._frames.ended:  # its outcome or an error reply: stop listening
                    self._channel._unregister(self._pending)
            if event is not None:
                return event

    def interrupt(self) -> None:
        """Interrupt the running code (KeyboardInterrupt); the outcome still arrives."""
        if self.result is None:
            self._channel.interrupt_session(self.session)

    def abandon(self) -> None:
        """Stop listening (the outcome no longer matters)."""
        self._channel._unregister(self._pending)
