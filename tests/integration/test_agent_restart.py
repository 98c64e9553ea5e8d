"""Crash safety of the agent channel: a lost or misbehaving agent never hangs or breaks the host.

The in-sandbox agent runs as the same user as sandbox code, so sandbox code
can kill it or write to its stdout.  The host must notice, fail that one
call, and start a fresh agent for the next call, with the sandbox's files
intact.  A sandbox whose container is gone must say so at once.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest

from agentnest import ChannelError, Sandbox, SandboxDestroyedError
from agentnest._core import core_of
from agentnest.channel.client import STALL_AFTER

from .helpers import Background, container_of, containers_of

#: Lets a command find the agent (its parent) and write to the agent's stdout.
WRITE_TO_AGENT = r"""
import os, sys
fd = os.open("/proc/%d/fd/1" % os.getppid(), os.O_WRONLY)
os.write(fd, bytes.fromhex(sys.argv[1]))
print("wrote")
"""


def agent_pid(sb: Sandbox) -> int:
    return int(sb.exec_python("import os; print(os.getppid())").stdout)


def test_agent_killed_during_a_call(sandbox: Sandbox) -> None:
    sandbox.write_file("keep.txt", "keep")
    first = agent_pid(sandbox)
    start = time.monotonic()
    with pytest.raises(ChannelError):
        sandbox.exec_shell("kill -9 $PPID", timeout=60)
    # Noticed at once, not at the command's timeout or the sandbox's deadline.
    assert time.monotonic() - start < 5
    # The next call starts a new agent, transparently; the files survived.
    assert sandbox.read_file("keep.txt") == "keep"
    assert sandbox.exec_shell("cat keep.txt").stdout == "keep"
    assert agent_pid(sandbox) != first


def test_restarted_agent_killed_during_a_call_is_noticed_at_once(sandbox: Sandbox) -> None:
    # Killing the first agent (attached to the container's stdio) makes the
    # host start a second one with `docker exec`: a different kind of stream.
    with pytest.raises(ChannelError):
        sandbox.exec_shell("kill -9 $PPID", timeout=60)
    second = agent_pid(sandbox)
    start = time.monotonic()
    with pytest.raises(ChannelError):
        sandbox.exec_shell("kill -9 $PPID", timeout=60)
    assert time.monotonic() - start < 5
    assert sandbox.exec_shell("echo next").stdout == "next\n"
    assert agent_pid(sandbox) != second


def test_agent_killed_between_calls(backend_name: str) -> None:
    with Sandbox(backend=backend_name, timeout=120) as sb:
        sb.write_file("keep.txt", "keep")
        channel = core_of(sb).channel
        assert channel is not None
        sb.exec_shell("agent=$PPID; (sleep 0.2; kill -9 $agent) >/dev/null 2>&1 &").check()
        # Wait for the agent's death to reach the host (PID 1's notice), not a fixed time.
        deadline = time.monotonic() + 10
        while channel.alive:
            assert time.monotonic() < deadline, "the host never learned that the agent died"
            time.sleep(0.05)
        # No per-call timeout: only noticing the dead agent can make this return.
        call = Background(lambda: sb.exec_shell("cat keep.txt"))
        finished = call.join(10)
    call.join(30)  # destroying the sandbox released a stuck call
    assert finished, "the call after the agent died did not return"
    assert call.error is None
    assert call.result.stdout == "keep"


def test_garbage_on_the_agents_stdout(sandbox: Sandbox) -> None:
    sandbox.write_file("keep.txt", "keep")
    start = time.monotonic()
    try:
        sandbox.exec(["python3", "-c", WRITE_TO_AGENT, (b"\xffGARBAGE\n" * 100).hex()], timeout=30)
    except ChannelError:
        pass  # the host dropped the channel: expected
    assert time.monotonic() - start < 10
    assert sandbox.exec_shell("cat keep.txt").stdout == "keep"
    assert sandbox.exec_python("print(6 * 7)").stdout == "42\n"


def test_partial_frame_on_the_agents_stdout(backend_name: str) -> None:
    partial = struct.pack(">II", 60_000, 0) + b'{"t":'
    with Sandbox(backend=backend_name, timeout=120) as sb:
        call = Background(lambda: sb.exec(["python3", "-c", WRITE_TO_AGENT, partial.hex()]))
        # runc: the agent is not dumpable, so the write is refused outright.
        # gVisor allows it; the host notices the missing heartbeat instead.
        finished = call.join(STALL_AFTER + 8)
    call.join(30)
    assert finished, "the call hung on a partial frame"
    assert call.error is None or isinstance(call.error, ChannelError)


def test_container_killed_externally(backend_name: str, docker_client: Any) -> None:
    sb = Sandbox(backend=backend_name, timeout=120)
    try:
        sb.write_file("keep.txt", "keep")
        container_of(docker_client, sb).kill()
        start = time.monotonic()
        with pytest.raises(SandboxDestroyedError):
            sb.exec_shell("echo hi", timeout=30)
        assert time.monotonic() - start < 5
        with pytest.raises(SandboxDestroyedError):
            sb.read_file("keep.txt")
    finally:
        sb.destroy()
    sb.destroy()  # idempotent
    assert sb.destroyed
    assert containers_of(docker_client, sb.id) == []
    with pytest.raises(SandboxDestroyedError):
        sb.exec_shell("echo hi")
