"""Frozen, validated configuration (config.py): sizes, limits, SandboxConfig, results."""

from __future__ import annotations

import dataclasses
import math
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any

import pytest

from agentnest.config import (
    ExecutionResult,
    FileInfo,
    GiB,
    KiB,
    MiB,
    ResourceLimits,
    SandboxConfig,
    format_size,
    parse_size,
)
from agentnest.errors import AgentNestError, ConfigurationError, ExecutionError, ExecutionTimeoutError
from agentnest.policy import NetworkPolicy
from agentnest.secrets import Secret

TiB = 1024 * GiB


def refused(match: str | None = None) -> AbstractContextManager[pytest.ExceptionInfo[ConfigurationError]]:
    """Every refusal is a ConfigurationError, hence an AgentNestError and a ValueError."""
    assert issubclass(ConfigurationError, AgentNestError)
    assert issubclass(ConfigurationError, ValueError)
    return pytest.raises(ConfigurationError, match=match)


# -- parse_size ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512m", 512 * MiB),
        ("512M", 512 * MiB),
        ("1g", GiB),
        ("2G", 2 * GiB),
        ("1.5GiB", int(1.5 * GiB)),
        ("1.5g", int(1.5 * GiB)),
        ("2gb", 2 * GiB),
        ("2 GB", 2 * GiB),
        (" 64k ", 64 * KiB),
        ("10KiB", 10 * KiB),
        ("1t", TiB),
        ("1024", 1024),
        ("1b", 1),
        (4096, 4096),
        (1, 1),
    ],
)
def test_parse_size(text: int | str, expected: int) -> None:
    assert parse_size(text, "memory") == expected


@pytest.mark.parametrize(
    "value",
    ["", "abc", "m", "-1m", "0", "0m", "0.1", "1x", "1e9", "1.5.2g", "1 g g", "12pb", 0, -5, True, False],
    ids=repr,
)
def test_parse_size_refuses(value: Any) -> None:
    with refused():
        parse_size(value, "memory")


@pytest.mark.parametrize("value", [1.5, None, b"1g", [1]], ids=repr)
def test_parse_size_refuses_other_types(value: Any) -> None:
    with refused("memory"):
        parse_size(value, "memory")


def test_parse_size_error_names_the_setting() -> None:
    with refused("workspace_size"):
        parse_size("lots", "workspace_size")


@pytest.mark.parametrize("n", [GiB, 3 * GiB, 512 * MiB, 64 * KiB, 1000])
def test_format_size_round_trips(n: int) -> None:
    assert parse_size(format_size(n), "x") == n


# -- ResourceLimits --------------------------------------------------------------


def test_default_limits_are_valid() -> None:
    limits = ResourceLimits()
    assert limits.memory == 512 * MiB
    assert ResourceLimits.build() == limits


def test_build_parses_sizes() -> None:
    limits = ResourceLimits.build(memory="2g", cpus=2, pids=100, workspace="1g", scratch="128m", gpus=1)
    assert (limits.memory, limits.cpus, limits.pids, limits.workspace, limits.scratch, limits.gpus) == (
        2 * GiB,
        2,
        100,
        GiB,
        128 * MiB,
        1,
    )


@pytest.mark.parametrize(
    "memory", [16 * MiB, 32 * MiB - 1, 1025 * GiB, 2 * TiB, -1, 0, True, "1p", 512.0 * MiB], ids=repr
)
def test_memory_out_of_range(memory: Any) -> None:
    with refused("memory"):
        ResourceLimits(memory=memory, workspace=MiB, scratch=MiB)


def test_absurd_memory_via_build() -> None:
    with refused("memory"):
        ResourceLimits.build(memory="2t")


@pytest.mark.parametrize("cpus", [math.nan, math.inf, -math.inf, 0, 0.0, 0.001, -1, 513, True, "1"], ids=repr)
def test_cpus_out_of_range(cpus: Any) -> None:
    with refused("cpus"):
        ResourceLimits(cpus=cpus)


@pytest.mark.parametrize("cpus", [0.01, 0.5, 1, 2.5, 512])
def test_cpus_in_range(cpus: float) -> None:
    assert ResourceLimits(cpus=cpus).cpus == cpus


@pytest.mark.parametrize("pids", [0, 7, 65537, -1, True, 8.0, "256"], ids=repr)
def test_pids_out_of_range(pids: Any) -> None:
    with refused("pids"):
        ResourceLimits(pids=pids)


@pytest.mark.parametrize("pids", [8, 65536])
def test_pids_bounds_inclusive(pids: int) -> None:
    assert ResourceLimits(pids=pids).pids == pids


