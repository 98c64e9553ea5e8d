"""Profiles: discovery, loading, inheritance and errors that point at the line."""

from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

import pytest

from agentnest import (
    AsyncSandbox,
    ConfigurationError,
    MissingDependencyError,
    NetworkPolicy,
    ProfileError,
    Sandbox,
    SecurityPolicy,
)
from agentnest.approvals import RuleApprover
from agentnest.profiles import ApprovalRule, Profile, find_profile_file, load_profiles

GOOD = """\
default: base
profiles:
  base:
    image: python:3.12-slim
    backend: docker
    timeout: 600
    memory: 1g
    cpus: 2
    pids: 128
    workspace_size: 512m
    scratch_size: 32m
    environment:
      LANG: C.UTF-8
      MODE: base
    approvals:
      - {kind: exec, match: "rm *", action: deny}
      - kind: file.write
        match: "/workspace/out/*"
        action: allow
  strict:
    extends: base
    memory: 768m
    environment:
      MODE: strict
    network:
      allowlist:
        domains: [pypi.org, "*.pythonhosted.org"]
        cidrs: [10.1.0.0/16]
        ports: [443]
    max_output_bytes: 1m
    max_file_bytes: 4194304
    require_image_digest: true
    allowed_images: ["python@sha256:*"]
    read_only_root: true
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agentnest.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profiles(path)
    return str(info.value)


# -- discovery ------------------------------------------------------------------


def test_find_explicit_beats_env_and_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text("profiles: {}\n")
    named = tmp_path / "named.yaml"
    named.write_text("profiles: {}\n")
    write(tmp_path, "profiles: {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENTNEST_PROFILE_FILE", str(named))
    assert find_profile_file(explicit) == explicit
    assert find_profile_file(str(explicit)) == explicit


def test_find_env_beats_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named = tmp_path / "named.yaml"
    named.write_text("profiles: {}\n")
    write(tmp_path, "profiles: {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENTNEST_PROFILE_FILE", str(named))
    assert find_profile_file() == named


def test_find_cwd_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTNEST_PROFILE_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert find_profile_file() is None
    write(tmp_path, "profiles: {}\n")
    found = find_profile_file()
    assert found is not None
    assert found.resolve() == (tmp_path / "agentnest.yaml").resolve()


def test_find_missing_explicit_or_env_file_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ProfileError, match="not found"):
        find_profile_file(tmp_path / "nope.yaml")
    monkeypatch.setenv("AGENTNEST_PROFILE_FILE", str(tmp_path / "gone.yaml"))
    with pytest.raises(ProfileError, match="AGENTNEST_PROFILE_FILE"):
        find_profile_file()


# -- a good file ------------------------------------------------------------------


def test_good_file_and_extends(tmp_path: Path) -> None:
    profiles = load_profiles(write(tmp_path, GOOD))
    assert profiles.default == "base"
    assert sorted(profiles.profiles) == ["base", "strict"]
    base = profiles.get()
    assert base.name == "base"
    rules = (
        ApprovalRule("exec", "rm *", "deny"),
        ApprovalRule("file.write", "/workspace/out/*", "allow"),
    )
    assert base.approvals == rules
    assert base.sandbox_kwargs() == {
        "image": "python:3.12-slim",
        "backend": "docker",
        "timeout": 600.0,
        "memory": 1024**3,
        "cpus": 2.0,
        "pids": 128,
        "workspace_size": 512 * 1024**2,
        "scratch_size": 32 * 1024**2,
        "environment": {"LANG": "C.UTF-8", "MODE": "base"},
        "security_policy": SecurityPolicy(approval_hook=RuleApprover(rules, "deny")),
    }
    strict = profiles.get("strict")
    assert strict.approvals == rules
    assert strict.sandbox_kwargs() == {
        "image": "python:3.12-slim",
        "backend": "docker",
        "timeout": 600.0,
        "memory": 768 * 1024**2,
        "cpus": 2.0,
        "pids": 128,
        "workspace_size": 512 * 1024**2,
        "scratch_size": 32 * 1024**2,
        "read_only_root": True,
        "environment": {"LANG": "C.UTF-8", "MODE": "strict"},
        "security_policy": SecurityPolicy(
            network=NetworkPolicy.allowlist(
                domains=["pypi.org", "*.pythonhosted.org"], cidrs=["10.1.0.0/16"], ports=[443]
            ),
            approval_hook=RuleApprover(rules, "deny"),
            max_output_bytes=1024**2,
            max_file_bytes=4194304,
            require_image_digest=True,
            allowed_images=("python@sha256:*",),
            read_only_root=True,
        ),
    }


def test_sandbox_kwargs_are_sandbox_and_async_sandbox_parameters(tmp_path: Path) -> None:
    kwargs = load_profiles(write(tmp_path, GOOD)).get("strict").sandbox_kwargs()
    for face in (Sandbox.__init__, AsyncSandbox.create):
        params = inspect.signature(face).parameters
        assert set(kwargs) <= set(params), set(kwargs) - set(params)


def test_profile_is_frozen(tmp_path: Path) -> None:
    profile = load_profiles(write(tmp_path, GOOD)).get("base")
    assert isinstance(profile, Profile)
    with pytest.raises(AttributeError):
        profile.memory = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        profile.environment["X"] = "y"  # type: ignore[index]


def test_network_short_forms(tmp_path: Path) -> None:
    profiles = load_profiles(
        write(tmp_path, "profiles:\n  a: {network: open}\n  b: {network: denied}\n  c: {}\n")
    )
    assert profiles.get("a").security_policy.network == NetworkPolicy.open()
    assert profiles.get("b").security_policy.network == NetworkPolicy.denied()
    assert profiles.get("c").sandbox_kwargs() == {"security_policy": SecurityPolicy()}


def test_network_0_3_0_mode_names_and_strict_matching(tmp_path: Path) -> None:
    text = (
        "profiles:\n  a: {network: deny}\n  b: {network: allow}\n  c:\n    network:\n      allowlist:\n"
        "        domains: [pypi.org, 10.20.30.40]\n        subdomains: false\n"
    )
    profiles = load_profiles(write(tmp_path, text))
    assert profiles.get("a").security_policy.network == NetworkPolicy.denied()
    assert profiles.get("b").security_policy.network == NetworkPolicy.open()
    strict = NetworkPolicy.allowlist(["pypi.org", "10.20.30.40"], subdomains=False)
    assert profiles.get("c").security_policy.network == strict
    bad = text.replace("subdomains: false", "subdomains: 'no'")
    where = r":8: profiles.c.network.allowlist.subdomains: must be true or false"
    with pytest.raises(ProfileError, match=where):
        load_profiles(write(tmp_path, bad))


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    path = write(tmp_path, "profiles:\n  a:\n    <<: {memory: 1g, pids: 64}\n    memory: 2g\n")
    assert load_profiles(path).get("a").memory == 2 * 1024**3


# -- errors, each at its line ---------------------------------------------------------


def test_missing_profile_lists_available(tmp_path: Path) -> None:
    profiles = load_profiles(write(tmp_path, GOOD))
    with pytest.raises(ProfileError, match=r"no profile 'lax'; available: base, strict"):
        profiles.get("lax")


def test_no_name_and_no_default(tmp_path: Path) -> None:
    profiles = load_profiles(write(tmp_path, "profiles:\n  a: {}\n"))
    with pytest.raises(ProfileError, match="no 'default:'"):
        profiles.get()


def test_default_must_name_a_profile(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "profiles:\n  a: {}\ndefault: b\n")
    assert msg.endswith("agentnest.yaml:3: default: no profile 'b'; available: a")


def test_bad_size_points_at_the_line(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "profiles:\n  strict:\n    image: x\n    memory: 12x\n")
    assert msg.endswith("agentnest.yaml:4: profiles.strict.memory: '12x' is not a size; write it like '512m'")
    msg = error_of(tmp_path, "profiles:\n  s:\n    scratch_size: -5\n")
    assert ":3: profiles.s.scratch_size: -5 must be a positive byte count" in msg
    msg = error_of(tmp_path, "profiles:\n  s:\n    max_output_bytes: [1]\n")
    assert ":3: profiles.s.max_output_bytes: must be a size" in msg


def test_unknown_key_suggests(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "profiles:\n  strict:\n    image: x\n\n    memroy: 1g\n")
    assert msg.endswith("agentnest.yaml:5: profiles.strict.memroy: unknown key; did you mean 'memory'?")
    msg = error_of(tmp_path, "profile:\n  a: {}\n")
    assert ":1: profile: unknown key; did you mean 'profiles'?" in msg
    msg = error_of(tmp_path, "profiles:\n  a:\n    network: {allowlist: {domain: [a.org]}}\n")
    assert ":3: profiles.a.network.allowlist.domain: unknown key; did you mean 'domains'?" in msg


def test_duplicate_key_refused(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "profiles:\n  a:\n    memory: 1g\n    cpus: 1\n    memory: 2g\n")
    assert msg.endswith("agentnest.yaml:5: memory: duplicate key (first at line 3)")
    msg = error_of(tmp_path, "profiles:\n  a: {}\n  a: {}\n")
    assert ":3: a: duplicate key (first at line 2)" in msg


def test_malformed_yaml_reports_its_line(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "profiles:\n  a:\n    image: x\n   memory: [1g\n")
    assert "agentnest.yaml:4: not valid YAML" in msg
    msg = error_of(tmp_path, "profiles:\n  a: {image: x\n  b: {}\n")
    assert "not valid YAML" in msg
    assert msg.split(":")[1].isdigit()


@pytest.mark.parametrize(
    ("body", "line", "where", "expected"),
    [
        ("    image: 3\n", 3, "profiles.a.image", "must be a non-empty string"),
        ("    cpus: lots\n", 3, "profiles.a.cpus", "must be a number"),
        ("    pids: 1.5\n", 3, "profiles.a.pids", "must be an integer"),
        ("    timeout: true\n", 3, "profiles.a.timeout", "must be a number"),
        ("    read_only_root: 'yes'\n", 3, "profiles.a.read_only_root", "must be true or false"),
        ("    allowed_images: python\n", 3, "profiles.a.allowed_images", "must be a list"),
        ("    allowed_images:\n      - ok\n      - 7\n", 5, "profiles.a.allowed_images", "non-empty strings"),
        ("    environment: [A]\n", 3, "profiles.a.environment", "must be a mapping"),
        (
            "    environment:\n      PORT: 8080\n",
            4,
            "profiles.a.environment.PORT",
            "must be a string (quote it)",
        ),
        ("    environment:\n      AGENTNEST_X: y\n", 4, "profiles.a.environment.AGENTNEST_X", "reserved"),
        ("    network: maybe\n", 3, "profiles.a.network", "must be 'denied', 'open'"),
        ("    network: {allowlist: {domains: a.org}}\n", 3, "profiles.a.network.allowlist.domains", "list"),
        (
            "    network:\n      allowlist:\n        ports: [99999]\n",
            5,
            "profiles.a.network.allowlist.ports",
            "99999",
        ),
        (
            "    network:\n      allowlist: {ports: [443]}\n",
            4,
            "profiles.a.network.allowlist",
            "at least one",
        ),
        ("    approvals: {kind: exec}\n", 3, "profiles.a.approvals.kind", "unknown key"),
        ("    approvals: {default: allow}\n", 3, "profiles.a.approvals", "missing 'rules'"),
        (
            "    approvals: {rules: [], default: maybe}\n",
            3,
            "profiles.a.approvals.default",
            "'allow' or 'deny'",
        ),
        ("    approvals: 3\n", 3, "profiles.a.approvals", "must be a list of rules"),
        (
            "    approvals:\n      - {kind: exec, match: x}\n",
            4,
            "profiles.a.approvals[0]",
            "missing 'action'",
        ),
        (
            "    approvals:\n      - kind: exec\n        match: x\n        action: maybe\n",
            6,
            "profiles.a.approvals[0].action",
            "'maybe' is unknown",
        ),
        (
            "    approvals:\n      - kind: shell\n        match: x\n        action: deny\n",
            4,
            "profiles.a.approvals[0].kind",
            "'shell' is unknown",
        ),
        (
            "    approvals:\n      - kind: exec\n        match: [x]\n        action: deny\n",
            5,
            "profiles.a.approvals[0].match",
            "must be a string",
        ),
        (
            "    approvals:\n      - {kind: exec, match: x, action: deny, why: no}\n",
            4,
            "profiles.a.approvals[0].why",
            "unknown key",
        ),
        ("    max_output_bytes: 10\n", 2, "profiles.a", "max_output_bytes=10 is out of range"),
        ("    memory: 64m\n    workspace_size: 64m\n", 2, "profiles.a", "must leave at least 16m"),
        ("    timeout: 0\n", 2, "profiles.a.timeout", "out of range"),
        ("    extends: 3\n", 3, "profiles.a.extends", "must be a non-empty string"),
    ],
)
def test_wrong_types_and_values(tmp_path: Path, body: str, line: int, where: str, expected: str) -> None:
    msg = error_of(tmp_path, "profiles:\n  a:\n" + body)
    assert msg.startswith(f"{tmp_path / 'agentnest.yaml'}:{line}: {where}: "), msg
    assert expected in msg, msg
    assert isinstance(ProfileError(msg), ConfigurationError)
    assert isinstance(ProfileError(msg), ValueError)


def test_too_broad_allowlist_pattern_reported_at_its_line(tmp_path: Path) -> None:
    text = (
        "profiles:\n  a:\n    network:\n      allowlist:\n"
        "        domains:\n          - pypi.org\n          - '*.com'\n"
    )
    msg = error_of(tmp_path, text)
    assert ":7: profiles.a.network.allowlist.domains: allowlist pattern '*.com' is too broad" in msg


def test_top_level_errors(tmp_path: Path) -> None:
    assert ":1: (top level): must be a mapping" in error_of(tmp_path, "- a\n")
    assert ":1: (top level): missing 'profiles:'" in error_of(tmp_path, "default: a\n")
    assert ":1: profiles: must be a mapping" in error_of(tmp_path, "profiles: [a]\n")
    assert ":2: profiles.a: must be a mapping" in error_of(tmp_path, "profiles:\n  a: 3\n")
    assert "(top level): must be a mapping" in error_of(tmp_path, "")


def test_extends_unknown_parent(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "profiles:\n  a: {}\n  b:\n    extends: c\n")
    assert msg.endswith(":4: profiles.b.extends: no profile 'c'; available: a, b")


def test_extends_cycle_refused(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "profiles:\n  a:\n    extends: b\n  b:\n    extends: c\n  c:\n    extends: a\n")
    assert ":7: profiles.c.extends: inheritance cycle: a -> b -> c -> a" in msg
    msg = error_of(tmp_path, "profiles:\n  a:\n    extends: a\n")
    assert "inheritance cycle: a -> a" in msg


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profiles(tmp_path / "missing.yaml")


def test_missing_pyyaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, GOOD)
    # None in sys.modules makes any import of yaml raise ImportError, as if it were not installed.
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(MissingDependencyError, match=r"agentnest\[profiles\]"):
        load_profiles(path)
