"""Admission shared by replicas (agentnest.server.shared, Database.hold/lead) on SQLite and on a
private PostgreSQL server: the one transaction that grants, the holds of gone servers freed by
the sweep, the leader's lease and its handover, and the queue of one replica counting what the
others hold.  No engine."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from agentnest.server.admission import Admission, Resources
from agentnest.server.db import Database
from agentnest.server.shared import LEADER, SharedAdmission, lead
from agentnest.server.tenants import Tenant

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
ONE = Resources(1, 64 * MIB, 1.0)
TENANT_3 = Resources(3, 1 << 40, 1e6)
ROOMY = Resources(100, 1 << 40, 1e6)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def hold(db: Database, server: str, tenant: str = "a", **kw: object) -> tuple[str, str | None]:
    hid = uuid.uuid4().hex
    args: dict[str, object] = {"demand": ONE, "tenant_limit": TENANT_3, "capacity": ROOMY, **kw}
    return hid, db.hold(hid, server=server, tenant=tenant, **args)  # type: ignore[arg-type]


def rows(db: Database) -> dict[str, str]:
    with db.engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT hold, server FROM holds")).all())


def test_a_grant_counts_every_server_s_holds_against_the_tenant_and_the_capacity(db: Database) -> None:
    granted = [hold(db, server) for server in ("s1", "s2", "s1")]
    assert [reason for _, reason in granted] == [None, None, None]
    # The tenant holds 3 across both servers: a fourth is refused on either, and nothing is written.
    assert hold(db, "s2")[1] == "tenant_cap"
    assert len(rows(db)) == 3
    assert hold(db, "s2", "b")[1] is None  # another tenant has its own cap
    assert hold(db, "s1", "c", capacity=Resources(4, 1 << 40, 1e6))[1] == "capacity"
    # Memory and CPUs are capacity too, summed over every row.
    assert hold(db, "s1", "c", capacity=Resources(100, 4 * 64 * MIB, 1e6))[1] == "capacity"
    assert hold(db, "s1", "c", capacity=Resources(100, 1 << 40, 4.5))[1] == "capacity"
    # What each server sees the others hold.
    assert db.held_elsewhere("s1") == {"a": ONE, "b": ONE}
    assert db.held_elsewhere("s2") == {"a": Resources(2, 128 * MIB, 2.0)}


def test_releases_go_with_the_next_grant_and_a_refused_transfer_keeps_the_old_hold(db: Database) -> None:
    first, _ = hold(db, "s1")
    hold(db, "s1")
    third, _ = hold(db, "s1")
    assert hold(db, "s1")[1] == "tenant_cap"
    # A release this server has not written yet is deleted in the same transaction as the grant.
    fourth, reason = hold(db, "s1", released=[first])
    assert reason is None and first not in rows(db) and fourth in rows(db)
    # A warm sandbox's hold moves to the claiming tenant, which is at its cap: refused, the pool's row stays.
    warm, _ = hold(db, "s1", "pool:p", tenant_limit=ROOMY)
    claim, reason = hold(db, "s1", "a", replaces=warm)
    assert reason == "tenant_cap" and warm in rows(db) and claim not in rows(db)
    # With room, the same claim takes the row over: one row, the tenant's.
    db.unhold([third])
    claim, reason = hold(db, "s1", "a", replaces=warm)
    assert reason is None and warm not in rows(db) and claim in rows(db)
    # The capacity check counts the replaced row once, not twice.
    full = Resources(len(rows(db)), 1 << 40, 1e6)
    warm, reason = hold(
        db, "s1", "pool:p", tenant_limit=ROOMY, capacity=Resources(full.sandboxes + 1, 1 << 40, 1e6)
    )
    assert reason is None
    db.unhold([claim])
    _, reason = hold(db, "s1", "a", replaces=warm, capacity=Resources(full.sandboxes, 1 << 40, 1e6))
    assert reason is None


def test_the_sweep_frees_a_gone_server_s_holds_and_a_clean_stop_its_own(db: Database) -> None:
    now = time.time()
    db.heartbeat("live", host="h1", pid=1, started=now)
    db.heartbeat("dead", host="h2", pid=2, started=now)
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE servers SET seen = :t WHERE server = 'dead'"), {"t": now - 120})
    mine, _ = hold(db, "live")
    hold(db, "dead")
    hold(db, "never-registered")
    assert db.sweep(60)[0] == ["h2:2"]
    assert list(rows(db)) == [mine]
    db.deregister("live")
    assert rows(db) == {}


def test_a_server_alone_on_its_database_forgets_the_earlier_runs(db: Database) -> None:
    now = time.time()
    for server, pid in (("me", 1), ("earlier", 2), ("earliest", 3)):
        db.heartbeat(server, host="h", pid=pid, started=now)
        hold(db, server)
    assert db.forget_others("me") == ["h:2", "h:3"]
    assert [s["server"] for s in db.list_servers()] == ["me"]
    assert set(rows(db).values()) == {"me"}
    assert db.forget_others("me") == []


def test_a_server_known_gone_is_forgotten_with_its_rows_and_holds(db: Database) -> None:
    now = time.time()
    db.heartbeat("live", host="h", pid=1, started=now)
    db.heartbeat("exited", host="h", pid=2, started=now)
    ops = []
    for sandbox, server in (("sb-live", "live"), ("sb-exited", "exited")):
        op = (
            "start",
            {
                "sandbox_id": sandbox,
                "tenant": "a",
                "token": "tok",
                "backend": "docker",
                "image": "img",
                "launch": "cold",
                "memory": 1,
                "cpus": 1.0,
                "started": now - 10,
                "server": server,
            },
        )
        ops.append(op)
    db.apply(ops)
    mine, _ = hold(db, "live")
    hold(db, "exited")
    assert db.forget([]) == []
    assert db.forget(["exited"]) == ["h:2"]
    assert list(rows(db)) == [mine]
    assert [s["server"] for s in db.list_servers()] == ["live"]
    with db.engine.connect() as conn:
        ended: dict[str, str | None] = dict(
            conn.execute(sa.text("SELECT sandbox_id, end_reason FROM sandboxes")).all()
        )
    assert ended == {"sb-live": None, "sb-exited": "lost"}


def test_no_two_replicas_grant_the_last_slot(postgres_server: Any) -> None:
    """Many threads on two engines (two replicas) race for a tenant capped at 3: exactly 3 win.
    (PostgreSQL only: replicas share it; a SQLite file has one server.)"""
    database_url = str(postgres_server.create_database(f"race{uuid.uuid4().hex[:12]}"))
    replicas = [Database(database_url), Database(database_url)]
    replicas[0].upgrade()
    go = threading.Barrier(16)

    def race(i: int) -> str | None:
        go.wait()
        return hold(replicas[i % 2], f"s{i % 2}")[1]

    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(race, range(16)))
        assert outcomes.count(None) == 3, outcomes
        assert set(outcomes) == {None, "tenant_cap"}
        assert len(rows(replicas[0])) == 3
    finally:
        for replica in replicas:
            replica.close()


def test_the_leader_s_lease_passes_on_when_it_lapses_or_is_given_up(db: Database) -> None:
    assert db.lead(LEADER, "a", ttl=0.5)
    assert not db.lead(LEADER, "b", ttl=0.5)
    assert db.lead(LEADER, "a", ttl=0.5)  # renewed by its holder
    deadline = time.monotonic() + 10
    while not db.lead(LEADER, "b", ttl=30):  # "a" stops renewing: "b" gets it once it lapses
        assert time.monotonic() < deadline, "the lapsed lease was never taken over"
        time.sleep(0.05)
    assert not db.lead(LEADER, "a", ttl=30)
    db.resign(LEADER, "a")  # only the holder can give it up
    assert not db.lead(LEADER, "a", ttl=30)
    db.resign(LEADER, "b")
    assert db.lead(LEADER, "a", ttl=30)


@pytest.mark.anyio
async def test_lead_reports_leading_and_gives_the_lease_up_when_cancelled(db: Database) -> None:
    changes: list[bool] = []
    became = asyncio.Event()

    def changed(leading: bool) -> None:
        changes.append(leading)
        became.set()

    task = asyncio.create_task(lead(db, "me", 30.0, changed))
    await asyncio.wait_for(became.wait(), 10)
    assert changes == [True] and not db.lead(LEADER, "other", ttl=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert changes == [True, False]
    assert db.lead(LEADER, "other", ttl=30)  # free at once, not after 30 s


@pytest.mark.anyio
async def test_a_replica_s_queue_counts_what_the_others_hold(db: Database) -> None:
    admission = Admission(ROOMY)
    shared = SharedAdmission(admission, db, "here")
    tenant = Tenant("a", max_sandboxes=3, rate=100.0, burst=100)
    hold(db, "there")
    hold(db, "there")
    await shared.refresh()
    first = await admission.acquire(tenant, ONE, max_wait=0)
    assert await shared.confirm(first, tenant) is None
    # Two elsewhere and one here: the next one waits, blocked by the tenant's cap.
    ticket = admission.submit(tenant, ONE, max_wait=30)
    assert not ticket.future.done()
    assert admission.position(ticket).blocked_by == "tenant_cap"
    # The other replica releases one: the next refresh admits the waiting request.
    with db.engine.begin() as conn:
        gone = conn.execute(sa.text("SELECT hold FROM holds WHERE server = 'there' LIMIT 1")).scalar()
    db.unhold([str(gone)])
    await shared.refresh()
    second = await asyncio.wait_for(admission.wait(ticket), 5)
    assert await shared.confirm(second, tenant) is None
    # A release here is written with the next refresh (or grant).
    admission.release(first)
    await shared.refresh()
    assert first.id not in rows(db) and second.id in rows(db)


@pytest.mark.anyio
async def test_a_refused_grant_is_undone_and_a_warm_transfer_holds_again(db: Database) -> None:
    admission = Admission(ROOMY)
    shared = SharedAdmission(admission, db, "here")
    pool = Tenant.for_pool("p", max_sandboxes=5, rate=100.0)
    tenant = Tenant("a", max_sandboxes=1, rate=100.0, burst=100)
    warm = await admission.acquire(pool, ONE, max_wait=0)
    assert await shared.confirm(warm, pool) is None
    hold(db, "there")  # the tenant's one sandbox, taken elsewhere; this replica has not read it yet
    claim = await admission.acquire(tenant, ONE, max_wait=0, transfer=warm)
    assert warm.released and admission.holdings(pool.name) == Resources()
    assert await shared.confirm(claim, tenant, warm) == "tenant_cap"
    assert shared.refused == 1
    admission.revoke(claim, warm)
    assert (warm.released, admission.holdings(pool.name)) == (False, ONE)
    assert admission.holdings("a") == Resources() and admission.held == ONE
    assert warm.id in rows(db) and claim.id not in rows(db)
