"""Step M: the manager (``agentnest serve``): admission between tenants (issue 14's targets).

- M1: one admission decision with 1,000 requests queued across 50 tenants: a
  sandbox is released and the dispatcher picks the next request by band,
  weighted dominant share and age, then a new request joins (the queue stays at
  1,000).  Pure logic on one event loop, no engine.  Target: p99 <= 2 ms.
- M2: a create joining that queue (``submit``: caps, queue bounds, one dispatch).
- M4: ``GET /metrics`` over loopback HTTP with 1,000 sandboxes recorded across 50
  tenants.  Target: <= 50 ms.
- M5: a warm-pool claim through the HTTP API until its first command returns
  (``POST /v1/sandboxes {"pool"}`` then ``POST .../exec``), next to a cold create
  the same way, the server recording into SQLite as `agentnest serve` does by default.
  Target: p50 <= 20 ms (agent-sandbox's warm claims: 35-137 ms).
- M3: a client holding a ``session``-lease sandbox through the remote backend is
  SIGKILLed; time until the server has reaped it and the engine has no container
  left.  Target: within the lease (the grace) + 5 s.
- M8: admission shared by replicas on PostgreSQL: one grant confirmed by its
  transaction (advisory lock, the sums of what every replica holds, the new
  row; the previous grant's release written in the same transaction), with
  1,000 sandboxes held by other replicas across 50 tenants, on a private
  PostgreSQL server on loopback.  Floor column: M1 (the decision of one
  replica alone).  Target: the admission decision's p99 <= 2 ms.
- M6, M7: a command over the HTTP API (``POST .../exec ["true"]``) while the
  manager records every event in its database, SQLite (M6) and a private
  PostgreSQL server (M7), next to the same server without a database (the floor
  column): what central audit costs a command.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time

from doubles.postgres import postgres_server
from harness import Plan, Result, Series, Target

from agentnest.server.admission import Admission, Grant, Resources
from agentnest.server.tenants import BANDS, Tenant

TENANTS = 50
QUEUED = 1000
GIB = 1 << 30


async def _decisions(samples: int) -> tuple[Series, Series]:
    rng = random.Random(14)
    tenants = [
        Tenant(
            f"t{i:02d}",
            weight=rng.choice((1.0, 1.0, 2.0, 4.0)),
            priority=BANDS[i % 3],
            max_sandboxes=1000,
            max_memory=1000 * GIB,
            max_cpus=1000.0,
            rate=1e6,
            burst=1_000_000,
            max_queued=QUEUED,
        )
        for i in range(TENANTS)
    ]
    one = Resources(1, GIB // 2, 1.0)
    capacity = 200
    adm = Admission(Resources(capacity, capacity * GIB, float(capacity)), max_queue=QUEUED * 2)
    held: list[Grant] = []
    for i in range(capacity):  # the server is full
        held.append(await adm.acquire(tenants[i % TENANTS], one, max_wait=0))
    tickets = [adm.submit(tenants[i % TENANTS], one, max_wait=600) for i in range(QUEUED)]
    assert adm.queued == QUEUED
    decide = Series(f"release + dispatch, {QUEUED} queued / {TENANTS} tenants", "ms")
    join = Series("submit into the full queue", "ms")
    for _ in range(samples):
        victim = held.pop(rng.randrange(len(held)))
        t0 = time.perf_counter()
        adm.release(victim)
        decide.samples.append(time.perf_counter() - t0)
        granted = [t for t in tickets if t.future.done()]
        assert len(granted) == 1, "one release admits exactly one request"
        tickets.remove(granted[0])
        held.append(granted[0].future.result())
        t0 = time.perf_counter()
        tickets.append(adm.submit(tenants[rng.randrange(TENANTS)], one, max_wait=600))
        join.samples.append(time.perf_counter() - t0)
    for ticket in tickets:
        ticket.future.cancel()
    return decide, join


def _shared_grants(samples: int, url: str) -> Series:
    """Database.hold cycles: release the last grant and take a new one, 1,000 held elsewhere."""
    import uuid

    from agentnest.server.db import Database

    db = Database(url)
    try:
        db.upgrade()
        one = Resources(1, GIB // 2, 1.0)
        roomy = Resources(10_000, 10_000 * GIB, 10_000.0)
        for i in range(QUEUED):
            kw = {"server": f"other{i % 3}", "tenant": f"t{i % TENANTS:02d}", "demand": one}
            assert db.hold(uuid.uuid4().hex, **kw, tenant_limit=roomy, capacity=roomy) is None
        series = Series("grant confirmed across replicas, 1,000 held / 50 tenants", "ms")
        last: list[str] = []
        for i in range(samples):
            hold = uuid.uuid4().hex
            tenant = f"t{i % TENANTS:02d}"
            t0 = time.perf_counter()
            refused = db.hold(
                hold,
                server="me",
                tenant=tenant,
                demand=one,
                tenant_limit=roomy,
                capacity=roomy,
                released=last,
            )
            series.samples.append(time.perf_counter() - t0)
            assert refused is None
            last = [hold]
        return series
    finally:
        db.close()


def _scrapes(samples: int) -> Series:
    """GET /metrics over loopback HTTP with 1,000 sandboxes recorded across 50 tenants."""
    import tempfile
    from pathlib import Path

    import httpx

    from agentnest.server.app import ServerSettings, create_app
    from agentnest.server.auth import Ceiling, TokenStore
    from agentnest.server.entries import Entry
    from agentnest.server.thread import serve_in_thread

    series = Series("GET /metrics, 1,000 sandboxes / 50 tenants recorded", "ms")
    with tempfile.TemporaryDirectory() as tmp:
        store = TokenStore(Path(tmp) / "tokens.json")
        _, secret = store.create("root", Ceiling(), admin=True)
        # The server never starts a sandbox here: the backend is named, never called.
        # No sweep during the run: the recorded entries are bookkeeping, not sandboxes.
        app = create_app(ServerSettings(tokens=store, image="IMAGE", max_sandboxes=2000, reap_interval=3600))
        service = app.state.service
        big = {
            name: Tenant(name, max_sandboxes=100, max_memory=100 * GIB, max_cpus=100.0, rate=1e6, burst=10**6)
            for name in (f"t{i:02d}" for i in range(TENANTS))
        }

        async def fill() -> None:
            for i in range(1000):
                # What a scrape reads of a live sandbox: its grant (tenant, resources).
                entry = Entry.__new__(Entry)
                entry.grant = await service.admission.acquire(
                    big[f"t{i % TENANTS:02d}"], Resources(1, GIB // 2, 1.0), max_wait=0
                )
                service.entries[f"sb{i:04d}"] = entry

        asyncio.run(fill())
        headers = {"Authorization": f"Bearer {secret}"}
        with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=headers) as http:
            try:
                for _ in range(samples):
                    t0 = time.perf_counter()
                    response = http.get("/metrics")
                    series.samples.append(time.perf_counter() - t0)
                    assert response.status_code == 200 and 'state="running"' in response.text
            finally:
                service.entries.clear()  # not sandboxes: nothing for the shutdown to destroy
    return series


def bench_manager(backend: str, plan: Plan) -> list[Result]:
    """M1 (admission decision), M2 (joining the queue), M3 (crashed client reaped)."""
    samples = 500 if plan.quick else 3000
    decide, join = asyncio.run(_decisions(samples))
    shared: list[Result] = []
    try:
        with postgres_server() as pg:
            shared.append(
                Result(
                    backend,
                    "M8",
                    "admission across replicas (PostgreSQL)",
                    _shared_grants(samples // 3, pg.create_database("shared")),
                    decide,
                    Target("p99_le", 2.0),
                    notes=[
                        "floor column: M1, one replica alone",
                        "private server, loopback, fsync off (a disk-backed one adds its flush per grant)",
                    ],
                )
            )
    except LookupError as exc:
        print(f"M8 skipped: {exc}")
    return [
        Result(
            backend,
            "M1",
            "admission decision (1,000 queued, 50 tenants)",
            decide,
            target=Target("p99_le", 2.0),
        ),
        *shared,
        Result(backend, "M2", "admission: a create joins the queue", join),
        Result(
            backend,
            "M4",
            "/metrics scrape, 1,000 sandboxes recorded",
            _scrapes(50 if plan.quick else 200),
            target=Target("p50_le", 50.0),
        ),
        *bench_manager_engine(backend, plan),
    ]


#: A client that takes a session-lease sandbox through the remote backend, says its id, waits to die.
_CLIENT = """
import sys
from agentnest import Sandbox
from agentnest.runtime.remote import RemoteBackend
url, secret, backend, image = sys.argv[1:5]
sandbox = Sandbox(image, timeout=300, memory="64m",
                  backend=RemoteBackend(url, secret, backend=backend, lease="session"))
