"""Shared by the server's unit tests: a backend whose sandboxes are local agent processes.

Each sandbox is a directory with the real agent running unsandboxed in it
(``doubles.local_agent.LocalAgent``), so the server, the guard, the
channel and the remote backend all run for real without an engine.  It
isolates nothing: tests only ever run harmless commands through it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from doubles import local_agent as process

from agentnest.runtime.base import Capability, RuntimeBackend, SandboxHandle
from agentnest.server.app import ServerSettings
from agentnest.server.auth import Ceiling, TokenStore

IMAGE = "local/test:1"


class LocalBackend(process.LocalBackend):
    """Each sandbox is a LocalAgent in its own directory; every agent of it is tracked."""

    name = "local-test"

    def __init__(self, root: Path) -> None:
        super().__init__(
            root,
            frozenset(
                {
                    Capability.NETWORK_DENIED,
                    Capability.RESOURCE_LIMITS,
                    Capability.READ_ONLY_ROOT,
                    Capability.EXTEND,
                }
            ),
        )

    def is_running(self, handle: SandboxHandle) -> bool:
        with self._lock:
            return handle.id in self.created and handle.id not in self.destroyed

    def extend(self, handle: SandboxHandle, deadline: float) -> None:
        handle.deadline = deadline

    def live_agents(self) -> int:
        with self._lock:
            return sum(1 for agents in self.agents.values() for a in agents if a.proc.poll() is None)

    def kill_all(self) -> None:
        with self._lock:
            everything = [a for agents in self.agents.values() for a in agents]
            self.agents.clear()
        for agent in everything:
            agent.kill()


def make_settings(root: Path, backend: RuntimeBackend, **kwargs: Any) -> ServerSettings:
    return ServerSettings(
        tokens=TokenStore(root / "tokens.json"),
        backends={"local": backend},
        image=IMAGE,
        **kwargs,
    )


def add_token(settings: ServerSettings, name: str, **ceiling: Any) -> str:
    ceiling.setdefault("images", (IMAGE, "local/*"))
    ceiling.setdefault("max_sandboxes", 4)
    _, secret = settings.tokens.create(name, Ceiling(**ceiling))
    return secret


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def tagged(tag: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose environment carries ``AN_TAG=tag``."""
    needle = f"AN_TAG={tag}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
        if needle in env.split(b"\0") and state not in b"ZX":
            found.append(int(pid))
    return found


@contextlib.contextmanager
def killed_on_exit(tag: str) -> Iterator[str]:
    try:
        yield tag
    finally:
        for pid in tagged(tag):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
