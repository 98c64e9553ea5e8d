"""The agent's own handling of ^C, ^\\ and ^Z for kernels whose terminals do not signal (gVisor).

Pure logic on this host's real pseudo-terminals: the probe tells Linux apart from a
kernel that passes ^C through (it answers True here), and :func:`terminal_input`, called
directly as it is under gVisor, signals the foreground job, discards the keystrokes not
yet read, and leaves plain typing alone.  ``tests/integration/test_shell_engine.py``
types ^C into ``agentnest shell`` on runc and gVisor.
"""

from __future__ import annotations

import os
import sys
import termios
import time
from collections.abc import Iterator

import pytest

from agentnest.agent import exec as execmod

pytestmark = pytest.mark.timeout(30)

WAIT = 10.0


def read_until(cmd: execmod.Command, needle: bytes) -> bytes:
    assert cmd.pty_fd is not None
    os.set_blocking(cmd.pty_fd, True)
    seen = b""
    deadline = time.monotonic() + WAIT
    while needle not in seen:
        assert time.monotonic() < deadline, seen
        seen += os.read(cmd.pty_fd, 4096)
    return seen


@pytest.fixture
def spawned() -> Iterator[list[execmod.Command]]:
    commands: list[execmod.Command] = []
    yield commands
    for cmd in commands:
        execmod.kill_tree(cmd.pid, cmd.marker)
        cmd.proc.wait(WAIT)
        for fd in {cmd.pty_fd, cmd.stdin_fd} - {None}:
            assert fd is not None
            os.close(fd)


def start(spawned: list[execmod.Command], script: str) -> execmod.Command:
    cmd = execmod.spawn(
        len(spawned) + 1, ["sh", "-c", script], dict(os.environ), "/", True, 1 << 20, "t", (24, 80)
    )
    spawned.append(cmd)
    return cmd


def test_the_probe_finds_that_linux_signals() -> None:
    assert execmod._probe_tty_signals(sys.executable) is True


def test_ctrl_c_signals_the_job_and_discards_unread_keystrokes(spawned: list[execmod.Command]) -> None:
    cmd = start(spawned, "trap 'echo got-INT; exit 9' INT; echo ready; while :; do sleep 0.05; done")
    read_until(cmd, b"ready")
    assert execmod.terminal_input(cmd, b"typed") == b"typed"  # plain typing passes
    assert execmod.terminal_input(cmd, b"lost\x03kept") == b"kept"
    read_until(cmd, b"got-INT")
    assert cmd.proc.wait(WAIT) == 9


def test_ctrl_backslash_and_ctrl_z(spawned: list[execmod.Command]) -> None:
    quit_cmd = start(spawned, "trap 'echo got-QUIT; exit 3' QUIT; echo ready; while :; do sleep 0.05; done")
    read_until(quit_cmd, b"ready")
    execmod.terminal_input(quit_cmd, b"\x1c")
    read_until(quit_cmd, b"got-QUIT")
    assert quit_cmd.proc.wait(WAIT) == 3
    # A caught SIGTSTP (the default action would be dropped: this command's group has no
    # parent in its session, unlike a shell's jobs).
    stop_cmd = start(spawned, "trap 'echo got-TSTP; exit 4' TSTP; echo ready; while :; do sleep 0.05; done")
    read_until(stop_cmd, b"ready")
    execmod.terminal_input(stop_cmd, b"\x1a")
    read_until(stop_cmd, b"got-TSTP")
    assert stop_cmd.proc.wait(WAIT) == 4


def test_noflsh_keeps_keystrokes_and_no_isig_passes_the_byte(spawned: list[execmod.Command]) -> None:
    cmd = start(spawned, "trap 'echo got-INT' INT; echo ready; while :; do sleep 0.05; done")
    read_until(cmd, b"ready")
    assert cmd.pty_name is not None
    fd = os.open(cmd.pty_name, os.O_RDWR | os.O_NOCTTY)
    try:
        attrs = termios.tcgetattr(fd)
        attrs[3] |= termios.NOFLSH
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
        assert execmod.terminal_input(cmd, b"ab\x03cd") == b"abcd"
        read_until(cmd, b"got-INT")
        attrs[3] &= ~termios.ISIG
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
        assert execmod.terminal_input(cmd, b"\x03") == b"\x03"  # no ISIG: just a byte
    finally:
        os.close(fd)