print(sandbox.id, flush=True)
sys.stdin.read()
"""


def _crashed_clients(backend: str, samples: int, grace: float) -> Series:
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import docker

    from agentnest.runtime.docker import base_image
    from agentnest.server.app import ServerSettings, create_app
    from agentnest.server.auth import Ceiling, TokenStore
    from agentnest.server.thread import serve_in_thread

    series = Series(
        f"SIGKILL -> sandbox reaped and container removed (session lease, grace {grace:g} s)", "ms"
    )
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        store = TokenStore(Path(tmp) / "tokens.json")
        _, secret = store.create("bench", Ceiling(max_sandboxes=4, max_memory=64 << 20, backends=(backend,)))
        settings = ServerSettings(
            tokens=store,
            backends={backend: backend},
            image=base_image(),
            session_grace=grace,
            reap_interval=0.5,
        )
        app = create_app(settings)
        service = app.state.service
        with serve_in_thread(app) as url:
            for _ in range(samples):
                with subprocess.Popen(
                    [sys.executable, "-c", _CLIENT, url, secret, backend, base_image()],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                ) as proc:
                    assert proc.stdout is not None
                    sandbox = proc.stdout.readline().strip()
                    proc.kill()
                    proc.wait(30)
                killed = time.perf_counter()
                label = {"label": f"agentnest.sandbox={sandbox}"}
                deadline = killed + 60
                while sandbox in service.entries or client.api.containers(all=True, filters=label):
                    if time.perf_counter() > deadline:
                        raise RuntimeError(f"sandbox {sandbox} was not reaped within 60 s")
                    time.sleep(0.02)  # paces the poll of the engine
                series.samples.append(time.perf_counter() - killed)
    client.close()
    return series


def bench_manager_engine(backend: str, plan: Plan) -> list[Result]:
    """M5: warm-pool claim until the first command returns; M3: a crashed client's sandboxes reaped."""
    warm, cold = _warm_claims(backend, 10 if plan.quick else 40)
    results = [
        Result(
            backend,
            "M5",
            "warm-pool claim + first command, HTTP",
            warm,
            cold,
            Target("p50_le", 20.0),
            notes=[
                "floor column: the same through a cold create (no pool)",
                "agent-sandbox warm claims: p50 35-137 ms",
            ],
        )
    ]
    samples = 60 if plan.quick else 300
    bare = _recorded_execs(backend, samples, None)
    with tempfile.TemporaryDirectory() as tmp:
        results.append(
            Result(
                backend,
                "M6",
                "command over HTTP, recorded in SQLite",
                _recorded_execs(backend, samples, f"sqlite:///{tmp}/manager.db"),
                bare,
                notes=["floor column: the same server without a database"],
            )
        )
    try:
        with postgres_server() as pg:
            results.append(
                Result(
                    backend,
                    "M7",
                    "command over HTTP, recorded in PostgreSQL",
                    _recorded_execs(backend, samples, pg.create_database("bench")),
                    bare,
                    notes=["floor column: the same server without a database; a private server on loopback"],
                )
            )
    except LookupError as exc:
        print(f"M7 skipped: {exc}")
    grace = 2.0
    crashed = _crashed_clients(backend, 3 if plan.quick else 8, grace)
    return [
        *results,
        Result(
            backend,
            "M3",
            "crashed client: reaped and removed",
            crashed,
            target=Target("p50_le", (grace + 5.0) * 1000.0),
            notes=[f"session lease with a {grace:g} s grace; the server sweeps every 0.5 s"],
        ),
    ]


