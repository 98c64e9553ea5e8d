"""``ExecutionStream``: a started command's output for the sync face, chunk by chunk.

This module decides how :class:`~agentnest.Sandbox` hands out a running
command (``stream_exec``, ``stream_shell``, ``stream_python``): its events are
read from the agent channel in the caller's thread, decoded through the
guard (which redacts secrets, also across chunk boundaries), and leaving the
iteration early, ``close()`` or the garbage collector closing the generator
kills the command's whole process tree.  The async twin is
:class:`~agentnest.AsyncExecutionStream` (:mod:`agentnest.aio_streams`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ._core import SandboxCore
from .channel.client import ExecHandle
from .config import ExecutionChunk, ExecutionResult
from .errors import ChannelError, ConfigurationError
from .guard import scrub_errors

__all__ = ["ExecutionStream"]


@scrub_errors
class ExecutionStream:
    """Output of a running command, chunk by chunk.  Iterate it once."""

    def __init__(self, sandbox: SandboxCore, handle: ExecHandle, timeout: float | None) -> None:
        self._sandbox = sandbox
        self._guard = sandbox.guard  # for scrub_errors
        self._handle = handle
        self._timeout = timeout
        self._decoder = sandbox.guard.stream_decoder()
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self.result: ExecutionResult | None = None

    def __iter__(self) -> Iterator[ExecutionChunk]:
        sandbox = self._sandbox
        deadline = sandbox.wait_deadline(self._timeout)
        try:
            while self._handle.result is None:
                try:
                    event = self._handle.next_event(deadline)
                except ChannelError as exc:
                    raise sandbox.lost(exc) from None
                if isinstance(event, tuple):
                    fd, data = event
                    (self._out if fd == 1 else self._err).append(data)
                    chunk = self._decoder.feed(fd, data)
                    if chunk is not None:
                        yield chunk
        except GeneratorExit:
            self.close()
            raise
        except BaseException:
            self.close()
            raise
        yield from self._decoder.flush()
        self.result = sandbox.result(self._handle, b"".join(self._out), b"".join(self._err), self._timeout)
        yield ExecutionChunk("status", exit_code=self.result.exit_code)

    def close(self) -> None:
        """Kill the command's process tree if it still runs."""
        if self._handle.result is None:
            self._handle.cancel()
            self._handle.abandon()

    def send_input(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin (started with ``interactive=True`` or a ``pty``).

        Input to a command that has ended is dropped, as a pipe would.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise ConfigurationError("input must be bytes")
        if self._handle.result is None:
            try:
                self._handle.write_stdin(bytes(data))
            except ChannelError as exc:
                raise self._sandbox.lost(exc) from None

    def close_input(self) -> None:
        """Close the command's stdin: it reads end of file."""
        if self._handle.result is None:
            try:
                self._handle.write_stdin(b"", True)
            except ChannelError as exc:
                raise self._sandbox.lost(exc) from None

    def kill(self) -> None:
        """Kill the command's process tree; the iteration still ends, with its status."""
        self._handle.cancel()

    def resize(self, rows: int, cols: int) -> None:
        """Set the size of the command's terminal (started with ``pty=``)."""
        try:
            self._handle.resize(rows, cols)
        except ChannelError as exc:
            raise self._sandbox.lost(exc) from None

    def __enter__(self) -> ExecutionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
