"""FakeBackend: a backend whose sandboxes run nothing; a scripted agent answers the host.

The small double of AgentNest's own backend contract, as httpx's ``MockTransport`` is of its
transport: for tests of the code above a backend (the guard, the channel, ``Sandbox``, a
preset, a third-party integration) that need no engine and no real agent.  Each channel's far
end is a :class:`~agentnest.testing.peer.Peer` that says hello, then hands every frame the host
sends to the test's ``handler`` and sends back what it returns.  Nothing is executed.

Example::

    def agent(request: Header, body: bytes) -> Replies:
        if request["t"] == "exec":
            return exec_reply(stdout=b"hi\\n")
        return None  # the default answer: pong to a ping, "unknown" to anything else

    backend = FakeBackend(agent)
    with Sandbox("any", backend=backend) as sb:
        assert sb.exec(["echo", "hi"]).stdout == "hi\\n"
    assert [h["t"] for h, _ in backend.requests] == ["exec"]

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ..agent.wire import Frame, Header
from ..channel.streams import ByteStream
from ..config import SandboxConfig
from ..runtime.base import Capability, RuntimeBackend, SandboxHandle
from .peer import Peer

__all__ = ["DEFAULT_CAPABILITIES", "FakeBackend", "Handler", "Replies", "Reply", "exec_reply"]

#: One frame the fake agent sends: a header, or a header and its body.  Its ``id`` defaults to the request's.
Reply = Header | Frame
#: What a handler returns for one request: a reply, a list of them, or None for the default answer.
Replies = Reply | Sequence[Reply] | None
#: ``handler(header, body)``: the fake agent's answer to one frame from the host.
Handler = Callable[[Header, bytes], Replies]

#: What a :class:`FakeBackend` claims by default: what a default ``Sandbox`` asks for.  It enforces nothing.
DEFAULT_CAPABILITIES = frozenset(
    {Capability.NETWORK_DENIED, Capability.RESOURCE_LIMITS, Capability.READ_ONLY_ROOT}
)


def exec_reply(stdout: bytes = b"", stderr: bytes = b"", code: int = 0) -> list[Reply]:
    """The frames of a command that wrote ``stdout`` and ``stderr`` and exited with ``code``."""
    frames: list[Reply] = [({"t": "out", "fd": fd}, data) for fd, data in ((1, stdout), (2, stderr)) if data]
    frames.append({"t": "exit", "code": code, "duration": 0.0})
    return frames


def _default(header: Header) -> Header:
    if header["t"] == "ping":
        return {"t": "pong"}
    return {"t": "error", "code": "unknown", "message": f"unknown request type {header['t']!r:.40}"}


class FakeBackend(RuntimeBackend):
    """Sandboxes that are names only; each channel is a scripted agent that executes nothing.

    Args:
        handler: answers each frame the host sends (see :data:`Handler`); None answers
            every one by default (pong to a ping, an ``unknown`` error to the rest).
        caps: the capabilities it claims (and enforces none of).
        oci_runtime: the OCI runtime it reports, for ``SecurityPolicy.required_runtime``.
        refuse: raised by :meth:`create` (after recording the config), as an engine that fails.
        hello: fields that replace the fake agent's hello (``caps``, ``agent``, ...).
        starts: False: every agent ends before its hello, as one that cannot start.

    ``configs``, ``created``, ``destroyed``, ``requests`` (every frame the host sent, in
    order) and ``agents`` (each sandbox's agents' far ends) let a test see what happened;
    ``errors`` holds what the handler raised (each also answered with an ``internal`` error).
    """

    name = "fake"

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        caps: frozenset[Capability] = DEFAULT_CAPABILITIES,
        oci_runtime: str | None = None,
        refuse: BaseException | type[BaseException] | None = None,
        hello: Mapping[str, Any] | None = None,
        starts: bool = True,
    ) -> None:
        self.handler = handler
        self.caps = caps
        self.runtime = oci_runtime
        self.refuse = refuse
        self.hello = dict(hello or {})
        self.starts = starts
        self.configs: list[SandboxConfig] = []
        self.created: list[str] = []
        self.destroyed: list[str] = []
        self.requests: list[Frame] = []
        self.errors: list[Exception] = []
        self.agents: dict[str, list[Peer]] = {}
        self._lock = threading.Lock()

    def capabilities(self) -> frozenset[Capability]:
        return self.caps

    @property
    def oci_runtime(self) -> str | None:
        return self.runtime

    def create(self, config: SandboxConfig) -> SandboxHandle:
        with self._lock:
            self.configs.append(config)
        if self.refuse is not None:
            raise self.refuse
        sid = uuid.uuid4().hex[:12]
        with self._lock:
            self.created.append(sid)
        return SandboxHandle(sid, self.name, time.time() + config.lifetime)

    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        peer = Peer(wait=None)  # blocking: the agent waits for the host as long as it takes
        with self._lock:
            self.agents.setdefault(handle.id, []).append(peer)
        if not self.starts:
            peer.sock.close()
            return peer.stream
        peer.hello(**self.hello)
        threading.Thread(target=self._serve, args=(peer,), name="agentnest-fake-agent", daemon=True).start()
        return peer.stream

    def is_running(self, handle: SandboxHandle) -> bool:
        return handle.id not in self.destroyed

    def destroy(self, handle: SandboxHandle) -> None:
        with self._lock:
            peers = self.agents.pop(handle.id, [])
            if handle.id not in self.destroyed:
                self.destroyed.append(handle.id)
        for peer in peers:
            peer.close()

    def _serve(self, peer: Peer) -> None:
        """Answer the host's frames until it (or :meth:`destroy`) closes the channel."""
        head: bytes | None = b""  # the first bytes, until we know whether they are the bundle
        skip = 0  # bytes of the bundle ("<length>\n<sources>", not a frame) still to drop
        with contextlib.suppress(OSError, ValueError):
            # Never blocked in recv: a test that closes the agent's socket (the agent died) must
            # end it, and a socket closed under a blocked recv stays open until that returns.
            while peer.sock.fileno() >= 0:
                if not select.select([peer.sock], [], [], 0.1)[0]:
                    continue
                data = peer.sock.recv(1 << 20)
                if not data:
                    break
                if head is not None:
                    head += data
                    # A frame starts with its header's length (< 64 KiB): a zero byte, never a digit.
                    if head[:1].isdigit():
                        if b"\n" not in head:
                            continue
                        size, _, data = head.partition(b"\n")
                        skip = int(size)
                    else:
                        data = head
                    head = None
                dropped = min(skip, len(data))
                skip -= dropped
                peer.decoder.feed(data[dropped:])
                for header, body in peer.decoder.frames():
                    self._answer(peer, header, body)

    def _answer(self, peer: Peer, header: Header, body: bytes) -> None:
        with self._lock:
            self.requests.append((header, body))
        if header["t"] == "reconnect":  # a restored agent answers with a fresh hello
            peer.hello(**self.hello)
            return
        try:
            replies = self.handler(header, body) if self.handler is not None else None
        except Exception as exc:
            self.errors.append(exc)
            replies = {"t": "error", "code": "internal", "message": f"the test's handler raised {exc!r}"}
        for reply_header, reply_body in _frames(_default(header) if replies is None else replies):
            peer.send({"id": header.get("id"), **reply_header}, reply_body)


def _frames(replies: Replies) -> list[Frame]:
    """A handler's answer as frames: one reply, or a list of them."""
    if isinstance(replies, dict):
        return [(replies, b"")]
    if isinstance(replies, tuple) and isinstance(replies[-1], bytes):
        return [cast(Frame, replies)]
    return [(reply, b"") if isinstance(reply, dict) else reply for reply in cast(Sequence[Reply], replies)]
