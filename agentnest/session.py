"""Persistent Python sessions: ``Sandbox.python_session()``.

A session is one Python interpreter process in the sandbox, started and
driven by the in-sandbox agent (:mod:`agentnest.agent.sessions`); nothing
is written to the workspace.  Variables, imports and open handles live
across :meth:`PythonSession.run` calls, and the value of a trailing
expression comes back as ``result``, as in a notebook.

Everything a session sends back passes the sandbox's guard: output is
bounded by ``max_output_bytes`` and every secret is redacted from text
(stdout, stderr, result, error, textual display items).

A session may have a name (``python_session(name="main")``).  The agent
keeps the names (and each session's id), so any host channel to that
agent -- this one, one opened after the channel was replaced, or a
live-forked child's -- lists its sessions (``Sandbox.sessions()``) and
attaches to one by name.  Within one ``Sandbox``, every
``python_session(name=...)`` of a live session returns the same
:class:`PythonSession` object, so its one-run-at-a-time lock is shared; and
a session whose channel was replaced while the agent lived on carries on
with the new channel.
"""

from __future__ import annotations

import base64
import math
import threading
import time
import uuid
import weakref
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from types import TracebackType

from ._core import SandboxCore, core_of
from .agent.limits import INTERRUPT_GRACE, MAX_CODE_BYTES, NAME_MAX, valid_name
from .channel.client import Channel, SessionBusy, SessionRunHandle
from .channel.protocol import BINARY_MIMES, RawDisplay, RawSessionRun, RawValue, SessionInfo
from .config import ExecutionChunk
from .errors import (
    ChannelError,
    ConfigurationError,
    ExecutionTimeoutError,
    SandboxDestroyedError,
    SessionLostError,
    UnsupportedCapabilityError,
)
from .events import EventType
from .guard import scrub_errors
from .results import DisplayItem, SessionResult

__all__ = ["DisplayItem", "PythonSession", "PythonSessionInfo", "SessionResult", "SessionStream"]

#: How long opening, resetting or closing a session may take.
_CLOSE_WAIT = 10.0
#: Extra time the host waits past a run's timeout (and the interrupt grace)
#: for the agent to report, before it declares the agent hung.
_BACKSTOP_GRACE = 10.0
#: Characters of code recorded in an audit event.
_EVENT_CODE = 2000

#: The host objects of named sessions, per sandbox and session id (the key
#: the agent keeps), so that asking for a name twice gives the one object
#: (and its one lock).  Weak both ways: a dropped sandbox or session leaves
#: nothing behind.
_NAMED: weakref.WeakKeyDictionary[SandboxCore, dict[str, weakref.ref[PythonSession]]] = (
    weakref.WeakKeyDictionary()
)
_NAMED_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class PythonSessionInfo:
    """A live Python session of a sandbox, as :meth:`Sandbox.sessions` lists it.

    The agent in the sandbox reports it (the host checks every field), so
    a listing is the same from any host connected to that agent.

    .. versionadded:: 0.4.0
    """

    name: str | None
    """The session's name; None for an anonymous session."""
    id: str
    """Its id, the same as :attr:`PythonSession.id` (and in its events)."""
    pid: int
    """Its interpreter's process id inside the sandbox."""
    started: float
    """When its interpreter started (Unix time, by the sandbox's clock)."""
    busy: bool
    """It is running code (or still starting) right now."""


