"""Admission shared by the replicas of one manager, and their leader.

Several ``agentnest serve`` replicas on one PostgreSQL database each keep their
own fair queue (:mod:`agentnest.server.admission`: a waiting request is a live
HTTP request on one replica).  What makes them one admission is the database:

- Every grant is confirmed by one transaction (:meth:`Database.hold
  <agentnest.server.db.Database.hold>`) that, under an advisory lock, sums what
  every replica holds for the tenant and in all, and writes the grant's row only
  if the tenant's caps and the capacity still have room.  Two replicas can
  never both take the last slot.  A grant the database refuses is undone
  (:meth:`Admission.revoke <agentnest.server.admission.Admission.revoke>`) and
  the request queues again with what the others hold read afresh.
- Each replica reads what the others hold every second and counts it as held,
  so its queue waits for room they took and its fair order sees their
  holdings.  With it, it writes its tenants' remembered usage (fair share over
  time, :mod:`agentnest.server.fairshare`) and reads the others': a tenant's
  key counts its usage on every replica.
- A replica's releases delete its rows with its next confirmation or its next
  refresh (within :data:`REFRESH`), whichever comes first.  The rows of a
  replica that stops answering are deleted by the sweep of the leader.

The leader (a row of the ``leases`` table, renewed every third of its time)
runs what must run once for all: the sweep of gone servers (their sandbox rows
ended, their holds freed, their containers removed) and the retention.  The
reaper of lapsed leases and the warm pools run on every replica, each for its
own sandboxes: a sandbox's channel and its warm sandboxes are held by the
process that started them.  A
successor takes over within the lease time; a clean stop gives the lease up
at once.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from ..errors import RuntimeNotAvailableError
from .admission import Admission, Grant, tenant_limit
from .tenants import Tenant

if TYPE_CHECKING:
    from .db import Database  # SQLAlchemy is imported only where a database is configured

log = logging.getLogger("agentnest.server")

#: Seconds between reads of what the other replicas hold.
REFRESH = 1.0
#: The leader's lease: its name in the ``leases`` table.
LEADER = "leader"


class SharedAdmission:
    """This replica's link to the admission it shares with the others (PostgreSQL only).

    Args:
        admission: this replica's queue.
        database: the shared database.
        server: this replica's id (its rows carry it).
    """

    def __init__(self, admission: Admission, database: Database, server: str) -> None:
        self.admission = admission
        self.database = database
        self.server = server
        self.refused = 0
        """Grants made here that the database refused (another replica took the room first)."""
        self._released: set[str] = set()
        # One refresh at a time: a create's refresh and the periodic one both replace this
        # replica's usage rows (delete, insert), and two at once collide on PostgreSQL's key.
        self._refreshing = anyio.Lock()
        admission.on_release.append(self._on_release)

    def _on_release(self, grant: Grant) -> None:
        self._released.add(grant.id)

    async def confirm(self, grant: Grant, tenant: Tenant, transfer: Grant | None = None) -> str | None:
        """Write ``grant`` if every replica's holdings leave room: None, else why not.

        Raises:
            RuntimeNotAvailableError: the database did not answer (nothing was granted).
        """
        released = list(self._released)
        reason = await anyio.to_thread.run_sync(
            functools.partial(
                self.database.hold,
                grant.id,
                server=self.server,
                tenant=grant.tenant,
                demand=grant.demand,
                tenant_limit=tenant_limit(tenant),
                capacity=self.admission.capacity,
                replaces=transfer.id if transfer is not None else None,
                released=released,
            )
        )
        self._released.difference_update(released)
        if reason is not None:
            self.refused += 1
        return reason

    async def refresh(self) -> None:
        """Write this replica's releases and read what the others hold now."""
        async with self._refreshing:
            await self._refresh()

    async def _refresh(self) -> None:
        released = list(self._released)
        if released:
            await anyio.to_thread.run_sync(self.database.unhold, released)
            self._released.difference_update(released)
        held = await anyio.to_thread.run_sync(self.database.held_elsewhere, self.server)
        # The remembered usage of fair share over time: this replica's written, the others' read.
        half_life = self.admission.usage.half_life
        mine = self.admission.own_usage()
        await anyio.to_thread.run_sync(self.database.write_usage, self.server, mine, half_life)
        others = await anyio.to_thread.run_sync(self.database.usage_elsewhere, self.server, half_life)
        self.admission.set_others(held, others)

    async def run(self) -> None:
        """Until cancelled: :meth:`refresh` every :data:`REFRESH` seconds."""
        while True:
            try:
                await self.refresh()
            except RuntimeNotAvailableError as exc:
                # Creates are refused while the database is down (require_database); the
                # last view of the others stays until it answers again.
                log.debug("shared admission: %s", exc)
            await anyio.sleep(REFRESH)


async def lead(database: Database, holder: str, ttl: float, on_change: Callable[[bool], None]) -> None:
    """Until cancelled: take the leader's lease when it is free and renew it every ``ttl / 3``
    seconds; ``on_change(leading)`` each time this replica becomes or stops being the leader.
    Gives the lease up when cancelled (a clean stop: the successor need not wait it out)."""
    leading = False
    try:
        while True:
            try:
                now_leading = await anyio.to_thread.run_sync(database.lead, LEADER, holder, ttl)
            except RuntimeNotAvailableError as exc:
                # Unknown whether the lease still holds: stop leading until it is renewed.
                log.debug("leader lease: %s", exc)
                now_leading = False
            if now_leading != leading:
                leading = now_leading
                log.info("this server %s the leader", "is now" if leading else "is no longer")
                on_change(leading)
            await anyio.sleep(ttl / 3)
    finally:
        if leading:
            on_change(False)
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(database.resign, LEADER, holder)
                except RuntimeNotAvailableError as exc:
                    log.warning("could not give up the leader's lease: %s", exc)


__all__ = ["LEADER", "REFRESH", "SharedAdmission", "lead"]
