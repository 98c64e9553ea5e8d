"""The warm-spare registry's logic (agentnest.state.spares), without an engine.

A spare here is a handle from a fake backend whose "agent" is the scripted one of
:class:`~agentnest.testing.fake.FakeBackend`: the registry connects a real
:class:`~agentnest.channel.client.Channel` to it (bundle out, hello back),
so liveness is the channel's own.  Each test uses its own ``_Spares()``,
never the process-wide ``SPARES``.  What a spare does on a real engine is in
tests/integration/test_warm_fork.py.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from agentnest._core import SandboxCore
from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.errors import BackendError
from agentnest.policy import NetworkPolicy
from agentnest.runtime.base import Capability, RuntimeBackend, SandboxHandle
from agentnest.state import spares
from agentnest.state.spares import MAX_FAILURES, SPARE_MAX_AGE, Spare, _same, _Spares
from agentnest.testing.fake import FakeBackend
from agentnest.testing.peer import Peer
from agentnest.testing.wait import wait_until

WAIT = 10.0
REPO = Path(__file__).resolve().parents[2]
WARM = frozenset({Capability.FORK, Capability.DISK_WORKSPACE, Capability.WARM_FORK})
CONFIG = SandboxConfig(
    image="img:1", lifetime=300, limits=ResourceLimits(workspace_medium="disk", workspace=64 << 20)
)


class SpareBackend(FakeBackend):
    """Makes spares on demand; records what it made and destroyed.  ``gate``/``destroy_gate`` hold calls.

    Each spare's agent is the FakeBackend's scripted one (``hello=False``: one that ends before its hello).
    """

    name = "spare-fake"

    def __init__(self, caps: frozenset[Capability] = WARM, *, fail: bool = False, hello: bool = True) -> None:
        super().__init__(caps=caps, starts=hello)
        self.fail = fail
        self.gate = threading.Event()
        self.gate.set()
        self.destroy_gate = threading.Event()
        self.destroy_gate.set()
        self.destroying = threading.Event()
        self.calls = 0
        self.made: list[str] = []

    @property
    def peers(self) -> dict[str, Peer]:
        """Each spare's agent (its far end)."""
        with self._lock:
            return {sid: found[-1] for sid, found in self.agents.items()}

    def create(self, config: SandboxConfig) -> SandboxHandle:
        raise AssertionError("the registry makes spares with create_spare, never create")

    def create_spare(self, config: SandboxConfig) -> SandboxHandle:
        with self._lock:
            self.calls += 1
        assert self.gate.wait(WAIT), "the test never opened the gate"
        if self.fail:
            raise BackendError("no room for a warm container")
        sid = uuid.uuid4().hex[:12]
        with self._lock:
            self.made.append(sid)
        return SandboxHandle(sid, self.name, time.time() + config.lifetime, {"config": config})

    def destroy(self, handle: SandboxHandle) -> None:
        self.destroying.set()
        assert self.destroy_gate.wait(WAIT), "the test never opened the destroy gate"
        super().destroy(handle)

    def live(self) -> list[str]:
        with self._lock:
            return [sid for sid in self.made if sid not in self.destroyed]

    def close_peers(self) -> None:
        with self._lock:
            peers, self.agents = [p for found in self.agents.values() for p in found], {}
        for peer in peers:
            peer.close()


class Parent:
    """What the registry reads of a sandbox that forked: its backend, config and whether it is gone."""

    def __init__(self, backend: RuntimeBackend, config: SandboxConfig = CONFIG) -> None:
        self.backend = backend
        self.config = config
        self.destroyed = False
        self.on_destroy: list[Any] = []


def parent(backend: RuntimeBackend, config: SandboxConfig = CONFIG) -> SandboxCore:
    return cast(SandboxCore, Parent(backend, config))


@pytest.fixture
def registry() -> Iterator[_Spares]:
    found = _Spares()
    try:
        yield found
    finally:
        found.close(wait=WAIT)


