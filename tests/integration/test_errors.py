"""What goes wrong says what went wrong and how to fix it, and leaves nothing behind.

No test here makes the engine reach a remote registry: missing images are
either in AgentNest's own repository (never pulled) or on 127.0.0.1:1.
"""

from __future__ import annotations

import gc
import io
import os
import tarfile
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from agentnest import (
    AgentNestError,
    BackendError,
    ChannelError,
    ConfigurationError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    Sandbox,
)
from agentnest.runtime.docker import DockerBackend, DockerSpec

from .helpers import owned_containers


@pytest.fixture
def no_new_containers(docker_client: Any) -> Iterator[None]:
    """Whatever the test does, this process has no more containers afterwards."""
    before = owned_containers(docker_client)
    yield
    assert owned_containers(docker_client) == before


@pytest.mark.usefixtures("no_new_containers")
def test_missing_default_image_names_the_build_command(backend_name: str) -> None:
    with pytest.raises(ImageNotFoundError) as info:
        Sandbox("agentnest/base:no-such-tag", backend=backend_name, timeout=30)
    assert "agentnest image base" in str(info.value)


@pytest.mark.usefixtures("no_new_containers")
def test_unpullable_image_names_the_pull_command(backend_name: str) -> None:
    # The pull goes to 127.0.0.1:1, where nothing listens: it fails locally.
    with pytest.raises(ImageNotFoundError) as info:
        Sandbox("127.0.0.1:1/agentnest-test/missing:1", backend=backend_name, timeout=30)
    assert "127.0.0.1:1/agentnest-test/missing:1" in str(info.value)
    assert "docker pull" in str(info.value)


def test_unknown_backend_lists_the_available_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        Sandbox(backend="no-such-backend", timeout=30)
    message = str(info.value)
    assert "no-such-backend" in message
    for name in ("docker", "gvisor", "kata"):
        assert name in message


@pytest.mark.docker
@pytest.mark.usefixtures("no_new_containers")
def test_unregistered_oci_runtime_points_at_daemon_json() -> None:
    backend = DockerBackend(DockerSpec(oci_runtime="no-such-runtime"))
    try:
        with pytest.raises(RuntimeNotAvailableError) as info:
            Sandbox(backend=backend, timeout=30)
    finally:
        backend.close()
    assert "no-such-runtime" in str(info.value)
    assert "daemon.json" in str(info.value)


def test_unreachable_engine() -> None:
    backend = DockerBackend(DockerSpec(docker_host="unix:///nonexistent-agentnest.sock"))
    message = ""
    with warnings.catch_warnings():
        # docker-py leaves the socket of its failed connection open: collect it
        # here rather than have its ResourceWarning fail some later test.
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            Sandbox(backend=backend, timeout=30)
        except RuntimeNotAvailableError as exc:
            message = str(exc)
        finally:
            backend.close()
        gc.collect()
    assert "not reachable" in message
    assert "DOCKER_HOST" in message


@pytest.fixture(scope="module")
def image_without_python(docker_client: Any) -> Iterator[str]:
    """A one-file image: no python3, no shell, nothing to run the agent with."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"this image has no python3\n"
        info = tarfile.TarInfo("README")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    repository, tag = "agentnest-test/no-python", f"{os.getpid()}-{os.urandom(3).hex()}"
    docker_client.api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag)
    try:
        yield f"{repository}:{tag}"
    finally:
        docker_client.images.remove(f"{repository}:{tag}", force=True)


@pytest.mark.usefixtures("no_new_containers")
def test_image_without_python3_fails_cleanly(backend_name: str, image_without_python: str) -> None:
    with pytest.raises((BackendError, ChannelError)) as info:
        Sandbox(image_without_python, backend=backend_name, timeout=30)
    assert "python3" in str(info.value)


def test_image_without_python3_names_the_image(backend_name: str, image_without_python: str) -> None:
    with pytest.raises(AgentNestError) as info:
        Sandbox(image_without_python, backend=backend_name, timeout=30)
    assert image_without_python in str(info.value)


@pytest.mark.parametrize(
    "limits",
    [
        {"memory": "1k"},
        {"memory": "abc"},
        {"cpus": 1000},
        {"cpus": 0},
        {"pids": 1},
        {"pids": 10**9},
        {"memory": "128m", "workspace_size": "1g", "workspace": "memory"},  # a tmpfs counts in memory
        {"disk": "70000g"},  # beyond any disk workspace
        {"disk": "5000g"},  # beyond this host's storage pool (it says how to grow it)
        {"disk": "1g", "workspace": "memory"},
    ],
    ids=lambda limits: ",".join(f"{k}={v}" for k, v in limits.items()),
)
@pytest.mark.usefixtures("no_new_containers")
def test_absurd_limits_are_refused_before_any_container(backend_name: str, limits: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        Sandbox(backend=backend_name, timeout=30, **limits)
