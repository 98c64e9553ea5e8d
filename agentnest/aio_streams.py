"""``AsyncExecutionStream``, ``AsyncSessionStream``, ``AsyncPythonSession``: what the async face hands out.

This module decides how :class:`~agentnest.AsyncSandbox` hands out what is
iterated with ``async for`` or awaited call by call: a command is started by
the :class:`~agentnest._core.SandboxCore` in a worker thread
(:mod:`agentnest._bridge`), which the iterating task abandons if it is
cancelled, and then killed (its whole process tree, as its timeout would);
session code is interrupted (``KeyboardInterrupt``) instead, and the session
stays.  The documentation of each method lives on its sync twin
(:class:`~agentnest.ExecutionStream`, :class:`~agentnest.PythonSession`).

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from types import TracebackType

import anyio
import anyio.to_thread

from ._bridge import Commands, _Abandoned, _Handoff, _kill, _ThreadIterator
from ._core import Command, SandboxCore
from .channel.client import ExecHandle
from .channel.protocol import RawExit
from .config import ExecutionChunk, ExecutionResult
from .errors import ChannelError, ConfigurationError, ExecutionError, ExecutionTimeoutError
from .guard import StreamDecoder
from .session import PythonSession, SessionResult, SessionStream

__all__ = ["AsyncExecutionStream", "AsyncPythonSession", "AsyncSessionStream"]


class AsyncExecutionStream:
    """Output of a running command for ``async for``; the twin of :class:`ExecutionStream`.

    Iterate it once for :class:`ExecutionChunk` items; ``.result`` holds the
    :class:`ExecutionResult` afterwards (a timeout raises
    :class:`ExecutionTimeoutError` after the last chunk, as in the sync face).
    Cancelling the iterating task, ``await stream.aclose()`` or leaving an
    ``async with stream:`` block kills the command's process tree.  Breaking
    out of a bare ``async for`` leaves the command running until the stream
    is garbage-collected: use ``async with`` to stop it at once.
    """

    def __init__(self, core: SandboxCore, command: Command, commands: Commands) -> None:
        self._owner = commands
        self._sandbox = core
        self._command = command
        self._timeout = command.timeout
        self._handoff: _Handoff[ExecHandle] = _Handoff()
        self._handle: ExecHandle | None = None
        self._deadline = 0.0
        self._decoder: StreamDecoder | None = None
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._tail: list[ExecutionChunk] = []
        self._error: ExecutionError | None = None
        self._finished = False
        self.result: ExecutionResult | None = None

    # -- worker-thread side ----------------------------------------------------

    def _begin(self) -> ExecHandle:
        handle = self._handle
        if handle is None:
            core = self._sandbox
            handle = core.start(self._command)
            if not self._handoff.give(handle):
                _kill(handle)
                raise _Abandoned
            self._deadline = core.wait_deadline(self._timeout)
            self._decoder = core.guard.stream_decoder()
            self._handle = handle
        return handle

    def _step(self) -> tuple[int, bytes] | RawExit:
        handle = self._begin()
        try:
            return handle.next_event(self._deadline)
        except ChannelError as exc:
            if self._handoff.abandoned:
                raise _Abandoned from None
            raise self._sandbox.lost(exc) from None

    def _finish(self, raw: RawExit) -> ExecutionResult:
        assert self._handle is not None and self._handle.result is raw
        return self._sandbox.result(self._handle, b"".join(self._out), b"".join(self._err), self._timeout)

    # -- task side ---------------------------------------------------------------

    def __aiter__(self) -> AsyncExecutionStream:
        return self

    async def __anext__(self) -> ExecutionChunk:
        while True:
            if self._tail:
                return self._tail.pop(0)
            if self._finished:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            try:
                event = await self._owner.wait(self._step, self._handoff)
            except BaseException:
                await self.aclose()
                raise
            assert self._decoder is not None
            if isinstance(event, tuple):
                fd, data = event
                (self._out if fd == 1 else self._err).append(data)
                chunk = self._decoder.feed(fd, data)
                if chunk is not None:
                    return chunk
                continue
            self._finished = True
            self._tail = self._decoder.flush()
            try:
                # In a thread: finishing emits events, and observers may block.
                self.result = await anyio.to_thread.run_sync(self._finish, event)
            except ExecutionTimeoutError as exc:
                self._error = exc
            else:
                self._tail.append(ExecutionChunk("status", exit_code=self.result.exit_code))

    async def aclose(self) -> None:
        """Kill the command's process tree if it still runs (see :meth:`ExecutionStream.close`)."""
        self._finished = True
        handle = self._handoff.abandon()
        if handle is not None and handle.result is None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_kill, handle)

    close = aclose

    def _running(self) -> ExecHandle:
        handle = self._handle
        if handle is None:
            raise ConfigurationError("the command has not started yet: use `async with stream:` first")
        return handle

    async def send_input(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin (started with ``interactive=True`` or a ``pty``).

        Input to a command that has ended is dropped, as a pipe would.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise ConfigurationError("input must be bytes")
        handle = self._running()
        if handle.result is None:
            await self._owner.call(handle.write_stdin, bytes(data))

    async def close_input(self) -> None:
        """Close the command's stdin: it reads end of file."""
        handle = self._running()
        if handle.result is None:
            await self._owner.call(handle.write_stdin, b"", True)

    async def kill(self) -> None:
        """Kill the command's process tree; the iteration still ends, with its status."""
        handle = self._running()
        if handle.result is None:
            await self._owner.call(handle.cancel)

    async def resize(self, rows: int, cols: int) -> None:
        """Set the size of the command's terminal (started with ``pty=``)."""
        handle = self._running()
        await self._owner.call(handle.resize, rows, cols)

    async def __aenter__(self) -> AsyncExecutionStream:
        if not self._finished:
            await self._owner.wait(self._begin, self._handoff)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # The twin of a sync stream's generator being closed by the garbage
        # collector: a forgotten command must not run on until its timeout.
        handle = self._handle
        if handle is not None and handle.result is None and not self._handoff.abandoned:
            try:
                _kill(handle)
            except Exception:  # noqa: S110 - nothing can be reported from __del__
                pass


class AsyncSessionStream(_ThreadIterator[ExecutionChunk]):
    """Output of session code for ``async for``; the twin of :class:`SessionStream`.

    ``.result`` holds the :class:`SessionResult` afterwards.  Cancelling the
    iterating task, ``aclose()`` or leaving ``async with`` interrupts the
    code (``KeyboardInterrupt``); the session stays.

    .. versionadded:: 0.4.0
    """

    def __init__(self, stream: SessionStream, session: PythonSession, limiter: anyio.CapacityLimiter) -> None:
        super().__init__(lambda: stream, session.interrupt, limiter)
        self._stream = stream

    @property
    def result(self) -> SessionResult | None:
        """See :attr:`SessionStream.result`."""
        return self._stream.result


class AsyncPythonSession:
    """A persistent Python interpreter, awaited; the twin of :class:`PythonSession`.

    Use ``await sandbox.python_session()`` on an :class:`AsyncSandbox`::

        async with await sandbox.python_session() as session:
            await session.run("x = 41")
            print((await session.run("x + 1")).check().result)   # "42"

    Each method is documented on :class:`PythonSession`.  Cancelling an
    awaited :meth:`run` interrupts the code (``KeyboardInterrupt``): the
    session and what it defined before stay.

    .. versionadded:: 0.4.0
    """

    def __init__(self, session: PythonSession, limiter: anyio.CapacityLimiter) -> None:
        self._session = session
        self._limiter = limiter

    @property
    def id(self) -> str:
        """See :attr:`PythonSession.id`."""
        return self._session.id

    @property
    def name(self) -> str | None:
        """See :attr:`PythonSession.name`."""
        return self._session.name

    @property
    def closed(self) -> bool:
        """See :attr:`PythonSession.closed`."""
        return self._session.closed

    @property
    def pid(self) -> int | None:
        """See :attr:`PythonSession.pid`."""
        return self._session.pid

    async def start(self) -> None:
        """See :meth:`PythonSession.start`."""
        await anyio.to_thread.run_sync(self._session.start)

    async def run(self, code: str, *, timeout: float | None = 30.0) -> SessionResult:
        """See :meth:`PythonSession.run`."""
        stream = self.stream(code, timeout=timeout)
        async for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream(self, code: str, *, timeout: float | None = None) -> AsyncSessionStream:
        """See :meth:`PythonSession.stream`; iterate the result with ``async for``."""
        return AsyncSessionStream(self._session.stream(code, timeout=timeout), self._session, self._limiter)

    async def interrupt(self) -> None:
        """See :meth:`PythonSession.interrupt`."""
        await anyio.to_thread.run_sync(self._session.interrupt)

    async def reset(self) -> None:
        """See :meth:`PythonSession.reset`."""
        await anyio.to_thread.run_sync(self._session.reset)

    async def close(self) -> None:
        """See :meth:`PythonSession.close`.  Runs to the end even if the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._session.close)

    async def __aenter__(self) -> AsyncPythonSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return "<Async" + repr(self._session)[1:]
