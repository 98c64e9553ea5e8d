"""``agentnest serve``: the authenticated HTTP API (FastAPI) over the public sandbox API.

Every sandbox belongs to the token that created it.  Another token gets 404
for it, exactly as for an id that never existed, so ids do not leak between
tokens.  Each request's policy is built from the client's ask checked against
the token's :class:`~agentnest.server.auth.Ceiling`: asking for more is
refused with 403 and a message naming the limit, never silently clamped.  The
ceiling is also made the sandbox's :class:`~agentnest.SecurityPolicy`, so the
guard refuses a later fork or extension past it too.

Sandboxes are :class:`~agentnest.AsyncSandbox` objects: the guard does policy,
redaction and events; a command whose HTTP client goes away mid-stream is
cancelled, which kills its process tree.  ``/v1/sandboxes/{id}/channel`` (a
websocket) carries the raw agent protocol to a sandbox the token owns: that is
what the ``remote`` backend (:mod:`agentnest.runtime.remote`) speaks, so the
whole ``Sandbox`` API works through it.  docs/server.md explains the trust
boundary.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from ..errors import MissingDependencyError

try:
    import fastapi  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError("agentnest serve needs FastAPI: pip install 'agentnest[server]'") from exc
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from .._version import __version__
from ..errors import AdmissionRefusedError, AgentNestError
from . import schemas as s
from .disconnect import CancelOnDisconnect
from .forward import Forward, Relay
from .inputs import json_safe
from .middleware import BodyLimit, JsonBodies, Wrap, error_response
from .refused import Refused
from .routes import audit, channel, exec, files, health, sandboxes, sessions, tenants
from .service import Service
from .settings import DEFAULT_MAX_BODY, DEFAULT_MAX_UPLOAD, ServerSettings
from .tracing import TracingMiddleware, fastapi_options

log = logging.getLogger("agentnest.server")
#: The routers, in the order a path is matched.
_ROUTERS = (
    health.router,
    tenants.router,
    audit.router,
    sandboxes.router,
    exec.router,
    sessions.router,
    files.router,
    channel.router,
)


def _e2b_face(service: Service, settings: ServerSettings) -> Any:
    """The E2B face (:mod:`agentnest.server.e2b`), or None where its library cannot be had."""
    try:
        from .e2b.face import E2BFace
    except ImportError as exc:  # connectrpc needs Python 3.11; the native API serves on
        log.warning("the E2B API is off: %s (pip install 'agentnest[server]' on Python 3.11 or later)", exc)
        return None
    return E2BFace(service, settings)


def create_app(settings: ServerSettings) -> FastAPI:
    """The FastAPI application of ``agentnest serve``.

    Example::

        store = TokenStore("tokens.json")
        app = create_app(ServerSettings(tokens=store, backends={"docker": "docker"}))
        uvicorn.run(app, host="127.0.0.1", port=8700)
    """
    service = Service(settings)
    try:
        from .metrics import ServerMetrics

        service.metrics = ServerMetrics(service)
    except MissingDependencyError:
        log.warning("prometheus_client is not installed: /metrics answers 501")

    e2b = _e2b_face(service, settings) if settings.e2b else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:

            async def reaper() -> None:
                next_verify = time.monotonic() + settings.verify_interval
                while True:
                    await anyio.sleep(settings.reap_interval)
                    try:
                        await service.reap()
                        if time.monotonic() >= next_verify:
                            next_verify = time.monotonic() + settings.verify_interval
                            await service.verify()
                    except Exception:  # a failed sweep must not end the sweeps
                        log.exception("reaping expired sandboxes")

            async def pools() -> None:
                try:
                    await service.run_pools()
                except AgentNestError as exc:  # e.g. the engine is down at start: say so, serve on
                    log.error("warm pools stopped: %s", exc)

            # The database first (bounded: its connect timeout), so the first create finds it
            # migrated; if it is down the server serves on and keeps trying (/readyz says why).
            opened = await service.open_database()
            tg.start_soon(service.run_database, opened)
            tg.start_soon(reaper)
            tg.start_soon(pools)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await relay.close()
                    if e2b is not None:
                        await e2b.close()
                    await service.close()

    app = FastAPI(
        title="AgentNest",
        version=__version__,
        description=(
            "Disposable, policy-controlled sandboxes over HTTP.  Every call but /v1/health needs "
            "`Authorization: Bearer <token>`; a token's ceiling bounds what it may ask for.  "
            "The websocket /v1/sandboxes/{id}/channel (not listed here) carries the raw agent "
            "protocol for the `remote` backend; see docs/server.md."
        ),
        lifespan=lifespan,
        **fastapi_options(),
    )
    app.state.service = service  # the routes' service (routes/deps.py)
    if e2b is not None:
        # Inside the body limit (E2B uploads get the upload limit), outside the routes.
        app.add_middleware(Wrap, wrap=e2b.wrap)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, upload_limit=settings.max_upload_bytes)
    # Before the body limit and the routes: a request for a sandbox another replica runs goes
    # there whole (that replica applies its own limits and checks the token).
    relay = Relay(service)
    app.add_middleware(Forward, relay=relay)
    if service.tracing.enabled:
        # Outermost: a request refused by the body limit is traced too.
        app.add_middleware(TracingMiddleware, tracing=service.tracing)
    # Outermost of all: a request whose client goes away is cancelled, wherever it is
    # (a command, a queued create, an upload, a relay to another replica).
    app.add_middleware(CancelOnDisconnect)
    app.exception_handler(AgentNestError)(_agentnest_error)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(HTTPException)(_http_error)
    app.exception_handler(Exception)(_unexpected)
    for router in _ROUTERS:
        app.include_router(router)
    return app


async def _agentnest_error(request: Request, exc: AgentNestError) -> JSONResponse:
    code = s.error_code(exc)
    status = s.ERROR_CODES[code][0]
    if status >= 500:
        log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    headers = None
    if isinstance(exc, AdmissionRefusedError) and exc.retry_after is not None:
        headers = {"Retry-After": str(max(1, round(exc.retry_after)))}
    return error_response(status, code, str(exc), headers)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's own 422 shape, but renderable: its default handler raises on a NaN or an
    # infinity it quotes back ('{"timeout": NaN}'), a 500 and a traceback for a client's typo.
    return JSONResponse({"detail": json_safe(jsonable_encoder(exc.errors()))}, status_code=422)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    code = (
        exc.code
        if isinstance(exc, Refused)
        else {404: "not_found", 405: "invalid"}.get(exc.status_code, "invalid")
    )
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=exc.headers)
    return error_response(exc.status_code, code, str(exc.detail), exc.headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Never a traceback to the client; the log has it.
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, "error", "internal server error (the server log has the details)")


def openapi_document(app: FastAPI) -> str:
    """The OpenAPI document as published in docs/openapi.json (stable key order, newline at the end)."""
    return json.dumps(app.openapi(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_MAX_UPLOAD",
    "BodyLimit",
    "ServerSettings",
    "Service",
    "create_app",
    "openapi_document",
]
