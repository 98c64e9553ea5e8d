"""Admission as the :class:`~agentnest.server.service.Service` does it: the capacity (configured,
else the backend's), this replica's queue, and the confirmation of each grant by the admission
replicas share on PostgreSQL (:mod:`agentnest.server.shared`).

A mixin of :class:`~agentnest.server.service.Service`, kept apart to keep that module readable.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from ..errors import AdmissionRefusedError, AgentNestError, PolicyDeniedError
from ..runtime.base import RuntimeBackend
from .admission import Admission, Grant, Position, Rejected, Resources
from .refused import Refused
from .service_db import database_down
from .settings import ServerSettings
from .tenants import Tenant
from .tracing import Tracing

if TYPE_CHECKING:
    from .shared import SharedAdmission

#: A dimension no one configured and the backend cannot tell: only the other dimensions bound it.
UNBOUNDED_MEMORY = 1 << 62
UNBOUNDED_CPUS = 1e9


class AdmitMixin:
    """The admission part of the service (see the module's docstring)."""

    settings: ServerSettings
    backends: dict[str, RuntimeBackend]
    default_backend: str
    admission: Admission
    shared: SharedAdmission | None
    tracing: Tracing
    _capacity_known: bool

    async def capacity(self) -> Resources:
        """What all sandboxes may hold together: configured, else what the default backend reports.

        Read once, on the first create (the engine may be down when the server starts).
        A dimension neither configured nor reported is bounded only by the others.
        """
        if not self._capacity_known:
            backend = self.backends[self.default_backend]
            memory, cpus = await anyio.to_thread.run_sync(backend.capacity)
            settings = self.settings
            self.admission.set_capacity(
                Resources(
                    settings.max_sandboxes,
                    settings.capacity_memory or memory or UNBOUNDED_MEMORY,
                    settings.capacity_cpus or cpus or UNBOUNDED_CPUS,
                )
            )
            self._capacity_known = True
        return self.admission.capacity

    async def admit(
        self,
        tenant: Tenant,
        demand: Resources,
        *,
        band: int | None = None,
        max_wait: float = 0.0,
        on_update: Callable[[Position], Awaitable[None]] | None = None,
        client_gone: Callable[[], Awaitable[object]] | None = None,
        transfer: Grant | None = None,
    ) -> Grant:
        """Wait for ``tenant``'s turn to hold ``demand`` (see :mod:`agentnest.server.admission`).

        Returns as soon as ``client_gone`` does (the client disconnected), with
        the request dropped from the queue at once.

        Raises:
            AdmissionRefusedError: not admitted within ``max_wait`` (429, with reason and Retry-After).
            PolicyDeniedError: it can never fit the tenant or the server (403).
        """
        with self.tracing.span(
            "agentnest.admission", tenant=tenant.name, memory=demand.memory, cpus=demand.cpus
        ) as span:
            started = time.monotonic()
            try:
                return await self._admit(
                    tenant,
                    demand,
                    band=band,
                    max_wait=max_wait,
                    on_update=on_update,
                    client_gone=client_gone,
                    transfer=transfer,
                )
            except AdmissionRefusedError as exc:
                span.set_attribute("agentnest.admission.reason", exc.reason)
                raise
            finally:
                span.set_attribute("agentnest.admission.waited", time.monotonic() - started)

    async def _admit(
        self,
        tenant: Tenant,
        demand: Resources,
        *,
        band: int | None,
        max_wait: float,
        on_update: Callable[[Position], Awaitable[None]] | None,
        client_gone: Callable[[], Awaitable[object]] | None,
        transfer: Grant | None,
    ) -> Grant:
        await self.capacity()
        deadline = time.monotonic() + max_wait
        wait = max_wait  # the client's own figure the first time (errors quote it)
        while True:
            grant = await self._queue(
                tenant,
                demand,
                band=band,
                max_wait=wait,
                on_update=on_update,
                client_gone=client_gone,
                transfer=transfer,
            )
            shared = self.shared
            if shared is None:
                return grant
            try:
                reason = await shared.confirm(grant, tenant, transfer)
            except AgentNestError as exc:
                self.admission.revoke(grant, transfer)
                raise database_down(exc) from None
            except BaseException:
                self.admission.revoke(grant, transfer)
                raise
            if reason is None:
                return grant
            # Another replica took the room first: queue again, knowing what the others hold now.
            self.admission.revoke(grant, transfer)
            with contextlib.suppress(AgentNestError):
                await shared.refresh()
            wait = max(0.0, deadline - time.monotonic())
            if not wait:
                raise AdmissionRefusedError(
                    f"tenant {tenant.name!r}: other replicas of this server hold "
                    + ("what the tenant may hold" if reason == "tenant_cap" else "the capacity")
                    + "; retry later",
                    reason,
                    1,
                )

    async def _queue(
        self,
        tenant: Tenant,
        demand: Resources,
        *,
        band: int | None,
        max_wait: float,
        on_update: Callable[[Position], Awaitable[None]] | None,
        client_gone: Callable[[], Awaitable[object]] | None,
        transfer: Grant | None,
    ) -> Grant:
        """This replica's queue (:class:`Admission`): the grant, or a refusal."""
        try:
            ticket = self.admission.submit(tenant, demand, band=band, max_wait=max_wait, transfer=transfer)
            if ticket.future.done():
                return ticket.future.result()
            waiting = asyncio.ensure_future(self.admission.wait(ticket, on_update))
            if client_gone is None:
                return await waiting
            watcher = asyncio.ensure_future(client_gone())
            try:
                await asyncio.wait((waiting, watcher), return_when=asyncio.FIRST_COMPLETED)
            finally:
                watcher.cancel()
                if not waiting.done():
                    waiting.cancel()  # the queue entry goes at once (Admission.wait's cleanup)
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
            if waiting.cancelled():
                raise Refused(499, "client_gone", "the client went away while its create was queued")
            return waiting.result()
        except Rejected as exc:
            if exc.status == 403:
                raise PolicyDeniedError(exc.detail) from None
            raise AdmissionRefusedError(exc.detail, exc.reason, exc.retry_after) from None
