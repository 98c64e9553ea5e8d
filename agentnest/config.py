"""Frozen, validated configuration and result types.

One fact, one field: these dataclasses are the single source of truth that the
guard, the channel and every backend read.  They validate in
``__post_init__`` so that an invalid value never reaches an engine.
"""

from __future__ import annotations

import math
import posixpath
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from .errors import ConfigurationError, ExecutionError, ExecutionTimeoutError
from .policy import NetworkPolicy
from .secrets import Secret

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

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


def _freeze_env(env: Mapping[str, str | Secret] | None) -> Mapping[str, str | Secret]:
    if env is None:
        return MappingProxyType({})
    if not isinstance(env, Mapping):
        raise ConfigurationError("environment must be a mapping of names to str or Secret")
    out: dict[str, str | Secret] = {}
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise ConfigurationError(
                f"environment name {k!r} is invalid; use letters, digits and '_', not starting with a digit"
            )
        if k.startswith("AGENTNEST_"):
            raise ConfigurationError(f"environment name {k!r} is reserved (AGENTNEST_ prefix)")
        if isinstance(v, Secret):
            raw = v.get_secret_value()
        elif isinstance(v, str):
            raw = v
        else:
            raise ConfigurationError(f"environment[{k!r}] must be str or Secret, not {type(v).__name__}")
        if "\x00" in raw:
            raise ConfigurationError(f"environment[{k!r}] contains a NUL byte")
        out[k] = v
    for k, v in out.items():
        if isinstance(v, Secret) and v.as_file and f"{k}_FILE" in out:
            raise ConfigurationError(
                f"environment[{k!r}] is a Secret with as_file=True, which sets {k}_FILE to its path; "
                f"do not set {k}_FILE yourself"
            )
    return MappingProxyType(out)


#: The presets a sandbox can be made for, and what each changes from the defaults:
#:
#: ``browser``: Chromium reserves tens of GiB of address space it never uses
#: (V8's heap cage, PartitionAlloc's pools), so under gVisor the sandbox gets
#: no address-space rlimit (memory stays capped by the cgroup); ``/dev/shm``
#: is a 256 MiB tmpfs (Chromium's shared memory; Docker's default is 64 MiB).
PRESETS = ("browser",)
#: ``/dev/shm`` of a browser sandbox (bytes), on every backend.
BROWSER_SHM = 256 * MiB


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """Everything a backend needs to create one sandbox."""

    image: str
    """Image reference (``name:tag`` or ``name@sha256:...``)."""
    lifetime: float = 300.0
    """Seconds until the sandbox stops itself, host alive or not."""
    environment: Mapping[str, str | Secret] = field(default_factory=lambda: MappingProxyType({}))
    """Environment of every command; ``Secret`` values are redacted from output."""
    workdir: str = "/workspace"
    """The workspace mount point and default working directory."""
    network: NetworkPolicy = field(default_factory=NetworkPolicy.denied)
    """Network policy; denied by default."""
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    """Resource ceilings."""
    read_only_root: bool = True
    """Mount the image's root filesystem read-only."""
    user: str = "65532:65532"
    """UID:GID the workload runs as."""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Extra labels on every engine resource."""
    seccomp_profile: str | None = None
    """A seccomp profile (JSON, or a path to it) replacing AgentNest's
    (``SecurityPolicy.seccomp_profile``).  .. versionadded:: 0.4.0"""
    apparmor_profile: str | None = None
    """An AppArmor profile to run under (``SecurityPolicy.apparmor_profile``).  .. versionadded:: 0.4.0"""
    rootless: bool = False
    """Require a rootless engine (``SecurityPolicy.rootless``).  .. versionadded:: 0.4.0"""
    proxy_image: str | None = None
    """Image of the egress proxy (``SecurityPolicy.egress_proxy_image``).  .. versionadded:: 0.4.0"""
    preset: str | None = None
    """The preset the sandbox was made for (``"browser"``), or None.  A backend
    gives a preset what its workload needs and nothing more (see
    :data:`PRESETS`).  .. versionadded:: 0.4.0"""

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset not in PRESETS:
            raise ConfigurationError(
                f"preset={self.preset!r} is not a preset; choose one of {', '.join(map(repr, PRESETS))}"
            )
        if not isinstance(self.image, str) or not self.image.strip() or any(c.isspace() for c in self.image):
            raise ConfigurationError(
                f"image={self.image!r} is not an image reference like 'python:3.12-slim'"
            )
        if (
            isinstance(self.lifetime, bool)
            or not isinstance(self.lifetime, (int, float))
            or not math.isfinite(self.lifetime)
            or not 1 <= self.lifetime <= 7 * 24 * 3600
        ):
            raise ConfigurationError(f"timeout={self.lifetime!r} is out of range; use 1 to 604800 seconds")
        object.__setattr__(self, "environment", _freeze_env(self.environment))
        if (
            not isinstance(self.workdir, str)
            or not self.workdir.startswith("/")
            or posixpath.normpath(self.workdir) != self.workdir
            or self.workdir.startswith("//")
        ):
            raise ConfigurationError(
                f"workdir={self.workdir!r} must be a normalised absolute path such as '/workspace'"
            )
        if self.workdir.rstrip("/") in ("", "/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/lib"):
            raise ConfigurationError(
                f"workdir={self.workdir!r} would shadow a system directory; use /workspace"
            )
        if not isinstance(self.network, NetworkPolicy):
            raise ConfigurationError("network must be a NetworkPolicy")
        if not isinstance(self.limits, ResourceLimits):
            raise ConfigurationError("limits must be a ResourceLimits")
        if (
            not isinstance(self.user, str)
            or not re.fullmatch(r"\d{1,10}(:\d{1,10})?", self.user)
            or int(self.user.split(":")[0]) == 0
        ):
            raise ConfigurationError(
                f"user={self.user!r} must be a non-root numeric UID[:GID], like '65532:65532'"
            )
        if not isinstance(self.labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()
        ):
            raise ConfigurationError("labels must be a mapping of str to str")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @property
    def secrets(self) -> tuple[str, ...]:
        """The raw values of every ``Secret`` in the environment."""
        return tuple(v.get_secret_value() for v in self.environment.values() if isinstance(v, Secret))

    @property
    def secret_files(self) -> dict[str, str]:
        """``NAME: value`` of each ``Secret(..., as_file=True)``: written to files, not the environment."""
        return {
            k: v.get_secret_value()
            for k, v in self.environment.items()
            if isinstance(v, Secret) and v.as_file
        }

    def container_environment(self) -> dict[str, str]:
        """The environment a backend gives the container: plain values, secrets' values,
        and ``NAME_FILE`` paths for secrets injected as files.

        .. versionadded:: 0.4.0
        """
        from .secrets import SECRET_DIR

        out: dict[str, str] = {}
        for k, v in self.environment.items():
            if isinstance(v, Secret) and v.as_file:
                out[f"{k}_FILE"] = f"{SECRET_DIR}/{k}"
            else:
                out[k] = v.get_secret_value() if isinstance(v, Secret) else v
        return out


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """The outcome of one command.

    ``stdout`` and ``stderr`` are decoded as UTF-8 (invalid bytes become
    U+FFFD) and have every secret redacted.
    """

    command: str
    """The command as run (``display_command`` when one was given); secrets redacted.

    .. versionchanged:: 0.4.0
       The fields keep 0.3.0's order: ``command, exit_code, stdout, stderr, duration``."""
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    truncated: bool = False
    signal: int | None = None
    """The signal that ended the command, if one did."""

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout followed by stderr."""
        return self.stdout + self.stderr

    def check(self) -> ExecutionResult:
        """Return self if ``ok``; raise :class:`ExecutionError` otherwise."""
        if self.timed_out:
            raise ExecutionTimeoutError(f"command timed out after {self.duration:.1f}s", self)
        if self.exit_code != 0:
            tail = self.stderr.strip().splitlines()[-1:] or [""]
            raise ExecutionError(f"command exited with {self.exit_code}: {tail[0][:500]}", self)
        return self


@dataclass(frozen=True, slots=True)
class ExecutionChunk:
    """A piece of output from a streaming command.

    The last chunk of a stream that ended is a ``"status"`` chunk carrying the
    ``exit_code`` (as in 0.3.0); ``data`` is empty there.
    """

    stream: Literal["stdout", "stderr", "status"]
    data: str = ""
    timestamp: float = field(default_factory=time.time, compare=False)
    """When the chunk arrived at the host (epoch seconds; not part of equality)."""
    exit_code: int | None = None
    """The command's exit code, on the ``"status"`` chunk only."""


