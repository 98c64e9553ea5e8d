"""``/v1/sandboxes/{id}/sessions``: persistent Python interpreters in a sandbox (at most ``MAX_SESSIONS``).

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

from fastapi import APIRouter

from ...aio import AsyncPythonSession
from ...config import ExecutionResult
from ...errors import ExecutionTimeoutError
from .. import schemas as s
from ..entries import Entry
from ..refused import Refused
from ..service import MAX_SESSIONS
from .deps import ERRORS, SandboxId, ServiceDep, TokenDep, owned

router = APIRouter(tags=["sessions"], responses=ERRORS)


@router.post("/v1/sandboxes/{sandbox_id}/sessions", status_code=201, response_model=s.SessionOut)
async def open_session(service: ServiceDep, token: TokenDep, sandbox_id: SandboxId) -> s.SessionOut:
    """Start a persistent Python interpreter."""
    entry = await owned(service, token, sandbox_id)
    if len(entry.sessions) >= MAX_SESSIONS:
        raise Refused(429, "quota", f"a sandbox has at most {MAX_SESSIONS} sessions; close one first")
    session = await entry.sandbox.python_session()
    entry.sessions[session.id] = session
    return s.SessionOut(id=session.id)


@router.post("/v1/sandboxes/{sandbox_id}/sessions/{session_id}/run", response_model=s.SessionRunOut)
async def run_session(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, session_id: SandboxId, body: s.SessionRunIn
) -> s.SessionRunOut:
    """Run code in the session; the trailing expression's repr is ``result``."""
    entry = await owned(service, token, sandbox_id)
    session = _session_of(entry, session_id)
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


@router.delete("/v1/sandboxes/{sandbox_id}/sessions/{session_id}", response_model=s.Deleted)
async def close_session(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, session_id: SandboxId
) -> s.Deleted:
    """Stop the session's interpreter."""
    entry = await owned(service, token, sandbox_id)
    session = _session_of(entry, session_id)
    del entry.sessions[session_id]
    await session.close()
    return s.Deleted(id=session_id, destroyed=True)


def _session_of(entry: Entry, session_id: str) -> AsyncPythonSession:
    session = entry.sessions.get(session_id)
    if session is None:
        raise Refused(404, "not_found", f"no session {session_id!r:.80} in this sandbox")
    return session
