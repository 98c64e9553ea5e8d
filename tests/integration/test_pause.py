"""``Sandbox.pause`` / ``resume`` on the real engine, runc and gVisor (``docker pause``: memory kept).

A paused sandbox's container is frozen (the engine says so), its processes
and Python sessions carry on from where they were after ``resume``, a
fork's freeze of the workspace never undoes the owner's pause, and
``destroy`` works while paused.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from agentnest import (
    AsyncSandbox,
    MemoryObserver,
    Sandbox,
    SandboxDestroyedError,
    SandboxPausedError,
    SnapshotError,
)
from agentnest.runtime.base import Capability
from agentnest.runtime.docker import DockerBackend, DockerSpec, checkpoint
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(240)

#: A thread in a session that counts as fast as it can (with a pause between).
COUNTER = """
import threading, time
count = [0]
def _tick():
    while True:
        count[0] += 1
        time.sleep(0.005)
threading.Thread(target=_tick, daemon=True).start()
"""


def engine_paused(sb: Sandbox) -> bool:
    state = sb.backend.api.inspect_container(sb.handle.info["container"])["State"]  # type: ignore[attr-defined]
    return bool(state["Paused"])


def frozen(sb: Sandbox) -> bool:
    """Paused through the engine, or frozen through the container's freezer cgroup directly."""
    if engine_paused(sb):
        return True
    cid = sb.handle.info["container"]
    for path in (
        f"/sys/fs/cgroup/freezer/docker/{cid}/freezer.state",
        f"/sys/fs/cgroup/docker/{cid}/cgroup.events",
        f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cgroup.events",
    ):
        if os.path.exists(path):
            text = Path(path).read_text()
            return "FROZEN" in text or "frozen 1" in text
    return False


@pytest.fixture
def sandbox(backend_name: str) -> Iterator[Sandbox]:
    with Sandbox(backend=backend_name, timeout=180) as sb:
        yield sb


def test_the_docker_backend_declares_pause(sandbox: Sandbox) -> None:
    assert Capability.PAUSE in sandbox.backend.capabilities()


def test_processes_keep_their_state_across_pause_and_resume(sandbox: Sandbox) -> None:
    session = sandbox.python_session(name="main")
    session.run(COUNTER)
    wait_until(lambda: int(session.run("count[0]").result or 0) > 3, "the counter to run")
    to_disk = isinstance(sandbox.backend, DockerBackend) and sandbox.backend.checkpoints()
    sandbox.pause()
    if to_disk:  # gVisor on an experimental engine: a checkpoint, the container stopped
        assert not sandbox.backend.is_running(sandbox.handle)
    else:
        assert engine_paused(sandbox)
    with pytest.raises(SandboxPausedError, match=r"resume\(\)"):
        sandbox.exec(["true"])
    started = time.monotonic()
    sandbox.resume()
    resumed_in = time.monotonic() - started
    assert not engine_paused(sandbox)
    if not to_disk:
        assert resumed_in < 1.0, resumed_in  # the freezer; a restore's time is a benchmark's matter
    # The same interpreter (its variables), and its thread counts on.
    before = int(session.run("count[0]").result or 0)
    wait_until(lambda: int(session.run("count[0]").result or 0) > before, "the counter to go on")
    assert sandbox.exec(["echo", "after"]).stdout == "after\n"
    session.close()


def test_a_fork_freeze_does_not_undo_a_pause(sandbox: Sandbox) -> None:
    backend, handle = sandbox.backend, sandbox.handle
    if isinstance(backend, DockerBackend) and backend.checkpoints():
        pytest.skip("gVisor pauses by checkpoint on this engine (its freeze rules: test_gvisor_pause_*)")
    sandbox.pause()
    with backend.frozen(handle):
        assert frozen(sandbox)
    assert frozen(sandbox), "the freeze's end resumed a paused sandbox"
    sandbox.resume()
    assert not frozen(sandbox)
    # The other order: paused by the user inside a freeze, still frozen after it.
    with backend.frozen(handle):
        sandbox.pause()
    assert frozen(sandbox)
    sandbox.resume()
    assert not frozen(sandbox)
    assert sandbox.exec(["true"]).exit_code == 0


def test_destroy_while_paused_and_pause_after_destroy(backend_name: str) -> None:
    events = MemoryObserver()
    sb = Sandbox(backend=backend_name, timeout=120, observers=[events])
    container = sb.handle.info["container"]
    sb.pause()
    sb.destroy()
    assert not sb.backend.is_running(sb.handle)
    import docker.errors

    with pytest.raises(docker.errors.NotFound):
        sb.backend.api.inspect_container(container)  # type: ignore[attr-defined]
    with pytest.raises(SandboxDestroyedError):
        sb.pause()
    with pytest.raises(SandboxDestroyedError):
        sb.resume()
    assert [t for t in events.types() if t.startswith("sandbox.")] == [
        "sandbox.created",
        "sandbox.paused",
        "sandbox.destroyed",
    ]


def test_async_twins(backend_name: str) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(backend=backend_name, timeout=120) as sb:
            await sb.pause()
            states = [sb.paused]
            with pytest.raises(SandboxPausedError):
                await sb.exec(["true"])
            await sb.resume()
            states.append(sb.paused)
            assert states == [True, False]
            assert (await sb.exec(["echo", "ok"])).stdout == "ok\n"

    anyio.run(main)


