"""Forwarding a request for a sandbox to the replica that runs it.

A sandbox lives in the process that started it (its agent channel, sessions and
lease are there).  With several replicas on one PostgreSQL database, a request
for a sandbox this replica does not run is looked up in the database (its open
row names the server, the server's heartbeat row its URL) and relayed there:
HTTP requests with their bodies streamed both ways (event streams included),
and the agent channel's websocket message by message.  The replica that runs
the sandbox authenticates the request itself, with the same token, so forwarding
widens no one's rights.  Before relaying, this replica only checks that the
credential is the sandbox's own token (the database row names it): anything else
is answered here as for an id that does not exist, so the relay is no existence
oracle (the E2B data plane excepted: see :meth:`Relay.owner`).

A request that was forwarded once is never forwarded again (the
``X-AgentNest-Forwarded-By`` header), so two replicas that disagree cannot
bounce it between them.  A replica that does not answer gives 503
``replica_unavailable``; once the leader has swept it (``--server-timeout``)
its sandboxes are ended and the answer is 404.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import AgentNestError
from .auth import AuthError
from .e2b.state import secret_of

if TYPE_CHECKING:
    from .service import Service

log = logging.getLogger("agentnest.server")

#: The header that marks a forwarded request (its value: the forwarding server's id).
FORWARDED = b"x-agentnest-forwarded-by"
#: Seconds a sandbox's owner, once found, is remembered (a sandbox never changes servers).
OWNER_TTL = 30.0
#: Seconds to connect to the other replica.
CONNECT_TIMEOUT = 5.0
_PATH = re.compile(r"^/v1/sandboxes/([^/]{1,64})(?:/|$)")
# The E2B face (agentnest.server.e2b): its control plane names the sandbox in the path,
# its data plane in a header.
_E2B_PATH = re.compile(r"^/(?:v2/)?sandboxes/([^/]{1,64})(?:/|$)")
_E2B_HEADER = b"e2b-sandbox-id"
#: What :meth:`Relay._caller` says of an E2B data-plane request (no API key to check here).
_DATA_PLANE = object()
# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the relay sets itself.
_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        FORWARDED,
    }
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _sandbox_of(scope: Scope) -> str | None:
    """The sandbox a request is for: a native or E2B path, or E2B's routing header."""
    path = str(scope.get("path", ""))
    match = _PATH.match(path) or _E2B_PATH.match(path)
    if match is not None:
        return match.group(1)
    for key, value in scope.get("headers", ()):
        if key == _E2B_HEADER:
            text = value.decode("latin-1")
            return text if 0 < len(text) <= 64 and "/" not in text else None
    return None


class Forward:
    """ASGI middleware: relay requests for sandboxes another replica runs (see the module)."""

    def __init__(self, app: Any, relay: Relay) -> None:
        self.app = app
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        relay = self.relay
        base = await relay.owner(scope) if scope["type"] in ("http", "websocket") else None
        if base is None:
            await self.app(scope, receive, send)
            return
        relay.forwarded += 1
        if scope["type"] == "http":
            await relay.http(scope, receive, send, base)
        else:
            await relay.websocket(scope, receive, send, base)


