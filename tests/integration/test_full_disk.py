"""Full disks: a workspace's quota, the storage pool, the host disk under it, the audit log's disk.

Each case on the real engine: creates and writes fail with a clear error from
the AgentNest tree, what was written before is byte-identical afterwards, the
sandbox stays usable, and the space comes back (deleting files, destroying
sandboxes, ``prune`` after a killed process).  The pools and disks filled
here are private ones on small tmpfs mounts made and removed by the
fixtures; the shared pool and the host's own disk are never filled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentnest import AuditError, BackendError, FileAccessError, Sandbox
from agentnest.audit import JsonLogObserver
from agentnest.runtime import storage
from agentnest.runtime.docker import DockerBackend
from agentnest.runtime.docker.prune import prune
from agentnest.runtime.registry import get_backend
from agentnest.runtime.storage import StoragePool
from agentnest.state import SPARES
from agentnest.testing.wait import wait_until

from .helpers import need_storage_pool

MiB = 1024 * 1024
GiB = 1024 * MiB

pytestmark = pytest.mark.timeout(180)


def sh(sb: Sandbox, script: str, timeout: float = 60) -> str:
    return sb.exec_shell(script, timeout=timeout).check().stdout


def sha(sb: Sandbox, path: str) -> str:
    return hashlib.sha256(sb.read_file(path, encoding=None)).hexdigest()


def free(path: str | Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    """A private tmpfs of ``size``, unmounted (with anything mounted below it) on the way out."""
    where = Path(tempfile.mkdtemp(prefix="agentnest-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        umount(where)
        where.rmdir()


def umount(path: Path) -> None:
    if subprocess.run(["umount", "-R", str(path)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "-R", "-l", str(path)], capture_output=True, check=False)


def fill(directory: Path, leave: int) -> Path:
    """A file taking all of ``directory``'s free space but ``leave`` bytes."""
    filler = directory / "filler"
    size = free(directory) - leave
    assert size > 0
    subprocess.run(["fallocate", "-l", str(size), str(filler)], check=True)
    return filler


@dataclasses.dataclass
class Private:
    """A 1 GiB pool on its own sparse file, on a 1.2 GiB tmpfs (the "host disk"), and a backend for it."""

    host: Path
    pool: StoragePool
    backend: DockerBackend


@pytest.fixture(scope="module", autouse=True)
def shared_pool() -> StoragePool:
    """Every test here needs disk workspaces (a skip without a pool, a failure under ``make test``)."""
    return need_storage_pool()


@pytest.fixture(scope="module")
def private() -> Iterator[Private]:
    if os.geteuid() != 0:
        pytest.skip("a private storage pool needs root")
    with tmpfs("1200m") as host:
        root = host.parent / f"{host.name}-pool"
        root.mkdir()
        try:
            status, _ = storage.setup(str(root), image=str(host / "pool.img"), size=GiB)
            assert status.ready, status
            shared = get_backend("docker")
            assert isinstance(shared, DockerBackend)
            backend = DockerBackend(dataclasses.replace(shared.spec, storage=str(root)), name="docker")
            pool = backend.storage_pool()
            assert pool is not None and pool.root == root
            yield Private(host, pool, backend)
        finally:
            SPARES.wait_idle(60)
            umount(root)
            root.rmdir()
            storage._found.pop(str(root), None)


# -- a workspace's quota -------------------------------------------------------------------------


def test_a_full_workspace_fails_writes_clearly_and_keeps_its_files(backend_name: str) -> None:
    with Sandbox(backend=backend_name, workspace="disk", disk="32m", timeout=120) as sb:
        sh(sb, "mkdir -p keep && head -c 4M /dev/urandom > keep/a.bin && echo text > keep/b.txt")
        before = {p: sha(sb, p) for p in ("keep/a.bin", "keep/b.txt")}
        full = sb.exec_shell("head -c 40M /dev/urandom > fill.bin", timeout=60)
        assert full.exit_code != 0 and "Disk quota exceeded" in full.stderr, full

        # write_file and upload_file: a FileAccessError naming the quota and the fix.
        calls: list[Callable[[], None]] = [
            lambda: sb.write_file("new.bin", os.urandom(2 * MiB)),
            lambda: sb.upload_file(__file__, "up.py"),
        ]
        for call in calls:
            with pytest.raises(FileAccessError) as info:
                call()
            assert info.value.code == "no_space"
            message = str(info.value)
            assert "workspace is full" in message and "disk=" in message and "delete files" in message
        assert not sb.exists("new.bin") and not sb.exists("up.py")  # nothing half-written left

        # A program writing gets the kernel's EDQUOT; the sandbox answers on.
        shell = sb.exec_shell("head -c 1M /dev/urandom > shell.bin")
        assert shell.exit_code != 0 and "Disk quota exceeded" in shell.stderr
        session = sb.python_session()
        cell = session.run("open('py.bin', 'wb').write(b'x' * (3 << 20))")
        assert cell.error is not None and "Disk quota exceeded" in cell.error
        assert session.run("6 * 7").check().result == "42"  # the interpreter lived through it

        # A snapshot and a fork of the full workspace hold the same bytes; the fork is full too.
        with tempfile.TemporaryDirectory() as tmp:
            meta = sb.snapshot(Path(tmp) / "full.tar")
            assert meta.files >= 3
        with sb.fork() as child:
            assert {p: sha(child, p) for p in before} == before
            with pytest.raises(FileAccessError) as info:
                child.write_file("c.txt", "c" * 65536)
            assert info.value.code == "no_space"

        assert {p: sha(sb, p) for p in before} == before
        # Deleting files gives the room back.
        sh(sb, "rm fill.bin")
        sb.write_file("new.bin", b"n" * (2 * MiB))
        assert sb.exec_shell("head -c 8M /dev/urandom > again.bin").exit_code == 0
        assert {p: sha(sb, p) for p in before} == before


