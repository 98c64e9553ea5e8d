"""Host-side checks of agent frames (channel/protocol.py): nothing unchecked gets through."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentnest.channel.protocol import (
    MAX_DISPLAY_ITEMS,
    PROTOCOL_VERSION,
    Collected,
    ExecFrames,
    Hello,
    ProtocolViolation,
    RawDisplay,
    RawExit,
    RawSessionRun,
    RawValue,
    RunFrames,
    SessionBusy,
    SessionInfo,
    check_opened,
    check_written,
    error_fields,
    parse_exit,
    parse_hello,
    raise_if_error,
    session_error,
    session_reply,
    wait_time,
)
from agentnest.errors import ChannelError, FileAccessError, FileTooLargeError, SessionLostError

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


# -- violations ----------------------------------------------------------------


def test_a_violation_closes_the_channel_with_its_reason_and_tells_the_caller() -> None:
    exc = ProtocolViolation("output frame with an invalid fd")
    assert str(exc) == "output frame with an invalid fd"
    assert exc.reason == "protocol violation: output frame with an invalid fd"
    assert exc.error == "the agent broke the protocol: output frame with an invalid fd"
    custom = ProtocolViolation("x", reason="r", error="e")
    assert (str(custom), custom.reason, custom.error) == ("x", "r", "e")


# -- waits: deadline and heartbeat -----------------------------------------------


def test_wait_time_without_a_deadline_or_stall_waits_forever() -> None:
    assert wait_time(None, 1e6, None, False, "x") is None


def test_wait_time_waits_until_the_deadline() -> None:
    assert wait_time(2.5, 100.0, None, False, "x") == 2.5


@pytest.mark.parametrize("left", [0.0, -0.001, -5.0])
def test_wait_time_a_missed_deadline_is_a_violation(left: float) -> None:
    with pytest.raises(ProtocolViolation) as caught:
        wait_time(left, 0.0, None, False, "the command's result")
    assert caught.value.reason == "the agent stopped answering"
    assert (
        caught.value.error == "the agent did not deliver the command's result in time; the channel was reset"
    )


def test_wait_time_waits_for_the_next_heartbeat_or_the_deadline_whichever_first() -> None:
    assert wait_time(None, 3.0, 10.0, False, "x") == 7.0
    assert wait_time(2.0, 3.0, 10.0, False, "x") == 2.0


@pytest.mark.parametrize("quiet", [10.0, 10.5, 1e9])
def test_wait_time_no_heartbeat_for_the_stall_time_is_a_violation(quiet: float) -> None:
    with pytest.raises(ProtocolViolation) as caught:
        wait_time(None, quiet, 10.0, False, "the session's result")
    assert caught.value.reason == "the agent stopped answering"
    assert caught.value.error.startswith(f"the channel stalled for {quiet:.0f}s (no heartbeat)")
    assert "the session's result" in caught.value.error


def test_wait_time_a_held_channel_is_not_stalled_but_still_has_its_deadline() -> None:
    assert wait_time(None, 1e6, 10.0, True, "x") == 1.0  # look again in a second
    assert wait_time(0.25, 1e6, 10.0, True, "x") == 0.25
    with pytest.raises(ProtocolViolation, match="in time"):
        wait_time(0.0, 1e6, 10.0, True, "x")


def test_wait_time_the_deadline_wins_over_a_stall() -> None:
    with pytest.raises(ProtocolViolation, match="did not deliver"):
        wait_time(-1.0, 1e6, 10.0, False, "x")


# -- error replies ---------------------------------------------------------------


def error(code: Any, message: Any = "m") -> dict[str, Any]:
    return {"t": "error", "id": 3, "code": code, "message": message}


def test_raise_if_error_lets_any_other_frame_pass() -> None:
    raise_if_error({"t": "done", "code": "not_found"}, "p")


@pytest.mark.parametrize("code", ["protocol", "internal", "unknown", "invalid", 7, None])
def test_raise_if_error_agent_refusals_are_channel_errors(code: Any) -> None:
    with pytest.raises(ChannelError, match="the agent refused the request") as caught:
        raise_if_error(error(code), "p")
    assert not isinstance(caught.value, FileAccessError)


def test_raise_if_error_too_large_names_the_path() -> None:
    with pytest.raises(FileTooLargeError) as caught:
        raise_if_error(error("too_large", "over 1 MiB"), "big.bin")
    assert caught.value.path == "big.bin"


@pytest.mark.parametrize("code", ["not_found", "symlink", "builtins.SystemExit", "x" * 100])
def test_raise_if_error_any_other_code_is_a_file_error_never_a_class(code: str) -> None:
    with pytest.raises(FileAccessError) as caught:
        raise_if_error(error(code), "p")
    assert type(caught.value) is FileAccessError
    assert caught.value.code == code[:40]


@pytest.mark.parametrize("code", ["session_lost", "no_session", "spawn", "too_many_sessions"])
def test_session_error_lost_sessions(code: str) -> None:
    assert isinstance(session_error(error(code)), SessionLostError)


def test_session_error_busy_and_the_rest() -> None:
    busy = session_error(error("busy", "runs other code"))
    assert isinstance(busy, SessionBusy) and isinstance(busy, ChannelError)
    other = session_error(error("os.system"))
    assert type(other) is ChannelError and "(os.system)" in str(other)


# -- session replies -------------------------------------------------------------


def opened(**changes: Any) -> dict[str, Any]:
    h: dict[str, Any] = {"t": "done", "id": 4, "session": 2, "pid": 50, "python": "3.12.1"}
    h.update(changes)
    return {k: v for k, v in h.items() if v is not _DROP}


def test_session_reply_passes_done_and_raises_errors() -> None:
    assert session_reply(opened(), "session.open") == opened()
    with pytest.raises(SessionLostError):
        session_reply(error("no_session"), "session.reset")


def test_session_reply_any_other_frame_is_a_violation() -> None:
    with pytest.raises(ProtocolViolation) as caught:
        session_reply({"t": "out", "id": 4, "fd": 1}, "session.open")
    assert caught.value.reason == "protocol violation: 'out' frame in reply to 'session.open'"
    assert caught.value.error == "the agent answered 'session.open' with a 'out' frame"


def test_check_opened_the_session_asked_for() -> None:
    assert check_opened(opened(), reset=None, name=None) == SessionInfo(session=2, pid=50, python="3.12.1")
    assert check_opened(opened(name="nb"), reset=None, name="nb").name == "nb"
    assert check_opened(opened(session=9), reset=9, name="ignored on a reset").session == 9


def test_check_opened_another_session_is_a_violation() -> None:
    with pytest.raises(ProtocolViolation) as caught:
        check_opened(opened(session=3), reset=2, name=None)
    assert caught.value.reason == "protocol violation: the agent reset another session"
    assert caught.value.error == "the agent broke the protocol: it reset another session"
    with pytest.raises(ProtocolViolation, match="of another name"):
        check_opened(opened(name="other"), reset=None, name="nb")
    with pytest.raises(ProtocolViolation, match="of another name"):
        check_opened(opened(name="nb"), reset=None, name=None)
    with pytest.raises(ProtocolViolation, match="'pid' is invalid"):
        check_opened(opened(pid=0), reset=None, name=None)  # and every field is checked


# -- writes, reads and listings ---------------------------------------------------


def test_check_written_needs_every_byte() -> None:
    check_written({"t": "done", "size": 5}, "f", 5)
    for size in (4, 6, "5", None, 5.0):
        with pytest.raises(ChannelError, match="bytes written for 'f', expected 5"):
            check_written({"t": "done", "size": size}, "f", 5)
    with pytest.raises(FileAccessError):
        check_written(error("read_only"), "f", 5)


def data(body: bytes) -> tuple[dict[str, Any], bytes]:
    return {"t": "data", "id": 5}, body


def test_collected_read_keeps_the_data_and_checks_the_size() -> None:
    read = Collected("the contents of 'f'", "f", 6)
    assert read.receive(*data(b"abc")) is None
    assert read.receive(*data(b"def")) is None  # exactly the bound
    assert read.receive({"t": "done", "size": 6}, b"") == {"t": "done", "size": 6}
    assert b"".join(read.chunks) == b"abcdef"
    short = Collected("w", "f", 6)
    short.receive(*data(b"abc"))
    with pytest.raises(ChannelError, match="size for 'f' does not match") as caught:
        short.receive({"t": "done", "size": 4}, b"")
    assert not isinstance(caught.value, ProtocolViolation)


def test_collected_more_than_the_bound_is_a_violation() -> None:
    read = Collected("the contents of 'f'", "f", 5)
    read.receive(*data(b"abc"))
    with pytest.raises(ProtocolViolation) as caught:
        read.receive(*data(b"def"))
    assert caught.value.reason == "the agent sent more than allowed for the contents of 'f'"
    assert caught.value.error == "the agent sent more than 5 bytes for the contents of 'f'"


def test_collected_other_frames_fail_the_request() -> None:
    with pytest.raises(FileAccessError):
        Collected("w", "f", 5).receive(error("not_found"), b"")
    with pytest.raises(ChannelError, match="unexpected 'out' frame for w"):
        Collected("w", "f", 5).receive({"t": "out", "fd": 1}, b"x")


def listing(*lines: bytes) -> bytes:
    return b"\n".join(lines) + b"\n"


def test_collected_listing_entries() -> None:
    ls = Collected("the listing of '.'", ".", 0, max_entries=2)
    assert ls.max_bytes == 2 * 8192
    ls.receive(*data(listing(b'{"path": "a"}', b"", b'{"path": "b"}')))
    assert ls.receive({"t": "done", "count": 2, "truncated": True}, b"") is not None
    assert ls.entries == [{"path": "a"}, {"path": "b"}]


@pytest.mark.parametrize(
    "done",
    [{"count": 1, "truncated": False}, {"count": 2}, {"count": 2, "truncated": "no"}, {"truncated": False}],
)
def test_collected_listing_done_must_agree(done: dict[str, Any]) -> None:
    ls = Collected("w", ".", 0, max_entries=5)
    ls.receive(*data(listing(b"1", b"2")))
    with pytest.raises(ChannelError, match="listing count"):
        ls.receive({"t": "done", **done}, b"")


def test_collected_listing_malformed_or_too_long_is_a_violation() -> None:
    with pytest.raises(ProtocolViolation) as caught:
        Collected("w", ".", 0, max_entries=5).receive(*data(b"{not json\n"))
    assert caught.value.reason == caught.value.error == "the agent sent a malformed listing"
    ls = Collected("w", ".", 0, max_entries=2)
    ls.receive(*data(listing(b"1", b"2")))
    with pytest.raises(ProtocolViolation) as caught:
        ls.receive(*data(listing(b"3")))
    assert caught.value.reason == "the agent sent more entries than asked for"
    assert caught.value.error == "the agent sent more than 2 entries"
    with pytest.raises(ProtocolViolation, match="more than allowed"):
        Collected("w", ".", 0, max_entries=1).receive(*data(b" " * 8193))


# -- a command's frames ----------------------------------------------------------


def out(body: bytes, fd: Any = 1) -> tuple[dict[str, Any], bytes]:
    return {"t": "out", "id": 3, "fd": fd}, body


def test_exec_frames_output_cut_at_max_output() -> None:
    frames = ExecFrames(5)
    assert frames.receive(*out(b"abc")) == (1, b"abc")
    before = frames.truncated
    assert frames.receive(*out(b"defg", 2)) == (2, b"de")
    assert (before, frames.truncated) == (False, True)
    assert frames.receive(*out(b"h")) is None  # nothing left of it
    assert frames.seen == 5 and not frames.ended


@pytest.mark.parametrize("fd", [0, 3, -1, "1", None, [1]], ids=repr)
def test_exec_frames_invalid_fd_is_a_violation(fd: Any) -> None:
    with pytest.raises(ProtocolViolation, match="invalid fd"):
        ExecFrames(5).receive(*out(b"x", fd))


def test_exec_frames_exit_ends_the_command() -> None:
    frames = ExecFrames(5)
    raw = frames.receive(exit_frame(code=3), b"")
    assert isinstance(raw, RawExit) and raw.code == 3
    assert frames.result == raw and frames.ended


def test_exec_frames_a_bad_exit_is_a_violation_and_ends_nothing() -> None:
    frames = ExecFrames(5)
    with pytest.raises(ProtocolViolation):
        frames.receive(exit_frame(code=256), b"")
    assert frames.result is None and not frames.ended


def test_exec_frames_an_error_reply_ends_the_command_without_a_violation() -> None:
    frames = ExecFrames(5)
    with pytest.raises(ChannelError, match="refused") as caught:
        frames.receive(error("internal"), b"")
    assert not isinstance(caught.value, ProtocolViolation) and frames.ended


@pytest.mark.parametrize("kind", ["ran", "display", "data", "done", "hello"])
def test_exec_frames_other_frames_are_violations(kind: str) -> None:
    frames = ExecFrames(5)
    with pytest.raises(ProtocolViolation, match=f"unexpected '{kind}' frame during a command"):
        frames.receive({"t": kind, "id": 3}, b"")
    assert not frames.ended


# -- a session run's frames --------------------------------------------------------


def display(
    body: bytes, final: bool = True, mime: str = "image/png", main: bool = False
) -> tuple[dict[str, Any], bytes]:
    return {"t": "display", "id": 3, "mime": mime, "final": final, "main": main}, body


def ran(**changes: Any) -> dict[str, Any]:
    return {"t": "ran", "id": 3, "duration": 0.5, **changes}


def test_run_frames_reassemble_a_display_item() -> None:
    frames = RunFrames(100)
    assert frames.receive(*display(b"ab", final=False)) is None
    assert frames.held == 2
    assert frames.receive(*display(b"cd", main=True)) == RawDisplay("image/png", b"abcd", main=True)
    assert (frames.seen, frames.held, frames.truncated) == (4, 0, False)


def test_run_frames_output_and_display_share_the_budget() -> None:
    frames = RunFrames(6)
    frames.receive(*display(b"abcd", final=False))
    assert frames.receive(*out(b"xyz")) == (1, b"xy")  # the held piece counts
    assert frames.truncated


def test_run_frames_drop_a_whole_item_over_budget_and_go_on() -> None:
    frames = RunFrames(5)
    assert frames.receive(*display(b"abc", final=False)) is None
    assert frames.receive(*display(b"def")) is None  # never part of an image
    assert frames.truncated and frames.seen == 0 and frames.held == 0
    assert frames.receive(*display(b"ok", mime="text/plain")) == RawDisplay("text/plain", b"ok")


def test_run_frames_keep_at_most_max_display_items() -> None:
    frames = RunFrames(1 << 20)
    got = [frames.receive(*display(b"x", mime="text/plain")) for _ in range(MAX_DISPLAY_ITEMS + 3)]
    assert sum(item is not None for item in got) == MAX_DISPLAY_ITEMS
    assert got[-1] is None and frames.truncated


def test_run_frames_an_item_keeps_its_mime() -> None:
    frames = RunFrames(100)
    frames.receive(*display(b"a", final=False))
    with pytest.raises(ProtocolViolation, match="changed its MIME type"):
        frames.receive(*display(b"b", mime="text/html"))
    with pytest.raises(ProtocolViolation, match="MIME type"):
        RunFrames(100).receive(*display(b"x", mime="application/x-evil"))


def test_run_frames_one_value_of_each_name() -> None:
    frames = RunFrames(100)
    assert frames.receive({"t": "value", "name": "result"}, b"42") == RawValue("result", "42")
    assert frames.receive({"t": "value", "name": "error"}, b"Trace") == RawValue("error", "Trace")
    with pytest.raises(ProtocolViolation, match="a second 'result' value"):
        frames.receive({"t": "value", "name": "result"}, b"43")


def test_run_frames_ran_ends_the_run_but_not_inside_an_item() -> None:
    frames = RunFrames(100)
    frames.receive(*display(b"a", final=False))
    with pytest.raises(ProtocolViolation, match="inside a display item"):
        frames.receive(ran(), b"")
    assert not frames.ended
    done = RunFrames(100)
    result = done.receive(ran(truncated=True), b"")
    assert isinstance(result, RawSessionRun) and result.truncated and result.duration == 0.5
    assert done.result == result and done.ended


def test_run_frames_an_error_reply_ends_the_run() -> None:
    frames = RunFrames(100)
    with pytest.raises(SessionLostError):
        frames.receive(error("session_lost"), b"")
    assert frames.ended


@pytest.mark.parametrize("kind", ["exit", "data", "done"])
def test_run_frames_other_frames_are_violations(kind: str) -> None:
    with pytest.raises(ProtocolViolation, match=f"unexpected '{kind}' frame during a session run"):
        RunFrames(100).receive({"t": kind, "id": 3}, b"")


def test_a_listing_nested_past_the_parsers_stack_is_a_violation() -> None:
    listed = Collected("the listing of '.'", ".", 10, max_entries=10)
    with pytest.raises(ProtocolViolation) as caught:
        listed.receive(*data(b"[" * 20_000 + b"]" * 20_000 + b"\n"))
    assert caught.value.reason == "the agent sent a malformed listing"
