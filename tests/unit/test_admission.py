"""The admission queue's logic (agentnest.server.admission): fairness, bands, caps, rate, waits."""

from __future__ import annotations

import asyncio

import pytest

from agentnest.errors import ConfigurationError
from agentnest.server.admission import Admission, Grant, Position, Rejected, Resources
from agentnest.server.tenants import Tenant

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

GIB = 1 << 30
ONE = Resources(1, GIB // 4, 0.5)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def tenant(name: str, **kw: object) -> Tenant:
    kw.setdefault("rate", 1000.0)
    kw.setdefault("burst", 1000)
    return Tenant(name, **kw)  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_request_that_fits_is_granted_at_once_and_release_gives_it_back() -> None:
    adm = Admission(Resources(4, 4 * GIB, 4))
    a = tenant("a")
    grant = await adm.acquire(a, ONE, max_wait=0)
    assert adm.holdings("a") == ONE and adm.held == ONE and grant.waited < 0.05
    adm.release(grant)
    adm.release(grant)  # twice is harmless
    assert adm.holdings("a") == Resources() and adm.held == Resources()


async def test_over_the_tenant_cap_waits_and_is_granted_when_its_tenant_releases() -> None:
    adm = Admission(Resources(8, 8 * GIB, 8))
    a = tenant("a", max_sandboxes=1)
    first = await adm.acquire(a, ONE, max_wait=0)
    with pytest.raises(Rejected) as refused:
        await adm.acquire(a, ONE, max_wait=0)
    assert (refused.value.status, refused.value.reason) == (429, "tenant_cap")
    assert refused.value.retry_after is not None and refused.value.retry_after >= 1
    waiting = asyncio.create_task(adm.acquire(a, ONE, max_wait=10))
    await settle()
    assert not waiting.done() and adm.queued == 1
    adm.release(first)
    second = await waiting
    assert isinstance(second, Grant) and adm.queued == 0 and adm.holdings("a") == ONE


async def test_a_full_server_refuses_with_capacity_and_retry_after_at_the_deadline() -> None:
    adm = Admission(Resources(1, 4 * GIB, 4))
    await adm.acquire(tenant("a"), ONE, max_wait=0)
    with pytest.raises(Rejected) as refused:
        await adm.acquire(tenant("b"), ONE, max_wait=0.2)
    assert (refused.value.status, refused.value.reason) == (429, "capacity")
    assert "max_wait=0.2s" in refused.value.detail and refused.value.retry_after
    assert adm.queued == 0, "a request past its deadline must leave the queue"


async def test_the_create_rate_is_a_token_bucket_and_a_rate_limited_request_waits_for_its_token() -> None:
    adm = Admission(Resources(8, 8 * GIB, 8))
    a = tenant("a", rate=20.0, burst=2)
    await adm.acquire(a, ONE, max_wait=0)
    await adm.acquire(a, ONE, max_wait=0)
    with pytest.raises(Rejected) as refused:
        await adm.acquire(a, ONE, max_wait=0)
    assert refused.value.reason == "rate" and refused.value.retry_after == 1
    loop = asyncio.get_running_loop()
    started = loop.time()
    await adm.acquire(a, ONE, max_wait=5)  # the next token comes 1/20 s after the last one
    assert loop.time() - started < 2


async def test_backlogged_tenants_get_shares_in_proportion_to_their_weights() -> None:
    adm = Admission(Resources(8, 64 * GIB, 64))
    blocker = await adm.acquire(tenant("z"), Resources(8, GIB, 1), max_wait=0)
    tenants = {"a": tenant("a"), "b": tenant("b"), "c": tenant("c", weight=2.0)}
    tasks = [
        asyncio.create_task(adm.acquire(t, ONE, max_wait=10)) for _ in range(10) for t in tenants.values()
    ]
    await settle()
    assert adm.queued == 30
    adm.release(blocker)
    await settle()
    held = {name: adm.holdings(name).sandboxes for name in tenants}
    assert held == {"a": 2, "b": 2, "c": 4}, held
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert adm.queued == 0


async def test_the_dominant_resource_decides_the_share() -> None:
    # a holds one sandbox with half the memory; b holds two small ones.  Memory dominates a's share.
    adm = Admission(Resources(8, 8 * GIB, 8))
    await adm.acquire(tenant("a"), Resources(1, 4 * GIB, 1), max_wait=0)
    b = tenant("b")
    await adm.acquire(b, Resources(1, GIB // 8, 0.5), max_wait=0)
    await adm.acquire(b, Resources(1, GIB // 8, 0.5), max_wait=0)
    blocker = await adm.acquire(tenant("z"), Resources(5, GIB, 1), max_wait=0)
    first_a = asyncio.create_task(adm.acquire(tenant("a"), ONE, max_wait=10))
    await settle()
    first_b = asyncio.create_task(adm.acquire(b, ONE, max_wait=10))
    await settle()
    adm.release(blocker)
    await settle()
    assert first_b.done() and first_a.done()  # room for both after the blocker
    order = [adm.holdings(n).sandboxes for n in ("a", "b")]
    assert order == [2, 3]


async def test_the_tenant_with_the_smaller_share_goes_first() -> None:
    adm = Admission(Resources(4, 64 * GIB, 64))
    a, b = tenant("a"), tenant("b")
    await adm.acquire(a, ONE, max_wait=0)
    await adm.acquire(a, ONE, max_wait=0)
    blocker = await adm.acquire(tenant("z"), Resources(2, GIB, 1), max_wait=0)
    later_a = asyncio.create_task(adm.acquire(a, ONE, max_wait=10))
    await settle()
    later_b = asyncio.create_task(adm.acquire(b, ONE, max_wait=10))
    await settle()
    adm.release(Grant("z", Resources(1, 0, 0), 0, 0))  # one slot frees
    await settle()
    assert later_b.done() and not later_a.done(), "b holds nothing: its turn although a asked first"
    adm.release(blocker)
    await settle()
    assert later_a.done()


async def test_a_higher_band_goes_first_and_a_low_band_ages_up_so_it_is_never_starved() -> None:
    adm = Admission(Resources(1, 8 * GIB, 8), aging=0.3)
    blocker = await adm.acquire(tenant("z"), ONE, max_wait=0)
    low = tenant("low", priority="low")
    high = tenant("high", priority="high")
    low_task = asyncio.create_task(adm.acquire(low, ONE, max_wait=10))
    await settle()
    high_task = asyncio.create_task(adm.acquire(high, ONE, max_wait=10))
    await settle()
    adm.release(blocker)
    await settle()
    assert high_task.done() and not low_task.done()
    adm.release(high_task.result())
    await low_task
    # Aging: a low request queued long enough stands ahead of a fresh high one (the server held
    # by a third tenant: low and high have used the same, so band and age decide).
    adm.release(low_task.result())
    blocker = await adm.acquire(tenant("z"), ONE, max_wait=0)
    old_low = adm.submit(low, ONE, max_wait=10)
    await asyncio.sleep(0.7)  # two aging steps: low -> normal -> high
    fresh_high = adm.submit(high, ONE, max_wait=10)
    assert adm.position(old_low).position == 1 and adm.position(fresh_high).position == 2
    adm.release(blocker)
    assert old_low.future.done() and not fresh_high.future.done()
    fresh_high.future.cancel()


async def test_a_head_that_does_not_fit_the_server_holds_back_smaller_requests_behind_it() -> None:
    adm = Admission(Resources(4, 4 * GIB, 8))
    blocker = await adm.acquire(tenant("z"), Resources(1, 3 * GIB, 1), max_wait=0)
    big = asyncio.create_task(adm.acquire(tenant("a"), Resources(1, 2 * GIB, 1), max_wait=10))
    await settle()
    small = asyncio.create_task(adm.acquire(tenant("b"), Resources(1, GIB // 2, 1), max_wait=10))
    await settle()
    assert not big.done() and not small.done(), "the small one would starve the big one"
    adm.release(blocker)
    await settle()
    assert big.done() and small.done()


async def test_cancelling_a_waiting_request_removes_it_at_once_and_the_next_tenant_moves_up() -> None:
    adm = Admission(Resources(1, 8 * GIB, 8))
    blocker = await adm.acquire(tenant("z"), ONE, max_wait=0)
    gone = asyncio.create_task(adm.acquire(tenant("a"), ONE, max_wait=10))
    await settle()
    stays = adm.submit(tenant("b"), ONE, max_wait=10)
    assert adm.position(stays).position == 2
    gone.cancel()
    await settle()
    assert gone.cancelled() and adm.queued == 1 and adm.position(stays).position == 1
    adm.release(blocker)
    assert stays.future.done() and adm.holdings("a") == Resources()


async def test_a_full_queue_answers_queue_full_at_once() -> None:
    adm = Admission(Resources(1, 8 * GIB, 8), max_queue=2)
    await adm.acquire(tenant("z"), ONE, max_wait=0)
    a = tenant("a", max_queued=1)
    adm.submit(a, ONE, max_wait=10)
    with pytest.raises(Rejected) as refused:
        adm.submit(a, ONE, max_wait=10)
    assert (refused.value.status, refused.value.reason) == (429, "queue_full") and refused.value.retry_after
    adm.submit(tenant("b"), ONE, max_wait=10)
    with pytest.raises(Rejected) as server_full:
        adm.submit(tenant("c"), ONE, max_wait=10)
    assert server_full.value.reason == "queue_full" and "server's" in server_full.value.detail


async def test_what_can_never_fit_is_refused_with_403_before_queueing() -> None:
    adm = Admission(Resources(8, 2 * GIB, 8))
    with pytest.raises(Rejected) as over_tenant:
        adm.submit(tenant("a", max_memory=GIB), Resources(1, 2 * GIB, 1), max_wait=10)
    assert (over_tenant.value.status, over_tenant.value.reason) == (403, "tenant_cap")
    with pytest.raises(Rejected) as over_server:
        adm.submit(tenant("a"), Resources(1, 3 * GIB, 1), max_wait=10)
    assert (over_server.value.status, over_server.value.reason) == (403, "capacity")
    assert adm.queued == 0


async def test_the_waiter_sees_its_position_change_as_the_queue_moves() -> None:
    adm = Admission(Resources(1, 8 * GIB, 8))
    blocker = await adm.acquire(tenant("z"), ONE, max_wait=0)
    ahead = adm.submit(tenant("a"), ONE, max_wait=10)
    seen: list[Position] = []

    async def record(position: Position) -> None:
        seen.append(position)

    waiting = asyncio.create_task(adm.acquire(tenant("b"), ONE, max_wait=10, on_update=record))
    await settle()
    assert [p.position for p in seen] == [2] and seen[0].blocked_by == "capacity"
    adm.release(blocker)  # a is admitted: b is first now
    await settle()
    assert [p.position for p in seen] == [2, 1] and seen[1].eta is None  # one release: no rate yet
    adm.release(ahead.future.result())
    await waiting
    assert adm.queued == 0


async def test_a_tenant_s_changed_caps_apply_to_its_next_request() -> None:
    adm = Admission(Resources(8, 8 * GIB, 8))
    await adm.acquire(tenant("a", max_sandboxes=1), ONE, max_wait=0)
    await adm.acquire(tenant("a", max_sandboxes=2), ONE, max_wait=0)
    assert adm.holdings("a").sandboxes == 2


def test_tenant_settings_are_validated_with_the_fix_named() -> None:
    with pytest.raises(ConfigurationError, match="lowercase"):
        Tenant("Team A")
    with pytest.raises(ConfigurationError, match="priority"):
        Tenant("a", priority="urgent")
    with pytest.raises(ConfigurationError, match="weight"):
        Tenant("a", weight=0)
    with pytest.raises(ConfigurationError, match="default_wait"):
        Tenant("a", default_wait=100, max_wait=10)
    with pytest.raises(ConfigurationError, match="above 600"):
        Tenant("a", max_wait=3600)
    with pytest.raises(ConfigurationError, match="unknown tenant fields"):
        Tenant.from_dict({"name": "a", "max_sandbox": 3})
    assert Tenant("a", max_memory="2g").max_memory == 2 * GIB  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="cannot change"):
        Tenant("a").updated({"name": "b"})


async def test_a_tenant_without_a_queue_is_still_admitted_when_there_is_room() -> None:
    adm = Admission(Resources(1, 8 * GIB, 8))
    a = tenant("a", max_queued=0)
    grant = await adm.acquire(a, ONE, max_wait=10)
    with pytest.raises(Rejected) as refused:
        adm.submit(a, ONE, max_wait=10)
    assert refused.value.reason == "queue_full" and adm.queued == 0
    adm.release(grant)


async def test_a_transfer_needs_no_new_room_and_moves_the_holding() -> None:
    adm = Admission(Resources(1, 8 * GIB, 8))
    pool = Tenant.for_pool("py", max_sandboxes=1, rate=10.0)
    warm = await adm.acquire(pool, ONE, max_wait=0)
    claimed = await adm.acquire(tenant("a"), ONE, max_wait=0, transfer=warm)
    assert warm.released and adm.holdings("pool:py") == Resources() and adm.holdings("a") == ONE
    assert adm.held == ONE, "the server's total did not change: the sandbox changed hands"
    adm.release(claimed)
    assert adm.held == Resources()
