"""``agentnest shell`` without an engine: the agent's terminals, the CLI's loop, every --help.

The agent's pseudo-terminal support runs for real: the agent is a plain child
process (``LocalAgent``) driven by the real ``Channel``.  The CLI runs its
interactive loop on a pseudo-terminal this test opens, against a sandbox of
the ``LocalBackend``.
"""

from __future__ import annotations

import argparse
import os
import pty
import signal
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from doubles.local_agent import LocalAgent, LocalBackend

from agentnest.channel.client import Channel, ExecHandle
from agentnest.cli import build_parser, main
from agentnest.cli import shell as shell_cmd
from agentnest.cli._output import is_terminal, print_table, status
from agentnest.errors import ChannelError
from agentnest.runtime import launch, registry
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)

WAIT = 15.0
TESTS = str(Path(__file__).resolve().parents[1])  # where `doubles` is, for the child processes


def alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] not in (b"Z", b"X")


class Terminal:
    """A command on a pseudo-terminal in the agent, read until what a test waits for."""

    def __init__(self, handle: ExecHandle) -> None:
        self.handle = handle
        self.seen = b""

    def type(self, text: bytes) -> None:
        self.handle.write_stdin(text)

    def expect(self, needle: bytes, within: float = WAIT) -> bytes:
        """Read output until ``needle`` appears; return everything seen so far."""
        deadline = time.monotonic() + within
        while needle not in self.seen:
            event = self.handle.next_event(deadline)
            if not isinstance(event, tuple):
                raise AssertionError(f"the command ended before printing {needle!r}; saw {self.seen!r}")
            fd, data = event
            assert fd == 1, "a terminal's output is fd 1"
            self.seen += data
        return self.seen

    def finish(self, within: float = WAIT) -> Any:
        deadline = time.monotonic() + within
        while self.handle.result is None:
            event = self.handle.next_event(deadline)
            if isinstance(event, tuple):
                self.seen += event[1]
        return self.handle.result


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Channel]:
    local = LocalAgent(str(tmp_path))
    ch = Channel.connect(local.stream, launch.bundle(), timeout=WAIT)
    try:
        yield ch
    finally:
        ch.close()
        try:
            local.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        local.kill()


def open_terminal(
    channel: Channel, argv: list[str], size: tuple[int, int] = (24, 80), timeout: float | None = 30
) -> Terminal:
    env = {"TERM": "xterm", "PS1": "$ ", "ENV": "", "HISTFILE": "/dev/null"}
    handle = channel.start_exec(
        argv, env=env, cwd=None, timeout=timeout, max_output=1 << 30, keep_stdin_open=True, pty=size
    )
    return Terminal(handle)


# -- the agent's pseudo-terminals --------------------------------------------------------


def test_the_agent_announces_terminals(channel: Channel) -> None:
    assert channel.hello is not None
    assert "pty" in channel.hello.capabilities


def test_an_interactive_shell_echoes_runs_and_exits_with_its_code(channel: Channel) -> None:
    term = open_terminal(channel, ["/bin/sh", "-i"])
    term.type(b"echo hi-$((6 * 7))\n")
    seen = term.expect(b"hi-42\r\n")
    assert b"echo hi-$((6 * 7))" in seen  # the terminal echoed what was typed
    term.type(b"exit 3\n")
    result = term.finish()
    assert result.code == 3
    assert not result.timed_out


def test_stdin_stdout_and_stderr_are_the_controlling_terminal(channel: Channel) -> None:
    script = (
        "test -t 0 && test -t 1 && test -t 2 && echo all-ttys; "
        "tty; "
        'python3 -c \'import os; print("sid", os.getsid(0) == os.getpid(), '
        '"fg", os.tcgetpgrp(0) == os.getpgrp())\''
    )
    term = open_terminal(channel, ["/bin/sh", "-c", script])
    result = term.finish()
    assert result.code == 0
    assert b"all-ttys" in term.seen
    assert b"/dev/pts/" in term.seen
    assert b"fg True" in term.seen  # a controlling terminal with a foreground group
    assert b"\r\n" in term.seen  # the line discipline's output processing is on


def test_the_initial_size_and_a_resize(channel: Channel) -> None:
    term = open_terminal(channel, ["/bin/sh", "-i"], size=(31, 97))
    term.type(b"stty size\n")
    term.expect(b"31 97\r\n")
    term.handle.resize(50, 132)
    term.type(b"stty size\n")
    term.expect(b"50 132\r\n")
    term.type(b"exit\n")
    assert term.finish().code == 0


