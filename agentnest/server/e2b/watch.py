"""Directory watches for envd's ``WatchDir`` and ``CreateWatcher``, by polling through the agent channel.

There is no inotify across the agent channel (and gVisor's is partial), so a
watcher lists the directory every :data:`INTERVAL` seconds and reports the
difference: a new name is ``CREATE``, a changed size or time ``WRITE``, a
changed mode ``CHMOD``, a name gone ``REMOVE``.  A rename shows as the old
name removed and the new one created; changes that undo themselves between
two polls are not seen.  docs/e2b.md says so.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Callable

from ...config import FileInfo
from ...errors import AgentNestError
from . import wire as w
from .state import Box

#: Seconds between two listings of a watched directory.
INTERVAL = 0.25
#: Entries a watch follows (a bigger tree is refused).
MAX_ENTRIES = 10000
#: Events a sync watcher keeps until the client fetches them (older ones are dropped).
MAX_PENDING = 10000

_Snapshot = dict[str, tuple[str, int, int, float]]


def _snapshot(infos: list[FileInfo], base: str, recursive: bool) -> _Snapshot:
    out: _Snapshot = {}
    for info in infos:
        rel = info.path if not base else posixpath.relpath(info.path, base)
        if rel.startswith("..") or (not recursive and "/" in rel):
            continue
        out[rel] = (info.type, info.size, info.mode, info.mtime)
    return out


def diff(before: _Snapshot, after: _Snapshot) -> list[w.FilesystemEvent]:
    events = []
    for name, now in after.items():
        was = before.get(name)
        if was is None:
            events.append(w.FilesystemEvent(name=name, type="EVENT_TYPE_CREATE"))
        elif was[0] != now[0]:
            events.append(w.FilesystemEvent(name=name, type="EVENT_TYPE_REMOVE"))
            events.append(w.FilesystemEvent(name=name, type="EVENT_TYPE_CREATE"))
        elif (was[1], was[3]) != (now[1], now[3]) and now[0] != "dir":
            events.append(w.FilesystemEvent(name=name, type="EVENT_TYPE_WRITE"))
        elif was[2] != now[2]:
            events.append(w.FilesystemEvent(name=name, type="EVENT_TYPE_CHMOD"))
    events.extend(w.FilesystemEvent(name=n, type="EVENT_TYPE_REMOVE") for n in before if n not in after)
    return events


class Watcher:
    """Polls one directory; hands each batch of events to ``deliver``."""

    def __init__(self, owner: Box, rel: str, recursive: bool) -> None:
        self.owner = owner
        self.rel = rel
        self.recursive = recursive
        self.pending: list[w.FilesystemEvent] = []
        self.error: AgentNestError | None = None
        self._task: asyncio.Task[None] | None = None

    async def _list(self) -> _Snapshot:
        infos = await self.owner.entry.sandbox.list_files(
            self.rel or ".", recursive=self.recursive, max_entries=MAX_ENTRIES
        )
        return _snapshot(infos, self.rel, self.recursive)

    async def first(self) -> _Snapshot:
        """The starting state (errors here are the caller's: a missing directory, a path refused)."""
        return await self._list()

    def start(self, state: _Snapshot, deliver: Callable[[list[w.FilesystemEvent]], None]) -> None:
        async def loop() -> None:
            nonlocal state
            while True:
                await asyncio.sleep(INTERVAL)
                try:
                    now = await self._list()
                except AgentNestError as exc:
                    self.error = exc
                    deliver([])
                    return
                events = diff(state, now)
                state = now
                if events:
                    deliver(events)

        self._task = self.owner.spawn(loop())

    def keep(self, events: list[w.FilesystemEvent]) -> None:
        """``deliver`` for a sync watcher: keep the events until fetched."""
        self.pending.extend(events)
        del self.pending[: max(0, len(self.pending) - MAX_PENDING)]

    def take(self) -> list[w.FilesystemEvent]:
        events, self.pending = self.pending, []
        return events

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
