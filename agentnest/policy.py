"""Security and network policy: what a sandbox may do.

Frozen and validated at construction, so that an unsafe policy cannot exist.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import fnmatch
import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._aliases import deprecated
from .egress.rules import check_pattern
from .errors import ConfigurationError
from .limits import ResourceLimits, format_size, parse_size

_RUNTIME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
#: Backend names that people use for an OCI runtime.
RUNTIME_ALIASES = {"gvisor": "runsc", "kata": "kata-runtime", "docker": "runc"}


class NetworkMode(str, enum.Enum):
    """How a sandbox may reach the network.

    0.3.0's names and values still work: :attr:`DENY` is :attr:`DENIED` and
    :attr:`ALLOW` is :attr:`OPEN` (the same members), and
    ``NetworkMode("deny")`` and ``NetworkMode("allow")`` return them.  The
    values are ours: ``NetworkMode.DENY.value == "denied"``.
    """

    DENIED = "denied"
    """No interface but loopback (the default)."""
    ALLOWLIST = "allowlist"
    """Only through the filtering proxy, to approved domains."""
    OPEN = "open"
    """Unfiltered network: an explicit, loudly logged opt-in."""
    DENY = "denied"
    """0.3.0's name of :attr:`DENIED`."""
    ALLOW = "open"
    """0.3.0's name of :attr:`OPEN`."""

    @classmethod
    def _missing_(cls, value: object) -> NetworkMode | None:
        # 0.3.0's values ("deny", "allow"), as its code, YAML and JSON spell them.
        return {"deny": cls.DENIED, "allow": cls.OPEN}.get(value) if isinstance(value, str) else None


def _check_domain(pattern: str) -> str:
    # The proxy's own check (agentnest/egress/rules.py), so that the policy
    # and the proxy can never disagree on what an entry means.
    try:
        return check_pattern(pattern)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """Network access of a sandbox.  Use the named constructors.

    With an allowlist, ``domains=["pypi.org"]`` admits ``pypi.org`` and the
    names below it (``files.pypi.org``), as in 0.3.0;
    ``subdomains=False`` admits exactly the names listed.  An IP address
    among the domains (``"10.20.30.40"``) admits connections to exactly that
    address.  See docs/egress.md.
    """

    mode: NetworkMode = NetworkMode.DENIED
    domains: tuple[str, ...] = ()
    """Allowed destinations: host names (``pypi.org``: the name and, with
    :attr:`subdomains`, every name below it), ``*.suffix`` patterns (the
    names strictly below the suffix) and IP addresses (``10.20.30.40``,
    ``::1``: exactly that address as a destination, even a private one;
    a name that resolves to it still needs :attr:`cidrs`)."""
    cidrs: tuple[str, ...] = ()
    """Address ranges allowed even though private or reserved."""
    ports: tuple[int, ...] = (80, 443)
    """Allowed destination ports."""
    subdomains: bool = True
    """Whether a listed name also admits the names below it (``pypi.org``
    admits ``files.pypi.org`` and ``a.b.pypi.org``, never ``notpypi.org``),
    as in 0.3.0.  ``False`` admits exactly the names listed; a ``*.suffix``
    entry still admits the names below its suffix.  A one-label name
    (``localhost``) admits only itself either way: below it would be a whole
    top-level domain.  Only for :attr:`NetworkMode.ALLOWLIST`.

    .. versionadded:: 0.4.0"""

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
        if not isinstance(self.subdomains, bool):
            raise ConfigurationError(f"subdomains must be True or False, not {self.subdomains!r:.60}")
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
        if self.mode is NetworkMode.ALLOWLIST:
            if not (self.domains or self.cidrs):
                raise ConfigurationError("an allowlist needs at least one domain or cidr")
        elif self.domains or self.cidrs or not self.subdomains:
            # As in 0.3.0: a denied or open network has nothing to list, and
            # accepting a list there would suggest a filter that is not applied.
            raise ConfigurationError(
                f"domains, cidrs and subdomains=False only go with network mode 'allowlist', "
                f"not {self.mode.value!r}; use NetworkPolicy.allowlist(...)"
            )

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
        *,
        subdomains: bool = True,
    ) -> NetworkPolicy:
        """Only these destinations, through the filtering proxy.

        Args:
            domains: host names (each with the names below it, unless
                ``subdomains=False``), ``*.suffix`` patterns, IP addresses.
            cidrs: private or reserved ranges to admit (names resolving
                into them, and address literals inside them).
            ports: allowed destination ports.
            subdomains: ``False`` admits exactly the names listed, not the
                names below them (``.. versionadded:: 0.4.0``).

        Raises:
            ConfigurationError: an entry is invalid or too broad (``*``,
                ``*.com``), or nothing is listed.
        """
        given: tuple[tuple[str, object], ...] = (("domains", domains), ("cidrs", cidrs), ("ports", ports))
        for name, value in given:
            if isinstance(value, (str, bytes)):
                raise ConfigurationError(
                    f"{name} must be a list or tuple, e.g. {name}=[{value!r}], not one string"
                )
        return cls(NetworkMode.ALLOWLIST, tuple(domains), tuple(cidrs), tuple(ports), subdomains)

    @classmethod
    def open(cls) -> NetworkPolicy:
        """Unfiltered network access (explicit opt-in)."""
        return cls(NetworkMode.OPEN)

    @classmethod
    def allowed(cls) -> NetworkPolicy:
        """0.3.0's name of :meth:`open`: unfiltered network access.

        .. deprecated:: 0.4.0
            Use :meth:`open`.
        """
        deprecated("NetworkPolicy.allowed()", "NetworkPolicy.open()")
        return cls.open()


