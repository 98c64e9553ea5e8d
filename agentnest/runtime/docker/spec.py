"""``DockerSpec``: the knobs of the Docker backend (a frozen, validated dataclass)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ...errors import ConfigurationError
from . import egress, images

__all__ = ["DEFAULT_API_TIMEOUT", "DockerSpec"]

#: Seconds an engine API call may wait for an answer (see ``DockerSpec.api_timeout``).
#: Long enough for a slow create or removal on a loaded host; every call of the
#: backend is a short one (images are built and loaded elsewhere, with their own limits).
DEFAULT_API_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class DockerSpec:
    """Knobs of the Docker backend.

    Attributes:
        oci_runtime: ``runc`` (default), ``runsc`` (gVisor) or ``kata-runtime``;
            must be registered with the engine.
        docker_host: engine address; ``None`` reads ``DOCKER_HOST`` as the
            Docker CLI does.
        pull: try ``docker pull`` when an image is missing.
        python: the interpreter in the image that runs the agent.
        egress_hosts: host name -> IP address, used by the egress proxy
            instead of DNS for those names (``NetworkPolicy.allowlist``
            sandboxes).  The way tests and air-gapped setups point allowed
            names at local servers.  A mapped name must still be on the
            allowlist, and a private mapped address still needs a ``cidrs``
            entry.  (May move to the policy later.)
        egress_network: the network the egress proxy uses for its way out
            (``bridge``: the engine's default bridge).
        egress_subnets: the IPv4 range each allowlisted sandbox's internal
            /29 is drawn from.
        proxy_image: the image the egress proxy runs in (needs python3 >=
            3.8); ``None`` is the default base image.
        proxy_oci_runtime: the OCI runtime of the proxy container.
        network_oci_runtime: the OCI runtime of allowlisted sandboxes, which
            need a network interface; ``None`` means ``oci_runtime``, except
            ``runsc`` (registered with ``--network=none``), which becomes
            ``runsc-host`` (``--network=host`` inside the container's own
            network namespace, as ``make engine`` registers it).
        image_aliases: requested image -> local image the engine runs instead
            (the policy judges the requested one); ``None`` reads
            ``$AGENTNEST_IMAGE_ALIASES`` at each create (see :mod:`.images`).
        storage: the mount point of the storage pool for disk workspaces
            (``None``: ``$AGENTNEST_STORAGE`` or /var/lib/agentnest/storage;
            ``""``: no disk workspaces).  Used only when the engine runs on
            this host (a unix socket).
        warm_forks: after a sandbox's first fork, keep one started container
            of its configuration ready for the next (``Capability.WARM_FORK``:
            runc, a local storage pool, a network-denied sandbox); ``False``
            creates every child from scratch.  See docs/state.md.
        api_timeout: seconds an engine API call may go without an answer
            before it fails with :class:`~agentnest.errors.RuntimeNotAvailableError`
            (an engine that accepts but never answers must not hang the caller);
            ``None`` reads ``$AGENTNEST_DOCKER_TIMEOUT``, else 60.

    .. versionchanged:: 0.4.0 the ``egress_*``, ``proxy_*``,
       ``network_oci_runtime`` and ``image_aliases`` fields.
    """

    type: str = "docker"
    oci_runtime: str = "runc"
    docker_host: str | None = None
    pull: bool = True
    python: str = "python3"
    # Not part of the hash (a mapping is not hashable); still compared.
    egress_hosts: Mapping[str, str] = field(default_factory=dict, hash=False)
    egress_network: str = "bridge"
    egress_subnets: str = egress.DEFAULT_SUBNETS
    proxy_image: str | None = None
    proxy_oci_runtime: str = "runc"
    network_oci_runtime: str | None = None
    image_aliases: Mapping[str, str] | None = field(default=None, hash=False)
    storage: str | None = None
    warm_forks: bool = True
    api_timeout: float | None = None

    def __post_init__(self) -> None:
        from ...egress.rules import Rules

        hosts: object = self.egress_hosts
        if not isinstance(hosts, Mapping):
            raise ConfigurationError(f"egress_hosts must map host names to addresses, not {hosts!r:.60}")
        try:
            Rules(hosts=dict(hosts))
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"egress_hosts: {exc}; use {{'name.example': '10.0.0.5'}}") from None
        object.__setattr__(self, "egress_hosts", MappingProxyType(dict(hosts)))
        if self.image_aliases is not None:
            object.__setattr__(self, "image_aliases", images.checked_image_aliases(self.image_aliases))
        if self.api_timeout is not None and not (
            isinstance(self.api_timeout, (int, float)) and 0 < self.api_timeout <= 3600
        ):
            raise ConfigurationError(
                f"api_timeout must be seconds in (0, 3600], not {self.api_timeout!r:.40}"
            )

    def engine_timeout(self) -> float:
        """The engine API timeout in seconds (``api_timeout``, ``$AGENTNEST_DOCKER_TIMEOUT``, or 60)."""
        if self.api_timeout is not None:
            return float(self.api_timeout)
        raw = os.environ.get("AGENTNEST_DOCKER_TIMEOUT", "").strip()
        if not raw:
            return DEFAULT_API_TIMEOUT
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 < value <= 3600:
            raise ConfigurationError(
                f"AGENTNEST_DOCKER_TIMEOUT={raw!r:.40} is not a number of seconds in (0, 3600]; "
                "unset it or fix it"
            )
        return value

    def allowlist_oci_runtime(self) -> str:
        """The OCI runtime an allowlisted sandbox runs with (see ``network_oci_runtime``)."""
        if self.network_oci_runtime:
            return self.network_oci_runtime
        return "runsc-host" if self.oci_runtime == "runsc" else self.oci_runtime
