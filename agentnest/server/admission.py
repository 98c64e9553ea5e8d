"""Fair admission for ``agentnest serve``: a queue per tenant, weighted max-min fairness, bounded waits.

A create either fits now or waits in its tenant's FIFO queue, up to its
``max_wait``; then it is refused with 429, a reason code and ``Retry-After``.
Never an unbounded hang (agent-sandbox #802), never a blind reject while
room is about to free up (E2B, Daytona).

**Order between tenants.** Each dispatch walks the backlogged tenants'
heads ordered by (band, fair-share key, arrival):

* *band*: ``high`` before ``normal`` before ``low``.  A queued request moves
  one band up every ``aging`` seconds, so a low band is never starved.
* *fair-share key* (:mod:`.fairshare`): the tenant's remembered usage (its
  dominant share integrated over time, decayed with a half-life) plus what it
  holds now counted for the expected hold time, divided by its weight.  The
  dominant share is the largest of the tenant's held fractions of the
  server's sandboxes, memory and CPUs (Dominant Resource Fairness, Ghodsi et
  al. NSDI '11, as Kueue and Armada order admission).  Ordering by usage over
  time, not by holdings now, makes weighted shares exact over time whatever
  the capacity (issue 33); a tenant that starts waiting joins no lower than the
  lowest key among those already waiting (no credit for idling).
* *arrival*: the older head first.

A head that is over its tenant's caps, or whose tenant's token bucket is
empty, is skipped (it holds nothing back).  A head that does not fit the
server's free capacity stops the walk: admitting smaller requests behind it
would starve it (Kueue's StrictFIFO), and its turn comes as soon as room
frees up.

Capacity is what the operator configured and the backend reports (Docker's
memory and CPUs, a Kubernetes namespace's ResourceQuota), never a guess.

Everything here runs on the server's event loop: no locks.  The class does
not import a web framework; :mod:`agentnest.server.app` maps
:class:`Rejected` onto HTTP.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Literal

from . import fairshare
from .tenants import BANDS, Tenant

Reason = Literal["tenant_cap", "capacity", "rate", "queue_full"]

#: Requests waiting at once on the whole server; beyond it: 429 ``queue_full``.
DEFAULT_MAX_QUEUE = 4096
#: Seconds a queued request waits before it moves up one band.
DEFAULT_AGING = 30.0
#: Retry-After when nothing better is known (seconds).
DEFAULT_RETRY_AFTER = 5


@dataclasses.dataclass(frozen=True, slots=True)
class Resources:
    """What a sandbox asks for, a tenant holds or the server has: sandboxes, memory, CPUs."""

    sandboxes: int = 0
    memory: int = 0
    cpus: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.sandboxes + other.sandboxes, self.memory + other.memory, self.cpus + other.cpus)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.sandboxes - other.sandboxes, self.memory - other.memory, self.cpus - other.cpus)

    def fits(self, limit: Resources) -> bool:
        # A small tolerance on CPUs: 0.1 + 0.2 must fit into 0.3.
        return (
            self.sandboxes <= limit.sandboxes
            and self.memory <= limit.memory
            and self.cpus <= limit.cpus + 1e-9
        )

    def share_of(self, capacity: Resources) -> float:
        """The dominant share: the largest fraction of ``capacity`` this holds."""
        return max(
            self.sandboxes / capacity.sandboxes if capacity.sandboxes else 0.0,
            self.memory / capacity.memory if capacity.memory else 0.0,
            self.cpus / capacity.cpus if capacity.cpus else 0.0,
        )


def tenant_limit(tenant: Tenant) -> Resources:
    return Resources(tenant.max_sandboxes, tenant.max_memory, tenant.max_cpus)


class Rejected(Exception):
    """A create not admitted: ``status`` (403: never fits, 429: not now), a reason code, when to retry."""

    def __init__(self, status: int, reason: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after


@dataclasses.dataclass(frozen=True, slots=True)
class Position:
    """Where a queued request stands: what the client sees while it waits."""

    position: int
    """1 + the requests ahead of it: in a better band, or in its band and older."""
    ahead_same_tenant: int
    queued: int
    """Requests waiting on the whole server."""
    eta: float | None
    """Estimated seconds until it is admitted, from the recent rate of releases; None until known."""
    blocked_by: str | None
    """Why its tenant's head waits now: ``tenant_cap``, ``capacity`` or ``rate``."""

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