@scrub_errors
class PythonSession:
    """A persistent Python interpreter in a sandbox.  Use :meth:`Sandbox.python_session`.

    Example::

        with sandbox.python_session() as session:
            session.run("import json; x = 41")
            print(session.run("x + 1").check().result)   # "42"

    A run's ``timeout`` interrupts the code with ``KeyboardInterrupt`` and
    keeps the session: what it defined before stays.  Code that ignores the
    interrupt for :data:`~agentnest.agent.limits.INTERRUPT_GRACE`
    seconds is killed with its interpreter, and the session is lost.

    A session runs one piece of code at a time; several sessions per sandbox
    are independent interpreters.  Its interpreter dies with the in-sandbox
    agent or the sandbox.  A session that lost its interpreter raises
    :class:`SessionLostError` on every run until :meth:`reset`.

    A session opened with ``python_session(name=...)`` can be reached
    again by that name (see :meth:`Sandbox.python_session`).

    .. versionadded:: 0.4.0
    """

    def __init__(self, sandbox: object, *, start_timeout: float = 30.0) -> None:
        """Prepare a session; the interpreter starts with :meth:`start` or the first run.

        Args:
            sandbox: the sandbox it runs in (a :class:`Sandbox`).
            start_timeout: seconds the interpreter may take to start.
        """
        if (
            isinstance(start_timeout, bool)
            or not isinstance(start_timeout, (int, float))
            or not math.isfinite(start_timeout)
            or start_timeout <= 0
        ):
            raise ConfigurationError(f"start_timeout={start_timeout!r} must be a positive number of seconds")
        self._start_timeout = float(start_timeout)
        self._sandbox = core_of(sandbox)
        self._guard = self._sandbox.guard
        self._id = uuid.uuid4().hex[:12]
        self._busy = threading.Lock()
        self._closed = False
        self._lost: str | None = None
        self._inflight: SessionRunHandle | None = None
        self._current: SessionRunHandle | None = None
        self._channel: Channel | None = None
        self._info: SessionInfo | None = None
        self._name: str | None = None

    def start(self) -> None:
        """Start the interpreter now (the first run starts it otherwise).  Idempotent.

        Raises:
            SessionLostError: the interpreter could not start, or the session is closed.
        """
        if self._closed:
            raise SessionLostError(f"session {self._id} is closed; open a new one with python_session()")
        if self._info is not None:
            return
        with self._busy:
            if self._info is None:
                self._open(reset=False)

    # -- properties ------------------------------------------------------------

    @property
    def id(self) -> str:
        """This session's id (stable across :meth:`reset`; used in events).

        The agent keeps it, so a host that attaches by name (or lists the
        sessions) sees the same id.
        """
        return self._id

    @property
    def name(self) -> str | None:
        """The name it was opened with (``python_session(name=...)``); None if anonymous.

        .. versionadded:: 0.4.0
        """
        return self._name

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pid(self) -> int | None:
        """The interpreter's process id inside the sandbox (None once lost or closed)."""
        if self._closed or self._lost is not None or self._info is None:
            return None
        return self._info.pid

    # -- running code ----------------------------------------------------------

    def run(self, code: str, *, timeout: float | None = 30.0) -> SessionResult:
        """Run ``code`` in the session and wait for it.

        Args:
            code: Python source.  If its last statement is an expression,
                ``repr()`` of its value comes back as ``result``.
                Top-level ``await`` works.
            timeout: seconds before the code is interrupted
                (``KeyboardInterrupt``), 30 by default as in 0.3.0; ``None``
                bounds it only by the sandbox's lifetime.

        Returns:
            The :class:`SessionResult`; an exception in the code is not an
            error here (``error`` holds its traceback; ``check()`` raises).

        Raises:
            ExecutionTimeoutError: the code ran past ``timeout`` and was
                interrupted; ``.result`` has the partial output.  The
                session and its variables survive.
            SessionLostError: the interpreter died (now or earlier), or did
                not stop after the interrupt and was killed.
            PolicyDeniedError: the approval hook refused (kind ``session.run``).
        """
        stream = self.stream(code, timeout=timeout)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream(self, code: str, *, timeout: float | None = None) -> SessionStream:
        """Run ``code`` and iterate over its output as it arrives.

        Returns a :class:`SessionStream`: iterate it for
        :class:`ExecutionChunk` items; ``.result`` holds the
        :class:`SessionResult` afterwards.  The code starts when the
        iteration does.  Leaving the iteration early interrupts the code
        (the session stays).  Raises as :meth:`run` does.
        """
        if not isinstance(code, str):
            raise ConfigurationError(f"code must be str, not {type(code).__name__}")
        data = code.encode("utf-8", "surrogatepass")
        if len(data) > MAX_CODE_BYTES:
            raise ConfigurationError(
                f"code of {len(data)} bytes is over the limit of {MAX_CODE_BYTES}; "
                "write it to a file with write_file and exec(open(...).read()) it"
            )
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds or None")
        return SessionStream(self, code, data, float(timeout) if timeout is not None else None)

    def interrupt(self) -> None:
        """Interrupt the code running now (``KeyboardInterrupt``), e.g. from another thread.

        The session keeps its state; the run returns with the traceback in
        ``error``.  Code that ignores the interrupt for
        :data:`~agentnest.agent.limits.INTERRUPT_GRACE` seconds is
        killed, and the session is lost.  Does nothing when no code runs.
        """
        handle = self._current
        if handle is not None:
            handle.interrupt()
        elif self._info is not None and self._channel is not None and self._channel.alive:
            # Code this object did not send (it was running when the channel
            # was replaced, or in the parent of a live fork) stops too; the
            # agent ignores an interrupt when nothing runs.
            self._channel.interrupt_session(self._info.session)

    def reset(self) -> None:
        """Start a fresh interpreter: every variable and import is gone.

        This also recovers a session that lost its interpreter.
        """
        if self._closed:
            raise SessionLostError(f"session {self._id} is closed; open a new one with python_session()")
        if not self._busy.acquire(blocking=False):
            raise ConfigurationError(f"session {self._id} is running code; reset it when the run has ended")
        try:
            if self._inflight is not None:
                self._inflight.abandon()  # the reset ends that run in the sandbox
                self._inflight = None
            try:
                self._open(reset=True)
            except SessionLostError as exc:
                self._lost = str(exc)  # the old interpreter is gone either way
                raise
            self._lost = None
        finally:
            self._busy.release()
        self._guard.emit(EventType.SESSION_RESET, {"session": self._id})

    def close(self) -> None:
        """End the interpreter (and what it started).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.abandon()  # closing ends that run in the sandbox
        _forget(self)
        ch = self._channel
        current = self._sandbox.channel
        if ch is not None and not ch.alive and current is not None and current.alive:
            # The channel was replaced: close the interpreter if the agent lives on.
            ch = current if self._reattach(current) else ch
        if ch is not None and ch.alive and self._info is not None:
            try:
                ch.session_call(
                    {"t": "session.close", "session": self._info.session}, time.monotonic() + _CLOSE_WAIT
                )
            except (ChannelError, SessionLostError):
                pass  # gone already: nothing left to close
        self._guard.emit(EventType.SESSION_CLOSED, {"session": self._id})

    def __enter__(self) -> PythonSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "lost" if self._lost is not None else "open"
        name = "" if self._name is None else f"{self._name!r} "
        return f"<PythonSession {name}{self._id} of sandbox {self._sandbox.id} {state}>"

    # -- internals -------------------------------------------------------------

    def _open(self, *, reset: bool) -> None:
        sandbox = self._sandbox
        ch = _session_channel(sandbox, named=self._name is not None)
        deadline = time.monotonic() + self._start_timeout
        # Restart in place when the same agent still knows the session (on
        # this channel, or on a new one to the same agent); after an agent
        # restart, start a new one on the new agent (a named one under its
        # name: fresh, as a reset is).
        if reset and ch is not self._channel:
            self._reattach(ch)
        same = reset and ch is self._channel and self._info is not None
        try:
            if same and self._info is not None:
                info = ch.open_session(deadline, reset=self._info.session)
            elif self._name is not None:
                if _holder(sandbox, self._name, besides=self) is not None:
                    raise SessionLostError(
                        f"session {self._name!r} was opened again on the restarted agent; "
                        f"reach it with python_session(name={self._name!r})"
                    )
                info = ch.open_session(deadline, name=self._name, key=self._id, fresh=True)
            else:
                info = ch.open_session(deadline, key=self._id)
        except ChannelError as exc:
            raise sandbox.lost(exc) from None
        self._adopt(ch, info)
        if self._name is not None:
            _remember(self)
        self._opened(info)

    def _reattach(self, ch: Channel) -> bool:
        """After the channel was replaced: carry on if the agent behind ``ch`` still has this interpreter."""
        info = self._info
        if info is None or ch.hello is None or "session-names" not in ch.hello.capabilities:
            return False
        try:
            listed = ch.list_sessions(time.monotonic() + _CLOSE_WAIT)
        except (ChannelError, SessionLostError):
            return False
        for found in listed:
            # The same id, process and start time: the very interpreter this
            # object drove (a restarted agent's sessions never match).  A busy
            # one still runs what the old channel sent: not ours to take over.
            if (found.key, found.pid, found.started) == (self._id, info.pid, info.started) and not found.busy:
                self._inflight = None  # it waited on the old channel
                self._channel = ch
                self._info = found
                return True
        return False

    def _adopt(self, ch: Channel, info: SessionInfo) -> None:
        """Bind to the agent's session ``info`` on ``ch``; a new interpreter drops a pending run."""
        if not info.attached or ch is not self._channel:
            inflight, self._inflight = self._inflight, None
            if inflight is not None:
                inflight.abandon()  # it ran in the interpreter that ended, or on the old channel
        self._channel = ch
        self._info = info
        self._lost = None  # the agent vouches for a live interpreter

    def _opened(self, info: SessionInfo) -> None:
        data: dict[str, object] = {"session": self._id, "pid": info.pid, "python": info.python}
        if self._name is not None:
            data.update({"name": self._name, "attached": info.attached})
        self._guard.emit(EventType.SESSION_OPENED, data)

    def _begin(self, code: str, data: bytes, timeout: float | None) -> SessionRunHandle:
        """Approve and send a run; the caller holds ``_busy`` until it ends."""
        if self._closed:
            raise SessionLostError(f"session {self._id} is closed; open a new one with python_session()")
        if self._lost is not None:
            raise SessionLostError(
                f"session {self._id} lost its interpreter earlier ({self._lost}); "
                "its variables are gone, call reset() to start a fresh one"
            )
        if self._info is None:  # not started yet (0.3.0 started on first use too)
            self._open(reset=False)
        ch = self._sandbox.link()
        if ch is not self._channel and not self._reattach(ch):
            raise self._mark_lost(
                "the in-sandbox agent was restarted and the session's interpreter ended with it"
            )
        self._guard.approve("session.run", {"session": self._id, "code": self._guard.redact(code)})
        self._settle(ch)
        assert self._info is not None
        try:
            self._current = ch.start_session_run(
                self._info.session, data, timeout=timeout, max_output=self._guard.policy.max_output_bytes
            )
        except ChannelError as exc:
            raise self._channel_lost(exc) from None
        return self._current

    def _settle(self, ch: Channel) -> None:
        """Wait for an interrupted, abandoned run to end before the next one."""
        handle, self._inflight = self._inflight, None
        if handle is None or handle.result is not None:
            return
        deadline = time.monotonic() + INTERRUPT_GRACE + _BACKSTOP_GRACE
        raw: RawSessionRun | None = None
        try:
            while raw is None:
                event = handle.next_event(deadline)
                if isinstance(event, RawSessionRun):
                    raw = event
        except ChannelError as exc:
            raise self._channel_lost(exc) from None
        except SessionLostError as exc:
            raise self._mark_lost(str(exc)) from None
        if raw.lost:
            raise self._mark_lost(raw.reason)

    def _deadline(self, timeout: float | None) -> float:
        if timeout is None:
            return self._sandbox.wait_deadline(None)
        return self._sandbox.wait_deadline(timeout + INTERRUPT_GRACE)

    def _mark_lost(self, reason: str, result: SessionResult | None = None) -> SessionLostError:
        first = self._lost is None
        self._lost = reason or "the interpreter is gone"
        if first:
            self._guard.emit(EventType.SESSION_LOST, {"session": self._id, "reason": self._lost})
        return SessionLostError(
            f"session {self._id} lost its interpreter: {self._lost}. Its variables are gone; "
            "call reset() to start a fresh one (the sandbox is intact)",
            result,
        )

    def _channel_lost(self, exc: ChannelError) -> Exception:
        gone = self._sandbox.lost(exc)
        if isinstance(gone, SandboxDestroyedError):
            self._lost = str(gone)
            return gone
        return self._mark_lost(f"the in-sandbox agent was lost ({exc})")

    def _abandon(self, handle: SessionRunHandle) -> None:
        """The caller stopped listening mid-run: interrupt it; the next call settles it."""
        if handle.result is None and self._lost is None:
            handle.interrupt()
            self._inflight = handle

    def _display_item(self, raw: RawDisplay) -> DisplayItem:
        if raw.mime in BINARY_MIMES:
            return DisplayItem(raw.mime, base64.b64encode(raw.data).decode("ascii"), raw.main)
        return DisplayItem(raw.mime, self._guard.redact(raw.data.decode("utf-8", "replace")), raw.main)


