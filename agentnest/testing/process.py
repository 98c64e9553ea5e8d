"""Run the real agent as a plain, unsandboxed child process (tests only).

This exercises the agent, the bootstrap and the channel for real without a
container engine.  It isolates nothing: never point it at untrusted code.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from ..channel.streams import ByteStream, SocketStream
from ..config import SandboxConfig
from ..runtime import bootstrap
from ..runtime.base import Capability, RuntimeBackend, SandboxHandle

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
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stream.close()


class LocalBackend(RuntimeBackend):
    """Sandboxes that are directories below ``root`` with a :class:`LocalAgent` in each.

    For unit tests only: it isolates nothing and enforces nothing it claims
    (``caps``, :data:`LOCAL_CAPABILITIES` by default).  ``created``,
    ``destroyed`` and ``agents`` let tests see what happened.
    """

    name = "local"

    def __init__(self, root: str | os.PathLike[str], caps: frozenset[Capability] | None = None) -> None:
        self.root = Path(root)
        self.caps = LOCAL_CAPABILITIES if caps is None else caps
        self.agents: dict[str, list[LocalAgent]] = {}
        self.created: list[str] = []
        self.destroyed: list[str] = []
        self._lock = threading.Lock()

    def capabilities(self) -> frozenset[Capability]:
        return self.caps

    def create(self, config: SandboxConfig) -> SandboxHandle:
        sid = uuid.uuid4().hex[:12]
        workspace = self.root / sid
        workspace.mkdir()
        with self._lock:
            self.created.append(sid)
        return SandboxHandle(sid, self.name, time.time() + config.lifetime, {"workspace": str(workspace)})

    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        agent = LocalAgent(handle.info["workspace"])
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
