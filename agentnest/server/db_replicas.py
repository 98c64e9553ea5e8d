"""The part of the manager's database that servers share with each other: their heartbeats,
the sweep of gone ones, the admission across replicas and the leader's lease.

A mixin of :class:`~agentnest.server.db.Database`, kept apart to keep that module readable;
see :mod:`agentnest.server.shared` for how the server uses it.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from .._version import __version__
from ..errors import RuntimeNotAvailableError
from . import fairshare
from .admission import Resources
from .db_tables import events, first_line, holds, leases, sandboxes, servers, usage

#: Key of the PostgreSQL advisory lock of admission: held for the length of one
#: :meth:`ReplicaQueries.hold` transaction, so the check of what every replica holds and
#: the new row are one step (two replicas never both see the last free slot).
_ADMISSION_LOCK = 0x41474E54
_LOCK = sa.text("SELECT pg_advisory_xact_lock(:key)")
# Database.hold on PostgreSQL in one statement (a grant costs three round trips: the lock, this,
# the commit).  Every part of a statement sees the same snapshot, so the sums leave out the rows
# it deletes (``skip``: the releases written here, the hold taken over) instead of seeing them
# gone; the row taken over goes only if the new one is written.  Same rules as the portable path
# below it, which the tests run on SQLite and PostgreSQL alike.
_GRANT = sa.text(
    """