@scrub_errors
class SessionStream:
    """Output of code running in a session, chunk by chunk.  Iterate it once.

    .. versionadded:: 0.4.0
    """

    def __init__(self, session: PythonSession, code: str, data: bytes, timeout: float | None) -> None:
        self._session = session
        self._code = code
        self._data = data
        self._timeout = timeout
        # A weak reference: the generator's frame holds this object, and a
        # cycle would keep an abandoned run's lock until the garbage collector
        # ran, instead of releasing it (and interrupting the code) at once.
        self._iterator: weakref.ref[Generator[ExecutionChunk, None, None]] | None = None
        self.result: SessionResult | None = None

    def __iter__(self) -> Iterator[ExecutionChunk]:
        if self._iterator is not None:
            raise ConfigurationError("a session stream can be iterated only once")
        iterator = self._iterate()
        self._iterator = weakref.ref(iterator)
        return iterator

    def _iterate(self) -> Generator[ExecutionChunk, None, None]:
        session = self._session
        if not session._busy.acquire(blocking=False):
            raise ConfigurationError(
                f"session {session.id} is already running code; a session runs one piece of code at a "
                "time (wait for the other run, or open another session)"
            )
        try:
            yield from self._run(session)
        finally:
            session._current = None
            session._busy.release()

    def _run(self, session: PythonSession) -> Iterator[ExecutionChunk]:
        guard = session._guard
        handle = session._begin(self._code, self._data, self._timeout)
        deadline = session._deadline(self._timeout)
        decoder = guard.stream_decoder()
        out: list[bytes] = []
        err: list[bytes] = []
        display: list[DisplayItem] = []
        values: dict[str, str] = {}
        finished = False
        try:
            while handle.result is None:
                try:
                    event = handle.next_event(deadline)
                except SessionBusy:
                    finished = True
                    raise ConfigurationError(
                        f"session {session.id} is still running code sent before its channel was "
                        "replaced; wait until sessions() shows it idle, interrupt() it, or reset() it"
                    ) from None
                except ChannelError as exc:
                    finished = True
                    raise session._channel_lost(exc) from None
                except SessionLostError as exc:
                    finished = True
                    raise session._mark_lost(str(exc)) from None
                if isinstance(event, tuple):
                    fd, data = event
                    (out if fd == 1 else err).append(data)
                    chunk = decoder.feed(fd, data)
                    if chunk is not None:
                        yield chunk
                elif isinstance(event, RawDisplay):
                    display.append(session._display_item(event))
                elif isinstance(event, RawValue):
                    values[event.name] = guard.redact(event.text)
            finished = True
        finally:
            if not finished:  # the caller left early, or an error on this side
                session._abandon(handle)
        yield from decoder.flush()
        raw = handle.result
        assert raw is not None
        result = SessionResult(
            stdout=guard.redact(b"".join(out).decode("utf-8", "replace")),
            stderr=guard.redact(b"".join(err).decode("utf-8", "replace")),
            result=values.get("result"),
            error=values.get("error"),
            display=tuple(display),
            duration=raw.duration,
            timed_out=raw.timed_out,
            truncated=handle.truncated or raw.truncated,
        )
        self.result = result
        if raw.lost:
            raise session._mark_lost(raw.reason, result)
        guard.emit(
            EventType.SESSION_TIMED_OUT if raw.timed_out else EventType.SESSION_RAN,
            {
                "session": session.id,
                "code": self._code[:_EVENT_CODE],
                "ok": result.ok,
                "duration": raw.duration,
                "truncated": result.truncated,
                "display": len(display),
            },
        )
        if raw.timed_out:
            raise ExecutionTimeoutError(
                f"session code timed out after {self._timeout}s and was interrupted with "
                "KeyboardInterrupt; the session and its variables are intact",
                result,
            )

    def close(self) -> None:
        """Stop listening; code still running is interrupted (the session stays)."""
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is not None:
            iterator.close()

    def __enter__(self) -> SessionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- names and listings ----------------------------------------------------------


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid session name; raise :class:`ConfigurationError` if not."""
    if not valid_name(name):
        raise ConfigurationError(
            f"session name {name!r:.80} is invalid: use 1 to {NAME_MAX} letters, digits, '_', '.' "
            "or '-', not starting with '.' or '-' (for example name=\"main\"), or no name for an "
            "anonymous session"
        )
    assert isinstance(name, str)
    return name


def open_python_session(sandbox: SandboxCore, *, name: str | None, start_timeout: float) -> PythonSession:
    """What :meth:`Sandbox.python_session` does: a new session, or the live one of ``name``."""
    if name is not None:
        check_name(name)
    session = PythonSession(sandbox, start_timeout=start_timeout)
    if name is None:
        session.start()
        return session
    session._name = name
    ch = _session_channel(sandbox, named=True)
    try:
        info = ch.open_session(time.monotonic() + session._start_timeout, name=name, key=session._id)
    except ChannelError as exc:
        raise sandbox.lost(exc) from None
    with _NAMED_LOCK:
        known = _named_of(sandbox)
        ref = known.get(info.key or session._id)
        held = ref() if ref is not None else None
        if held is not None and not held._closed:
            # This sandbox already has an object for that session: the same
            # object, so the lock that keeps it to one run at a time is too.
            held._adopt(ch, info)
            chosen = held
        else:
            if info.key:
                session._id = info.key  # the id another host (or this one, earlier) gave it
            session._adopt(ch, info)
            known[session._id] = weakref.ref(session)
            chosen = session
    if chosen is session or not info.attached:
        chosen._opened(info)
    return chosen


def list_python_sessions(sandbox: SandboxCore) -> tuple[PythonSessionInfo, ...]:
    """What :meth:`Sandbox.sessions` does: the agent's live sessions, oldest first."""
    ch = _session_channel(sandbox, named=True)
    try:
        listed = ch.list_sessions(time.monotonic() + _CLOSE_WAIT)
    except ChannelError as exc:
        raise sandbox.lost(exc) from None
    found = [PythonSessionInfo(i.name, i.key, i.pid, i.started, i.busy) for i in listed]
    return tuple(sorted(found, key=lambda i: (i.started, i.id)))


