"""How ``agentnest serve`` runs: :class:`ServerSettings`, everything the operator chooses."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..approvals import RuleApprover
from ..errors import ConfigurationError
from ..events import Observer
from ..runtime.base import RuntimeBackend
from .admission import DEFAULT_AGING, DEFAULT_MAX_QUEUE
from .auth import TokenStore
from .e2b.state import DEFAULT_TEMPLATES, E2BTemplate
from .pools import PoolSpec, pool_specs

#: JSON bodies larger than this are refused with 413 before they are read.
DEFAULT_MAX_BODY = 16 * 1024 * 1024
#: File uploads and snapshot restores may be larger, up to this.
DEFAULT_MAX_UPLOAD = 256 * 1024 * 1024
#: History the database keeps unless told otherwise: 30 days.
DEFAULT_RETENTION = 30 * 86400.0


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """How the server runs.  Everything here is the operator's choice; clients choose within tokens.

    Args:
        tokens: the token store (see :mod:`agentnest.server.auth`).
        backends: backends clients may be granted, by name (the first is the
            default); values are names for the registry or instances.
        image: the default image (``None``: the base image); a token without
            ``images`` in its ceiling gets only this one.
        default_lifetime: lifetime of a sandbox whose client gives none (at
            most the token's ``max_timeout``).
        max_sandboxes: live sandboxes on the server, all tokens together.
        max_body_bytes: largest JSON request body (413 beyond).
        max_upload_bytes: largest file upload or snapshot restore body.
        reap_interval: seconds between sweeps that destroy sandboxes past their deadline
            or whose lease lapsed.
        session_grace: seconds a ``session``-lease sandbox lives with no connection
            of its client holding it (time to attach after the create, or to reconnect).
        observers: event sinks for every sandbox (an audit log).
        work_dir: where snapshots are staged while they stream (a private
            temporary directory by default, removed at shutdown).
        capacity_memory: memory all sandboxes may hold together (``None``: what
            the default backend reports, e.g. Docker's host memory).
        capacity_cpus: CPUs all sandboxes may hold together (``None``: the backend's).
        aging: seconds after which a queued create moves up one priority band.
        max_queue: creates waiting at once on the whole server (429 ``queue_full`` beyond).
        pools: warm pools (:mod:`agentnest.server.pools`) a create may claim from by name.
        database: the audit and usage database (:mod:`agentnest.server.db`): ``sqlite:///PATH``
            or ``postgresql://...`` (``None``: none; the JSONL audit log only).
        retention: seconds of history the database keeps (``None``: forever).
        migrate: bring the database's schema up to date at start (else it must be already:
            ``agentnest serve db upgrade``).
        tracing: OpenTelemetry spans of requests, admissions and starts, where
            ``opentelemetry-api`` is installed (:mod:`agentnest.server.tracing`).
        tracer_provider: where those spans go (``None``: the global provider).
        server_timeout: seconds after which a server sharing the database that stopped
            sending heartbeats counts as gone: its open sandbox rows are ended (``lost``).
        leader_lease: seconds of the leader's lease among replicas on PostgreSQL
            (:mod:`agentnest.server.shared`): a successor takes over within it.
        verify_interval: seconds between checks that the backend still runs each sandbox (it
            is the truth of what exists): one removed or stopped behind the server's back
            (``docker rm``, a lost node) is ended and its share freed.
        advertise_url: where the other replicas reach this server (``http://10.0.0.7:8700``):
            requests for its sandboxes that reach them are forwarded here
            (:mod:`agentnest.server.forward`).  ``None``: not reachable; they answer 404.
        approvals: approval rules asked before every operation in every sandbox the server
            starts (``agentnest serve --approvals RULES.yaml``; :func:`agentnest.profiles.load_rules`),
            whichever API the operation came through; a denial is the client's 403.
        e2b: serve the E2B-compatible API on the same port (:mod:`agentnest.server.e2b`, docs/e2b.md).
        e2b_templates: what each E2B template name means here (:class:`~agentnest.server.e2b.E2BTemplate`:
            a warm pool, or an image and backend); ``base`` and ``code-interpreter-v1`` by default.
        e2b_domain: the domain of E2B host names ``{port}-{id}.{domain}`` this server answers
            (``E2B_DOMAIN`` clients, behind a TLS proxy); ``None``: header routing only.
    """

    tokens: TokenStore
    backends: Mapping[str, str | RuntimeBackend] = dataclasses.field(
        default_factory=lambda: {"docker": "docker"}
    )
    image: str | None = None
    default_lifetime: float = 600.0
    max_sandboxes: int = 64
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD
    reap_interval: float = 1.0
    session_grace: float = 15.0
    observers: Sequence[Observer] = ()
    work_dir: Path | None = None
    capacity_memory: int | None = None
    capacity_cpus: float | None = None
    aging: float = DEFAULT_AGING
    max_queue: int = DEFAULT_MAX_QUEUE
    pools: Sequence[PoolSpec] = ()
    database: str | None = None
    retention: float | None = DEFAULT_RETENTION
    migrate: bool = True
    tracing: bool = True
    tracer_provider: Any = None
    server_timeout: float = 60.0
    leader_lease: float = 15.0
    advertise_url: str | None = None
    verify_interval: float = 10.0
    approvals: RuleApprover | None = None
    e2b: bool = True
    e2b_templates: Mapping[str, E2BTemplate] = dataclasses.field(
        default_factory=lambda: dict(DEFAULT_TEMPLATES)
    )
    e2b_domain: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, TokenStore):
            raise ConfigurationError("tokens must be a TokenStore")
        if not self.backends:
            raise ConfigurationError("the server needs at least one backend")
        for name in ("max_sandboxes", "max_body_bytes", "max_upload_bytes", "max_queue"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(f"{name}={value!r} must be a positive integer")
        if self.capacity_memory is not None and (
            isinstance(self.capacity_memory, bool)
            or not isinstance(self.capacity_memory, int)
            or self.capacity_memory <= 0
        ):
            raise ConfigurationError(f"capacity_memory={self.capacity_memory!r} must be a positive size")
        if self.capacity_cpus is not None and not (
            isinstance(self.capacity_cpus, (int, float)) and 0 < self.capacity_cpus < math.inf
        ):
            raise ConfigurationError(f"capacity_cpus={self.capacity_cpus!r} must be a positive number")
        if self.advertise_url is not None and not re.fullmatch(r"https?://[^/?#\s]+/?", self.advertise_url):
            raise ConfigurationError(
                f"advertise_url={self.advertise_url!r} must be http://HOST:PORT or https://HOST:PORT "
                "(where the other replicas reach this server), with no path"
            )
        if self.approvals is not None and not isinstance(self.approvals, RuleApprover):
            raise ConfigurationError("approvals must be a RuleApprover (agentnest.profiles.load_rules)")
        if not all(isinstance(n, str) and isinstance(t, E2BTemplate) for n, t in self.e2b_templates.items()):
            raise ConfigurationError("e2b_templates must map template names to E2BTemplate objects")
        if self.e2b_domain is not None and not re.fullmatch(r"[a-z0-9.-]{1,200}", self.e2b_domain):
            raise ConfigurationError(
                f"e2b_domain={self.e2b_domain!r} must be a DNS domain such as 'sandbox.example.org'"
            )
        pool_specs(self.pools)  # unique names
        if not all(isinstance(p, PoolSpec) for p in self.pools):
            raise ConfigurationError("pools must be PoolSpec objects (see agentnest.server.pools.load_pools)")
        if self.retention is not None and not (
            isinstance(self.retention, (int, float))
            and not isinstance(self.retention, bool)
            and self.retention > 0
        ):
            raise ConfigurationError(
                f"retention={self.retention!r} must be a positive number of seconds or None"
            )
        seconds: tuple[str, ...] = ("default_lifetime", "reap_interval", "aging", "session_grace")
        seconds += ("server_timeout", "leader_lease", "verify_interval")
        for name in seconds:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds")


__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_MAX_UPLOAD", "DEFAULT_RETENTION", "ServerSettings"]