def test_a_resize_signals_the_foreground_program(channel: Channel) -> None:
    script = "trap 'echo winch $(stty size); exit 4' WINCH; echo ready; while :; do sleep 0.05; done"
    term = open_terminal(channel, ["/bin/sh", "-c", script])
    term.expect(b"ready")
    term.handle.resize(40, 100)
    assert term.finish().code == 4
    assert b"winch 40 100" in term.seen


def unique_sleep() -> list[str]:
    """``sleep`` for about 30 s, with an argument no other process has."""
    return ["sleep", f"30.{uuid.uuid4().int % 10**6:06d}"]


def in_the_foreground(argv: list[str]) -> bool:
    """Whether a process running ``argv`` is in its terminal's foreground group.

    Local agents run their commands as this machine's processes.  A ^C sent
    earlier reaches the shell instead, or the child before its exec, while it
    still runs the shell's own SIGINT handler.
    """
    want = "\0".join(argv).encode() + b"\0"
    for pid in os.listdir("/proc"):
        try:
            if not pid.isdigit() or Path(f"/proc/{pid}/cmdline").read_bytes() != want:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[2] == fields[5]:  # pgrp == tpgid, the terminal's foreground group
            return True
    return False


def test_ctrl_c_interrupts_the_foreground_program_only(channel: Channel) -> None:
    term = open_terminal(channel, ["/bin/sh", "-i"])
    sleep = unique_sleep()
    term.type(f"{' '.join(sleep)}; echo after-sleep\n".encode())
    wait_until(lambda: in_the_foreground(sleep), "the sleep in the foreground", WAIT)
    started = time.monotonic()
    term.type(b"\x03")  # ^C: the terminal's line discipline sends SIGINT to the foreground group
    term.type(b"echo still-here\n")
    term.expect(b"still-here\r\n")
    assert time.monotonic() - started < 10
    term.type(b"exit 0\n")
    assert term.finish().code == 0


def test_cancel_kills_the_whole_tree_of_a_terminal_command(channel: Channel, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    term = open_terminal(channel, ["/bin/sh", "-i"])
    term.type(
        f"(setsid sleep 300 & echo $! > daemon.pid); sleep 301 & echo $! > bg.pid; echo {tag}\n".encode()
    )
    term.expect(f"{tag}\r\n".encode())
    wait_until(lambda: (tmp_path / "daemon.pid").exists() and (tmp_path / "bg.pid").exists(), "pid files")
    pids = [int((tmp_path / n).read_text()) for n in ("daemon.pid", "bg.pid")]
    assert all(alive(p) for p in pids)
    term.handle.cancel()
    result = term.finish()
    assert result.cancelled
    wait_until(lambda: not any(alive(p) for p in pids), "the tree kill")
    assert channel.alive


def test_a_terminal_command_times_out_like_any_other(channel: Channel) -> None:
    term = open_terminal(channel, ["/bin/sh", "-c", "echo started; sleep 30"], timeout=0.5)
    result = term.finish()
    assert result.timed_out
    assert b"started" in term.seen


def test_terminal_output_ends_when_the_command_exits(channel: Channel) -> None:
    started = time.monotonic()
    term = open_terminal(channel, ["/bin/sh", "-c", "printf 'x%.0s' $(seq 1 20000); exit 7"])
    result = term.finish()
    assert result.code == 7
    assert term.seen.count(b"x") == 20000
    assert time.monotonic() - started < 10


def test_the_agent_refuses_a_bad_terminal_size(channel: Channel) -> None:
    # Bypass the host's check to see the agent's own.
    pending = channel._register()
    channel.send({"t": "exec", "id": pending.rid, "argv": ["true"], "pty": {"rows": 0, "cols": 80}})
    handle = ExecHandle(channel, pending, 100)
    with pytest.raises(ChannelError, match="pty must be"):
        handle.next_event(time.monotonic() + WAIT)
    assert channel.alive


def test_the_agent_ignores_a_bad_resize(channel: Channel) -> None:
    term = open_terminal(channel, ["/bin/sh", "-i"], size=(20, 70))
    channel.send({"t": "resize", "id": term.handle.id, "rows": True, "cols": 10**9})
    channel.send({"t": "resize", "id": 999999, "rows": 10, "cols": 10})
    term.type(b"stty size\n")
    term.expect(b"20 70\r\n")
    term.type(b"exit\n")
    assert term.finish().code == 0


@pytest.mark.parametrize("size", [(0, 80), (24, 0), (70000, 80), (True, 80), (24.0, 80), (24,)])
def test_the_host_refuses_a_bad_terminal_size(channel: Channel, size: Any) -> None:
    with pytest.raises(ValueError, match="terminal size"):
        channel.start_exec(["true"], env={}, cwd=None, timeout=5, max_output=10, pty=size)


def test_commands_without_a_terminal_are_unchanged(channel: Channel) -> None:
    handle = channel.start_exec(
        ["/bin/sh", "-c", "test -t 0 || echo no-tty; echo err >&2"],
        env={},
        cwd=None,
        timeout=10,
        max_output=1000,
    )
    out: dict[int, bytes] = {1: b"", 2: b""}
    for event in handle.events(time.monotonic() + WAIT):
        if isinstance(event, tuple):
            out[event[0]] += event[1]
    assert out == {1: b"no-tty\n", 2: b"err\n"}


# -- the command line -----------------------------------------------------------------------


@pytest.fixture
def local_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalBackend:
    """``--backend docker`` gives a LocalBackend: sandboxes are local agents (no isolation)."""
    backend = LocalBackend(tmp_path)
    monkeypatch.setattr(registry, "_shared", {"docker": backend})
    monkeypatch.delenv("AGENTNEST_IMAGE", raising=False)
    return backend


def test_shell_argv_defaults_to_an_interactive_shell() -> None:
    assert shell_cmd.shell_argv([]) == shell_cmd.DEFAULT_SHELL
    assert shell_cmd.shell_argv(["--"]) == shell_cmd.DEFAULT_SHELL
    assert shell_cmd.shell_argv(["--", "python3", "-q"]) == ["python3", "-q"]
    assert shell_cmd.shell_argv(["python3 -q"]) == ["python3", "-q"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("xterm-256color", "xterm-256color"),
        ("screen.xterm", "screen.xterm"),
        (None, "xterm"),
        ("", "xterm"),
        ("dumb", "xterm"),
        ("x" * 65, "xterm"),
        ("xterm;rm -rf /", "xterm"),
    ],
)
def test_terminal_type(value: str | None, expected: str) -> None:
    assert shell_cmd.terminal_type(value) == expected