def _session_channel(sandbox: SandboxCore, *, named: bool) -> Channel:
    ch = sandbox.link()
    caps = ch.hello.capabilities if ch.hello is not None else frozenset()
    if "session" not in caps:
        raise UnsupportedCapabilityError("this sandbox's agent does not offer Python sessions")
    if named and "session-names" not in caps:
        raise UnsupportedCapabilityError(
            "this sandbox's agent does not offer named Python sessions or a session list (it is older "
            "than this host); open an anonymous session with python_session()"
        )
    return ch


def _holder(sandbox: SandboxCore, name: str, *, besides: PythonSession) -> PythonSession | None:
    """Another open object of a session of ``sandbox`` named ``name``, if any."""
    with _NAMED_LOCK:
        for ref in _named_of(sandbox).values():
            held = ref()
            if held is not None and held is not besides and not held._closed and held._name == name:
                return held
    return None


def _named_of(sandbox: SandboxCore) -> dict[str, weakref.ref[PythonSession]]:
    """The named sessions of ``sandbox`` by id (the caller holds ``_NAMED_LOCK``)."""
    known = _NAMED.setdefault(sandbox, {})
    for gone in [k for k, ref in known.items() if ref() is None]:
        del known[gone]
    return known


def _remember(session: PythonSession) -> None:
    with _NAMED_LOCK:
        known = _named_of(session._sandbox)
        ref = known.get(session._id)
        held = ref() if ref is not None else None
        if held is None or held._closed:
            known[session._id] = weakref.ref(session)


def _forget(session: PythonSession) -> None:
    with _NAMED_LOCK:
        known = _NAMED.get(session._sandbox)
        ref = known.get(session._id) if known is not None else None
        if known is not None and ref is not None and ref() in (None, session):
            del known[session._id]
