"""Sizes and resource ceilings: how ``"512m"`` becomes bytes, and what a sandbox may use.

A leaf: :class:`ResourceLimits` validates itself against the ranges an engine
can enforce, and :func:`parse_size` / :func:`format_size` are the one spelling
of sizes that profiles, the policy's ceilings and the CLI share.  The policy
(:meth:`agentnest.policy.SecurityPolicy.check_limits`) reads these limits;
it never needs the whole sandbox configuration.

.. versionadded:: 0.4.0
   These lived in ``agentnest.config``, which still exports them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import ConfigurationError

__all__ = ["DEFAULT_DISK", "MAX_DISK", "GiB", "KiB", "MiB", "ResourceLimits", "format_size", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


KiB = 1024
MiB = 1024**2
GiB = 1024**3
#: The default size of a disk workspace (see ResourceLimits.workspace) and the largest one.
DEFAULT_DISK = 8 * GiB
MAX_DISK = 64 * 1024 * GiB


def parse_size(value: int | str, what: str) -> int:
    """Parse ``512m``, ``1g``, ``1.5GiB`` or a byte count into bytes."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a size such as '512m' or a byte count, not a bool")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE.match(value)
        if not m:
            raise ConfigurationError(f"{what}={value!r} is not a size; write it like '512m', '2g' or 1048576")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise ConfigurationError(
            f"{what} must be a size such as '512m' or an int, not {type(value).__name__}"
        )
    if n <= 0:
        raise ConfigurationError(f"{what} must be positive, got {value!r}")
    return n


def format_size(n: int) -> str:
    for unit, size in (("g", GiB), ("m", MiB), ("k", KiB)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Resource ceilings the engine enforces on a sandbox.

    ``scratch`` (``/tmp``) is a memory-backed filesystem (tmpfs), and so is
    the workspace when ``workspace_medium`` is ``"memory"``: what is stored
    there counts against ``memory``, which is why their sum must leave room
    for processes.  A ``"disk"`` workspace lives in the storage pool
    (:mod:`agentnest.runtime.storage`): bounded by the kernel at
    ``workspace`` bytes, costing host disk only for what is written, and not
    counted against ``memory``.  Either way the sandbox cannot fill the
    host's disk.
    """

    memory: int = 512 * MiB
    """Memory ceiling in bytes (no swap); a size string such as ``"512m"`` is parsed."""
    cpus: float = 1.0
    """CPU share, in cores."""
    pids: int = 256
    """Maximum number of processes and threads."""
    gpus: int = 0
    """GPUs requested from the engine (0 for none)."""
    workspace: int = None  # type: ignore[assignment]  # None: derived in __post_init__
    """Size of the writable ``/workspace`` filesystem; by default 8g on disk,
    and in memory half of ``memory``, at most 256m."""
    scratch: int = None  # type: ignore[assignment]  # None: derived from memory in __post_init__
    """Size of the writable ``/tmp`` scratch filesystem; by default an eighth
    of ``memory``, at most 64m."""
    workspace_medium: str = "memory"
    """``"memory"`` (a tmpfs) or ``"disk"`` (the storage pool).  ``Sandbox``
    picks ``"disk"`` when its backend has a storage pool.

    .. versionadded:: 0.4.0"""

    @classmethod
    def build(
        cls,
        memory: int | str = "512m",
        cpus: float = 1.0,
        pids: int = 256,
        workspace: int | str | None = None,
        scratch: int | str | None = None,
        gpus: int = 0,
        workspace_medium: str = "memory",
    ) -> ResourceLimits:
        """Build limits from human sizes (``"512m"``); ``None`` sizes get the defaults."""
        return cls(
            memory=parse_size(memory, "memory"),
            cpus=cpus,
            pids=pids,
            gpus=gpus,
            workspace=None if workspace is None else parse_size(workspace, "workspace_size"),  # type: ignore[arg-type]
            scratch=None if scratch is None else parse_size(scratch, "scratch_size"),  # type: ignore[arg-type]
            workspace_medium=workspace_medium,
        )

    def __post_init__(self) -> None:
        memory: object = self.memory
        if isinstance(memory, str):  # 0.3.0 took ResourceLimits(memory="512m")
            object.__setattr__(self, "memory", parse_size(memory, "memory"))
        if self.workspace_medium not in ("memory", "disk"):
            raise ConfigurationError(
                f"workspace={self.workspace_medium!r} is not a workspace medium; use 'disk' or 'memory'"
            )
        on_disk = self.workspace_medium == "disk"
        if isinstance(self.memory, int) and not isinstance(self.memory, bool):
            # In-memory filesystems follow the memory limit by default (0.3.0
            # accepted any memory; a fixed 256m workspace refused everything
            # under 352m).  A disk workspace gets room for a real project.
            scratch: object = self.scratch
            workspace: object = self.workspace
            if scratch is None:
                object.__setattr__(self, "scratch", max(MiB, min(64 * MiB, self.memory // 8)))
            if workspace is None:
                default = DEFAULT_DISK if on_disk else max(MiB, min(256 * MiB, self.memory // 2))
                object.__setattr__(self, "workspace", default)
        if not isinstance(self.memory, int) or not 32 * MiB <= self.memory <= 1024 * GiB:
            raise ConfigurationError(f"memory={self.memory!r} bytes is out of range; use 32m to 1024g")
        if (
            isinstance(self.cpus, bool)
            or not isinstance(self.cpus, (int, float))
            or not math.isfinite(self.cpus)
            or not 0.01 <= self.cpus <= 512
        ):
            raise ConfigurationError(f"cpus={self.cpus!r} is out of range; use 0.01 to 512 cores")
        if isinstance(self.pids, bool) or not isinstance(self.pids, int) or not 8 <= self.pids <= 65536:
            raise ConfigurationError(f"pids={self.pids!r} is out of range; use 8 to 65536")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or not 0 <= self.gpus <= 64:
            raise ConfigurationError(f"gpus={self.gpus!r} is out of range; use 0 to 64")
        for name in ("workspace", "scratch"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < MiB:
                raise ConfigurationError(f"{name} size {v!r} is too small; use at least 1m")
        if on_disk and self.workspace > MAX_DISK:
            raise ConfigurationError(
                f"disk={format_size(self.workspace)} is out of range; use at most {format_size(MAX_DISK)}"
            )
        reserve = min(32 * MiB, self.memory // 4)
        in_memory = self.scratch + (0 if on_disk else self.workspace)
        if in_memory > self.memory - reserve:
            both = (
                f"scratch ({format_size(self.scratch)})"
                if on_disk
                else f"workspace ({format_size(self.workspace)}) + scratch ({format_size(self.scratch)})"
            )
            raise ConfigurationError(
                f"{both} must leave at least {format_size(reserve)} of memory ({format_size(self.memory)}) "
                "for processes, "
                "because it lives in memory; raise memory, lower the size, or put the workspace on disk"
            )