@pytest.mark.parametrize("gpus", [-1, 65, True, 1.0], ids=repr)
def test_gpus_out_of_range(gpus: Any) -> None:
    with refused("gpus"):
        ResourceLimits(gpus=gpus)


@pytest.mark.parametrize("field", ["workspace", "scratch"])
def test_filesystems_need_at_least_a_mebibyte(field: str) -> None:
    sizes: dict[str, Any] = {field: MiB - 1}
    with refused(field):
        ResourceLimits(**sizes)


def test_workspace_and_scratch_must_leave_memory_for_processes() -> None:
    with refused("memory") as info:
        ResourceLimits.build(memory="256m", workspace="256m", scratch="64m")
    message = str(info.value)
    assert "workspace" in message
    assert "256m" in message


def test_workspace_and_scratch_boundary() -> None:
    # Exactly 32 MiB left over is enough; one byte less is not.
    ok = ResourceLimits(memory=512 * MiB, workspace=416 * MiB, scratch=64 * MiB)
    assert ok.workspace == 416 * MiB
    with refused("memory"):
        ResourceLimits(memory=512 * MiB, workspace=416 * MiB + 1, scratch=64 * MiB)


def test_limits_are_frozen_and_replace_revalidates() -> None:
    limits = ResourceLimits()
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.memory = GiB  # type: ignore[misc]
    with refused("cpus"):
        dataclasses.replace(limits, cpus=math.nan)


# -- SandboxConfig ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "python:3.12-slim",
        "alpine",
        "ghcr.io/acme/tool:1.0",
        "localhost:5000/x/y@sha256:" + "a" * 64,
    ],
)
def test_image_accepted(image: str) -> None:
    assert SandboxConfig(image=image).image == image


@pytest.mark.parametrize("image", ["", "   ", "python 3", "py\tthon", "python:3\n", None, 5], ids=repr)
def test_image_refused(image: Any) -> None:
    with refused("image"):
        SandboxConfig(image=image)


@pytest.mark.parametrize("lifetime", [1, 1.0, 300, 604800])
def test_lifetime_in_range(lifetime: float) -> None:
    assert SandboxConfig(image="alpine", lifetime=lifetime).lifetime == lifetime


@pytest.mark.parametrize("lifetime", [0, 0.5, -1, 604801, math.nan, math.inf, True, "300", None], ids=repr)
def test_lifetime_out_of_range(lifetime: Any) -> None:
    with refused("timeout"):
        SandboxConfig(image="alpine", lifetime=lifetime)


def test_environment_is_frozen_and_copied() -> None:
    env: dict[str, str | Secret] = {"A": "1", "TOKEN": Secret("tok-123")}
    config = SandboxConfig(image="alpine", environment=env)
    env["B"] = "2"
    assert isinstance(config.environment, MappingProxyType)
    assert set(config.environment) == {"A", "TOKEN"}
    with pytest.raises(TypeError):
        config.environment["C"] = "3"  # type: ignore[index]


def test_secrets_property_lists_secret_values_only() -> None:
    config = SandboxConfig(image="alpine", environment={"A": "plain", "T": Secret("tok-123")})
    assert config.secrets == ("tok-123",)


def test_environment_none_is_empty() -> None:
    assert dict(SandboxConfig(image="alpine", environment=None).environment) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "1ABC", "A-B", "A=B", "A B", "ÄB", "A\x00", "a.b"], ids=repr)
def test_environment_name_invalid(name: str) -> None:
    with refused("invalid"):
        SandboxConfig(image="alpine", environment={name: "x"})


@pytest.mark.parametrize("name", ["_X", "a", "PATH", "X1_Y2"])
def test_environment_name_valid(name: str) -> None:
    assert name in SandboxConfig(image="alpine", environment={name: "x"}).environment


@pytest.mark.parametrize("name", ["AGENTNEST_", "AGENTNEST_EXEC", "AGENTNEST_WORKSPACE"])
def test_environment_name_reserved(name: str) -> None:
    with refused("reserved"):
        SandboxConfig(image="alpine", environment={name: "x"})


def test_environment_non_str_name() -> None:
    with refused():
        SandboxConfig(image="alpine", environment={1: "x"})  # type: ignore[dict-item]


@pytest.mark.parametrize("value", ["a\x00b", Secret("a\x00b")], ids=["str", "secret"])
def test_environment_value_with_nul(value: str | Secret) -> None:
    with refused("NUL"):
        SandboxConfig(image="alpine", environment={"A": value})


@pytest.mark.parametrize("value", [5, None, b"x", ["x"]], ids=repr)
def test_environment_value_wrong_type(value: Any) -> None:
    with refused():
        SandboxConfig(image="alpine", environment={"A": value})


