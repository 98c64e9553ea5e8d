"""A hand-played agent for tests of the host side of the channel.

``Peer`` is the far end of a socketpair: a test sends whatever frames it likes
(valid, malformed, hostile) and reads what the host sent, to check that the host
trusts nothing it receives.  It doubles AgentNest's own agent, so it ships with
:class:`~agentnest.testing.fake.FakeBackend`, whose scripted agent is one.
"""

from __future__ import annotations

import socket
from typing import Any

from ..agent.wire import PROTOCOL_VERSION, Decoder, encode
from ..channel.streams import SocketStream

#: Seconds a peer waits for the host before a test fails.
WAIT = 10.0


class Peer:
    """The far end of a socketpair, playing a (misbehaving) agent by hand."""

    def __init__(self, wait: float | None = WAIT) -> None:
        host, self.sock = socket.socketpair()
        self.sock.settimeout(wait)
        self.stream = SocketStream(host)
        self.decoder = Decoder(max_body_bytes=64 * 1024 * 1024)
        self.frames: list[tuple[dict[str, Any], bytes]] = []

    def send(self, header: dict[str, Any], body: bytes = b"") -> None:
        self.sock.sendall(encode(header, body))

    def hello(self, **changes: Any) -> None:
        """Send the agent's hello; ``changes`` replace its fields."""
        header = {
            "t": "hello",
            "v": PROTOCOL_VERSION,
            "agent": "9.9.9",
            "pid": 4242,
            "uid": 1000,
            "python": "3.11.0",
            "caps": ["exec", "files"],
        }
        header.update(changes)
        self.send(header)

    def receive(self) -> tuple[dict[str, Any], bytes]:
        """The next frame the host sent."""
        while not self.frames:
            data = self.sock.recv(1 << 20)
            assert data, "the host closed the channel"
            self.decoder.feed(data)
            self.frames.extend(self.decoder.frames())
        return self.frames.pop(0)

    def close(self) -> None:
        self.sock.close()
        self.stream.close()
