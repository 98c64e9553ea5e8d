"""``/v1/tenants``: tenants over HTTP.  Admin tokens manage every tenant; any token reads its own.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

from typing import Annotated, Any

from fastapi import FastAPI
from fastapi import Path as PathParam

from ..errors import ConfigurationError
from . import schemas as s
from .auth import Token
from .refused import Refused
from .service import Service
from .tenants import Tenant, check_tenant_name

TenantName = Annotated[str, PathParam(min_length=1, max_length=40)]


def describe_tenant(service: Service, tenant: Tenant) -> s.TenantOut:
    held = service.admission.holdings(tenant.name)
    return s.TenantOut(
        name=tenant.name,
        settings=tenant.to_dict(),
        held_sandboxes=held.sandboxes,
        held_memory=held.memory,
        held_cpus=round(held.cpus, 6),
        queued=service.admission.queue_depths().get(tenant.name, 0),
    )


def add_tenant_routes(app: FastAPI, service: Service, token_dep: Any, errors: dict[int | str, Any]) -> None:
    """Add the tenant routes; ``token_dep`` authenticates the caller."""
    store = service.settings.tokens

    def admin(token: Token) -> None:
        if not token.admin:
            raise Refused(
                403,
                "policy_denied",
                "managing tenants needs an admin token (agentnest serve token create --admin)",
            )

    def known(name: str) -> Tenant:
        tenant = store.tenant(check_tenant_name(name))
        if tenant is None:
            raise Refused(404, "not_found", f"no tenant {name!r:.80}")
        return tenant

    @app.get("/v1/tenants", response_model=s.TenantList, responses=errors, tags=["tenants"])
    async def list_tenants(token: token_dep) -> s.TenantList:
        """Every tenant (admin), or the caller's own."""
        tenants = store.tenants() if token.admin else [service.tenant_of(token)]
        return s.TenantList(tenants=[describe_tenant(service, t) for t in tenants])

    @app.get("/v1/tenants/{name}", response_model=s.TenantOut, responses=errors, tags=["tenants"])
    async def get_tenant(token: token_dep, name: TenantName) -> s.TenantOut:
        """One tenant: its settings, what it holds and what it has queued."""
        if not token.admin and name != token.tenant:
            raise Refused(404, "not_found", f"no tenant {name!r:.80} for this token")
        return describe_tenant(service, known(name))

    @app.post("/v1/tenants", status_code=201, response_model=s.TenantOut, responses=errors, tags=["tenants"])
    async def create_tenant(token: token_dep, body: s.TenantIn) -> s.TenantOut:
        """A new tenant (admin)."""
        admin(token)
        tenant = store.create_tenant(Tenant.from_dict({"name": body.name, **body.changes()}))
        return describe_tenant(service, tenant)

    @app.patch("/v1/tenants/{name}", response_model=s.TenantOut, responses=errors, tags=["tenants"])
    async def update_tenant(token: token_dep, name: TenantName, body: s.TenantUpdate) -> s.TenantOut:
        """Change a tenant's settings (admin); queued requests see the change at once."""
        admin(token)
        if body.name is not None and body.name != name:
            raise ConfigurationError("a tenant's name cannot change; create another tenant")
        tenant = store.update_tenant(check_tenant_name(name), body.changes())
        service.admission.retune(tenant)
        return describe_tenant(service, tenant)

    @app.delete("/v1/tenants/{name}", response_model=s.Deleted, responses=errors, tags=["tenants"])
    async def delete_tenant(token: token_dep, name: TenantName) -> s.Deleted:
        """Remove a tenant no token belongs to (admin)."""
        admin(token)
        store.delete_tenant(check_tenant_name(name))
        return s.Deleted(id=name, destroyed=True)
