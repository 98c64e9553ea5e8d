"""The sandboxes of ``agentnest serve``: settings, ownership by token, admission by tenant.

:class:`Service` is the server's registry.  Every sandbox belongs to the
token that created it; every create passes the token's ceiling (403 beyond
it), the token's own count, and then fair admission between tenants
(:mod:`agentnest.server.admission`): it waits its turn up to its
``max_wait`` or is refused with 429, a reason and ``Retry-After``.  The HTTP
routes are in :mod:`agentnest.server.routes`.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import anyio

from .._core import core_of
from ..aio import AsyncSandbox
from ..config import ResourceLimits, parse_size
from ..egress.proxy import parse_ip
from ..errors import (
    AdmissionRefusedError,
    AgentNestError,
    BackendError,
    ConfigurationError,
    PolicyDeniedError,
)
from ..events import EventType
from ..policy import NetworkMode, NetworkPolicy, SecurityPolicy
from ..runtime.base import RuntimeBackend, SandboxHandle
from ..runtime.registry import get_backend
from ..secrets import Secret
from . import schemas as s
from .admission import Admission, Position, Resources
from .auth import Token
from .channel_audit import Emit
from .entries import Entry, Lease
from .pools import POOL_TICK, PoolSpec, WarmPool
from .refused import Refused
from .service_admit import UNBOUNDED_CPUS, UNBOUNDED_MEMORY, AdmitMixin
from .service_db import DatabaseMixin
from .settings import ServerSettings
from .tenants import BANDS, POOL_PREFIX, Tenant
from .tracing import Tracing

if TYPE_CHECKING:
    from .recorder import Recorder
    from .shared import SharedAdmission

log = logging.getLogger("agentnest.server")
T = TypeVar("T")

#: Seconds a new sandbox is left alone by :meth:`Service.verify` (its container may still be starting).
VERIFY_GRACE = 2.0
#: Agent channels (websockets) open at once per sandbox: each is an agent process in it.
MAX_CHANNELS = 4
#: Python sessions per sandbox.
MAX_SESSIONS = 8


class MetricsSink(Protocol):
    """What the service counts as it happens, and the text a scrape reads.

    :class:`~agentnest.server.metrics.ServerMetrics` is the one the app sets
    when ``prometheus_client`` is installed; the service knows only this.
    """

    def backend_error(self, backend: str) -> None:
        """A sandbox start failed in ``backend``."""

    def created(self, backend: str, launch: str, seconds: float) -> None:
        """A sandbox started in ``seconds`` once admitted; ``launch`` is ``cold`` or ``warm``."""

    def pool_claimed(self, pool: str, outcome: str) -> None:
        """A create named a warm pool: served ``warm``, started ``cold``, or refused ``empty``."""

    def lease_expired(self, tenant: str, lease: str) -> None:
        """A sandbox was reaped because its ``lease`` (kind) lapsed."""

    def render(self) -> bytes:
        """Everything counted, in the exposition format of ``GET /metrics``."""


_DEFAULTS = ResourceLimits()
#: What a claim from a warm pool cannot ask for: the warm sandbox is already running.
POOL_FIXED = frozenset(
    {
        "image", "backend", "memory", "cpus", "pids", "workspace_size", "scratch_size", "workdir",
        "read_only_root", "environment", "secrets", "secret_files", "network", "policy",
    }
)  # fmt: skip


async def _until_gone(work: Awaitable[T], client_gone: Callable[[], Awaitable[object]] | None) -> T | None:
    """``work``'s result, or None as soon as ``client_gone`` returns (``work`` is cancelled)."""
    task = asyncio.ensure_future(work)
    if client_gone is None:
        return await task
    watcher = asyncio.ensure_future(client_gone())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


#: Seconds without use before an ``idle`` lease lapses, when the client names none.
DEFAULT_IDLE_TIMEOUT = 300.0


def handle_of(sandbox: AsyncSandbox) -> SandboxHandle:
    # The backend handle of a sandbox the server owns: needed to open further
    # agent channels for the remote backend.
    return sandbox.handle


def emitter_of(sandbox: AsyncSandbox) -> Emit:
    # The sandbox's own guard: channel events get its redaction and its observers.
    return core_of(sandbox).guard.emit


