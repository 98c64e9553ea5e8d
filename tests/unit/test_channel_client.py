"""The channel's shell applies protocol's verdicts: a violation closes it, a refusal fails one request.

A scripted agent (``FakeBackend``) sends what a real one never would; the checks themselves are
proved in test_protocol.py, these prove ``client.py`` calls them and acts on the answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentnest.agent.wire import Header
from agentnest.channel.client import Channel, SessionBusy
from agentnest.config import SandboxConfig
from agentnest.errors import ChannelError, FileAccessError
from agentnest.testing.fake import FakeBackend, Replies


def agent(request: Header, body: bytes) -> Replies:
    t, path = request["t"], request.get("path")
    if t == "exec" and request["argv"] == ["bad-fd"]:
        return [({"t": "out", "fd": 7}, b"x"), {"t": "exit", "code": 0}]
    if t == "exec" and request["argv"] == ["loud"]:
        return [({"t": "out", "fd": 1}, b"0123456789"), {"t": "exit", "code": 0, "duration": 0.1}]
    if t == "read" and path == "flood":
        return [({"t": "data"}, b"x" * 8), ({"t": "data"}, b"x" * 8), {"t": "done", "size": 16}]
    if t == "read" and path == "liar":
        return [({"t": "data"}, b"abc"), {"t": "done", "size": 4}]
    if t == "read" and path == "missing":
        return {"t": "error", "code": "not_found", "message": "no such file"}
    if t == "read" and path == "slow":
        return []  # never answers
    if t == "session.open":
        return {"t": "out", "fd": 1}
    if t == "session.run":
        return {"t": "error", "code": "busy", "message": "runs other code"}
    return None


@pytest.fixture
def channel() -> Iterator[Channel]:
    backend = FakeBackend(agent)
    handle = backend.create(SandboxConfig(image="x"))
    ch = Channel.connect(backend.open_channel(handle), None, timeout=10)
    try:
        yield ch
    finally:
        ch.close()
        backend.destroy(handle)


def run(channel: Channel, argv: list[str], max_output: int = 100) -> tuple[bytes, bool]:
    handle = channel.start_exec(argv, env={}, cwd=None, timeout=5, max_output=max_output)
    got = b"".join(event[1] for event in handle.events(None) if isinstance(event, tuple))
    return got, handle.truncated


def test_output_past_max_output_is_cut_and_the_channel_lives(channel: Channel) -> None:
    assert run(channel, ["loud"], max_output=4) == (b"0123", True)
    assert run(channel, ["loud"]) == (b"0123456789", False)
    assert channel.alive


def test_a_frame_outside_the_protocol_closes_the_channel(channel: Channel) -> None:
    with pytest.raises(ChannelError, match="the agent broke the protocol: output frame with an invalid fd"):
        run(channel, ["bad-fd"])
    assert not channel.alive
    assert channel.broken_reason == "protocol violation: output frame with an invalid fd"


def test_a_read_past_its_bound_closes_the_channel(channel: Channel) -> None:
    with pytest.raises(ChannelError, match="more than 10 bytes"):
        channel.read_file("flood", 10, None)
    assert channel.broken_reason == "the agent sent more than allowed for the contents of 'flood'"


def test_refusals_and_mismatches_fail_one_request_only(channel: Channel) -> None:
    with pytest.raises(FileAccessError, match="no such file"):
        channel.read_file("missing", 10, None)
    with pytest.raises(ChannelError, match="does not match its data"):
        channel.read_file("liar", 10, None)
    assert channel.read_file("flood", 16, None) == b"x" * 16
    run_handle = channel.start_session_run(1, b"1", timeout=5, max_output=100)
    with pytest.raises(SessionBusy):
        run_handle.next_event(None)
    assert channel.alive


def test_a_wrong_reply_to_a_session_request_closes_the_channel(channel: Channel) -> None:
    with pytest.raises(ChannelError, match=r"answered 'session\.open' with a 'out' frame"):
        channel.open_session(None)
    assert channel.broken_reason == "protocol violation: 'out' frame in reply to 'session.open'"


def test_a_missed_deadline_closes_the_channel(channel: Channel) -> None:
    with pytest.raises(ChannelError, match="did not deliver the contents of 'slow' in time"):
        channel.read_file("slow", 10, time.monotonic() + 0.3)
    assert channel.broken_reason == "the agent stopped answering"
