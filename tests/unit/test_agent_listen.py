"""The agent of a pod: listening on a unix socket, reached through the bridge, outliving connections.

Run here as local processes (the keeper of ``launch.listen_command`` and
``agent/bridge.py``): what the Kubernetes backend runs in a pod and through
each exec.  A host connection is the bridge's stdin and stdout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentnest.channel.client import Channel
from agentnest.channel.streams import SocketStream
from agentnest.errors import ChannelError
from agentnest.runtime import launch
from agentnest.testing.wait import wait_until

WAIT = 20.0


class Pod:
    """The keeper (with its listening agent) as a local process, and bridges to it."""

    def __init__(self, root: Path) -> None:
        self.workspace = root / "workspace"
        self.workspace.mkdir()
        self.sock = str(root / "agent.sock")
        env = {**os.environ, "AGENTNEST_WORKSPACE": str(self.workspace)}
        self.keeper = subprocess.Popen(
            launch.listen_command(sys.executable, 120, self.sock),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.workspace,
            env=env,
            start_new_session=True,
        )
        self.bridges: list[subprocess.Popen[bytes]] = []

    def connect(self, after: int | Channel = 1) -> Channel:
        """A new host connection: a bridge process whose stdio is the channel."""
        wait_until(lambda: os.path.exists(self.sock), "the agent's socket", within=WAIT)
        host, child = socket.socketpair()
        bridge = subprocess.Popen(
            launch.bridge_command(sys.executable, self.sock),
            stdin=child.fileno(),
            stdout=child.fileno(),
            stderr=subprocess.PIPE,
        )
        child.close()
        self.bridges.append(bridge)
        return Channel.connect(SocketStream(host), None, timeout=WAIT, after=after)

    def close(self) -> None:
        for bridge in self.bridges:
            if bridge.poll() is None:
                bridge.kill()
            bridge.wait()
            if bridge.stderr is not None:
                bridge.stderr.close()
        # The keeper ignores SIGTERM (as PID 1 must): its whole group goes with SIGKILL.
        os.killpg(self.keeper.pid, signal.SIGKILL)
        self.keeper.wait()


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    p = Pod(tmp_path)
    try:
        yield p
    finally:
        p.close()


def run(ch: Channel, script: str) -> bytes:
    handle = ch.start_exec(["/bin/sh", "-c", script], env={}, cwd=None, timeout=10, max_output=1 << 20)
    out = [
        data
        for event in handle.events(time.monotonic() + WAIT)
        if isinstance(event, tuple)
        for _, data in [event]
    ]
    assert handle.result is not None and handle.result.code == 0, handle.result
    return b"".join(out)


def test_a_host_reaches_the_agent_through_the_bridge(pod: Pod) -> None:
    ch = pod.connect()
    assert run(ch, "echo hi; pwd") == f"hi\n{pod.workspace}\n".encode()
    assert ch.hello is not None and ch.hello.pid != pod.keeper.pid
    ch.close()


def test_the_agent_outlives_its_connections(pod: Pod) -> None:
    first = pod.connect()
    agent_pid = first.hello.pid if first.hello else None
    session = first.start_exec(
        ["/bin/sh", "-c", "i=0; while [ $i -lt 400 ]; do i=$((i+1)); echo $i > count; sleep 0.05; done"],
        env={},
        cwd=None,
        timeout=60,
        max_output=1 << 20,
    )
    del session  # its frames go to whichever host is connected; this one is about to leave
    wait_until(lambda: (pod.workspace / "count").exists(), "the command to start", within=WAIT)
    after = first.next_id()
    first.close()
    second = pod.connect(after)
    assert second.hello is not None and second.hello.pid == agent_pid  # the same agent
    # The command started on the first connection kept running through the change.
    seen = int((pod.workspace / "count").read_text() or 0)
    wait_until(lambda: int((pod.workspace / "count").read_text() or 0) > seen + 3, "the count", within=WAIT)
    assert run(second, "echo still here") == b"still here\n"
    second.close()


def test_a_new_connection_replaces_the_old_one(pod: Pod) -> None:
    first = pod.connect()
    second = pod.connect(first.next_id())
    # The agent closed the first bridge's socket: its bridge exits, its channel ends.
    wait_until(lambda: pod.bridges[0].poll() is not None, "the first bridge to exit", within=WAIT)
    assert pod.bridges[0].returncode == 0
    with pytest.raises(ChannelError):
        run(first, "true")
    assert run(second, "echo ok") == b"ok\n"
    second.close()


def test_a_dead_agent_is_started_again_by_the_keeper(pod: Pod) -> None:
    first = pod.connect()
    assert first.hello is not None
    old = first.hello.pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: pod.bridges[0].poll() is not None, "the bridge to see the agent go", within=WAIT)
    with pytest.raises(ChannelError):
        run(first, "true")

    def reconnected() -> bool:
        try:
            ch = pod.connect()
        except ChannelError:
            return False
        ok = ch.hello is not None and ch.hello.pid != old and run(ch, "echo back") == b"back\n"
        ch.close()
        return ok

    wait_until(reconnected, "a new agent on the socket", within=WAIT)


def test_the_bridge_without_an_agent_exits_naming_the_socket(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing.sock")
    done = subprocess.run(
        launch.bridge_command(sys.executable, missing),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 3
    assert missing.encode() in done.stderr and b"cannot reach the agent" in done.stderr


def test_the_socket_is_the_agent_users_only(pod: Pod) -> None:
    pod.connect().close()
    assert os.stat(pod.sock).st_mode & 0o077 == 0