# -- the pool's own filesystem, and the host disk under it ---------------------------------------


@pytest.mark.docker
def test_a_full_pool_refuses_new_workspaces_and_keeps_the_old(private: Private) -> None:
    with Sandbox(backend=private.backend, workspace="disk", disk="1g", timeout=120) as sb:
        sh(sb, "head -c 8M /dev/urandom > keep.bin")
        kept = sha(sb, "keep.bin")
        # The pool fills before the workspace's quota does: ENOSPC inside.
        full = sb.exec_shell("head -c 1100M /dev/zero > fill.bin", timeout=60)
        assert full.exit_code != 0 and "No space left" in full.stderr, full
        with pytest.raises(FileAccessError) as info:
            sb.write_file("more.bin", b"m" * MiB)
        assert info.value.code == "no_space" and "storage pool is full" in str(info.value)
        with pytest.raises(BackendError) as refused:
            Sandbox(backend=private.backend, workspace="disk", disk="64m", timeout=60)
        assert refused.value.reason == "no_space"
        assert "storage pool" in str(refused.value) and "is full" in str(refused.value)
        assert "agentnest prune" in str(refused.value)
        assert sha(sb, "keep.bin") == kept and sh(sb, "echo alive") == "alive\n"
        sh(sb, "rm fill.bin")
        private.pool.reclaim()
        with Sandbox(backend=private.backend, workspace="disk", disk="64m", timeout=60) as other:
            other.write_file("ok.txt", "ok")
        assert sha(sb, "keep.bin") == kept


@pytest.mark.docker
def test_a_nearly_full_host_disk_refuses_new_workspaces(private: Private) -> None:
    with Sandbox(backend=private.backend, workspace="disk", disk="256m", timeout=120) as sb:
        sh(sb, "head -c 8M /dev/urandom > keep.bin")
        kept = sha(sb, "keep.bin")
        filler = fill(private.host, 16 * MiB)  # below the reserve (1/20 of the host disk)
        try:
            with pytest.raises(BackendError) as refused:
                Sandbox(backend=private.backend, workspace="disk", disk="64m", timeout=60)
            message = str(refused.value)
            assert refused.value.reason == "no_space"
            assert "host disk under the storage pool" in message and str(private.host) in message
            assert private.pool.status().detail == message  # what doctor and setup are told
            with pytest.raises(BackendError):  # a fork is a new workspace too
                sb.fork(live=False)
            assert sha(sb, "keep.bin") == kept
        finally:
            filler.unlink()
        with sb.fork(live=False) as child:
            assert sha(child, "keep.bin") == kept


@pytest.fixture
def tiny_host() -> Iterator[tuple[Path, Path]]:
    """A 1 GiB sparse pool on a 300 MiB tmpfs: ``(host dir, pool root)``."""
    if os.geteuid() != 0:
        pytest.skip("a private storage pool needs root")
    with tmpfs("300m") as host:
        root = host.parent / f"{host.name}-pool"
        root.mkdir()
        try:
            yield host, root
        finally:
            umount(root)
            root.rmdir()
            storage._found.pop(str(root), None)