@dataclass(frozen=True, slots=True)
class SecurityPolicy:
    """What sandboxes created under this policy may do.

    Frozen and validated when built.  Every setting is enforced or refused:
    a backend that cannot enforce one (no such OCI runtime, no read-only
    root, no network mode) refuses to create the sandbox, and a sandbox that
    asks for more than a ceiling is refused, never silently clamped.
    """

    # The first nine fields keep 0.3.0's order (SecurityPolicy is a dataclass:
    # a positional call must keep its meaning); ours follow.
    network: NetworkPolicy = field(default_factory=NetworkPolicy.denied)
    """Network policy."""
    max_output_bytes: int = 10 * 1024 * 1024
    """Ceiling on a command's stdout + stderr; the rest is cut (``truncated``)."""
    max_file_read_bytes: int | None = None
    """Ceiling on one file read from the sandbox, if lower than ``max_file_bytes``
    (0.3.0's only file bound, 64 MiB by default there; ``None`` here: reads
    are bounded by ``max_file_bytes``)."""
    allowed_images: tuple[str, ...] = ()
    """Glob patterns of acceptable images; empty means any."""
    require_image_digest: bool = False
    """Refuse ``name:tag``; accept only ``name@sha256:...``."""
    seccomp_profile: str | None = None
    """A seccomp profile to use instead of AgentNest's: a path to a Docker
    seccomp JSON file, or the JSON itself.  ``"unconfined"`` is refused: no
    sandbox runs without a filter (docs/compat.md)."""
    apparmor_profile: str | None = None
    """An AppArmor profile the container runs under (Docker: ``apparmor=``).
    Refused at create on a host without AppArmor or without that profile
    loaded, never silently ignored."""
    rootless: bool = False
    """Require a rootless container engine; creating on a root engine is refused."""
    egress_proxy_image: str | None = None
    """Image the egress proxy runs in for allowlist sandboxes (needs
    ``python3``); ``None`` uses the backend's own (the base image)."""
    max_file_bytes: int = 256 * 1024 * 1024
    """Ceiling on one file read from or written to the sandbox."""
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
            ("max_file_read_bytes", 1, 1 << 36),
        ):
            v = getattr(self, name)
            if v is None and name == "max_file_read_bytes":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ConfigurationError(f"{name}={v!r} is out of range; use {low} to {high}")
        for name in ("require_image_digest", "read_only_root", "rootless"):
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
        profile = self.seccomp_profile
        if profile is not None:
            if not isinstance(profile, str) or not profile.strip():
                raise ConfigurationError(
                    "seccomp_profile must be a path to a seccomp JSON file, the JSON, or None"
                )
            if profile.strip().lower() == "unconfined":
                # 0.3.0 passed this through; ours never runs a sandbox without a
                # syscall filter, so the setting is refused rather than honoured.
                raise ConfigurationError(
                    "seccomp_profile='unconfined' is refused: AgentNest never runs a sandbox without a "
                    "seccomp filter; leave it None for AgentNest's profile or give your own profile's JSON"
                )
        for name in ("apparmor_profile", "egress_proxy_image"):
            value = getattr(self, name)
            bad = not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value)
            if value is not None and bad:
                raise ConfigurationError(f"{name}={value!r} must be a non-empty name without spaces, or None")
        if self.apparmor_profile is not None and self.apparmor_profile.lower() == "unconfined":
            raise ConfigurationError(
                "apparmor_profile='unconfined' is refused: it would only remove a confinement; leave it None"
            )
        runtime = self.required_runtime
        if runtime is not None:
            if not isinstance(runtime, str) or not _RUNTIME.match(runtime):
                raise ConfigurationError(
                    f"required_runtime={runtime!r} is not an OCI runtime name such as 'runsc' or 'runc'"
                )
            object.__setattr__(self, "required_runtime", RUNTIME_ALIASES.get(runtime, runtime))
        if self.max_memory is not None:
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

    @property
    def read_limit(self) -> int:
        """The ceiling on one file read: the lower of ``max_file_bytes`` and ``max_file_read_bytes``."""
        if self.max_file_read_bytes is None:
            return self.max_file_bytes
        return min(self.max_file_bytes, self.max_file_read_bytes)

    def validate_image(self, image: str) -> None:
        """Raise :class:`ConfigurationError` (a ``ValueError``) if ``image`` is refused (0.3.0's check).

        See :meth:`check_image`, which returns the reason instead.
        """
        reason = self.check_image(image)
        if reason is not None:
            raise ConfigurationError(reason)

    def check_image(self, image: str) -> str | None:
        """Return why ``image`` is refused, or None if it is acceptable."""
        if self.require_image_digest and "@sha256:" not in image:
            return f"image {image!r} is not pinned by digest; use 'name@sha256:...'"
        if self.allowed_images and not any(fnmatch.fnmatchcase(image, p) for p in self.allowed_images):
            return f"image {image!r} matches none of allowed_images {list(self.allowed_images)}"
        return None

    def check_limits(self, limits: ResourceLimits, lifetime: float | None = None) -> str | None:
        """Return why ``limits`` (and a sandbox ``lifetime`` in seconds) ask for more than a
        ceiling allows, or None.

        .. versionchanged:: 0.4.0
           Takes the limits and the lifetime, not a whole ``SandboxConfig``.
        """
        if self.max_memory is not None and limits.memory > int(self.max_memory):
            return (
                f"memory {format_size(limits.memory)} exceeds the policy's max_memory "
                f"{format_size(int(self.max_memory))}; ask for less"
            )
        if self.max_cpus is not None and limits.cpus > self.max_cpus:
            return f"cpus {limits.cpus:g} exceeds the policy's max_cpus {self.max_cpus:g}; ask for less"
        if self.max_pids is not None and limits.pids > self.max_pids:
            return f"pids {limits.pids} exceeds the policy's max_pids {self.max_pids}; ask for less"
        if self.max_timeout is not None and lifetime is not None and lifetime > self.max_timeout:
            return (
                f"timeout {lifetime:g}s exceeds the policy's max_timeout {self.max_timeout:g}s; "
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


# -- a server's ceiling ---------------------------------------------------------------------
#
# One implementation for both servers that hand sandboxes to clients: the
# manager (``agentnest serve``: a ceiling per token, agentnest.server.auth)
# and ``agentnest mcp`` (one ceiling for the server, agentnest.mcp.service).


@dataclass(frozen=True, slots=True)
class Ceiling:
    """The most a client of a server may ask for.  A request may narrow any of it, never widen it.

    Every request is checked against it and refused (``PolicyDeniedError``,
    HTTP 403 on the manager) when it asks for more; nothing is silently
    clamped.  :meth:`bound` writes it into the policy each sandbox gets, so
    the guard itself holds the sandbox, and every fork of it, to the ceiling.

    .. versionadded:: 0.4.0
    """

    backends: tuple[str, ...] = ()
    """Server backends the client may use; empty means the server's default backend only."""
    images: tuple[str, ...] = ()
    """Glob patterns of images; empty means the server's default image only (a client
    must not make the host pull and run arbitrary images)."""
    max_sandboxes: int = 4
    """Live sandboxes of this client at once."""
    max_memory: int = 512 * 1024 * 1024
    max_cpus: float = 1.0
    max_pids: int = 256
    max_timeout: float = 3600.0
    """Longest lifetime (seconds) a sandbox may have, extensions included."""
    max_workspace: int = 256 * 1024 * 1024
    max_output_bytes: int = 10_000_000
    max_file_bytes: int = 64 * 1024 * 1024
    network: tuple[str, ...] = ("denied",)
    """Network modes the client may ask for (``denied``, ``allowlist``, ``open``)."""
    domains: tuple[str, ...] = ()
    """Glob patterns that every domain of an allowlist must match."""
    writable_root: bool = False
    """Whether a sandbox may ask for a writable root filesystem."""

    def __post_init__(self) -> None:
        for name in ("backends", "images", "network", "domains"):
            value: object = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise ConfigurationError(f"ceiling {name} must be a list of strings")
            if not all(isinstance(v, str) and v.strip() for v in value):
                raise ConfigurationError(f"ceiling {name} must hold non-empty strings")
            object.__setattr__(self, name, tuple(value))
        modes = []
        for mode in self.network:
            try:
                # Stored as ours' value: 0.3.0's 'deny'/'allow' name the same modes.
                modes.append(NetworkMode(mode).value)
            except ValueError:
                raise ConfigurationError(
                    f"ceiling network mode {mode!r} is unknown; use denied, allowlist or open"
                ) from None
        object.__setattr__(self, "network", tuple(modes))
        count = self.max_sandboxes
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 10_000:
            raise ConfigurationError(f"max_sandboxes={count!r} must be an integer from 0 to 10000")
        for name in ("max_memory", "max_workspace", "max_file_bytes", "max_output_bytes"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, parse_size(value, name))
            elif isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(f"{name}={value!r} must be a positive size")
        for name in ("max_cpus", "max_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"{name}={value!r} must be a positive number")
            object.__setattr__(self, name, float(value))
        pids = self.max_pids
        if isinstance(pids, bool) or not isinstance(pids, int) or pids <= 0:
            raise ConfigurationError(f"max_pids={pids!r} must be a positive integer")
        if not isinstance(self.writable_root, bool):
            raise ConfigurationError("writable_root must be true or false")

    def allows_image(self, image: str, default_image: str) -> bool:
        if not self.images:
            return image == default_image
        return any(fnmatch.fnmatchcase(image, p) for p in self.images)

    def allows_domain(self, domain: str) -> bool:
        return any(fnmatch.fnmatchcase(domain, p) for p in self.domains)

    def bound(self, policy: SecurityPolicy, default_image: str) -> SecurityPolicy:
        """``policy`` held to this ceiling, for the guard to enforce on a sandbox and its forks.

        The images become the ceiling's patterns (else ``default_image``
        only), as :meth:`allows_image` decides; memory, CPUs, lifetime and the
        file bound become the lower of the policy's and the ceiling's (a
        policy's ``None`` is no limit).  The rest of ``policy`` is kept:
        what else a client may ask for (backend, network, workspace, pids,
        a writable root) is checked per request by the server that asks.
        """
        memory = self.max_memory
        if policy.max_memory is not None:
            memory = min(memory, int(policy.max_memory))
        cpus = self.max_cpus if policy.max_cpus is None else min(self.max_cpus, policy.max_cpus)
        timeout = self.max_timeout
        if policy.max_timeout is not None:
            timeout = min(timeout, policy.max_timeout)
        return dataclasses.replace(
            policy,
            allowed_images=self.images or (default_image,),
            max_memory=memory,
            max_cpus=cpus,
            max_timeout=timeout,
            max_file_bytes=min(self.max_file_bytes, policy.max_file_bytes),
        )

    @classmethod
    def from_dict(cls, data: collections.abc.Mapping[str, Any]) -> Ceiling:
        """A ceiling from its stored form (a token record), every field checked."""
        if not isinstance(data, collections.abc.Mapping):
            raise ConfigurationError("a token's ceiling must be an object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigurationError(f"unknown ceiling fields {sorted(unknown)}")
        return cls(**dict(data))
