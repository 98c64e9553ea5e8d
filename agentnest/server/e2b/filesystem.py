"""envd's ``filesystem.Filesystem`` service over the sandbox's workspace file API.

Paths are E2B's: ``/home/user`` (the default, and the base of relative paths)
is the workspace.  Every operation goes through the same guard as
:class:`~agentnest.Sandbox`'s file methods: confined to the workspace, no
symlink followed, approvals asked and events audited, names redacted.  A
path elsewhere (``/etc/passwd``) is refused with ``permission_denied``.
"""

from __future__ import annotations

import asyncio
import posixpath
import stat as st
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import StreamType
from connectrpc.server import Endpoint

from ...config import FileInfo
from . import wire as w
from .rpc import box, check_user, connect_error, endpoint, keepalive_interval
from .state import Box
from .watch import Watcher

#: Entries one ListDir answers at most.
MAX_LIST = 10000
#: Watchers one sandbox may hold at once.
MAX_WATCHERS = 64
_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
_MODE_BITS = {"file": st.S_IFREG, "dir": st.S_IFDIR, "symlink": st.S_IFLNK}


def entry_info(owner: Box, info: FileInfo) -> w.EntryInfo:
    path = owner.e2b_path(info.path)
    return w.EntryInfo(
        name=posixpath.basename(path),
        type=_TYPES.get(info.type, "FILE_TYPE_UNSPECIFIED"),
        path=path,
        size=info.size,
        mode=info.mode,
        # Go's FileMode.String(), which is what envd sends: "-rw-r--r--", "drwxr-xr-x".
        permissions=st.filemode(_MODE_BITS.get(info.type, 0) | info.mode).replace("l", "L", 1),
        owner="user",
        group="user",
        modified_time=datetime.fromtimestamp(info.mtime, timezone.utc).isoformat().replace("+00:00", "Z"),
    )


async def stat_entry(owner: Box, path: str) -> w.EntryInfo:
    return entry_info(owner, await owner.entry.sandbox.stat(path))


