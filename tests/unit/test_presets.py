"""agentnest.presets: 0.3.0's signatures, defaults and errors, without an engine.

``Refusing`` is a backend at the engine's edge: it records the config it was
asked for and fails as an engine would (no image, no GPU driver), so what is
checked is what the presets ask for and how they report a failure.  The
engine tests (tests/integration/test_presets_engine.py) see the real errors.
"""

from __future__ import annotations

import inspect

import pytest

from agentnest import (
    AgentNestError,
    BackendError,
    ConfigurationError,
    ImageNotFoundError,
    NetworkPolicy,
    SecurityPolicy,
)
from agentnest.config import MiB
from agentnest.runtime.base import Capability
from agentnest.testing.fake import FakeBackend


class Refusing(FakeBackend):
    """Records each config, then fails creating it with ``error``."""

    def __init__(self, error: Exception) -> None:
        caps = frozenset(
            {
                Capability.NETWORK_DENIED,
                Capability.EGRESS_DOMAINS,
                Capability.RESOURCE_LIMITS,
                Capability.READ_ONLY_ROOT,
                Capability.GPU,
            }
        )
        super().__init__(caps=caps, refuse=error)


def test_module_keeps_0_3_0_names_and_signatures() -> None:
    from agentnest import Sandbox, presets

    assert presets.Sandbox is Sandbox and presets.SecurityPolicy is SecurityPolicy
    browser = inspect.signature(presets.browser_sandbox).parameters
    assert [(p.name, p.kind.name, p.default) for p in browser.values()] == [
        ("timeout", "KEYWORD_ONLY", 300),
        ("image", "KEYWORD_ONLY", "agentnest/preset:browser"),
        ("security_policy", "KEYWORD_ONLY", None),
        ("kwargs", "VAR_KEYWORD", inspect.Parameter.empty),
    ]
    gpu = inspect.signature(presets.gpu_sandbox).parameters
    assert list(gpu) == ["image", "gpus", "timeout", "kwargs"]
    assert (gpu["gpus"].default, gpu["timeout"].default) == (1, 300)
    assert gpu["image"].default is inspect.Parameter.empty


def test_browser_defaults_and_a_backend_that_cannot_build_the_image() -> None:
    from agentnest.presets import BROWSER_IMAGE, browser_sandbox

    assert BROWSER_IMAGE == "agentnest/preset:browser"
    backend = Refusing(ImageNotFoundError("image 'local/browser' is not on this engine"))
    # The image is built on this host's Docker engine; another backend must be told which image.
    with pytest.raises(ConfigurationError) as info:
        browser_sandbox(backend=backend)
    assert "agentnest image browser" in str(info.value) and "image=" in str(info.value)
    assert backend.configs == []
    with pytest.raises(ImageNotFoundError):
        browser_sandbox(image="local/browser", backend=backend)
    (config,) = backend.configs
    assert config.image == "local/browser" and config.lifetime == 300 and config.preset == "browser"
    assert (config.limits.memory, config.limits.pids, config.limits.scratch) == (2048 * MiB, 512, 256 * MiB)
    assert config.network == NetworkPolicy.denied()
    # Every default can be overridden, and the other Sandbox arguments pass through.
    policy = SecurityPolicy(network=NetworkPolicy.allowlist(domains=("example.com",)))
    with pytest.raises(ImageNotFoundError):
        browser_sandbox(
            timeout=60,
            image="local/browser",
            security_policy=policy,
            memory="1g",
            pids=300,
            cpus=2.0,
            backend=backend,
        )
    config = backend.configs[-1]
    assert (config.image, config.lifetime, config.limits.memory, config.limits.pids) == (
        "local/browser",
        60,
        1024 * MiB,
        300,
    )
    assert config.limits.cpus == 2.0 and config.network.domains == ("example.com",)


def test_an_unknown_preset_is_refused_before_anything_is_created() -> None:
    from agentnest import Sandbox

    backend = Refusing(AssertionError("must not be reached"))
    for bad in ("chrome", "", 1):
        with pytest.raises(ConfigurationError, match="preset="):
            Sandbox(image="local", preset=bad, backend=backend)  # type: ignore[arg-type]
    assert backend.configs == []


def test_gpu_counts_are_checked_before_anything_is_created() -> None:
    from agentnest.presets import gpu_sandbox

    backend = Refusing(AssertionError("must not be reached"))
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises(ConfigurationError, match="gpus"):
            gpu_sandbox("local", gpus=bad, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # 0.3.0 raised ValueError
        gpu_sandbox("local", gpus=0)
    assert backend.configs == []


def test_gpu_sandbox_asks_for_gpus_and_explains_an_engine_without_them() -> None:
    from agentnest.presets import gpu_sandbox

    engine = (
        "starting the sandbox container: the engine refused: "
        'could not select device driver "" with capabilities: [[gpu]]'
    )
    backend = Refusing(BackendError(engine))
    with pytest.raises(BackendError) as info:
        gpu_sandbox("local", gpus=2, timeout=90, backend=backend)
    assert "NVIDIA Container Toolkit" in str(info.value) and "device driver" in str(info.value)
    (config,) = backend.configs
    assert (config.image, config.limits.gpus, config.lifetime) == ("local", 2, 90)
    # Other engine failures, and a missing image, go through as they were.
    other = BackendError("the engine refused: no space left on device")
    with pytest.raises(BackendError) as passed:
        gpu_sandbox("local", backend=Refusing(other))
    assert passed.value is other
    missing = ImageNotFoundError("image 'cuda' is not on this engine")
    with pytest.raises(ImageNotFoundError) as not_found:
        gpu_sandbox("cuda", backend=Refusing(missing))
    assert not_found.value is missing and isinstance(not_found.value, AgentNestError)
