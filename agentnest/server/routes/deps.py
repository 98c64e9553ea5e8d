"""What every route of ``agentnest serve`` shares: the service, the caller's token, the sandbox it owns.

The service is the one the app was made with (``app.state.service``).  A
token is read from ``Authorization: Bearer``; a sandbox of another token is
404, exactly as one that never existed, so ids do not leak between tokens.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

import time
from typing import Annotated, Any

from fastapi import Depends
from fastapi import Path as PathParam
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from .. import schemas as s
from ..auth import AuthError, Token
from ..entries import Entry
from ..refused import Refused
from ..service import Service

_WWW_AUTHENTICATE = 'Bearer realm="agentnest"'
_INVALID_TOKEN = _WWW_AUTHENTICATE + ', error="invalid_token"'

#: The error answers every authenticated route declares.
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": s.ErrorOut} for code in (400, 401, 403, 404, 409, 410, 413, 429)
}


def service_of(connection: HTTPConnection) -> Service:
    """The service of the app serving this request (or websocket)."""
    service: Service = connection.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(service_of)]

bearer = HTTPBearer(auto_error=False, description="a token from `agentnest serve token create`")


def authenticate(service: Service, header_value: str | None) -> Token:
    """The token a bearer credential names; 401 (and why) when it names none."""
    if not header_value:
        raise Refused(
            401,
            "unauthorized",
            "missing bearer token: send 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": _WWW_AUTHENTICATE},
        )
    try:
        return service.settings.tokens.authenticate(header_value)
    except AuthError as exc:
        raise Refused(
            401,
            "unauthorized",
            str(exc),
            {"WWW-Authenticate": f'{_INVALID_TOKEN}, error_description="{exc}"'},
        ) from None


async def current_token(
    service: ServiceDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Token:
    token = authenticate(service, credentials.credentials if credentials is not None else None)
    service.tracing.annotate(tenant=token.tenant, token=token.id)  # the id, never the secret
    return token


TokenDep = Annotated[Token, Depends(current_token)]
SandboxId = Annotated[str, PathParam(min_length=1, max_length=64)]


async def owned(service: Service, token: Token, sandbox_id: str) -> Entry:
    """The live sandbox ``sandbox_id`` of ``token`` (404 otherwise); the call renews its idle lease."""
    entry = service.get(token, sandbox_id)
    if entry.deadline <= time.time():
        await service.destroy(entry)
        raise Refused(404, "not_found", f"no sandbox {sandbox_id!r:.80} for this token")
    entry.lease.touch()  # every call on a sandbox is use: it renews an idle lease
    return entry