# -- gVisor: a checkpoint to disk ---------------------------------------------------


@pytest.fixture
def checkpointing() -> Iterator[DockerBackend]:
    """The gVisor backend on an engine that checkpoints (experimental; see docs/state.md).

    ``AGENTNEST_TEST_CHECKPOINT_DOCKER_HOST`` points at such an engine when the
    default one is not experimental (a second dockerd on this host).
    """
    host = os.environ.get("AGENTNEST_TEST_CHECKPOINT_DOCKER_HOST") or None
    backend = DockerBackend(DockerSpec(docker_host=host, oci_runtime="runsc"), name="gvisor")
    if not backend.checkpoints():
        pytest.skip(
            'needs a local Docker engine with "experimental": true (`make engine` sets it) or '
            "AGENTNEST_TEST_CHECKPOINT_DOCKER_HOST pointing at one"
        )
    yield backend
    backend.close()


def checkpoint_dir(sb: Sandbox) -> Path:
    backend = sb.backend
    assert isinstance(backend, DockerBackend)
    return checkpoint.directory(backend.engine_info(), sb.handle.info["container"], checkpoint.PAUSE_NAME)


def status(sb: Sandbox) -> str:
    return str(sb.backend.api.inspect_container(sb.handle.info["container"])["State"]["Status"])  # type: ignore[attr-defined]


@pytest.mark.gvisor
def test_gvisor_pause_is_a_checkpoint_and_resume_restores_it(checkpointing: DockerBackend) -> None:
    events = MemoryObserver()
    with Sandbox(backend=checkpointing, timeout=180, observers=[events]) as sb:
        session = sb.python_session(name="main")
        session.run("x = 41\n" + COUNTER)
        wait_until(lambda: int(session.run("count[0]").result or 0) > 3, "the counter to run")
        sb.pause()
        # Stopped, memory released, the state on disk.
        assert status(sb) == "exited"
        assert (checkpoint_dir(sb) / checkpoint.IMAGE_FILE).stat().st_size > 0
        with pytest.raises(SandboxPausedError):
            sb.exec(["true"])
        started = time.monotonic()
        sb.resume()
        resumed_in = time.monotonic() - started
        assert status(sb) == "running"
        # The same interpreter, found by its name, and its thread counts on.
        assert sb.python_session(name="main").run("x + 1").result == "42"
        before = int(session.run("count[0]").result or 0)
        wait_until(lambda: int(session.run("count[0]").result or 0) > before, "the counter to go on")
        assert sb.exec(["echo", "after"]).stdout == "after\n"
        session.close()
    paused = [e for e in events.events if e.type.value == "sandbox.paused"]
    resumed = [e for e in events.events if e.type.value == "sandbox.resumed"]
    assert paused[0].attributes["how"] == "checkpoint" and resumed[0].attributes["reconnected"] is True
    assert "agent.restarted" not in events.types(), "the resume started a new agent instead of reconnecting"
    print(f"gVisor checkpoint pause {paused[0].attributes['seconds']:.2f}s, resume {resumed_in:.2f}s")


@pytest.mark.gvisor
@pytest.mark.parametrize("damage", ["truncated", "empty", "missing"])
def test_a_damaged_checkpoint_is_refused_and_the_files_stay(
    checkpointing: DockerBackend, damage: str
) -> None:
    with Sandbox(backend=checkpointing, timeout=180) as sb:
        sb.write_file("keep.txt", "kept")
        sb.pause()
        image = checkpoint_dir(sb) / checkpoint.IMAGE_FILE
        if damage == "missing":
            image.unlink()
        else:
            with image.open("r+b") as f:
                f.truncate(0 if damage == "empty" else image.stat().st_size // 2)
        with pytest.raises(SnapshotError, match="checkpoint") as info:
            sb.resume()
        assert info.value.rule == "checkpoint" and "destroy()" in str(info.value)
        if damage == "truncated":
            # Found by runsc after the start: the restore failed, the processes are gone.
            assert not sb.backend.is_running(sb.handle)
        else:
            # Found before the start: still paused, nothing changed.
            assert sb.paused and status(sb) == "exited"
        workspace = sb.backend.workspace_path(sb.handle)
        assert workspace is not None and (workspace / "keep.txt").read_text() == "kept"
        container = sb.handle.info["container"]
    import docker.errors

    with pytest.raises(docker.errors.NotFound):
        checkpointing.api.inspect_container(container)


@pytest.mark.gvisor
def test_a_restored_sandbox_pauses_with_the_freezer_next_time(checkpointing: DockerBackend) -> None:
    events = MemoryObserver()
    with Sandbox(backend=checkpointing, timeout=180, observers=[events]) as sb:
        sb.python_session(name="main").run("x = 41")
        sb.pause()
        sb.resume()
        sb.pause()  # a second checkpoint would strand the task (see live.ONCE)
        assert status(sb) == "paused" and frozen(sb)
        sb.resume()
        assert sb.python_session(name="main").run("x + 1").result == "42"
    hows = [e.attributes["how"] for e in events.events if e.type.value == "sandbox.paused"]
    assert hows == ["checkpoint", "freezer"]
