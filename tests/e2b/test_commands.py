"""``sandbox.commands`` through the stock SDK: foreground and background runs, exit codes,
stdin, environment, cwd, user, timeouts, list, connect and kill."""

from __future__ import annotations

import pytest

from .conftest import SDK, Observed

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

#: E2B's home, which the server maps onto the sandbox's workspace.
HOMES = ("/home/user", "/workspace")


@pytest.fixture(scope="module")
def commands(sdk: SDK, shared_sandbox: str) -> Observed:
    return sdk.run("commands", sandbox_id=shared_sandbox)


def test_foreground_stdout_stderr_and_exit_code(commands: Observed) -> None:
    assert commands.value("foreground") == {"stdout": "out\n", "stderr": "err\n", "exit_code": 0}


def test_a_non_zero_exit_raises_command_exit_exception(commands: Observed) -> None:
    err = commands.error("exit_code", "CommandExitException")
    assert "SandboxException" in err["mro"]
    assert err["exit_code"] == 3
    assert err["stderr"] == "bad\n" and err["stdout"] == "partial\n"
    assert "exited with code 3" in err["message"]


def test_envs(commands: Observed) -> None:
    assert commands.value("envs")["stdout"] == "bar baz"


def test_cwd(commands: Observed) -> None:
    home = commands.value("default_cwd")["stdout"].strip()
    assert home in HOMES
    commands.value("make_cwd")
    cwd = commands.value("cwd")["stdout"].splitlines()
    assert cwd[0] in {f"{h}/cwd-test" for h in HOMES} and cwd[1:] == ["inner"]
    commands.value("cwd_relative_file")
    assert commands.value("cwd_file_seen") == "made\n"


def test_user_user_is_the_sandbox_user_and_root_is_refused(commands: Observed) -> None:
    out = commands.value("user_user")["stdout"].split()
    assert out[1] != "0", out
    err = commands.error("user_root", "SandboxException")
    assert "CommandExitException" not in err["mro"], "user='root' ran a command"
    assert "root" in err["message"], err


def test_timeout_raises_the_sdks_timeout_exception(commands: Observed) -> None:
    timed = commands.value("timeout")
    assert timed["raised"] is not None, "sleep 30 with timeout=1 returned"
    assert "TimeoutException" in timed["raised"]["mro"], timed["raised"]
    assert timed["seconds"] < 15, timed
    assert commands.value("after_timeout")["stdout"] == "still here\n"


def test_background_handle_list_and_wait(commands: Observed) -> None:
    pid = commands.value("background_start")["pid"]
    assert isinstance(pid, int) and pid > 0
    listed = {p["pid"]: p for p in commands.value("list_running")}
    assert pid in listed, listed
    assert "read -t 30 x" in " ".join([listed[pid]["cmd"], *listed[pid]["args"]])
    commands.value("background_send")
    assert commands.value("background_wait") == {"stdout": "begin\nend\n", "stderr": "", "exit_code": 0}
    assert pid not in commands.value("list_after_wait")


def test_kill_a_background_command(commands: Observed) -> None:
    assert commands.value("kill_listed") is True
    assert commands.value("kill") is True
    ended = commands.error("kill_wait", "CommandExitException")
    assert ended["exit_code"] != 0, ended
    assert commands.value("kill_list_after") is False
    assert commands.value("kill_again") is False
    assert commands.value("kill_unknown_pid") is False


def test_connect_to_a_running_command_gets_later_output(commands: Observed) -> None:
    pid = commands.value("connect_start")["pid"]
    assert commands.value("connect_attach")["pid"] == pid
    commands.value("connect_disconnect_first")
    commands.value("connect_send")
    got = commands.value("connect_wait")
    assert "later:from-stdin\n" in got["stdout"] and got["exit_code"] == 0, got
    commands.error("connect_unknown_pid", "NotFoundException")


def test_stdin_send_and_close(commands: Observed) -> None:
    commands.value("stdin_send_text")
    commands.value("stdin_send_bytes")
    assert commands.value("stdin_close") is True
    assert commands.value("stdin_wait") == {"stdout": "one\ntwoé\n", "stderr": "", "exit_code": 0}
    commands.error("stdin_unknown_pid", "NotFoundException")