class Relay:
    """What :class:`Forward` needs: who runs a sandbox (cached), and the client to reach it."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._owners: dict[str, tuple[str, str | None, float]] = {}
        """Sandbox id: (its replica's URL, its token's id, until when this is trusted)."""
        self._client: Any = None
        self.forwarded = 0
        """Requests relayed to another replica."""

    async def owner(self, scope: Scope) -> str | None:
        """The base URL of the replica that runs the sandbox ``scope`` is for, if another does and
        the request's credential is the sandbox's own (see :meth:`_caller`)."""
        service = self.service
        recorder = service.recorder
        if service.shared is None or recorder is None:
            return None  # one server (or no shared database): nothing runs elsewhere
        sandbox_id = _sandbox_of(scope)
        if sandbox_id is None or sandbox_id in service.entries:
            return None
        if any(key == FORWARDED for key, _ in scope.get("headers", ())):
            return None
        known = self._owners.get(sandbox_id)
        now = time.monotonic()
        if known is None or known[2] <= now:
            try:
                found = await anyio.to_thread.run_sync(
                    recorder.database.owner_url, sandbox_id, recorder.server
                )
            except AgentNestError as exc:
                log.warning("looking up the server of sandbox %s: %s", sandbox_id, exc)
                return None  # answered here: 404, as without replicas
            if found is None:
                self._owners.pop(sandbox_id, None)
                return None
            if len(self._owners) > 10_000:
                self._owners.clear()  # bounded; it is only a cache
            known = self._owners[sandbox_id] = (found[0].rstrip("/"), found[1], now + OWNER_TTL)
        base, token_id, _ = known
        caller = self._caller(scope)
        # No existence oracle across replicas: a request whose credential is missing, wrong or
        # another token's is answered here, exactly as for an id that never existed (401 or 404),
        # never relayed (a relay would answer 503 while the other replica is down, or answer later).
        # The E2B data plane is the exception: only the owning replica knows the sandbox's access
        # token, so those requests are relayed and checked there (docs/e2b.md).
        if caller is not _DATA_PLANE and (caller is None or caller != token_id):
            return None
        return base

    def _caller(self, scope: Scope) -> object:
        """The id of the token the request's credential names (``None``: none, or not one of ours),
        or :data:`_DATA_PLANE` for an E2B data-plane request (authenticated by the sandbox's
        access token, which only the owning replica holds)."""
        path = str(scope.get("path", ""))
        native = _PATH.match(path) is not None
        e2b = not native and _E2B_PATH.match(path) is not None
        if not native and not e2b:
            return _DATA_PLANE
        headers = {key.lower(): value for key, value in scope.get("headers", ())}
        key = headers.get(b"x-api-key", b"").decode("latin-1").strip() if e2b else ""
        if not key:
            scheme, _, value = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            key = value.strip() if scheme.lower() == "bearer" else ""
        if not key:
            return None
        try:
            return self.service.settings.tokens.authenticate(secret_of(key) if e2b else key).id
        except AuthError:
            return None

    def _headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() not in _HOP]
        server = self.service.recorder.server if self.service.recorder is not None else "?"
        headers.append((FORWARDED, server.encode()))
        return headers

    @staticmethod
    def _target(scope: Scope, base: str) -> str:
        path = scope.get("raw_path") or str(scope["path"]).encode()
        query = scope.get("query_string") or b""
        return base + path.decode("latin-1") + (("?" + query.decode("latin-1")) if query else "")

    async def _unavailable(
        self, scope: Scope, receive: Receive, send: Send, base: str, exc: Exception
    ) -> None:
        from starlette.responses import JSONResponse

        log.warning("forwarding %s to %s: %s", scope.get("path"), base, exc)
        detail = (
            f"the server that runs this sandbox ({base}) did not answer ({type(exc).__name__}); retry later"
        )
        answer = JSONResponse(
            {"detail": detail, "code": "replica_unavailable"}, status_code=503, headers={"Retry-After": "5"}
        )
        await answer(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send, base: str) -> None:
        import httpx

        if self._client is None:
            # No read or write timeout: a command may run as long as its own timeout says, and
            # the replica that runs it enforces that.
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT, pool=CONNECT_TIMEOUT),
                follow_redirects=False,
            )

        async def body() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                if chunk:
                    yield chunk
                if not message.get("more_body"):
                    return

        request = self._client.build_request(
            scope["method"],
            self._target(scope, base),
            headers=self._headers(scope),
            content=body() if scope["method"] not in ("GET", "HEAD", "DELETE") else None,
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            self._owners.clear()
            await self._unavailable(scope, receive, send, base, exc)
            return
        try:
            headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.TransportError as exc:
            # Mid-answer: the status is sent; end the body (the client sees it cut short).
            log.warning("forwarding %s to %s: cut off: %s", scope.get("path"), base, exc)
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    async def websocket(self, scope: Scope, receive: Receive, send: Send, base: str) -> None:
        import websockets
        from websockets.asyncio.client import connect

        first = await receive()
        if first["type"] != "websocket.connect":
            return
        url = "ws" + self._target(scope, base).removeprefix("http")  # http -> ws, https -> wss
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._headers(scope)]
        headers = [(k, v) for k, v in headers if not k.lower().startswith("sec-websocket")]
        try:
            upstream = await asyncio.wait_for(
                connect(url, additional_headers=headers, max_size=None, open_timeout=None),
                CONNECT_TIMEOUT,
            )
        except websockets.InvalidStatus as exc:
            # Refused there (no such sandbox for this token, too many channels): refused here too.
            code = 1008 if exc.response.status_code in (401, 403, 404) else 1011
            await send(
                {"type": "websocket.close", "code": code, "reason": f"refused: {exc.response.status_code}"}
            )
            return
        except (OSError, TimeoutError, websockets.WebSocketException) as exc:
            self._owners.clear()
            log.warning("forwarding the channel of %s to %s: %s", scope.get("path"), base, exc)
            await send(
                {"type": "websocket.close", "code": 1013, "reason": "its server did not answer; retry"}
            )
            return
        await send({"type": "websocket.accept"})
        async with upstream, anyio.create_task_group() as tg:

            async def down() -> None:
                try:
                    async for message in upstream:
                        if isinstance(message, bytes):
                            await send({"type": "websocket.send", "bytes": message})
                        else:
                            await send({"type": "websocket.send", "text": message})
                except websockets.ConnectionClosed:
                    pass
                code = upstream.close_code or 1000
                reason = upstream.close_reason or ""
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": code, "reason": reason[:120]})
                tg.cancel_scope.cancel()

            async def up() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "websocket.disconnect":
                        break
                    data = message.get("bytes")
                    try:
                        await upstream.send(data if data is not None else message.get("text", ""))
                    except websockets.ConnectionClosed:
                        break
                await upstream.close()
                tg.cancel_scope.cancel()

            tg.start_soon(down)
            tg.start_soon(up)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