class Grant:
    """Resources held for one sandbox.  :meth:`Admission.release` gives them back (once)."""

    __slots__ = ("demand", "granted_at", "id", "released", "tenant", "waited")

    def __init__(self, tenant: str, demand: Resources, granted_at: float, waited: float) -> None:
        self.id = uuid.uuid4().hex
        """Names the grant where replicas share admission (its row in the ``holds`` table)."""
        self.tenant = tenant
        self.demand = demand
        self.granted_at = granted_at
        self.waited = waited
        self.released = False


class Ticket:
    """A request in the queue."""

    __slots__ = (
        "band",
        "blocked_by",
        "deadline",
        "demand",
        "enqueued",
        "future",
        "seq",
        "tenant",
        "transfer",
    )

    def __init__(
        self,
        seq: int,
        tenant: Tenant,
        demand: Resources,
        band: int,
        enqueued: float,
        deadline: float,
        transfer: Grant | None = None,
    ) -> None:
        self.seq = seq
        self.tenant = tenant
        self.demand = demand
        self.band = band
        self.enqueued = enqueued
        self.deadline = deadline
        self.future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self.blocked_by: str | None = None
        self.transfer = transfer
        """A grant this request takes over when admitted (a warm sandbox changing hands): what it
        holds already counts against the server, so only the difference needs room."""


class _Bucket:
    """A token bucket: ``rate`` per second up to ``burst``."""

    __slots__ = ("stamp", "tokens")

    def __init__(self, burst: int, now: float) -> None:
        self.tokens = float(burst)
        self.stamp = now

    def level(self, tenant: Tenant, now: float) -> float:
        self.tokens = min(float(tenant.burst), self.tokens + (now - self.stamp) * tenant.rate)
        self.stamp = now
        return self.tokens

    def wait_for_one(self, tenant: Tenant, now: float) -> float:
        return max(0.0, (1.0 - self.level(tenant, now)) / tenant.rate)


class _Tenant:
    """The admission state of one tenant."""

    __slots__ = ("bucket", "config", "held", "queue")

    def __init__(self, config: Tenant, now: float) -> None:
        self.config = config
        self.queue: collections.deque[Ticket] = collections.deque()
        self.held = Resources()
        self.bucket = _Bucket(config.burst, now)


