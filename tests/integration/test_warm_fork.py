"""Warm forks on the real engine: a spare container claimed by the next host-side fork (runc).

After a sandbox with a disk workspace forks on the host, a container of its
configuration is started in the background with its agent connected and an
empty *slot* as its workspace (agentnest.state.spares); the next fork mounts
a copy-on-write snapshot of the parent on that slot, and mount propagation
shows it inside the running container.  What the unit suite cannot check:
the child really works in its own subvolume with exactly the parent's files
at the instant of the fork, its quota, user, environment and deadline are
its own, nothing of a spare outlives its parent or a crash, and a mount that
does not reach the container fails closed.  Also ``deadline.write_local``,
which moves a keeper's deadline through ``/proc/PID/root``.

runc only (marked ``docker``): gVisor's gofer serves the directory it opened
at start and never sees a mount made on the host later, so the backend does
not declare ``Capability.WARM_FORK`` there, which the one test that runs on
both runtimes checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentnest import EventType, MemoryObserver, Sandbox, Secret
from agentnest._core import core_of
from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.errors import UnsupportedCapabilityError
from agentnest.runtime import mounts, storage
from agentnest.runtime.base import Capability, SandboxHandle
from agentnest.runtime.docker import DockerBackend
from agentnest.runtime.docker import deadline as moved
from agentnest.runtime.docker.prune import OWNER_GONE, SANDBOX_GONE, prune
from agentnest.runtime.registry import get_backend
from agentnest.runtime.storage import StoragePool
from agentnest.sandbox import default_image
from agentnest.state import SPARES
from agentnest.state.spares import _same

from .helpers import (
    SANDBOX_UID,
    containers_of,
    listing,
    need_storage_pool,
    owned_containers,
    spawn_host,
    wait_until_stopped,
)

MiB = 1024 * 1024
GiB = 1024 * MiB
#: How long a spare may take to be made in the background.
SPARE_WAIT = 60.0
GVISOR = (
    "no warm forks on gVisor: its gofer serves the directory it opened at start and never sees "
    "a mount made on the host later, so runsc does not declare Capability.WARM_FORK"
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def pool() -> StoragePool:
    """Every test here needs the pool (a skip without one, a failure under ``make test``)."""
    return need_storage_pool()


@pytest.fixture(autouse=True)
def no_leaks(docker_client: Any) -> Iterator[None]:
    """Each test leaves no container and no spare behind."""
    before, spares = owned_containers(docker_client), SPARES.ready()
    yield
    assert owned_containers(docker_client) == before
    assert SPARES.ready() == spares, "a warm spare outlived the sandboxes that forked"


def sh(sb: Sandbox, script: str, timeout: float = 60) -> str:
    return sb.exec_shell(script, timeout=timeout).check().stdout


def forks(events: MemoryObserver, parent: Sandbox) -> list[tuple[str, bool]]:
    """``(child id, warm)`` of each ``sandbox.forked`` event of ``parent``, oldest first."""
    return [
        (e.attributes["child"], e.attributes["warm"])
        for e in events.events
        if e.type is EventType.SANDBOX_FORKED and e.sandbox_id == parent.id
    ]


def spare_for(sb: Sandbox) -> SandboxHandle | None:
    """The handle of the ready spare for ``sb``'s next fork, if there is one."""
    found = [s.handle for s in SPARES._ready if s.backend is sb.backend and _same(s.config, sb.config)]
    assert len(found) <= 1, "more than one spare for one configuration"
    return found[0] if found else None


def ready_spare(sb: Sandbox) -> SandboxHandle:
    assert SPARES.wait_idle(SPARE_WAIT), "the spare was still being made"
    spare = spare_for(sb)
    assert spare is not None, "no spare was made after the first fork"
    return spare


