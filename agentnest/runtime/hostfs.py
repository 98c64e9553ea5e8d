"""Workspace files from the host side: the fast path for a local disk workspace.

This module decides whether the host may touch a sandbox's workspace itself
(:func:`host_workspace`) and does ``read_file`` and ``write_file`` there.

The same code as the agent's (:class:`agentnest.agent.files.Workspace`: every
path walked one component at a time from a descriptor of the workspace root
with ``O_NOFOLLOW``, a symlink anywhere refused, writes to a temp file
renamed into place), run in this process on the workspace's directory in the
storage pool, so no byte crosses the agent channel.

It runs in one worker thread per sandbox identity whose *filesystem* UID and
GID are the sandbox's (``setfsuid``/``setfsgid`` are per thread on Linux, and
a non-zero fsuid drops the thread's file capabilities): the kernel checks
each access as it would for the sandbox's own process, and what is created
belongs to the sandbox, never to root.  Nothing else of this process changes.
Where that cannot be set up (not Linux, not root), callers use the channel.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..agent.files import FileError, Workspace
from ..errors import FileAccessError, FileTooLargeError
from .launch import host_python

if TYPE_CHECKING:
    from .base import HostTarget


def become(uid: int, gid: int) -> None:
    """Make this thread's filesystem UID and GID ``uid:gid`` (``setfsuid``/``setfsgid``: per thread).

    A non-zero fsuid also drops the thread's file capabilities: the kernel
    checks each access as it would for the sandbox's own process, and what
    the thread creates belongs to the sandbox.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setfsgid(gid)  # the group first, while the thread may still change it
    libc.setfsuid(uid)
    # Each call returns the previous value; an invalid one (-1) changes nothing.
    if libc.setfsuid(-1) != uid or libc.setfsgid(-1) != gid:
        raise OSError("setfsuid/setfsgid did not take effect")


def host_workspace(sandbox: HostTarget, *, write: bool = False) -> Path | None:
    """The sandbox's workspace directory on this host when the fast path applies, else ``None``.

    ``write``: the host writes there (see ``RuntimeBackend.workspace_path``).
    """
    path = sandbox.backend.workspace_path(sandbox.handle, write=write)
    if path is None or host_python() is None or not sandbox.config.user.replace(":", "").isdigit():
        return None
    return path


T = TypeVar("T")
_workers: dict[tuple[int, int], concurrent.futures.ThreadPoolExecutor | None] = {}
_lock = threading.Lock()


def _worker(uid: int, gid: int) -> concurrent.futures.ThreadPoolExecutor | None:
    """The thread that acts as ``uid:gid``, or ``None`` where there can be none."""
    key = (uid, gid)
    with _lock:
        if key in _workers:
            return _workers[key]
        pool: concurrent.futures.ThreadPoolExecutor | None = None
        if os.geteuid() == 0 and uid != 0:
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"agentnest-fs-{uid}", initializer=become, initargs=key
            )
            try:
                pool.submit(int).result(timeout=10)  # runs the initializer: check it worked
            except Exception:
                pool.shutdown(wait=False)
                pool = None
        _workers[key] = pool
        return pool


def _call(sandbox: HostTarget, path: Path, rel: str, fn: Callable[[Workspace], T]) -> tuple[bool, T | None]:
    """``(True, fn(workspace))`` on the host as the sandbox's user, or ``(False, None)``: use the channel."""
    uid, _, gid = sandbox.config.user.partition(":")
    worker = _worker(int(uid), int(gid or uid))
    if worker is None:
        return False, None

    def job() -> T:
        workspace = Workspace(str(path))
        try:
            return fn(workspace)
        finally:
            fd = workspace._root_fd
            if fd is not None:
                os.close(fd)

    try:
        return True, worker.submit(job).result()
    except FileError as exc:  # the agent's codes and messages, as the channel would carry them
        if exc.code == "not_found" and sandbox.backend.workspace_path(sandbox.handle, complete=True) is None:
            # Not on the host is not always not in the sandbox (gVisor keeps
            # FIFOs and sockets made inside in its own kernel): the agent decides.
            return False, None
        if exc.code == "too_large":
            raise FileTooLargeError(exc.message, path=rel) from None
        raise FileAccessError(exc.message, path=rel, code=exc.code) from None
    except OSError:
        # Not one of the agent's file errors: the workspace itself is out of
        # reach here (the sandbox being destroyed meanwhile, say).  The channel
        # tells the caller what became of the sandbox.
        return False, None


def read(sandbox: HostTarget, rel: str, max_bytes: int) -> bytes | None:
    """The file's bytes read on the host, or ``None`` when the channel must do it."""
    path = host_workspace(sandbox)
    if path is None:
        return None
    done, data = _call(sandbox, path, rel, lambda ws: b"".join(ws.read(rel, max_bytes)))
    return data if done else None


def write(sandbox: HostTarget, rel: str, data: bytes, mode: int) -> bool:
    """Write the file on the host; ``False`` when the channel must do it."""
    path = host_workspace(sandbox, write=True)
    if path is None:
        return False
    # The agent numbers its own writes from 1; these temp names cannot meet its.
    wid = int.from_bytes(os.urandom(6), "big") | 1 << 48
    done, _ = _call(sandbox, path, rel, lambda ws: ws.write_chunk(wid, rel, mode, data, True, True))
    return done
