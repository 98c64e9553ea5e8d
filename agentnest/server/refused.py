"""HTTP refusals with a stable code, raised anywhere in the server (the body is ``{"detail", "code"}``)."""

from __future__ import annotations

from starlette.exceptions import HTTPException


class Refused(HTTPException):
    """An HTTP error with a stable code (the body is ``{"detail", "code"}``)."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, detail, headers)
        self.code = code


class TooLarge(Refused):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413, "too_large", f"the request body is larger than this server's limit of {limit} bytes"
        )


__all__ = ["Refused", "TooLarge"]
