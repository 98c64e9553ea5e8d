"""Approval hooks, policy ceilings, required runtimes, profiles wired into Sandbox (no engine).

Creation checks are tested against a backend that records what it was asked:
a refusal must come before ``create`` is ever called.
"""

from __future__ import annotations

import argparse
import io
import threading
from pathlib import Path
from typing import Any

import pytest

from agentnest import AsyncSandbox, Sandbox
from agentnest.approvals import (
    APPROVAL_KINDS,
    ApprovalRequest,
    ApprovalRule,
    PromptApprover,
    RuleApprover,
    allow_all,
    builtin,
    deny_all,
    describe,
)
from agentnest.cli import main
from agentnest.cli.run import PROMPT_TIMEOUT, sandbox_options
from agentnest.errors import (
    ConfigurationError,
    PolicyDeniedError,
    ProfileError,
    UnsupportedCapabilityError,
)
from agentnest.events import MemoryObserver
from agentnest.policy import NetworkPolicy, SecurityPolicy
from agentnest.profiles import load_profiles, load_rules
from agentnest.runtime.base import Capability
from agentnest.testing.fake import FakeBackend

FULL = frozenset(
    {
        Capability.NETWORK_DENIED,
        Capability.RESOURCE_LIMITS,
        Capability.READ_ONLY_ROOT,
        Capability.NETWORK_OPEN,
    }
)


class Created(Exception):
    """Raised by the recording backend once it has the config: proof that create() was called."""


class RecordingBackend(FakeBackend):
    """Records the config it is asked to create, then stops (no sandbox is needed for these tests)."""

    def __init__(self, caps: frozenset[Capability] = FULL, runtime: str | None = "runc") -> None:
        super().__init__(caps=caps, oci_runtime=runtime, refuse=Created)


def request(kind: str = "exec", **details: Any) -> ApprovalRequest:
    return ApprovalRequest(kind, "sb", details)


# -- built-in hooks ------------------------------------------------------------------


def test_allow_all_and_deny_all() -> None:
    assert allow_all(request()) is True
    assert deny_all(request()) is False
    assert builtin("allow") is allow_all
    assert builtin("deny") is deny_all
    assert isinstance(builtin("prompt"), PromptApprover)
    with pytest.raises(ConfigurationError, match="'allow', 'deny' or 'prompt'"):
        builtin("maybe")


def test_rules_first_match_wins_then_default() -> None:
    rules = RuleApprover(
        [
            ApprovalRule("exec", "rm *", "deny"),
            ApprovalRule("exec", "*", "allow"),
            ApprovalRule("file.write", "/workspace/out/*", "allow"),
        ]
    )
    assert rules(request("exec", command="ls -l"))
    assert not rules(request("exec", command="rm -rf /workspace"))
    assert rules(request("file.write", path="/workspace/out/a.txt"))
    assert not rules(request("file.write", path="/workspace/src/a.py"))  # default deny
    allowed, rule = rules.decide(request("file.read", path="/workspace/x"))
    assert (allowed, rule) == (False, None)
    assert RuleApprover([], default="allow")(request("fork", image="x"))


def test_rule_kind_star_matches_every_kind() -> None:
    rules = RuleApprover([ApprovalRule("*", "*secret*", "deny")], default="allow")
    assert not rules(request("file.read", path="/workspace/secret.txt"))
    assert not rules(request("exec", command="cat secret"))
    assert rules(request("exec", command="ls"))


