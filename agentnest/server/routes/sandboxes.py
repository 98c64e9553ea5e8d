"""``/v1/sandboxes``: create (waiting its tenant's turn), list, describe, destroy, extend, lease, fork.

A create that cannot start now waits in its tenant's queue; asked for
``text/event-stream`` it says where it stands while it waits.  A lease
stream holds its sandbox as long as it is open.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ...errors import AdmissionRefusedError, AgentNestError, PolicyDeniedError
from .. import schemas as s
from ..admission import Position
from ..auth import Token
from ..entries import Entry
from ..refused import Refused
from ..service import Service
from ..sse import event
from .deps import ERRORS, SandboxId, ServiceDep, TokenDep, owned

#: Seconds between the comment lines of a held lease stream (they keep proxies from closing it).
LEASE_HEARTBEAT = 10.0

router = APIRouter(tags=["sandboxes"], responses=ERRORS)


@router.post("/v1/sandboxes", status_code=201, response_model=s.SandboxOut)
async def create_sandbox(
    service: ServiceDep, token: TokenDep, body: s.CreateSandbox, request: Request
) -> Any:
    """Create a sandbox within the token's ceiling, once its tenant's turn comes.

    A create that cannot start now waits in its tenant's queue up to
    ``max_wait``, then fails with 429, a reason code (``tenant_cap``,
    ``capacity``, ``rate``, ``queue_full``) and ``Retry-After``.  With
    ``Accept: text/event-stream`` the answer is a stream: ``queued`` events
    (position, requests ahead of it in its tenant, estimated wait) while it
    waits, then ``created`` (the sandbox) or ``error``.  A client that goes
    away while queued leaves the queue at once.
    """
    if "text/event-stream" in request.headers.get("accept", ""):
        return StreamingResponse(
            _create_events(service, token, body),
            status_code=201,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def client_gone() -> None:
        # The body is read: the next message the server gets is the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    entry = await service.create(token, body, client_gone=client_gone)
    return await service.describe(entry, fresh=True)


@router.get("/v1/sandboxes", response_model=s.SandboxList)
async def list_sandboxes(service: ServiceDep, token: TokenDep) -> s.SandboxList:
    """This token's live sandboxes."""
    await service.reap()
    mine = sorted((e for e in service.entries.values() if e.token_id == token.id), key=lambda e: e.created)
    described = [await service.describe(e) for e in mine]
    return s.SandboxList(
        sandboxes=described,
        max_sandboxes=token.ceiling.max_sandboxes,
        available=max(0, token.ceiling.max_sandboxes - service.count(token.id)),
    )


@router.get("/v1/sandboxes/{sandbox_id}", response_model=s.SandboxOut)
async def get_sandbox(service: ServiceDep, token: TokenDep, sandbox_id: SandboxId) -> s.SandboxOut:
    """One sandbox of this token."""
    return await service.describe(await owned(service, token, sandbox_id))


@router.delete("/v1/sandboxes/{sandbox_id}", response_model=s.Deleted)
async def delete_sandbox(service: ServiceDep, token: TokenDep, sandbox_id: SandboxId) -> s.Deleted:
    """Destroy a sandbox and everything in it."""
    entry = service.get(token, sandbox_id)
    await service.destroy(entry)
    return s.Deleted(id=sandbox_id, destroyed=True)


@router.post("/v1/sandboxes/{sandbox_id}/extend", response_model=s.ExtendOut)
async def extend(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, body: s.ExtendIn
) -> s.ExtendOut:
    """Move the deadline later (the whole lifetime stays within the token's max_timeout)."""
    entry = await owned(service, token, sandbox_id)
    if entry.until is not None:
        # A claimed warm sandbox: its lifetime counts from the claim.
        lifetime = entry.until + body.seconds - entry.claimed_at
        if lifetime > token.ceiling.max_timeout:
            raise PolicyDeniedError(
                f"a lifetime of {lifetime:g}s is beyond this token's max_timeout "
                f"{token.ceiling.max_timeout:g}s"
            )
        entry.until += body.seconds
        if entry.until > entry.sandbox.deadline:
            await entry.sandbox.extend(entry.until - entry.sandbox.deadline)
        return s.ExtendOut(deadline=entry.deadline)
    return s.ExtendOut(deadline=await entry.sandbox.extend(body.seconds))


