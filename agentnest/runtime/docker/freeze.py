"""Freezing a sandbox's processes for the instant of a copy, or for a user's pause.

The container's freezer cgroup directly where it is on this host (what
``docker pause`` uses on runc, without two engine round trips), else the
engine's pause.  Holders are counted: a fork's unfreeze never resumes a
sandbox someone else (another fork, or its owner's ``pause()``) still holds.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..base import SandboxHandle
from .engine import explain, map_docker_errors

__all__ = ["Freeze", "Freezer", "cgroup_freeze", "state"]


def state(handle: SandboxHandle) -> Freeze:
    """The freeze bookkeeping of a sandbox (made on first use)."""
    found = handle.info.setdefault("freeze", Freeze())
    assert isinstance(found, Freeze)
    return found


class Freeze:
    """How many holders want a sandbox frozen right now (see :meth:`Freezer.frozen`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        # Whether the owner's pause() is one of the holders; user_lock orders
        # pause against resume (taken before ``lock``, never the other way).
        self.user = False
        self.user_lock = threading.Lock()
        self.how = "docker"  # how the current freeze was made: thawed the same way
        # The owner's pause is a gVisor checkpoint: the container is stopped.
        self.checkpointed = False


class Freezer:
    """Stops and continues one engine's containers: the freezer cgroup, else ``docker pause``.

    Holders are counted per sandbox (its handle's ``info["freeze"]``, a
    :class:`Freeze`): nested and concurrent freezes share one pause.
    """

    def __init__(self, api: Callable[[], Any]) -> None:
        self._api = api  # the backend's engine client, made on first use

    @property
    def api(self) -> Any:
        return self._api()

    @contextlib.contextmanager
    def frozen(self, handle: SandboxHandle) -> Iterator[None]:
        # The freezer cgroup on runc, `runsc pause` on gVisor: every process
        # stops where it is, memory kept; nothing writes the workspace meanwhile.
        # Nested and concurrent freezes (parallel forks of one parent) share
        # one pause: the first pauses, the last resumes.
        # A user's pause() is one more holder (see pause), so a fork's unfreeze
        # never resumes a sandbox its owner paused.
        self.hold(handle)
        try:
            yield
        finally:
            self.release(handle)

    def hold(self, handle: SandboxHandle, *, fast: bool = True) -> None:
        cid = handle.info["container"]
        freeze = handle.info.setdefault("freeze", Freeze())
        with freeze.lock:
            if freeze.count == 0:
                freeze.how = self._pause(cid, fast=fast)
            freeze.count += 1

    def release(self, handle: SandboxHandle) -> None:
        cid = handle.info["container"]
        freeze = handle.info.setdefault("freeze", Freeze())
        with freeze.lock:
            freeze.count -= 1
            if freeze.count == 0:
                self._unpause(cid, freeze.how)

    def _pause(self, cid: str, *, fast: bool = True) -> str:
        """Freeze the container; return how (``"cgroup"`` or ``"docker"``), for :meth:`_unpause`.

        On this host, the container's freezer cgroup directly: the same freezer
        ``docker pause`` uses on runc, without two engine round trips (~2 ms
        instead of 40-150 ms measured here; a fork or snapshot holds it for
        milliseconds).  Else ``docker pause``, tried again a few times: runc's
        cgroup-v1 freezer gives up ("unable to freeze") when a task does not stop
        in time, e.g. one in uninterruptible sleep under heavy writeback
        (measured here right after 100 MiB were written); a moment later it works.
        """
        import docker.errors

        if fast and cgroup_freeze(cid, True):
            return "cgroup"
        for attempt in range(6):
            try:
                self.api.pause(cid)
                return "docker"
            except docker.errors.APIError as exc:
                if "unable to freeze" not in explain(exc) or attempt == 5:
                    with map_docker_errors("pausing the sandbox"):
                        raise
                time.sleep(0.02 * 2**attempt)  # backoff between retries: 20 ms to 320 ms
        raise AssertionError("unreachable")  # pragma: no cover

    def _unpause(self, cid: str, how: str) -> None:
        if how == "cgroup" and cgroup_freeze(cid, False):
            return
        with map_docker_errors("resuming the sandbox"):
            self.api.unpause(cid)


#: Where a container's freezer lives: cgroup v1 (cgroupfs driver), v2 cgroupfs, v2 systemd.
FREEZERS = (
    ("/sys/fs/cgroup/freezer/docker/{}/freezer.state", "FROZEN", "THAWED"),
    ("/sys/fs/cgroup/docker/{}/cgroup.freeze", "1", "0"),
    ("/sys/fs/cgroup/system.slice/docker-{}.scope/cgroup.freeze", "1", "0"),
)


def cgroup_freeze(cid: str, on: bool) -> bool:
    """Freeze (or thaw) container ``cid`` through its freezer cgroup; False where there is none.

    Freezing waits until the kernel reports every task frozen (bounded: 2 s);
    one that will not freeze is thawed again and False returned, so the caller
    falls back to ``docker pause``.
    """
    if not all(c in "0123456789abcdef" for c in cid) or len(cid) != 64:
        return False
    for template, frozen, thawed in FREEZERS:
        path = template.format(cid)
        if not os.path.exists(path):
            continue
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(frozen if on else thawed)
            if not on:
                return True
            until = time.monotonic() + 2.0
            while time.monotonic() < until:
                if is_frozen(path):
                    return True
                time.sleep(0.001)  # the kernel's freezing is asynchronous: poll its state
            with open(path, "w", encoding="ascii") as f:
                f.write(thawed)
        except OSError:
            return False
        return False
    return False


def is_frozen(path: str) -> bool:
    if path.endswith("freezer.state"):
        with open(path, encoding="ascii") as f:
            return f.read().strip() == "FROZEN"
    events = path.rsplit("/", 1)[0] + "/cgroup.events"
    with open(events, encoding="ascii") as f:
        return "frozen 1" in f.read()
