"""What an ``agentnest mcp`` server's operator decides: :class:`ServerSettings` and its defaults.

Clients choose none of this.  The settings are checked once, when they are
made, so a server never starts with a lifetime over its own maximum, an
unknown preset or a ``sandbox_kwargs`` key a client could use to widen the
ceiling (the backend, the network, the environment are the operator's).

.. versionadded:: 0.4.0
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..events import Observer
from ..policy import SecurityPolicy
from ..runtime.base import RuntimeBackend

#: Lifetime of a sandbox when the client does not ask for one (seconds).
DEFAULT_LIFETIME = 600.0
#: The longest lifetime a client may ask for, unless the policy's max_timeout is lower.
MAX_LIFETIME = 3600.0
#: Live sandboxes per server, unless --max-sandboxes says otherwise.
DEFAULT_MAX_SANDBOXES = 8
#: One file read or written through MCP (the policy's max_file_bytes, if lower, wins).
MAX_FILE_BYTES = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """How an MCP server makes sandboxes.  Everything here is the operator's choice.

    Args:
        backend: backend name (``docker``, ``gvisor``...) or instance; clients cannot change it.
        policy: the ceiling for every sandbox (see the module docstring).
        sandbox_kwargs: further :class:`~agentnest.Sandbox` arguments for every
            sandbox (image, memory, cpus, pids, sizes, environment,
            read_only_root), e.g. from a profile.
        lifetime: default lifetime of a sandbox in seconds.
        max_lifetime: the longest lifetime a client may ask for.
        max_sandboxes: live sandboxes at once.
        snapshot_dir: where snapshots go; None makes a private directory for
            this server under ``$XDG_STATE_HOME/agentnest/mcp-snapshots`` that
            is removed when the server stops.
        observers: more event sinks (a JSONL log, tests).
        presets: presets a client may ask create_sandbox for (``("browser",)``:
            sandboxes with Chromium, and the ``browse`` tool); none by default.

    .. versionchanged:: 0.4.0
       ``presets``.
    """

    backend: str | RuntimeBackend = "docker"
    policy: SecurityPolicy = dataclasses.field(default_factory=SecurityPolicy)
    sandbox_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    lifetime: float = DEFAULT_LIFETIME
    max_lifetime: float = MAX_LIFETIME
    max_sandboxes: int = DEFAULT_MAX_SANDBOXES
    snapshot_dir: Path | None = None
    observers: Sequence[Observer] = ()
    presets: Sequence[str] = ()

    def __post_init__(self) -> None:
        from .browse import check_presets

        object.__setattr__(self, "presets", check_presets(self.presets))
        count = self.max_sandboxes
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise ConfigurationError(f"max_sandboxes={count!r} must be an integer from 1 to 1000")
        for name in ("lifetime", "max_lifetime"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds")
        if self.lifetime > self.max_lifetime:
            raise ConfigurationError(
                f"the default lifetime {self.lifetime:g}s is longer than max_lifetime {self.max_lifetime:g}s"
            )
        unknown = set(self.sandbox_kwargs) - _SANDBOX_KWARGS
        if unknown:
            raise ConfigurationError(f"sandbox_kwargs cannot set {sorted(unknown)} for an MCP server")


#: What the operator may preset for every sandbox (clients set none of these directly).
_SANDBOX_KWARGS = frozenset(
    {"image", "memory", "cpus", "pids", "workspace_size", "scratch_size", "environment", "read_only_root"}
)