@router.get("/v1/sandboxes/{sandbox_id}/logs", response_model=s.LogsOut)
async def logs(
    service: ServiceDep,
    token: TokenDep,
    sandbox_id: SandboxId,
    tail: Annotated[int, Query(ge=1, le=10000)] = 200,
) -> s.LogsOut:
    """The sandbox's own diagnostics (redacted)."""
    entry = await owned(service, token, sandbox_id)
    return s.LogsOut(logs=await entry.sandbox.logs(tail))


@router.get("/v1/sandboxes/{sandbox_id}/network-log", response_model=s.NetworkLogOut)
async def network_log(service: ServiceDep, token: TokenDep, sandbox_id: SandboxId) -> s.NetworkLogOut:
    """Every connection an allowlist sandbox tried through its egress proxy (redacted)."""
    entry = await owned(service, token, sandbox_id)
    return s.NetworkLogOut(events=await entry.sandbox.network_log())


@router.post("/v1/sandboxes/{sandbox_id}/keepalive", response_model=s.LeaseOut)
async def keepalive(service: ServiceDep, token: TokenDep, sandbox_id: SandboxId) -> s.LeaseOut:
    """Renew the sandbox's idle lease (any call on it does too); returns the lease."""
    entry = await owned(service, token, sandbox_id)
    return entry.lease.out(service.settings.session_grace)


@router.get(
    "/v1/sandboxes/{sandbox_id}/lease",
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
    response_class=StreamingResponse,
)
async def hold_lease(service: ServiceDep, token: TokenDep, sandbox_id: SandboxId) -> StreamingResponse:
    """Hold the sandbox while this stream is open (a ``session`` lease ends when none is).

    Sends ``lease`` (the lease) at once and a comment line every
    ``LEASE_HEARTBEAT`` seconds, and ``ended`` when the sandbox is gone.
    """
    entry = await owned(service, token, sandbox_id)
    return StreamingResponse(
        _hold(service, entry), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
    )


@router.post("/v1/sandboxes/{sandbox_id}/fork", status_code=201, response_model=s.SandboxOut)
async def fork(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, body: s.ForkIn | None = None
) -> s.SandboxOut:
    """Branch a sandbox into a new one of this token (counts against max_sandboxes)."""
    entry = await owned(service, token, sandbox_id)
    new = await service.fork(token, entry, body.timeout if body is not None else None)
    return await service.describe(new, fresh=True)


async def _create_events(service: Service, token: Token, body: s.CreateSandbox) -> AsyncIterator[bytes]:
    """``POST /v1/sandboxes`` as server-sent events: ``queued``... then ``created`` or ``error``."""
    updates: asyncio.Queue[Position] = asyncio.Queue()

    async def on_update(position: Position) -> None:
        updates.put_nowait(position)

    # Cancelling this generator (the client went away) cancels the create: queued, it
    # leaves the queue; admitted, its start finishes and the sandbox is the token's.
    task = asyncio.ensure_future(service.create(token, body, on_update=on_update))
    try:
        while not task.done():
            getter = asyncio.ensure_future(updates.get())
            await asyncio.wait((task, getter), return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break
            yield event("queued", getter.result().to_dict())
        try:
            entry = task.result()
        except AdmissionRefusedError as exc:
            yield event(
                "error",
                {
                    "detail": str(exc),
                    "code": s.error_code(exc),
                    "status": 429,
                    "retry_after": exc.retry_after,
                },
            )
            return
        except AgentNestError as exc:
            code = s.error_code(exc)
            yield event("error", {"detail": str(exc), "code": code, "status": s.ERROR_CODES[code][0]})
            return
        except Refused as exc:
            yield event("error", {"detail": str(exc.detail), "code": exc.code, "status": exc.status_code})
            return
        yield event("created", (await service.describe(entry, fresh=True)).model_dump())
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, AgentNestError, Refused):
                await task


async def _hold(service: Service, entry: Entry) -> AsyncIterator[bytes]:
    with entry.lease.held():
        yield event("lease", entry.lease.out(service.settings.session_grace).model_dump())
        while service.entries.get(entry.sandbox.id) is entry:
            with anyio.move_on_after(LEASE_HEARTBEAT):
                await entry.gone.wait()
            if entry.gone.is_set():
                break
            yield b": held\n\n"
        yield event("ended", {"id": entry.sandbox.id})
