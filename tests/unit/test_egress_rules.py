"""What the egress proxy admits (egress/rules.py): allowlist entries, host matching, address checks.

Pure: no proxy, no socket.  Every refusal of an entry is a ValueError, whatever
the input (the policy turns it into a ConfigurationError).
"""

from __future__ import annotations

import ast
import ipaddress
import random
import string
from pathlib import Path
from typing import Any

import pytest

from agentnest.egress import rules
from agentnest.egress.rules import REASONS, Rules, address_category, check_pattern, match_host, normalize_host

# -- allowlist entries -----------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [
        *("*", "*.com", "", "*.", "exa mple.com", "a..b", "-a.com", "*.*.com", 3),
        *("0.0.0.0", "::", "224.0.0.1", "10.1.2", "2130706433", "[10.0.0.1]", "fe80::1%eth0", "10.0.0.0/8"),
        # Not strings at all.
        *(None, b"example.com", ["example.com"], 1.5, True),
        # Names that are no host names.
        *(".", "..", ".example.com", "a_b.com", "ex@mple.com", "exämple.com", "a-.com", "a.-b.com"),
        *("a" * 64 + ".com", ".".join(["a" * 63] * 4) + ".com", "*.a" * 200, "a\x00.com", "a\n.com"),
        # '$' in a pattern matches before a final newline: none may slip through.
        *("example.com\n.x", "a\n.example.com", "*.a\n.example.com", "10.0.0.1\n.x"),
        # Wildcards anywhere but the front, or too broad.
        *("a.*.com", "*a.example.com", "**.example.com", "*example.com", "*.", "*.*", "*.1.2.3"),
        # Digits where the top-level domain goes: an address in a legacy notation.
        *("1.2.3.4.5", "0x7f.1", "example.123", "*.10.0.1"),
        # Addresses that are no server's.
        *("[::]", "::ffff:0.0.0.0", "ff02::1", "239.255.255.250", "[::1", "::1]", "[fe80::1%eth0]"),
    ],
    ids=repr,
)
def test_bad_patterns_are_refused(pattern: Any) -> None:
    with pytest.raises(ValueError):
        check_pattern(pattern)


@pytest.mark.parametrize(
    ("pattern", "normalised"),
    [
        ("Example.COM.", "example.com"),
        ("  pypi.org  ", "pypi.org"),
        ("*.Files.Example", "*.files.example"),
        ("a-b.c", "a-b.c"),
        ("localhost", "localhost"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("10.20.30.40.", "10.20.30.40"),
        ("[::1]", "::1"),
        ("2001:DB8::1", "2001:db8::1"),
        ("0:0::1", "::1"),
        ("::ffff:10.0.0.1", "::ffff:a00:1"),
        ("a" * 63 + ".com", "a" * 63 + ".com"),
    ],
)
def test_good_patterns_come_back_normalised(pattern: str, normalised: str) -> None:
    assert check_pattern(pattern) == normalised
    assert check_pattern(normalised) == normalised  # idempotent


def test_patterns_match_like_the_policy() -> None:
    from agentnest.policy import NetworkPolicy

    for pattern in ("Example.COM.", "*.files.example", "a-b.c", "10.20.30.40.", "[::1]", "2001:DB8::1"):
        assert check_pattern(pattern) == NetworkPolicy.allowlist([pattern]).domains[0]
    for bad in ("*.com", "0.0.0.0", "10.1.2"):
        with pytest.raises(ValueError) as proxy_error:
            check_pattern(bad)
        with pytest.raises(ValueError) as policy_error:
            NetworkPolicy.allowlist([bad])
        assert str(proxy_error.value) == str(policy_error.value)
    patterns = ["example.com", "*.files.example"]
    assert match_host("example.com", patterns)
    assert match_host("a.b.files.example", patterns)
    assert not match_host("files.example", patterns)
    assert not match_host("evilfiles.example", patterns)
    assert not match_host("example.com.evil", patterns)
    assert match_host("sub.example.com", patterns)  # the default, as in 0.3.0
    assert not match_host("sub.example.com", patterns, subdomains=False)
    assert match_host("a.b.files.example", patterns, subdomains=False)


def test_random_patterns_give_a_pattern_or_a_value_error() -> None:
    rng = random.Random(32)
    alphabet = string.ascii_letters + string.digits + ".-*:[]%/_ \x00é"
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        try:
            pattern = check_pattern(text)
        except ValueError:
            continue
        assert check_pattern(pattern) == pattern
        # What is admitted is a name, a '*.name' or an address, and nothing broader.
        assert pattern != "*" and pattern.count("*") <= 1
        if pattern.startswith("*."):
            assert normalize_host(pattern[2:]) is not None and "." in pattern[2:]


# -- host names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("a", "a"),
        ("", None),
        (".", None),
        ("a..b", None),
        ("a.", "a"),
        ("a..", None),
        ("exämple.com", None),
        ("a b", None),
        ("a_b", None),
        ("-a", None),
        ("a-", None),
        ("a" * 63, "a" * 63),
        ("a" * 64, None),
        (".".join(["a" * 63] * 3 + ["a" * 61]), ".".join(["a" * 63] * 3 + ["a" * 61])),  # 253
        (".".join(["a" * 63] * 3 + ["a" * 62]), None),  # 254
        (".".join(["a" * 63] * 3 + ["a" * 61]) + ".", ".".join(["a" * 63] * 3 + ["a" * 61])),
        ("a" * 300, None),
        ("a\n", None),
        ("a\n.com", None),
        ("example.com\n", None),
        (None, None),
        (b"example.com", None),
        (7, None),
    ],
)
def test_normalize_host(name: Any, expected: str | None) -> None:
    assert normalize_host(name) == expected