class FilesystemService:
    async def stat(self, request: w.PathRequest, ctx: Any) -> w.EntryResponse:
        check_user(ctx)
        owner = box()
        return w.EntryResponse(entry=await stat_entry(owner, owner.sandbox_path(request.path)))

    async def list_dir(self, request: w.ListDirRequest, ctx: Any) -> w.ListDirResponse:
        check_user(ctx)
        owner = box()
        depth = request.depth or 1
        path = owner.sandbox_path(request.path)
        sandbox = owner.entry.sandbox
        top = await sandbox.stat(path)
        if top.type != "dir":
            raise ConnectError(Code.INVALID_ARGUMENT, f"path {request.path[:200]!r} is not a directory")
        infos = await sandbox.list_files(path, recursive=depth > 1, max_entries=MAX_LIST)
        base = top.path if top.path not in ("", ".") else ""
        entries = []
        for info in infos:
            rel = posixpath.relpath(info.path, base) if base else info.path
            if rel.count("/") < depth:
                entries.append(entry_info(owner, info))
        return w.ListDirResponse(entries=entries)

    async def make_dir(self, request: w.PathRequest, ctx: Any) -> w.EntryResponse:
        check_user(ctx)
        owner = box()
        path = owner.sandbox_path(request.path)
        sandbox = owner.entry.sandbox
        if await sandbox.exists(path):
            raise ConnectError(Code.ALREADY_EXISTS, f"directory {request.path[:200]!r} already exists")
        await sandbox.mkdir(path, parents=True)
        return w.EntryResponse(entry=await stat_entry(owner, path))

    async def move(self, request: w.MoveRequest, ctx: Any) -> w.EntryResponse:
        check_user(ctx)
        owner = box()
        destination = owner.sandbox_path(request.destination)
        await owner.entry.sandbox.rename(owner.sandbox_path(request.source), destination)
        return w.EntryResponse(entry=await stat_entry(owner, destination))

    async def remove(self, request: w.PathRequest, ctx: Any) -> w.Empty:
        check_user(ctx)
        owner = box()
        await owner.entry.sandbox.remove_file(owner.sandbox_path(request.path), recursive=True)
        return w.Empty()

    async def _watcher(self, request: w.WatchRequest) -> tuple[Watcher, Any]:
        owner = box()
        if len(owner.watchers) >= MAX_WATCHERS:
            raise ConnectError(Code.RESOURCE_EXHAUSTED, f"{MAX_WATCHERS} watchers already in this sandbox")
        path = owner.sandbox_path(request.path)
        info = await owner.entry.sandbox.stat(path)
        if info.type != "dir":
            raise ConnectError(Code.INVALID_ARGUMENT, f"path {request.path[:200]!r} is not a directory")
        watcher = Watcher(owner, info.path if info.path not in ("", ".") else "", request.recursive)
        return watcher, await watcher.first()

    async def watch_dir(self, request: w.WatchRequest, ctx: Any) -> AsyncIterator[w.WatchDirResponse]:
        check_user(ctx)
        watcher, state = await self._watcher(request)
        queue: asyncio.Queue[list[w.FilesystemEvent]] = asyncio.Queue()
        watcher.start(state, queue.put_nowait)
        interval = keepalive_interval(ctx)
        try:
            yield w.WatchDirResponse(start=w.Empty())
            while True:
                try:
                    events = await asyncio.wait_for(queue.get(), interval)
                except asyncio.TimeoutError:
                    yield w.WatchDirResponse(keepalive=w.Empty())
                    continue
                if watcher.error is not None:
                    raise connect_error(watcher.error)
                for event in events:
                    yield w.WatchDirResponse(filesystem=event)
        finally:
            watcher.stop()

    async def create_watcher(self, request: w.WatchRequest, ctx: Any) -> w.WatcherId:
        check_user(ctx)
        watcher, state = await self._watcher(request)
        watcher.start(state, watcher.keep)
        watcher_id = uuid.uuid4().hex
        box().watchers[watcher_id] = watcher
        return w.WatcherId(watcher_id=watcher_id)

    def _watcher_of(self, watcher_id: str) -> Watcher:
        watcher: Watcher | None = box().watchers.get(watcher_id)
        if watcher is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher {watcher_id[:64]!r} not found")
        return watcher

    async def get_watcher_events(self, request: w.WatcherId, ctx: Any) -> w.WatcherEvents:
        watcher = self._watcher_of(request.watcher_id)
        if watcher.error is not None:
            raise connect_error(watcher.error)
        return w.WatcherEvents(events=watcher.take())

    async def remove_watcher(self, request: w.WatcherId, ctx: Any) -> w.Empty:
        watcher = self._watcher_of(request.watcher_id)
        watcher.stop()
        box().watchers.pop(request.watcher_id, None)
        return w.Empty()


def endpoints(service: FilesystemService) -> dict[str, Endpoint[Any, Any]]:
    f = w.FILESYSTEM
    return dict(
        [
            endpoint(f, "Stat", w.PathRequest, w.EntryResponse, service.stat),
            endpoint(f, "ListDir", w.ListDirRequest, w.ListDirResponse, service.list_dir),
            endpoint(f, "MakeDir", w.PathRequest, w.EntryResponse, service.make_dir),
            endpoint(f, "Move", w.MoveRequest, w.EntryResponse, service.move),
            endpoint(f, "Remove", w.PathRequest, w.Empty, service.remove),
            endpoint(
                f, "WatchDir", w.WatchRequest, w.WatchDirResponse, service.watch_dir, StreamType.SERVER_STREAM
            ),
            endpoint(f, "CreateWatcher", w.WatchRequest, w.WatcherId, service.create_watcher),
            endpoint(f, "GetWatcherEvents", w.WatcherId, w.WatcherEvents, service.get_watcher_events),
            endpoint(f, "RemoveWatcher", w.WatcherId, w.Empty, service.remove_watcher),
        ]
    )
