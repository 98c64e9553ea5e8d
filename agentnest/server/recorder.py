"""Writes the manager's audit events, admission decisions and sandbox usage to its database.

Events come from the guard on whatever thread ran the operation; the
:class:`Recorder` queues them (a thread-safe deque) and a task on the
server's event loop writes them in batches, in order, in one transaction
each, from a worker thread.  The guard's own JSONL audit log is still
written synchronously (an event that cannot be written there fails the
operation); the database is the central, queryable copy.

When the database is down, batches stay queued and are retried (events
carry their id, so a retry never duplicates one); new creates are refused
with 503 ``database_unavailable`` (:meth:`Recorder.require`) while running
sandboxes keep working.  The queue is bounded: past :data:`MAX_BUFFER`
operations the oldest *events* are dropped and counted (``dropped``; a
warning in the log), never a sandbox's start or end.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from ..errors import RuntimeNotAvailableError
from ..events import SandboxEvent
from .db import Database, EventQuery, Usage

log = logging.getLogger("agentnest.server")

#: Operations held while the database is unreachable before old events are dropped.
MAX_BUFFER = 200_000
#: Seconds between flushes of what is queued.
FLUSH_INTERVAL = 0.2
#: A create checks the database live when nothing reached it for this long.
HEALTH_TTL = 2.0
#: Seconds a health check may take before the database counts as down.
PING_TIMEOUT = 3.0

Op = tuple[str, Mapping[str, Any]]


class Recorder:
    """The manager's link to its :class:`~agentnest.server.db.Database`.

    Args:
        database: the open database (migrated).
        server: this server's id, written on every sandbox row it starts.
        retention: seconds of history kept (``None``: forever).
    """

    def __init__(
        self,
        database: Database,
        *,
        server: str | None = None,
        retention: float | None = None,
        url: str | None = None,
    ) -> None:
        self.database = database
        self.server = server or uuid.uuid4().hex[:16]
        self.url = url
        """Where the other servers reach this one (written with each heartbeat)."""
        self.started_at = time.time()
        self.retention = retention
        self._ops: collections.deque[Op] = collections.deque()
        self._writing = 0  # records of the batch being written now (out of _ops, not yet in the database)
        self._lock = threading.Lock()  # the deque's appends are atomic; the drop/requeue is not
        self._flushing = asyncio.Lock()
        self.dropped = 0
        self.healthy = True
        self.waiters = 0
        """Readers in :meth:`written` now (long polls waiting for news)."""
        self._last_ok = time.monotonic()
        self._written = asyncio.Event()

    # -- what goes in (any thread) ---------------------------------------------------------

    def _put(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)
            if len(self._ops) > MAX_BUFFER:
                self._drop_oldest_event()

    def _drop_oldest_event(self) -> None:
        for i, (kind, _row) in enumerate(self._ops):
            if kind == "event":
                del self._ops[i]
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    log.warning(
                        "the database has been unreachable too long: %d audit events dropped from its "
                        "queue (the JSONL audit log still has them)",
                        self.dropped,
                    )
                return

    def observer(self, owner: Callable[[str], tuple[str, str | None]]) -> Callable[[SandboxEvent], None]:
        """An event sink for sandboxes: each event tagged with ``owner(sandbox_id)``, its (tenant, token)."""

        def record(event: SandboxEvent) -> None:
            tenant, token = owner(event.sandbox_id)
            self._event(
                event.type.value,
                tenant,
                token,
                dict(event.attributes),
                sandbox_id=event.sandbox_id,
                actor=event.actor,
                event_id=event.event_id,
                at=event.timestamp,
            )

        return record

    def decision(self, outcome: str, tenant: str, reason: str | None, waited: float) -> None:
        """An admission decision (``admission.admitted`` or ``admission.rejected``)."""
        kind = "admission.admitted" if outcome == "granted" else "admission.rejected"
        self._event(kind, tenant, None, {"reason": reason, "waited": round(waited, 6)})

    def create_failed(self, tenant: str, token: str | None, backend: str, exc: BaseException) -> None:
        """An admitted create whose start failed (``sandbox.create_failed``; no sandbox id)."""
        # The same message the client got in its 502 answer, bounded.
        data = {"backend": backend, "error": type(exc).__name__, "message": str(exc)[:500]}
        self._event("sandbox.create_failed", tenant, token, data)

    def _event(
        self,
        kind: str,
        tenant: str,
        token: str | None,
        data: dict[str, Any],
        *,
        sandbox_id: str = "",
        actor: str = "host",
        event_id: str | None = None,
        at: float | None = None,
    ) -> None:
        """Queue one row of ``events`` (a host event of the manager unless told otherwise)."""
        self._put(
            (
                "event",
                {
                    "event_id": event_id or uuid.uuid4().hex,
                    "time": time.time() if at is None else at,
                    "tenant": tenant,
                    "token": token,
                    "sandbox_id": sandbox_id,
                    "type": kind,
                    "actor": actor,
                    "data": data,
                },
            )
        )

    def started(
        self,
        sandbox_id: str,
        *,
        tenant: str,
        token: str | None,
        backend: str,
        image: str,
        launch: str,
        memory: int,
        cpus: float,
    ) -> None:
        self._put(
            (
                "start",
                {
                    "sandbox_id": sandbox_id,
                    "tenant": tenant,
                    "token": token,
                    "backend": backend,
                    "image": image[:255],
                    "launch": launch,
                    "memory": memory,
                    "cpus": cpus,
                    "started": time.time(),
                    "server": self.server,
                },
            )
        )

    def ended(self, sandbox_id: str, reason: str) -> None:
        self._put(("end", {"sandbox_id": sandbox_id, "ended": time.time(), "reason": reason[:32]}))

    @property
    def queued(self) -> int:
        """Records not yet in the database: those waiting and those of the batch being written
        (a reader that sees 0 can read every record it queued before)."""
        with self._lock:
            return len(self._ops) + self._writing

    # -- writing (the event loop) ----------------------------------------------------------

    async def flush(self) -> None:
        """Write everything queued now; raises :class:`RuntimeNotAvailableError` if it cannot."""
        async with self._flushing:
            while True:
                with self._lock:
                    batch = list(self._ops)
                    self._ops.clear()
                    self._writing = len(batch)
                if not batch:
                    return
                try:
                    await anyio.to_thread.run_sync(self.database.apply, batch)
                except BaseException as exc:
                    with self._lock:
                        self._writing = 0
                        # Back in front, in order; whatever came meanwhile stays behind it.
                        self._ops.extendleft(reversed(batch))
                        while len(self._ops) > MAX_BUFFER:
                            before = len(self._ops)
                            self._drop_oldest_event()
                            if len(self._ops) == before:
                                break
                    if isinstance(exc, RuntimeNotAvailableError):
                        self._down(exc)
                    raise
                with self._lock:
                    self._writing = 0
                self._up()
                # Wake every reader waiting for news (a fresh Event for the next wait).
                written, self._written = self._written, asyncio.Event()
                written.set()

    async def run(self) -> None:
        """Flush every :data:`FLUSH_INTERVAL` until cancelled; back off while the database is down."""
        delay = FLUSH_INTERVAL
        while True:
            await anyio.sleep(delay)
            try:
                await self.flush()
            except RuntimeNotAvailableError:
                delay = min(max(delay * 2, 0.5), 5.0)
            except Exception:  # never let one bad batch end the writer
                log.exception("writing to the manager's database")
                delay = 5.0
            else:
                delay = FLUSH_INTERVAL

    async def close(self) -> None:
        """A last flush (best effort: the database may be the reason we stop)."""
        try:
            await self.flush()
        except Exception as exc:
            log.warning("the last %d records did not reach the database: %s", self.queued, exc)

    def _up(self) -> None:
        if not self.healthy:
            log.info("the manager's database %s is reachable again", self.database.display)
        self.healthy = True
        self._last_ok = time.monotonic()

    def _down(self, exc: BaseException) -> None:
        if self.healthy:
            log.error("%s", exc)
        self.healthy = False

    async def ping(self) -> None:
        """Raise :class:`RuntimeNotAvailableError` unless the database answers at its newest schema."""
        try:
            with anyio.fail_after(PING_TIMEOUT):
                await anyio.to_thread.run_sync(self.database.check, abandon_on_cancel=True)
        except TimeoutError:
            exc = RuntimeNotAvailableError(
                f"the manager's database {self.database.display} did not answer within {PING_TIMEOUT:g} s"
            )
            self._down(exc)
            raise exc from None
        except RuntimeNotAvailableError as exc:
            self._down(exc)
            raise
        self._up()

    async def require(self) -> None:
        """Before a create: raise :class:`RuntimeNotAvailableError` if the database is down.

        Free while writes succeed; a live check when the last one failed or is old.
        """
        if self.healthy and time.monotonic() - self._last_ok < HEALTH_TTL:
            return
        await self.ping()

    # -- reading ---------------------------------------------------------------------------

    async def events(self, query: EventQuery) -> list[dict[str, Any]]:
        await self.flush()  # read your own writes on this server
        return await anyio.to_thread.run_sync(self.database.events, query)

    async def written(self, timeout: float) -> None:
        """Return when this server next writes to the database, or after ``timeout`` seconds."""
        self.waiters += 1
        try:
            with anyio.move_on_after(timeout):
                await self._written.wait()
        finally:
            self.waiters -= 1

    async def usage(self, since: float, until: float | None, tenant: str | None) -> list[Usage]:
        await self.flush()
        return await anyio.to_thread.run_sync(self.database.usage, since, until, tenant)

    # -- liveness --------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        """Register this server, or say it is still alive."""
        await anyio.to_thread.run_sync(
            functools.partial(
                self.database.heartbeat,
                self.server,
                host=socket.gethostname(),
                pid=os.getpid(),
                started=self.started_at,
                url=self.url,
            )
        )

    async def liveness(
        self,
        stale_after: float,
        on_gone: Callable[[list[str]], Awaitable[None]] | None = None,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        """Until cancelled: a heartbeat every ``stale_after / 6`` seconds, and every
        ``stale_after / 2`` while ``leading()`` end the sandboxes of servers silent for
        ``stale_after``, then ``on_gone(owners)`` (their ``host:pid``) to remove what they
        left on the backends."""
        beat, sweep_every = stale_after / 6, stale_after / 2
        next_sweep = time.monotonic()
        while True:
            try:
                await self.heartbeat()
                if leading() and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + sweep_every
                    gone, closed = await anyio.to_thread.run_sync(self.database.sweep, stale_after)
                    if gone or closed:
                        log.warning(
                            "database: servers %s stopped answering for %gs; %d of their sandboxes ended "
                            "as lost at their last event",
                            gone or "(unregistered)",
                            stale_after,
                            closed,
                        )
                    if gone and on_gone is not None:
                        await on_gone(gone)
            except RuntimeNotAvailableError as exc:
                self._down(exc)
            await anyio.sleep(beat)

    async def deregister(self) -> None:
        """Forget this server in the database (a clean stop; best effort)."""
        try:
            await anyio.to_thread.run_sync(self.database.deregister, self.server)
        except RuntimeNotAvailableError as exc:
            log.warning("could not deregister from the database: %s", exc)

    async def prune(self) -> int:
        """Delete what is older than the retention (nothing without one)."""
        if self.retention is None:
            return 0
        return await anyio.to_thread.run_sync(self.database.prune, time.time() - self.retention)