ENTRIES = ["pypi.org", "*.files.example", "localhost", "10.0.0.1", "::1"]


@pytest.mark.parametrize(
    ("host", "with_subdomains", "strict"),
    [
        ("pypi.org", True, True),
        ("PyPI.ORG", True, True),
        ("pypi.org.", True, True),
        ("files.pypi.org", True, False),
        ("A.B.PyPI.org.", True, False),
        ("notpypi.org", False, False),
        ("pypi-org.com", False, False),
        ("pypi.org.evil.com", False, False),
        ("org", False, False),
        ("x.files.example", True, True),
        ("a.b.files.example", True, True),
        ("files.example", False, False),
        ("localhost", True, True),
        ("a.localhost", False, False),  # one label: never a whole top-level domain
        ("10.0.0.1", False, False),  # an address is no name (see listed())
        ("x.10.0.0.1", False, False),
    ],
)
def test_name_matching(host: str, with_subdomains: bool, strict: bool) -> None:
    name = normalize_host(host)
    assert name is not None
    assert Rules(ENTRIES).admits_name(name) is with_subdomains
    assert Rules(ENTRIES, subdomains=False).admits_name(name) is strict


def test_nothing_matches_an_empty_allowlist() -> None:
    for host in ("a", "example.com", "localhost"):
        assert not match_host(host, [])
        assert not Rules().admits_name(host)


# -- rules -----------------------------------------------------------------------------


def test_rules_keep_listed_addresses_apart() -> None:
    r = Rules(["pypi.org", "10.20.30.40", "[::1]", "::ffff:10.0.0.9"], cidrs=["192.0.2.0/24"])
    assert r.domains == ("pypi.org",)
    ip = ipaddress.ip_address
    for listed in ("10.20.30.40", "::ffff:10.20.30.40", "::1", "10.0.0.9", "::ffff:a00:9"):
        assert r.listed(ip(listed)), listed
    for other in ("10.20.30.41", "::2", "127.0.0.1", "192.0.2.1"):
        assert not r.listed(ip(other)), other
    # Listing is not a cidr: a name resolving to the address is still refused.
    assert r.refusal(ip("10.20.30.40")) == "10.20.30.40 is private"
    assert r.refusal(ip("192.0.2.1")) is None


