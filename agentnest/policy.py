"""Security and network policy: what a sandbox may do.

Frozen and validated at construction, so that an unsafe policy cannot exist.
"""

from __future__ import annotations

import enum
import fnmatch
import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .config import SandboxConfig

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_RUNTIME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
#: Backend names that people use for an OCI runtime.
RUNTIME_ALIASES = {"gvisor": "runsc", "kata": "kata-runtime", "docker": "runc"}


class NetworkMode(str, enum.Enum):
    """How a sandbox may reach the network."""

    DENIED = "denied"
    """No interface but loopback (the default)."""
    ALLOWLIST = "allowlist"
    """Only through the filtering proxy, to approved domains."""
    OPEN = "open"
    """Unfiltered network: an explicit, loudly logged opt-in."""


def _check_domain(pattern: str) -> str:
    if not isinstance(pattern, str):
        raise ConfigurationError(f"allowlist domain {pattern!r} must be a string")
    p = pattern.strip().lower().rstrip(".")
    host = p[2:] if p.startswith("*.") else p
    labels = host.split(".")
    if not host or not all(_LABEL.match(label) for label in labels):
        raise ConfigurationError(f"allowlist domain {pattern!r} is not a host name or '*.suffix' pattern")
    if p.startswith("*.") and len(labels) < 2:
        # '*' or '*.com' would admit a whole top-level domain.
        raise ConfigurationError(
            f"allowlist pattern {pattern!r} is too broad; name at least two labels, like '*.example.com'"
        )
    return p


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """Network access of a sandbox.  Use the named constructors."""

    mode: NetworkMode = NetworkMode.DENIED
    domains: tuple[str, ...] = ()
    """Allowed host names (exact, or ``*.suffix``)."""
    cidrs: tuple[str, ...] = ()
    """Address ranges allowed even though private or reserved."""
    ports: tuple[int, ...] = (80, 443)
    """Allowed destination ports."""

    def __post_init__(self) -> None:
        mode: object = self.mode  # may be a plain string from YAML or HTTP
        if not isinstance(mode, NetworkMode):
            try:
                object.__setattr__(self, "mode", NetworkMode(mode))
            except ValueError:
                raise ConfigurationError(
                    f"network mode {self.mode!r} is unknown; use 'denied', 'allowlist' or 'open'"
                ) from None
        for name in ("domains", "cidrs", "ports"):
            value: object = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
                raise ConfigurationError(
                    f"{name} must be a list or tuple, e.g. {name}=('...',), not {value!r:.60}"
                )
        object.__setattr__(self, "domains", tuple(_check_domain(d) for d in self.domains))
        cidrs = []
        for c in self.cidrs:
            try:
                cidrs.append(str(ipaddress.ip_network(c, strict=False)))
            except (ValueError, TypeError):
                raise ConfigurationError(f"cidr {c!r} is not an address range like '10.1.0.0/16'") from None
        object.__setattr__(self, "cidrs", tuple(cidrs))
        for port in self.ports:
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ConfigurationError(f"port {port!r} is not a TCP port (1-65535)")
        object.__setattr__(self, "ports", tuple(self.ports))
        if self.mode is NetworkMode.ALLOWLIST and not (self.domains or self.cidrs):
            raise ConfigurationError("an allowlist needs at least one domain or cidr")

    @classmethod
    def denied(cls) -> NetworkPolicy:
        """No network (the default)."""
        return cls()

    @classmethod
    def allowlist(
        cls,
        domains: tuple[str, ...] | list[str] = (),
        cidrs: tuple[str, ...] | list[str] = (),
        ports: tuple[int, ...] | list[int] = (80, 443),
    ) -> NetworkPolicy:
        """Only these domains (and ranges), through the filtering proxy."""
        given: tuple[tuple[str, object], ...] = (("domains", domains), ("cidrs", cidrs), ("ports", ports))
        for name, value in given:
            if isinstance(value, (str, bytes)):
                raise ConfigurationError(
                    f"{name} must be a list or tuple, e.g. {name}=[{value!r}], not one string"
                )
        return cls(NetworkMode.ALLOWLIST, tuple(domains), tuple(cidrs), tuple(ports))

    @classmethod
    def open(cls) -> NetworkPolicy:
        """Unfiltered network access (explicit opt-in)."""
        return cls(NetworkMode.OPEN)