def test_shell_without_a_terminal_reads_commands_from_stdin(
    local_backend: LocalBackend, tmp_path: Path
) -> None:
    script = tmp_path / "script.sh"
    script.write_text("echo out-$((2 + 3))\necho err >&2\nexit 6\n")
    code = (
        "import sys; from agentnest.cli import main; from agentnest.runtime import registry; "
        f"sys.path.insert(0, {TESTS!r}); from doubles.local_agent import LocalBackend; "
        f"registry._shared['docker'] = LocalBackend({str(tmp_path)!r}); "
        "sys.exit(main(['shell', '--', 'sh']))"
    )
    with script.open("rb") as stdin:
        proc = subprocess.run(
            [sys.executable, "-c", code], stdin=stdin, capture_output=True, timeout=WAIT * 2, check=False
        )
    assert proc.returncode == 6, proc.stderr
    assert proc.stdout == b"out-5\n"
    assert proc.stderr == b"err\n"


SHELL_CHILD = """\
import sys
from agentnest.cli import main
from agentnest.runtime import registry
sys.path.insert(0, sys.argv[2])  # tests/, where doubles is
from doubles.local_agent import LocalBackend
backend = LocalBackend(sys.argv[1])
registry._shared["docker"] = backend
code = main(["shell", "--", "sh", "-i"])
print(f"[code={code} live={len(backend.live())} created={len(backend.created)}]", flush=True)
sys.exit(code)
"""


def run_in_terminal(
    tmp_path: Path, script: Callable[[int, int], None], size: tuple[int, int] = (24, 80)
) -> tuple[int, bytes]:
    """Run ``agentnest shell`` (LocalBackend) on a new pseudo-terminal; ``script(master, pid)`` types."""
    import fcntl
    import struct

    env = {**os.environ, "TERM": "xterm-256color", "PS1": "$ ", "ENV": "", "HISTFILE": "/dev/null"}
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.execve(sys.executable, [sys.executable, "-c", SHELL_CHILD, str(tmp_path), TESTS], env)
        finally:
            os._exit(127)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
    seen = bytearray()
    done = threading.Event()

    def reader() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            seen.extend(data)
        done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        script_state["seen"] = seen
        script(master, pid)
        _, status_ = os.waitpid(pid, 0)
        done.wait(WAIT)
        # The terminal is back in cooked mode (raw mode clears ICANON and ECHO).
        lflag = termios.tcgetattr(master)[3]
        assert lflag & termios.ICANON and lflag & termios.ECHO, "the terminal was left in raw mode"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        os.close(master)
    return os.waitstatus_to_exitcode(status_), bytes(seen)


script_state: dict[str, bytearray] = {}