@pytest.fixture
def backend() -> Iterator[SpareBackend]:
    made = SpareBackend()
    try:
        yield made
    finally:
        made.gate.set()
        made.destroy_gate.set()
        made.close_peers()


def ready_one(registry: _Spares, sb: SandboxCore) -> None:
    registry.want(sb)
    assert registry.wait_idle(WAIT)
    assert registry.ready() == 1


def the_spare(registry: _Spares) -> Spare:
    (spare,) = registry._ready
    return spare


# -- _same: the lifetime, and nothing else, may differ -----------------------------------------

#: A different value for every field of SandboxConfig but the lifetime.
CHANGES: dict[str, Any] = {
    "image": "img:2",
    "environment": {"A": "1"},
    "workdir": "/work",
    "network": NetworkPolicy.open(),
    "limits": ResourceLimits(workspace_medium="disk", workspace=128 << 20),
    "read_only_root": False,
    "user": "1000:1000",
    "labels": {"team": "x"},
    "seccomp_profile": '{"defaultAction": "SCMP_ACT_ALLOW"}',
    "apparmor_profile": "other",
    "rootless": True,
    "proxy_image": "proxy:2",
    "preset": "browser",
}


def test_same_covers_every_field_of_the_configuration() -> None:
    # A field added to SandboxConfig must be listed here (and so judged by _same).
    assert set(CHANGES) | {"lifetime"} == {f.name for f in dataclasses.fields(SandboxConfig)}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_same_tells_apart_any_other_field(name: str) -> None:
    other = dataclasses.replace(CONFIG, **{name: CHANGES[name]})
    assert not _same(CONFIG, other) and not _same(other, CONFIG)
    # Even with the lifetime changed too.
    assert not _same(CONFIG, dataclasses.replace(other, lifetime=5))


def test_same_ignores_the_lifetime() -> None:
    assert _same(CONFIG, CONFIG)
    assert _same(CONFIG, dataclasses.replace(CONFIG, lifetime=5))
    assert _same(dataclasses.replace(CONFIG, lifetime=7200), CONFIG)
    # Equal values, not the same objects.
    assert _same(
        CONFIG, SandboxConfig(**{f.name: getattr(CONFIG, f.name) for f in dataclasses.fields(CONFIG)})
    )


# -- take --------------------------------------------------------------------------------------


def test_take_hands_the_ready_spare_to_the_same_backend_and_configuration_once(
    registry: _Spares, backend: SpareBackend
) -> None:
    sb = parent(backend)
    ready_one(registry, sb)
    (made,) = backend.made
    other_backend = SpareBackend()
    other_config = dataclasses.replace(CONFIG, image="img:2")
    # Not for another backend (even of the same kind), nor another configuration...
    assert registry.take(parent(other_backend), CONFIG) is None
    assert registry.take(sb, other_config) is None
    assert registry.ready() == 1 and backend.destroyed == []
    # ... but for this one, whatever the child's lifetime, and only once.
    spare = registry.take(sb, dataclasses.replace(CONFIG, lifetime=5))
    assert spare is not None and spare.handle.id == made and spare.backend is backend
    assert spare.channel.alive and spare.channel.hello is not None
    assert registry.take(sb, CONFIG) is None
    assert registry.ready() == 0 and registry.handles() == []
    assert backend.destroyed == []  # handed out, not destroyed: it becomes the child
    spare.discard()
    assert backend.destroyed == [made] and not spare.channel.alive


def test_an_old_spare_is_destroyed_not_handed_out(registry: _Spares, backend: SpareBackend) -> None:
    sb = parent(backend)
    ready_one(registry, sb)
    spare = the_spare(registry)
    # Its container's own deadline is near (the backend gives it lifetime + its maximum age).
    spare.born -= SPARE_MAX_AGE + 1
    assert registry.take(sb, CONFIG) is None
    assert backend.destroyed == [spare.handle.id] and not spare.channel.alive
    assert registry.ready() == 0


