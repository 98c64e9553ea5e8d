"""SandboxPool and AsyncSandboxPool with real sandboxes, on runc and runsc."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from agentnest import (
    AsyncSandbox,
    AsyncSandboxPool,
    PolicyDeniedError,
    PoolExhaustedError,
    PoolFactoryError,
    Sandbox,
    SandboxPool,
    SecurityPolicy,
)
from agentnest.testing.wait import wait_until

from .helpers import container_of, containers_of, owned_containers, processes

WAIT = 60.0


def factory_for(backend_name: str) -> Callable[[], Sandbox]:
    def factory() -> Sandbox:
        return Sandbox(backend=backend_name, timeout=300)

    return factory


def test_acquire_release_and_destroy_reset(backend_name: str, docker_client: Any) -> None:
    with SandboxPool(factory_for(backend_name), size=2) as pool:
        pool.start(wait=True)
        assert pool.stats.idle == 2
        with pool.acquire() as sandbox:
            assert sandbox.exec_shell("echo pooled").stdout == "pooled\n"
            used = sandbox.id
            assert pool.stats.in_use == 1
        wait_until(lambda: containers_of(docker_client, used) == [], "the used sandbox's removal")
        wait_until(lambda: pool.stats.idle == 2, "its replacement")
        assert (pool.stats.created, pool.stats.destroyed) == (3, 1)
        with pool.acquire() as sandbox:
            assert sandbox.id != used
    assert pool.closed


def test_exhausted_after_the_acquire_timeout(backend_name: str) -> None:
    # The first acquire waits for the creation (slower than 0.5 s under load); the second is the test.
    with (
        SandboxPool(factory_for(backend_name), size=1, acquire_timeout=0.5) as pool,
        pool.acquire(WAIT) as held,
    ):
        t0 = time.monotonic()
        with pytest.raises(PoolExhaustedError), pool.acquire():
            pass
        assert 0.5 <= time.monotonic() - t0 < 10
        assert held.exec_shell("true").ok


def test_health_check_replaces_a_killed_container(backend_name: str, docker_client: Any) -> None:
    with SandboxPool(factory_for(backend_name), size=1, reset="clean") as pool:
        with pool.acquire() as sandbox:
            first = sandbox
            container = container_of(docker_client, sandbox)
        wait_until(lambda: pool.stats.idle == 1, "the clean reset")
        container.kill()  # behind the pool's back
        with pool.acquire() as sandbox:
            assert sandbox is not first
            assert sandbox.exec_shell("echo fresh").stdout == "fresh\n"
        assert first.destroyed and pool.stats.destroyed == 1
        wait_until(lambda: containers_of(docker_client, first.id) == [], "the dead sandbox's removal")


def test_clean_reset_removes_files_and_processes(backend_name: str) -> None:
    with SandboxPool(factory_for(backend_name), size=1, reset="clean", max_uses=2) as pool:
        with pool.acquire() as sandbox:
            first = sandbox.id
            sandbox.write_file("data/out.txt", "left behind")
            sandbox.write_file(".hidden", "x")
            script = (
                "setsid sleep 1001 >/dev/null 2>&1 < /dev/null & "
                "echo scratch > /tmp/scratch; mkdir -p locked/inner; chmod 000 locked"
            )
            assert sandbox.exec_shell(script).ok
            assert ["sleep", "1001"] in processes(sandbox)
        with pool.acquire() as sandbox:
            assert sandbox.id == first  # reused, not recreated
            assert sandbox.list_files(".") == []
            assert sandbox.exec_shell("ls -A /tmp").stdout == ""
            assert ["sleep", "1001"] not in processes(sandbox)
            assert sandbox.exec_shell("echo works > f; cat f").stdout == "works\n"
        with pool.acquire() as sandbox:
            assert sandbox.id != first  # max_uses=2 retired it
        assert pool.stats.destroyed == 1


def test_failing_factory_is_reported_and_the_pool_recovers(backend_name: str) -> None:
    broken = {"yes": True}

    def factory() -> Sandbox:
        policy = SecurityPolicy(require_image_digest=broken["yes"])  # the default image has a tag
        return Sandbox(backend=backend_name, timeout=300, security_policy=policy)

    with SandboxPool(factory, size=1, acquire_timeout=WAIT) as pool:
        with pytest.raises(PoolFactoryError) as info, pool.acquire():
            pass
        assert isinstance(info.value.__cause__, PolicyDeniedError)
        wait_until(lambda: pool.stats.creating == 0, "the failed creation to end")
        broken["yes"] = False
        with pool.acquire() as sandbox:
            assert sandbox.exec_shell("true").ok


def test_close_removes_every_container(backend_name: str, docker_client: Any) -> None:
    before = owned_containers(docker_client)
    pool = SandboxPool(factory_for(backend_name), size=3)
    try:
        pool.start(wait=True)
        assert len(owned_containers(docker_client) - before) == 3
        with pool.acquire() as lent:
            pool.close()
            assert lent.destroyed
    finally:
        pool.close()
    assert pool.stats.created == pool.stats.destroyed == 3
    assert owned_containers(docker_client) == before


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_async_pool(backend_name: str, docker_client: Any) -> None:
    def factory() -> Any:
        return AsyncSandbox.create(backend=backend_name, timeout=300)

    async with AsyncSandboxPool(factory, size=2, reset="clean") as pool:
        async with pool.acquire() as sandbox:
            assert isinstance(sandbox, AsyncSandbox)
            await sandbox.write_file("x", "1")
            assert (await sandbox.exec_shell("cat x")).stdout == "1"
            first = sandbox.id
        async with pool.acquire() as a, pool.acquire() as b:
            assert first in (a.id, b.id)  # cleaned and lent again
            assert not await a.exists("x") and not await b.exists("x")
            with pytest.raises(PoolExhaustedError):
                async with pool.acquire(timeout=0.2):
                    pass
        ids = [a.id, b.id]
    assert pool.closed
    assert all(containers_of(docker_client, sid) == [] for sid in ids)
