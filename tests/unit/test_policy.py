"""Network and security policy (policy.py): unsafe policies cannot be constructed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentnest.errors import AgentNestError, ConfigurationError
from agentnest.policy import Ceiling, NetworkMode, NetworkPolicy, SecurityPolicy

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


@pytest.mark.parametrize("mode", ["open", "denied"])
def test_mode_from_string(mode: str) -> None:
    assert NetworkPolicy(mode).mode is NetworkMode(mode)  # type: ignore[arg-type]
    assert NetworkPolicy("allowlist", domains=("example.com",)).mode is NetworkMode.ALLOWLIST  # type: ignore[arg-type]


def test_unknown_mode() -> None:
    with pytest.raises(ConfigurationError, match="unknown"):
        NetworkPolicy("bridge")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        NetworkMode("DENY")


def test_0_3_0_mode_names_and_values() -> None:
    # 0.3.0 had DENY="deny", ALLOW="allow": the same members under both names and values.
    # mypy does not model enum aliases: it takes DENY for a member of its own.
    assert NetworkMode.DENY is NetworkMode.DENIED  # type: ignore[comparison-overlap]
    assert NetworkMode.ALLOW is NetworkMode.OPEN  # type: ignore[comparison-overlap]
    assert NetworkMode.DENY.value == "denied"
    assert NetworkMode("deny") is NetworkMode.DENIED
    assert NetworkMode("allow") is NetworkMode.OPEN
    assert NetworkMode["DENY"] is NetworkMode.DENIED
    assert list(NetworkMode) == [NetworkMode.DENIED, NetworkMode.ALLOWLIST, NetworkMode.OPEN]
    assert NetworkPolicy("deny").mode is NetworkMode.DENIED  # type: ignore[arg-type]
    assert NetworkPolicy(mode="allow") == NetworkPolicy.open()  # type: ignore[arg-type]
    assert NetworkPolicy(NetworkMode.DENY) == NetworkPolicy.denied()


def test_0_3_0_positional_and_keyword_calls() -> None:
    positional = NetworkPolicy(NetworkMode.ALLOWLIST, ("pypi.org",), ("10.0.0.0/8",))
    keyword = NetworkPolicy.allowlist(domains=("pypi.org",), cidrs=("10.0.0.0/8",))
    assert positional == keyword
    assert (keyword.domains, keyword.cidrs, keyword.subdomains) == (("pypi.org",), ("10.0.0.0/8",), True)


def test_allowed_is_0_3_0_name_of_open() -> None:
    with pytest.deprecated_call(match=r"open\(\)"):
        policy = NetworkPolicy.allowed()
    assert policy == NetworkPolicy.open()


@pytest.mark.parametrize(
    "changes",
    [
        {"mode": NetworkMode.DENIED, "domains": ("example.com",)},
        {"mode": NetworkMode.DENY, "cidrs": ("10.0.0.0/8",)},
        {"mode": NetworkMode.OPEN, "domains": ("example.com",)},
        {"mode": NetworkMode.OPEN, "subdomains": False},
    ],
    ids=repr,
)
def test_lists_only_go_with_an_allowlist(changes: dict[str, Any]) -> None:
    # 0.3.0 raised ValueError here too: a list on an unfiltered network would filter nothing.
    with pytest.raises(ValueError, match="only go with network mode 'allowlist'"):
        NetworkPolicy(**changes)


def test_subdomains_is_the_default_and_strict_is_opt_in() -> None:
    assert NetworkPolicy.allowlist(["pypi.org"]).subdomains is True
    assert NetworkPolicy().subdomains is True
    strict = NetworkPolicy.allowlist(["pypi.org"], subdomains=False)
    assert strict.subdomains is False
    assert strict != NetworkPolicy.allowlist(["pypi.org"])
    assert dataclasses.replace(strict, subdomains=True) == NetworkPolicy.allowlist(["pypi.org"])
    with pytest.raises(TypeError):
        NetworkPolicy.allowlist(["pypi.org"], (), (443,), False)  # type: ignore[call-arg]


@pytest.mark.parametrize("value", [0, 1, "false", None], ids=repr)
def test_subdomains_must_be_a_bool(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="subdomains"):
        NetworkPolicy.allowlist(["pypi.org"], subdomains=value)


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
        ("123.example", "123.example"),
        # IP literals: kept in canonical form.
        ("10.20.30.40", "10.20.30.40"),
        ("127.0.0.1", "127.0.0.1"),
        ("169.254.169.254", "169.254.169.254"),
        ("10.20.30.40.", "10.20.30.40"),
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("2001:DB8:0:0::1", "2001:db8::1"),
        ("::ffff:10.0.0.1", "::ffff:a00:1"),
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
        # Addresses that name no server, and names that only look like addresses.
        "0.0.0.0",
        "::",
        "::ffff:0.0.0.0",
        "224.0.0.1",
        "ff02::1",
        "10.1.2",
        "2130706433",
        "010.0.0.1",
        "*.10.0.0",
        "fe80::1%eth0",
        "[10.0.0.1]",
        "10.0.0.0/8",
        "1.2.3.4:80",
    ],
    ids=repr,
)
def test_allowlist_domain_refused(pattern: Any) -> None:
    with pytest.raises(ConfigurationError):
        NetworkPolicy.allowlist([pattern])


def test_too_broad_wildcard_message() -> None:
    with pytest.raises(ConfigurationError, match="too broad"):
        NetworkPolicy.allowlist(["*.com"])


def test_a_name_that_looks_like_an_address_says_so() -> None:
    with pytest.raises(ConfigurationError, match="four decimal numbers"):
        NetworkPolicy.allowlist(["10.1.2"])


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
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.subdomains = False  # type: ignore[misc]
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


# -- Ceiling (a server's: agentnest serve's tokens and agentnest mcp) -----------------------


def test_the_one_ceiling_is_the_token_ceiling() -> None:
    from agentnest.server import auth

    assert auth.Ceiling is Ceiling


def test_bound_takes_the_lower_limit_and_the_ceilings_images() -> None:
    loose = SecurityPolicy(max_memory="2g", max_cpus=4, max_file_bytes=1 << 30, allowed_images=("any/*",))
    bound = Ceiling(max_memory=1 << 30, max_cpus=1, max_timeout=60, max_file_bytes=1 << 20).bound(
        loose, "mine"
    )
    assert (bound.max_memory, bound.max_cpus, bound.max_timeout) == (1 << 30, 1.0, 60.0)
    assert bound.max_file_bytes == 1 << 20
    assert bound.allowed_images == ("mine",)  # an empty ceiling list: the server's image only
    assert bound.check_image("any/thing") is not None and bound.check_image("mine") is None

    tight = SecurityPolicy(max_memory="256m", max_cpus=0.5, max_timeout=30, max_file_bytes=4096)
    kept = Ceiling(images=("py:*",)).bound(tight, "mine")
    assert (kept.max_memory, kept.max_cpus, kept.max_timeout, kept.max_file_bytes) == (
        256 << 20,
        0.5,
        30,
        4096,
    )
    assert kept.allowed_images == ("py:*",)


def test_bound_keeps_what_a_server_checks_per_request() -> None:
    policy = SecurityPolicy(
        network=NetworkPolicy.allowlist(["pypi.org"]),
        max_pids=1024,
        read_only_root=False,
        max_output_bytes=4096,
    )
    bound = Ceiling(max_pids=64).bound(policy, "mine")
    assert bound.network == policy.network
    assert (bound.max_pids, bound.read_only_root, bound.max_output_bytes) == (1024, False, 4096)
