"""``CancelOnDisconnect``: a request whose client goes away before its answer is complete is cancelled.

Pure ASGI, no server and no engine: a scripted ``receive`` plays the client (its body, then
its disconnect at a chosen moment) and a small application records what it saw.  The
engine-backed cases (a SIGKILLed client mid-exec, mid-stream, mid-upload...) are in
tests/integration/test_disconnect_engine.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agentnest.server.disconnect import CancelOnDisconnect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Client:
    """The server's side of one connection: the body's messages, then a disconnect once ``leave`` is set."""

    def __init__(self, *chunks: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.chunks = list(chunks) or [b""]
        self.leave = anyio.Event()
        self.asked = 0
        self.sent: list[dict[str, Any]] = []
        self.scope = {"type": "http", "method": "POST", "path": "/", "headers": headers or []}

    async def receive(self) -> dict[str, Any]:
        self.asked += 1
        if self.chunks:
            body = self.chunks.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def answer(send: Any, body: bytes = b"ok") -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def test_a_client_gone_while_its_request_runs_cancels_the_handler() -> None:
    client = Client(b'{"argv": ["sleep", "20"]}')
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["body"] = (await receive())["body"]
        try:
            client.leave.set()  # the client dies while the "command" runs
            await anyio.sleep(20)
            seen["ended"] = "ran to its end"
        except anyio.get_cancelled_exc_class():
            seen["ended"] = "cancelled"
            raise
        await answer(send)

    with anyio.fail_after(5):
        await CancelOnDisconnect(app)(client.scope, client.receive, client.send)
    assert seen == {"body": b'{"argv": ["sleep", "20"]}', "ended": "cancelled"}
    assert client.sent == []


async def test_a_client_gone_mid_upload_cancels_the_handler_at_its_read() -> None:
    client = Client(b"part one", b"part two", b"never read")
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((await receive())["body"])
        client.chunks.clear()  # the rest of the upload never comes: the client is killed
        client.leave.set()
        while True:
            message = await receive()
            seen.append(message.get("body", message["type"].encode()))

    with anyio.fail_after(5):
        await CancelOnDisconnect(app)(client.scope, client.receive, client.send)
    # The one message read ahead reaches the app; the disconnect never does: it is cancelled.
    assert seen == [b"part one", b"part two"]


async def test_the_body_is_read_at_most_one_message_ahead_of_the_application() -> None:
    client = Client(*[bytes([n]) * 4 for n in range(6)])
    got: list[bytes] = []
    ahead: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            await anyio.sleep(0.01)  # the reader runs meanwhile
            ahead.append(client.asked - len(got))
            message = await receive()
            got.append(message["body"])
            if not message["more_body"]:
                break
        await answer(send)

    await CancelOnDisconnect(app)(client.scope, client.receive, client.send)
    assert got == [bytes([n]) * 4 for n in range(6)]
    assert max(ahead) <= 2  # one handed over (buffered), one being handed: never the whole body


async def test_the_disconnect_that_follows_a_complete_answer_cancels_nothing() -> None:
    client = Client(b"{}")
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await answer(send)
        client.leave.set()  # uvicorn says "disconnect" once the answer is complete
        await anyio.sleep(0.05)
        seen.append("the work after the answer finished")

    await CancelOnDisconnect(app)(client.scope, client.receive, client.send)
    assert seen == ["the work after the answer finished"]
    assert [m["type"] for m in client.sent] == ["http.response.start", "http.response.body"]


async def test_a_streaming_answer_sees_the_disconnect_through_its_own_receive() -> None:
    client = Client()
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"event 1", "more_body": True})
        client.leave.set()
        with anyio.CancelScope(shield=True):  # what Starlette's listen_for_disconnect reads
            seen.append((await receive())["type"])

    with anyio.fail_after(5):
        await CancelOnDisconnect(app)(client.scope, client.receive, client.send)
    assert seen == ["http.disconnect"]


async def test_a_client_that_expects_100_continue_is_not_read_before_the_application_reads() -> None:
    client = Client(b"big", headers=[(b"expect", b"100-continue")])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await anyio.sleep(0.05)
        assert client.asked == 0, "reading would send '100 Continue' before the app decided"
        await answer(send, b"refused")

    await CancelOnDisconnect(app)(client.scope, client.receive, client.send)
    assert client.asked == 0 and client.sent[-1]["body"] == b"refused"


async def test_a_websocket_passes_untouched() -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(receive)

    async def receive() -> dict[str, Any]:
        raise AssertionError("not read by the middleware")

    async def send(message: dict[str, Any]) -> None:
        pass

    await CancelOnDisconnect(app)({"type": "websocket"}, receive, send)
    assert seen == [receive]
