"""The server's own routes: liveness, readiness, Prometheus metrics and ``/v1/info``.

Liveness and readiness need no token (probes and load balancers call them);
they tell nothing about sandboxes.  Metrics need an admin token: they name
every tenant.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

import anyio
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from ..._version import __version__
from ...errors import AgentNestError
from .. import schemas as s
from ..refused import Refused
from ..token_admin import ceiling_to_dict
from .deps import ERRORS, ServiceDep, TokenDep

#: Seconds a readiness probe waits for each backend.
READY_TIMEOUT = 5.0
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter(tags=["server"])


@router.get("/v1/health", response_model=s.HealthOut)
async def health() -> s.HealthOut:
    """Liveness (no token needed, tells nothing about sandboxes)."""
    return s.HealthOut(status="ok", version=__version__)


@router.get("/healthz", response_model=s.HealthOut)
async def healthz() -> s.HealthOut:
    """Liveness: the process serves (no token; the Kubernetes liveness probe)."""
    return s.HealthOut(status="ok", version=__version__)


@router.get("/readyz", response_model=s.ReadyOut, responses={503: {"model": s.ReadyOut}})
async def readyz(service: ServiceDep) -> Response:
    """Readiness: the token file reads, every backend answers now, and the database answers
    at the newest migration (no token; 503 naming what failed, so a load balancer sends no
    client here while it is not ready)."""
    checks: dict[str, str] = {}
    try:
        await anyio.to_thread.run_sync(service.settings.tokens.list)
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


@router.get(
    "/metrics",
    responses={**ERRORS, 200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
    response_class=Response,
)
async def metrics(service: ServiceDep, token: TokenDep) -> Response:
    """Prometheus metrics (an admin token: they name every tenant)."""
    if not token.admin:
        raise Refused(403, "policy_denied", "metrics need an admin token (they name every tenant)")
    if service.metrics is None:
        raise Refused(
            501, "missing_dependency", "metrics need prometheus_client: pip install 'agentnest[server]'"
        )
    return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)


@router.get("/v1/info", response_model=s.InfoOut, responses=ERRORS)
async def info(service: ServiceDep, token: TokenDep) -> s.InfoOut:
    """The server's backends and image, and this token's ceiling."""
    allowed = token.ceiling.backends or (service.default_backend,)
    settings = service.settings
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
        ceiling=ceiling_to_dict(token.ceiling),
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
