"""The manager's database as the :class:`~agentnest.server.service.Service` uses it: who owns
each event, recording a sandbox's start before its client hears of it, refusing creates while
the database is down, opening it (migrations, one server per SQLite file), and the tasks that
write, send heartbeats, sweep gone servers and apply the retention.

A mixin of :class:`~agentnest.server.service.Service`, kept apart to keep that module readable.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import anyio

from ..errors import AgentNestError, ConfigurationError
from ..events import Observer
from ..runtime.base import RuntimeBackend
from ..runtime.owner import owner_alive
from .entries import Entry
from .refused import Refused
from .settings import ServerSettings
from .shared import lead
from .tracing import Tracing

if TYPE_CHECKING:
    from .recorder import Recorder
    from .shared import SharedAdmission

log = logging.getLogger("agentnest.server")


def database_down(exc: AgentNestError) -> Refused:
    """The refusal of a create while the database is down (503, retry in a few seconds)."""
    detail = f"{exc}; creates resume when it answers"
    return Refused(503, "database_unavailable", detail, {"Retry-After": "5"})


class DatabaseMixin:
    """The database part of the service (see the module's docstring)."""

    settings: ServerSettings
    recorder: Recorder | None
    entries: dict[str, Entry]
    backends: dict[str, RuntimeBackend]
    tracing: Tracing
    shared: SharedAdmission | None
    """Admission shared with other replicas (PostgreSQL), else None."""
    leader = False
    """Whether this replica holds the leader's lease (PostgreSQL)."""

    def observers(self, tenant: str, token: str | None) -> tuple[Observer, ...]:
        """The event sinks of a new sandbox: the server's, and the database tagged with its owner.

        The owner is looked up per event: a warm sandbox's events belong to its
        pool until a claim, then to the claiming tenant and token.
        """
        tracing = () if self.tracing.observer is None else (self.tracing.observer,)
        recorder = self.recorder
        if recorder is None:
            return (*self.settings.observers, *tracing)

        def owner(sandbox_id: str) -> tuple[str, str | None]:
            entry = self.entries.get(sandbox_id)  # a dict read: safe from the guard's threads
            return (tenant, token) if entry is None else (entry.grant.tenant, entry.token_id)

        return (*self.settings.observers, *tracing, recorder.observer(owner))

    async def _started(self, entry: Entry, launch: str) -> None:
        """Record a new sandbox, durably before the client hears of it (one transaction): a
        server killed right after its answer still leaves the sandbox in the history."""
        self.tracing.annotate(sandbox_id=entry.sandbox.id, launch=launch)
        if self.recorder is None:
            return
        limits = entry.sandbox.config.limits
        self.recorder.started(
            entry.sandbox.id,
            tenant=entry.grant.tenant,
            token=entry.token_id,
            backend=entry.backend_name,
            image=entry.sandbox.config.image,
            launch=launch,
            memory=limits.memory,
            cpus=limits.cpus,
        )
        try:
            await self.recorder.flush()
        except Exception as exc:  # queued still, retried by the writer; the sandbox is real
            log.warning("recording the start of sandbox %s: %s", entry.sandbox.id, exc)

    async def require_database(self) -> None:
        """Refuse a create with 503 ``database_unavailable`` while the database is down:
        an admission that cannot be recorded is not made (running sandboxes are not touched)."""
        if self.recorder is None:
            return
        try:
            await self.recorder.require()
        except AgentNestError as exc:
            raise database_down(exc) from None

    async def open_database(self) -> bool:
        """Migrate (or check) the database once; False if it is unreachable now (logged).

        Raises:
            ConfigurationError: another live server uses the same SQLite file.
        """
        recorder = self.recorder
        if recorder is None:
            return True
        db = recorder.database
        try:
            if self.settings.migrate:
                before, after = await anyio.to_thread.run_sync(db.upgrade)
                if before != after:
                    log.info("database %s migrated from %s to %s", db.display, before or "nothing", after)
            await recorder.ping()
            if db.dialect == "sqlite":
                await self._alone_on_sqlite()
            await recorder.heartbeat()
            if db.dialect == "sqlite":
                # One server per SQLite file: rows another run left open ended with it, and
                # what it left on the backends (killed, it could not remove them) goes now
                # instead of at each sandbox's deadline.
                closed = await anyio.to_thread.run_sync(db.close_open, None)
                if closed:
                    log.info("database: %d sandboxes of an earlier run marked ended", closed)
                earlier = await anyio.to_thread.run_sync(db.forget_others, recorder.server)
                if earlier:
                    await self._reclaim(earlier)
            else:
                await self._reconcile()
        except ConfigurationError:
            raise
        except AgentNestError as exc:
            log.error("%s", exc)
            return False
        return True

    async def _reconcile(self) -> None:
        """At start on a shared database: the servers registered from this host whose process
        has exited (this replica's earlier run, restarted with a new pid) are gone now, not
        after ``--server-timeout``: their rows end, their holds go, their sandboxes are
        removed.  Servers on other hosts are left to the leader's sweep."""
        assert self.recorder is not None
        db = self.recorder.database
        gone = [
            other["server"]
            for other in await anyio.to_thread.run_sync(db.list_servers)
            if other["server"] != self.recorder.server
            and owner_alive(f"{other['host']}:{other['pid']}") is False
        ]
        owners = await anyio.to_thread.run_sync(db.forget, gone)
        if owners:
            log.warning(
                "database: servers %s of this host have exited; their sandboxes ended and removed", owners
            )
            await self._reclaim(owners)

    async def _alone_on_sqlite(self) -> None:
        """Refuse to share a SQLite file with a live server: each would end the other's
        sandboxes as those of an earlier run (and SQLite has one writer)."""
        assert self.recorder is not None
        db = self.recorder.database
        for other in await anyio.to_thread.run_sync(db.list_servers):
            owner = f"{other['host']}:{other['pid']}"
            alive = owner_alive(owner)
            if other["server"] == self.recorder.server or alive is False:
                continue
            if alive or time.time() - float(other["seen"]) < self.settings.server_timeout:
                raise ConfigurationError(
                    f"the SQLite database {db.display} is in use by another agentnest serve ({owner}); "
                    "give this server its own --database, or share PostgreSQL between servers"
                )

    async def run_database(self, opened: bool = False) -> None:
        """Until cancelled: open the database (retrying unless ``opened``), write what is
        recorded, apply the retention."""
        recorder = self.recorder
        if recorder is None:
            return
        while not opened and not await self.open_database():
            await anyio.sleep(5.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.run)
            tg.start_soon(recorder.liveness, self.settings.server_timeout, self._reclaim, self.is_leader)
            if self.shared is not None:
                tg.start_soon(self.shared.run)
                tg.start_soon(
                    lead, recorder.database, recorder.server, self.settings.leader_lease, self._lead_changed
                )
            if recorder.retention is not None:
                every = min(3600.0, recorder.retention / 4)
                while True:
                    if self.is_leader():
                        try:
                            pruned = await recorder.prune()
                            if pruned:
                                log.info("database: %d records past the retention deleted", pruned)
                        except AgentNestError as exc:
                            log.warning("database retention: %s", exc)
                    await anyio.sleep(every if self.is_leader() else self.settings.leader_lease)

    def is_leader(self) -> bool:
        """Whether this server runs the once-for-all duties: alone on SQLite, the lease's holder
        on PostgreSQL."""
        return self.shared is None or self.leader

    def _lead_changed(self, leading: bool) -> None:
        self.leader = leading

    async def _reclaim(self, owners: list[str]) -> None:
        """Remove from every backend what servers that stopped answering left running (the
        backend decides what it can reach: Docker, the sandboxes of gone processes on its host)."""
        if self.shared is not None:
            # Their holds were deleted with the sweep: the tenants' room is free here at once.
            try:
                await self.shared.refresh()
            except AgentNestError as exc:
                log.debug("shared admission: %s", exc)
        for name, backend in self.backends.items():
            try:
                removed = await anyio.to_thread.run_sync(backend.reclaim, owners)
            except AgentNestError as exc:
                log.warning("reclaiming the sandboxes of %s on %s: %s", owners, name, exc)
                continue
            if removed:
                log.warning("removed %d sandboxes of %s from %s", removed, owners, name)