def _warm_claims(backend: str, samples: int) -> tuple[Series, Series]:
    """Warm claim through the HTTP API until the first command returns; and a cold create the same way."""
    import tempfile
    from pathlib import Path

    import httpx

    from agentnest.runtime.docker import base_image
    from agentnest.server.app import ServerSettings, create_app
    from agentnest.server.auth import Ceiling, TokenStore
    from agentnest.server.pools import PoolSpec
    from agentnest.server.thread import serve_in_thread

    warm = Series("POST /v1/sandboxes {pool} + POST .../exec 'true'", "ms")
    cold = Series("POST /v1/sandboxes (cold) + POST .../exec 'true'", "ms")
    with tempfile.TemporaryDirectory() as tmp:
        store = TokenStore(Path(tmp) / "tokens.json")
        ceiling = Ceiling(max_sandboxes=8, max_memory=64 << 20, backends=(backend,))
        _, secret = store.create("bench", ceiling)
        pool = PoolSpec("bench", backend=backend, memory=64 << 20, min=2, max=3, refill_rate=10.0)
        # As `agentnest serve` runs by default: recording into a SQLite database (a new
        # sandbox's row is committed before the answer).
        settings = ServerSettings(
            tokens=store,
            backends={backend: backend},
            image=base_image(),
            max_sandboxes=8,
            pools=(pool,),
            database=f"sqlite:///{tmp}/manager.db",
        )
        app = create_app(settings)
        ready = app.state.service.pools["bench"].ready
        headers = {"Authorization": f"Bearer {secret}"}
        with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=headers, timeout=120) as http:
            for series, body in ((warm, {"pool": "bench"}), (cold, {"memory": "64m"})):
                for _ in range(samples if series is warm else max(3, samples // 4)):
                    deadline = time.monotonic() + 120
                    while len(ready) < 2:  # the pool refilled (the condition is the signal)
                        if time.monotonic() > deadline:
                            raise RuntimeError("the pool did not refill within 120 s")
                        time.sleep(0.01)
                    t0 = time.perf_counter()
                    made = http.post("/v1/sandboxes", json=body)
                    sandbox = made.json()["id"]
                    ran = http.post(f"/v1/sandboxes/{sandbox}/exec", json={"argv": ["true"]})
                    series.samples.append(time.perf_counter() - t0)
                    assert made.status_code == 201 and ran.json()["exit_code"] == 0, (made.text, ran.text)
                    http.delete(f"/v1/sandboxes/{sandbox}")
    return warm, cold


def _recorded_execs(backend: str, samples: int, database: str | None) -> Series:
    """``POST .../exec ["true"]`` on one sandbox, the server recording into ``database`` (or none);
    checks at the end that every command's events reached the database."""
    from pathlib import Path

    import httpx

    from agentnest.runtime.docker import base_image
    from agentnest.server.app import ServerSettings, create_app
    from agentnest.server.auth import Ceiling, TokenStore
    from agentnest.server.thread import serve_in_thread

    where = "no database" if database is None else database.split(":", 1)[0]
    series = Series(f"POST .../exec 'true' ({where})", "ms")
    with tempfile.TemporaryDirectory() as tmp:
        store = TokenStore(Path(tmp) / "tokens.json")
        _, secret = store.create("bench", Ceiling(max_memory=64 << 20, backends=(backend,)), admin=True)
        settings = ServerSettings(
            tokens=store, backends={backend: backend}, image=base_image(), database=database
        )
        headers = {"Authorization": f"Bearer {secret}"}
        app = create_app(settings)
        with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=headers, timeout=120) as http:
            made = http.post("/v1/sandboxes", json={"memory": "64m"})
            assert made.status_code == 201, made.text
            sandbox = made.json()["id"]
            for i in range(samples + 10):
                t0 = time.perf_counter()
                ran = http.post(f"/v1/sandboxes/{sandbox}/exec", json={"argv": ["true"]})
                if i >= 10:  # the first ten warm the connection and the agent
                    series.samples.append(time.perf_counter() - t0)
                assert ran.json()["exit_code"] == 0, ran.text
            if database is not None:
                page = http.get(
                    "/v1/audit", params={"sandbox": sandbox, "type": "exec.finished", "limit": 1000}
                ).json()
                assert len(page["events"]) == samples + 10, len(page["events"])
            http.delete(f"/v1/sandboxes/{sandbox}")
    return series