@contextlib.contextmanager
def warm_parent(
    backend: str | DockerBackend = "docker", **kwargs: Any
) -> Iterator[tuple[Sandbox, MemoryObserver]]:
    """A disk sandbox that forked once (cold) and has a spare ready for its next fork."""
    events = MemoryObserver()
    kwargs.setdefault("disk", "64m")
    with Sandbox(backend=backend, workspace="disk", timeout=120, observers=[events], **kwargs) as parent:
        with parent.fork():
            pass
        assert [warm for _, warm in forks(events, parent)] == [False]
        ready_spare(parent)
        yield parent, events


def mounted_root(text: str, target: str) -> str | None:
    """The root (within its file system) of the topmost mount at ``target`` in a mountinfo text."""
    found = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == target:
            found = fields[3]
    return found


def host_mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


FILL = r"""
set -e
mkdir -p src/pkg data ro
printf 'print("hi")\n' > src/main.py
printf '#!/bin/sh\necho tool\n' > src/tool.sh && chmod 755 src/tool.sh
head -c 300000 /dev/urandom > data/blob.bin && chmod 600 data/blob.bin
ln -s ../src/main.py src/pkg/link.py
printf 'inner' > ro/f && chmod 555 ro
"""


# -- the second fork is warm -------------------------------------------------------------------


@pytest.mark.docker
def test_the_first_fork_is_cold_and_leaves_a_spare_the_second_one_claims(
    docker_client: Any, pool: StoragePool
) -> None:
    events = MemoryObserver()
    with Sandbox(backend="docker", workspace="disk", disk="64m", timeout=120, observers=[events]) as parent:
        assert spare_for(parent) is None  # nothing warm before a first fork
        first = parent.fork()
        try:
            spare = ready_spare(parent)
            # A started container, its agent connected, nothing but an empty slot as its workspace.
            (container,) = containers_of(docker_client, spare.id)
            assert container.status == "running"
            slot = pool.slot(spare.id)
            assert os.listdir(slot) == [] and not os.path.lexists(pool.path(spare.id))
            assert mounted_root(host_mountinfo(), str(slot)) == f"/slot/{spare.id}"
            second = parent.fork()
            try:
                # The spare became the child: no container was started for it.
                assert second.id == spare.id and second.handle is spare
                assert forks(events, parent) == [(first.id, False), (second.id, True)]
                (mine,) = [
                    e.attributes
                    for e in events.events
                    if e.type is EventType.SANDBOX_FORKED and e.sandbox_id == second.id
                ]
                assert mine["parent"] == parent.id and mine["warm"] is True
                assert sh(second, "echo up") == "up\n"
                # And the next spare is made for the fork after.
                following = ready_spare(parent)
                assert following.id not in (spare.id, first.id, second.id)
            finally:
                second.destroy()
        finally:
            first.destroy()


# -- a warm child is the parent at the instant of the fork -------------------------------------


@pytest.mark.docker
def test_a_warm_child_has_exactly_the_parents_files_in_its_own_subvolume(pool: StoragePool) -> None:
    with warm_parent() as (parent, events):
        sh(parent, FILL)
        # Written after the spare was made: the copy is taken at the fork, not before.
        parent.write_file("late.txt", "written just before the fork")
        expected = listing(parent)
        with parent.fork() as child:
            assert forks(events, parent)[-1] == (child.id, True)
            assert listing(child) == expected
            # The host fast path reads the child's own subvolume ...
            assert child.backend.workspace_path(child.handle) == pool.path(child.id)
            assert child.read_file("late.txt") == "written just before the fork"
            assert child.read_file("data/blob.bin", encoding=None) == parent.read_file(
                "data/blob.bin", encoding=None
            )
            # ... the agent sees the same through the channel and in its shell ...
            assert sorted(f.path for f in child.list_files()) == sorted(f.path for f in parent.list_files())
            assert sh(child, "cat late.txt; ./src/tool.sh") == "written just before the fork" + "tool\n"
            # ... and /workspace is that subvolume (inode 256, its device), not the empty slot below.
            inode, device = sh(child, "pwd; stat -c '%i %d' .").splitlines()[1].split()
            assert sh(child, "pwd") == "/workspace\n"
            assert int(inode) == 256 and int(device) == os.stat(pool.path(child.id)).st_dev
            assert int(device) != os.stat(pool.path(parent.id)).st_dev
            inside = sh(child, "cat /proc/self/mountinfo")
            assert mounted_root(inside, "/workspace") == f"/ws/{child.id}"
            # Independent from now on, both ways.
            child.write_file("src/main.py", "child")
            sh(child, "rm -rf data && echo c > child-only")
            parent.write_file("parent-only", "p")
            assert parent.read_file("src/main.py") == 'print("hi")\n' and parent.exists("data/blob.bin")
            assert not parent.exists("child-only") and not child.exists("parent-only")
            assert child.read_file("src/main.py") == "child"


