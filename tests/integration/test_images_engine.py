"""Image aliases and the default image's ``python`` command, on the real engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentnest import PolicyDeniedError, Sandbox, SecurityPolicy
from agentnest.errors import ConfigurationError
from agentnest.runtime.docker import DockerBackend, DockerSpec, base_image
from agentnest.runtime.docker.images import ALIASES_ENV

from .helpers import container_of, owned_containers

pytestmark = pytest.mark.docker

#: A name this engine does not have and cannot pull (no registry is asked: the alias wins).
REQUESTED = "python:3.12-slim"


@pytest.fixture
def aliased() -> Iterator[DockerBackend]:
    backend = DockerBackend(DockerSpec(image_aliases={REQUESTED: base_image()}, pull=False))
    try:
        yield backend
    finally:
        backend.close()


def test_an_aliased_image_runs_the_local_one_and_records_both(
    aliased: DockerBackend, docker_client: Any
) -> None:
    with Sandbox(REQUESTED, timeout=60, backend=aliased) as sb:
        assert sb.config.image == REQUESTED  # what the program asked for, and what a snapshot records
        assert sb.handle.info["requested_image"] == REQUESTED
        assert sb.handle.info["image"] == base_image()
        assert container_of(docker_client, sb).attrs["Config"]["Image"] == base_image()
        assert sb.exec_shell("echo ok").stdout == "ok\n"


def test_the_policy_judges_the_requested_name(aliased: DockerBackend, docker_client: Any) -> None:
    before = owned_containers(docker_client)
    with pytest.raises(PolicyDeniedError, match=r"python:3\.12-slim"):
        Sandbox(REQUESTED, backend=aliased, security_policy=SecurityPolicy(allowed_images=("agentnest/*",)))
    assert owned_containers(docker_client) == before
    policy = SecurityPolicy(allowed_images=(REQUESTED,))
    with Sandbox(REQUESTED, timeout=60, backend=aliased, security_policy=policy) as sb:
        assert sb.handle.info["image"] == base_image()


def test_the_environment_variable_aliases_for_the_shared_backend(
    monkeypatch: pytest.MonkeyPatch, docker_client: Any
) -> None:
    monkeypatch.setenv(ALIASES_ENV, f"{REQUESTED}={base_image()}")
    with Sandbox(REQUESTED, timeout=60) as sb:
        assert container_of(docker_client, sb).attrs["Config"]["Image"] == base_image()
    before = owned_containers(docker_client)
    monkeypatch.setenv(ALIASES_ENV, f"{REQUESTED}={base_image()},")
    with pytest.raises(ConfigurationError, match=f"{ALIASES_ENV}: entry 2 is empty"):
        Sandbox(REQUESTED, timeout=60)
    assert owned_containers(docker_client) == before


def test_the_default_image_has_a_python_command(backend_name: str) -> None:
    # 0.3.0's examples run `python main.py` (the official python images have it).
    with Sandbox(backend=backend_name, timeout=60) as sb:
        sb.write_file("main.py", "import sys; print(sys.version_info[0])")
        assert sb.exec_shell("python main.py").stdout == "3\n"
