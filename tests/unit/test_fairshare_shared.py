"""Fair share over time across replicas, on SQLite and on a private PostgreSQL server: each
replica writes its tenants' remembered usage and reads the others' (Database.write_usage,
usage_elsewhere, SharedAdmission.refresh), so a tenant's key counts its usage everywhere."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import sqlalchemy as sa

from agentnest.server import fairshare
from agentnest.server.admission import Admission, Resources
from agentnest.server.db import Database
from agentnest.server.shared import SharedAdmission
from agentnest.server.tenants import Tenant

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
ONE = Resources(1, 64 * MIB, 1.0)
ROOMY = Resources(100, 1 << 40, 1e6)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_each_server_s_usage_is_one_row_per_tenant_summed_and_decayed_by_the_readers(db: Database) -> None:
    db.write_usage("s1", {"a": 10.0})
    db.write_usage("s2", {"a": 5.0, "b": 1.0, "gone": 1e-9})
    assert db.usage_elsewhere("s1") == pytest.approx({"a": 5.0, "b": 1.0}, rel=1e-3)
    assert db.usage_elsewhere("s3") == pytest.approx({"a": 15.0, "b": 1.0}, rel=1e-3)
    db.write_usage("s2", {"b": 2.0})  # a server's write replaces its rows
    assert db.usage_elsewhere("s1") == pytest.approx({"b": 2.0}, rel=1e-3)
    # A row written one half-life ago counts half; one long decayed is deleted by the next write.
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE usage SET stamp = :t WHERE server = 's1'"), {"t": time.time() - 100})
    assert db.usage_elsewhere("s2", half_life=100.0)["a"] == pytest.approx(5.0, rel=1e-2)
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE usage SET stamp = :t WHERE server = 's1'"), {"t": 0.0})
    db.write_usage("s2", {"b": 2.0})
    with db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT server, tenant FROM usage")).all() == [("s2", "b")]


@pytest.mark.anyio
async def test_a_tenant_s_usage_on_another_replica_counts_in_this_replica_s_order(db: Database) -> None:
    here = Admission(Resources(2, 1 << 40, 1e6))
    shared = SharedAdmission(here, db, "here")
    a = Tenant("a", rate=100.0, burst=100)
    b = Tenant("b", rate=100.0, burst=100)
    # The other replica: a and z fill the server.
    held_a, held_z = uuid.uuid4().hex, uuid.uuid4().hex
    for hold, tenant in ((held_a, "a"), (held_z, "z")):
        assert (
            db.hold(
                hold, server="there", tenant=tenant, demand=ONE, tenant_limit=ROOMY, capacity=here.capacity
            )
            is None
        )
    await shared.refresh()
    first = here.submit(a, ONE, max_wait=30)  # a asks first
    second = here.submit(b, ONE, max_wait=30)
    assert not first.future.done() and not second.future.done()
    # There, a has used half the server for 100 s and gives its sandbox back.
    db.write_usage("there", {"a": fairshare.accrued(0.5, 100.0), "z": fairshare.accrued(0.5, 100.0)})
    db.unhold([held_a])
    await shared.refresh()
    # One slot is free: b's turn, although a asked first and neither holds anything now.
    await asyncio.wait_for(here.wait(second), 5)
    assert not first.future.done()
    assert here.fair_key("a") > 40 and here.fair_key("b") > 0
    # This replica's usage is written for the others with the next refresh.
    await shared.refresh()
    assert "b" in db.usage_elsewhere("there")
    here.withdraw(first)


@pytest.mark.anyio
async def test_refreshes_at_once_do_not_collide(db: Database) -> None:
    """A create's refresh and the periodic one may run together: both replace this replica's
    usage rows, and neither fails (PostgreSQL refused the second insert of the same key)."""
    admission = Admission(Resources(4, 1 << 40, 1e6))
    shared = SharedAdmission(admission, db, "here")
    tenants = [Tenant(name, rate=100.0, burst=100) for name in ("a", "b", "c")]
    for tenant in tenants:
        grant = await admission.acquire(tenant, ONE, max_wait=0)
        assert await shared.confirm(grant, tenant) is None
    await asyncio.sleep(0.05)  # some usage to write: it is the integral of what is held

    async def many() -> None:
        await asyncio.gather(*(shared.refresh() for _ in range(16)))

    for _ in range(5):
        await many()
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT tenant FROM usage WHERE server = 'here'")).all()
    assert sorted(r[0] for r in rows) == ["a", "b", "c"]
