"""agentnest.presets against the real engine: its errors where this host lacks what they need.

This machine has neither Playwright's image (and no registry to pull it from)
nor a GPU: both presets must fail fast with AgentNest's own errors, saying
what is missing, and leave no container behind.  On a host that has either,
the test for it is skipped (it would create a real browser or GPU sandbox).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentnest import BackendError, ConfigurationError, ImageNotFoundError
from agentnest.presets import BROWSER_IMAGE, browser_sandbox, gpu_sandbox

from .helpers import owned_containers

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]


def test_browser_sandbox_without_its_image_says_it_cannot_be_pulled_here(docker_client: Any) -> None:
    import docker.errors

    try:
        docker_client.images.get(BROWSER_IMAGE)
    except docker.errors.ImageNotFound:
        pass
    else:
        pytest.skip(f"{BROWSER_IMAGE} is on this engine: browser_sandbox() would start a browser sandbox")
    before = owned_containers(docker_client)
    with pytest.raises(ImageNotFoundError) as info:
        browser_sandbox()
    message = str(info.value)
    assert BROWSER_IMAGE in message and "cannot be pulled here" in message
    assert "built-in browser image" in message and "planned" in message
    assert info.value.__cause__ is None and "docker.errors" not in repr(info.value)
    assert owned_containers(docker_client) == before


def test_gpu_sandbox_on_a_host_without_gpus_fails_fast_and_clearly(docker_client: Any) -> None:
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime: gpu_sandbox() would start a GPU sandbox")
    with pytest.raises(ConfigurationError):
        gpu_sandbox(None, gpus=0)
    before = owned_containers(docker_client)
    start = time.monotonic()
    with pytest.raises(BackendError) as info:
        gpu_sandbox(None, gpus=1, timeout=60)
    # The engine refuses at once; the bound only catches a hang.
    assert time.monotonic() - start < 60
    assert "cannot pass GPUs through" in str(info.value) and "NVIDIA Container Toolkit" in str(info.value)
    assert owned_containers(docker_client) == before  # the container that failed to start was removed