def test_rule_subjects_by_kind() -> None:
    assert request("exec", command="a b", argv=["a", "b"]).subject() == "a b"
    assert request("file.read", path="/workspace/a").subject() == "/workspace/a"
    assert request("session.run", session="s", code="x = 1").subject() == "x = 1"
    assert request("fork", image="img", timeout=3).subject() == "img"
    assert request("network", mode="open", domains=[]).subject() == "open"
    assert describe(request("exec", command="ls")) == "exec: ls"
    assert describe(request("exec", command="x" * 400)).endswith("...")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("shell", "x", "deny"), "kind 'shell' is unknown"),
        (("exec", "", "deny"), "non-empty glob"),
        (("exec", "x", "maybe"), "action 'maybe'"),
    ],
)
def test_bad_rules_are_refused(args: tuple[str, str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ApprovalRule(*args)


def test_rule_approver_refuses_bad_defaults_and_items() -> None:
    with pytest.raises(ConfigurationError, match="default"):
        RuleApprover([], default="perhaps")
    with pytest.raises(ConfigurationError, match="ApprovalRule"):
        RuleApprover([("exec", "*", "allow")])  # type: ignore[list-item]


def test_rules_refuse_kinds_the_guard_never_asks() -> None:
    assert "session.run" in APPROVAL_KINDS and "file.delete" not in APPROVAL_KINDS
    with pytest.raises(ConfigurationError, match=r"file\.delete"):
        ApprovalRule("file.delete", "*", "deny")


def test_rules_from_yaml_both_forms(tmp_path: Path) -> None:
    mapping = tmp_path / "rules.yaml"
    mapping.write_text("default: allow\nrules:\n  - {kind: exec, match: 'curl *', action: deny}\n")
    rules = RuleApprover.from_yaml(mapping)
    assert rules.default == "allow"
    assert rules.rules == (ApprovalRule("exec", "curl *", "deny"),)
    listing = tmp_path / "list.yaml"
    listing.write_text("- {kind: exec, match: 'python3 *', action: allow}\n")
    assert load_rules(listing) == RuleApprover([ApprovalRule("exec", "python3 *", "allow")], "deny")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rules: [{kind: exec, match: x, action: allow}]\nextra: 1\n", ":2: (top level).extra: unknown key"),
        ("- {kind: exec, match: x}\n", ":1: (top level)[0]: missing 'action'"),
        ("- {kind: exec, match: x, action: yes}\n", "must be a string"),
        ("just text\n", ":1: (top level): must be a list of rules"),
        ("rules: [\n", "not valid YAML"),
    ],
)
def test_rules_file_errors_point_at_the_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as info:
        load_rules(path)
    assert str(info.value).startswith(str(path))
    assert expected in str(info.value)


def test_prompt_approver_reads_yes_and_no() -> None:
    out = io.StringIO()
    approver = PromptApprover(io.StringIO("y\nno\n\n"), out)
    assert approver(request("exec", command="ls"))
    assert not approver(request("exec", command="rm -rf x"))
    assert not approver(request("exec", command="x"))  # end of input is a no
    assert "asks to exec: ls" in out.getvalue()
    assert out.getvalue().count("allow? [y/N]") == 3