def test_environment_not_a_mapping() -> None:
    with refused("mapping"):
        SandboxConfig(image="alpine", environment=[("A", "1")])  # type: ignore[arg-type]


@pytest.mark.parametrize("user", ["1000", "1000:1000", "65532:65532", "1"])
def test_user_accepted(user: str) -> None:
    assert SandboxConfig(image="alpine", user=user).user == user


@pytest.mark.parametrize(
    "user", ["0", "0:0", "0:1000", "root", "", "-1", "1000:", ":1000", "1000:x", "1 000"]
)
def test_user_refused(user: str) -> None:
    with refused("user"):
        SandboxConfig(image="alpine", user=user)


@pytest.mark.parametrize("user", ["00", "000:0", "00:65532"])
def test_user_root_with_leading_zeros_refused(user: str) -> None:
    with refused("user"):
        SandboxConfig(image="alpine", user=user)


def test_user_with_trailing_newline_refused() -> None:
    with refused("user"):
        SandboxConfig(image="alpine", user="1000\n")


@pytest.mark.parametrize("changes", [{"user": 1000}, {"user": None}, {"labels": 5}], ids=repr)
def test_wrong_types_raise_configuration_error(changes: dict[str, Any]) -> None:
    with refused():
        SandboxConfig(image="alpine", **changes)


@pytest.mark.parametrize(
    "workdir", ["workspace", "/workspace/../etc", "/", "/proc", "/etc/", "/usr", "//", 5], ids=repr
)
def test_workdir_refused(workdir: Any) -> None:
    with refused("workdir"):
        SandboxConfig(image="alpine", workdir=workdir)


def test_network_and_limits_types_checked() -> None:
    with refused("network"):
        SandboxConfig(image="alpine", network="open")  # type: ignore[arg-type]
    with refused("limits"):
        SandboxConfig(image="alpine", limits={"memory": "1g"})  # type: ignore[arg-type]


def test_config_defaults() -> None:
    config = SandboxConfig(image="alpine")
    assert config.network == NetworkPolicy.denied()
    assert config.limits == ResourceLimits()
    assert config.read_only_root is True
    assert config.user.split(":")[0] != "0"
    assert config.workdir == "/workspace"


def test_config_is_frozen_and_replace_revalidates() -> None:
    config = SandboxConfig(image="alpine", labels={"team": "a"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.image = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.labels["x"] = "y"  # type: ignore[index]
    with refused("user"):
        dataclasses.replace(config, user="0")


# -- ExecutionResult -------------------------------------------------------------------


def result(**changes: Any) -> ExecutionResult:
    fields: dict[str, Any] = {
        "command": "true",
        "stdout": "out\n",
        "stderr": "",
        "exit_code": 0,
        "duration": 0.5,
    }
    fields.update(changes)
    return ExecutionResult(**fields)


def test_result_ok_and_check_return_self() -> None:
    r = result()
    assert r.ok
    assert r.check() is r


def test_result_output_is_stdout_then_stderr() -> None:
    assert result(stdout="a\n", stderr="b\n").output == "a\nb\n"


def test_result_nonzero_exit() -> None:
    r = result(exit_code=2, stderr="warning\nfatal: no such thing\n")
    assert not r.ok
    with pytest.raises(ExecutionError) as info:
        r.check()
    assert info.value.result is r
    assert not isinstance(info.value, ExecutionTimeoutError)
    assert "2" in str(info.value)
    assert "fatal: no such thing" in str(info.value)
    assert "warning" not in str(info.value)


def test_result_nonzero_exit_without_stderr() -> None:
    with pytest.raises(ExecutionError, match="exited with 1"):
        result(exit_code=1, stderr="").check()


def test_result_timed_out() -> None:
    r = result(exit_code=0, timed_out=True, duration=2.0)
    assert not r.ok
    with pytest.raises(ExecutionTimeoutError) as info:
        r.check()
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, ExecutionError)
    assert isinstance(info.value, AgentNestError)
    assert info.value.result is r


def test_result_killed_by_signal_is_not_ok() -> None:
    r = result(exit_code=137, signal=9)
    assert not r.ok
    with pytest.raises(ExecutionError):
        r.check()


def test_result_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        result().exit_code = 1  # type: ignore[misc]


def test_file_info_is_dir() -> None:
    assert FileInfo("d", "dir", 0, 0o755, 0.0).is_dir
    assert not FileInfo("f", "file", 1, 0o644, 0.0).is_dir
    assert not FileInfo("l", "symlink", 1, 0o777, 0.0).is_dir