def test_a_full_host_disk_stops_the_pool_read_only_and_keeps_what_was_committed(
    tiny_host: tuple[Path, Path],
) -> None:
    """The dangerous case: the sparse file cannot grow, btrfs sees write errors and stops writing."""
    host, root = tiny_host
    image = host / "pool.img"
    assert storage.setup(str(root), image=str(image), size=GiB)[0].ready
    pool = StoragePool(root)
    ws = pool.create("kept", 512 * MiB, 0, 0)
    data = os.urandom(8 * MiB)
    (ws / "keep.bin").write_bytes(data)
    pool.reclaim()  # committed
    filler = fill(host, 2 * MiB)
    with pytest.raises(BackendError) as refused:
        pool.create("late", 64 * MiB, 0, 0)
    assert refused.value.reason == "no_space"
    # Other programs filled the host after the workspace was handed out; it writes on.
    with pytest.raises(OSError), open(ws / "big.bin", "wb") as f:
        for _ in range(64):
            f.write(os.urandom(MiB))
        os.fsync(f.fileno())
    # Its next commit cannot write the metadata either: the kernel stops the pool.
    subprocess.run([storage._btrfs(), "filesystem", "sync", str(root)], capture_output=True, check=False)
    wait_until(lambda: (pool.shortage() or ("",))[0] == "read_only", "the pool stopping read-only", within=20)
    with pytest.raises(BackendError) as stopped:
        pool.create("later", 64 * MiB, 0, 0)
    assert stopped.value.reason == "read_only"
    assert "read-only" in str(stopped.value) and f"umount {root}" in str(stopped.value)
    assert "what was written before is kept" in str(stopped.value)
    # The fix the message names: room on the host, then mount the pool again.
    filler.unlink()
    umount(root)
    assert storage.setup(str(root), image=str(image))[0].ready
    assert hashlib.sha256((ws / "keep.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
    pool.create("after", 64 * MiB, 0, 0)


# -- prune gives the space back ------------------------------------------------------------------

LEFT_BEHIND = """
import sys, time
from agentnest import Sandbox
sb = Sandbox(backend="docker", workspace="disk", disk="600m", timeout=300)
sb.exec_shell("head -c 700M /dev/zero > fill.bin")
print(sb.id, flush=True)
time.sleep(300)
"""


@pytest.mark.docker
def test_prune_gives_back_the_space_of_full_workspaces(private: Private) -> None:
    pool = private.pool
    pool.reclaim()
    start = pool.capacity()[1]
    # Destroyed: the space is back once btrfs has cleaned the subvolume up.
    with Sandbox(backend=private.backend, workspace="disk", disk="400m", timeout=120) as sb:
        assert sb.exec_shell("head -c 500M /dev/zero > fill.bin", timeout=60).exit_code != 0
        sb.exec_shell("sync")
        wait_until(lambda: pool.capacity()[1] < start - 300 * MiB, "the pool filling")
    pool.reclaim()
    wait_until(lambda: pool.capacity()[1] > start - 16 * MiB, "space back after destroy", within=30)

    # Left behind by a killed process: its container and workspace stay until prune.
    with subprocess.Popen(
        [sys.executable, "-c", LEFT_BEHIND],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTNEST_STORAGE": str(pool.root)},
    ) as child:
        try:
            assert child.stdout is not None
            sid = child.stdout.readline().strip()
            assert sid in pool.names(), (sid, pool.names())
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
    try:
        wait_until(lambda: pool.used(sid) > 500 * MiB or pool.capacity()[1] < start - 500 * MiB, "the fill")
        host_full = free(private.host)
        api = private.backend.api
        first = prune(api, orphans=True, sandbox=sid, pool=pool)
        assert first.ok, first.errors
        assert [r.sandbox for r in first.containers] == [sid]
        # A young workspace waits out the grace period (a sandbox may be being made); then it goes.
        assert first.workspaces == () and sid in pool.names()
        later = prune(api, orphans=True, sandbox=sid, pool=pool, now=time.time() + storage.ORPHAN_AGE + 1)
        assert later.ok and [r.id for r in later.workspaces] == [f"ws/{sid}"]
        assert sid not in pool.names()
        wait_until(lambda: pool.capacity()[1] > start - 16 * MiB, "pool space back after prune", within=30)
        # And the host's: discard punches the freed blocks out of the sparse file (btrfs discards
        # after its cleaner has freed them, a moment after the pool counts them free).
        wait_until(
            lambda: free(private.host) - host_full > 400 * MiB, "the host's space back after prune", within=30
        )
    finally:  # nothing left behind if an assertion failed on the way
        prune(private.backend.api, everything=True, sandbox=sid, pool=pool)


# -- the audit log's disk ------------------------------------------------------------------------


@pytest.mark.docker
def test_a_full_audit_disk_fails_the_operation_and_keeps_the_log_whole() -> None:
    with tmpfs("256k") as disk:
        path = disk / "audit.jsonl"
        log = JsonLogObserver(path)
        filler: Path | None = None
        with Sandbox(backend="docker", workspace="memory", observers=[log], timeout=120) as sb:
            try:
                sh(sb, "echo before")
                # Every page of the disk taken but what the log's last page has left:
                # the next line starts to fit and is cut short.
                filler = fill(disk, 0)
                with pytest.raises(AuditError) as info:
                    for _ in range(200):  # each exec writes ~1 KiB of events
                        sb.exec_shell("echo " + "x" * 500)
                assert "No space left" in str(info.value) and str(path) in str(info.value)
                raw = path.read_bytes()
                assert raw.endswith(b"\n")
                lines = [json.loads(line) for line in raw.splitlines()]
                assert lines[0]["type"] == "sandbox.created"
                filler.unlink()
                filler = None
                assert sh(sb, "echo after") == "after\n"
            finally:
                if filler is not None:
                    filler.unlink()
        raw = path.read_bytes()
        after = [json.loads(line) for line in raw.splitlines()]  # every line whole, before and after
        assert len(after) > len(lines) and after[: len(lines)] == lines
        assert after[-1]["type"] == "sandbox.destroyed"
        assert any(e["data"].get("command") == "echo after" for e in after if "data" in e)
