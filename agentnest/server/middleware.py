"""The ASGI middleware of ``agentnest serve`` that is its own: the request body limit, JSON bodies.

Every refusal here has the API's error shape (``{"detail", "code"}``), as the
routes' own refusals do.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from .inputs import is_json, media_type
from .refused import TooLarge


def error_response(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error answer in the API's shape."""
    return JSONResponse({"detail": detail, "code": code}, status_code=status, headers=dict(headers or {}))


def is_upload(scope: Mapping[str, Any]) -> bool:
    """Whether the request's body is bytes as they are (an upload), not JSON."""
    path = str(scope.get("path", ""))
    method = scope.get("method")
    return (
        (method == "PUT" and "/files/" in path)
        or (method == "POST" and path.endswith("/restore"))
        or (method == "POST" and path == "/files")  # the E2B face's uploads
    )


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
        return self.upload_limit if is_upload(scope) else self.limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit_for(scope)
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                if not value.isdigit():
                    response = error_response(400, "invalid", "Content-Length is not a number")
                    await response(scope, receive, send)
                    return
                if int(value) > limit:
                    await error_response(413, "too_large", TooLarge(limit).detail)(scope, receive, send)
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


class JsonBodies:
    """ASGI middleware: a native route's body (``/v1/...``, uploads aside) is JSON, or 415.

    FastAPI parses a body as JSON only when the ``Content-Type`` says so (or
    says nothing); another type left the model to fail with a confusing 422
    ("Input should be a valid dictionary").  The E2B face's paths answer in
    their own shapes (:mod:`.e2b`), so only ``/v1/`` is checked here.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and str(scope.get("path", "")).startswith("/v1/")
            and scope.get("method") in ("POST", "PUT", "PATCH")
            and not is_upload(scope)
        ):
            headers = dict(scope.get("headers", ()))
            kind = headers.get(b"content-type", b"").decode("latin-1")
            has_body = headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers
            if has_body and not is_json(kind):
                response = error_response(
                    415,
                    "invalid",
                    f"unsupported Content-Type {media_type(kind)[:80]!r}: this route takes a JSON body "
                    "(send Content-Type: application/json)",
                    {"Accept": "application/json"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Wrap:
    """ASGI middleware from a function that wraps an application (the E2B face's ``wrap``)."""

    def __init__(self, app: Any, wrap: Any) -> None:
        self._app = wrap(app)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


__all__ = ["BodyLimit", "JsonBodies", "Wrap", "error_response", "is_upload"]