WITH gone AS (DELETE FROM holds WHERE hold = ANY(CAST(:released AS VARCHAR[]))),
held AS (
    SELECT
        COALESCE(SUM(sandboxes) FILTER (WHERE tenant = :tenant), 0) AS tn,
        COALESCE(SUM(memory) FILTER (WHERE tenant = :tenant), 0) AS tm,
        COALESCE(SUM(cpus) FILTER (WHERE tenant = :tenant), 0) AS tc,
        COALESCE(SUM(sandboxes), 0) AS n,
        COALESCE(SUM(memory), 0) AS m,
        COALESCE(SUM(cpus), 0) AS c
    FROM holds WHERE NOT (hold = ANY(CAST(:skip AS VARCHAR[])))
),
verdict AS (
    SELECT
        (tn + :sandboxes <= :ln AND tm + :memory <= :lm AND tc + :cpus <= :lc + 1e-9) AS tenant_ok,
        (n + :sandboxes <= :cn AND m + :memory <= :cm AND c + :cpus <= :cc + 1e-9) AS capacity_ok
    FROM held
),
added AS (
    INSERT INTO holds (hold, server, tenant, sandboxes, memory, cpus, since)
    SELECT :hold, :server, :tenant, :sandboxes, :memory, :cpus, :since
    FROM verdict WHERE tenant_ok AND capacity_ok
    RETURNING hold
),
moved AS (DELETE FROM holds WHERE hold = :replaces AND EXISTS (SELECT 1 FROM added))
SELECT tenant_ok, capacity_ok FROM verdict
"""
)


class ReplicaQueries:
    """Servers, their holds and their leader (mixed into :class:`~agentnest.server.db.Database`)."""

    dialect: str
    _grants: Engine

    if TYPE_CHECKING:

        @property
        def display(self) -> str: ...

        def _begin(self) -> AbstractContextManager[Connection]: ...

    @staticmethod
    def _close(conn: Connection, where: list[sa.ColumnElement[bool]], reason: str) -> int:
        last = (
            sa.select(sa.func.max(events.c.time))
            .where(events.c.sandbox_id == sandboxes.c.sandbox_id)
            .scalar_subquery()
        )
        result = conn.execute(
            sandboxes.update()
            .where(sandboxes.c.ended.is_(None), *where)
            .values(ended=sa.func.coalesce(last, sandboxes.c.started), end_reason=reason)
        )
        return int(result.rowcount or 0)

    # -- servers ---------------------------------------------------------------------

    def heartbeat(self, server: str, *, host: str, pid: int, started: float, url: str | None = None) -> None:
        """Say that ``server`` is alive now (registering it the first time), reachable at ``url``."""
        now = time.time()
        with self._begin() as conn:
            updated = conn.execute(
                servers.update().where(servers.c.server == server).values(seen=now, url=url)
            )
            if not updated.rowcount:
                conn.execute(
                    servers.insert(),
                    [
                        {
                            "server": server,
                            "host": host[:255],
                            "pid": pid,
                            "version": __version__[:32],
                            "started": started,
                            "seen": now,
                            "url": url,
                        }
                    ],
                )

    def sweep(self, stale_after: float) -> tuple[list[str], int]:
        """End the open sandbox rows of servers silent for ``stale_after`` seconds (or never
        registered), at their last event; forget those servers.  Returns their owners
        (``host:pid``, as the backends label sandboxes) and the number of rows ended.

        One transaction, idempotent; the leader runs it (:meth:`lead`).
        """
        cutoff = time.time() - stale_after
        with self._begin() as conn:
            stale = conn.execute(
                sa.select(servers.c.server, servers.c.host, servers.c.pid).where(servers.c.seen < cutoff)
            ).all()
            live = sa.select(servers.c.server).where(servers.c.seen >= cutoff)
            closed = self._close(conn, [sandboxes.c.server.not_in(live)], "lost")
            # What a gone server held is free again (its sandboxes are ended above and
            # removed from the backends by the caller).
            conn.execute(holds.delete().where(holds.c.server.not_in(live)))
            if stale:
                conn.execute(servers.delete().where(servers.c.server.in_([row.server for row in stale])))
            alive = {
                f"{row.host}:{row.pid}"
                for row in conn.execute(
                    sa.select(servers.c.host, servers.c.pid).where(servers.c.seen >= cutoff)
                )
            }
        # A live server with the same host and pid (a restart in the same container) owns
        # whatever carries that label now: never hand it to the backends for removal.
        return sorted({f"{row.host}:{row.pid}" for row in stale} - alive), closed

    def owner_url(self, sandbox_id: str, server: str) -> tuple[str, str | None] | None:
        """The URL of the live server other than ``server`` that runs ``sandbox_id``, if any, and the
        id of the token the sandbox belongs to."""
        with self._begin() as conn:
            row = conn.execute(
                sa.select(servers.c.url, sandboxes.c.token)
                .join(sandboxes, sandboxes.c.server == servers.c.server)
                .where(
                    sandboxes.c.sandbox_id == sandbox_id,
                    sandboxes.c.ended.is_(None),
                    servers.c.server != server,
                    servers.c.url.is_not(None),
                )
            ).first()
        return None if row is None else (str(row.url), row.token)

    def forget_others(self, server: str) -> list[str]:
        """Forget every server but ``server`` and free what they held; their owners (``host:pid``).

        For a server alone on its database (SQLite) at start: the others are earlier runs.
        """
        with self._begin() as conn:
            others = [
                row.server
                for row in conn.execute(sa.select(servers.c.server).where(servers.c.server != server))
            ]
        return self.forget(others)

    def forget(self, gone: Sequence[str]) -> list[str]:
        """Servers known to be gone (their process exited): end their open sandbox rows at
        their last event (``lost``), free what they held, forget them; their owners (``host:pid``)."""
        if not gone:
            return []
        with self._begin() as conn:
            rows = conn.execute(
                sa.select(servers.c.host, servers.c.pid).where(servers.c.server.in_(list(gone)))
            ).all()
            self._close(conn, [sandboxes.c.server.in_(list(gone))], "lost")
            conn.execute(holds.delete().where(holds.c.server.in_(list(gone))))
            conn.execute(servers.delete().where(servers.c.server.in_(list(gone))))
        return sorted({f"{row.host}:{row.pid}" for row in rows})

    def deregister(self, server: str) -> None:
        """Forget ``server`` (it stopped cleanly, its rows ended)."""
        with self._begin() as conn:
            conn.execute(servers.delete().where(servers.c.server == server))
            conn.execute(holds.delete().where(holds.c.server == server))

    def list_servers(self) -> list[dict[str, Any]]:
        """The registered servers, most recently seen first."""
        with self._begin() as conn:
            rows = conn.execute(sa.select(servers).order_by(servers.c.seen.desc())).mappings().all()
        return [dict(row) for row in rows]

    # -- admission across replicas (PostgreSQL) -------------------------------------------

    def hold(
        self,
        hold: str,
        *,
        server: str,
        tenant: str,
        demand: Resources,
        tenant_limit: Resources,
        capacity: Resources,
        replaces: str | None = None,
        released: Sequence[str] = (),
    ) -> str | None:
        """Grant ``demand`` to ``tenant`` if what every replica holds leaves room: one transaction.

        ``replaces`` is a hold this one takes over (a warm sandbox changing from its
        pool to the tenant); ``released`` are holds this server gave back and may
        not have written yet.  Returns None when granted (the row is written),
        else why not: ``tenant_cap`` or ``capacity``.
        """
        row = {
            "hold": hold,
            "server": server,
            "tenant": tenant[:64],
            "sandboxes": demand.sandboxes,
            "memory": demand.memory,
            "cpus": demand.cpus,
            "since": time.time(),
        }
        if self.dialect == "postgresql":
            params = {
                **row,
                "released": list(released),
                "skip": [*released, *([replaces] if replaces else [])],
                "replaces": replaces or "",
                "ln": tenant_limit.sandboxes,
                "lm": tenant_limit.memory,
                "lc": tenant_limit.cpus,
                "cn": capacity.sandboxes,
                "cm": capacity.memory,
                "cc": capacity.cpus,
            }
            return self._grant_on_postgresql(params)
        with self._begin() as conn:
            if released:
                conn.execute(holds.delete().where(holds.c.hold.in_(list(released))))
            if not (self._held(conn, tenant, replaces) + demand).fits(tenant_limit):
                return "tenant_cap"
            if not (self._held(conn, None, replaces) + demand).fits(capacity):
                return "capacity"
            if replaces:
                conn.execute(holds.delete().where(holds.c.hold == replaces))
            conn.execute(holds.insert(), [row])
        return None

    def _grant_on_postgresql(self, params: Mapping[str, Any]) -> str | None:
        for attempt in (1, 2):
            try:
                with self._grants.begin() as conn:
                    # Serialises the admission transactions of all replicas (released at commit):
                    # without it two could each read the sums before the other's insert.  A
                    # statement of its own: the next one's snapshot is taken after the lock.
                    conn.execute(_LOCK, {"key": _ADMISSION_LOCK})
                    tenant_ok, capacity_ok = conn.execute(_GRANT, params).one()
            except IntegrityError:
                if attempt == 2:
                    return None  # the first try committed before its connection dropped: granted
                raise
            except DBAPIError as exc:
                if attempt == 1 and exc.connection_invalidated:
                    continue  # a connection the server had dropped (it restarted): once more, fresh
                raise RuntimeNotAvailableError(
                    f"the manager's database {self.display} failed: {first_line(exc)}"
                ) from exc
            except SQLAlchemyError as exc:
                raise RuntimeNotAvailableError(
                    f"the manager's database {self.display} failed: {first_line(exc)}"
                ) from exc
            return None if tenant_ok and capacity_ok else "tenant_cap" if not tenant_ok else "capacity"
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _held(conn: Connection, tenant: str | None, besides: str | None = None) -> Resources:
        query = sa.select(
            sa.func.coalesce(sa.func.sum(holds.c.sandboxes), 0),
            sa.func.coalesce(sa.func.sum(holds.c.memory), 0),
            sa.func.coalesce(sa.func.sum(holds.c.cpus), 0.0),
        )
        if besides is not None:
            query = query.where(holds.c.hold != besides)
        if tenant is not None:
            query = query.where(holds.c.tenant == tenant)
        n, memory, cpus = conn.execute(query).one()
        return Resources(int(n), int(memory), float(cpus))

    def held_elsewhere(self, server: str) -> dict[str, Resources]:
        """What the other replicas hold, per tenant."""
        with self._begin() as conn:
            rows = conn.execute(
                sa.select(
                    holds.c.tenant,
                    sa.func.sum(holds.c.sandboxes),
                    sa.func.sum(holds.c.memory),
                    sa.func.sum(holds.c.cpus),
                )
                .where(holds.c.server != server)
                .group_by(holds.c.tenant)
            ).all()
        return {row[0]: Resources(int(row[1]), int(row[2]), float(row[3])) for row in rows}

    def unhold(self, released: Sequence[str]) -> None:
        """Forget holds given back (idempotent)."""
        if released:
            with self._begin() as conn:
                conn.execute(holds.delete().where(holds.c.hold.in_(list(released))))

    def write_usage(
        self, server: str, values: Mapping[str, float], half_life: float = fairshare.HALF_LIFE
    ) -> None:
        """Replace ``server``'s row of each tenant's decayed usage (as of now, wall clock).

        Rows are kept when their server is gone (the usage was the tenant's); a row whose value
        has decayed to nothing is deleted by the next write of any server.
        """
        now = time.time()
        rows = [
            {"server": server, "tenant": tenant[:64], "value": value, "stamp": now}
            for tenant, value in values.items()
            if value > fairshare.NEGLIGIBLE
        ]
        # Older than this, any value a server can write has decayed below NEGLIGIBLE.
        forgotten = now - 64 * half_life
        with self._begin() as conn:
            conn.execute(usage.delete().where(sa.or_(usage.c.server == server, usage.c.stamp < forgotten)))
            if rows:
                conn.execute(usage.insert(), rows)

    def usage_elsewhere(self, server: str, half_life: float = fairshare.HALF_LIFE) -> dict[str, float]:
        """Each tenant's decayed usage on the other replicas (and gone ones), as of now."""
        now = time.time()
        with self._begin() as conn:
            rows = conn.execute(
                sa.select(usage.c.tenant, usage.c.value, usage.c.stamp).where(usage.c.server != server)
            ).all()
        summed: dict[str, float] = {}
        for tenant, value, stamp in rows:
            summed[tenant] = summed.get(tenant, 0.0) + fairshare.decayed(float(value), now - stamp, half_life)
        return summed

    def lead(self, name: str, holder: str, ttl: float) -> bool:
        """Take or renew the lease ``name`` for ``holder`` for ``ttl`` seconds; True if it holds it.

        A lease whose holder stopped renewing it is free once it expires: the
        successor takes over within ``ttl``.  (Replicas' clocks must agree to well
        within ``ttl``, as for the heartbeats.)
        """
        now = time.time()
        try:
            with self._begin() as conn:
                taken = conn.execute(
                    leases.update()
                    .where(leases.c.name == name, sa.or_(leases.c.holder == holder, leases.c.expires < now))
                    .values(holder=holder, expires=now + ttl)
                )
                if taken.rowcount:
                    return True
                if conn.execute(sa.select(leases.c.name).where(leases.c.name == name)).first() is not None:
                    return False
                conn.execute(leases.insert(), [{"name": name, "holder": holder, "expires": now + ttl}])
        except IntegrityError:
            return False  # another replica inserted it first
        return True

    def resign(self, name: str, holder: str) -> None:
        """Give the lease up at once (a clean stop: the successor need not wait it out)."""
        with self._begin() as conn:
            conn.execute(leases.delete().where(leases.c.name == name, leases.c.holder == holder))