@dataclass(frozen=True, slots=True)
class FileInfo:
    """An entry of the workspace as ``list_files`` reports it.

    .. versionadded:: 0.4.0
    """

    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"


@dataclass(frozen=True, slots=True)
class Artifact:
    """A regular file of the workspace, as :meth:`Sandbox.artifacts` reports it.

    .. versionadded:: 0.4.0
    """

    path: str
    """Workspace-relative path (``output/report.csv``)."""
    size: int
    """Size in bytes."""
    sha256: str
    """SHA-256 of the content, lowercase hex, computed inside the sandbox."""


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    """A workspace snapshot file, as :meth:`Sandbox.snapshot` wrote it (or ``restore`` read it).

    The first four fields keep their 0.3.0 meaning and order.

    .. versionchanged:: 0.4.0
       Added ``image``, ``files`` and the fields after them, and ``created``
       as a short name of ``created_at``.
    """

    path: Path
    """The snapshot file on the host."""
    size: int
    """Size of the snapshot file in bytes."""
    sha256: str
    """SHA-256 of the snapshot file as stored (``sha256sum`` agrees)."""
    created_at: float
    """When the snapshot was taken (epoch seconds)."""
    image: str = ""
    """Image of the sandbox it was taken from (empty for a tar without AgentNest metadata)."""
    files: int = 0
    """Number of regular files."""
    entries: int = 0
    """Number of archive members: files, directories and symlinks."""
    workspace_size: int = 0
    """Total size of the regular files in bytes (holes of sparse files included)."""
    payload_sha256: str = ""
    """SHA-256 of the payload (every tar byte before the metadata member), as recorded in it."""
    sandbox_id: str = ""
    """Id of the sandbox it was taken from."""
    compressed: bool = False
    """Whether the file is gzip-compressed."""
    skipped: tuple[str, ...] = ()
    """Workspace entries that cannot be archived (sockets, FIFOs, devices) and were left out."""

    @property
    def created(self) -> float:
        """Same as :attr:`created_at`."""
        return self.created_at