@dataclass(frozen=True, slots=True)
class SecurityPolicy:
    """What sandboxes created under this policy may do.

    Frozen and validated when built.  Every setting is enforced or refused:
    a backend that cannot enforce one (no such OCI runtime, no read-only
    root, no network mode) refuses to create the sandbox, and a sandbox that
    asks for more than a ceiling is refused, never silently clamped.
    """

    network: NetworkPolicy = field(default_factory=NetworkPolicy.denied)
    """Network policy."""
    max_output_bytes: int = 10_000_000
    """Ceiling on a command's stdout + stderr; the rest is cut (``truncated``)."""
    max_file_bytes: int = 256 * 1024 * 1024
    """Ceiling on one file read from or written to the sandbox."""
    require_image_digest: bool = False
    """Refuse ``name:tag``; accept only ``name@sha256:...``."""
    allowed_images: tuple[str, ...] = ()
    """Glob patterns of acceptable images; empty means any."""
    read_only_root: bool = True
    """Keep the image's root filesystem read-only."""
    required_runtime: str | None = None
    """OCI runtime every sandbox must run under: ``runsc`` (or ``gvisor``) for
    gVisor only, ``kata-runtime``; ``None`` accepts any backend.

    .. versionadded:: 0.4.0"""
    max_memory: int | str | None = None
    """Ceiling on ``memory`` (a size such as ``2g``).  .. versionadded:: 0.4.0"""
    max_cpus: float | None = None
    """Ceiling on ``cpus``.  .. versionadded:: 0.4.0"""
    max_pids: int | None = None
    """Ceiling on ``pids``.  .. versionadded:: 0.4.0"""
    max_timeout: float | None = None
    """Ceiling on a sandbox's lifetime (``timeout``) in seconds.  .. versionadded:: 0.4.0"""
    approval_hook: Callable[[Any], Any] | None = None
    """Asked before every operation (see :mod:`agentnest.approvals`); a
    ``Sandbox(approval_hook=...)`` is asked as well, and both must allow.

    .. versionadded:: 0.4.0"""
    approval_timeout: float = 30.0
    """Seconds an approval hook may take; one that does not answer in time denies.

    .. versionadded:: 0.4.0"""

    def __post_init__(self) -> None:
        if not isinstance(self.network, NetworkPolicy):
            raise ConfigurationError("SecurityPolicy.network must be a NetworkPolicy")
        for name, low, high in (
            ("max_output_bytes", 1024, 1 << 34),
            ("max_file_bytes", 1024, 1 << 36),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ConfigurationError(f"{name}={v!r} is out of range; use {low} to {high}")
        for name in ("require_image_digest", "read_only_root"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(f"{name} must be True or False, not {getattr(self, name)!r}")
        images: object = self.allowed_images
        if isinstance(images, (str, bytes)) or not isinstance(images, (tuple, list)):
            raise ConfigurationError(
                f"allowed_images must be a list or tuple of patterns, not {images!r:.60}"
            )
        if not all(isinstance(p, str) and p.strip() for p in images):
            raise ConfigurationError("allowed_images must hold non-empty pattern strings")
        object.__setattr__(self, "allowed_images", tuple(images))
        runtime = self.required_runtime
        if runtime is not None:
            if not isinstance(runtime, str) or not _RUNTIME.match(runtime):
                raise ConfigurationError(
                    f"required_runtime={runtime!r} is not an OCI runtime name such as 'runsc' or 'runc'"
                )
            object.__setattr__(self, "required_runtime", RUNTIME_ALIASES.get(runtime, runtime))
        if self.max_memory is not None:
            from .config import parse_size  # config imports this module

            object.__setattr__(self, "max_memory", parse_size(self.max_memory, "max_memory"))
        for name, integral in (("max_cpus", False), ("max_pids", True), ("max_timeout", False)):
            ceiling: Any = getattr(self, name)
            if ceiling is None:
                continue
            good = (
                isinstance(ceiling, (int, float))
                and not isinstance(ceiling, bool)
                and (isinstance(ceiling, int) or not integral)
                and math.isfinite(ceiling)
                and ceiling > 0
            )
            if not good:
                kind = "a positive integer" if integral else "a positive number"
                raise ConfigurationError(f"{name}={ceiling!r} must be {kind} or None")
        if self.approval_hook is not None and not callable(self.approval_hook):
            raise ConfigurationError(
                f"approval_hook must be a callable taking an ApprovalRequest, not {self.approval_hook!r:.60}"
            )
        t = self.approval_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 86400:
            raise ConfigurationError(f"approval_timeout={t!r} must be 0 < seconds <= 86400")

    def check_image(self, image: str) -> str | None:
        """Return why ``image`` is refused, or None if it is acceptable."""
        if self.require_image_digest and "@sha256:" not in image:
            return f"image {image!r} is not pinned by digest; use 'name@sha256:...'"
        if self.allowed_images and not any(fnmatch.fnmatchcase(image, p) for p in self.allowed_images):
            return f"image {image!r} matches none of allowed_images {list(self.allowed_images)}"
        return None

    def check_limits(self, config: SandboxConfig) -> str | None:
        """Return why ``config`` asks for more than a ceiling allows, or None."""
        from .config import format_size

        limits = config.limits
        if self.max_memory is not None and limits.memory > int(self.max_memory):
            return (
                f"memory {format_size(limits.memory)} exceeds the policy's max_memory "
                f"{format_size(int(self.max_memory))}; ask for less"
            )
        if self.max_cpus is not None and limits.cpus > self.max_cpus:
            return f"cpus {limits.cpus:g} exceeds the policy's max_cpus {self.max_cpus:g}; ask for less"
        if self.max_pids is not None and limits.pids > self.max_pids:
            return f"pids {limits.pids} exceeds the policy's max_pids {self.max_pids}; ask for less"
        if self.max_timeout is not None and config.lifetime > self.max_timeout:
            return (
                f"timeout {config.lifetime:g}s exceeds the policy's max_timeout {self.max_timeout:g}s; "
                "ask for a shorter lifetime"
            )
        return None

    def check_runtime(self, runtime: str | None) -> str | None:
        """Return why a backend running ``runtime`` is refused, or None."""
        if self.required_runtime is None or runtime == self.required_runtime:
            return None
        found = f"OCI runtime {runtime!r}" if runtime else "no OCI runtime it can name"
        backend = {v: k for k, v in RUNTIME_ALIASES.items()}.get(self.required_runtime)
        fix = f"use backend={backend!r}" if backend else "use a backend that runs it"
        return (
            f"the policy requires OCI runtime {self.required_runtime!r} but the backend has {found}; "
            f"{fix} or change the policy"
        )
