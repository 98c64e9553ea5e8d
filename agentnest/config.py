"""Frozen, validated configuration: what a backend needs to create one sandbox.

One fact, one field: these dataclasses are the single source of truth that the
guard, the channel and every backend read.  They validate in
``__post_init__`` so that an invalid value never reaches an engine.

Sizes and :class:`ResourceLimits` live in :mod:`agentnest.limits`, the result
types in :mod:`agentnest.results`; both are exported here as well, where
0.3.0 had them (``agentnest.config.ExecutionResult`` keeps working).
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import ConfigurationError
from .limits import DEFAULT_DISK, MAX_DISK, GiB, KiB, MiB, ResourceLimits, format_size, parse_size
from .policy import NetworkPolicy
from .results import Artifact, ExecutionChunk, ExecutionResult, FileInfo, SnapshotMetadata
from .secrets import Secret

__all__ = [
    "BROWSER_SHM",
    "DEFAULT_DISK",
    "MAX_DISK",
    "PRESETS",
    "Artifact",
    "ExecutionChunk",
    "ExecutionResult",
    "FileInfo",
    "GiB",
    "KiB",
    "MiB",
    "ResourceLimits",
    "SandboxConfig",
    "SnapshotMetadata",
    "env_name_problem",
    "format_size",
    "parse_size",
]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Longest environment variable name any surface accepts.
MAX_ENV_NAME = 128


def env_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be an environment variable name (None: it can).

    The one rule of every surface (the SDK, the native API, the E2B face):
    letters, digits and ``_``, not starting with a digit, at most
    :data:`MAX_ENV_NAME` characters, and not ``AGENTNEST_*`` (the agent's own).
    Anything else (NUL, ``=``, a newline, non-ASCII) would be cut or split by
    ``execve``'s ``NAME=value`` strings and break every later command.
    """
    if not isinstance(name, str) or len(name) > MAX_ENV_NAME or not _ENV_NAME.fullmatch(name):
        return (
            f"environment name {str(name)[: MAX_ENV_NAME + 8]!r} is invalid; use letters, digits and '_', "
            f"not starting with a digit, at most {MAX_ENV_NAME} characters"
        )
    if name.startswith("AGENTNEST_"):
        return f"environment name {name!r} is reserved (AGENTNEST_ prefix)"
    return None


def _freeze_env(env: Mapping[str, str | Secret] | None) -> Mapping[str, str | Secret]:
    if env is None:
        return MappingProxyType({})
    if not isinstance(env, Mapping):
        raise ConfigurationError("environment must be a mapping of names to str or Secret")
    out: dict[str, str | Secret] = {}
    for k, v in env.items():
        problem = env_name_problem(k)
        if problem is not None:
            raise ConfigurationError(problem)
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
