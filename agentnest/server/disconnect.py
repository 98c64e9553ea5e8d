"""Nothing outlives its client: an HTTP request whose client goes away is cancelled.

uvicorn runs a request's handler to its end even when the client has gone:
a ``POST .../exec`` of a 20 s command kept running (and holding its sandbox's
lease) for 20 s after its client was killed.  :class:`CancelOnDisconnect`
reads the connection for the client's disconnect while the handler runs and,
if the client goes before its whole answer is sent, cancels the handler.
Cancellation is what the rest of the server already handles: an awaited
command's process tree is killed, a session's code is interrupted, a queued
create leaves its queue, an upload stops, and every ``Lease.held()`` of the
request ends with it, so an idle or session lease counts from the disconnect.

How: one reader task owns the server's ``receive``.  It hands the request
body to the application one message at a time (at most one message ahead,
so an upload is never buffered whole), then waits for the one message that
can follow a body, ``http.disconnect``.  The application's own ``receive``
after the body waits for that too (Starlette's streaming responses and
``Request.is_disconnected`` read it there).  A disconnect after the answer is
complete is the server's way of saying "done": it cancels nothing.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream


def _disconnect() -> dict[str, Any]:
    return {"type": "http.disconnect"}


class _Connection:
    """One HTTP request's view of its client: the body as it comes, and whether it went."""

    def __init__(self, receive: Any, handler: anyio.CancelScope) -> None:
        self._receive = receive
        self._handler = handler
        self.gone = anyio.Event()
        self.answered = False
        self.reader: asyncio.Future[None] | None = None
        send: MemoryObjectSendStream[dict[str, Any]]
        body: MemoryObjectReceiveStream[dict[str, Any]]
        send, body = anyio.create_memory_object_stream[dict[str, Any]](1)
        self._send, self._body = send, body

    def start(self) -> None:
        if self.reader is None:
            self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        """The reader task: the body to the application, then the disconnect (if it comes)."""
        async with self._send:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    self._went()
                    return
                await self._send.send(message)
                if message["type"] != "http.request" or not message.get("more_body", False):
                    break
        # After the body the server sends nothing but the disconnect (uvicorn: also
        # once the answer is complete, which _went tells apart).
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._went()

    def _went(self) -> None:
        self.gone.set()
        if not self.answered:
            self._handler.cancel()

    async def receive(self) -> dict[str, Any]:
        """The application's ``receive``: the body, then (blocking) the disconnect."""
        self.start()
        if self.gone.is_set():
            return _disconnect()
        try:
            return await self._body.receive()
        except anyio.EndOfStream:
            await self.gone.wait()
            return _disconnect()

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            # Its own failure (the server's receive raising) ends only the watch.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self.reader
        self._send.close()
        self._body.close()


class CancelOnDisconnect:
    """ASGI middleware: cancel an HTTP request's handler when its client disconnects before its
    answer is complete.  Websockets pass untouched (their handlers see the close themselves)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with anyio.CancelScope() as handler:
            connection = _Connection(receive, handler)

            async def sending(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    connection.answered = True
                await send(message)

            # Watch from the start, unless the client waits for "100 Continue" before sending
            # its body: reading would send that at once, before the app may refuse the body
            # by its Content-Length.  Then the watch starts when the app first reads.
            if not any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope["headers"]):
                connection.start()
            try:
                await self.app(scope, connection.receive, sending)
            finally:
                with anyio.CancelScope(shield=True):
                    await connection.close()


__all__ = ["CancelOnDisconnect"]
