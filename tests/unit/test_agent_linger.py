"""The Docker agent's linger mode: its first host is on stdio, and when that stream is lost
(dockerd restarting under a live-restore container), a host reaches the same agent again
through ``agent/bridge.py`` on ``$AGENTNEST_REATTACH``, its commands and sessions with it.

Run here as local processes: the keeper of ``bootstrap.command("keeper")`` (the container's
PID 1 on Docker) with its stdio on a socketpair (the engine's attach stream), and bridges.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_agent_listen import WAIT, run  # the same agent, reached through a socket

from agentnest.channel.client import Channel
from agentnest.channel.streams import SocketStream
from agentnest.errors import ChannelError
from agentnest.runtime import bootstrap, launch
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)


class Container:
    """A keeper whose stdio is the first host's stream, as ``docker attach`` gives it."""

    def __init__(self, root: Path, *, linger: bool, abstract: bool = False) -> None:
        self.workspace = root / "workspace"
        self.workspace.mkdir()
        # Docker's is abstract ("@name", in the sandbox's network namespace); a path works too.
        self.sock = f"@agentnest-test-{uuid.uuid4().hex}" if abstract else str(root / "run" / "agent.sock")
        env = {**os.environ, "AGENTNEST_WORKSPACE": str(self.workspace)}
        if linger:
            env["AGENTNEST_REATTACH"] = self.sock
        host, child = socket.socketpair()
        self.keeper = subprocess.Popen(
            bootstrap.command("keeper", sys.executable, 120),
            stdin=child.fileno(),
            stdout=child.fileno(),
            stderr=subprocess.PIPE,
            cwd=self.workspace,
            env=env,
            start_new_session=True,
        )
        child.close()
        self.first = Channel.connect(SocketStream(host), launch.bundle(), timeout=WAIT)
        self.bridges: list[subprocess.Popen[bytes]] = []

    def bridge(self, after: int) -> Channel:
        host, child = socket.socketpair()
        bridge = subprocess.Popen(
            launch.bridge_command(sys.executable, self.sock),
            stdin=child.fileno(),
            stdout=child.fileno(),
            stderr=subprocess.DEVNULL,
        )
        child.close()
        self.bridges.append(bridge)
        return Channel.connect(SocketStream(host), None, timeout=WAIT, after=after)

    def close(self) -> None:
        self.first.close()
        for bridge in self.bridges:
            if bridge.poll() is None:
                bridge.kill()
            bridge.wait()
        loop = self.workspace / "loop.pid"
        if loop.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(loop.read_text()), signal.SIGKILL)
        os.killpg(self.keeper.pid, signal.SIGKILL)  # the keeper ignores SIGTERM, as PID 1 must
        self.keeper.wait()
        if self.keeper.stderr is not None:
            self.keeper.stderr.close()


@pytest.fixture(params=["abstract", "path"])
def lingering(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Container]:
    c = Container(tmp_path, linger=True, abstract=request.param == "abstract")
    try:
        yield c
    finally:
        c.close()


def test_a_lost_stream_reaches_the_same_agent_with_its_session_and_commands(lingering: Container) -> None:
    first = lingering.first
    agent = first.hello.pid if first.hello else None
    info = first.open_session(time.monotonic() + WAIT)
    # Bounded (20 s), and killed at teardown by its pid: it lives outside the keeper's group.
    run(
        first,
        "nohup sh -c 'i=0; while [ $i -lt 400 ]; do i=$((i+1)); date +%s%N > tick; sleep 0.05; done' "
        ">/dev/null 2>&1 & echo $! > loop.pid",
    )
    wait_until(lambda: (lingering.workspace / "tick").exists(), "the background loop", within=WAIT)
    after = first.next_id()
    # The engine goes away: the first host's stream ends (as dockerd's attach does).
    first.close("the engine stopped")
    # The agent did not exit with its stdio: the keeper reported no agent exit.
    assert lingering.keeper.poll() is None
    second = lingering.bridge(after)
    assert second.hello is not None and second.hello.pid == agent  # the same agent
    sessions = second.list_sessions(time.monotonic() + WAIT)
    # Its Python session lives on: the same interpreter process.
    assert [(s.session, s.pid) for s in sessions] == [(info.session, info.pid)]
    tick = (lingering.workspace / "tick").read_text()
    wait_until(lambda: (lingering.workspace / "tick").read_text() != tick, "the loop to go on", within=WAIT)
    assert run(second, "echo still here") == b"still here\n"


def test_without_the_socket_the_agent_ends_with_its_stream(tmp_path: Path) -> None:
    c = Container(tmp_path, linger=False)
    try:
        c.first.close("gone")
        stderr = c.keeper.stderr
        assert stderr is not None
        seen = b""
        deadline = time.monotonic() + WAIT
        while bootstrap.AGENT_EXITED not in seen and time.monotonic() < deadline:
            chunk = os.read(stderr.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
        assert bootstrap.AGENT_EXITED in seen  # the keeper says its agent exited
        assert not os.path.exists(c.sock)
    finally:
        c.close()


def test_a_bridge_to_no_agent_fails_fast(tmp_path: Path) -> None:
    """No agent listening (it was killed): the reattach fails at once, and the host starts a new one."""
    c = Container(tmp_path, linger=True, abstract=True)
    try:
        agent = c.first.hello.pid if c.first.hello else 0
        after = c.first.next_id()
        os.kill(agent, signal.SIGKILL)
        wait_until(lambda: not _alive(agent), "the agent to die", within=WAIT)
        started = time.monotonic()
        with pytest.raises(ChannelError):
            c.bridge(after)
        assert time.monotonic() - started < 5
    finally:
        c.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
