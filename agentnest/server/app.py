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

# No ``from __future__ import annotations``: FastAPI reads the route
# functions' annotations, some of them local to create_app, as objects.

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio

from ..errors import MissingDependencyError

try:
    import fastapi  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError("agentnest serve needs FastAPI: pip install 'agentnest[server]'") from exc
from fastapi import Depends, FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import model_validator
from starlette.exceptions import HTTPException

from .._version import __version__
from ..agent.wire import WireError
from ..aio import AsyncExecutionStream, AsyncPythonSession, AsyncSandbox
from ..config import ExecutionResult
from ..errors import (
    AdmissionRefusedError,
    AgentNestError,
    ConfigurationError,
    ExecutionTimeoutError,
    PolicyDeniedError,
)
from . import schemas as s
from .admission import Position
from .audit_routes import add_audit_routes
from .auth import AuthError, Token
from .channel_audit import ChannelAudit
from .entries import Entry, Lease
from .forward import Forward, Relay
from .refused import Refused, TooLarge
from .service import MAX_CHANNELS, MAX_SESSIONS, Service, emitter_of, handle_of
from .settings import DEFAULT_MAX_BODY, DEFAULT_MAX_UPLOAD, ServerSettings
from .tenant_routes import add_tenant_routes
from .tracing import TracingMiddleware, fastapi_options

log = logging.getLogger("agentnest.server")
#: Seconds a readiness probe waits for each backend.
READY_TIMEOUT = 5.0
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_WWW_AUTHENTICATE = 'Bearer realm="agentnest"'
_INVALID_TOKEN = _WWW_AUTHENTICATE + ', error="invalid_token"'


def _exec_out(result: ExecutionResult) -> s.ExecOut:
    return s.ExecOut(
        stdout=result.stdout,
        stderr=result.stderr,
        exit_code=result.exit_code,
        ok=result.ok,
        duration=round(result.duration, 6),
        timed_out=result.timed_out,
        truncated=result.truncated,
        signal=getattr(result, "signal", None),
    )


