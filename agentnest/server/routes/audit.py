"""``/v1/audit`` and ``/v1/usage``: the manager's history and usage from its database.

An admin token reads every tenant's; any other token only its own tenant's
(asking for another is refused).  Pages are ordered by ``id``; ``after`` is
the cursor, and ``wait`` makes a request a long poll that answers as soon
as a newer matching event is written (by this server, or by another replica
within half a second), which is how ``agentnest audit --server --follow``
follows.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ...errors import RuntimeNotAvailableError
from .. import schemas as s
from ..auth import Token
from ..db import MAX_PAGE, EventQuery
from ..inputs import MAX_UNIX_TIME
from ..recorder import Recorder
from ..refused import Refused
from ..service import Service
from .deps import ERRORS, ServiceDep, TokenDep

#: Longest long poll (seconds).
MAX_WAIT = 30.0
#: How often a long poll looks for what another replica wrote.
_POLL = 0.5

#: The largest cursor (a database id is a signed 64-bit integer).
MAX_CURSOR = 2**63 - 1

router = APIRouter(tags=["audit"], responses=ERRORS)


def _time(description: str) -> Any:
    """A Unix time in a query: finite, 0 to MAX_UNIX_TIME ("nan", "inf" and -1e308 are typos, not windows)."""
    return Query(ge=0, le=MAX_UNIX_TIME, allow_inf_nan=False, description=description)


@router.get("/v1/audit", response_model=s.AuditPage)
async def audit(
    service: ServiceDep,
    token: TokenDep,
    tenant: Annotated[str | None, Query(max_length=64)] = None,
    sandbox: Annotated[str | None, Query(max_length=80, description="an id or a prefix of one")] = None,
    type: Annotated[list[str] | None, Query(max_length=64, description="repeatable")] = None,
    since: Annotated[float | None, _time("Unix seconds")] = None,
    until: Annotated[float | None, _time("Unix seconds (exclusive)")] = None,
    after: Annotated[
        int, Query(ge=0, le=MAX_CURSOR, description="the cursor: only events after this id")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT, description="long poll: seconds to wait")] = 0.0,
) -> s.AuditPage:
    """The audit history, oldest first, one page (every event of the manager's sandboxes,
    and its admission decisions)."""
    rec = _recorder(service)
    if type is not None and len(type) > 32:
        raise Refused(400, "invalid", "at most 32 types at once")
    query = EventQuery(
        tenant=_scope(token, tenant),
        sandbox_id=sandbox,
        types=tuple(type or ()),
        since=since,
        until=until,
        after=after,
        limit=limit,
    )
    deadline = time.monotonic() + wait
    while True:
        try:
            rows = await rec.events(query)
        except RuntimeNotAvailableError as exc:
            raise _down(exc) from None
        left = deadline - time.monotonic()
        if rows or left <= 0:
            break
        await rec.written(min(_POLL, left))
    return s.AuditPage(
        events=[s.AuditEventOut(**row) for row in rows], next=rows[-1]["id"] if rows else after
    )


@router.get("/v1/usage", response_model=s.UsageList)
async def usage(
    service: ServiceDep,
    token: TokenDep,
    tenant: Annotated[str | None, Query(max_length=64)] = None,
    since: Annotated[float | None, _time("Unix seconds (default: 24 hours ago)")] = None,
    until: Annotated[float | None, _time("Unix seconds (default: now)")] = None,
) -> s.UsageList:
    """Usage per tenant over a window: creates, sandbox-, CPU- and memory-seconds, rejections."""
    rec = _recorder(service)
    now = time.time()
    start = now - 86400 if since is None else since
    end = now if until is None else until
    if end <= start:
        raise Refused(400, "invalid", "until must be after since")
    try:
        rows = await rec.usage(start, end, _scope(token, tenant))
    except RuntimeNotAvailableError as exc:
        raise _down(exc) from None
    return s.UsageList(
        since=start,
        until=end,
        usage=[s.UsageOut(**{f: getattr(u, f) for f in s.UsageOut.model_fields}) for u in rows],
    )


def _recorder(service: Service) -> Recorder:
    if service.recorder is None:
        raise Refused(
            409,
            "unsupported",
            "this server keeps no database (started without --database); its audit is the JSONL log",
        )
    return service.recorder


def _scope(token: Token, tenant: str | None) -> str | None:
    """The tenant a caller may read: its own, or any (admin)."""
    if token.admin:
        return tenant
    if tenant is not None and tenant != token.tenant:
        raise Refused(
            403, "policy_denied", f"this token reads only tenant {token.tenant!r}'s history (not admin)"
        )
    return token.tenant


def _down(exc: RuntimeNotAvailableError) -> Refused:
    return Refused(503, "database_unavailable", str(exc), {"Retry-After": "5"})