def wait_for(needle: bytes, within: float = WAIT) -> None:
    wait_until(lambda: needle in script_state["seen"], f"{needle!r} on the terminal", within)


def test_shell_on_a_terminal_types_resizes_and_exits_with_the_shell_code(tmp_path: Path) -> None:
    def session(master: int, pid: int) -> None:
        import fcntl
        import struct

        wait_for(b"$ ")
        os.write(master, b"echo hello-$((40 + 2)); stty size\n")
        wait_for(b"hello-42")
        wait_for(b"33 101")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 120, 0, 0))

        # The resize reaches the child as SIGWINCH, then the agent's terminal:
        # ask again until the shell sees the new size.
        def resized() -> bool:
            if b"45 120" in script_state["seen"]:
                return True
            os.write(master, b"stty size\n")
            return False

        wait_until(resized, "the new size in the sandbox's terminal", WAIT, interval=0.5)
        os.write(master, b"exit 3\n")

    code, seen = run_in_terminal(tmp_path, session, size=(33, 101))
    assert code == 3, seen.decode(errors="replace")
    assert b"[code=3 live=0 created=1]" in seen


def test_shell_restores_the_terminal_and_passes_ctrl_c_on(tmp_path: Path) -> None:
    sleep = unique_sleep()

    def session(master: int, pid: int) -> None:
        wait_for(b"$ ")
        os.write(master, " ".join(sleep).encode() + b"\n")
        wait_until(lambda: in_the_foreground(sleep), "the sleep in the foreground", WAIT)
        os.write(master, b"\x03")  # raw mode: ^C goes to the sandbox, not to agentnest
        os.write(master, b"echo alive-$$-after\n")
        wait_for(b"-after")
        os.write(master, b"exit\n")

    code, seen = run_in_terminal(tmp_path, session)
    assert code == 0, seen.decode(errors="replace")
    assert b"[code=" in seen
    assert b"live=0" in seen


def test_shell_ends_the_session_and_the_sandbox_on_sigterm(tmp_path: Path) -> None:
    def session(master: int, pid: int) -> None:
        wait_for(b"$ ")
        os.write(master, b"echo ready-for-term\n")
        wait_for(b"ready-for-term\r\n")
        os.kill(pid, signal.SIGTERM)  # agentnest itself, while the shell runs

    code, seen = run_in_terminal(tmp_path, session)
    assert code == 128 + signal.SIGTERM, seen.decode(errors="replace")
    assert b"live=0" in seen


# -- output layer --------------------------------------------------------------------------


def test_plain_output_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    import io

    stream = io.StringIO()
    assert not is_terminal(stream)
    with status("working", stream):
        time.sleep(0.01)
    assert stream.getvalue() == ""
    print_table(["A", "BB"], [["1", "2"], ["333", "4"]])
    out = capsys.readouterr().out
    assert out == "A    BB\n1    2\n333  4\n"


def test_spinner_on_a_terminal_is_erased_afterwards(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from agentnest.cli import _output

    class FakeTerminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(_output, "_rich_console", lambda stream: None)
    monkeypatch.setattr(_output, "SPINNER_DELAY", 0.0)
    stream = FakeTerminal()
    with status("creating a sandbox", stream):
        wait_until(lambda: "creating a sandbox..." in stream.getvalue(), "the spinner", WAIT)
    text = stream.getvalue()
    assert "creating a sandbox..." in text
    assert text.endswith("\r\x1b[K")


# -- help on every command ---------------------------------------------------------------------


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def test_every_command_and_subcommand_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    commands = list(walk(build_parser()))
    assert ("shell",) in commands
    assert ("serve", "token", "create") in commands
    for command in commands:
        code = main([*command, "--help"])
        out = capsys.readouterr().out
        assert code == 0, command
        assert "\nexamples:\n" in out, f"agentnest {' '.join(command)} --help has no examples"
        examples = out.split("\nexamples:\n", 1)[1]
        assert f"agentnest {' '.join(command)}".rstrip() in examples, command


def test_shell_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shell", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--image", "--backend", "--profile", "--memory", "--cpus", "--timeout", "--lifetime"):
        assert option in out
    assert "destroyed" in out


def test_shell_rejects_a_timeout_longer_than_its_lifetime(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shell", "--timeout", "100", "--lifetime", "50"]) == 2
    assert "must be shorter than the lifetime" in capsys.readouterr().err


def test_sandbox_destroyed_after_a_piped_shell_in_process(
    local_backend: LocalBackend, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"echo in-process\n")
    os.close(write_fd)
    with os.fdopen(read_fd, "r") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        assert main(["shell"]) == 0
    assert "in-process" in capfd.readouterr().out
    assert local_backend.created and not local_backend.live()
