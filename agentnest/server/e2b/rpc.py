"""Shared by the data-plane services: the request's sandbox, errors as E2B clients expect them, keepalives."""

from __future__ import annotations

import contextvars
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import StreamType
from connectrpc.server import Endpoint
from starlette.responses import JSONResponse, Response

from ...errors import (
    AgentNestError,
    ExecutionTimeoutError,
    FileAccessError,
    FileTooLargeError,
    SandboxDestroyedError,
    SandboxPausedError,
)
from .. import schemas as s
from ..inputs import media_type
from .state import Box, basic_user, user_problem
from .wire import Msg, method

#: The sandbox of the data-plane request being served (set by the dispatcher,
#: after it checked the sandbox's access token).
CURRENT: contextvars.ContextVar[Box] = contextvars.ContextVar("agentnest_e2b_box")
#: Seconds between keepalive events on a quiet stream unless the client asks
#: (``Keepalive-Ping-Interval``); envd's default is 90, the SDK asks for 50.
KEEPALIVE = 50.0


def box() -> Box:
    return CURRENT.get()


def not_found_message(sandbox_id: str) -> str:
    # "was not found" is what the SDK looks for to tell a sandbox that is gone
    # (SandboxNotRunningException) from one it cannot reach.
    return f"The sandbox {sandbox_id[:64]} was not found"


def _file_code(exc: FileAccessError) -> Code:
    if exc.code == "not_found":
        return Code.NOT_FOUND
    if exc.code in ("exists", "not_empty"):
        return Code.ALREADY_EXISTS
    if exc.code in ("outside_workspace", "symlink", "permission", "read_only"):
        return Code.PERMISSION_DENIED
    if exc.code in ("no_space", "quota"):
        return Code.RESOURCE_EXHAUSTED
    return Code.INVALID_ARGUMENT


def connect_error(exc: AgentNestError) -> ConnectError:
    """An AgentNest error as the Connect error an E2B client maps to its own exception."""
    if isinstance(exc, FileTooLargeError):
        return ConnectError(Code.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, FileAccessError):
        return ConnectError(_file_code(exc), str(exc))
    if isinstance(exc, SandboxDestroyedError):
        return ConnectError(Code.UNAVAILABLE, f"{not_found_message(box().id)}: {exc}")
    if isinstance(exc, SandboxPausedError):
        return ConnectError(Code.FAILED_PRECONDITION, f"the sandbox is paused: {exc}")
    if isinstance(exc, ExecutionTimeoutError):
        return ConnectError(Code.DEADLINE_EXCEEDED, str(exc))
    status = s.ERROR_CODES[s.error_code(exc)][0]
    code = {
        400: Code.INVALID_ARGUMENT,
        401: Code.UNAUTHENTICATED,
        403: Code.PERMISSION_DENIED,
        404: Code.NOT_FOUND,
        408: Code.DEADLINE_EXCEEDED,
        409: Code.FAILED_PRECONDITION,
        410: Code.UNAVAILABLE,
        413: Code.INVALID_ARGUMENT,
        429: Code.RESOURCE_EXHAUSTED,
        501: Code.UNIMPLEMENTED,
        503: Code.UNAVAILABLE,
    }.get(status, Code.INTERNAL)
    return ConnectError(code, str(exc))


def translated(fn: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    """A unary (or client-stream) handler whose AgentNest errors answer as :func:`connect_error`."""

    async def call(request: Any, ctx: Any) -> Any:
        try:
            return await fn(request, ctx)
        except AgentNestError as exc:
            raise connect_error(exc) from None

    return call


def translated_stream(
    fn: Callable[[Any, Any], AsyncIterator[Any]],
) -> Callable[[Any, Any], AsyncIterator[Any]]:
    """The same for a server-stream handler."""

    async def call(request: Any, ctx: Any) -> AsyncIterator[Any]:
        try:
            async for message in fn(request, ctx):
                yield message
        except AgentNestError as exc:
            raise connect_error(exc) from None

    return call


def endpoint(
    service: str,
    name: str,
    request: type[Msg],
    response: type[Msg],
    fn: Any,
    kind: StreamType = StreamType.UNARY,
) -> tuple[str, Endpoint[Any, Any]]:
    """One RPC's path and endpoint, its AgentNest errors answered as Connect errors."""
    info = method(service, name, request, response, kind)
    if kind is StreamType.SERVER_STREAM:
        return f"/{service}/{name}", Endpoint.server_stream(info, translated_stream(fn))
    if kind is StreamType.CLIENT_STREAM:
        return f"/{service}/{name}", Endpoint.client_stream(info, translated(fn))
    return f"/{service}/{name}", Endpoint.unary(info, translated(fn))


def check_user(ctx: Any) -> None:
    """Refuse a user other than the sandbox's own (``Authorization: Basic``)."""
    problem = user_problem(basic_user(ctx.request_headers.get("authorization")))
    if problem is not None:
        code = Code.PERMISSION_DENIED if "root" in problem else Code.UNAUTHENTICATED
        raise ConnectError(code, problem)


def keepalive_interval(ctx: Any) -> float:
    try:
        asked = float(ctx.request_headers.get("keepalive-ping-interval", KEEPALIVE))
    except ValueError:
        asked = KEEPALIVE
    if not math.isfinite(asked):  # "nan" parses, and min/max pass NaN through
        asked = KEEPALIVE
    return min(max(asked, 1.0), 90.0)


def connect_refusal(
    status: int, code: Code, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """A Connect error body (``{"code", "message"}``) with an HTTP status, for a request no RPC serves."""
    return JSONResponse(
        {"code": code.value, "message": message}, status_code=status, headers=dict(headers or {})
    )


#: The content type each kind of RPC is served in (the JSON codec only, as E2B clients send).
_SERVED = {StreamType.UNARY: "application/json"}
_STREAMED = "application/connect+json"


def rpc_refusal(kind: StreamType | None, path: str, content_type: str | None) -> Response | None:
    """Why the Connect app cannot serve this call (None: it can).

    An unknown method is a Connect error ``unimplemented`` with 404 (the
    status the protocol maps to it); a content type other than Connect's
    JSON is 415, code ``unknown`` (what the protocol maps 415 to), with
    ``Accept-Post`` naming the one that works: gRPC and gRPC-Web need HTTP
    trailers this server does not send, and only the JSON codec is served.
    """
    if kind is None:
        return connect_refusal(
            404, Code.UNIMPLEMENTED, f"no RPC {path[:120]}: see docs/e2b.md for the envd RPCs served"
        )
    wanted = _SERVED.get(kind, _STREAMED)
    given = media_type(content_type)
    if given == wanted:
        return None
    return connect_refusal(
        415,
        Code.UNKNOWN,
        f"unsupported Content-Type {given[:80]!r} for {path[:120]}: send {wanted!r} "
        "(the Connect protocol with JSON; gRPC, gRPC-Web and binary protobuf are not served)",
        {"Accept-Post": wanted},
    )
