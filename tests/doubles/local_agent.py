"""Run the real agent as a plain, unsandboxed child process (tests only).

This exercises the agent, the bootstrap and the channel for real without a
container engine.  It isolates nothing: never point it at untrusted code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from agentnest.channel.streams import ByteStream, SocketStream
from agentnest.config import SandboxConfig
from agentnest.runtime import bootstrap
from agentnest.runtime.base import Capability, RuntimeBackend, SandboxHandle

#: What a :class:`LocalBackend` claims by default.  It enforces none of it:
#: it exists so that pure logic (the guard, the channel, state handling) can
#: be tested without an engine.
LOCAL_CAPABILITIES = frozenset(
    {
        Capability.NETWORK_DENIED,
        Capability.RESOURCE_LIMITS,
        Capability.READ_ONLY_ROOT,
        Capability.FORK,
        Capability.SNAPSHOT,
    }
)


class LocalAgent:
    """An agent child process connected over a socketpair."""

    def __init__(
        self, workspace: str, python: str = sys.executable, env: dict[str, str] | None = None
    ) -> None:
        host, child = socket.socketpair()
        full_env = dict(os.environ if env is None else env)
        full_env["AGENTNEST_WORKSPACE"] = workspace
        self.proc = subprocess.Popen(
            bootstrap.command("agent", python=python),
            stdin=child.fileno(),
            stdout=child.fileno(),
            stderr=None if os.environ.get("AGENTNEST_DEBUG_AGENT") else subprocess.DEVNULL,
            cwd=workspace,
            env=full_env,
            close_fds=True,
        )
        child.close()
        self.stream = SocketStream(host)

    def kill(self) -> None:
        """End the agent and every process below it, as removing a container would.

        The commands are found before the agent dies (they are its
        descendants until then): a command the agent had stopped on its way
        to killing it (its timeout's tree kill) would stay stopped on the
        host for good otherwise.
        """
        below = _descendants(self.proc.pid) if self.proc.poll() is None else set()
        if self.proc.poll() is None:
            self.proc.kill()
        for pid in below:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.stream.close()


def _descendants(root: int) -> set[int]:
    """The pids below ``root`` now (from /proc: parent links)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in found}
        found |= frontier
    return found


class LocalBackend(RuntimeBackend):
    """Sandboxes that are directories below ``root`` with a :class:`LocalAgent` in each.

    For unit tests only: it isolates nothing and enforces nothing it claims
    (``caps``, :data:`LOCAL_CAPABILITIES` by default).  ``created``,
    ``destroyed`` and ``agents`` let tests see what happened.  The one
    backend of the tests that runs the real agent; a test that only needs
    scripted replies uses :class:`agentnest.testing.fake.FakeBackend`.
    """

    name = "local"

    def __init__(
        self,
        root: str | os.PathLike[str],
        caps: frozenset[Capability] | None = None,
        *,
        environment: bool = False,
    ) -> None:
        self.root = Path(root)
        self.caps = LOCAL_CAPABILITIES if caps is None else caps
        #: Give each agent the sandbox's environment (secrets included), as an engine does.
        self.environment = environment
        self.agents: dict[str, list[LocalAgent]] = {}
        self.created: list[str] = []
        self.destroyed: list[str] = []
        #: ``create`` sets ``creating``, then waits (up to a minute) for ``gate``: clear it to
        #: hold provisioning "in the engine".
        self.creating = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self._lock = threading.Lock()

    def capabilities(self) -> frozenset[Capability]:
        return self.caps

    def create(self, config: SandboxConfig) -> SandboxHandle:
        self.creating.set()
        self.gate.wait(60.0)
        sid = uuid.uuid4().hex[:12]
        workspace = self.root / sid
        workspace.mkdir()
        with self._lock:
            self.created.append(sid)
        info: dict[str, Any] = {"workspace": str(workspace)}
        if self.environment:
            info["env"] = {**os.environ, **config.container_environment()}
        return SandboxHandle(sid, self.name, time.time() + config.lifetime, info)

    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        agent = LocalAgent(handle.info["workspace"], env=handle.info.get("env"))
        with self._lock:
            self.agents.setdefault(handle.id, []).append(agent)
        return agent.stream

    def destroy(self, handle: SandboxHandle) -> None:
        with self._lock:
            agents = self.agents.pop(handle.id, [])
            if handle.id not in self.destroyed:
                self.destroyed.append(handle.id)
        for agent in agents:
            agent.kill()

    def live(self) -> set[str]:
        """Ids of the sandboxes not destroyed yet."""
        with self._lock:
            return set(self.agents)
