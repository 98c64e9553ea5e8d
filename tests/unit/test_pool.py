"""SandboxPool and AsyncSandboxPool logic (pool.py) with fake sandboxes: no engine.

The fakes stand in for what the pool touches of a ``Sandbox``: ``destroy``,
``destroyed``, ``deadline``, ``config.workdir``/``read_only_root``, ``exec``
(the clean reset), ``handle.info`` (the egress log) and the channel's
``request`` (the health ping), ``alive``, ``hello`` and session calls.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest

from agentnest import (
    AsyncSandbox,
    AsyncSandboxPool,
    ConfigurationError,
    PoolExhaustedError,
    PoolFactoryError,
    Sandbox,
    SandboxPool,
)
from agentnest._core import Command, SandboxCore, bind, core_of
from agentnest.errors import ChannelError
from agentnest.pool import CLEAN_SCRIPT
from agentnest.runtime.docker.egress import EgressLog
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0


class FakeSandbox:
    """What the pool uses of a Sandbox, scripted."""

    _ids = itertools.count(1)

    def __init__(self, factory: Factory, lifetime: float = 3600.0) -> None:
        self.id = f"fake-{next(self._ids)}"
        self._factory = factory
        self.deadline = time.time() + lifetime
        self.destroyed = False
        self.destroy_calls = 0
        self.config = SimpleNamespace(workdir="/workspace", read_only_root=True, secret_files={})
        self.handle = SimpleNamespace(info={})
        self.healthy = True
        self.clean_ok = True
        self.pings = 0
        self.cleans = 0
        self.clean_gate = threading.Event()
        self.clean_gate.set()
        #: None: no channel object, so every acquire pings; set to self to model an open one.
        self.channel: FakeSandbox | None = None
        self.alive = True
        self.hello: Any = None  # no capabilities: no session calls
        self.sessions_left: list[int] = []
        self.closed_sessions: list[int] = []
        self.guard: Any = None  # what a Sandbox face of it reads (no redaction here)
        bind(self, cast(SandboxCore, self))  # its own core: the pool reaches it through core_of

    def destroy(self) -> None:
        self.destroy_calls += 1
        if not self.destroyed:
            self.destroyed = True
            self._factory.gone(self)

    def link(self) -> FakeSandbox:
        return self

    def run(self, command: Command) -> Any:
        return self.exec(list(command.argv), timeout=command.timeout)

    def request(self, header: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        assert header["t"] == "ping"
        self.pings += 1
        if not self.healthy:
            raise ChannelError("the fake agent is gone")
        return {"t": "pong"}

    def list_sessions(self, deadline: float | None) -> tuple[Any, ...]:
        return tuple(SimpleNamespace(session=sid) for sid in self.sessions_left)

    def session_call(self, header: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        assert header["t"] == "session.close"
        self.sessions_left.remove(header["session"])
        self.closed_sessions.append(header["session"])
        return {"t": "done"}

    def exec(self, argv: list[str], *, timeout: float | None = None) -> Any:
        assert argv[:3] == ["/bin/sh", "-c", CLEAN_SCRIPT] and argv[4] == "/workspace"
        self.clean_gate.wait(WAIT)
        self.cleans += 1
        ok = self.clean_ok
        killed = "killed\n" if self.sessions_left else ""  # a session is a process the script kills
        return SimpleNamespace(exit_code=0 if ok else 1, stdout=killed + "clean\n" if ok else "")


class Factory:
    """Makes fakes; can block or fail on demand; checks the pool's bound."""

    def __init__(self, lifetime: float = 3600.0) -> None:
        self.lifetime = lifetime
        self.lock = threading.Lock()
        self.made: list[FakeSandbox] = []
        self.calls = 0
        self.alive = 0  # from the factory call to the end of destroy()
        self.max_alive = 0
        self.fail: BaseException | None = None
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self) -> Sandbox:
        with self.lock:
            self.calls += 1
            self.alive += 1
            self.max_alive = max(self.max_alive, self.alive)
        self.gate.wait(WAIT)
        if self.fail is not None:
            with self.lock:
                self.alive -= 1
            raise self.fail
        sandbox = FakeSandbox(self, self.lifetime)
        with self.lock:
            self.made.append(sandbox)
        return cast(Sandbox, sandbox)

    def gone(self, sandbox: FakeSandbox) -> None:
        with self.lock:
            self.alive -= 1