def test_cidrs_admit_their_range_in_either_address_family() -> None:
    r = Rules(["a.example"], cidrs=["10.0.0.0/8", "fd00::/8", "127.0.0.1/8"])  # host bits are dropped
    ip = ipaddress.ip_address
    for admitted in ("10.1.2.3", "::ffff:10.1.2.3", "fd12::1", "127.0.0.9"):
        assert r.in_cidrs(ip(admitted)) and r.refusal(ip(admitted)) is None, admitted
    for refused in ("172.16.0.1", "fe80::1", "::1", "169.254.169.254"):
        assert not r.in_cidrs(ip(refused)) and r.refusal(ip(refused)) is not None, refused
    with pytest.raises(ValueError):
        Rules(cidrs=["not a range"])


def test_rules_from_config_carry_the_matching() -> None:
    assert Rules.from_config({"domains": ["a.example"]}).subdomains is True
    strict = Rules.from_config({"domains": ["a.example"], "subdomains": False})
    assert strict.subdomains is False
    assert not strict.admits_name("b.a.example")
    with pytest.raises(ValueError, match="subdomains"):
        Rules.from_config({"domains": ["a.example"], "subdomains": "false"})
    defaults = Rules.from_config({})
    assert defaults.ports == frozenset({80, 443}) and defaults.domains == () and defaults.hosts == {}


@pytest.mark.parametrize("port", [0, 65536, -1, True, "443", 443.0, None])
def test_rules_refuse_what_is_no_tcp_port(port: Any) -> None:
    with pytest.raises(ValueError, match="port"):
        Rules(["a.example"], ports=[port])


def test_rules_validate_their_hosts_mapping() -> None:
    r = Rules(["a.example"], hosts={"A.Example.": "1.2.3.4", "b.example": ["::1", "[::2]"]})
    ip = ipaddress.ip_address
    assert r.hosts == {"a.example": (ip("1.2.3.4"),), "b.example": (ip("::1"), ip("::2"))}
    mappings: list[dict[str, Any]] = [
        {"a.example": "not-an-ip"},
        {"bad name": "1.2.3.4"},
        {"a.example": []},
        {"a.example": ["1.2.3.4", 5]},
        {"a.example": ["1.2.3.4", "x"]},
    ]
    for bad in mappings:
        with pytest.raises(ValueError, match="hosts mapping"):
            Rules(["a.example"], hosts=bad)


# -- addresses -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "private"),
        ("10.0.0.1", "private"),
        ("192.168.1.1", "private"),
        ("172.16.0.1", "private"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:8.8.8.8", None),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        # NAT64 of 8.8.8.8: the embedded address is not checked.  Some Pythons
        # already call the NAT64 ranges reserved; refused either way.
        ("64:ff9b::808:808", ("reserved", "translated")),
        ("64:ff9b:1::1", ("reserved", "translated")),
        ("2002:a00:1::1", "translated"),  # 6to4
        ("2001::1", "translated"),  # Teredo
        ("100.64.0.1", "not-global"),
        ("198.18.0.1", "private"),  # the benchmarking range the sandboxes' networks use
    ],
)
def test_address_categories(text: str, expected: str | tuple[str, ...] | None) -> None:
    category = address_category(ipaddress.ip_address(text))
    assert category in expected if isinstance(expected, tuple) else category == expected


# -- what the proxy says -----------------------------------------------------------------


def test_every_reason_the_proxy_gives_is_a_known_one() -> None:
    """Each reason string in the proxy's modules is a key of REASONS (the host drops unknown ones)."""
    found: set[str] = set()
    for name in ("hello", "head", "proxy"):
        tree = ast.parse((Path(rules.__file__).parent / f"{name}.py").read_text("utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            # RequestError(reason, ...), self._deny(conn, reason, ...), conn.event(allowed, reason, ...)
            at = {"RequestError": 0, "_deny": 1, "event": 1}.get(callee)
            if at is not None and len(node.args) > at:
                reason = node.args[at]
                if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                    found.add(reason.value)
    assert len(found) >= 15
    assert found <= set(REASONS), found - set(REASONS)
