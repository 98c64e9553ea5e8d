"""Host-side checks of agent frames (channel/protocol.py): nothing unchecked gets through."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentnest.channel.protocol import (
    PROTOCOL_VERSION,
    Hello,
    ProtocolViolation,
    RawExit,
    error_fields,
    parse_exit,
    parse_hello,
)

#: Marks a field to leave out of the frame.
_DROP = object()


def hello(**changes: Any) -> dict[str, Any]:
    h: dict[str, Any] = {
        "t": "hello",
        "v": PROTOCOL_VERSION,
        "agent": "0.4.0",
        "pid": 1234,
        "uid": 65532,
        "gid": 65532,
        "python": "3.12.1",
        "workspace": "/workspace",
        "subreaper": True,
        "caps": ["exec", "files"],
    }
    h.update(changes)
    return {k: v for k, v in h.items() if v is not _DROP}


def exit_frame(**changes: Any) -> dict[str, Any]:
    h: dict[str, Any] = {
        "t": "exit",
        "id": 3,
        "code": 0,
        "signal": None,
        "timed_out": False,
        "truncated": False,
        "cancelled": False,
        "duration": 0.25,
    }
    h.update(changes)
    return {k: v for k, v in h.items() if v is not _DROP}


# -- hello ---------------------------------------------------------------------


def test_parse_hello_fields() -> None:
    got = parse_hello(hello())
    assert got == Hello(
        version=PROTOCOL_VERSION,
        agent="0.4.0",
        pid=1234,
        uid=65532,
        python="3.12.1",
        capabilities=frozenset({"exec", "files"}),
    )


def test_parse_hello_without_caps_has_none() -> None:
    assert parse_hello(hello(caps=_DROP)).capabilities == frozenset()


def test_parse_hello_truncates_long_capability_names() -> None:
    got = parse_hello(hello(caps=["x" * 100]))
    assert got.capabilities == frozenset({"x" * 40})


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"t": "exit"}, id="not-hello"),
        pytest.param({"v": PROTOCOL_VERSION + 1}, id="newer-version"),
        pytest.param({"v": 0}, id="older-version"),
        pytest.param({"v": str(PROTOCOL_VERSION)}, id="str-version"),
        pytest.param({"v": True}, id="bool-version"),
        pytest.param({"v": float(PROTOCOL_VERSION)}, id="float-version"),
        pytest.param({"v": _DROP}, id="no-version"),
        pytest.param({"v": -1}, id="negative-version"),
        pytest.param({"caps": "exec"}, id="caps-str"),
        pytest.param({"caps": {"exec": True}}, id="caps-dict"),
        pytest.param({"caps": ["exec", 1]}, id="caps-non-str-item"),
        pytest.param({"caps": [None]}, id="caps-null-item"),
        pytest.param({"caps": ["c"] * 65}, id="too-many-caps"),
        pytest.param({"agent": "a" * 41}, id="long-agent-version"),
        pytest.param({"agent": 4}, id="int-agent-version"),
        pytest.param({"python": None}, id="null-python"),
        pytest.param({"pid": 0}, id="pid-zero"),
        pytest.param({"pid": True}, id="pid-bool"),
        pytest.param({"pid": (1 << 22) + 1}, id="pid-huge"),
        pytest.param({"uid": -1}, id="uid-negative"),
        pytest.param({"uid": "0"}, id="uid-str"),
    ],
)
def test_parse_hello_rejects(changes: dict[str, Any]) -> None:
    with pytest.raises(ProtocolViolation):
        parse_hello(hello(**changes))


def test_version_mismatch_message_names_both_versions() -> None:
    with pytest.raises(ProtocolViolation, match=rf"protocol {PROTOCOL_VERSION + 1}.*{PROTOCOL_VERSION}"):
        parse_hello(hello(v=PROTOCOL_VERSION + 1))


# -- exit ----------------------------------------------------------------------


def test_parse_exit_fields() -> None:
    assert parse_exit(exit_frame(code=137, signal=9, timed_out=True, duration=1.5)) == RawExit(
        code=137,
        signal=9,
        timed_out=True,
        truncated=False,
        cancelled=False,
        duration=1.5,
        spawn_error=False,
    )


@pytest.mark.parametrize("code", [-1, 0, 1, 126, 127, 255])
def test_parse_exit_code_in_range(code: int) -> None:
    assert parse_exit(exit_frame(code=code)).code == code


@pytest.mark.parametrize(
    "code",
    [256, -2, 1 << 40, True, False, "0", 0.0, None, [0]],
    ids=repr,
)
def test_parse_exit_code_out_of_range_or_wrong_type(code: Any) -> None:
    with pytest.raises(ProtocolViolation):
        parse_exit(exit_frame(code=code))


def test_parse_exit_code_missing() -> None:
    with pytest.raises(ProtocolViolation):
        parse_exit(exit_frame(code=_DROP))


@pytest.mark.parametrize("sig", [None, 1, 9, 15, 64, 127])
def test_parse_exit_signal_accepted(sig: int | None) -> None:
    assert parse_exit(exit_frame(signal=sig)).signal == sig


@pytest.mark.parametrize("sig", [0, -9, 128, 1000, True, "9", 9.0, [9]], ids=repr)
def test_parse_exit_bad_signal(sig: Any) -> None:
    with pytest.raises(ProtocolViolation):
        parse_exit(exit_frame(signal=sig))


@pytest.mark.parametrize("duration", [0, 0.0, 3, 12.5, 1e7 - 1])
def test_parse_exit_duration_accepted(duration: float) -> None:
    got = parse_exit(exit_frame(duration=duration)).duration
    assert got == duration
    assert isinstance(got, float)


@pytest.mark.parametrize(
    "duration",
    [-0.001, -1, math.nan, math.inf, -math.inf, 1e7, True, "1.0", None, [1]],
    ids=repr,
)
def test_parse_exit_bad_duration(duration: Any) -> None:
    with pytest.raises(ProtocolViolation):
        parse_exit(exit_frame(duration=duration))


def test_parse_exit_missing_duration_defaults_to_zero() -> None:
    assert parse_exit(exit_frame(duration=_DROP)).duration == 0.0


@pytest.mark.parametrize("value", [1, "yes", "true", [True], {"x": 1}], ids=repr)
def test_parse_exit_flags_are_true_only_for_json_true(value: Any) -> None:
    got = parse_exit(exit_frame(timed_out=value, truncated=value, cancelled=value, spawn_error=value))
    assert (got.timed_out, got.truncated, got.cancelled, got.spawn_error) == (False, False, False, False)


def test_parse_exit_spawn_error() -> None:
    assert parse_exit(exit_frame(code=127, spawn_error=True)).spawn_error is True


# -- errors --------------------------------------------------------------------


def test_error_fields_bounded() -> None:
    code, message = error_fields({"t": "error", "code": "c" * 100, "message": "m" * 5000})
    assert code == "c" * 40
    assert message == "m" * 2000


def test_error_fields_defaults_for_wrong_types() -> None:
    code, message = error_fields({"t": "error", "code": 5, "message": ["x"]})
    assert code == "unknown"
    assert message == "agent reported an error"