def fake(sandbox: Sandbox) -> FakeSandbox:
    found: object = sandbox
    assert isinstance(found, FakeSandbox)
    return found


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def pools() -> Iterator[list[SandboxPool]]:
    """Pools made by a test; closed afterwards even if it failed."""
    made: list[SandboxPool] = []
    yield made
    for pool in made:
        pool.close()


def make_pool(
    pools: list[SandboxPool], factory: Callable[[], Sandbox], size: int = 2, **kwargs: Any
) -> SandboxPool:
    pool = SandboxPool(factory, size, **kwargs)
    pools.append(pool)
    return pool


# -- arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": 0},
        {"size": True},
        {"size": 2.5},
        {"max_uses": 0},
        {"acquire_timeout": 0},
        {"acquire_timeout": -1},
        {"acquire_timeout": "5"},
        {"reset": "wipe"},
    ],
)
def test_bad_arguments_are_refused(factory: Factory, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        SandboxPool(factory, **kwargs)


def test_factory_must_be_callable() -> None:
    with pytest.raises(ConfigurationError):
        SandboxPool(cast(Any, "not callable"))


def test_bad_acquire_timeout_is_refused(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory)
    with pytest.raises(ConfigurationError), pool.acquire(timeout=-1):
        pass


# -- warming and lending -------------------------------------------------------------------


def test_nothing_is_created_before_start(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=3)
    assert factory.calls == 0
    assert pool.stats.idle == 0 and pool.stats.created == 0
    pool.start(wait=True)
    stats = pool.stats
    assert (stats.created, stats.idle, stats.in_use, stats.creating) == (3, 3, 0, 0)
    assert factory.calls == 3


def test_first_acquire_starts_the_pool(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=3, reset="destroy")
    with pool.acquire() as sandbox:
        assert fake(sandbox) in factory.made
        assert pool.stats.in_use == 1
    wait_until(lambda: pool.stats.created == 4, "the warm-up and the replacement")


def test_destroy_reset_destroys_after_use_and_replaces(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=2, reset="destroy")
    pool.start(wait=True)
    with pool.acquire() as sandbox:
        used = fake(sandbox)
        assert used.pings == 1  # health-checked on acquire
    wait_until(lambda: used.destroyed, "the used sandbox's destruction")
    wait_until(lambda: pool.stats.idle == 2, "the replacement")
    stats = pool.stats
    assert (stats.created, stats.destroyed, stats.in_use) == (3, 1, 0)
    assert used.cleans == 0


def test_an_exception_in_the_block_still_releases(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1, acquire_timeout=5)
    with pytest.raises(KeyError), pool.acquire():
        raise KeyError("boom")
    with pool.acquire() as sandbox:
        assert not sandbox.destroyed
    assert pool.stats.in_use == 0


def test_clean_reset_reuses_until_max_uses(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1, reset="clean", max_uses=3)
    seen = []
    for _ in range(4):
        with pool.acquire() as sandbox:
            seen.append(fake(sandbox))
    first = seen[0]
    assert seen[:3] == [first] * 3
    assert seen[3] is not first
    assert first.cleans == 2  # after uses 1 and 2; the third use retires it
    wait_until(lambda: first.destroyed, "retirement after max_uses")
    assert first.destroy_calls == 1


def test_the_default_reset_is_clean(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1)
    with pool.acquire() as sandbox:
        first = fake(sandbox)
    with pool.acquire() as sandbox:
        assert fake(sandbox) is first and first.cleans == 1
    assert factory.calls == 1


def test_release_returns_at_once_and_the_reset_runs_in_the_background(
    pools: list[SandboxPool], factory: Factory
) -> None:
    pool = make_pool(pools, factory, size=1, acquire_timeout=WAIT)
    with pool.acquire() as sandbox:
        first = fake(sandbox)
        first.clean_gate.clear()  # the reset blocks until the test lets it go
    # Out of the block while the reset is still blocked: release did not wait for it.
    stats = pool.stats
    assert (stats.in_use, stats.idle) == (0, 0) and first.cleans == 0
    with pytest.raises(PoolExhaustedError), pool.acquire(timeout=0.05):
        pass  # drained: the only sandbox is being reset, none is lent half-clean
    first.clean_gate.set()
    wait_until(lambda: pool.stats.idle == 1, "the background reset")
    with pool.acquire() as sandbox:
        assert fake(sandbox) is first and first.cleans == 1


def test_a_writable_root_is_never_reused(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1)
    with pool.acquire() as sandbox:
        first = fake(sandbox)
        first.config.read_only_root = False  # what a use changed on the root would stay
    with pool.acquire() as sandbox:
        assert fake(sandbox) is not first
    assert first.destroyed and first.cleans == 0


def test_clean_closes_sessions_and_forgets_the_network_log(
    pools: list[SandboxPool], factory: Factory
) -> None:
    pool = make_pool(pools, factory, size=1)
    with pool.acquire() as sandbox:
        first = fake(sandbox)
        first.hello = SimpleNamespace(capabilities=frozenset({"session", "session-names"}))
        first.sessions_left = [1, 2]
        log = EgressLog(first.id)
        line = {"type": "egress.allowed", "host": "example.com", "port": 443, "address": "10.0.0.5"}
        extra = {"reason": "allowed", "bytes_up": 1, "bytes_down": 2, "duration": 0.1, "time": 1.0}
        log.feed_line(json.dumps({**line, **extra}).encode())
        assert log.log() != []
        first.handle.info["egress"] = log
    wait_until(lambda: pool.stats.idle == 1, "the reset")
    assert first.closed_sessions == [1, 2] and first.sessions_left == []
    assert log.log() == []


def test_a_fresh_reset_spares_the_ping(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1)
    with pool.acquire() as sandbox:
        first = fake(sandbox)
        assert first.pings == 1  # never cleaned yet: pinged
        first.channel = first  # an open channel
    wait_until(lambda: pool.stats.idle == 1, "the reset")
    with pool.acquire() as sandbox:
        assert first.pings == 1  # the reset just proved the agent answers
    wait_until(lambda: pool.stats.idle == 1, "the reset")
    first.alive = False  # the channel broke: ping (and reconnect) again
    with pool.acquire() as sandbox:
        assert fake(sandbox) is first and first.pings == 2


def test_failed_clean_destroys_and_replaces(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1, reset="clean")
    with pool.acquire() as sandbox:
        first = fake(sandbox)
        first.clean_ok = False
    with pool.acquire() as sandbox:
        assert fake(sandbox) is not first
    assert first.cleans == 1 and first.destroyed


def test_unhealthy_sandbox_is_replaced_on_acquire(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1, reset="clean")
    pool.start(wait=True)
    (broken,) = factory.made
    broken.healthy = False
    with pool.acquire() as sandbox:
        assert fake(sandbox) is not broken
        assert sandbox.destroyed is False
    assert broken.pings == 1 and broken.destroyed
    assert pool.stats.destroyed == 1


def test_health_check_off_skips_the_ping(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1, health_check=False)
    pool.start(wait=True)
    (only,) = factory.made
    only.healthy = False
    with pool.acquire() as sandbox:
        assert fake(sandbox) is only
    assert only.pings == 0


def test_destroyed_and_expiring_sandboxes_are_never_lent(pools: list[SandboxPool]) -> None:
    factory = Factory(lifetime=3600)
    pool = make_pool(pools, factory, size=2, health_check=False)
    pool.start(wait=True)
    gone, expiring = factory.made
    gone.destroy()
    expiring.deadline = time.time() + 1.0  # less than MIN_LIFETIME_LEFT
    with pool.acquire() as sandbox:
        assert fake(sandbox) not in (gone, expiring)
    assert expiring.destroyed


def test_sandbox_destroyed_by_its_user_frees_its_slot(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1, reset="clean")
    with pool.acquire() as sandbox:
        first = fake(sandbox)
        sandbox.destroy()
    with pool.acquire() as sandbox:
        assert fake(sandbox) is not first
    assert first.cleans == 0 and first.destroy_calls >= 1


# -- bounds and waiting --------------------------------------------------------------------


def test_exhausted_after_the_wait(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1, acquire_timeout=0.3)
    with pool.acquire():
        t0 = time.monotonic()
        with pytest.raises(PoolExhaustedError) as info, pool.acquire():
            pass
        waited = time.monotonic() - t0
        assert 0.3 <= waited < 3.0
        assert "1 in use" in str(info.value) and "0.3s" in str(info.value)
        with pytest.raises(PoolExhaustedError), pool.acquire(timeout=0):
            pass
    assert factory.calls == 1  # waiting never created past the bound


def test_waiter_gets_a_sandbox_when_one_is_released(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=1, reset="clean", acquire_timeout=WAIT)
    got: list[FakeSandbox] = []
    holding = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with pool.acquire() as sandbox:
            got.append(fake(sandbox))
            holding.set()
            release.wait(WAIT)

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(WAIT)
    release.set()
    with pool.acquire() as sandbox:
        assert fake(sandbox) is got[0]  # reused after cleaning
    thread.join(WAIT)


def hammer(pool: SandboxPool, threads: int = 50, rounds: int = 20) -> list[BaseException]:
    """Many threads acquire and release at once; return what went wrong."""
    lent: set[str] = set()
    lock = threading.Lock()
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            barrier.wait(WAIT)
            for _ in range(rounds):
                with pool.acquire() as sandbox:
                    with lock:
                        assert sandbox.id not in lent, "one sandbox lent twice"
                        lent.add(sandbox.id)
                    assert not sandbox.destroyed
                    if rng.random() < 0.1:
                        fake(sandbox).clean_ok = False
                    with lock:
                        lent.discard(sandbox.id)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(50)
    return errors


@pytest.mark.parametrize("reset", ["destroy", "clean"])
def test_never_more_than_size_alive_under_many_threads(
    pools: list[SandboxPool], factory: Factory, reset: Any
) -> None:
    """50 threads hammer a pool of 3; check the bound, exclusivity and the final accounting."""
    pool = make_pool(pools, factory, size=3, reset=reset, max_uses=4, acquire_timeout=30)
    errors = hammer(pool)
    assert not errors, errors[:3]
    assert factory.max_alive <= 3
    assert pool.stats.created >= 3
    pool.close()
    assert factory.alive == 0
    stats = pool.stats
    assert stats.created == stats.destroyed and stats.in_use == stats.idle == 0
    assert all(s.destroyed and s.destroy_calls == 1 for s in factory.made)


# -- failing factory -----------------------------------------------------------------------


def test_failing_factory_is_reported_on_acquire_and_retried(
    pools: list[SandboxPool], factory: Factory
) -> None:
    factory.fail = ValueError("no such image")
    pool = make_pool(pools, factory, size=2, acquire_timeout=WAIT)
    t0 = time.monotonic()
    with pytest.raises(PoolFactoryError) as info, pool.acquire():
        pass
    assert time.monotonic() - t0 < WAIT / 2  # reported, not waited out
    assert isinstance(info.value.__cause__, ValueError)
    assert "ValueError: no such image" in str(info.value)
    assert pool.stats.failed >= 1
    wait_until(lambda: pool.stats.creating == 0, "the other failing creation to end")
    factory.fail = None  # the engine is back: the pool works again
    with pool.acquire() as sandbox:
        assert fake(sandbox) in factory.made
    wait_until(lambda: pool.stats.idle == 2, "the pool to refill once the factory works")


def test_failing_factory_is_not_hammered(pools: list[SandboxPool], factory: Factory) -> None:
    factory.fail = OSError("engine down")
    pool = make_pool(pools, factory, size=4)
    with pytest.raises(PoolFactoryError):
        pool.start(wait=True)
    calls = factory.calls
    assert calls == 4
    assert pool.stats.creating == 0
    # Nobody waits: no retries in the background.
    assert factory.calls == calls
    for _ in range(3):
        with pytest.raises(PoolFactoryError), pool.acquire(timeout=WAIT):
            pass
    assert factory.calls == calls + 3  # one probe per waiting acquire


def test_factory_errors_reach_only_waiting_callers(pools: list[SandboxPool], factory: Factory) -> None:
    factory.fail = RuntimeError("flaky")
    pool = make_pool(pools, factory, size=1)
    with pytest.raises(PoolFactoryError):
        pool.start(wait=True)
    factory.fail = None
    with pool.acquire(timeout=WAIT) as sandbox:  # no stale error is owed to this caller
        assert not sandbox.destroyed


# -- closing ---------------------------------------------------------------------------------


def test_close_destroys_everything_and_is_idempotent(pools: list[SandboxPool], factory: Factory) -> None:
    pool = make_pool(pools, factory, size=3)
    pool.start(wait=True)
    with pool.acquire() as lent:
        pool.close()
        assert lent.destroyed
        pool.close()
    assert all(s.destroyed and s.destroy_calls == 1 for s in factory.made)
    assert pool.closed and factory.alive == 0
    with pytest.raises(PoolExhaustedError, match="closed"), pool.acquire():
        pass
    with pytest.raises(PoolExhaustedError, match="closed"):
        pool.start()


def test_close_wakes_waiters_and_destroys_creations_in_flight(
    pools: list[SandboxPool], factory: Factory
) -> None:
    pool = make_pool(pools, factory, size=1, acquire_timeout=WAIT)
    factory.gate.clear()  # the creation blocks
    outcome: list[BaseException] = []

    def waiter() -> None:
        try:
            with pool.acquire():
                pass
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: factory.calls == 1, "the creation to start")
    closer = threading.Thread(target=pool.close)
    closer.start()
    thread.join(WAIT)
    assert outcome and isinstance(outcome[0], PoolExhaustedError)
    factory.gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    (made,) = factory.made
    assert made.destroyed  # close() waited for the creation and destroyed its sandbox


