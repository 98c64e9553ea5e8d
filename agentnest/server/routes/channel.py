"""``/v1/sandboxes/{id}/channel``: the raw agent protocol over a websocket, for the ``remote`` backend.

What is decided here is who may open one (the token that owns the sandbox;
not on a server with approval rules; at most ``MAX_CHANNELS`` a sandbox);
then the bytes are pumped both ways and audited.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

import contextlib
import logging

import anyio
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ...agent.wire import WireError
from ...errors import AgentNestError
from ..channel_audit import ChannelAudit
from ..entries import Entry
from ..refused import Refused
from ..service import MAX_CHANNELS, emitter_of, handle_of
from .deps import authenticate, owned, service_of

log = logging.getLogger("agentnest.server")

router = APIRouter()


@router.websocket("/v1/sandboxes/{sandbox_id}/channel")
async def channel(websocket: WebSocket, sandbox_id: str) -> None:
    """Carry the agent protocol between the client and a new agent in the sandbox.

    The server forwards the bytes and reads only the frames' headers, for
    its audit log (:mod:`agentnest.server.channel_audit`); bytes that are
    not the agent protocol close the channel (1007).  The sandbox is the
    boundary (the client could run the same code with /exec); what the
    server enforces is who may reach which sandbox, and the ceiling it was
    created under.  When either side goes away the agent's stream is
    closed, and the agent kills every command it started.
    """
    service = service_of(websocket)
    header = websocket.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    try:
        if scheme.lower() != "bearer":
            raise Refused(401, "unauthorized", "missing bearer token")
        token = authenticate(service, credential.strip())
        entry = await owned(service, token, sandbox_id)
    except Refused as exc:
        # Policy violation; the handshake fails with 403 and nothing is said
        # about whether the sandbox exists.
        await websocket.close(code=1008, reason=str(exc.detail)[:120])
        return
    if service.settings.approvals is not None:
        # The raw channel carries operations the server only reads, never holds: with
        # server-wide approval rules it would be the one path around them.  Accepted, then
        # closed, so that the client reads why (a refused handshake says only 403).
        await websocket.accept()
        await websocket.close(
            code=1008, reason="this server asks approval for every operation: use the HTTP API"
        )
        return
    if entry.channels >= MAX_CHANNELS:
        await websocket.close(code=1013, reason=f"at most {MAX_CHANNELS} channels per sandbox")
        return
    entry.channels += 1
    try:
        # An open agent channel holds the sandbox: the remote backend keeps one open for
        # its whole life, so a client that dies ends a session lease with it.
        with entry.lease.held():
            await _pump(websocket, entry)
    finally:
        entry.channels -= 1


async def _pump(websocket: WebSocket, entry: Entry) -> None:
    sandbox = entry.sandbox
    backend = sandbox.backend
    handle = handle_of(sandbox)
    try:
        stream = await anyio.to_thread.run_sync(backend.open_channel, handle)
    except AgentNestError as exc:
        await websocket.close(code=1011, reason=str(exc)[:120])
        return
    # The server's audit log records what the client does over the channel too.
    audit = ChannelAudit(emitter_of(sandbox), entry.token_id)
    garbage: list[str] = []

    def read_agent() -> bytes:
        data = stream.read(1 << 20)
        audit.from_agent(data)
        return data

    def write_agent(data: bytes) -> None:
        # Audited before it is forwarded: a command is recorded before it runs,
        # and bytes that are not the agent protocol never reach the agent.
        audit.from_client(data)
        stream.write(data)

    try:
        await websocket.accept()
        async with anyio.create_task_group() as tg:

            async def from_agent() -> None:
                try:
                    while True:
                        data = await anyio.to_thread.run_sync(read_agent, abandon_on_cancel=True)
                        if not data:
                            break
                        await websocket.send_bytes(data)
                except (OSError, WebSocketDisconnect, RuntimeError):
                    pass  # either side went away: closing below ends the other
                tg.cancel_scope.cancel()

            async def to_agent() -> None:
                try:
                    while True:
                        message = await websocket.receive()
                        if message["type"] == "websocket.disconnect":
                            break
                        data = message.get("bytes")
                        if data is None:
                            break  # text frames are not part of the protocol
                        await anyio.to_thread.run_sync(write_agent, data)
                except WireError as exc:
                    garbage.append(str(exc))
                except (OSError, WebSocketDisconnect, RuntimeError):
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(from_agent)
            tg.start_soon(to_agent)
    finally:
        with anyio.CancelScope(shield=True):
            # The agent sees end-of-file and kills every command it started.
            await anyio.to_thread.run_sync(stream.close)
            audit.close()
            if garbage:
                log.warning("sandbox %s: closed a channel that sent %s", sandbox.id, garbage[0])
                with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                    # 1007: the payload is not the agent protocol.
                    await websocket.close(code=1007, reason=f"not the agent protocol: {garbage[0]}"[:120])
            try:
                await websocket.close()
            except (RuntimeError, OSError, WebSocketDisconnect):
                pass  # already closed by the client
