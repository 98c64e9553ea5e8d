"""``/v1/sandboxes/{id}/exec``: run a command and wait for it, or stream its output as server-sent events.

A timeout is an outcome (``timed_out``), not an error.  A client that goes
away mid-stream cancels the command, which kills its process tree.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

from collections.abc import AsyncIterator

import anyio
from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import model_validator

from ...aio import AsyncExecutionStream, AsyncSandbox
from ...config import ExecutionResult
from ...errors import AgentNestError, ConfigurationError, ExecutionTimeoutError
from .. import schemas as s
from ..entries import Lease
from ..sse import event
from .deps import ERRORS, SandboxId, ServiceDep, TokenDep, owned

router = APIRouter(tags=["commands"], responses=ERRORS)


class ExecRequest(s.ExecIn):
    @model_validator(mode="after")
    def _one_command(self) -> "ExecRequest":
        given = [n for n in ("argv", "shell", "python") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of argv, shell or python")
        return self


@router.post("/v1/sandboxes/{sandbox_id}/exec", response_model=s.ExecOut)
async def exec_command(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, body: ExecRequest
) -> s.ExecOut:
    """Run a command and wait for it.  A timeout is an outcome (``timed_out``), not an error."""
    entry = await owned(service, token, sandbox_id)
    try:
        with entry.lease.held():  # a running command is use: an idle lease does not lapse under it
            result = await _run_command(entry.sandbox, _command_argv(body), body)
    except ExecutionTimeoutError as exc:
        if not isinstance(exc.result, ExecutionResult):
            raise
        result = exc.result
    return exec_out(result)


@router.post(
    "/v1/sandboxes/{sandbox_id}/exec/stream",
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
    response_class=StreamingResponse,
)
async def exec_stream(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, body: ExecRequest
) -> StreamingResponse:
    """Run a command and stream its output as server-sent events.

    Events: ``stdout`` and ``stderr`` (``{"data": text}``) as output
    arrives, then one ``exit`` (the same object as ``/exec`` returns) or
    ``error`` (``{"detail", "code"}``).  A client that disconnects kills
    the command's process tree.
    """
    entry = await owned(service, token, sandbox_id)
    sandbox = entry.sandbox
    argv = _command_argv(body)
    if argv is not None:
        stream = sandbox.stream_exec(argv, timeout=body.timeout, env=body.env, cwd=body.cwd, input=body.stdin)
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


def exec_out(result: ExecutionResult) -> s.ExecOut:
    """A command's result as the API answers it."""
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


async def _sse(stream: AsyncExecutionStream, lease: Lease) -> AsyncIterator[bytes]:
    with lease.held():  # an open command stream holds the sandbox (session and idle leases)
        async for chunk in _sse_events(stream):
            yield chunk


async def _sse_events(stream: AsyncExecutionStream) -> AsyncIterator[bytes]:
    try:
        try:
            async for chunk in stream:
                if chunk.stream != "status":  # the exit event below says it, with the whole result
                    yield event(chunk.stream, {"data": chunk.data})
            assert stream.result is not None
            yield event("exit", exec_out(stream.result).model_dump())
        except ExecutionTimeoutError as exc:
            if isinstance(exc.result, ExecutionResult):
                yield event("exit", exec_out(exc.result).model_dump())
            else:
                yield event("error", {"detail": str(exc), "code": s.error_code(exc)})
        except AgentNestError as exc:
            yield event("error", {"detail": str(exc), "code": s.error_code(exc)})
    finally:
        # Also on cancellation (the client went away): kill the command's tree.
        with anyio.CancelScope(shield=True):
            await stream.aclose()