def test_context_manager_starts_and_closes(factory: Factory) -> None:
    with SandboxPool(factory, 2) as pool:
        wait_until(lambda: pool.stats.idle == 2, "warm-up on enter")
        assert "2 idle" in repr(pool)
    assert pool.closed and all(s.destroyed for s in factory.made)


# -- the clean script --------------------------------------------------------------------------


# Every destructive command becomes a function that exits 99 (a function shadows the
# shell's regular builtins such as kill, and every program), so a broken check fails the
# test instead of harming the machine.
STUBS = "".join(
    f"{name}() {{ echo DESTRUCTIVE {name}; exit 99; }}\n" for name in ("kill", "rm", "chmod", "ipcrm")
)


def run_clean_script(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", "-c", STUBS + script, "agentnest-clean", "/nonexistent-agentnest-workspace"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_clean_script_refuses_to_run_outside_a_sandbox() -> None:
    """On a host, PID 1 is not the keeper: the script must stop before killing or deleting."""
    proc = run_clean_script(CLEAN_SCRIPT)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "refused" in proc.stdout and "DESTRUCTIVE" not in proc.stdout


def test_clean_script_goes_on_under_the_keeper(tmp_path: Path) -> None:
    """The positive control: with the keeper's command line as PID 1's, the script kills."""
    from agentnest.runtime.bootstrap import BOOTSTRAP

    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(
        b"\0".join([b"python3", b"-S", b"-c", BOOTSTRAP.encode(), b"keeper", b"300.000", b""])
    )
    assert CLEAN_SCRIPT.count("/proc/1/cmdline") == 1
    proc = run_clean_script(CLEAN_SCRIPT.replace("/proc/1/cmdline", str(cmdline)))
    assert proc.returncode == 99, proc.stdout + proc.stderr
    assert "DESTRUCTIVE kill" in proc.stdout  # the host's processes, but the stub stopped it


# -- the async twin -----------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def async_factory(factory: Factory) -> Callable[[], Any]:
    async def make() -> AsyncSandbox:
        return AsyncSandbox(await anyio.to_thread.run_sync(factory))

    return make


@pytest.mark.anyio
async def test_async_pool_lends_async_sandboxes(factory: Factory) -> None:
    async with AsyncSandboxPool(async_factory(factory), 2, reset="clean") as pool:
        await pool.start(wait=True)
        assert pool.stats.idle == 2 and pool.size == 2
        async with pool.acquire() as sandbox:
            assert isinstance(sandbox, AsyncSandbox)
            assert fake(cast(Sandbox, core_of(sandbox))) in factory.made
            assert pool.stats.in_use == 1
        assert "AsyncSandboxPool" in repr(pool)
    assert pool.closed and all(s.destroyed for s in factory.made)


@pytest.mark.anyio
async def test_async_pool_exhausted_and_cancelled_waits(factory: Factory) -> None:
    async with AsyncSandboxPool(async_factory(factory), 1, acquire_timeout=0.2, reset="destroy") as pool:
        async with pool.acquire() as held:
            with pytest.raises(PoolExhaustedError):
                async with pool.acquire():
                    pass
            t0 = time.monotonic()
            with anyio.move_on_after(0.2) as scope:
                async with pool.acquire(timeout=WAIT):
                    pass
            assert scope.cancelled_caught and time.monotonic() - t0 < WAIT / 2
        # The cancelled wait did not keep a lease: the sandbox is lent again.
        async with pool.acquire(timeout=WAIT) as again:
            assert core_of(again) is not core_of(held) and held.destroyed  # reset="destroy"
            assert pool.stats.in_use == 1
        assert pool.stats.in_use == 0


@pytest.mark.anyio
async def test_async_pool_factory_must_make_async_sandboxes(factory: Factory) -> None:
    async def wrong() -> Any:
        return await anyio.to_thread.run_sync(factory)

    async with AsyncSandboxPool(wrong, 1) as pool:
        with pytest.raises(PoolFactoryError) as info:
            async with pool.acquire(timeout=WAIT):
                pass
    assert isinstance(info.value.__cause__, TypeError)
    assert "not an AsyncSandbox" in str(info.value)
