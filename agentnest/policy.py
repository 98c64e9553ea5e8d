"""Security and network policy: what a sandbox may do.

Frozen and validated at construction, so that an unsafe policy cannot exist.
"""

from __future__ import annotations

import enum
import fnmatch
import ipaddress
import re
from dataclasses import dataclass, field

from .errors import ConfigurationError

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


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
    """What sandboxes created under this policy may do."""

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
        images: object = self.allowed_images
        if isinstance(images, (str, bytes)) or not isinstance(images, (tuple, list)):
            raise ConfigurationError(
                f"allowed_images must be a list or tuple of patterns, not {images!r:.60}"
            )
        if not all(isinstance(p, str) and p.strip() for p in images):
            raise ConfigurationError("allowed_images must hold non-empty pattern strings")
        object.__setattr__(self, "allowed_images", tuple(images))

    def check_image(self, image: str) -> str | None:
        """Return why ``image`` is refused, or None if it is acceptable."""
        if self.require_image_digest and "@sha256:" not in image:
            return f"image {image!r} is not pinned by digest; use 'name@sha256:...'"
        if self.allowed_images and not any(fnmatch.fnmatchcase(image, p) for p in self.allowed_images):
            return f"image {image!r} matches none of allowed_images {list(self.allowed_images)}"
        return None
