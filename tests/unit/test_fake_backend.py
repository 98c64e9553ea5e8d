"""agentnest.testing.fake.FakeBackend: the shipped double of the backend contract (executes nothing)."""

from __future__ import annotations

import time

import pytest

from agentnest import Sandbox
from agentnest.agent.wire import Header
from agentnest.channel.client import Channel
from agentnest.config import SandboxConfig
from agentnest.errors import BackendError, ChannelError, UnsupportedCapabilityError
from agentnest.runtime import launch
from agentnest.runtime.base import Capability, SandboxHandle
from agentnest.testing.fake import DEFAULT_CAPABILITIES, FakeBackend, Replies, exec_reply


def echo(request: Header, body: bytes) -> Replies:
    if request["t"] == "exec":
        return exec_reply(stdout=" ".join(request["argv"][1:]).encode() + b"\n", stderr=b"warn\n", code=3)
    return None


def test_a_sandbox_runs_on_scripted_replies_and_the_backend_records_it() -> None:
    backend = FakeBackend(echo)
    with Sandbox("any", 60, backend=backend) as sb:
        result = sb.exec(["echo", "hi", "there"])
        assert (result.stdout, result.stderr, result.exit_code) == ("hi there\n", "warn\n", 3)
        assert backend.is_running(sb.handle)
    assert [config.image for config in backend.configs] == ["any"]
    assert backend.created == backend.destroyed == [sb.id]
    assert not backend.is_running(sb.handle) and backend.agents == {}
    (request, body), *_ = backend.requests
    assert request["t"] == "exec" and request["argv"] == ["echo", "hi", "there"] and body == b""
    assert backend.errors == []


def test_the_channel_skips_the_bundle_and_gets_the_default_answers() -> None:
    backend = FakeBackend(hello={"agent": "1.2.3", "caps": ["exec", "pty"]})
    handle = backend.create(SandboxConfig(image="x"))
    channel = Channel.connect(backend.open_channel(handle), launch.bundle(), timeout=10)
    try:
        assert channel.hello is not None and channel.hello.agent == "1.2.3"
        assert "pty" in channel.hello.capabilities
        assert channel.request({"t": "ping"}, None)["t"] == "pong"
        with pytest.raises(ChannelError, match="unknown"):
            channel.request({"t": "stat", "path": "/workspace"}, None)
    finally:
        channel.close()
    # A restored agent: a reconnect frame instead of the bundle, answered by a fresh hello.
    again = Channel.connect(backend.open_channel(handle), None, timeout=10, after=channel)
    try:
        assert again.request({"t": "ping"}, None)["t"] == "pong"
    finally:
        again.close()
    assert [h["t"] for h, _ in backend.requests] == ["ping", "stat", "reconnect", "ping"]
    backend.destroy(handle)
    backend.destroy(handle)  # idempotent
    assert backend.destroyed == [handle.id]


def test_what_the_handler_raises_is_recorded_and_answered_as_an_internal_error() -> None:
    def broken(request: Header, body: bytes) -> Replies:
        raise KeyError("a bug in the test")

    backend = FakeBackend(broken)
    with Sandbox("any", 60, backend=backend) as sb, pytest.raises(ChannelError, match="internal"):
        sb.exec(["true"])
    assert [type(exc) for exc in backend.errors] == [KeyError]


def test_refuse_records_the_config_then_fails_as_an_engine_would() -> None:
    backend = FakeBackend(refuse=BackendError("the engine is full"))
    with pytest.raises(BackendError, match="full"):
        Sandbox("img:1", 60, backend=backend)
    assert [config.image for config in backend.configs] == ["img:1"] and backend.created == []


def test_an_agent_that_cannot_start_fails_the_connect() -> None:
    backend = FakeBackend(starts=False)
    handle = SandboxHandle("s", "fake", 0.0)
    with pytest.raises(ChannelError, match="could not start"):
        Channel.connect(backend.open_channel(handle), launch.bundle(), timeout=10)


def test_capabilities_runtime_and_the_contract_defaults() -> None:
    assert FakeBackend().capabilities() == DEFAULT_CAPABILITIES and FakeBackend().oci_runtime is None
    backend = FakeBackend(caps=frozenset({Capability.GPU}), oci_runtime="runsc")
    assert backend.capabilities() == {Capability.GPU} and backend.oci_runtime == "runsc"
    with pytest.raises(UnsupportedCapabilityError, match="cannot pause"):
        backend.pause(SandboxHandle("s", "fake", 0.0))


def test_a_reply_may_be_a_header_a_frame_or_a_list() -> None:
    answers: dict[str, Replies] = {
        "ping": ({"t": "pong"}, b""),
        "mkdir": {"t": "done"},
        "remove": [{"t": "done", "id": 999}],  # an id of its own is kept: this reply matches nothing
    }
    backend = FakeBackend(lambda request, body: answers[request["t"]])
    handle = backend.create(SandboxConfig(image="x"))
    channel = Channel.connect(backend.open_channel(handle), launch.bundle(), timeout=10)
    try:
        assert channel.request({"t": "ping"}, None)["t"] == "pong"
        assert channel.request({"t": "mkdir", "path": "/workspace/d"}, None)["t"] == "done"
        with pytest.raises(ChannelError, match="in time"):
            channel.request({"t": "remove", "path": "/workspace/d"}, time.monotonic() + 0.5)
    finally:
        backend.destroy(handle)
