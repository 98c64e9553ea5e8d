"""Warm pools of ``agentnest serve``: sandboxes started ahead of time, claimed by a create.

A pool is named in the server's configuration (``agentnest serve --pools
FILE``): an image, a backend and the sandbox's resources, with a band of
warm sandboxes (``min`` ready, at most ``max`` warm in all) refilled at a
paced rate.  A create with ``"pool": NAME`` claims a ready one: the claim
goes through admission like any create (the tenant's caps, rate and turn),
and the warm sandbox's share of the server moves to the tenant (it was
counted already, so it needs no new room).  When the pool is drained the
request's ``when_drained`` (or the pool's) decides: ``cold`` starts one the
usual way, ``wait`` waits for the next warm one up to ``max_wait``, ``fail``
answers 429 ``pool_empty`` at once.

Warm sandboxes are never reused: a claimed one is the tenant's until it is
destroyed, so every claim gets a sandbox no one has used.  Refills run at the
lowest priority: only while no create waits in the admission queue and
within the server's capacity, so a pool never takes room a waiting client
needs.  A warm sandbox nearing the end of its ``lifetime`` is replaced.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..aio import AsyncSandbox
from ..config import parse_size
from ..errors import AgentNestError, ConfigurationError
from .admission import Admission, Grant, Rejected, Resources
from .tenants import Tenant

log = logging.getLogger("agentnest.server")

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
DRAINED = ("cold", "wait", "fail")
#: A warm sandbox with less than this share of its lifetime left is replaced.
RECYCLE_AT = 0.25
#: Seconds between looks at the pools when nothing wakes the loop (deadlines, capacity).
POOL_TICK = 1.0
#: After a failed warm start, the pool waits this long (doubling, up to 60 s) before the next.
FAILURE_BACKOFF = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class PoolSpec:
    """One named pool, as the operator writes it."""

    name: str
    image: str | None = None
    """None: the server's default image."""
    backend: str | None = None
    """None: the server's default backend."""
    memory: int = 256 * 1024 * 1024
    cpus: float = 1.0
    pids: int = 256
    min: int = 1
    """Warm sandboxes kept ready."""
    max: int = 4
    """Warm sandboxes in all (ready and starting); ``wait`` claims may fill up to it."""
    refill_rate: float = 1.0
    """Warm starts per second at most."""
    lifetime: float = 900.0
    """A warm sandbox's lifetime; it is replaced when a quarter is left."""
    when_drained: str = "cold"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"pool name {self.name!r:.80} must be 1-40 lowercase letters, digits or '-'"
            )
        for name in ("image", "backend"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigurationError(f"pool {self.name}: {name} must be a non-empty string")
        memory = getattr(self, "memory")  # noqa: B009 - typed int, but a file may say "512m"
        if isinstance(memory, str):
            object.__setattr__(self, "memory", parse_size(memory, f"pool {self.name}: memory"))
        elif isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
            raise ConfigurationError(f"pool {self.name}: memory={memory!r} must be a positive size")
        for name in ("pids", "min", "max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10_000:
                raise ConfigurationError(
                    f"pool {self.name}: {name}={value!r} must be an integer from 0 to 10000"
                )
        if self.pids < 1 or self.max < 1 or self.min > self.max:
            raise ConfigurationError(
                f"pool {self.name}: need pids >= 1, max >= 1 and min <= max (min={self.min}, max={self.max})"
            )
        for name in ("cpus", "refill_rate", "lifetime"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"pool {self.name}: {name}={value!r} must be a positive number")
            object.__setattr__(self, name, float(value))
        if self.lifetime < 60:
            raise ConfigurationError(f"pool {self.name}: lifetime={self.lifetime:g}s must be at least 60 s")
        if self.when_drained not in DRAINED:
            raise ConfigurationError(
                f"pool {self.name}: when_drained={self.when_drained!r} must be one of {list(DRAINED)}"
            )

    @property
    def demand(self) -> Resources:
        return Resources(1, self.memory, self.cpus)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolSpec:
        if not isinstance(data, Mapping):
            raise ConfigurationError("a pool must be an object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigurationError(
                f"pool {data.get('name', '?')!r:.40}: unknown fields {sorted(unknown)}; "
                f"known: {sorted(known)}"
            )
        if "name" not in data:
            raise ConfigurationError("a pool needs a name")
        return cls(**dict(data))


def load_pools(path: Path | str) -> list[PoolSpec]:
    """The pools of a JSON (or, with PyYAML, YAML) file: ``{"pools": [{...}, ...]}``.

    Raises:
        ConfigurationError: unreadable, malformed, or a pool spec that is wrong (named).
    """
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read the pools file {path}: {exc.strerror or exc}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigurationError(
                f"{path}: YAML needs PyYAML (pip install pyyaml), or write JSON"
            ) from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"{path}: not valid YAML: {exc}") from None
    else:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("pools"), list):
        raise ConfigurationError(f'{path}: expected {{"pools": [ ... ]}}')
    pools = [PoolSpec.from_dict(item) for item in doc["pools"]]
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{path}: pool names must be unique ({names})")
    return pools


@dataclasses.dataclass
class Warm:
    """A ready warm sandbox and what it holds of the server."""

    sandbox: AsyncSandbox
    grant: Grant