def test_a_spare_younger_than_the_maximum_age_is_handed_out(registry: _Spares, backend: SpareBackend) -> None:
    sb = parent(backend)
    ready_one(registry, sb)
    the_spare(registry).born -= SPARE_MAX_AGE - 5
    taken = registry.take(sb, CONFIG)
    assert taken is not None and backend.destroyed == []
    taken.discard()


def test_a_spare_whose_agent_died_is_destroyed_not_handed_out(
    registry: _Spares, backend: SpareBackend
) -> None:
    sb = parent(backend)
    ready_one(registry, sb)
    spare = the_spare(registry)
    backend.peers[spare.handle.id].sock.close()  # the agent (or its container) went away
    wait_until(lambda: not spare.channel.alive, "the channel noticing its agent is gone", within=WAIT)
    assert registry.take(sb, CONFIG) is None
    assert backend.destroyed == [spare.handle.id] and registry.ready() == 0


# -- want --------------------------------------------------------------------------------------


def test_want_makes_nothing_without_the_capability(registry: _Spares) -> None:
    cold = SpareBackend(WARM - {Capability.WARM_FORK})
    registry.want(parent(cold))
    assert registry.wait_idle(WAIT)
    assert cold.calls == 0 and registry.ready() == 0


def test_want_makes_one_spare_per_key_even_when_called_at_once(
    registry: _Spares, backend: SpareBackend
) -> None:
    backend.gate.clear()  # every spare stays "being made" until the gate opens
    parents = [parent(backend) for _ in range(8)]
    start = threading.Barrier(len(parents))

    def want(sb: SandboxCore) -> None:
        start.wait(WAIT)
        registry.want(sb)

    threads = [threading.Thread(target=want, args=(sb,)) for sb in parents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert backend.calls == 1
    assert not registry.wait_idle(0.05)  # still being made: the gate is shut
    backend.gate.set()
    assert registry.wait_idle(WAIT) and registry.ready() == 1
    # Ready now: asking again makes no other.
    for sb in parents:
        registry.want(sb)
    assert registry.wait_idle(WAIT) and backend.calls == 1
    # Another key gets its own: another configuration, another backend.  (The
    # registry holds its parents weakly: a collected sandbox wants nothing.)
    second = parent(backend, dataclasses.replace(CONFIG, image="img:2"))
    registry.want(second)
    other = SpareBackend()
    third = parent(other)
    try:
        registry.want(third)
        assert registry.wait_idle(WAIT)
        assert backend.calls == 2 and other.calls == 1 and registry.ready() == 3
    finally:
        registry.close(wait=WAIT)
        other.close_peers()


def test_want_stops_trying_after_repeated_failures(registry: _Spares) -> None:
    failing = SpareBackend(fail=True)
    sb = parent(failing)
    for attempt in range(1, MAX_FAILURES + 1):
        registry.want(sb)
        assert registry.wait_idle(WAIT)
        assert failing.calls == attempt and registry.ready() == 0
    registry.want(sb)
    assert registry.wait_idle(WAIT)
    assert failing.calls == MAX_FAILURES
    # Per configuration: another one is still tried.
    registry.want(parent(failing, dataclasses.replace(CONFIG, image="img:2")))
    assert registry.wait_idle(WAIT) and failing.calls == MAX_FAILURES + 1


def test_a_spare_whose_agent_never_answers_is_destroyed_and_counts_as_a_failure(registry: _Spares) -> None:
    mute = SpareBackend(hello=False)
    sb = parent(mute)
    for _ in range(MAX_FAILURES + 1):
        registry.want(sb)
        assert registry.wait_idle(WAIT)
    assert mute.calls == MAX_FAILURES and registry.ready() == 0
    assert sorted(mute.destroyed) == sorted(mute.made) and len(mute.made) == MAX_FAILURES


# -- forget and close --------------------------------------------------------------------------


def test_forget_keeps_the_spare_while_another_parent_wants_it(
    registry: _Spares, backend: SpareBackend
) -> None:
    first, second = parent(backend), parent(backend, dataclasses.replace(CONFIG, lifetime=60))
    other = parent(backend, dataclasses.replace(CONFIG, image="img:2"))
    for sb in (first, second, other):
        registry.want(sb)
    assert registry.wait_idle(WAIT) and registry.ready() == 2 and backend.calls == 2
    ours = next(s for s in registry._ready if s.config == CONFIG)
    # The second parent (same configuration, another lifetime) still wants it.
    registry.forget(first)
    assert registry.ready() == 2 and backend.destroyed == []
    # A destroyed parent wants nothing, even if it was not forgotten yet.
    cast(Parent, second).destroyed = True
    registry.forget(other)
    assert registry.ready() == 0
    assert sorted(backend.destroyed) == sorted(backend.made) and not ours.channel.alive


def test_forget_while_the_spare_is_being_made_destroys_it_when_done(
    registry: _Spares, backend: SpareBackend
) -> None:
    sb = parent(backend)
    backend.gate.clear()
    registry.want(sb)
    wait_until(lambda: backend.calls == 1, "the spare being made", within=WAIT)
    registry.forget(sb)
    backend.destroy_gate.clear()
    backend.gate.set()
    assert backend.destroying.wait(WAIT)
    # Still busy while it is being destroyed: wait_idle() covers that too (the
    # leak checks of the engine tests count containers right after it).
    assert not registry.wait_idle(0.2)
    backend.destroy_gate.set()
    assert registry.wait_idle(WAIT)
    assert registry.ready() == 0 and backend.destroyed == backend.made and len(backend.made) == 1


def test_a_parent_collected_without_destroy_wants_no_spare(registry: _Spares, backend: SpareBackend) -> None:
    # The registry holds parents weakly: a sandbox nobody references any more keeps no container warm.
    backend.gate.clear()
    sb = parent(backend)
    alive = weakref.ref(sb)
    registry.want(sb)
    del sb
    assert alive() is None
    backend.gate.set()
    assert registry.wait_idle(WAIT)
    assert backend.calls == 1 and registry.ready() == 0 and backend.destroyed == backend.made


def test_close_destroys_every_spare_and_makes_no_more(registry: _Spares, backend: SpareBackend) -> None:
    parents = [parent(backend, config) for config in (CONFIG, dataclasses.replace(CONFIG, image="img:2"))]
    for sb in parents:
        registry.want(sb)
    assert registry.wait_idle(WAIT) and registry.ready() == 2
    registry.close(wait=WAIT)
    assert registry.ready() == 0 and sorted(backend.destroyed) == sorted(backend.made)
    sb = parent(backend, dataclasses.replace(CONFIG, image="img:3"))
    registry.want(sb)
    assert registry.wait_idle(WAIT) and backend.calls == 2 and registry.ready() == 0
    assert registry.take(sb, sb.config) is None


def test_a_spare_finished_after_close_is_destroyed(registry: _Spares, backend: SpareBackend) -> None:
    backend.gate.clear()
    sb = parent(backend)
    registry.want(sb)
    wait_until(lambda: backend.calls == 1, "the spare being made", within=WAIT)
    closing = threading.Thread(target=registry.close, kwargs={"wait": WAIT})
    closing.start()
    backend.gate.set()
    closing.join(WAIT)
    assert not closing.is_alive()
    assert registry.ready() == 0 and backend.destroyed == backend.made and len(backend.made) == 1


#: A process that leaves a ready spare in SPARES and exits normally.
AT_EXIT = """
import sys, time
from agentnest.state.spares import SPARES, Spare

class Channel:
    alive = True
    def close(self, reason):
        pass

class Backend:
    def destroy(self, handle):
        with open(sys.argv[1], "w") as f:
            f.write(handle)

SPARES._ready.append(Spare(Backend(), None, "spare-1", Channel(), time.monotonic()))
"""


def test_the_process_wide_registry_destroys_its_spares_at_exit(tmp_path: Path) -> None:
    assert isinstance(spares.SPARES, _Spares)
    record = tmp_path / "destroyed"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    done = subprocess.run(
        [sys.executable, "-c", AT_EXIT, str(record)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert record.read_text() == "spare-1"
