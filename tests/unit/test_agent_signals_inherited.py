"""Commands start with default signal handling, whatever the agent was started with.

Ignored signal dispositions and the signal mask survive ``fork`` and
``exec``.  An agent started from a background job (SIGINT and SIGQUIT
ignored) or under a blocked mask must not hand either on: a command, a
terminal command and a Python session (and what it runs) each see nothing
ignored and nothing blocked in ``/proc/self/status``, as from a login shell.
The real agent runs unsandboxed here, as in ``test_agent_local.py``.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from doubles.local_agent import LocalAgent

from agentnest.channel.client import Channel, ExecHandle
from agentnest.channel.protocol import RawValue
from agentnest.runtime import launch

pytestmark = pytest.mark.timeout(60)

WAIT = 15.0
IGNORED = (signal.SIGINT, signal.SIGQUIT)
BLOCKED = (signal.SIGHUP,)
STATUS = ["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"]


#: The signals a program can set: the C library keeps two real-time signals (32 and 33 with glibc)
#: for its threads, and no Python program, shell or agent can change their disposition; a
#: launcher that leaves one of them ignored (seen from a background job here) is not ours to fix.
SETTABLE = sum(1 << (int(sig) - 1) for sig in signal.valid_signals())


def masks(status: bytes) -> dict[str, int]:
    """``SigIgn`` and ``SigBlk`` of a ``/proc/<pid>/status``, as numbers, over the settable signals."""
    found: dict[str, int] = {}
    for line in status.decode().splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigBlk"):
            found[key] = int(value.strip(), 16) & SETTABLE
    assert set(found) == {"SigIgn", "SigBlk"}, status
    return found


def bit(sig: int) -> int:
    return 1 << (sig - 1)


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Channel]:
    """An agent started with SIGINT and SIGQUIT ignored and SIGHUP blocked, as from a background job."""
    saved = {sig: signal.getsignal(sig) for sig in IGNORED}
    try:
        for sig in IGNORED:
            signal.signal(sig, signal.SIG_IGN)
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)
        try:
            agent = LocalAgent(str(tmp_path))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    try:
        agent_masks = masks(Path(f"/proc/{agent.proc.pid}/status").read_bytes())
        # The premise: the agent itself did inherit both (else this tests nothing).
        assert agent_masks["SigIgn"] & bit(signal.SIGQUIT)
        assert agent_masks["SigBlk"] & bit(signal.SIGHUP)
        ch = Channel.connect(agent.stream, launch.bundle(), timeout=WAIT)
        yield ch
        ch.close()
    finally:
        agent.kill()


def output(handle: ExecHandle) -> bytes:
    out: list[bytes] = []
    for event in handle.events(time.monotonic() + WAIT):
        if isinstance(event, tuple) and event[0] == 1:
            out.append(event[1])
    assert handle.result is not None and handle.result.code == 0, (handle.result, out)
    return b"".join(out)


@pytest.mark.parametrize("timeout", [None, 10.0], ids=["no-timeout", "timeout"])
def test_a_command_starts_with_no_signal_ignored_or_blocked(channel: Channel, timeout: float | None) -> None:
    # With a timeout the command is made a subreaper first (another spawn path).
    handle = channel.start_exec(STATUS, env={}, cwd=None, timeout=timeout, max_output=1 << 20)
    assert masks(output(handle)) == {"SigIgn": 0, "SigBlk": 0}


def test_a_terminal_command_starts_with_no_signal_ignored_or_blocked(channel: Channel) -> None:
    handle = channel.start_exec(STATUS, env={}, cwd=None, timeout=10.0, max_output=1 << 20, pty=(24, 80))
    assert masks(output(handle).replace(b"\r\n", b"\n")) == {"SigIgn": 0, "SigBlk": 0}


def test_a_python_session_starts_with_no_signal_ignored_or_blocked(channel: Channel) -> None:
    info = channel.open_session(time.monotonic() + WAIT)
    code = (
        "import subprocess\n"
        "own = open('/proc/self/status').read()\n"
        f"child = subprocess.run({STATUS!r}, capture_output=True).stdout.decode()\n"
        "(own, child)"
    )
    handle = channel.start_session_run(info.session, code.encode(), timeout=WAIT, max_output=1 << 20)
    events = []
    while handle.result is None:
        events.append(handle.next_event(time.monotonic() + WAIT))
    values = [e for e in events if isinstance(e, RawValue)]
    assert values and values[0].name == "result", events
    own, child = ast.literal_eval(values[0].text)
    # The interpreter handles SIGINT itself; Python ignores SIGPIPE and SIGXFSZ.
    own_masks = masks(own.encode())
    assert own_masks["SigBlk"] == 0
    assert own_masks["SigIgn"] & ~(bit(signal.SIGPIPE) | bit(signal.SIGXFSZ)) == 0
    assert masks(child.encode()) == {"SigIgn": 0, "SigBlk": 0}


def test_spawn_from_a_process_that_ignores_signals(tmp_path: Path) -> None:
    """:func:`exec.spawn` itself, called from a process that ignores SIGINT (the unit tests' path)."""
    script = (
        "import os, signal, sys, time\n"
        "from agentnest.agent import exec as execmod\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGQUIT, signal.SIG_IGN)\n"
        "assert execmod.inherited_signals()\n"
        f"cmd = execmod.spawn(1, {STATUS!r}, dict(os.environ), {str(tmp_path)!r}, False, 1 << 20, 'tok')\n"
        "out = b''\n"
        "fd = next(iter(cmd.fds))\n"
        "os.set_blocking(fd, True)\n"
        "while True:\n"
        "    got = os.read(fd, 4096)\n"
        "    if not got:\n"
        "        break\n"
        "    out += got\n"
        "cmd.proc.wait()\n"
        "sys.stdout.buffer.write(out)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, env=env, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert masks(done.stdout) == {"SigIgn": 0, "SigBlk": 0}


def test_nothing_inherited_once_reset() -> None:
    """After :func:`exec.default_signals`, :func:`exec.inherited_signals` finds nothing (the vfork path)."""
    script = (
        "import signal\n"
        "from agentnest.agent import exec as execmod\n"
        "signal.signal(signal.SIGQUIT, signal.SIG_IGN)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGHUP])\n"
        "assert execmod.inherited_signals()\n"
        "execmod.default_signals()\n"
        "assert not execmod.inherited_signals()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, env=env, timeout=WAIT)
    assert done.returncode == 0, done.stderr