class Service(AdmitMixin, DatabaseMixin):
    """The sandboxes of one server, by token.  Runs on the server's event loop (no locks needed)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.backends: dict[str, RuntimeBackend] = {}
        for name, backend in settings.backends.items():
            instance = get_backend(backend) if isinstance(backend, str) else backend
            if not isinstance(instance, RuntimeBackend):
                raise ConfigurationError(f"backend {name!r} is not a RuntimeBackend")
            self.backends[name] = instance
        self.default_backend = next(iter(self.backends))
        if settings.image is not None:
            self.image = settings.image
        else:
            from ..sandbox import default_image

            self.image = default_image()
        self.entries: dict[str, Entry] = {}
        self.pending: dict[str, int] = {}
        self.closed = False
        self._work_dir: Path | None = None
        self.admission = Admission(
            Resources(
                settings.max_sandboxes,
                settings.capacity_memory or UNBOUNDED_MEMORY,
                settings.capacity_cpus or UNBOUNDED_CPUS,
            ),
            aging=settings.aging,
            max_queue=settings.max_queue,
        )
        self._capacity_known = settings.capacity_memory is not None and settings.capacity_cpus is not None
        self.metrics: MetricsSink | None = None
        """Set by the app when prometheus_client is installed."""
        self.pools: dict[str, WarmPool] = {}
        for spec in settings.pools:
            backend_name = spec.backend or self.default_backend
            if backend_name not in self.backends:
                raise ConfigurationError(
                    f"pool {spec.name}: the server has no backend {backend_name!r} "
                    f"(it has {list(self.backends)})"
                )
            self.pools[spec.name] = WarmPool(spec, backend_name, spec.image or self.image)
        self.pool_wake = asyncio.Event()
        self.tracing = Tracing(settings.tracer_provider, enabled=settings.tracing)
        self.recorder: Recorder | None = None
        """The audit and usage database's writer (``None``: the server keeps no database)."""
        if settings.database is not None:
            from .db import Database
            from .recorder import Recorder

            self.recorder = Recorder(
                Database(settings.database), retention=settings.retention, url=settings.advertise_url
            )
            self.admission.on_decision.append(self.recorder.decision)
        self.shared: SharedAdmission | None = None
        if self.recorder is not None and self.recorder.database.dialect == "postgresql":
            # Only PostgreSQL is shared by replicas (one server per SQLite file).
            from .shared import SharedAdmission

            self.shared = SharedAdmission(self.admission, self.recorder.database, self.recorder.server)

    def tenant_of(self, token: Token) -> Tenant:
        tenant = self.settings.tokens.tenant(token.tenant)
        if tenant is None:
            raise PolicyDeniedError(
                f"this token's tenant {token.tenant!r} no longer exists; ask the operator to recreate it"
            )
        return tenant

    @property
    def work_dir(self) -> Path:
        """Where snapshots are staged: the operator's directory, or a private one made on first use."""
        if self._work_dir is None:
            if self.settings.work_dir is not None:
                self._work_dir = Path(self.settings.work_dir)
                self._work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            else:
                self._work_dir = Path(tempfile.mkdtemp(prefix="agentnest-serve-"))
        return self._work_dir

    # -- lookup ----------------------------------------------------------------

    def get(self, token: Token, sandbox_id: str) -> Entry:
        entry = self.entries.get(sandbox_id)
        # The same answer for "never existed" and "another token's": nothing leaks.
        if entry is None or entry.token_id != token.id:
            raise Refused(404, "not_found", f"no sandbox {sandbox_id!r:.80} for this token")
        return entry

    def count(self, token_id: str) -> int:
        live = sum(1 for e in self.entries.values() if e.token_id == token_id)
        return live + self.pending.get(token_id, 0)

    @asynccontextmanager
    async def slot(self, token: Token) -> AsyncIterator[None]:
        """Reserve room for one more sandbox of ``token`` while it is created."""
        await self.reap()
        if self.closed:
            raise Refused(503, "runtime_unavailable", "the server is shutting down")
        used = self.count(token.id)
        if used >= token.ceiling.max_sandboxes:
            raise Refused(
                429,
                "quota",
                f"this token already has {used} of at most {token.ceiling.max_sandboxes} sandboxes; "
                "destroy one first",
            )
        self.pending[token.id] = self.pending.get(token.id, 0) + 1
        try:
            yield
        finally:
            self.pending[token.id] -= 1
            if not self.pending[token.id]:
                del self.pending[token.id]

    # -- lifecycle ---------------------------------------------------------------

    def _request_terms(
        self, token: Token, tenant: Tenant, body: s.CreateSandbox
    ) -> tuple[float, float, int | None, Lease]:
        """A create's lifetime, queue wait, band and lease, each checked against the token and tenant."""
        ceiling = token.ceiling
        if body.timeout is not None and body.timeout > ceiling.max_timeout:
            raise PolicyDeniedError(
                f"timeout {body.timeout:g}s is beyond this token's max_timeout {ceiling.max_timeout:g}s"
            )
        if body.timeout is not None and body.timeout > tenant.max_lifetime:
            raise PolicyDeniedError(
                f"timeout {body.timeout:g}s is beyond tenant {tenant.name!r}'s max_lifetime "
                f"{tenant.max_lifetime:g}s"
            )
        timeout = body.timeout or min(
            self.settings.default_lifetime, ceiling.max_timeout, tenant.max_lifetime
        )
        max_wait = tenant.default_wait if body.max_wait is None else body.max_wait
        if max_wait > tenant.max_wait:
            raise PolicyDeniedError(
                f"max_wait {max_wait:g}s is beyond tenant {tenant.name!r}'s ceiling of {tenant.max_wait:g}s; "
                "ask for less"
            )
        if body.idle_timeout is not None and body.lease != "idle":
            raise ConfigurationError("idle_timeout goes with lease 'idle' only")
        lease = Lease(
            body.lease,
            (body.idle_timeout or DEFAULT_IDLE_TIMEOUT) if body.lease == "idle" else None,
        )
        band = None if body.priority is None else BANDS.index(body.priority)
        if band is not None and band < tenant.band:
            raise PolicyDeniedError(
                f"priority {body.priority!r} is above tenant {tenant.name!r}'s band {tenant.priority!r}"
            )
        return timeout, max_wait, band, lease

    async def create(
        self,
        token: Token,
        body: s.CreateSandbox,
        *,
        on_update: Callable[[Position], Awaitable[None]] | None = None,
        client_gone: Callable[[], Awaitable[object]] | None = None,
    ) -> Entry:
        ceiling = token.ceiling
        tenant = self.tenant_of(token)
        if body.pool is not None:
            pool = self._pool_for(token, body)
            claimed = await self._claim(token, tenant, pool, body, on_update, client_gone)
            if claimed is not None:
                return claimed
            # Drained with when_drained="cold": start one of the pool's kind the usual way.
            body = body.model_copy(
                update={
                    "pool": None,
                    "image": pool.image,
                    "backend": pool.backend_name,
                    "memory": pool.spec.memory,
                    "cpus": pool.spec.cpus,
                    "pids": pool.spec.pids,
                }
            )
        allowed_backends = ceiling.backends or (self.default_backend,)
        backend_name = body.backend or (
            self.default_backend if self.default_backend in allowed_backends else allowed_backends[0]
        )
        if backend_name not in allowed_backends:
            raise PolicyDeniedError(
                f"backend {backend_name!r} is beyond this token's ceiling; "
                f"it may use {list(allowed_backends)}"
            )
        backend = self.backends.get(backend_name)
        if backend is None:
            raise ConfigurationError(f"this server has no backend {backend_name!r}; GET /v1/info lists them")
        image = body.image or self.image
        if not ceiling.allows_image(image, self.image):
            allowed = list(ceiling.images) or [self.image]
            raise PolicyDeniedError(f"image {image!r} is beyond this token's ceiling; allowed: {allowed}")
        timeout, max_wait, band, lease = self._request_terms(token, tenant, body)
        if not body.read_only_root and not ceiling.writable_root:
            raise PolicyDeniedError("a writable root filesystem is beyond this token's ceiling")
        network = self._network(token, body.network)
        policy = self._policy(token, body.policy, network, image)
        memory = parse_size(body.memory, "memory") if body.memory is not None else None
        workspace = parse_size(body.workspace_size, "workspace_size") if body.workspace_size else None
        if workspace is not None and workspace > ceiling.max_workspace:
            raise PolicyDeniedError(
                f"workspace_size {workspace} is beyond this token's max_workspace {ceiling.max_workspace}"
            )
        environment: dict[str, str | Secret] = dict(body.environment)
        for name, value in body.secrets.items():
            environment[name] = Secret(value)
        for name, value in body.secret_files.items():
            environment[name] = Secret(value, as_file=True)
        # What the client did not ask for defaults to the smaller of the
        # usual default and the ceiling: not asking is never "asking for more".
        # The tmpfs sizes follow the memory (they live in it).
        memory = memory if memory is not None else min(_DEFAULTS.memory, ceiling.max_memory)
        if workspace is None:
            workspace = min(_DEFAULTS.workspace, ceiling.max_workspace, memory // 2)
        scratch = body.scratch_size if body.scratch_size is not None else min(_DEFAULTS.scratch, memory // 8)
        cpus = body.cpus if body.cpus is not None else min(_DEFAULTS.cpus, ceiling.max_cpus)
        pids = body.pids if body.pids is not None else min(_DEFAULTS.pids, ceiling.max_pids)
        async with self.slot(token):
            await self.require_database()
            grant = await self.admit(
                tenant,
                Resources(1, memory, cpus),
                band=band,
                max_wait=max_wait,
                on_update=on_update,
                client_gone=client_gone,
            )

            async def start() -> Entry:
                started = time.monotonic()
                try:
                    with self.tracing.span("agentnest.sandbox.start", backend=backend_name, image=image):
                        sandbox = await AsyncSandbox.create(
                            image,
                            timeout,
                            environment=environment,
                            workdir=body.workdir,
                            memory=memory,
                            cpus=cpus,
                            pids=pids,
                            workspace_size=workspace,
                            scratch_size=scratch,
                            backend=backend,
                            read_only_root=body.read_only_root,
                            security_policy=policy,
                            observers=self.observers(tenant.name, token.id),
                            approval_hook=self.settings.approvals,
                        )
                except BaseException as exc:
                    self.admission.release(grant)
                    if self.metrics is not None and isinstance(exc, BackendError):
                        self.metrics.backend_error(backend_name)
                    if self.recorder is not None and isinstance(exc, Exception):
                        self.recorder.create_failed(tenant.name, token.id, backend_name, exc)
                    raise
                if self.metrics is not None:
                    self.metrics.created(backend_name, "cold", time.monotonic() - started)
                entry = Entry(token.id, sandbox, backend_name, grant, lease)
                self.entries[sandbox.id] = entry
                await self._started(entry, "cold")
                return entry

            # Once admitted, the start runs to its end even if the client goes away: the
            # sandbox is then the token's (listed, reaped at its deadline), never a stray.
            return await asyncio.shield(asyncio.ensure_future(start()))

    def _network(self, token: Token, asked: s.NetworkIn) -> NetworkPolicy:
        ceiling = token.ceiling
        if asked.mode not in ceiling.network:
            raise PolicyDeniedError(
                f"network mode {asked.mode!r} is beyond this token's ceiling; "
                f"it may use {list(ceiling.network)}"
            )
        if asked.mode == NetworkMode.ALLOWLIST.value:
            for domain in asked.domains:
                name = domain.lower().rstrip(".")
                if not ceiling.allows_domain(name):
                    raise PolicyDeniedError(
                        f"allowlist domain {domain!r} is beyond this token's ceiling "
                        f"(allowed patterns: {list(ceiling.domains)})"
                    )
                # With subdomains a listed name also admits every name below it
                # (NetworkPolicy.subdomains): the ceiling must admit those as it
                # would admit the pattern '*.name'.  An address or a one-label
                # name admits only itself.
                below = "." in name and not name.startswith("*.") and parse_ip(name) is None
                if asked.subdomains and below and not ceiling.allows_domain("*." + name):
                    raise PolicyDeniedError(
                        f"allowlist domain {domain!r} with the names below it is beyond this token's "
                        f"ceiling (allowed patterns: {list(ceiling.domains)}); ask with subdomains=false "
                        "for exactly that name"
                    )
            return NetworkPolicy.allowlist(
                domains=tuple(asked.domains), ports=tuple(asked.ports), subdomains=asked.subdomains
            )
        if asked.domains:
            raise ConfigurationError(f"domains only go with network mode 'allowlist', not {asked.mode!r}")
        return NetworkPolicy.open() if asked.mode == NetworkMode.OPEN.value else NetworkPolicy.denied()

    def _policy(self, token: Token, asked: s.PolicyIn, network: NetworkPolicy, image: str) -> SecurityPolicy:
        ceiling = token.ceiling
        for name in ("max_output_bytes", "max_file_bytes"):
            value = getattr(asked, name)
            if value is not None and value > getattr(ceiling, name):
                raise PolicyDeniedError(
                    f"{name} {value} is beyond this token's ceiling {getattr(ceiling, name)}"
                )
        return SecurityPolicy(
            network=network,
            max_output_bytes=asked.max_output_bytes or ceiling.max_output_bytes,
            max_file_bytes=asked.max_file_bytes or ceiling.max_file_bytes,
            require_image_digest=asked.require_image_digest,
            # Forks inherit this policy: the guard itself holds them to the ceiling.
            allowed_images=tuple(ceiling.images) or (self.image,),
            read_only_root=not ceiling.writable_root,
            max_memory=ceiling.max_memory,
            max_cpus=ceiling.max_cpus,
            max_pids=ceiling.max_pids,
            max_timeout=ceiling.max_timeout,
        )

    # -- warm pools ------------------------------------------------------------------

    def _pool_for(self, token: Token, body: s.CreateSandbox) -> WarmPool:
        """The pool a create names, if the token may have its sandboxes and the body asks for nothing else."""
        pool = self.pools.get(str(body.pool))
        if pool is None:
            raise ConfigurationError(f"this server has no pool {body.pool!r:.60}; GET /v1/info lists them")
        # A warm sandbox is already running: what it was started with cannot change.
        fixed = sorted(body.model_fields_set & POOL_FIXED)
        if fixed:
            raise ConfigurationError(
                f"a claim from pool {pool.spec.name!r} takes the pool's sandbox as it is; drop {fixed}"
            )
        ceiling, spec = token.ceiling, pool.spec
        allowed_backends = ceiling.backends or (self.default_backend,)
        problems = []
        if pool.backend_name not in allowed_backends:
            problems.append(f"backend {pool.backend_name!r}")
        if not ceiling.allows_image(pool.image, self.image):
            problems.append(f"image {pool.image!r}")
        if spec.memory > ceiling.max_memory:
            problems.append(f"memory {spec.memory}")
        if spec.cpus > ceiling.max_cpus:
            problems.append(f"cpus {spec.cpus:g}")
        if spec.pids > ceiling.max_pids:
            problems.append(f"pids {spec.pids}")
        if "denied" not in ceiling.network:
            problems.append("network 'denied'")
        if problems:
            raise PolicyDeniedError(
                f"pool {spec.name!r} gives sandboxes beyond this token's ceiling: {', '.join(problems)}"
            )
        return pool

    async def _claim(
        self,
        token: Token,
        tenant: Tenant,
        pool: WarmPool,
        body: s.CreateSandbox,
        on_update: Callable[[Position], Awaitable[None]] | None,
        client_gone: Callable[[], Awaitable[object]] | None,
    ) -> Entry | None:
        """A warm sandbox of ``pool`` for ``token``, or None: drained and ``cold`` was asked for."""
        timeout, max_wait, band, lease = self._request_terms(token, tenant, body)
        policy = body.when_drained or pool.spec.when_drained
        started = time.monotonic()
        async with self.slot(token):
            await self.require_database()
            warm = pool.take()
            self.pool_wake.set()
            if warm is None:
                if policy == "cold":
                    self._count_claim(pool, "cold")
                    return None
                if policy == "wait":
                    warm = await _until_gone(pool.wait_for_one(started + max_wait), client_gone)
                if warm is None:
                    self._count_claim(pool, "empty")
                    raise AdmissionRefusedError(
                        f"pool {pool.spec.name!r} has no warm sandbox"
                        + (f" within max_wait={max_wait:g}s" if policy == "wait" else " now")
                        + f"; it refills at {pool.spec.refill_rate:g}/s",
                        "pool_empty",
                        max(1.0, math.ceil(1.0 / pool.spec.refill_rate)),
                    )
            try:
                grant = await self.admit(
                    tenant,
                    pool.spec.demand,
                    band=band,
                    max_wait=max(0.0, max_wait - (time.monotonic() - started)),
                    on_update=on_update,
                    client_gone=client_gone,
                    transfer=warm.grant,
                )
            except BaseException:
                pool.put_back(warm)
                raise
            sandbox = warm.sandbox
            left = sandbox.deadline - time.time()
            if left < timeout:
                await sandbox.extend(timeout - left + 1.0)
            entry = Entry(token.id, sandbox, pool.backend_name, grant, lease)
            entry.until = time.time() + timeout
            self.entries[sandbox.id] = entry
            await self._started(entry, "warm")
            pool.claimed += 1
            self._count_claim(pool, "warm")
            if self.metrics is not None:
                self.metrics.created(pool.backend_name, "warm", time.monotonic() - started)
            return entry

    def _count_claim(self, pool: WarmPool, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.pool_claimed(pool.spec.name, outcome)

    async def start_warm(self, spec: PoolSpec, backend_name: str, image: str) -> AsyncSandbox:
        """One warm sandbox of a pool (network denied; the defaults of the server otherwise)."""
        return await AsyncSandbox.create(
            image,
            spec.lifetime,
            memory=spec.memory,
            cpus=spec.cpus,
            pids=spec.pids,
            backend=self.backends[backend_name],
            security_policy=SecurityPolicy(
                network=NetworkPolicy.denied(),
                allowed_images=(image,),
                max_memory=spec.memory,
                max_cpus=spec.cpus,
                max_pids=spec.pids,
            ),
            observers=self.observers(POOL_PREFIX + spec.name, None),
            approval_hook=self.settings.approvals,
        )

    async def destroy_sandbox(self, sandbox: AsyncSandbox) -> None:
        try:
            await sandbox.destroy()
        except AgentNestError as exc:
            log.warning("destroying warm sandbox %s: %s", sandbox.id, exc)

    async def run_pools(self) -> None:
        """The refill loop: each pool's step, then sleep until woken (a claim) or a tick."""
        if not self.pools:
            return
        await self.capacity()
        while not self.closed:
            for pool in self.pools.values():
                try:
                    await pool.refill(
                        self.admission,
                        self.start_warm,
                        self.destroy_sandbox,
                        self.shared.confirm if self.shared is not None else None,
                    )
                except Exception:  # one pool's failure must not stop the others' refills
                    log.exception("refilling pool %s", pool.spec.name)
            self.pool_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pool_wake.wait(), POOL_TICK)

    async def fork(self, token: Token, parent: Entry, timeout: float | None) -> Entry:
        """A copy of ``parent`` for ``token``: admitted like a create, without waiting."""
        limits = parent.sandbox.config.limits
        async with self.slot(token):
            await self.require_database()
            grant = await self.admit(self.tenant_of(token), Resources(1, limits.memory, limits.cpus))
            try:
                child = await parent.sandbox.fork(timeout=timeout)
            except BaseException:
                self.admission.release(grant)
                raise
            # A fork's lease is its parent's kind, starting now.
            lease = Lease(parent.lease.kind, parent.lease.idle_timeout)
            entry = Entry(token.id, child, parent.backend_name, grant, lease)
            self.entries[child.id] = entry
            await self._started(entry, "fork")
        return entry

    async def destroy(self, entry: Entry, reason: str = "destroyed") -> None:
        if self.entries.pop(entry.sandbox.id, None) is not None and self.recorder is not None:
            self.recorder.ended(entry.sandbox.id, reason)
        self.admission.release(entry.grant)
        entry.gone.set()
        for session in list(entry.sessions.values()):
            try:
                await session.close()
            except AgentNestError:
                pass  # the sandbox goes next, its sessions with it
        entry.sessions.clear()
        try:
            await entry.sandbox.destroy()
        except AgentNestError as exc:
            # Already gone, or the engine failed: its deadline stops it anyway.
            log.warning("destroying sandbox %s: %s", entry.sandbox.id, exc)

    async def reap(self) -> None:
        """Destroy the sandboxes past their deadline (they stopped themselves already),
        and those whose lease lapsed: idle too long, or no connection of their client left."""
        now, clock = time.time(), time.monotonic()
        grace = self.settings.session_grace
        for entry in list(self.entries.values()):
            expires = entry.lease.expires(grace)
            if expires is not None and expires <= clock and entry.deadline > now:
                lease = entry.lease
                why = (
                    f"no use for {lease.idle_timeout:g}s"
                    if lease.kind == "idle"
                    else f"no connection of its client for {grace:g}s"
                )
                log.info(
                    "sandbox %s: its %s lease lapsed (%s); destroying it", entry.sandbox.id, lease.kind, why
                )
                with contextlib.suppress(Exception):  # the audit log's own failure is logged by it
                    emitter_of(entry.sandbox)(
                        EventType.LEASE_EXPIRED,
                        {"lease": lease.kind, "reason": why, "tenant": entry.grant.tenant},
                        "server",
                    )
                if self.metrics is not None:
                    self.metrics.lease_expired(entry.grant.tenant, lease.kind)
                await self.destroy(entry, "lease_expired")
            elif entry.deadline <= now:
                await self.destroy(entry, "deadline")

    async def verify(self) -> int:
        """End the sandboxes the backend no longer runs although the server never ended them
        (removed or stopped behind its back: ``docker rm``, a lost node): their rows end as
        ``gone`` and their share is free.  The backend is the truth of what exists.  The number ended."""
        now = time.time()
        entries = [
            e
            for e in self.entries.values()
            if not e.sandbox.destroyed and e.deadline > now and now - e.created > VERIFY_GRACE
        ]
        if not entries:
            return 0

        def check() -> list[tuple[Entry, str | None]]:
            gone: list[tuple[Entry, str | None]] = []
            for entry in entries:
                backend, handle = entry.sandbox.backend, handle_of(entry.sandbox)
                try:
                    if not backend.is_running(handle):
                        gone.append((entry, backend.exit_reason(handle)))
                except Exception as exc:  # the engine unreachable: unknown, never "gone"
                    log.debug("checking sandbox %s: %s", entry.sandbox.id, exc)
                    continue
            return gone

        ended = 0
        for entry, why in await anyio.to_thread.run_sync(check):
            if self.entries.get(entry.sandbox.id) is entry and not entry.sandbox.destroyed:
                log.warning(
                    "sandbox %s: the backend no longer runs it (%s); ending it", entry.sandbox.id, why
                )
                await self.destroy(entry, "gone")
                ended += 1
        return ended

    async def close(self) -> None:
        self.closed = True
        for pool in self.pools.values():
            await pool.close(self.admission, self.destroy_sandbox)
        entries = list(self.entries.values())
        async with anyio.create_task_group() as tg:
            for entry in entries:
                tg.start_soon(self.destroy, entry, "server_stopped")
        if self.recorder is not None:
            await self.recorder.close()
            if self.recorder.queued == 0:  # every end written: nothing for the others to close
                await self.recorder.deregister()
            self.recorder.database.close()
        if self._work_dir is not None and self.settings.work_dir is None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    # -- descriptions ------------------------------------------------------------

    async def describe(self, entry: Entry, *, fresh: bool = False) -> s.SandboxOut:
        """The wire description; ``fresh``: just started or claimed, so running without asking the
        engine (an inspect costs ~8 ms, a third of a warm claim)."""
        sandbox = entry.sandbox
        config = sandbox.config
        backend = sandbox.backend
        handle = handle_of(sandbox)

        def state() -> tuple[bool, str | None]:
            if sandbox.destroyed:
                return False, "it was destroyed"
            running = backend.is_running(handle)
            return running, None if running else backend.exit_reason(handle)

        if fresh and not sandbox.destroyed:
            running, reason = True, None
        else:
            running, reason = await anyio.to_thread.run_sync(state)
        return s.SandboxOut(
            id=sandbox.id,
            image=config.image,
            backend=entry.backend_name,
            oci_runtime=backend.oci_runtime,
            created=entry.created,
            deadline=entry.deadline,
            expires_in=max(0.0, round(entry.deadline - time.time(), 3)),
            running=running,
            memory=config.limits.memory,
            cpus=config.limits.cpus,
            pids=config.limits.pids,
            network=config.network.mode.value,
            read_only_root=config.read_only_root,
            exit_reason=reason,
            lease=entry.lease.out(self.settings.session_grace),
        )