@pytest.mark.docker
def test_a_warm_childs_quota_is_the_parents_disk_size(pool: StoragePool) -> None:
    with warm_parent(disk="64m") as (parent, events):
        sh(parent, "head -c 8M /dev/urandom > eight.bin")
        with parent.fork() as child:
            assert forks(events, parent)[-1] == (child.id, True)
            assert child.backend.workspace_quota(child.handle) == 64 * MiB == pool.limit(child.id)
            # The kernel enforces it inside the child, counting the blocks shared with the
            # parent: 8M + 40M fits, 8M + 40M + 20M does not (60M alone would).
            assert sh(child, "head -c 40M /dev/zero > forty.bin && echo ok") == "ok\n"
            result = child.exec_shell("head -c 20M /dev/zero > twenty.bin", timeout=60)
            assert result.exit_code != 0 and "Disk quota exceeded" in result.stderr, result
            # The parent's own room is untouched by the child's writes.
            assert sh(parent, "head -c 40M /dev/zero > p.bin && echo ok") == "ok\n"


@pytest.mark.docker
def test_a_warm_child_runs_as_the_sandbox_user_with_the_parents_environment() -> None:
    token = "tok-" + os.urandom(8).hex()
    env = {"PLAIN": "visible", "API_TOKEN": Secret(token)}
    probe = "id -u; id -g; echo $PLAIN; echo $API_TOKEN"
    with warm_parent(environment=env) as (parent, events):
        seen = sh(parent, probe)
        with parent.fork() as child:
            assert forks(events, parent)[-1] == (child.id, True)
            got = sh(child, probe)
            assert got == seen and token not in got
            assert got.splitlines()[:3] == [str(SANDBOX_UID), str(SANDBOX_UID), "visible"]
            # Its agent (and so every command) is the sandbox's user too, never root.
            hello = core_of(child).link().hello
            assert hello is not None and hello.uid == SANDBOX_UID


# -- its deadline is its own -------------------------------------------------------------------


@pytest.mark.docker
def test_a_warm_child_stops_at_its_own_deadline(docker_client: Any) -> None:
    with warm_parent() as (parent, events):
        spare = spare_for(parent)
        assert spare is not None
        # The spare waits with a provisional deadline minutes away.
        assert spare.deadline > time.time() + 120
        asked = time.time()
        with parent.fork(timeout=5) as child:
            assert forks(events, parent)[-1] == (child.id, True)
            assert child.deadline == pytest.approx(asked + 5, abs=1.5)
            took = wait_until_stopped(docker_client, child.id, within=25)
            stopped = time.time()
            assert took is not None, "the warm child outlived its deadline"
            assert stopped >= child.deadline - 0.5, "it stopped before its deadline"
            assert stopped <= child.deadline + 10
            # The parent lives on.
            assert sh(parent, "echo alive") == "alive\n"


# -- nothing of a spare outlives its owner -----------------------------------------------------


