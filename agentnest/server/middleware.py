"""The ASGI middleware of ``agentnest serve`` that is its own: the request body limit.

Every refusal here has the API's error shape (``{"detail", "code"}``), as the
routes' own refusals do.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from .refused import TooLarge


def error_response(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error answer in the API's shape."""
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


class Wrap:
    """ASGI middleware from a function that wraps an application (the E2B face's ``wrap``)."""

    def __init__(self, app: Any, wrap: Any) -> None:
        self._app = wrap(app)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


__all__ = ["BodyLimit", "Wrap", "error_response"]