class Admission:
    """The admission queue of one server.

    Example::

        admission = Admission(Resources(sandboxes=64, memory=32 << 30, cpus=16))
        grant = await admission.acquire(tenant, Resources(1, 512 << 20, 1.0), max_wait=30)
        ...  # create the sandbox; when it is gone:
        admission.release(grant)
    """

    def __init__(
        self,
        capacity: Resources,
        *,
        aging: float = DEFAULT_AGING,
        max_queue: int = DEFAULT_MAX_QUEUE,
        clock: Callable[[], float] = time.monotonic,
        half_life: float = fairshare.HALF_LIFE,
    ) -> None:
        if not aging > 0 or not math.isfinite(aging):
            raise ValueError(f"aging={aging!r} must be a positive number of seconds")
        self.capacity = capacity
        self.aging = aging
        self.max_queue = max_queue
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        self._seq = itertools.count()
        self._queued = 0
        self._held = Resources()
        self._changed: asyncio.Event | None = None
        self._ranks: dict[int, int] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # Releases per second, smoothed: the basis of the wait estimate (and of Retry-After).
        self._release_rate: float | None = None
        self._last_release: float | None = None
        #: Called after each decision: ("granted"|"rejected", tenant, reason or None, waited seconds).
        self.on_decision: list[Callable[[str, str, str | None, float], None]] = []
        #: Called with each grant given back by :meth:`release`.
        self.on_release: list[Callable[[Grant], None]] = []
        # What other replicas hold (shared admission on PostgreSQL), per tenant and in all:
        # counted as held here, so this server's queue waits for room the others took.
        self._others: dict[str, Resources] = {}
        self._others_total = Resources()
        # Fair share over time (:mod:`.fairshare`): this replica's decayed usage per tenant, the
        # others' as last read (with the time it was read), and the expected hold time.
        self.usage = fairshare.Usage(clock(), half_life)
        self.hold_time = fairshare.HoldTime()
        self._others_usage: dict[str, float] = {}
        self._others_usage_at = clock()

    # -- state -------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def held(self) -> Resources:
        return self._held

    def holdings(self, tenant: str) -> Resources:
        state = self._tenants.get(tenant)
        return state.held if state is not None else Resources()

    def tenant_names(self) -> list[str]:
        """Every tenant that has asked for something since the server started."""
        return list(self._tenants)

    def queue_depths(self) -> dict[str, int]:
        return {name: len(t.queue) for name, t in self._tenants.items() if t.queue}

    def set_capacity(self, capacity: Resources) -> None:
        """New capacity (the operator's or the backend's); queued requests may fit now."""
        self._accrue(self._clock())
        self.capacity = capacity
        self._dispatch()

    def set_others(self, held: dict[str, Resources], usage: dict[str, float] | None = None) -> None:
        """What the other replicas hold now, per tenant (:mod:`agentnest.server.shared`), and
        their tenants' decayed usage as of now (None: unchanged)."""
        now = self._clock()
        self._accrue(now)
        total = Resources()
        for resources in held.values():
            total = total + resources
        changed = held != self._others
        self._others, self._others_total = held, total
        if usage is not None:
            changed = changed or bool(usage or self._others_usage)
            self._others_usage, self._others_usage_at = usage, now
        if changed:
            self._dispatch()

    def own_usage(self) -> dict[str, float]:
        """Each tenant's decayed usage on this replica up to now (what :mod:`.shared` writes)."""
        self._accrue(self._clock())
        return dict(self.usage.items())

    def fair_key(self, tenant: str) -> float:
        """The tenant's place in the order between tenants (:func:`.fairshare.key`), all replicas'."""
        state = self._tenants.get(tenant)
        if state is None:
            return 0.0
        now = self._clock()
        self._accrue(now)
        return self._key(state, now)

    def _usage(self, state: _Tenant, now: float) -> float:
        """The tenant's remembered usage on every replica (this one's exact, the others' as last read)."""
        name = state.config.name
        others = self._others_usage.get(name)
        mine = self.usage[name]
        if not others:
            return mine
        return mine + fairshare.decayed(others, now - self._others_usage_at, self.usage.half_life)

    def _key(self, state: _Tenant, now: float) -> float:
        share = self._holding(state).share_of(self.capacity)
        return fairshare.key(self._usage(state, now), share, self.hold_time.seconds, state.config.weight)

    def _accrue(self, now: float) -> None:
        """Count this replica's holdings in the usage up to ``now`` (before they change)."""
        if now > self.usage.stamp:
            shares = {
                name: t.held.share_of(self.capacity) for name, t in self._tenants.items() if t.held.sandboxes
            }
            self.usage.advance(shares, now)

    def retune(self, tenant: Tenant) -> None:
        """Apply a tenant's changed settings to what it holds and has queued."""
        state = self._tenants.get(tenant.name)
        if state is not None:
            state.config = tenant
            self._dispatch()

    def _state(self, tenant: Tenant) -> _Tenant:
        state = self._tenants.get(tenant.name)
        if state is None:
            state = self._tenants[tenant.name] = _Tenant(tenant, self._clock())
        else:
            state.config = tenant  # caps changed by the operator apply at once
        return state

    # -- the two calls -------------------------------------------------------------

    def submit(
        self,
        tenant: Tenant,
        demand: Resources,
        *,
        band: int | None = None,
        max_wait: float,
        transfer: Grant | None = None,
    ) -> Ticket:
        """Queue a request, admitting it at once if its turn is now.

        Raises:
            Rejected: it can never fit (403), or its queue is full (429 ``queue_full``).
        """
        state = self._state(tenant)
        band = tenant.band if band is None else max(band, tenant.band)  # never better than the tenant's
        if not demand.fits(tenant_limit(tenant)):
            self._decided("rejected", tenant.name, "tenant_cap", 0.0)
            raise Rejected(
                403,
                "tenant_cap",
                f"this sandbox ({_show(demand)}) is more than tenant {tenant.name!r} may hold at all "
                f"({_show(tenant_limit(tenant))}); ask for less or raise the tenant's caps",
            )
        if transfer is None and not demand.fits(self.capacity):
            self._decided("rejected", tenant.name, "capacity", 0.0)
            raise Rejected(
                403,
                "capacity",
                f"this sandbox ({_show(demand)}) is more than the whole server has "
                f"({_show(self.capacity)}); ask for less",
            )
        now = self._clock()
        ticket = Ticket(next(self._seq), tenant, demand, band, now, now + max(0.0, max_wait), transfer)
        if not state.queue:
            self._join_backlog(state, ticket, now)
        state.queue.append(ticket)
        self._queued += 1
        self._dispatch()
        # The queue bounds apply to requests that must wait: one admitted at once never queued.
        waiting_before = len(state.queue) - 1
        if not ticket.future.done() and (
            waiting_before >= tenant.max_queued or self._queued - 1 >= self.max_queue
        ):
            whose = "tenant's" if waiting_before >= tenant.max_queued else "server's"
            self._remove(ticket)
            self._decided("rejected", tenant.name, "queue_full", 0.0)
            raise Rejected(
                429,
                "queue_full",
                f"the {whose} admission queue is full ({waiting_before} of tenant {tenant.name!r} waiting, "
                f"{self._queued} in all); retry later",
                self._retry_after(waiting_before + 1),
            )
        return ticket

    async def wait(
        self, ticket: Ticket, on_update: Callable[[Position], Awaitable[None]] | None = None
    ) -> Grant:
        """Wait for ``ticket``'s grant until its deadline.

        ``on_update`` is called with the request's :class:`Position` when it is
        first queued and whenever it changes.  Cancelling this call (the client
        went away) removes the request from the queue at once.

        Raises:
            Rejected: 429 with the reason it still waited for when the deadline came.
        """
        last: Position | None = None
        try:
            while not ticket.future.done():
                remaining = ticket.deadline - self._clock()
                if remaining <= 0:
                    break
                if on_update is not None:
                    now = self.position(ticket)
                    if now != last:
                        last = now
                        await on_update(now)
                    if ticket.future.done():
                        break
                changed = self._change_event()
                waiter = asyncio.ensure_future(changed.wait())
                try:
                    await asyncio.wait(
                        (ticket.future, waiter), timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    waiter.cancel()
            if ticket.future.done():
                return ticket.future.result()
            reason = self._blocked_by(ticket)
            self._remove(ticket)
            self._decided("rejected", ticket.tenant.name, reason, self._clock() - ticket.enqueued)
            raise Rejected(
                429,
                reason,
                f"not admitted within max_wait={ticket.deadline - ticket.enqueued:g}s: {_WHY[reason]}",
                self._retry_after(self._ahead(ticket) + 1, ticket),
            )
        except BaseException:
            if ticket.future.done() and not ticket.future.cancelled():
                # Granted in the instant the caller gave up (the client went away): give it back.
                self.release(ticket.future.result())
            else:
                self._remove(ticket)
            raise

    async def acquire(
        self,
        tenant: Tenant,
        demand: Resources,
        *,
        band: int | None = None,
        max_wait: float,
        on_update: Callable[[Position], Awaitable[None]] | None = None,
        transfer: Grant | None = None,
    ) -> Grant:
        """:meth:`submit` then :meth:`wait`."""
        ticket = self.submit(tenant, demand, band=band, max_wait=max_wait, transfer=transfer)
        return await self.wait(ticket, on_update)

    def _join_backlog(self, state: _Tenant, head: Ticket, now: float) -> None:
        """No credit for idling: a tenant that starts waiting joins with usage per weight at most
        :data:`.fairshare.CREDIT` grants' worth below the least among those already waiting
        (start-time fair queuing's virtual time, with the slack of a lag it may rightly carry).
        Usage only: what the others hold now still counts against them."""
        self._accrue(now)
        floor = min(
            (self._usage(t, now) / t.config.weight for t in self._tenants.values() if t.queue), default=None
        )
        if floor is not None:
            slack = fairshare.CREDIT * self.hold_time.seconds * head.demand.share_of(self.capacity)
            self.usage.add(state.config.name, floor * state.config.weight - slack - self._usage(state, now))

    def _unhold(self, grant: Grant) -> bool:
        if grant.released:
            return False
        self._accrue(self._clock())
        grant.released = True
        state = self._tenants.get(grant.tenant)
        if state is not None:
            state.held = state.held - grant.demand
        self._held = self._held - grant.demand
        return True

    def revoke(self, grant: Grant, transfer: Grant | None = None) -> None:
        """Undo a grant the shared admission refused: it never held anything, and the
        grant it took over (``transfer``, a warm sandbox's) holds again."""
        self._unhold(grant)
        if transfer is not None and transfer.released:
            self._accrue(self._clock())
            transfer.released = False
            state = self._tenants.get(transfer.tenant)
            if state is not None:
                state.held = state.held + transfer.demand
            self._held = self._held + transfer.demand
        self._dispatch()

    def withdraw(self, ticket: Ticket) -> None:
        """Take a request that is still waiting out of the queue (its caller gives up)."""
        self._remove(ticket)

    def release(self, grant: Grant) -> None:
        """Give back what ``grant`` held (the sandbox is gone).  Safe to call twice."""
        if not self._unhold(grant):
            return
        for callback in self.on_release:
            callback(grant)
        now = self._clock()
        self.hold_time.observe(now - grant.granted_at)
        if self._last_release is not None:
            gap = max(now - self._last_release, 1e-3)
            rate = 1.0 / gap
            self._release_rate = rate if self._release_rate is None else 0.8 * self._release_rate + 0.2 * rate
        self._last_release = now
        self._dispatch()

    # -- where a request stands ----------------------------------------------------

    def position(self, ticket: Ticket) -> Position:
        """Where ``ticket`` stands now (cheap: one sort per change of the queue, shared by all)."""
        ahead = self._ahead(ticket)
        state = self._tenants[ticket.tenant.name]
        same = 0
        for other in state.queue:
            if other is ticket:
                break
            same += 1
        return Position(
            position=ahead + 1,
            ahead_same_tenant=same,
            queued=self._queued,
            eta=self._eta(ahead + 1),
            blocked_by=self._blocked_by(ticket),
        )

    def _blocked_by(self, ticket: Ticket) -> str:
        state = self._tenants.get(ticket.tenant.name)
        head = state.queue[0] if state is not None and state.queue else ticket
        return head.blocked_by or "capacity"

    def _ahead(self, ticket: Ticket) -> int:
        """Queued requests in a better band, or in its band and older (bands as of the last change)."""
        if self._ranks is None:
            now = self._clock()
            keys = sorted(
                (self._effective_band(t, now), t.enqueued, t.seq)
                for s in self._tenants.values()
                for t in s.queue
            )
            self._ranks = {key[2]: i for i, key in enumerate(keys)}
        return self._ranks.get(ticket.seq, 0)

    def _eta(self, grants_needed: int) -> float | None:
        if not self._release_rate:
            return None
        return round(grants_needed / self._release_rate, 3)

    def _retry_after(self, grants_needed: int, ticket: Ticket | None = None) -> int:
        if ticket is not None and ticket.blocked_by == "rate":
            state = self._tenants[ticket.tenant.name]
            return max(1, math.ceil(state.bucket.wait_for_one(ticket.tenant, self._clock())))
        eta = self._eta(grants_needed)
        return DEFAULT_RETRY_AFTER if eta is None else max(1, min(600, math.ceil(eta)))

    # -- the dispatcher ----------------------------------------------------------------

    def _effective_band(self, ticket: Ticket, now: float) -> int:
        return max(0, ticket.band - int((now - ticket.enqueued) / self.aging))

    def _holding(self, state: _Tenant) -> Resources:
        """What a tenant holds on every replica (this one's exact count, the others' as last read)."""
        others = self._others.get(state.config.name)
        return state.held if others is None else state.held + others

    def _order(self, now: float) -> Iterator[tuple[_Tenant, Ticket]]:
        heads = [(state, state.queue[0]) for state in self._tenants.values() if state.queue]
        heads.sort(
            key=lambda pair: (
                self._effective_band(pair[1], now),
                self._key(pair[0], now),
                pair[1].enqueued,
                pair[1].seq,
            )
        )
        return iter(heads)

    def _dispatch(self) -> None:
        """Admit every head whose turn it is; schedule the next look when time alone can change that."""
        now = self._clock()
        self._accrue(now)
        wake: float | None = None
        progress = True
        while progress and self._queued:
            progress = False
            for state, head in self._order(now):
                config = state.config
                if not (self._holding(state) + head.demand).fits(tenant_limit(config)):
                    head.blocked_by = "tenant_cap"
                    continue
                wait = state.bucket.wait_for_one(config, now)
                if wait > 0:
                    head.blocked_by = "rate"
                    wake = now + wait if wake is None else min(wake, now + wait)
                    continue
                moving = head.transfer if head.transfer is not None and not head.transfer.released else None
                needed = head.demand - moving.demand if moving is not None else head.demand
                if not (self._held + self._others_total + needed).fits(self.capacity):
                    head.blocked_by = "capacity"
                    break  # strict order: nothing behind it jumps ahead
                state.bucket.tokens -= 1.0
                state.queue.popleft()
                self._queued -= 1
                if moving is not None:
                    self._unhold(moving)  # it changes hands: no release, no room freed
                state.held = state.held + head.demand
                self._held = self._held + head.demand
                grant = Grant(config.name, head.demand, now, now - head.enqueued)
                head.future.set_result(grant)  # a queued ticket's future is never done (see _remove)
                self._decided("granted", config.name, None, grant.waited)
                progress = True
                break  # shares changed: order again
        # Aging: the next moment a queued head moves up a band.
        for state in self._tenants.values():
            if state.queue and state.queue[0].band > 0:
                head = state.queue[0]
                steps = int((now - head.enqueued) / self.aging) + 1
                at = head.enqueued + steps * self.aging
                wake = at if wake is None else min(wake, at)
        self._schedule(wake)
        self._notify()

    def _schedule(self, at: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if at is None or not self._queued:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, at - self._clock()), self._dispatch)

    def _remove(self, ticket: Ticket) -> None:
        state = self._tenants.get(ticket.tenant.name)
        if state is None:
            return
        try:
            state.queue.remove(ticket)
        except ValueError:
            return
        self._queued -= 1
        if not ticket.future.done():
            ticket.future.cancel()
        self._dispatch()  # a head left: the next one may fit

    def _change_event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        self._ranks = None
        if self._changed is not None:
            changed, self._changed = self._changed, None
            changed.set()

    def _decided(self, outcome: str, tenant: str, reason: str | None, waited: float) -> None:
        for hook in self.on_decision:
            hook(outcome, tenant, reason, waited)


_WHY = {
    "tenant_cap": "the tenant holds as much as its caps allow; destroy a sandbox or raise the caps",
    "capacity": "the server is full; retry later",
    "rate": "the tenant creates faster than its rate allows; retry later",
    "queue_full": "the queue is full",
}


def _show(r: Resources) -> str:
    return f"{r.sandboxes} sandbox(es), {r.memory} bytes of memory, {r.cpus:g} CPUs"


__all__ = [
    "BANDS",
    "Admission",
    "Grant",
    "Position",
    "Reason",
    "Rejected",
    "Resources",
    "Ticket",
    "tenant_limit",
]
