"""Prometheus metrics of ``agentnest serve`` (``GET /metrics``, through ``prometheus_client``).

Each server has its own registry (several apps in one process never mix).
What is counted as it happens: admission decisions and queue waits, create
latency split by launch type, lease expiries, backend errors.  What is a state
is read at scrape time from the server's own bookkeeping (sandboxes by tenant
and state, held memory and CPUs, queue depth, capacity), so a scrape costs
O(tenants + sandboxes) and never touches the engine.

Names follow the conventions of the anchors (research/manager.md §0.10):
``agentnest_sandbox_create_seconds{launch="cold|warm"}`` as agent-sandbox's
``launch_type``; the queue metrics nobody else exports.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

from ..errors import MissingDependencyError

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError(
        "agentnest serve's /metrics needs prometheus_client: pip install 'agentnest[server]'"
    ) from exc

if TYPE_CHECKING:
    from .admission import Admission
    from .entries import Entry
    from .pools import WarmPool
    from .shared import SharedAdmission

#: The exposition format's content type (text 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # agentnest.server.routes.health serves it
#: Seconds: starts take from ~0.1 s (warm) to minutes (an image build).
_CREATE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 180.0)
#: Seconds in the admission queue, up to the 600 s ceiling.
_WAIT_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class ServerState(Protocol):
    """The bookkeeping a scrape reads (:class:`~agentnest.server.service.Service` has it)."""

    @property
    def admission(self) -> Admission: ...
    @property
    def entries(self) -> Mapping[str, Entry]: ...
    @property
    def pools(self) -> Mapping[str, WarmPool]: ...
    @property
    def shared(self) -> SharedAdmission | None: ...
    def is_leader(self) -> bool: ...


class _State(Collector):
    """Gauges read from the service at scrape time."""

    def __init__(self, service: ServerState) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        admission = service.admission
        running: dict[str, int] = {}
        for entry in service.entries.values():
            running[entry.grant.tenant] = running.get(entry.grant.tenant, 0) + 1
        sandboxes = GaugeMetricFamily(
            "agentnest_sandboxes", "Sandboxes of the server by tenant and state.", labels=["tenant", "state"]
        )
        held_memory = GaugeMetricFamily(
            "agentnest_tenant_memory_bytes", "Memory held by each tenant's sandboxes.", labels=["tenant"]
        )
        held_cpus = GaugeMetricFamily(
            "agentnest_tenant_cpus", "CPUs held by each tenant's sandboxes.", labels=["tenant"]
        )
        depths = admission.queue_depths()
        queue = GaugeMetricFamily(
            "agentnest_queue_depth", "Creates waiting for admission, by tenant.", labels=["tenant"]
        )
        for tenant in sorted(set(running) | set(depths) | set(admission.tenant_names())):
            held = admission.holdings(tenant)
            sandboxes.add_metric([tenant, "running"], running.get(tenant, 0))
            # Admitted, not yet (or no longer) a live sandbox: a start in progress.
            sandboxes.add_metric([tenant, "starting"], max(0, held.sandboxes - running.get(tenant, 0)))
            sandboxes.add_metric([tenant, "queued"], depths.get(tenant, 0))
            held_memory.add_metric([tenant], held.memory)
            held_cpus.add_metric([tenant], held.cpus)
            queue.add_metric([tenant], depths.get(tenant, 0))
        yield sandboxes
        yield held_memory
        yield held_cpus
        yield queue
        capacity = GaugeMetricFamily(
            "agentnest_capacity", "What all sandboxes may hold together.", labels=["resource"]
        )
        capacity.add_metric(["sandboxes"], admission.capacity.sandboxes)
        capacity.add_metric(["memory_bytes"], admission.capacity.memory)
        capacity.add_metric(["cpus"], admission.capacity.cpus)
        yield capacity
        leader = GaugeMetricFamily(
            "agentnest_leader",
            "1 if this server runs the once-for-all duties (the sweep of gone servers, the retention): "
            "alone, or the holder of the leader's lease among replicas.",
        )
        leader.add_metric([], 1 if service.is_leader() else 0)
        yield leader
        if service.shared is not None:
            refused = CounterMetricFamily(
                "agentnest_shared_admission_refusals",
                "Grants of this replica the shared database refused: another replica took the room first.",
            )
            refused.add_metric([], service.shared.refused)
            yield refused
        pools = GaugeMetricFamily(
            "agentnest_pool_sandboxes", "Warm sandboxes by pool and state.", labels=["pool", "state"]
        )
        lag = GaugeMetricFamily(
            "agentnest_pool_refill_lag_seconds",
            "How long each pool has been below its minimum of ready sandboxes (0: it is not).",
            labels=["pool"],
        )
        now = time.monotonic()
        for name, pool in sorted(service.pools.items()):
            pools.add_metric([name, "ready"], len(pool.ready))
            pools.add_metric([name, "starting"], pool.starting)
            lag.add_metric([name], pool.refill_lag(now))
        yield pools
        yield lag


class ServerMetrics:
    """The metrics of one server: the service's
    :class:`~agentnest.server.service.MetricsSink`, and the gauges of its state."""

    def __init__(self, service: ServerState) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_State(service))
        self.admissions = Counter(
            "agentnest_admissions",
            "Admission decisions: granted, or rejected with a reason.",
            ["tenant", "outcome", "reason"],
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "agentnest_queue_wait_seconds",
            "Time a create waited for admission (granted or not).",
            ["tenant"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.create_seconds = Histogram(
            "agentnest_sandbox_create_seconds",
            "Time to start a sandbox once admitted, by backend and launch type.",
            ["backend", "launch"],
            buckets=_CREATE_BUCKETS,
            registry=self.registry,
        )
        self.lease_expiries = Counter(
            "agentnest_lease_expiries",
            "Sandboxes reaped because their lease lapsed.",
            ["tenant", "lease"],
            registry=self.registry,
        )
        self.backend_errors = Counter(
            "agentnest_backend_errors",
            "Sandbox starts that failed in the backend (engine unreachable, start failed).",
            ["backend"],
            registry=self.registry,
        )
        self.pool_claims = Counter(
            "agentnest_pool_claims",
            "Creates that named a warm pool: served warm, started cold, or refused empty.",
            ["pool", "outcome"],
            registry=self.registry,
        )
        service.admission.on_decision.append(self.decided)

    def decided(self, outcome: str, tenant: str, reason: str | None, waited: float) -> None:
        self.admissions.labels(tenant, outcome, reason or "").inc()
        self.queue_wait.labels(tenant).observe(max(0.0, waited))

    def backend_error(self, backend: str) -> None:
        self.backend_errors.labels(backend).inc()

    def created(self, backend: str, launch: str, seconds: float) -> None:
        self.create_seconds.labels(backend, launch).observe(seconds)

    def pool_claimed(self, pool: str, outcome: str) -> None:
        self.pool_claims.labels(pool, outcome).inc()

    def lease_expired(self, tenant: str, lease: str) -> None:
        self.lease_expiries.labels(tenant, lease).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "ServerMetrics", "ServerState"]
