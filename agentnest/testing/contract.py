"""The backend contract suite: every ``RuntimeBackend`` must pass it.

Third-party backends reuse it by subclassing and providing two fixtures::

    # tests/test_my_backend.py
    import pytest
    from agentnest.testing.contract import BackendContract

    class TestMyBackend(BackendContract):
        @pytest.fixture
        def backend(self):
            return MyBackend()

        @pytest.fixture
        def image(self):
            return "my-image-with-python3"

The suite drives the backend through the public ``Sandbox`` as well as
directly, so it checks what users rely on: creation, the agent channel,
restarts after the agent dies, idempotent destruction, and fail-closed
refusals of what the backend says it cannot do.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from ..channel.client import Channel
from ..config import SandboxConfig
from ..errors import (
    ChannelError,
    ConfigurationError,
    SandboxDestroyedError,
    UnsupportedCapabilityError,
)
from ..policy import NetworkPolicy, SecurityPolicy
from ..runtime import launch
from ..runtime.base import Capability, RuntimeBackend
from ..sandbox import Sandbox


class BackendContract:
    """Mix-in test class; subclasses provide ``backend`` and ``image`` fixtures."""

    @pytest.fixture
    def backend(self) -> RuntimeBackend:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def image(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def test_capabilities_are_data(self, backend: RuntimeBackend) -> None:
        caps = backend.capabilities()
        assert isinstance(caps, frozenset)
        assert all(isinstance(c, Capability) for c in caps)
        assert Capability.NETWORK_DENIED in caps, "every backend must be able to deny the network"

    def test_create_channel_destroy(self, backend: RuntimeBackend, image: str) -> None:
        handle = backend.create(SandboxConfig(image=image, lifetime=60))
        try:
            assert handle.deadline > time.time()
            stream = backend.open_channel(handle)
            # As Sandbox connects: an agent that runs already (a pod's listening
            # agent) takes a reconnect frame with the ids it names, not the bundle.
            ids = handle.info.pop("reconnect_ids", None)
            if isinstance(ids, int):
                channel = Channel.connect(stream, None, timeout=60, after=ids)
            else:
                channel = Channel.connect(stream, launch.bundle(), timeout=60)
            assert channel.hello is not None
            assert channel.hello.uid != 0, "the agent must not run as root"
            reply = channel.request({"t": "ping"}, time.monotonic() + 30)
            assert reply["t"] == "pong"
            channel.close()
        finally:
            backend.destroy(handle)
        backend.destroy(handle)  # idempotent
        assert not backend.is_running(handle)

    def test_exec_through_sandbox(self, backend: RuntimeBackend, image: str) -> None:
        with Sandbox(image, timeout=60, backend=backend) as sb:
            result = sb.exec_shell("echo contract; echo err >&2; exit 3")
            assert (result.stdout, result.stderr, result.exit_code) == ("contract\n", "err\n", 3)
            sb.write_file("c/d.txt", b"\x00\x01data")
            assert sb.read_file("c/d.txt", encoding=None) == b"\x00\x01data"

    def test_agent_restarts_after_it_dies(self, backend: RuntimeBackend, image: str) -> None:
        with Sandbox(image, timeout=60, backend=backend) as sb:
            sb.write_file("keep.txt", "kept")
            first_pid = sb.exec_shell("echo $PPID").stdout.strip()
            with pytest.raises(ChannelError):
                sb.exec_shell("kill -9 $PPID; sleep 5")
            assert sb.read_file("keep.txt") == "kept"
            assert sb.exec_shell("echo $PPID").stdout.strip() != first_pid

    def test_destroyed_sandbox_refuses_calls(self, backend: RuntimeBackend, image: str) -> None:
        sb = Sandbox(image, timeout=60, backend=backend)
        sb.destroy()
        sb.destroy()
        assert sb.destroyed
        with pytest.raises(SandboxDestroyedError):
            sb.exec_shell("true")

    def test_network_modes_are_enforced_or_refused(self, backend: RuntimeBackend, image: str) -> None:
        """A mode the backend declares works; one it does not declare refuses the sandbox."""
        caps = backend.capabilities()
        policy = SecurityPolicy(network=NetworkPolicy.allowlist(domains=("pkgs.example.com",)))
        if Capability.EGRESS_DOMAINS not in caps:
            with pytest.raises(UnsupportedCapabilityError):
                Sandbox(image, timeout=60, backend=backend, security_policy=policy)
            return
        with Sandbox(image, timeout=60, backend=backend, security_policy=policy) as sb:
            # The only way out is the proxy the backend set up; nothing has been asked of it yet.
            proxy = sb.exec_python("import os; print(os.environ.get('HTTPS_PROXY', ''))").stdout.strip()
            assert proxy.startswith("http://"), proxy
            assert sb.network_log() == []
        if Capability.NETWORK_OPEN not in caps:
            with pytest.raises(UnsupportedCapabilityError):
                Sandbox(image, timeout=60, backend=backend, network_enabled=True)

    def test_bad_limits_refused_before_create(self, backend: RuntimeBackend, image: str) -> None:
        calls: list[Any] = []
        original = backend.create

        def spy(config: SandboxConfig) -> Any:
            calls.append(config)
            return original(config)

        backend.create = spy  # type: ignore[method-assign]
        try:
            with pytest.raises(ConfigurationError):
                Sandbox(image, timeout=60, backend=backend, memory="1k")
        finally:
            del backend.create
        assert calls == []
