"""The guard (guard.py): path normalisation, exec validation, approvals, redaction, events."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentnest.channel.protocol import RawExit
from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.errors import (
    AgentNestError,
    ConfigurationError,
    ExecutionError,
    FileAccessError,
    PolicyDeniedError,
    UnsupportedCapabilityError,
)
from agentnest.events import EventType, MemoryObserver
from agentnest.guard import MAX_ARG, ApprovalRequest, Guard, scrub_errors
from agentnest.policy import NetworkPolicy, SecurityPolicy
from agentnest.runtime.base import Capability
from agentnest.secrets import REDACTED, Secret

ALL_NETWORK = frozenset(
    {
        Capability.NETWORK_DENIED,
        Capability.RESOURCE_LIMITS,
        Capability.READ_ONLY_ROOT,
        Capability.NETWORK_OPEN,
        Capability.EGRESS_DOMAINS,
    }
)


def make_guard(
    hook: Any = None,
    observer: MemoryObserver | None = None,
    policy: SecurityPolicy | None = None,
    **config: Any,
) -> Guard:
    config.setdefault("image", "python:3.12-slim")
    return Guard(
        SandboxConfig(**config),
        policy or SecurityPolicy(),
        [observer] if observer is not None else [],
        hook,
    )


def exec_request(guard: Guard, argv: Any, **kwargs: Any) -> tuple[list[str], dict[str, str], Any, Any]:
    kwargs.setdefault("timeout", None)
    kwargs.setdefault("env", None)
    kwargs.setdefault("cwd", None)
    return guard.exec_request(argv, **kwargs)


def recorder(seen: list[ApprovalRequest], answer: bool) -> Callable[[ApprovalRequest], bool]:
    """An approval hook that records each request and gives ``answer``."""

    def hook(request: ApprovalRequest) -> bool:
        seen.append(request)
        return answer

    return hook


def raw_exit(**changes: Any) -> RawExit:
    fields: dict[str, Any] = {
        "code": 0,
        "signal": None,
        "timed_out": False,
        "truncated": False,
        "cancelled": False,
        "duration": 0.1,
    }
    fields.update(changes)
    return RawExit(**fields)


# -- workspace_path ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "rel"),
    [
        ("a.txt", "a.txt"),
        ("dir/a.txt", "dir/a.txt"),
        ("./a", "a"),
        ("a/../b", "b"),
        ("a//b", "a/b"),
        ("a/b/", "a/b"),
        (".", ""),
        ("/workspace", ""),
        ("/workspace/", ""),
        ("/workspace/a", "a"),
        ("/workspace/./x/", "x"),
        ("/workspace/a/../b", "b"),
        ("//workspace//a", "a"),
        ("///workspace/a", "a"),
        ("..foo", "..foo"),
        ("a/..b", "a/..b"),
    ],
)
def test_workspace_path_normalised(path: str, rel: str) -> None:
    assert make_guard().workspace_path(path) == rel


@pytest.mark.parametrize(
    "path",
    [
        "/workspace/../etc/passwd",
        "..",
        "../x",
        "a/../../x",
        "/etc/passwd",
        "/",
        "//",
        "///etc",
        "/workspacefoo/x",
        "/workspace-other",
        "/workspace/../workspace2/x",
        "//etc/passwd",
    ],
)
def test_workspace_path_outside_refused(path: str) -> None:
    with pytest.raises(FileAccessError) as info:
        make_guard().workspace_path(path)
    assert info.value.code == "outside_workspace"
    assert info.value.path == path


@pytest.mark.parametrize("path", ["", "a\x00b", "\x00", 5, None, b"a"], ids=repr)
def test_workspace_path_invalid(path: Any) -> None:
    with pytest.raises(FileAccessError) as info:
        make_guard().workspace_path(path)
    assert info.value.code == "invalid_path"


def test_workspace_path_with_another_workdir() -> None:
    guard = make_guard(workdir="/srv/ws")
    assert guard.workspace_path("/srv/ws/a") == "a"
    assert guard.workspace_path("a") == "a"
    with pytest.raises(FileAccessError):
        guard.workspace_path("/workspace/a")


@pytest.mark.parametrize("workdir", ["/srv//ws", "/srv/ws/."])
def test_workspace_path_with_unnormalised_workdir(workdir: str) -> None:
    try:
        guard = make_guard(workdir=workdir)
    except ConfigurationError:
        return  # refusing the spelling up front is a fix too
    assert guard.workspace_path("a") == "a"


def test_workdir_path() -> None:
    guard = make_guard()
    assert guard.workdir_path("sub") == "/workspace/sub"
    assert guard.workdir_path(".") == "/workspace"
    assert guard.workdir_path("/workspace/a/b") == "/workspace/a/b"
    with pytest.raises(FileAccessError):
        guard.workdir_path("..")


# -- exec_request validation --------------------------------------------------------


def test_exec_request_valid() -> None:
    args, env, cwd, timeout = exec_request(make_guard(), ("ls", "-l"), timeout=5, env={"A": "1"}, cwd="sub")
    assert args == ["ls", "-l"]
    assert env == {"A": "1"}
    assert cwd == "/workspace/sub"
    assert timeout == 5.0
    assert isinstance(timeout, float)


def test_exec_request_defaults() -> None:
    assert exec_request(make_guard(), ["true"]) == (["true"], {}, None, None)


@pytest.mark.parametrize(
    "argv",
    [[], (), "ls -l", "ls", b"ls", None, 5, ["ls", 1], ["ls", None], [b"ls"], ["a\x00b"], ["ls", "x\x00"]],
    ids=repr,
)
def test_exec_request_bad_argv(argv: Any) -> None:
    with pytest.raises(ConfigurationError):
        exec_request(make_guard(), argv)


def test_exec_request_argument_size_limit() -> None:
    guard = make_guard()
    assert exec_request(guard, ["echo", "x" * (MAX_ARG - 1)])[0][1] == "x" * (MAX_ARG - 1)
    with pytest.raises(ConfigurationError, match="128 KiB"):
        exec_request(guard, ["echo", "x" * MAX_ARG])
    # The kernel counts bytes, not characters.
    with pytest.raises(ConfigurationError):
        exec_request(guard, ["echo", "é" * (MAX_ARG // 2)])


@pytest.mark.parametrize(
    "timeout", [0, 0.0, -1, math.nan, math.inf, -math.inf, True, False, "5", [5]], ids=repr
)
def test_exec_request_bad_timeout(timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        exec_request(make_guard(), ["true"], timeout=timeout)


@pytest.mark.parametrize("timeout", [0.001, 1, 2.5, 86400])
def test_exec_request_good_timeout(timeout: float) -> None:
    assert exec_request(make_guard(), ["true"], timeout=timeout)[3] == float(timeout)


@pytest.mark.parametrize(
    "env",
    [{"": "x"}, {"A=B": "x"}, {"A\x00": "x"}, {1: "x"}, {"A": 5}, {"A": None}, {"A": "a\x00b"}],
    ids=repr,
)
def test_exec_request_bad_env(env: dict[Any, Any]) -> None:
    with pytest.raises(ConfigurationError):
        exec_request(make_guard(), ["true"], env=env)


def test_exec_request_bad_cwd() -> None:
    with pytest.raises(FileAccessError) as info:
        exec_request(make_guard(), ["true"], cwd="../etc")
    assert info.value.code == "outside_workspace"


def test_validation_errors_are_agentnest_errors() -> None:
    with pytest.raises(AgentNestError):
        exec_request(make_guard(), [])
    with pytest.raises(AgentNestError):
        make_guard().workspace_path("/etc")


# -- approvals ---------------------------------------------------------------------


def test_no_hook_approves_without_events_about_approval() -> None:
    obs = MemoryObserver()
    exec_request(make_guard(observer=obs), ["true"])
    assert obs.types() == ["exec.started"]


def test_hook_sees_the_request() -> None:
    seen: list[ApprovalRequest] = []

    def hook(request: ApprovalRequest) -> bool:
        seen.append(request)
        return True

    obs = MemoryObserver()
    guard = make_guard(hook, obs)
    guard.sandbox_id = "sb-1"
    exec_request(guard, ["ls", "-l"], cwd="sub")
    assert len(seen) == 1
    assert seen[0].kind == "exec"
    assert seen[0].sandbox_id == "sb-1"
    assert seen[0].details["argv"] == ["ls", "-l"]
    assert seen[0].details["cwd"] == "/workspace/sub"
    with pytest.raises(TypeError):
        seen[0].details["argv"] = []  # type: ignore[index]
    assert obs.types() == ["approval.requested", "approval.granted", "exec.started"]
    assert obs.events[0].data["command"] == "ls -l"


@pytest.mark.parametrize("answer", [False, None, 0, "", [], {}], ids=repr)
def test_falsy_answer_denies(answer: Any) -> None:
    obs = MemoryObserver()
    guard = make_guard(lambda request: answer, obs)
    with pytest.raises(PolicyDeniedError) as info:
        exec_request(guard, ["rm", "-rf", "/"])
    assert not isinstance(info.value, ValueError)
    assert isinstance(info.value.request, ApprovalRequest)
    assert info.value.request.kind == "exec"
    assert obs.types() == ["approval.requested", "approval.denied", "policy.denied"]  # no exec.started
    denied = obs.events[-1]
    assert denied.type is EventType.POLICY_DENIED
    assert denied.data["kind"] == "exec"
    assert "refused" in denied.data["reason"]


def test_hook_raising_denies() -> None:
    obs = MemoryObserver()

    def hook(request: ApprovalRequest) -> bool:
        raise RuntimeError("approval service down")

    with pytest.raises(PolicyDeniedError, match="RuntimeError"):
        exec_request(make_guard(hook, obs), ["true"])
    assert obs.types() == ["approval.requested", "approval.denied", "policy.denied"]
    assert "approval service down" in obs.events[-1].data["reason"]


@pytest.mark.parametrize("answer", [True, False])
def test_async_hook_on_the_sync_guard_is_awaited(answer: bool) -> None:
    asked: list[str] = []

    async def hook(request: ApprovalRequest) -> bool:
        asked.append(request.kind)
        return answer

    guard = make_guard(hook)
    if answer:
        exec_request(guard, ["true"])
    else:
        with pytest.raises(PolicyDeniedError, match="refused"):
            exec_request(guard, ["true"])
    assert asked == ["exec"]


def test_hook_that_never_answers_denies_after_the_timeout() -> None:
    release = threading.Event()
    obs = MemoryObserver()

    def hang(request: ApprovalRequest) -> bool:
        release.wait(30)
        return True

    guard = Guard(
        SandboxConfig(image="img"),
        SecurityPolicy(approval_timeout=0.2),
        observers=[obs],
        approval_hook=hang,
    )
    started = time.monotonic()
    try:
        with pytest.raises(PolicyDeniedError, match=r"did not answer within 0.2s"):
            exec_request(guard, ["true"])
    finally:
        release.set()
    assert time.monotonic() - started < 5
    assert obs.types() == ["approval.requested", "approval.denied", "policy.denied"]


def test_async_hook_that_never_answers_denies_after_the_timeout() -> None:
    async def hang(request: ApprovalRequest) -> bool:
        await asyncio.sleep(30)
        return True

    guard = Guard(SandboxConfig(image="img"), SecurityPolicy(approval_timeout=0.2), approval_hook=hang)
    with pytest.raises(PolicyDeniedError, match="did not answer"):
        exec_request(guard, ["true"])


def test_policy_hook_and_sandbox_hook_must_both_allow() -> None:
    asked: list[str] = []

    def policy_hook(request: ApprovalRequest) -> bool:
        asked.append("policy")
        return request.kind != "file.remove"

    def sandbox_hook(request: ApprovalRequest) -> bool:
        asked.append("sandbox")
        return request.kind != "file.write"

    guard = Guard(
        SandboxConfig(image="img"), SecurityPolicy(approval_hook=policy_hook), approval_hook=sandbox_hook
    )
    guard.approve("file.read", {"path": "/workspace/a"})
    assert asked == ["policy", "sandbox"]
    asked.clear()
    with pytest.raises(PolicyDeniedError):
        guard.approve("file.remove", {"path": "/workspace/a"})
    assert asked == ["policy"]  # the first refusal decides; the second hook is not asked
    asked.clear()
    with pytest.raises(PolicyDeniedError):
        guard.approve("file.write", {"path": "/workspace/a"})
    assert asked == ["policy", "sandbox"]


def test_a_hook_that_is_not_callable_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="callable"):
        Guard(SandboxConfig(image="img"), SecurityPolicy(), approval_hook="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="callable"):
        SecurityPolicy(approval_hook="yes")  # type: ignore[arg-type]


def test_denial_message_and_reason_are_redacted() -> None:
    obs = MemoryObserver()

    def hook(request: ApprovalRequest) -> bool:
        raise RuntimeError("cannot approve with key tok-abc123")

    guard = make_guard(hook, obs, environment={"TOKEN": Secret("tok-abc123")})
    with pytest.raises(PolicyDeniedError) as info:
        exec_request(guard, ["true"])
    assert "tok-abc123" not in str(info.value)
    assert REDACTED in str(info.value)
    assert all("tok-abc123" not in repr(e.to_dict()) for e in obs.events)


def test_approval_argv_is_redacted() -> None:
    seen: list[ApprovalRequest] = []
    guard = make_guard(recorder(seen, True), environment={"TOKEN": Secret("tok-abc123")})
    exec_request(guard, ["curl", "-H", "Authorization: tok-abc123"])
    assert seen[0].details["argv"] == ["curl", "-H", f"Authorization: {REDACTED}"]


# -- secrets and redaction ----------------------------------------------------------


def test_config_secrets_are_redacted_from_results_and_events() -> None:
    obs = MemoryObserver()
    guard = make_guard(observer=obs, environment={"TOKEN": Secret("tok-abc123")})
    args, _, _, _ = exec_request(guard, ["echo", "tok-abc123"])
    assert args == ["echo", "tok-abc123"]  # the command itself gets the real value
    result = guard.finish_exec(raw_exit(), b"tok-abc123\n", b"err tok-abc123", False)
    assert result.stdout == f"{REDACTED}\n"
    assert result.stderr == f"err {REDACTED}"
    started = obs.events[0]
    assert started.type is EventType.EXEC_STARTED
    assert started.data["argv"] == ["echo", REDACTED]


def test_per_call_secret_is_injected_and_redacted_later() -> None:
    obs = MemoryObserver()
    guard = make_guard(observer=obs)
    _, env, _, _ = exec_request(guard, ["env"], env={"API_KEY": Secret("call-secret-42"), "PLAIN": "x"})
    assert env == {"API_KEY": "call-secret-42", "PLAIN": "x"}
    assert "call-secret-42" in guard.secrets
    # Later output, events and streams of this sandbox never show it.
    result = guard.finish_exec(raw_exit(), b"API_KEY=call-secret-42\n", b"", False)
    assert result.stdout == f"API_KEY={REDACTED}\n"
    exec_request(guard, ["echo", "call-secret-42"])
    assert obs.events[-1].data["argv"] == ["echo", REDACTED]
    decoder = guard.stream_decoder()
    pieces = [decoder.feed(1, b"key=call-se"), decoder.feed(1, b"cret-42 done")]
    text = "".join(c.data for c in pieces if c is not None) + "".join(c.data for c in decoder.flush())
    assert text == f"key={REDACTED} done"


def test_add_secret_ignores_empty_and_duplicates() -> None:
    guard = make_guard()
    guard.add_secret("")
    guard.add_secret("abc")
    guard.add_secret("abc")
    assert guard.secrets == ("abc",)


def test_denial_reason_is_redacted() -> None:
    obs = MemoryObserver()
    guard = make_guard(observer=obs, environment={"TOKEN": Secret("tok-abc123")})
    with pytest.raises(PolicyDeniedError):
        guard.deny("exec", "argv contained tok-abc123")
    assert obs.events[0].data["reason"] == f"argv contained {REDACTED}"


# -- finish_exec and streams --------------------------------------------------------


def test_finish_exec_result_and_event() -> None:
    obs = MemoryObserver()
    guard = make_guard(observer=obs)
    result = guard.finish_exec(raw_exit(code=3, signal=None, duration=1.5), b"o\xff", b"e", True)
    assert (result.stdout, result.stderr, result.exit_code, result.truncated) == ("o\ufffd", "e", 3, True)
    assert result.duration == 1.5
    assert obs.types() == ["exec.finished"]
    assert obs.events[0].data["exit_code"] == 3


def test_finish_exec_timed_out_event() -> None:
    obs = MemoryObserver()
    result = make_guard(observer=obs).finish_exec(
        raw_exit(code=137, signal=9, timed_out=True, truncated=True), b"", b"", False
    )
    assert result.timed_out
    assert result.truncated
    assert result.signal == 9
    assert obs.types() == ["exec.timed_out"]


def test_stream_decoder_joins_split_utf8() -> None:
    decoder = make_guard().stream_decoder()
    data = "grüße ✓".encode()
    out = [decoder.feed(1, data[i : i + 1]) for i in range(len(data))]
    out.extend(decoder.flush())
    chunks = [c for c in out if c is not None]
    assert "".join(c.data for c in chunks) == "grüße ✓"
    assert {c.stream for c in chunks} == {"stdout"}


def test_stream_decoder_keeps_streams_apart() -> None:
    decoder = make_guard(environment={"T": Secret("secret-xyz")}).stream_decoder()
    a = decoder.feed(1, b"out secret-")
    b = decoder.feed(2, b"err")
    c = decoder.feed(1, b"xyz")
    rest = decoder.flush()
    stdout = "".join(x.data for x in (a, c, *rest) if x is not None and x.stream == "stdout")
    stderr = "".join(x.data for x in (b, *rest) if x is not None and x.stream == "stderr")
    assert stdout == f"out {REDACTED}"
    assert stderr == "err"


# -- check_create ------------------------------------------------------------------


def test_check_create_ok() -> None:
    make_guard().check_create(
        frozenset({Capability.NETWORK_DENIED, Capability.RESOURCE_LIMITS, Capability.READ_ONLY_ROOT})
    )


def test_check_create_needs_the_network_capability() -> None:
    with pytest.raises(UnsupportedCapabilityError):
        make_guard().check_create(frozenset())
    allowlist = make_guard(network=NetworkPolicy.allowlist(["example.com"]))
    with pytest.raises(UnsupportedCapabilityError):
        allowlist.check_create(
            frozenset(
                {
                    Capability.NETWORK_DENIED,
                    Capability.RESOURCE_LIMITS,
                    Capability.READ_ONLY_ROOT,
                    Capability.NETWORK_OPEN,
                }
            )
        )
    allowlist.check_create(ALL_NETWORK)


def test_check_create_gpus_need_the_capability() -> None:
    guard = make_guard(limits=ResourceLimits(gpus=1))
    with pytest.raises(UnsupportedCapabilityError):
        guard.check_create(ALL_NETWORK)
    guard.check_create(ALL_NETWORK | {Capability.GPU})


def test_check_create_image_policy_denies_and_emits() -> None:
    obs = MemoryObserver()
    guard = make_guard(observer=obs, policy=SecurityPolicy(require_image_digest=True))
    with pytest.raises(PolicyDeniedError, match="digest"):
        guard.check_create(ALL_NETWORK)
    assert obs.types() == ["policy.denied"]
    assert obs.events[0].data["kind"] == "sandbox.create"


def test_check_create_read_only_root_policy() -> None:
    guard = make_guard(read_only_root=False)
    with pytest.raises(PolicyDeniedError, match="read-only"):
        guard.check_create(ALL_NETWORK)
    relaxed = make_guard(read_only_root=False, policy=SecurityPolicy(read_only_root=False))
    relaxed.check_create(ALL_NETWORK)


def test_check_create_asks_approval_for_network() -> None:
    seen: list[ApprovalRequest] = []
    guard = make_guard(recorder(seen, False), network=NetworkPolicy.open())
    with pytest.raises(PolicyDeniedError):
        guard.check_create(ALL_NETWORK)
    assert seen[0].kind == "network"
    assert seen[0].details["mode"] == "open"
    # A denied network asks nobody.
    seen.clear()
    make_guard(recorder(seen, False)).check_create(ALL_NETWORK)
    assert seen == []


# -- secrets in exception messages ---------------------------------------------------


def test_scrub_redacts_message_and_text_attributes() -> None:
    guard = make_guard(environment={"TOKEN": Secret("tok-abc123")})
    exc = FileAccessError(
        "no such file: /workspace/tok-abc123", path="/workspace/tok-abc123", code="not_found"
    )
    guard.scrub(exc)
    assert "tok-abc123" not in str(exc) and "tok-abc123" not in (exc.path or "")
    assert REDACTED in str(exc)
    assert exc.code == "not_found"  # codes are ours, never redacted


def test_scrub_errors_wraps_methods_generators_and_keeps_aliases() -> None:
    @scrub_errors
    class Face:
        def __init__(self) -> None:
            self._guard = make_guard(environment={"TOKEN": Secret("tok-abc123")})

        def fail(self) -> None:
            raise ExecutionError("stderr said tok-abc123")

        def chunks(self) -> Iterator[int]:
            yield 1
            raise FileAccessError("gone: tok-abc123", path="tok-abc123")

        def other(self) -> ValueError:
            return ValueError("tok-abc123")  # not raised, not ours: untouched

        alias = fail

    face = Face()
    with pytest.raises(ExecutionError) as info:
        face.fail()
    assert str(info.value) == f"stderr said {REDACTED}"
    with pytest.raises(FileAccessError) as err:
        list(face.chunks())
    assert "tok-abc123" not in str(err.value) and err.value.path == REDACTED
    assert Face.alias is Face.fail
    assert str(face.other()) == "tok-abc123"
