"""Warm spares: a started container kept ready to become the next fork of a configuration.

A host-side fork costs a copy-on-write snapshot of the workspace (a few
milliseconds) plus a new container, whose start is most of the time (runc:
~250 ms here).  So after a sandbox forks on the host, a container of its
configuration is started in the background (``RuntimeBackend.create_spare``,
``Capability.WARM_FORK``), its agent already connected; the next fork of that
configuration claims it (``claim_spare``: the parent frozen for the snapshot,
the copy mounted into the waiting container, the deadline moved) and so
costs no container start.

A spare is no sandbox yet: nothing runs in it but the agent, it has no
workspace and nobody's files, no event names it and no approval is asked
for it.  It becomes one, with the usual ``sandbox.created`` and
``sandbox.forked`` events, inside the fork that claims it.  One spare per
configuration at most, kept while a sandbox that forked with that
configuration lives (and at most ``SPARE_MAX_AGE`` seconds); destroyed with
the last such sandbox and at interpreter exit.  A spare whose making fails
is simply not there: the fork creates its child from scratch.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..channel.client import Channel
from ..errors import AgentNestError
from ..runtime import launch
from ..runtime.base import Capability

if TYPE_CHECKING:
    from .._core import SandboxCore
    from ..config import SandboxConfig
    from ..runtime.base import RuntimeBackend, SandboxHandle

log = logging.getLogger("agentnest.spares")

#: A spare older than this is not handed out (its container's provisional
#: deadline is its creation plus the backend's maximum age, 300 s on Docker).
SPARE_MAX_AGE = 240.0
#: After this many failed attempts to make a spare of one configuration, stop trying for it.
MAX_FAILURES = 3


@dataclass(eq=False)
class Spare:
    """A started container of ``config`` with its agent connected, not yet a sandbox."""

    backend: RuntimeBackend
    config: SandboxConfig
    handle: SandboxHandle
    channel: Channel
    born: float

    def discard(self) -> None:
        """Close its channel and destroy its container (best effort: a spare has no owner to tell)."""
        self.channel.close("the warm container was discarded")
        try:
            self.backend.destroy(self.handle)
        except AgentNestError as exc:
            log.warning("could not destroy warm container %s: %s", self.handle.id, exc)


def _same(a: SandboxConfig, b: SandboxConfig) -> bool:
    """Whether a spare made for ``a`` can become a sandbox of ``b`` (the lifetime is set at the claim)."""
    return dataclasses.replace(a, lifetime=b.lifetime) == b


class _Spares:
    """The process's spares, at most one per (backend, configuration).  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: list[Spare] = []
        self._making: list[tuple[RuntimeBackend, SandboxConfig, threading.Thread]] = []
        self._failures: list[tuple[RuntimeBackend, SandboxConfig, int]] = []
        # Sandboxes that forked on the host and may fork again.
        self._parents: weakref.WeakSet[SandboxCore] = weakref.WeakSet()
        self._closed = False

    def take(self, parent: SandboxCore, config: SandboxConfig) -> Spare | None:
        """The ready spare for a child of ``parent`` with ``config``, removed from the registry."""
        found: Spare | None = None
        with self._lock:
            for spare in self._ready:
                if spare.backend is parent.backend and _same(spare.config, config):
                    found = spare
                    self._ready.remove(spare)
                    break
        if found is None:
            return None
        if time.monotonic() - found.born > SPARE_MAX_AGE or not found.channel.alive:
            found.discard()
            return None
        return found

    def want(self, parent: SandboxCore) -> None:
        """Have a spare of ``parent``'s configuration ready for its next fork (made in the background)."""
        backend, config = parent.backend, parent.config
        if Capability.WARM_FORK not in backend.capabilities():
            return
        with self._lock:
            if self._closed:
                return
            self._parents.add(parent)
            if self.forget not in parent.on_destroy:
                parent.on_destroy.append(self.forget)  # its spares go when no live sandbox wants them
            if any(b is backend and _same(c, config) for b, c, _ in self._making):
                return
            if any(s.backend is backend and _same(s.config, config) for s in self._ready):
                return
            if any(b is backend and _same(c, config) and n >= MAX_FAILURES for b, c, n in self._failures):
                return
            thread = threading.Thread(
                target=self._make, args=(backend, config), name="agentnest-spare", daemon=True
            )
            self._making.append((backend, config, thread))
        thread.start()

    def forget(self, parent: SandboxCore) -> None:
        """``parent`` is gone: drop the spares that no live sandbox wants any more."""
        with self._lock:
            self._parents.discard(parent)
            wanted = [(p.backend, p.config) for p in self._parents if not p.destroyed]
            unwanted = [
                s for s in self._ready if not any(b is s.backend and _same(s.config, c) for b, c in wanted)
            ]
            for spare in unwanted:
                self._ready.remove(spare)
        for spare in unwanted:
            spare.discard()

    def _make(self, backend: RuntimeBackend, config: SandboxConfig) -> None:
        spare: Spare | None = None
        try:
            handle = backend.create_spare(config)
            try:
                channel = Channel.connect(backend.open_channel(handle), launch.bundle(), timeout=60.0)
            except BaseException:
                backend.destroy(handle)
                raise
            spare = Spare(backend, config, handle, channel, time.monotonic())
        except AgentNestError as exc:
            # Nobody waits for it: the next fork makes its child from scratch.
            log.info("no warm container for the next fork (%s)", exc)
            self._failed(backend, config)
        finally:
            with self._lock:
                keep = spare is not None and not self._closed
                if keep and spare is not None:
                    keep = any(p.backend is backend and _same(config, p.config) for p in self._parents)
                    if keep:
                        self._ready.append(spare)
            try:
                if spare is not None and not keep:
                    spare.discard()
            finally:
                # Only now: wait_idle() and close() return once an unwanted
                # spare's container is gone, not while it is being removed.
                with self._lock:
                    self._making = [m for m in self._making if m[2] is not threading.current_thread()]

    def _failed(self, backend: RuntimeBackend, config: SandboxConfig) -> None:
        with self._lock:
            for i, (b, c, n) in enumerate(self._failures):
                if b is backend and _same(c, config):
                    self._failures[i] = (b, c, n + 1)
                    return
            self._failures.append((backend, config, 1))

    def close(self, wait: float = 30.0) -> None:
        """Destroy every spare, after those being made are done (at interpreter exit)."""
        with self._lock:
            self._closed = True
            making = [t for _, _, t in self._making]
        until = time.monotonic() + wait
        for thread in making:
            thread.join(max(0.0, until - time.monotonic()))
        with self._lock:
            ready, self._ready = self._ready, []
        for spare in ready:
            spare.discard()

    def ready(self) -> int:
        """How many spares are ready now (for tests and ``doctor``)."""
        with self._lock:
            return len(self._ready)

    def handles(self) -> list[SandboxHandle]:
        """The backend handles of the spares ready now (for tests: they are no leak)."""
        with self._lock:
            return [s.handle for s in self._ready]

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no spare is being made; ``False`` on timeout (for tests and benchmarks)."""
        until = time.monotonic() + timeout
        while True:
            with self._lock:
                making = [t for _, _, t in self._making]
            if not making:
                return True
            for thread in making:
                thread.join(max(0.0, until - time.monotonic()))
            if time.monotonic() >= until:
                return False


SPARES = _Spares()
atexit.register(SPARES.close)
