"""agentnest.presets against the real engine: its errors where this host lacks what they need.

This machine has neither Playwright's image (and no registry to pull it from)
nor a GPU: both presets must fail fast with AgentNest's own errors, saying
what is missing, and leave no container behind (GPUs: no network either,
and refused before the engine is asked to create anything).  On a host that has either,
the test for it is skipped (it would create a real browser or GPU sandbox).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentnest import (
    ConfigurationError,
    GPUUnavailableError,
    ImageNotFoundError,
    NetworkPolicy,
    Sandbox,
    SecurityPolicy,
    UnsupportedCapabilityError,
)
from agentnest.cli import main
from agentnest.presets import BROWSER_IMAGE, browser_sandbox, gpu_sandbox
from agentnest.runtime.docker import DockerBackend
from agentnest.runtime.registry import get_backend

from .helpers import owned_containers, owner_label

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


def owned_networks(client: Any) -> set[str]:
    """Ids of every network this test process created (an allowlisted sandbox's own)."""
    return {n.id for n in client.networks.list(filters={"label": f"agentnest.owner={owner_label()}"})}


def gpu_capable(backend: str) -> bool:
    found = get_backend(backend)
    assert isinstance(found, DockerBackend)
    return found.gpu_support().available


@pytest.mark.parametrize(
    "backend",
    [pytest.param("docker", id="runc"), pytest.param("gvisor", marks=pytest.mark.gvisor, id="runsc")],
)
def test_gpus_on_a_host_without_them_are_refused_before_anything_is_created(
    docker_client: Any, backend: str
) -> None:
    if gpu_capable(backend):
        pytest.skip(f"this engine gives GPUs on {backend}: a GPU sandbox would be created")
    with pytest.raises(ConfigurationError):
        gpu_sandbox(None, gpus=0)
    before, networks = owned_containers(docker_client), owned_networks(docker_client)
    allowlist = SecurityPolicy(network=NetworkPolicy.allowlist(["example.com"]))
    attempts: list[Callable[[], object]] = [
        lambda: gpu_sandbox(None, gpus=1, timeout=60, backend=backend),
        lambda: Sandbox(None, 60, gpus=1, backend=backend),
        # An allowlisted sandbox's network and proxy would come first: refused before them too.
        lambda: Sandbox(None, 60, gpus=1, backend=backend, security_policy=allowlist),
        lambda: Sandbox(None, 60, gpus=64, backend=backend),
    ]
    for attempt in attempts:
        start = time.monotonic()
        with pytest.raises(GPUUnavailableError) as info:
            attempt()
        # Refused from facts, without asking the engine to create anything.
        assert time.monotonic() - start < 5
        message = str(info.value)
        assert "GPU(s) requested" in message and "no sandbox was created" in message
        if backend == "gvisor":
            assert "nvproxy" in message and "opt-in" in message and "--nvproxy=true" in message
        else:
            assert "no NVIDIA GPU is visible" in message and "nvidia-ctk runtime configure" in message
        assert isinstance(info.value, UnsupportedCapabilityError) and info.value.available == 0
    assert owned_containers(docker_client) == before
    assert owned_networks(docker_client) == networks


def test_doctor_json_reports_the_gpu_check_with_its_fix(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--json", "--backend", "docker"])
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"] if c["scope"] == "Docker engine"}
    gpu, nvproxy = checks["gpu"], checks["gpu (gVisor nvproxy)"]
    if gpu_capable("docker"):
        assert gpu["status"] == "ok" and "GPU(s)" in gpu["detail"]
    else:
        # GPUs are optional: said, with the fix, and the doctor still passes.
        assert gpu["status"] == "skip" and "no GPU for sandboxes (optional)" in gpu["detail"]
        assert "NVIDIA Container Toolkit" in gpu["hint"] and "nvidia-ctk runtime configure" in gpu["hint"]
        assert code == 0 and report["ok"] is True
    assert nvproxy["status"] in ("ok", "skip")
    if nvproxy["status"] == "skip" and "opt-in" in nvproxy["detail"]:
        assert "--nvproxy=true" in nvproxy["hint"]
