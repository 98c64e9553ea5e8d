"""``/v1/tenants``: tenants over HTTP.  Admin tokens manage every tenant; any token reads its own.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam

from ...errors import ConfigurationError
from .. import schemas as s
from ..auth import Token
from ..refused import Refused
from ..service import Service
from ..tenants import Tenant, check_tenant_name
from .deps import ERRORS, ServiceDep, TokenDep

TenantName = Annotated[str, PathParam(min_length=1, max_length=40)]

router = APIRouter(tags=["tenants"], responses=ERRORS)


@router.get("/v1/tenants", response_model=s.TenantList)
async def list_tenants(service: ServiceDep, token: TokenDep) -> s.TenantList:
    """Every tenant (admin), or the caller's own."""
    tenants = service.settings.tokens.tenants() if token.admin else [service.tenant_of(token)]
    return s.TenantList(tenants=[describe_tenant(service, t) for t in tenants])


@router.get("/v1/tenants/{name}", response_model=s.TenantOut)
async def get_tenant(service: ServiceDep, token: TokenDep, name: TenantName) -> s.TenantOut:
    """One tenant: its settings, what it holds and what it has queued."""
    if not token.admin and name != token.tenant:
        raise Refused(404, "not_found", f"no tenant {name!r:.80} for this token")
    return describe_tenant(service, _known(service, name))


@router.post("/v1/tenants", status_code=201, response_model=s.TenantOut)
async def create_tenant(service: ServiceDep, token: TokenDep, body: s.TenantIn) -> s.TenantOut:
    """A new tenant (admin)."""
    _admin(token)
    tenant = service.settings.tokens.create_tenant(Tenant.from_dict({"name": body.name, **body.changes()}))
    return describe_tenant(service, tenant)


@router.patch("/v1/tenants/{name}", response_model=s.TenantOut)
async def update_tenant(
    service: ServiceDep, token: TokenDep, name: TenantName, body: s.TenantUpdate
) -> s.TenantOut:
    """Change a tenant's settings (admin); queued requests see the change at once."""
    _admin(token)
    if body.name is not None and body.name != name:
        raise ConfigurationError("a tenant's name cannot change; create another tenant")
    tenant = service.settings.tokens.update_tenant(check_tenant_name(name), body.changes())
    service.admission.retune(tenant)
    return describe_tenant(service, tenant)


@router.delete("/v1/tenants/{name}", response_model=s.Deleted)
async def delete_tenant(service: ServiceDep, token: TokenDep, name: TenantName) -> s.Deleted:
    """Remove a tenant no token belongs to (admin)."""
    _admin(token)
    service.settings.tokens.delete_tenant(check_tenant_name(name))
    return s.Deleted(id=name, destroyed=True)


def describe_tenant(service: Service, tenant: Tenant) -> s.TenantOut:
    """A tenant as the API answers it: its settings, what it holds and what it has queued."""
    held = service.admission.holdings(tenant.name)
    return s.TenantOut(
        name=tenant.name,
        settings=tenant.to_dict(),
        held_sandboxes=held.sandboxes,
        held_memory=held.memory,
        held_cpus=round(held.cpus, 6),
        queued=service.admission.queue_depths().get(tenant.name, 0),
    )


def _admin(token: Token) -> None:
    if not token.admin:
        raise Refused(
            403,
            "policy_denied",
            "managing tenants needs an admin token (agentnest serve token create --admin)",
        )


def _known(service: Service, name: str) -> Tenant:
    tenant = service.settings.tokens.tenant(check_tenant_name(name))
    if tenant is None:
        raise Refused(404, "not_found", f"no tenant {name!r:.80}")
    return tenant