class ExecRequest(s.ExecIn):
    @model_validator(mode="after")
    def _one_command(self) -> "ExecRequest":
        given = [n for n in ("argv", "shell", "python") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of argv, shell or python")
        return self


async def _run_command(sandbox: AsyncSandbox, argv: list[str] | None, body: s.ExecIn) -> ExecutionResult:
    if argv is not None:
        return await sandbox.exec(argv, timeout=body.timeout, env=body.env, cwd=body.cwd, input=body.stdin)
    assert body.python is not None
    return await sandbox.exec_python(
        body.python, timeout=body.timeout, env=body.env, cwd=body.cwd, input=body.stdin
    )


def _command_argv(body: s.ExecIn) -> list[str] | None:
    if body.argv is not None:
        return list(body.argv)
    if body.shell is not None:
        return ["/bin/sh", "-c", body.shell]
    return None


def _error_response(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status, headers=dict(headers or {}))


class BodyLimit:
    """ASGI middleware: refuse request bodies over the limit with 413.

    A declared ``Content-Length`` over it is refused before anything is read;
    a chunked body is counted as it arrives and cut off at the limit.  Bodies
    of uploads (``PUT .../files/...``, ``POST .../restore``) have the larger
    upload limit; everything else is JSON and has the smaller one.
    """

    def __init__(self, app: Any, limit: int, upload_limit: int) -> None:
        self.app = app
        self.limit = limit
        self.upload_limit = upload_limit

    def _limit_for(self, scope: Mapping[str, Any]) -> int:
        path = str(scope.get("path", ""))
        method = scope.get("method")
        if (
            (method == "PUT" and "/files/" in path)
            or (method == "POST" and path.endswith("/restore"))
            or (method == "POST" and path == "/files")  # the E2B face's uploads
        ):
            return self.upload_limit
        return self.limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit_for(scope)
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                if not value.isdigit():
                    response = _error_response(400, "invalid", "Content-Length is not a number")
                    await response(scope, receive, send)
                    return
                if int(value) > limit:
                    await _error_response(413, "too_large", TooLarge(limit).detail)(scope, receive, send)
                    return
        received = 0

        async def limited() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise TooLarge(limit)
            return message

        await self.app(scope, limited, send)


class _Wrap:
    """ASGI middleware from a function that wraps an application."""

    def __init__(self, app: Any, wrap: Any) -> None:
        self._app = wrap(app)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


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
    app.state.service = service
    if e2b is not None:
        # Inside the body limit (E2B uploads get the upload limit), outside the routes.
        app.add_middleware(_Wrap, wrap=e2b.wrap)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, upload_limit=settings.max_upload_bytes)
    # Before the body limit and the routes: a request for a sandbox another replica runs goes
    # there whole (that replica applies its own limits and checks the token).
    relay = Relay(service)
    app.add_middleware(Forward, relay=relay)
    if service.tracing.enabled:
        # Outermost: a request refused by the body limit is traced too.
        app.add_middleware(TracingMiddleware, tracing=service.tracing)

    # -- errors ------------------------------------------------------------------

    @app.exception_handler(AgentNestError)
    async def agentnest_error(request: Request, exc: AgentNestError) -> JSONResponse:
        code = s.error_code(exc)
        status = s.ERROR_CODES[code][0]
        if status >= 500:
            log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        headers = None
        if isinstance(exc, AdmissionRefusedError) and exc.retry_after is not None:
            headers = {"Retry-After": str(max(1, round(exc.retry_after)))}
        return _error_response(status, code, str(exc), headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = (
            exc.code
            if isinstance(exc, Refused)
            else {404: "not_found", 405: "invalid"}.get(exc.status_code, "invalid")
        )
        if exc.status_code in (204, 304):
            return Response(status_code=exc.status_code, headers=exc.headers)
        return _error_response(exc.status_code, code, str(exc.detail), exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Never a traceback to the client; the log has it.
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error_response(500, "error", "internal server error (the server log has the details)")

    # -- auth --------------------------------------------------------------------

    bearer = HTTPBearer(auto_error=False, description="a token from `agentnest serve token create`")

    def authenticate(header_value: str | None) -> Token:
        if not header_value:
            raise Refused(
                401,
                "unauthorized",
                "missing bearer token: send 'Authorization: Bearer <token>'",
                {"WWW-Authenticate": _WWW_AUTHENTICATE},
            )
        try:
            return settings.tokens.authenticate(header_value)
        except AuthError as exc:
            raise Refused(
                401,
                "unauthorized",
                str(exc),
                {"WWW-Authenticate": f'{_INVALID_TOKEN}, error_description="{exc}"'},
            ) from None

    async def current_token(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Token:
        token = authenticate(credentials.credentials if credentials is not None else None)
        service.tracing.annotate(tenant=token.tenant, token=token.id)  # the id, never the secret
        return token

    TokenDep = Annotated[Token, Depends(current_token)]
    SandboxId = Annotated[str, PathParam(min_length=1, max_length=64)]
    errors: dict[int | str, dict[str, Any]] = {
        code: {"model": s.ErrorOut} for code in (400, 401, 403, 404, 409, 410, 413, 429)
    }

    async def owned(token: Token, sandbox_id: str) -> Entry:
        entry = service.get(token, sandbox_id)
        if entry.deadline <= time.time():
            await service.destroy(entry)
            raise Refused(404, "not_found", f"no sandbox {sandbox_id!r:.80} for this token")
        entry.lease.touch()  # every call on a sandbox is use: it renews an idle lease
        return entry

    # -- routes: server ------------------------------------------------------------

    @app.get("/v1/health", response_model=s.HealthOut, tags=["server"])
    async def health() -> s.HealthOut:
        """Liveness (no token needed, tells nothing about sandboxes)."""
        return s.HealthOut(status="ok", version=__version__)

    @app.get("/healthz", response_model=s.HealthOut, tags=["server"])
    async def healthz() -> s.HealthOut:
        """Liveness: the process serves (no token; the Kubernetes liveness probe)."""
        return s.HealthOut(status="ok", version=__version__)

    @app.get("/readyz", response_model=s.ReadyOut, responses={503: {"model": s.ReadyOut}}, tags=["server"])
    async def readyz() -> Response:
        """Readiness: the token file reads, every backend answers now, and the database answers
        at the newest migration (no token; 503 naming what failed, so a load balancer sends no
        client here while it is not ready)."""
        checks: dict[str, str] = {}
        try:
            await anyio.to_thread.run_sync(settings.tokens.list)
            checks["tokens"] = "ok"
        except AgentNestError as exc:
            checks["tokens"] = str(exc)[:300]
        for name, backend in service.backends.items():
            try:
                with anyio.fail_after(READY_TIMEOUT):
                    # abandon_on_cancel: an engine that hangs must not hang the probe.
                    await anyio.to_thread.run_sync(backend.ping, abandon_on_cancel=True)
                checks[f"backend:{name}"] = "ok"
            except TimeoutError:
                checks[f"backend:{name}"] = f"did not answer within {READY_TIMEOUT:g}s"
            except AgentNestError as exc:
                checks[f"backend:{name}"] = str(exc)[:300]
        if service.recorder is not None:
            try:
                await service.recorder.ping()
                checks["database"] = "ok"
            except AgentNestError as exc:
                checks["database"] = str(exc)[:300]
        ready = all(v == "ok" for v in checks.values()) and not service.closed
        body = s.ReadyOut(status="ready" if ready else "not ready", checks=checks)
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    @app.get(
        "/metrics",
        responses={**errors, 200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
        response_class=Response,
        tags=["server"],
    )
    async def metrics(token: TokenDep) -> Response:
        """Prometheus metrics (an admin token: they name every tenant)."""
        if not token.admin:
            raise Refused(403, "policy_denied", "metrics need an admin token (they name every tenant)")
        if service.metrics is None:
            raise Refused(
                501, "missing_dependency", "metrics need prometheus_client: pip install 'agentnest[server]'"
            )
        return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/info", response_model=s.InfoOut, responses=errors, tags=["server"])
    async def info(token: TokenDep) -> s.InfoOut:
        """The server's backends and image, and this token's ceiling."""
        allowed = token.ceiling.backends or (service.default_backend,)
        return s.InfoOut(
            version=__version__,
            token_id=token.id,
            token_name=token.name,
            default_image=service.image,
            backends=[
                s.BackendOut(
                    name=name,
                    oci_runtime=backend.oci_runtime,
                    capabilities=sorted(c.value for c in backend.capabilities()),
                    default=name == service.default_backend,
                )
                for name, backend in service.backends.items()
                if name in allowed
            ],
            ceiling=token.ceiling.to_dict(),
            max_body_bytes=settings.max_body_bytes,
            max_upload_bytes=settings.max_upload_bytes,
            tenant=token.tenant,
            pools=[
                s.PoolOut(
                    name=name,
                    image=pool.image,
                    backend=pool.backend_name,
                    memory=pool.spec.memory,
                    cpus=pool.spec.cpus,
                    pids=pool.spec.pids,
                    ready=len(pool.ready),
                    max=pool.spec.max,
                    when_drained=pool.spec.when_drained,
                )
                for name, pool in sorted(service.pools.items())
            ],
        )

    add_tenant_routes(app, service, TokenDep, errors)
    add_audit_routes(app, service, TokenDep, errors)

    # -- routes: sandboxes -----------------------------------------------------------

    @app.post(
        "/v1/sandboxes", status_code=201, response_model=s.SandboxOut, responses=errors, tags=["sandboxes"]
    )
    async def create_sandbox(token: TokenDep, body: s.CreateSandbox, request: Request) -> Any:
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

    @app.get("/v1/sandboxes", response_model=s.SandboxList, responses=errors, tags=["sandboxes"])
    async def list_sandboxes(token: TokenDep) -> s.SandboxList:
        """This token's live sandboxes."""
        await service.reap()
        mine = sorted(
            (e for e in service.entries.values() if e.token_id == token.id), key=lambda e: e.created
        )
        described = [await service.describe(e) for e in mine]
        return s.SandboxList(
            sandboxes=described,
            max_sandboxes=token.ceiling.max_sandboxes,
            available=max(0, token.ceiling.max_sandboxes - service.count(token.id)),
        )

    @app.get("/v1/sandboxes/{sandbox_id}", response_model=s.SandboxOut, responses=errors, tags=["sandboxes"])
    async def get_sandbox(token: TokenDep, sandbox_id: SandboxId) -> s.SandboxOut:
        """One sandbox of this token."""
        return await service.describe(await owned(token, sandbox_id))

    @app.delete("/v1/sandboxes/{sandbox_id}", response_model=s.Deleted, responses=errors, tags=["sandboxes"])
    async def delete_sandbox(token: TokenDep, sandbox_id: SandboxId) -> s.Deleted:
        """Destroy a sandbox and everything in it."""
        entry = service.get(token, sandbox_id)
        await service.destroy(entry)
        return s.Deleted(id=sandbox_id, destroyed=True)

    @app.post(
        "/v1/sandboxes/{sandbox_id}/extend", response_model=s.ExtendOut, responses=errors, tags=["sandboxes"]
    )
    async def extend(token: TokenDep, sandbox_id: SandboxId, body: s.ExtendIn) -> s.ExtendOut:
        """Move the deadline later (the whole lifetime stays within the token's max_timeout)."""
        entry = await owned(token, sandbox_id)
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

    @app.get(
        "/v1/sandboxes/{sandbox_id}/logs", response_model=s.LogsOut, responses=errors, tags=["sandboxes"]
    )
    async def logs(
        token: TokenDep, sandbox_id: SandboxId, tail: Annotated[int, Query(ge=1, le=10000)] = 200
    ) -> s.LogsOut:
        """The sandbox's own diagnostics (redacted)."""
        entry = await owned(token, sandbox_id)
        return s.LogsOut(logs=await entry.sandbox.logs(tail))

    @app.get(
        "/v1/sandboxes/{sandbox_id}/network-log",
        response_model=s.NetworkLogOut,
        responses=errors,
        tags=["sandboxes"],
    )
    async def network_log(token: TokenDep, sandbox_id: SandboxId) -> s.NetworkLogOut:
        """Every connection an allowlist sandbox tried through its egress proxy (redacted)."""
        entry = await owned(token, sandbox_id)
        return s.NetworkLogOut(events=await entry.sandbox.network_log())

    @app.post(
        "/v1/sandboxes/{sandbox_id}/keepalive",
        response_model=s.LeaseOut,
        responses=errors,
        tags=["sandboxes"],
    )
    async def keepalive(token: TokenDep, sandbox_id: SandboxId) -> s.LeaseOut:
        """Renew the sandbox's idle lease (any call on it does too); returns the lease."""
        entry = await owned(token, sandbox_id)
        return entry.lease.out(settings.session_grace)

    @app.get(
        "/v1/sandboxes/{sandbox_id}/lease",
        responses={
            **errors,
            200: {"content": {"text/event-stream": {}}, "description": "server-sent events"},
        },
        response_class=StreamingResponse,
        tags=["sandboxes"],
    )
    async def hold_lease(token: TokenDep, sandbox_id: SandboxId) -> StreamingResponse:
        """Hold the sandbox while this stream is open (a ``session`` lease ends when none is).

        Sends ``lease`` (the lease) at once and a comment line every
        ``LEASE_HEARTBEAT`` seconds, and ``ended`` when the sandbox is gone.
        """
        entry = await owned(token, sandbox_id)
        return StreamingResponse(
            _hold(service, entry), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    @app.post(
        "/v1/sandboxes/{sandbox_id}/fork",
        status_code=201,
        response_model=s.SandboxOut,
        responses=errors,
        tags=["sandboxes"],
    )
    async def fork(token: TokenDep, sandbox_id: SandboxId, body: s.ForkIn | None = None) -> s.SandboxOut:
        """Branch a sandbox into a new one of this token (counts against max_sandboxes)."""
        entry = await owned(token, sandbox_id)
        new = await service.fork(token, entry, body.timeout if body is not None else None)
        return await service.describe(new, fresh=True)

    # -- routes: commands ---------------------------------------------------------------

    @app.post(
        "/v1/sandboxes/{sandbox_id}/exec", response_model=s.ExecOut, responses=errors, tags=["commands"]
    )
    async def exec_command(token: TokenDep, sandbox_id: SandboxId, body: ExecRequest) -> s.ExecOut:
        """Run a command and wait for it.  A timeout is an outcome (``timed_out``), not an error."""
        entry = await owned(token, sandbox_id)
        sandbox = entry.sandbox
        argv = _command_argv(body)
        try:
            with entry.lease.held():  # a running command is use: an idle lease does not lapse under it
                result = await _run_command(sandbox, argv, body)
        except ExecutionTimeoutError as exc:
            if not isinstance(exc.result, ExecutionResult):
                raise
            result = exc.result
        return _exec_out(result)

    @app.post(
        "/v1/sandboxes/{sandbox_id}/exec/stream",
        responses={
            **errors,
            200: {"content": {"text/event-stream": {}}, "description": "server-sent events"},
        },
        response_class=StreamingResponse,
        tags=["commands"],
    )
    async def exec_stream(token: TokenDep, sandbox_id: SandboxId, body: ExecRequest) -> StreamingResponse:
        """Run a command and stream its output as server-sent events.

        Events: ``stdout`` and ``stderr`` (``{"data": text}``) as output
        arrives, then one ``exit`` (the same object as ``/exec`` returns) or
        ``error`` (``{"detail", "code"}``).  A client that disconnects kills
        the command's process tree.
        """
        entry = await owned(token, sandbox_id)
        sandbox = entry.sandbox
        argv = _command_argv(body)
        if argv is not None:
            stream = sandbox.stream_exec(
                argv, timeout=body.timeout, env=body.env, cwd=body.cwd, input=body.stdin
            )
        else:
            if body.stdin is not None:
                raise ConfigurationError("stdin cannot be given with python for a stream; use argv")
            assert body.python is not None
            stream = sandbox.stream_python(body.python, timeout=body.timeout, env=body.env, cwd=body.cwd)
        # Started here, so that a refused command is an HTTP error, not an event.
        await stream.__aenter__()
        return StreamingResponse(
            _sse(stream, entry.lease), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    # -- routes: sessions ------------------------------------------------------------------

    @app.post(
        "/v1/sandboxes/{sandbox_id}/sessions",
        status_code=201,
        response_model=s.SessionOut,
        responses=errors,
        tags=["sessions"],
    )
    async def open_session(token: TokenDep, sandbox_id: SandboxId) -> s.SessionOut:
        """Start a persistent Python interpreter."""
        entry = await owned(token, sandbox_id)
        if len(entry.sessions) >= MAX_SESSIONS:
            raise Refused(429, "quota", f"a sandbox has at most {MAX_SESSIONS} sessions; close one first")
        session = await entry.sandbox.python_session()
        entry.sessions[session.id] = session
        return s.SessionOut(id=session.id)

    def session_of(entry: Entry, session_id: str) -> AsyncPythonSession:
        session = entry.sessions.get(session_id)
        if session is None:
            raise Refused(404, "not_found", f"no session {session_id!r:.80} in this sandbox")
        return session

    @app.post(
        "/v1/sandboxes/{sandbox_id}/sessions/{session_id}/run",
        response_model=s.SessionRunOut,
        responses=errors,
        tags=["sessions"],
    )
    async def run_session(
        token: TokenDep, sandbox_id: SandboxId, session_id: SandboxId, body: s.SessionRunIn
    ) -> s.SessionRunOut:
        """Run code in the session; the trailing expression's repr is ``result``."""
        entry = await owned(token, sandbox_id)
        session = session_of(entry, session_id)
        try:
            with entry.lease.held():
                result = await session.run(body.code, timeout=body.timeout)
        except ExecutionTimeoutError as exc:
            if exc.result is None or isinstance(exc.result, ExecutionResult):
                raise
            result = exc.result
        return s.SessionRunOut(
            ok=result.ok, stdout=result.stdout, stderr=result.stderr, error=result.error, result=result.result
        )

    @app.delete(
        "/v1/sandboxes/{sandbox_id}/sessions/{session_id}",
        response_model=s.Deleted,
        responses=errors,
        tags=["sessions"],
    )
    async def close_session(token: TokenDep, sandbox_id: SandboxId, session_id: SandboxId) -> s.Deleted:
        """Stop the session's interpreter."""
        entry = await owned(token, sandbox_id)
        session = session_of(entry, session_id)
        del entry.sessions[session_id]
        await session.close()
        return s.Deleted(id=session_id, destroyed=True)

    # -- routes: files ------------------------------------------------------------------------

    @app.get("/v1/sandboxes/{sandbox_id}/files", response_model=s.FileList, responses=errors, tags=["files"])
    async def list_files(
        token: TokenDep,
        sandbox_id: SandboxId,
        path: Annotated[str, Query(min_length=1, max_length=4096)] = ".",
        recursive: bool = False,
    ) -> s.FileList:
        """List a workspace directory (links are listed, never followed; at most 10000 entries)."""
        entry = await owned(token, sandbox_id)
        infos = await entry.sandbox.list_files(path, recursive=recursive)
        return s.FileList(
            entries=[
                s.FileEntry(path=i.path, type=i.type, size=i.size, mode=i.mode, mtime=i.mtime) for i in infos
            ]
        )

    FilePath = Annotated[str, PathParam(min_length=1, max_length=4096)]

    @app.get(
        "/v1/sandboxes/{sandbox_id}/files/{path:path}",
        responses={**errors, 200: {"content": {"application/octet-stream": {}}, "description": "the bytes"}},
        response_class=Response,
        tags=["files"],
    )
    async def read_file(token: TokenDep, sandbox_id: SandboxId, path: FilePath) -> Response:
        """A workspace file's bytes, as they are (up to the policy's max_file_bytes)."""
        entry = await owned(token, sandbox_id)
        data = await entry.sandbox.read_file(path, encoding=None)
        return Response(bytes(data), media_type="application/octet-stream")

    @app.put(
        "/v1/sandboxes/{sandbox_id}/files/{path:path}",
        status_code=204,
        responses=errors,
        tags=["files"],
        response_class=Response,
        openapi_extra={
            "requestBody": {
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
            }
        },
    )
    async def write_file(
        token: TokenDep, sandbox_id: SandboxId, path: FilePath, request: Request
    ) -> Response:
        """Write the request body to a workspace file (parents created, atomically replaced)."""
        entry = await owned(token, sandbox_id)
        data = await request.body()
        await entry.sandbox.write_file(path, data)
        return Response(status_code=204)

    @app.delete(
        "/v1/sandboxes/{sandbox_id}/files/{path:path}",
        status_code=204,
        responses=errors,
        tags=["files"],
        response_class=Response,
    )
    async def remove_file(
        token: TokenDep, sandbox_id: SandboxId, path: FilePath, recursive: bool = False
    ) -> Response:
        """Remove a workspace file (a directory tree with ``recursive=true``)."""
        entry = await owned(token, sandbox_id)
        await entry.sandbox.remove_file(path, recursive=recursive)
        return Response(status_code=204)

    # -- routes: snapshots -----------------------------------------------------------------------

    @app.get(
        "/v1/sandboxes/{sandbox_id}/snapshot",
        responses={**errors, 200: {"content": {"application/x-tar": {}}, "description": "the snapshot tar"}},
        response_class=StreamingResponse,
        tags=["snapshots"],
    )
    async def snapshot(token: TokenDep, sandbox_id: SandboxId, compress: bool = False) -> StreamingResponse:
        """The workspace as a snapshot tar (gzip with ``compress=true``), streamed.

        Staged in the server's private directory and removed once sent: a
        client never names a path on the server.
        """
        entry = await owned(token, sandbox_id)
        target = service.work_dir / f"snapshot-{uuid.uuid4().hex}.tar"
        try:
            meta = await entry.sandbox.snapshot(target, compress=compress)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return StreamingResponse(
            _file_chunks(target),
            media_type="application/gzip" if compress else "application/x-tar",
            headers={"X-AgentNest-SHA256": meta.sha256, "Content-Length": str(meta.size)},
        )

    @app.post(
        "/v1/sandboxes/{sandbox_id}/restore",
        response_model=s.RestoreOut,
        responses=errors,
        tags=["snapshots"],
        openapi_extra={
            "requestBody": {
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
            }
        },
    )
    async def restore(token: TokenDep, sandbox_id: SandboxId, request: Request) -> s.RestoreOut:
        """Replace the workspace with the snapshot tar in the body (checked member by member)."""
        entry = await owned(token, sandbox_id)
        target = service.work_dir / f"restore-{uuid.uuid4().hex}.tar"
        try:
            async with await anyio.open_file(target, "wb") as out:
                async for chunk in request.stream():
                    await out.write(chunk)
            meta = await entry.sandbox.restore(target)
        finally:
            target.unlink(missing_ok=True)
        return s.RestoreOut(image=meta.image or None, files=meta.files, size=meta.size, sha256=meta.sha256)

    # -- the raw agent channel (the remote backend) ----------------------------------------------

    @app.websocket("/v1/sandboxes/{sandbox_id}/channel")
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
        header = websocket.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        try:
            if scheme.lower() != "bearer":
                raise Refused(401, "unauthorized", "missing bearer token")
            token = authenticate(credential.strip())
            entry = await owned(token, sandbox_id)
        except Refused as exc:
            # Policy violation; the handshake fails with 403 and nothing is said
            # about whether the sandbox exists.
            await websocket.close(code=1008, reason=str(exc.detail)[:120])
            return
        if settings.approvals is not None:
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

    return app


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


async def _sse(stream: AsyncExecutionStream, lease: Lease) -> AsyncIterator[bytes]:
    with lease.held():  # an open command stream holds the sandbox (session and idle leases)
        async for chunk in _sse_events(stream):
            yield chunk


async def _sse_events(stream: AsyncExecutionStream) -> AsyncIterator[bytes]:
    event = _event
    try:
        try:
            async for chunk in stream:
                if chunk.stream != "status":  # the exit event below says it, with the whole result
                    yield event(chunk.stream, {"data": chunk.data})
            assert stream.result is not None
            yield event("exit", _exec_out(stream.result).model_dump())
        except ExecutionTimeoutError as exc:
            if isinstance(exc.result, ExecutionResult):
                yield event("exit", _exec_out(exc.result).model_dump())
            else:
                yield event("error", {"detail": str(exc), "code": s.error_code(exc)})
        except AgentNestError as exc:
            yield event("error", {"detail": str(exc), "code": s.error_code(exc)})
    finally:
        # Also on cancellation (the client went away): kill the command's tree.
        with anyio.CancelScope(shield=True):
            await stream.aclose()


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
            yield _event("queued", getter.result().to_dict())
        try:
            entry = task.result()
        except AdmissionRefusedError as exc:
            yield _event(
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
            yield _event("error", {"detail": str(exc), "code": code, "status": s.ERROR_CODES[code][0]})
            return
        except Refused as exc:
            yield _event("error", {"detail": str(exc.detail), "code": exc.code, "status": exc.status_code})
            return
        yield _event("created", (await service.describe(entry, fresh=True)).model_dump())
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, AgentNestError, Refused):
                await task


#: Seconds between the comment lines of a held lease stream (they keep proxies from closing it).
LEASE_HEARTBEAT = 10.0


async def _hold(service: Service, entry: Entry) -> AsyncIterator[bytes]:
    with entry.lease.held():
        yield _event("lease", entry.lease.out(service.settings.session_grace).model_dump())
        while service.entries.get(entry.sandbox.id) is entry:
            with anyio.move_on_after(LEASE_HEARTBEAT):
                await entry.gone.wait()
            if entry.gone.is_set():
                break
            yield b": held\n\n"
        yield _event("ended", {"id": entry.sandbox.id})


def _event(name: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def _file_chunks(path: Path, chunk: int = 1 << 20) -> AsyncIterator[bytes]:
    try:
        async with await anyio.open_file(path, "rb") as f:
            while True:
                data = await f.read(chunk)
                if not data:
                    break
                yield data
    finally:
        path.unlink(missing_ok=True)


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