class WarmPool:
    """One pool's warm sandboxes and its refill state (on the server's event loop)."""

    def __init__(self, spec: PoolSpec, backend_name: str, image: str) -> None:
        self.spec = spec
        self.backend_name = backend_name
        self.image = image
        self.ready: collections.deque[Warm] = collections.deque()
        self.starting = 0
        self.waiting = 0
        """Claims with ``when_drained="wait"`` waiting now."""
        self.changed = asyncio.Event()
        self.claimed = 0
        self.created = 0
        self.failures = 0
        self.below_min_since: float | None = None
        self.next_start = 0.0
        self.backoff = FAILURE_BACKOFF
        self.tasks: set[asyncio.Future[None]] = set()
        self.closing = False
        # The pool holds its warm sandboxes as a tenant of its own: lowest band, its own
        # pace as the create rate, never more than max at once.
        self.tenant = Tenant.for_pool(spec.name, max_sandboxes=spec.max, rate=spec.refill_rate)

    def wanted(self) -> int:
        """How many more warm sandboxes to start now: ``min`` ready, plus one per waiting claim,
        never more than ``max`` warm in all."""
        target = min(self.spec.max, self.spec.min + self.waiting)
        return max(0, target - len(self.ready) - self.starting)

    def refill_lag(self, now: float) -> float:
        """Seconds the pool has been below its minimum of ready sandboxes (0 when it is not)."""
        return 0.0 if self.below_min_since is None else now - self.below_min_since

    def note_level(self, now: float) -> None:
        if len(self.ready) < self.spec.min:
            if self.below_min_since is None:
                self.below_min_since = now
        else:
            self.below_min_since = None

    def take(self) -> Warm | None:
        """A ready sandbox that is alive and has a good part of its lifetime left, or None."""
        now = time.time()
        while self.ready:
            warm = self.ready.popleft()
            left = warm.sandbox.deadline - now
            if not warm.sandbox.destroyed and left > RECYCLE_AT * self.spec.lifetime:
                self.note_level(time.monotonic())
                return warm
            self.ready.append(warm)  # stale: the refill loop replaces it
            break
        self.note_level(time.monotonic())
        return None

    def put_back(self, warm: Warm) -> None:
        self.ready.appendleft(warm)
        self.note_level(time.monotonic())
        self._wake()

    def _wake(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def wait_for_one(self, deadline: float) -> Warm | None:
        """Wait (up to ``deadline``, monotonic) for a ready sandbox and take it."""
        self.waiting += 1
        try:
            while True:
                warm = self.take()
                if warm is not None:
                    return warm
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                event = self.changed
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    return None
        finally:
            self.waiting -= 1

    async def refill(
        self,
        admission: Admission,
        start: Callable[[PoolSpec, str, str], Awaitable[AsyncSandbox]],
        destroy: Callable[[AsyncSandbox], Awaitable[None]],
        confirm: Callable[[Grant, Tenant], Awaitable[str | None]] | None = None,
    ) -> None:
        """One step of the refill loop: replace stale warm sandboxes, start what is wanted.

        ``confirm`` is the shared admission of replicas (:mod:`agentnest.server.shared`):
        a warm start it refuses is not made."""
        now = time.time()
        for warm in list(self.ready):
            if warm.sandbox.destroyed or warm.sandbox.deadline - now <= RECYCLE_AT * self.spec.lifetime:
                self.ready.remove(warm)
                admission.release(warm.grant)
                await destroy(warm.sandbox)
        clock = time.monotonic()
        self.note_level(clock)
        if self.closing or admission.queued or clock < self.next_start:
            return  # clients waiting for admission come first; failures back off
        for _ in range(self.wanted()):
            try:
                ticket = admission.submit(self.tenant, self.spec.demand, max_wait=0)
            except Rejected:
                return
            if not ticket.future.done():  # no room or no token now: try on a later step
                admission.withdraw(ticket)
                return
            grant = ticket.future.result()
            self.starting += 1
            task = asyncio.ensure_future(self._start_one(admission, start, grant, confirm))
            self.tasks.add(task)  # kept until done: the loop holds only weak references
            task.add_done_callback(self.tasks.discard)

    async def _start_one(
        self,
        admission: Admission,
        start: Callable[[PoolSpec, str, str], Awaitable[AsyncSandbox]],
        grant: Grant,
        confirm: Callable[[Grant, Tenant], Awaitable[str | None]] | None = None,
    ) -> None:
        if confirm is not None:
            try:
                refused: str | None = await confirm(grant, self.tenant)
            except AgentNestError as exc:
                refused = str(exc)
            except BaseException:
                self.starting -= 1
                admission.revoke(grant)
                raise
            if refused is not None:
                # The other replicas hold the room: try again on a later step.
                self.starting -= 1
                admission.revoke(grant)
                self.next_start = time.monotonic() + self.backoff
                log.debug("pool %s: no warm start now: %s", self.spec.name, refused)
                return
        try:
            sandbox = await start(self.spec, self.backend_name, self.image)
        except (AgentNestError, OSError) as exc:
            admission.release(grant)
            self.failures += 1
            self.next_start = time.monotonic() + self.backoff
            log.warning(
                "pool %s: a warm start failed (next try in %.0fs): %s", self.spec.name, self.backoff, exc
            )
            self.backoff = min(60.0, self.backoff * 2)
            return
        except BaseException:
            admission.release(grant)
            raise
        finally:
            self.starting -= 1
        self.backoff = FAILURE_BACKOFF
        self.created += 1
        self.ready.append(Warm(sandbox, grant))
        self.note_level(time.monotonic())
        self._wake()

    async def close(self, admission: Admission, destroy: Callable[[AsyncSandbox], Awaitable[None]]) -> None:
        # Starts in flight finish (a start cancelled half-way could leave a container behind),
        # then everything warm is destroyed.
        self.closing = True
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        while self.ready:
            warm = self.ready.popleft()
            admission.release(warm.grant)
            await destroy(warm.sandbox)


def pool_specs(items: Sequence[PoolSpec]) -> dict[str, PoolSpec]:
    names = [p.name for p in items]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"pool names must be unique ({names})")
    return {p.name: p for p in items}


__all__ = ["DRAINED", "PoolSpec", "Warm", "WarmPool", "load_pools", "pool_specs"]
