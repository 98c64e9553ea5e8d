"""Allowlist matching through the server: the remote backend sends ``subdomains``, the server
builds the same policy, and a token's domain ceiling covers the names below a listed name.
Local agents behind the server (no engine)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from server_fakes import IMAGE, LocalBackend, add_token, make_settings

from agentnest import NetworkPolicy, PolicyDeniedError, Sandbox, SecurityPolicy
from agentnest.config import SandboxConfig
from agentnest.runtime.base import Capability, SandboxHandle
from agentnest.runtime.remote import RemoteBackend
from agentnest.server.app import ServerSettings
from agentnest.server.auth import Ceiling
from agentnest.server.thread import serve_in_thread

pytestmark = pytest.mark.timeout(60)


class RecordingBackend(LocalBackend):
    """Claims the allowlist capability (it enforces nothing) and keeps every config it gets."""

    def __init__(self, root: object) -> None:
        super().__init__(root)  # type: ignore[arg-type]
        self.caps = self.caps | {Capability.EGRESS_DOMAINS}
        self.configs: list[SandboxConfig] = []

    def create(self, config: SandboxConfig) -> SandboxHandle:
        self.configs.append(config)
        return super().create(config)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, ServerSettings, RecordingBackend]]:
    from agentnest.server.app import create_app

    root = tmp_path_factory.mktemp("allowlist")
    backend = RecordingBackend(root / "sandboxes")
    backend.root.mkdir()
    settings = make_settings(root, backend)
    try:
        with serve_in_thread(create_app(settings)) as url:
            yield url, settings, backend
    finally:
        backend.kill_all()


def create_remote(
    server: tuple[str, ServerSettings, RecordingBackend], domains: tuple[str, ...], network: NetworkPolicy
) -> NetworkPolicy:
    """The policy the server builds for ``network`` under a token whose domain ceiling is ``domains``."""
    url, settings, backend = server
    token = add_token(settings, f"t-{uuid.uuid4().hex[:6]}", network=("denied", "allowlist"), domains=domains)
    remote = RemoteBackend(url, token)
    try:
        before = len(backend.configs)
        with Sandbox(IMAGE, timeout=60, backend=remote, security_policy=SecurityPolicy(network=network)):
            pass
        assert len(backend.configs) == before + 1
        return backend.configs[-1].network
    finally:
        remote.close()


def test_strict_matching_travels_to_the_server(server: tuple[str, ServerSettings, RecordingBackend]) -> None:
    asked = NetworkPolicy.allowlist(["pypi.test"], subdomains=False)
    assert create_remote(server, ("pypi.test",), asked) == asked


def test_a_ceiling_must_cover_the_names_below_a_listed_name(
    server: tuple[str, ServerSettings, RecordingBackend],
) -> None:
    _, _, backend = server
    before = len(backend.configs)
    with pytest.raises(PolicyDeniedError, match="names below it"):
        create_remote(server, ("pypi.test",), NetworkPolicy.allowlist(["pypi.test"]))
    assert len(backend.configs) == before  # refused before anything was created
    asked = NetworkPolicy.allowlist(["pypi.test"])
    built = create_remote(server, ("pypi.test", "*.pypi.test"), asked)
    assert built == asked and built.subdomains is True


def test_an_address_or_one_label_name_asks_for_nothing_below_it(
    server: tuple[str, ServerSettings, RecordingBackend],
) -> None:
    asked = NetworkPolicy.allowlist(["10.20.30.40", "mirror"])
    assert create_remote(server, ("10.20.*", "mirror"), asked) == asked


def test_ceiling_accepts_0_3_0_mode_names() -> None:
    assert Ceiling(network=("deny", "allowlist", "allow")).network == ("denied", "allowlist", "open")
