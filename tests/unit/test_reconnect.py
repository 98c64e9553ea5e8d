"""The reconnect handshake: a new host channel to an agent that already runs (after a checkpoint restore).

The host sends a ``reconnect`` frame instead of the bundle, the agent answers
with a fresh hello and keeps everything it had (sessions, commands), and the
frames it still sends for the old channel's requests are dropped by the new
one (its request ids continue above the old ones).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from doubles.local_agent import LocalAgent

from agentnest.agent import wire
from agentnest.channel.client import Channel, ExecHandle
from agentnest.channel.protocol import RawExit, RawSessionRun, RawValue
from agentnest.channel.streams import ByteStream, SocketStream
from agentnest.runtime import launch
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)
WAIT = 20.0


class Switch:
    """One real agent behind a switchable host connection; the agent never sees a host leave."""

    def __init__(self, workspace: str) -> None:
        self.agent = LocalAgent(workspace)
        self._host: socket.socket | None = None
        self._lock = threading.Lock()
        self.frames_to_host: list[dict[str, object]] = []
        threading.Thread(target=self._from_agent, daemon=True).start()

    def connect(self) -> ByteStream:
        ours, theirs = socket.socketpair()
        with self._lock:
            self._host = ours
        threading.Thread(target=self._to_agent, args=(ours,), daemon=True).start()
        return SocketStream(theirs)

    def drop(self) -> None:
        with self._lock:
            host, self._host = self._host, None
        if host is not None:
            host.shutdown(socket.SHUT_RDWR)
            host.close()

    def close(self) -> None:
        self.drop()
        self.agent.kill()

    def _to_agent(self, sock: socket.socket) -> None:
        try:
            while data := sock.recv(1 << 20):
                self.agent.stream.write(data)
        except OSError:
            pass

    def _from_agent(self) -> None:
        decoder = wire.Decoder(max_body_bytes=64 * 1024 * 1024)
        try:
            while data := self.agent.stream.read(1 << 20):
                decoder.feed(data)
                for header, body in decoder.frames():
                    with self._lock:
                        if self._host is None:
                            continue  # between hosts: lost, as on a cut channel
                        self.frames_to_host.append(header)
                        try:
                            self._host.sendall(wire.encode(header, body))
                        except OSError:
                            pass
        except OSError:
            pass


def start(ch: Channel, argv: list[str]) -> ExecHandle:
    return ch.start_exec(argv, env={}, cwd=None, timeout=10, max_output=1 << 20)


def finish(handle: ExecHandle) -> bytes:
    out = b""
    for event in handle.events(time.monotonic() + WAIT):
        if isinstance(event, RawExit):
            return out
        out += event[1]
    raise AssertionError("no exit")


def run(ch: Channel, session: int, code: str) -> str | None:
    handle = ch.start_session_run(session, code.encode(), timeout=10, max_output=1 << 20)
    result: str | None = None
    deadline = time.monotonic() + WAIT
    while True:
        event = handle.next_event(deadline)
        if isinstance(event, RawValue) and event.name == "result":
            result = event.text
        if isinstance(event, RawSessionRun):
            return result


def test_reconnect_gets_a_fresh_hello_and_keeps_the_agent_state(tmp_path: object) -> None:
    switch = Switch(str(tmp_path))
    try:
        deadline = time.monotonic() + WAIT
        first = Channel.connect(switch.connect(), launch.bundle())
        assert first.hello is not None and "reconnect" in first.hello.capabilities
        opened = first.open_session(deadline, name="main", key="0123456789ab")
        assert run(first, opened.session, "x = 41") is None
        # A command of the old side that is still talking when the host changes.
        late = start(first, ["sh", "-c", "sleep 0.5; echo late"])
        old_ids = {late.id}
        switch.drop()
        wait_until(lambda: not first.alive, "the first channel to break")

        second = Channel.connect(switch.connect(), None, after=first)
        assert second.hello is not None and second.hello.pid == first.hello.pid  # the same agent
        listed = {i.name: i for i in second.list_sessions(deadline)}
        assert listed["main"].session == opened.session
        again = second.open_session(deadline, name="main", key="ffffffffffff")
        assert again.attached and run(second, again.session, "x + 1") == "42"
        # The old command's frames reach the new side and match nothing there.
        wait_until(
            lambda: any(h.get("id") in old_ids and h.get("t") == "exit" for h in switch.frames_to_host),
            "the old command's exit frame",
        )
        assert second.alive
        assert finish(start(second, ["echo", "new"])) == b"new\n"
        second.close()
    finally:
        switch.close()


def test_new_request_ids_continue_above_the_old_ones(tmp_path: object) -> None:
    switch = Switch(str(tmp_path))
    try:
        first = Channel.connect(switch.connect(), launch.bundle())
        used = [start(first, ["true"]).id for _ in range(3)]
        switch.drop()
        wait_until(lambda: not first.alive, "the first channel to break")
        second = Channel.connect(switch.connect(), None, after=first)
        assert start(second, ["true"]).id > max(used)
        second.close()
    finally:
        switch.close()
