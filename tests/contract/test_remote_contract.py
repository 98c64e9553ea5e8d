"""The backend contract suite against the remote backend: real HTTP and websockets on loopback,
``agentnest serve`` (uvicorn in a thread) with the real Docker engine behind it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentnest.runtime.base import RuntimeBackend
from agentnest.runtime.docker import base_image
from agentnest.testing.contract import BackendContract


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    import docker

    from agentnest.server.app import ServerSettings, create_app
    from agentnest.server.auth import Ceiling, TokenStore
    from agentnest.server.thread import serve_in_thread

    root: Path = tmp_path_factory.mktemp("remote-contract")
    store = TokenStore(root / "tokens.json")
    # The contract asks for an allowlist sandbox only to see it refused where
    # unsupported; Docker supports it, so the ceiling grants what the suite needs.
    _, secret = store.create(
        "contract",
        Ceiling(
            backends=("docker", "gvisor"),
            max_sandboxes=8,
            max_timeout=600.0,
            network=("denied", "allowlist"),
            domains=("*.example.com",),
        ),
    )
    settings = ServerSettings(
        tokens=store, backends={"docker": "docker", "gvisor": "gvisor"}, image=base_image()
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url, secret
    # The server destroyed what it made: no sandbox container is left behind.
    assert CREATED, "the suite created no sandbox through the server"
    client = docker.from_env()
    try:
        for sid in CREATED:
            left = client.containers.list(
                all=True, ignore_removed=True, filters={"label": f"agentnest.sandbox={sid}"}
            )
            assert left == [], f"sandbox {sid} left {[c.name for c in left]}"
    finally:
        client.close()


CREATED: set[str] = set()


class _RemoteContract(BackendContract):
    server_backend = "docker"

    @pytest.fixture
    def backend(self, served: tuple[str, str]) -> Iterator[RuntimeBackend]:
        from agentnest.runtime.remote import RemoteBackend

        url, secret = served
        remote = RemoteBackend(url, secret, backend=self.server_backend)
        original = remote.create

        def create(config):  # type: ignore[no-untyped-def]
            handle = original(config)
            CREATED.add(handle.id)
            return handle

        remote.create = create  # type: ignore[method-assign]
        try:
            yield remote
        finally:
            remote.close()

    @pytest.fixture
    def image(self) -> str:
        return base_image()


@pytest.mark.docker
class TestRemoteRunc(_RemoteContract):
    server_backend = "docker"


@pytest.mark.gvisor
class TestRemoteRunsc(_RemoteContract):
    server_backend = "gvisor"