@pytest.mark.docker
def test_destroying_a_warm_child_and_the_parent_removes_their_containers_slots_and_workspaces(
    docker_client: Any, pool: StoragePool
) -> None:
    with warm_parent() as (parent, _):
        child = parent.fork()
        try:
            assert pool.path(child.id).is_dir() and pool.slot(child.id).is_dir()
        finally:
            child.destroy()
        assert containers_of(docker_client, child.id) == []
        assert not os.path.lexists(pool.path(child.id)) and not os.path.lexists(pool.slot(child.id))
        assert mounted_root(host_mountinfo(), str(pool.slot(child.id))) is None
        spare = ready_spare(parent)
    # The spare kept for the parent's next fork went with it.
    assert spare_for(parent) is None
    assert containers_of(docker_client, spare.id) == []
    assert not os.path.lexists(pool.slot(spare.id)) and not os.path.lexists(pool.path(spare.id))
    assert mounted_root(host_mountinfo(), str(pool.slot(spare.id))) is None


@pytest.mark.docker
def test_warm_forks_off_makes_no_spare() -> None:
    shared = get_backend("docker")
    assert isinstance(shared, DockerBackend)
    cold = DockerBackend(dataclasses.replace(shared.spec, warm_forks=False), name="docker")
    assert Capability.WARM_FORK in shared.capabilities()
    assert Capability.WARM_FORK not in cold.capabilities()
    assert Capability.DISK_WORKSPACE in cold.capabilities()
    events = MemoryObserver()
    with Sandbox(backend=cold, workspace="disk", disk="64m", timeout=120, observers=[events]) as parent:
        with pytest.raises(UnsupportedCapabilityError):
            cold.create_spare(parent.config)
        parent.write_file("f", "x")
        for _ in range(2):
            with parent.fork() as child:
                assert child.read_file("f") == "x"
            assert SPARES.wait_idle(SPARE_WAIT) and spare_for(parent) is None
        assert [warm for _, warm in forks(events, parent)] == [False, False]


@pytest.mark.docker
def test_a_spare_whose_mount_does_not_reach_it_falls_back_cold_and_disables_warm_forks(
    docker_client: Any, pool: StoragePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = get_backend("docker")
    assert isinstance(shared, DockerBackend)
    # A backend of its own: the one every other test uses keeps its warm forks.
    backend = DockerBackend(shared.spec, name="docker")
    with warm_parent(backend) as (parent, events):
        parent.write_file("kept.txt", "the parent's")
        spare = spare_for(parent)
        assert spare is not None
        real, seen = mounts.top_mount, []

        def elsewhere(target: str, pid: int | str = "self") -> str | None:
            # What an engine in another mount namespace would show: the mount never arrived.
            seen.append(pid)
            return f"/slot/{spare.id}" if len(seen) == 1 else real(target, pid)

        monkeypatch.setattr(mounts, "top_mount", elsewhere)
        with parent.fork() as child:
            # The fork still succeeded, from scratch, with the parent's files.
            assert seen == [spare.info["pid"]]
            assert child.id != spare.id and forks(events, parent)[-1] == (child.id, False)
            assert child.read_file("kept.txt") == "the parent's"
            assert sh(child, "cat kept.txt") == "the parent's"
            assert sh(parent, "cat kept.txt") == "the parent's"  # frozen for the claim, running again
        # The spare that took the copy is gone, copy and slot included ...
        assert containers_of(docker_client, spare.id) == []
        assert not os.path.lexists(pool.slot(spare.id)) and not os.path.lexists(pool.path(spare.id))
        # ... and this backend stops trying (fail closed); the shared one is unaffected.
        assert Capability.WARM_FORK not in backend.capabilities()
        assert Capability.WARM_FORK in shared.capabilities()
        with pytest.raises(UnsupportedCapabilityError) as info:
            backend.create_spare(parent.config)
        assert "did not reach its container" in str(info.value)
        assert SPARES.wait_idle(SPARE_WAIT) and spare_for(parent) is None


def test_warm_forks_are_declared_on_runc_only(backend_name: str) -> None:
    backend = get_backend(backend_name)
    assert isinstance(backend, DockerBackend)
    assert Capability.DISK_WORKSPACE in backend.capabilities()
    if backend_name == "docker":
        assert Capability.WARM_FORK in backend.capabilities()
        return
    # runsc: asking anyway is refused before any container.
    assert Capability.WARM_FORK not in backend.capabilities(), GVISOR
    config = SandboxConfig(image=default_image(), limits=ResourceLimits(workspace_medium="disk"))
    with pytest.raises(UnsupportedCapabilityError):
        backend.create_spare(config)


# -- prune reaps what a crashed process's spare left --------------------------------------------


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoragePool]:
    """A pool of this module's own: prune sweeps all of it, and other sessions share the real one."""
    root = tmp_path_factory.mktemp("pool") / "storage"
    status, steps = storage.setup(str(root), size=GiB)  # a sparse file: costs what is written
    try:
        assert status.ready and steps, status
        yield StoragePool(root)
    finally:
        # -R: a slot left mounted by a failed test is below it.
        if subprocess.run(["umount", "-R", str(root)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], capture_output=True, check=False)


