"""Network and security policy (policy.py): unsafe policies cannot be constructed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentnest.errors import AgentNestError, ConfigurationError
from agentnest.policy import NetworkMode, NetworkPolicy, SecurityPolicy

DIGEST = "sha256:" + "0123456789abcdef" * 4


# -- NetworkPolicy -------------------------------------------------------------------


def test_default_is_denied() -> None:
    policy = NetworkPolicy()
    assert policy.mode is NetworkMode.DENIED
    assert policy == NetworkPolicy.denied()
    assert policy.domains == ()
    assert policy.cidrs == ()


def test_open() -> None:
    assert NetworkPolicy.open().mode is NetworkMode.OPEN


@pytest.mark.parametrize("mode", ["open", "denied", "allowlist"])
def test_mode_from_string(mode: str) -> None:
    policy = NetworkPolicy(mode, domains=("example.com",))  # type: ignore[arg-type]
    assert policy.mode is NetworkMode(mode)


def test_unknown_mode() -> None:
    with pytest.raises(ConfigurationError, match="unknown"):
        NetworkPolicy("bridge")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pattern", "normalised"),
    [
        ("example.com", "example.com"),
        ("*.example.com", "*.example.com"),
        ("API.GitHub.com", "api.github.com"),
        ("example.com.", "example.com"),
        (" pypi.org ", "pypi.org"),
        ("*.s3.amazonaws.com", "*.s3.amazonaws.com"),
        ("localhost", "localhost"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ],
)
def test_allowlist_domain_accepted(pattern: str, normalised: str) -> None:
    policy = NetworkPolicy.allowlist([pattern])
    assert policy.mode is NetworkMode.ALLOWLIST
    assert policy.domains == (normalised,)


@pytest.mark.parametrize(
    "pattern",
    [
        "*",
        "*.com",
        "*.",
        "*.*.com",
        "**.example.com",
        "*example.com",
        "example.*",
        "",
        ".",
        "exa mple.com",
        "-bad.com",
        "bad-.com",
        "a..b.com",
        "a_b.com",
        "x" * 64 + ".com",
        "http://example.com",
        "example.com/path",
        "example.com:443",
        5,
        None,
    ],
    ids=repr,
)
def test_allowlist_domain_refused(pattern: Any) -> None:
    with pytest.raises(ConfigurationError):
        NetworkPolicy.allowlist([pattern])


def test_too_broad_wildcard_message() -> None:
    with pytest.raises(ConfigurationError, match="too broad"):
        NetworkPolicy.allowlist(["*.com"])


def test_allowlist_refuses_a_bare_string() -> None:
    with pytest.raises(ConfigurationError):
        NetworkPolicy.allowlist("github")  # type: ignore[arg-type]


def test_allowlist_needs_something_to_allow() -> None:
    with pytest.raises(ConfigurationError, match="at least one"):
        NetworkPolicy.allowlist()


def test_allowlist_with_only_a_cidr() -> None:
    policy = NetworkPolicy.allowlist(cidrs=["10.1.2.3/16"])
    assert policy.cidrs == ("10.1.0.0/16",)  # normalised to the network address


@pytest.mark.parametrize("cidr", ["10.0.0.0/8", "192.168.1.7/32", "fd00::/8", "::1/128"])
def test_cidr_accepted(cidr: str) -> None:
    assert len(NetworkPolicy.allowlist(cidrs=[cidr]).cidrs) == 1


@pytest.mark.parametrize(
    "cidr", ["10.0.0.0/33", "nope", "300.1.1.1/8", "10.0.0.0/-1", "", "fd00::/129", None], ids=repr
)
def test_cidr_refused(cidr: Any) -> None:
    with pytest.raises(ConfigurationError, match="cidr"):
        NetworkPolicy.allowlist(["example.com"], cidrs=[cidr])


@pytest.mark.parametrize("ports", [[1], [65535], [22, 8080], ()])
def test_ports_accepted(ports: list[int]) -> None:
    assert NetworkPolicy.allowlist(["example.com"], ports=ports).ports == tuple(ports)


@pytest.mark.parametrize("port", [0, -1, 65536, True, "80", 80.0, None], ids=repr)
def test_port_refused(port: Any) -> None:
    with pytest.raises(ConfigurationError, match="port"):
        NetworkPolicy.allowlist(["example.com"], ports=[port])


def test_network_policy_is_frozen_with_tuples() -> None:
    policy = NetworkPolicy.allowlist(["example.com"], ports=[443])
    assert isinstance(policy.domains, tuple)
    assert isinstance(policy.ports, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.mode = NetworkMode.OPEN  # type: ignore[misc]
    with pytest.raises(ConfigurationError):
        dataclasses.replace(policy, domains=("*.com",))


# -- SecurityPolicy -----------------------------------------------------------------


def test_security_policy_defaults() -> None:
    policy = SecurityPolicy()
    assert policy.network == NetworkPolicy.denied()
    assert policy.read_only_root is True
    assert policy.check_image("anything:latest") is None


@pytest.mark.parametrize(
    "changes",
    [
        {"max_output_bytes": 1023},
        {"max_output_bytes": (1 << 34) + 1},
        {"max_output_bytes": True},
        {"max_output_bytes": 1e6},
        {"max_file_bytes": 0},
        {"max_file_bytes": (1 << 36) + 1},
        {"max_file_bytes": "1g"},
        {"network": "denied"},
    ],
    ids=repr,
)
def test_security_policy_refuses(changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        SecurityPolicy(**changes)


def test_require_image_digest() -> None:
    policy = SecurityPolicy(require_image_digest=True)
    reason = policy.check_image("python:3.12")
    assert reason is not None
    assert "digest" in reason
    assert policy.check_image(f"python@{DIGEST}") is None
    assert policy.check_image(f"ghcr.io/acme/tool:1@{DIGEST}") is None


def test_allowed_images() -> None:
    policy = SecurityPolicy(allowed_images=("python:*", "ghcr.io/acme/*"))
    assert isinstance(policy.allowed_images, tuple)
    assert policy.check_image("python:3.12-slim") is None
    assert policy.check_image("ghcr.io/acme/tool:1") is None
    for image in ("evil:latest", "docker.io/library/python:3.12", "ghcr.io/other/tool:1", "pythonx:1"):
        reason = policy.check_image(image)
        assert reason is not None, image
        assert image in reason


def test_allowed_images_and_digest_together() -> None:
    policy = SecurityPolicy(require_image_digest=True, allowed_images=["python*"])  # type: ignore[arg-type]
    assert policy.check_image(f"python@{DIGEST}") is None
    assert policy.check_image("python:3.12") is not None
    assert policy.check_image(f"evil@{DIGEST}") is not None


def test_allowed_images_as_a_string_does_not_allow_everything() -> None:
    try:
        policy = SecurityPolicy(allowed_images="python:*")  # type: ignore[arg-type]
    except ConfigurationError:
        return  # refusing the str outright is fine too
    assert policy.check_image("evil:latest") is not None


def test_allowed_images_wrong_type() -> None:
    with pytest.raises(ConfigurationError):
        SecurityPolicy(allowed_images=5)  # type: ignore[arg-type]


def test_policy_errors_are_agentnest_errors() -> None:
    with pytest.raises(AgentNestError):
        NetworkPolicy.allowlist(["*"])
    with pytest.raises(ValueError):
        SecurityPolicy(max_output_bytes=0)
