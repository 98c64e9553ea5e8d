"""``/v1/sandboxes/{id}/files``, ``/snapshot``, ``/restore``: the workspace's files, and all of it as a tar.

Bodies are bytes as they are (``application/octet-stream``).  A snapshot or
a restore is staged in the server's private directory and removed once done:
a client never names a path on the server.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: FastAPI reads the route annotations as objects.

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response, StreamingResponse

from .. import schemas as s
from .deps import ERRORS, SandboxId, ServiceDep, TokenDep, owned

FilePath = Annotated[str, PathParam(min_length=1, max_length=4096)]
_BYTES_BODY = {
    "requestBody": {
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    }
}

router = APIRouter(responses=ERRORS)


@router.get("/v1/sandboxes/{sandbox_id}/files", response_model=s.FileList, tags=["files"])
async def list_files(
    service: ServiceDep,
    token: TokenDep,
    sandbox_id: SandboxId,
    path: Annotated[str, Query(min_length=1, max_length=4096)] = ".",
    recursive: bool = False,
) -> s.FileList:
    """List a workspace directory (links are listed, never followed; at most 10000 entries)."""
    entry = await owned(service, token, sandbox_id)
    infos = await entry.sandbox.list_files(path, recursive=recursive)
    return s.FileList(
        entries=[
            s.FileEntry(path=i.path, type=i.type, size=i.size, mode=i.mode, mtime=i.mtime) for i in infos
        ]
    )


@router.get(
    "/v1/sandboxes/{sandbox_id}/files/{path:path}",
    responses={200: {"content": {"application/octet-stream": {}}, "description": "the bytes"}},
    response_class=Response,
    tags=["files"],
)
async def read_file(service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, path: FilePath) -> Response:
    """A workspace file's bytes, as they are (up to the policy's max_file_bytes)."""
    entry = await owned(service, token, sandbox_id)
    data = await entry.sandbox.read_file(path, encoding=None)
    return Response(bytes(data), media_type="application/octet-stream")


@router.put(
    "/v1/sandboxes/{sandbox_id}/files/{path:path}",
    status_code=204,
    tags=["files"],
    response_class=Response,
    openapi_extra=_BYTES_BODY,
)
async def write_file(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, path: FilePath, request: Request
) -> Response:
    """Write the request body to a workspace file (parents created, atomically replaced)."""
    entry = await owned(service, token, sandbox_id)
    with entry.lease.held():  # an upload under way is use (until it ends or its client goes)
        data = await request.body()
        await entry.sandbox.write_file(path, data)
    return Response(status_code=204)


@router.delete(
    "/v1/sandboxes/{sandbox_id}/files/{path:path}", status_code=204, tags=["files"], response_class=Response
)
async def remove_file(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, path: FilePath, recursive: bool = False
) -> Response:
    """Remove a workspace file (a directory tree with ``recursive=true``)."""
    entry = await owned(service, token, sandbox_id)
    await entry.sandbox.remove_file(path, recursive=recursive)
    return Response(status_code=204)


@router.get(
    "/v1/sandboxes/{sandbox_id}/snapshot",
    responses={200: {"content": {"application/x-tar": {}}, "description": "the snapshot tar"}},
    response_class=StreamingResponse,
    tags=["snapshots"],
)
async def snapshot(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, compress: bool = False
) -> StreamingResponse:
    """The workspace as a snapshot tar (gzip with ``compress=true``), streamed.

    Staged in the server's private directory and removed once sent: a
    client never names a path on the server.
    """
    entry = await owned(service, token, sandbox_id)
    target = service.work_dir / f"snapshot-{uuid.uuid4().hex}.tar"
    try:
        meta = await entry.sandbox.snapshot(target, compress=compress)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return StreamingResponse(
        _file_chunks(target),
        media_type="application/gzip" if compress else "application/x-tar",
        headers={"X-AgentNest-SHA256": meta.sha256, "Content-Length": str(meta.size)},
    )


@router.post(
    "/v1/sandboxes/{sandbox_id}/restore",
    response_model=s.RestoreOut,
    tags=["snapshots"],
    openapi_extra=_BYTES_BODY,
)
async def restore(
    service: ServiceDep, token: TokenDep, sandbox_id: SandboxId, request: Request
) -> s.RestoreOut:
    """Replace the workspace with the snapshot tar in the body (checked member by member)."""
    entry = await owned(service, token, sandbox_id)
    target = service.work_dir / f"restore-{uuid.uuid4().hex}.tar"
    try:
        with entry.lease.held():  # an upload under way is use (until it ends or its client goes)
            async with await anyio.open_file(target, "wb") as out:
                async for chunk in request.stream():
                    await out.write(chunk)
            meta = await entry.sandbox.restore(target)
    finally:
        target.unlink(missing_ok=True)
    return s.RestoreOut(image=meta.image or None, files=meta.files, size=meta.size, sha256=meta.sha256)


async def _file_chunks(path: Path, chunk: int = 1 << 20) -> AsyncIterator[bytes]:
    """The file's bytes, then the file is gone (also when the client goes away)."""
    try:
        async with await anyio.open_file(path, "rb") as f:
            while True:
                data = await f.read(chunk)
                if not data:
                    break
                yield data
    finally:
        path.unlink(missing_ok=True)