#: Make a spare in the given pool, print its ids, and die without cleaning up.
CRASH_WITH_A_SPARE = r"""
import dataclasses, os, sys
from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.runtime.docker import DockerBackend
from agentnest.runtime.registry import get_backend
from agentnest.sandbox import default_image

backend = DockerBackend(dataclasses.replace(get_backend("docker").spec, storage=sys.argv[1]))
config = SandboxConfig(
    image=default_image(), lifetime=60, limits=ResourceLimits(workspace_medium="disk", workspace=64 << 20)
)
handle = backend.create_spare(config)
print(handle.id, handle.info["container"], flush=True)
os._exit(0)
"""


def crashed_spare(pool: StoragePool) -> tuple[str, str, int]:
    """``(sandbox id, container id, pid)`` of a spare whose process died without cleaning up."""
    child = spawn_host(CRASH_WITH_A_SPARE, str(pool.root))
    try:
        assert child.stdout is not None
        sid, cid = child.stdout.readline().split()
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    return sid, cid, child.pid


@pytest.mark.docker
def test_prune_reaps_a_spare_left_by_a_crashed_process(docker_client: Any, private: StoragePool) -> None:
    api = docker_client.api
    sid, cid, pid = crashed_spare(private)
    slot = private.slot(sid)
    try:
        # What the crash left: a running container of a dead owner, and its slot, mounted.
        container = docker_client.containers.get(cid)
        assert container.status == "running" and container.labels["agentnest.owner"].endswith(f":{pid}")
        assert mounted_root(host_mountinfo(), str(slot)) == f"/slot/{sid}"
        # Old or not, a slot stays while its container does; a plain prune keeps a running sandbox.
        old = time.time() - storage.ORPHAN_AGE - 60
        os.utime(slot, (old, old))
        assert prune(api, sandbox=sid, pool=private).resources == ()
        assert prune(api, pool=private, dry_run=True).workspaces == ()
        # The owner is gone: prune --orphans reaps the container, and with it gone, its slot.
        report = prune(api, orphans=True, pool=private, sandbox=sid)
        assert report.ok, report.errors
        assert [(r.id, r.reason) for r in report.containers] == [(cid, OWNER_GONE)]
        assert containers_of(docker_client, sid) == []
        assert [(r.kind, r.id, r.sandbox, r.reason) for r in report.workspaces] == [
            ("workspace", f"slot/{sid}", sid, SANDBOX_GONE)
        ]
        assert not os.path.lexists(slot) and mounted_root(host_mountinfo(), str(slot)) is None
        assert private.orphans(set()) == []
    finally:
        for leftover in containers_of(docker_client, sid):
            leftover.remove(force=True, v=True)
        private.remove_slot(sid)


