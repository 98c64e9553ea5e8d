"""Labels on every engine resource AgentNest creates.

Every container, network and volume carries its owner and its deadline, so
that ``agentnest prune`` can reap what a crashed host process left behind.
"""

from __future__ import annotations

import os
import socket

from ..._version import __version__

PREFIX = "agentnest."
MANAGED = PREFIX + "managed"
SANDBOX = PREFIX + "sandbox"
OWNER = PREFIX + "owner"
DEADLINE = PREFIX + "deadline"
CREATED = PREFIX + "created"
BACKEND = PREFIX + "backend"
VERSION = PREFIX + "version"
ROLE = PREFIX + "role"
#: On a container started as a warm spare for forks (kept once it became a fork's child:
#: labels cannot change).
WARM = PREFIX + "warm"


def owner() -> str:
    """``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def for_sandbox(
    sandbox_id: str, backend: str, created: float, deadline: float, role: str = "sandbox"
) -> dict[str, str]:
    return {
        MANAGED: "true",
        SANDBOX: sandbox_id,
        OWNER: owner(),
        CREATED: f"{created:.3f}",
        DEADLINE: f"{deadline:.3f}",
        BACKEND: backend,
        VERSION: __version__,
        ROLE: role,
    }


def owner_alive(value: str) -> bool | None:
    """Whether the owning process still runs; None if it is on another host."""
    hostname, _, pid = value.rpartition(":")
    if hostname != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
