"""envd's ``GET``/``POST /files``: file downloads and uploads (multipart or octet-stream, gzip).

Errors are envd's JSON ``{"code", "message"}`` with the statuses the SDK maps
to its exceptions (400 a directory or bad input, 401 an unknown user, 403 a
path outside the workspace, 404 missing, 413 over the file limit, 415 a
content type other than multipart or octet-stream, 507 the workspace full).
Uploads are bounded by the server's upload limit as they arrive and by the
sandbox policy's ``max_file_bytes`` per file.
"""

from __future__ import annotations

import gzip
import zlib
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import AgentNestError, FileAccessError, FileTooLargeError
from .. import schemas as s
from ..refused import Refused
from .state import Box, user_problem

#: Files one multipart upload may carry.
MAX_FILES = 1000


def envd_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _status(exc: AgentNestError) -> int:
    if isinstance(exc, FileTooLargeError):
        return 413
    if isinstance(exc, FileAccessError):
        return {
            "not_found": 404,
            "is_directory": 400,
            "outside_workspace": 403,
            "symlink": 403,
            "permission": 403,
            "no_space": 507,
        }.get(exc.code, 400)
    status = s.ERROR_CODES[s.error_code(exc)][0]
    return 502 if status == 410 else status


def error_response(exc: AgentNestError) -> JSONResponse:
    return envd_error(_status(exc), str(exc))


def _user_refused(request: Request) -> JSONResponse | None:
    problem = user_problem(request.query_params.get("username"))
    return None if problem is None else envd_error(401, problem)


async def download(request: Request, owner: Box) -> Response:
    refused = _user_refused(request)
    if refused is not None:
        return refused
    path = owner.sandbox_path(request.query_params.get("path"))
    try:
        data = await owner.entry.sandbox.read_file(path, encoding=None)
    except AgentNestError as exc:
        return error_response(exc)
    headers = {"Content-Disposition": "attachment"}
    if "gzip" in request.headers.get("accept-encoding", "") and len(data) > 1024:
        return Response(
            gzip.compress(data, compresslevel=1),
            media_type="application/octet-stream",
            headers={**headers, "Content-Encoding": "gzip"},
        )
    return Response(data, media_type="application/octet-stream", headers=headers)


def _gunzip(data: bytes, limit: int) -> bytes:
    """Decompress at most ``limit`` bytes (a gzip bomb stops there)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflater.decompress(data, limit + 1)
    if len(out) > limit:
        raise FileTooLargeError(f"the decompressed upload exceeds {limit} bytes", path=None)
    if not inflater.eof:
        raise ValueError("the gzip body is truncated")
    return out


async def _write(owner: Box, path: str, data: bytes) -> dict[str, str]:
    target = owner.sandbox_path(path)
    await owner.entry.sandbox.write_file(target, data)
    e2b = owner.e2b_path(target)
    return {"path": e2b, "name": e2b.rsplit("/", 1)[-1], "type": "file"}


async def upload(request: Request, owner: Box, limit: int) -> Response:
    refused = _user_refused(request)
    if refused is not None:
        return refused
    query_path = request.query_params.get("path")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    written: list[dict[str, str]] = []
    try:
        if kind == "multipart/form-data":
            form = await request.form(max_files=MAX_FILES, max_fields=MAX_FILES)
            try:
                parts: list[Any] = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
                if not parts:
                    return envd_error(400, "the multipart body has no file part")
                for part in parts:
                    # envd: the part's file name is its destination; with one file
                    # the query's path wins.
                    path = query_path if (query_path and len(parts) == 1) else part.filename
                    if not path:
                        return envd_error(400, "a file part has no file name (its destination path)")
                    written.append(await _write(owner, path, await part.read()))
            finally:
                await form.close()
        elif kind in ("application/octet-stream", ""):
            if not query_path:
                return envd_error(400, "an octet-stream upload needs ?path=")
            data = await request.body()
            encoding = request.headers.get("content-encoding", "").strip().lower()
            if encoding == "gzip":
                data = _gunzip(data, limit)
            elif encoding not in ("", "identity"):
                return envd_error(400, f"unsupported Content-Encoding {encoding[:40]!r}: send gzip or none")
            written.append(await _write(owner, query_path, data))
        else:
            # envd answers 400 here; 415 is what the status means, and no stock SDK sends another type.
            return envd_error(
                415,
                f"unsupported Content-Type {kind[:80]!r}: "
                "send multipart/form-data or application/octet-stream",
            )
    except AgentNestError as exc:
        return error_response(exc)
    except Refused as exc:  # the body limit, hit while reading
        return envd_error(exc.status_code, str(exc.detail))
    except (ValueError, zlib.error) as exc:
        return envd_error(400, f"malformed upload: {exc}")
    return JSONResponse(written)