def test_prompt_approver_asks_one_question_at_a_time() -> None:
    class Slow(io.StringIO):
        active = 0
        overlap = False

        def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
            Slow.active += 1
            Slow.overlap |= Slow.active > 1
            threading.Event().wait(0.01)  # hold the "terminal" while another thread might ask
            Slow.active -= 1
            return "y\n"

    approver = PromptApprover(Slow(), io.StringIO())
    threads = [threading.Thread(target=approver, args=(request(),)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not Slow.overlap


# -- policy: ceilings and runtime -----------------------------------------------------


def test_policy_ceilings_validate() -> None:
    policy = SecurityPolicy(max_memory="1g", max_cpus=2, max_pids=100, max_timeout=600)
    assert policy.max_memory == 1024**3
    for bad in (
        {"max_cpus": 0},
        {"max_cpus": float("inf")},
        {"max_pids": 1.5},
        {"max_pids": True},
        {"max_timeout": -1},
        {"max_memory": "lots"},
        {"approval_timeout": 0},
        {"approval_timeout": "1"},
        {"required_runtime": "run sc"},
        {"read_only_root": "yes"},
    ):
        with pytest.raises(ConfigurationError):
            SecurityPolicy(**bad)


def test_required_runtime_aliases() -> None:
    assert SecurityPolicy(required_runtime="gvisor").required_runtime == "runsc"
    assert SecurityPolicy(required_runtime="kata").required_runtime == "kata-runtime"
    assert SecurityPolicy(required_runtime="runsc").check_runtime("runsc") is None
    reason = SecurityPolicy(required_runtime="runsc").check_runtime("runc")
    assert reason is not None and "backend='gvisor'" in reason
    assert SecurityPolicy().check_runtime(None) is None


@pytest.mark.parametrize(
    ("kwargs", "policy", "message"),
    [
        ({"memory": "2g"}, SecurityPolicy(max_memory="1g"), "memory 2g exceeds the policy's max_memory 1g"),
        ({"cpus": 4}, SecurityPolicy(max_cpus=2), "cpus 4 exceeds"),
        ({"pids": 512}, SecurityPolicy(max_pids=128), "pids 512 exceeds"),
        ({"timeout": 3600}, SecurityPolicy(max_timeout=600), "timeout 3600s exceeds"),
        ({}, SecurityPolicy(required_runtime="runsc"), "requires OCI runtime 'runsc'"),
        ({"read_only_root": False}, SecurityPolicy(), "requires a read-only root"),
        ({"image": "python:3.12"}, SecurityPolicy(require_image_digest=True), "not pinned by digest"),
    ],
)
def test_refusals_come_before_the_backend_creates_anything(
    kwargs: dict[str, Any], policy: SecurityPolicy, message: str
) -> None:
    backend = RecordingBackend()
    obs = MemoryObserver()
    kwargs = {"image": "img", **kwargs}
    with pytest.raises(PolicyDeniedError, match=message):
        Sandbox(backend=backend, security_policy=policy, observers=[obs], **kwargs)
    assert backend.configs == []  # the operation did not happen
    assert obs.types() == ["policy.denied"]
    assert obs.events[0].data["kind"] == "sandbox.create"


def test_within_the_ceilings_the_backend_is_asked() -> None:
    backend = RecordingBackend(runtime="runsc")
    policy = SecurityPolicy(
        max_memory="1g", max_cpus=2, max_pids=256, max_timeout=600, required_runtime="gvisor"
    )
    with pytest.raises(Created):
        Sandbox("img", 600, backend=backend, security_policy=policy, memory="1g", cpus=2)
    assert len(backend.configs) == 1


@pytest.mark.parametrize(
    ("missing", "kwargs", "message"),
    [
        (Capability.READ_ONLY_ROOT, {}, "cannot keep the root filesystem read-only"),
        (Capability.RESOURCE_LIMITS, {}, "cannot enforce memory, CPU and PID limits"),
        (Capability.NETWORK_OPEN, {"network_enabled": True}, "network mode 'open'"),
    ],
)
def test_a_backend_that_cannot_enforce_a_setting_refuses(
    missing: Capability, kwargs: dict[str, Any], message: str
) -> None:
    backend = RecordingBackend(caps=FULL - {missing})
    with pytest.raises(UnsupportedCapabilityError, match=message):
        Sandbox("img", backend=backend, **kwargs)
    assert backend.configs == []


def test_a_backend_that_cannot_name_its_runtime_fails_a_required_runtime() -> None:
    backend = RecordingBackend(runtime=None)
    with pytest.raises(PolicyDeniedError, match="no OCI runtime it can name"):
        Sandbox("img", backend=backend, security_policy=SecurityPolicy(required_runtime="runsc"))
    assert backend.configs == []


def test_network_approval_denied_creates_nothing() -> None:
    backend = RecordingBackend()
    asked: list[ApprovalRequest] = []

    def hook(req: ApprovalRequest) -> bool:
        asked.append(req)
        return False

    with pytest.raises(PolicyDeniedError, match="network denied"):
        Sandbox("img", backend=backend, network_enabled=True, approval_hook=hook)
    assert [r.kind for r in asked] == ["network"]
    assert asked[0].details["mode"] == "open"
    assert backend.configs == []


# -- Sandbox(profile=...) -------------------------------------------------------------

PROFILES = """\
profiles:
  small:
    memory: 256m
    workspace_size: 64m
    scratch_size: 32m
    cpus: 0.5
    timeout: 120
    environment: {MODE: small, KEEP: yes-from-profile}
    max_memory: 1g
  locked:
    extends: small
    approvals:
      - {kind: exec, match: "python3 *", action: allow}
"""


@pytest.fixture
def profile_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "agentnest.yaml"
    path.write_text(PROFILES)
    monkeypatch.setenv("AGENTNEST_PROFILE_FILE", str(path))
    return path


def test_profile_fills_in_what_the_caller_did_not_pass(profile_file: Path) -> None:
    backend = RecordingBackend()
    with pytest.raises(Created):
        Sandbox("img", backend=backend, profile="small", cpus=0.25, environment={"MODE": "mine"})
    (config,) = backend.configs
    assert config.limits.memory == 256 * 1024**2  # from the profile
    assert config.limits.cpus == 0.25  # passed explicitly: wins
    assert config.lifetime == 120
    assert dict(config.environment) == {"MODE": "mine", "KEEP": "yes-from-profile"}  # merged by name


def test_explicit_arguments_equal_to_the_defaults_still_win(profile_file: Path) -> None:
    backend = RecordingBackend()
    with pytest.raises(Created):
        Sandbox("img", 300, backend=backend, profile="small", memory="512m")
    assert backend.configs[0].limits.memory == 512 * 1024**2
    assert backend.configs[0].lifetime == 300


def test_profile_ceilings_apply_to_explicit_arguments(profile_file: Path) -> None:
    backend = RecordingBackend()
    with pytest.raises(PolicyDeniedError, match="max_memory"):
        Sandbox("img", backend=backend, profile="small", memory="2g", workspace_size="64m")
    assert backend.configs == []


def test_profile_object_and_unknown_names(profile_file: Path) -> None:
    backend = RecordingBackend()
    profile = load_profiles(profile_file).get("small")
    with pytest.raises(Created):
        Sandbox("img", backend=backend, profile=profile)
    with pytest.raises(ProfileError, match="no profile 'nope'; available: locked, small"):
        Sandbox("img", backend=backend, profile="nope")
    with pytest.raises(ConfigurationError, match="profile must be"):
        Sandbox("img", backend=backend, profile=3)  # type: ignore[arg-type]


def test_profile_name_without_a_file_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTNEST_PROFILE_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProfileError, match="no profile file was found"):
        Sandbox("img", backend=RecordingBackend(), profile="small")


def test_profile_rules_become_the_policy_hook(profile_file: Path) -> None:
    policy = load_profiles(profile_file).get("locked").security_policy
    assert isinstance(policy.approval_hook, RuleApprover)
    assert policy.approval_hook(request("exec", command="python3 -V"))
    assert not policy.approval_hook(request("exec", command="sh -c id"))


def test_profile_over_its_own_ceiling_is_a_line_error(tmp_path: Path) -> None:
    path = tmp_path / "agentnest.yaml"
    path.write_text("profiles:\n  a:\n    memory: 2g\n    max_memory: 1g\n")
    with pytest.raises(ProfileError, match=r":2: profiles.a: memory 2g exceeds the policy's max_memory 1g"):
        load_profiles(path)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_async_create_takes_a_profile(profile_file: Path, anyio_backend: str) -> None:
    backend = RecordingBackend()
    with pytest.raises(Created):
        await AsyncSandbox.create("img", backend=backend, profile="small")
    assert backend.configs[0].limits.memory == 256 * 1024**2


# -- the command line -----------------------------------------------------------------


def run_args(*argv: str) -> argparse.Namespace:
    from agentnest.cli import build_parser

    return build_parser().parse_args(["run", *argv, "--", "true"])


def test_run_options_only_pass_what_was_given() -> None:
    assert sandbox_options(run_args(), None) == {"timeout": 600.0}
    options = sandbox_options(run_args("--memory", "1g", "--approve", "deny", "--network", "denied"), 5)
    assert options["memory"] == "1g"
    assert options["approval_hook"] is deny_all
    assert options["network_enabled"] is False


def test_run_with_a_profile_keeps_its_lifetime_and_policy(profile_file: Path) -> None:
    options = sandbox_options(run_args("--profile", "small", "--approve", "prompt"), None)
    assert options["profile"].name == "small"
    assert "timeout" not in options  # the profile's 120 s applies
    assert isinstance(options["approval_hook"], PromptApprover)
    assert options["security_policy"].approval_timeout == PROMPT_TIMEOUT
    assert options["security_policy"].max_memory == 1024**3  # the profile's policy, kept
    with pytest.raises(ConfigurationError, match="shorter than the lifetime 120"):
        sandbox_options(run_args("--profile", "small", "--timeout", "300"), 300)


def test_run_profile_errors_exit_2(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--profile-file", str(profile_file), "--", "true"]) == 2
    assert "--profile-file needs --profile" in capsys.readouterr().err
    assert main(["run", "--profile", "nope", "--", "true"]) == 2
    assert "no profile 'nope'" in capsys.readouterr().err


def test_profiles_command_lists_and_validates(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "2 profiles, valid" in out
    assert "locked" in out and "1 rules" in out and "memory 256m" in out
    profile_file.write_text("profiles:\n  a:\n    cpus: lots\n")
    assert main(["profiles", "--file", str(profile_file)]) == 2
    assert f"{profile_file}:3: profiles.a.cpus: must be a number" in capsys.readouterr().err


def test_network_policy_in_a_profile_requires_its_capability(profile_file: Path) -> None:
    backend = RecordingBackend(caps=FULL - {Capability.EGRESS_DOMAINS})
    policy = SecurityPolicy(network=NetworkPolicy.allowlist(domains=["example.org"]))
    with pytest.raises(UnsupportedCapabilityError, match="allowlist"):
        Sandbox("img", backend=backend, security_policy=policy)
    assert backend.configs == []