@pytest.mark.docker
def test_prune_of_one_sandbox_reaps_its_slot_too(docker_client: Any, private: StoragePool) -> None:
    sid, cid, _ = crashed_spare(private)
    slot = private.slot(sid)
    try:
        old = time.time() - storage.ORPHAN_AGE - 60
        os.utime(slot, (old, old))
        report = prune(docker_client.api, orphans=True, sandbox=sid, pool=private)
        assert report.ok, report.errors
        assert [r.id for r in report.containers] == [cid]
        assert containers_of(docker_client, sid) == []
        assert [r.id for r in report.workspaces] == [f"slot/{sid}"]
        assert not os.path.lexists(slot)
    finally:
        for leftover in containers_of(docker_client, sid):
            leftover.remove(force=True, v=True)
        private.remove_slot(sid)


# -- deadline.write_local: a keeper's deadline moved through /proc/PID/root ---------------------


def keeper_pid(docker_client: Any, sb: Sandbox) -> int:
    pid = int(docker_client.api.inspect_container(sb.handle.info["container"])["State"]["Pid"])
    assert pid > 1
    return pid


def deadline_files(sb: Sandbox) -> list[str]:
    """The deadline file and its temporary name, as they are in the sandbox's /tmp."""
    return sorted(n for n in sh(sb, "ls -A /tmp").split() if n.startswith(".agentnest-deadline"))


@pytest.mark.docker
def test_write_local_moves_the_keepers_deadline(docker_client: Any) -> None:
    with Sandbox(backend="docker", timeout=120) as sb:
        cid = sb.handle.info["container"]
        new = time.time() + 3
        assert moved.write_local(keeper_pid(docker_client, sb), cid, new)
        # The file the keeper and prune read: root's, holding the new deadline, no temporary left.
        assert deadline_files(sb) == [".agentnest-deadline"]
        assert sh(sb, "stat -c %u /tmp/.agentnest-deadline") == "0\n"
        recorded = moved.read(docker_client.api, cid, "python3")
        assert recorded == pytest.approx(new, abs=0.01)
        # Earlier than its first deadline: the keeper stops the container then.
        took = wait_until_stopped(docker_client, sb.id, within=20)
        stopped = time.time()
        assert took is not None, "the container outlived its moved deadline"
        assert new - 0.5 <= stopped <= new + 10


@pytest.mark.docker
def test_write_local_refuses_another_container_and_a_planted_file(docker_client: Any) -> None:
    with (
        Sandbox(backend="docker", timeout=120) as first,
        Sandbox(backend="docker", timeout=120) as second,
    ):
        pid = keeper_pid(docker_client, first)
        cid = first.handle.info["container"]
        soon = time.time() + 1
        # A pid that is not in the named container's cgroup (a reused pid): nothing written anywhere.
        assert not moved.write_local(pid, second.handle.info["container"], soon)
        assert not moved.write_local(pid, "0" * 64, soon)
        assert deadline_files(first) == [] and deadline_files(second) == []
        # Sandbox code got there first: its file is neither followed nor replaced.
        sh(
            first,
            "echo mine > /tmp/.agentnest-deadline.new && ln -s /workspace/target /tmp/.agentnest-deadline",
        )
        assert not moved.write_local(pid, cid, soon)
        assert sh(first, "cat /tmp/.agentnest-deadline.new") == "mine\n"
        assert sh(first, "stat -c %u /tmp/.agentnest-deadline.new") == f"{SANDBOX_UID}\n"
        assert not first.exists("target")
        assert moved.read(docker_client.api, cid, "python3") is None
        sh(first, "rm /tmp/.agentnest-deadline.new && ln -s /workspace/target /tmp/.agentnest-deadline.new")
        assert not moved.write_local(pid, cid, soon)
        assert not first.exists("target")
        assert moved.read(docker_client.api, cid, "python3") is None
        # So each keeper still has its first deadline: both run on past the refused one.
        while time.time() < soon + 1:
            assert sh(first, "echo alive") == "alive\n" and sh(second, "echo alive") == "alive\n"
        assert {c.status for sb in (first, second) for c in containers_of(docker_client, sb.id)} == {
            "running"
        }
