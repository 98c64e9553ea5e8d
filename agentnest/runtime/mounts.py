"""Bind mounts on this host, as system calls (``mount(2)``, ``umount2(2)``).

For the storage pool's slots (:meth:`agentnest.runtime.storage.StoragePool.make_slot`):
a warm container binds a slot, and a fork later mounts its child's workspace
on it.  Called directly rather than through ``mount(8)``: a fork waits on them.
Root only, as the pool itself.
"""

from __future__ import annotations

import ctypes
import errno
import os
from functools import lru_cache
from pathlib import Path

__all__ = ["bind", "make_shared", "roots_in_use", "top_mount", "unmount_all"]

_MS_BIND = 4096
_MS_SHARED = 1 << 20
_MNT_DETACH = 2
#: More mounts than this on one slot is not something AgentNest made.
_MAX_STACK = 16


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, path: Path) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))


def bind(source: Path, target: Path) -> None:
    """Mount directory ``source`` on ``target`` (``mount --bind``)."""
    _check(_libc().mount(os.fsencode(source), os.fsencode(target), None, _MS_BIND, None), target)


def make_shared(target: Path) -> None:
    """Make the mount at ``target`` shared: mounts made on it propagate to its copies."""
    _check(_libc().mount(None, os.fsencode(target), None, _MS_SHARED, None), target)


def unmount_all(target: Path) -> int:
    """Lazily unmount every mount stacked on ``target``; return how many there were."""
    for count in range(_MAX_STACK):
        if _libc().umount2(os.fsencode(target), _MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code == errno.EINVAL:  # not a mount point (any more)
                return count
            raise OSError(code, os.strerror(code), str(target))
    raise OSError(errno.EBUSY, f"more than {_MAX_STACK} mounts on it", str(target))


def top_mount(target: str, pid: int | str = "self") -> str | None:
    """What the topmost mount at ``target`` shows, as seen by process ``pid``: its root within its
    filesystem (``/ws/ID`` for a workspace of the pool), or ``None`` if nothing is mounted there.

    From ``/proc/PID/mountinfo``, which lists mounts in the order they were made.
    """
    return _last_at(target, 3, pid)


def _last_at(target: str, field: int, pid: int | str = "self") -> str | None:
    """Field ``field`` of the topmost mount at ``target`` in ``/proc/PID/mountinfo``, or ``None``."""
    found: str | None = None
    try:
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4] == target:
                    found = fields[field]
    except OSError:
        return None
    return found


def roots_in_use(mountpoint: str) -> set[str]:
    """Which parts of the filesystem mounted at ``mountpoint`` any process on this host has mounted.

    The roots (``/ws/ID``, ``/slot/ID``) of every mount of that filesystem,
    in every mount namespace on the host (each container has its own), except
    mounts at a path under ``mountpoint`` itself: those are the pool's own
    slots, or copies of them that shared propagation put in a namespace made
    from the host's (a daemon's private one), not a sandbox's use.  Read from
    ``/proc/PID/mountinfo``, one process per namespace; a process that exits
    meanwhile is skipped.  Root sees every namespace; another user may not,
    and gets fewer roots.
    """
    device = _last_at(mountpoint, 2)  # major:minor of the filesystem mounted there
    if device is None:
        return set()
    inside = mountpoint.rstrip("/") + "/"
    seen: set[str] = set()
    roots: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            ns = f"pid:{pid}"  # unreadable (gone, or not ours to read): read its mounts anyway
        if ns in seen:
            continue
        seen.add(ns)
        try:
            with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 5 or fields[2] != device or fields[3] == "/" or fields[4].startswith(inside):
                continue
            roots.add(fields[3])
    return roots
