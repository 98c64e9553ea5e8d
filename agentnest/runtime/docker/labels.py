"""Labels on every engine resource AgentNest creates.

Every container, network and volume carries its owner and its deadline, so
that ``agentnest prune`` can reap what a crashed host process left behind.
"""

from __future__ import annotations

from ..._version import __version__
from ..owner import owner as owner  # re-exported: the host process that owns a sandbox
from ..owner import owner_alive as owner_alive

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
