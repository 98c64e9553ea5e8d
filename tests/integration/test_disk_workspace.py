"""Disk workspaces in the btrfs storage pool, and the host-side fast paths (runc and runsc).

What the unit suite cannot check: the workspace really is a subvolume of the
pool that goes with its sandbox, the host's disk pays only for what is
written (measured on the pool's backing file, not as the sandbox reports),
a fork is a consistent instant of its parent, ``prune`` reaps what a crash
left behind, and the host paths (read_file, write_file, artifacts,
download, snapshot) answer exactly as the agent channel does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentnest import ConfigurationError, FileAccessError, Sandbox, SecurityPolicy, SnapshotError
from agentnest._core import core_of
from agentnest.runtime import hostfs as hostfiles
from agentnest.runtime import storage
from agentnest.runtime.docker import DockerBackend
from agentnest.runtime.docker.prune import SANDBOX_GONE, prune
from agentnest.runtime.hostfs import host_workspace as _host_workspace
from agentnest.runtime.registry import get_backend
from agentnest.runtime.storage import StoragePool
from agentnest.state import SPARES
from agentnest.testing.wait import wait_until

from .helpers import REPO, SANDBOX_UID, Background, need_storage_pool, xfail_on

MiB = 1024 * 1024
GiB = 1024 * MiB

pytestmark = pytest.mark.timeout(300)


def sh(sb: Sandbox, script: str, timeout: float = 120) -> str:
    return sb.exec_shell(script, timeout=timeout).check().stdout


def host_bytes(pool: StoragePool) -> int:
    """What the pool costs the host's disk now: the backing file's allocated bytes, after a commit."""
    image = pool.backing_file()
    assert image is not None, "the pool is expected on a loop file (agentnest setup makes one)"
    pool.reclaim()
    return os.stat(image).st_blocks * 512


#: size, allocated bytes and a few bytes at offsets of a file, as the sandbox sees it.
STAT = r"""
import json, os, sys
st = os.stat(sys.argv[1])
out = {"size": st.st_size, "allocated": st.st_blocks * 512, "at": {}}
with open(sys.argv[1], "rb") as f:
    for off in json.loads(sys.argv[2]):
        f.seek(off)
        out["at"][str(off)] = f.read(5).decode()
print(json.dumps(out))
"""


def stat_in(sb: Sandbox, path: str, offsets: list[int]) -> dict[str, Any]:
    result = sb.exec(["python3", "-c", STAT, path, json.dumps(offsets)], timeout=60).check()
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


@pytest.fixture(scope="module", autouse=True)
def pool() -> StoragePool:
    """Every test here needs the pool (a skip without one, a failure under ``make test``)."""
    return need_storage_pool()


@pytest.fixture(scope="module")
def private_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoragePool]:
    """A pool of this module's own, for measuring the host's disk: other sessions write to the shared one."""
    root = tmp_path_factory.mktemp("pool") / "storage"
    status, steps = storage.setup(str(root), size=8 * GiB)  # a sparse file: costs what is written
    try:
        assert status.ready and steps, status
        yield StoragePool(root)
    finally:
        # Warm spares made for this pool's sandboxes have slots mounted in it.
        SPARES.wait_idle(60)
        if subprocess.run(["umount", "-R", str(root)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-R", "-l", str(root)], capture_output=True, check=False)


@pytest.fixture(scope="module")
def private(backend_name: str, private_root: StoragePool) -> tuple[DockerBackend, StoragePool]:
    """The runtime's backend with its disk workspaces in the private pool."""
    shared = get_backend(backend_name)
    assert isinstance(shared, DockerBackend)
    backend = DockerBackend(
        dataclasses.replace(shared.spec, storage=str(private_root.root)), name=backend_name
    )
    found = backend.storage_pool()
    assert found is not None and found.root == private_root.root
    return backend, found


# -- the workspace is a subvolume, and goes with its sandbox ------------------------------------


def test_the_workspace_is_a_subvolume_named_after_the_sandbox(
    private: tuple[DockerBackend, StoragePool],
) -> None:
    backend, pool = private
    before = host_bytes(pool)
    with Sandbox(backend=backend, workspace="disk", disk="256m", timeout=120) as sb:
        path = pool.path(sb.id)
        assert sb.config.limits.workspace_medium == "disk" and sb.config.limits.workspace == 256 * MiB
        # The root of a btrfs subvolume has inode 256; it belongs to the sandbox's user.
        st = os.stat(path)
        assert st.st_ino == 256 and (st.st_uid, st.st_gid) == (SANDBOX_UID, SANDBOX_UID)
        # Incompressible data, written inside, lands in that subvolume on the host.
        sh(sb, "head -c 64M /dev/urandom > blob.bin && sync")
        assert (path / "blob.bin").stat().st_size == 64 * MiB
        written = host_bytes(pool)
        assert written - before >= 48 * MiB
        assert pool.used(sb.id) >= 64 * MiB
    assert not os.path.lexists(path)
    assert sb.id not in pool.names()
    # Deleting the subvolume gave its blocks back to the host.
    assert written - host_bytes(pool) >= 48 * MiB


def test_disk_does_not_count_against_memory(backend_name: str) -> None:
    with Sandbox(backend=backend_name, workspace="disk", memory="128m", disk="512m", timeout=120) as sb:
        assert sb.config.limits.memory == 128 * MiB
        sh(sb, "head -c 300M /dev/zero > big.bin", timeout=120)
        assert stat_in(sb, "big.bin", [])["size"] == 300 * MiB
        assert sh(sb, "echo alive") == "alive\n"
    with pytest.raises(ConfigurationError) as info:
        Sandbox(backend=backend_name, workspace="memory", memory="128m", workspace_size="512m", timeout=60)
    assert "on disk" in str(info.value)


# -- sparse files cost no host disk through fork, snapshot and restore -------------------------

SPARSE = r"""
import os
with open("sparse.bin", "wb") as f:
    f.truncate(3 << 30)
    for off, text in ((0, b"first"), (1 << 30, b"mid01"), ((3 << 30) - 5, b"last!")):
        f.seek(off)
        f.write(text)
"""
OFFSETS = [0, 1 << 30, (3 << 30) - 5]
MARKS = {"0": "first", str(1 << 30): "mid01", str((3 << 30) - 5): "last!"}


def assert_sparse(sb: Sandbox, pool: StoragePool, backend_name: str) -> None:
    """``sparse.bin`` is 3 GiB with its marks, and takes almost no blocks on the host."""
    seen = stat_in(sb, "sparse.bin", OFFSETS)
    assert seen["size"] == 3 * GiB and seen["at"] == MARKS
    if backend_name == "docker":
        assert seen["allocated"] < MiB
    # gVisor reports st_blocks as the size inside; the host's own count is what costs disk.
    assert os.stat(pool.path(sb.id) / "sparse.bin").st_blocks * 512 < MiB


def test_a_3g_sparse_file_costs_no_host_disk(
    backend_name: str, private: tuple[DockerBackend, StoragePool], tmp_path: Path
) -> None:
    backend, pool = private
    slack = 16 * MiB  # btrfs metadata
    with Sandbox(backend=backend, workspace="disk", disk="4g", timeout=180) as parent:
        start = host_bytes(pool)
        parent.exec_python(SPARSE, timeout=60).check()
        assert_sparse(parent, pool, backend_name)
        assert host_bytes(pool) - start < slack

        before = host_bytes(pool)
        with parent.fork() as child:
            assert_sparse(child, pool, backend_name)
            assert host_bytes(pool) - before < slack

        target = tmp_path / "sparse.tar"
        before = host_bytes(pool)
        meta = parent.snapshot(target)
        assert meta.size < 4 * MiB and os.stat(target).st_blocks * 512 < 4 * MiB
        assert host_bytes(pool) - before < slack

    with Sandbox(backend=backend, workspace="disk", disk="4g", timeout=180) as other:
        before = host_bytes(pool)
        other.restore(target)
        assert_sparse(other, pool, backend_name)
        assert host_bytes(pool) - before < slack


# -- a fork is an instant of its parent --------------------------------------------------------

#: Numbered files, each complete (written under a temp name, then renamed) until ``stop`` exists.
WRITER = r"""
import os
os.makedirs("n", exist_ok=True)
i = 0
while not os.path.exists("stop") and i < 200000:
    body = (str(i) + "\n").encode() * 200
    with open("n/.tmp", "wb") as f:
        f.write(body)
    os.rename("n/.tmp", "n/%06d" % i)
    i += 1
print(i)
"""

#: How many numbered files there are, whether they are 0..n-1, and each complete (every size
#: checked; the content of the first and the last ones, those a torn copy would hit, read too).
CHECK = r"""
import json, os
names = sorted(n for n in os.listdir("n") if not n.startswith("."))
numbers = [int(n) for n in names]
body = lambda i: (str(i) + "\n").encode() * 200
complete = all(os.stat("n/" + n).st_size == len(body(int(n))) for n in names)
complete = complete and all(open("n/" + n, "rb").read() == body(int(n)) for n in names[:5] + names[-50:])
prefix = numbers == list(range(len(numbers)))
print(json.dumps({"count": len(numbers), "prefix": prefix, "complete": complete}))
"""


def numbered(sb: Sandbox) -> dict[str, Any]:
    doc: dict[str, Any] = sb.exec_json(CHECK, timeout=60)
    return doc


def test_a_fork_sees_a_consistent_instant(backend_name: str) -> None:
    with Sandbox(backend=backend_name, workspace="disk", disk="512m", timeout=180) as parent:
        writing = Background(lambda: parent.exec_python(WRITER, timeout=150))
        children: list[Sandbox] = []
        try:
            wait_until(lambda: parent.exists("n/000020"), "the parent's first files", within=60)
            for _ in range(3):
                # Files only: a live fork (gVisor, experimental engine) would carry
                # the writer into the child, which then writes on by itself.
                children.append(parent.fork(live=False))
            counts = []
            for child in children:
                found = numbered(child)
                assert found["prefix"] and found["complete"], found
                assert found["count"] >= 20
                counts.append(found["count"])
            assert counts == sorted(counts)  # each fork a later instant of the same history
            # Independent afterwards: the parent writes on, the children have no writer.
            last = counts[-1]
            wait_until(lambda: parent.exists(f"n/{last + 50:06d}"), "the parent writing on", within=60)
            children[0].write_file("child-only", "c")
            for child, count in zip(children, counts, strict=True):
                assert numbered(child)["count"] == count
            assert not parent.exists("child-only") and not children[1].exists("child-only")
        finally:
            parent.write_file("stop", "")
            assert writing.join(60)
            for child in children:
                child.destroy()
        assert writing.error is None
        result = writing.result
        assert result.exit_code == 0 and int(result.stdout) > counts[-1] + 50
        after = numbered(parent)
        assert after["prefix"] and after["complete"]


# -- prune reaps workspaces without a sandbox --------------------------------------------------


def test_prune_reaps_orphaned_workspaces_and_keeps_live_ones(backend_name: str, pool: StoragePool) -> None:
    orphan = os.urandom(6).hex()
    old = time.time() - storage.ORPHAN_AGE - 60
    with Sandbox(backend=backend_name, workspace="disk", disk="64m", timeout=120) as live:
        api = live.backend.api  # type: ignore[attr-defined]
        path = pool.create(orphan, 16 << 20, SANDBOX_UID, SANDBOX_UID)
        try:
            # Both old: only the container's existence keeps the live one.
            os.utime(path, (old, old))
            os.utime(pool.path(live.id), (old, old))
            dry = prune(api, pool=pool, dry_run=True)
            listed = {r.id: r for r in dry.workspaces}
            assert f"ws/{orphan}" in listed and f"ws/{live.id}" not in listed
            found = listed[f"ws/{orphan}"]
            assert (found.kind, found.sandbox, found.reason) == ("workspace", orphan, SANDBOX_GONE)
            assert dry.dry_run and path.exists()
            # Only this orphan (other sessions share the engine and the pool).
            report = prune(api, pool=pool, sandbox=orphan)
            assert report.ok, report.errors
            assert [r.id for r in report.workspaces] == [f"ws/{orphan}"]
            assert not os.path.lexists(path) and orphan not in pool.names()
            assert pool.path(live.id).exists()
            assert live.exec_shell("echo ok > f && cat f").stdout == "ok\n"
            # A live sandbox's workspace stays under a full prune of it, old or not.
            again = prune(api, pool=pool, sandbox=live.id)
            assert again.workspaces == () and pool.path(live.id).exists()
        finally:
            pool.remove(orphan)


# -- setup and doctor --------------------------------------------------------------------------


def agentnest(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / ".venv/bin/agentnest"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_setup_makes_a_pool_once_then_takes_no_steps(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("agentnest setup needs root")
    root = tmp_path / "pool"
    try:
        first = agentnest("setup", "--path", str(root), "--size", "1g")
        assert first.returncode == 0, first.stderr
        steps = [line for line in first.stdout.splitlines() if line.startswith("setup: ")]
        assert len(steps) == 3 and steps[-1] == "setup: enabled quotas", first.stdout
        assert f"storage pool ready at {root}" in first.stdout
        second = agentnest("setup", "--path", str(root))
        assert second.returncode == 0, second.stderr
        assert not [line for line in second.stdout.splitlines() if line.startswith("setup:")], second.stdout
        assert f"storage pool ready at {root}" in second.stdout and "0 workspace(s)" in second.stdout
        # The one on this host, made by `make engine`: ready, nothing to do.
        default = agentnest("setup")
        assert default.returncode == 0 and "setup:" not in default.stdout
        assert f"storage pool ready at {storage.DEFAULT_ROOT}" in default.stdout
    finally:
        subprocess.run(["umount", str(root)], capture_output=True, check=False)


@pytest.mark.docker
def test_doctor_reports_the_storage_pool_ok() -> None:
    need_storage_pool()
    done = agentnest("doctor", "--json", "--backend", "docker", timeout=240)
    doc = json.loads(done.stdout)
    (check,) = [c for c in doc["checks"] if c["name"] == "storage pool"]
    assert check["status"] == "ok", check
    assert check["detail"].startswith(f"{storage.DEFAULT_ROOT}: ") and "free of" in check["detail"]


# -- the host paths answer as the channel does ------------------------------------------------

POLICY = SecurityPolicy(max_file_bytes=4 * MiB)
BAD = r"""
set -e
mkdir -p bad/adir bad/locked-dir
echo inside > bad/adir/f
ln -s adir bad/link
echo secret > bad/locked && chmod 000 bad/locked
echo x > bad/locked-dir/f && chmod 000 bad/locked-dir
mkfifo bad/fifo
head -c 5M /dev/zero > bad/big.bin
"""
TREE = r"""
set -e
mkdir -p tree/sub/deep "tree/sp ace" tree/empty
python3 -c 'import random; random.seed(7); open("tree/sub/blob.bin", "wb").write(random.randbytes(300000))'
printf 'hello\n' > tree/a.txt
: > tree/sub/deep/empty.txt
printf 'ünï' > "tree/sp ace/ünï.txt"
chmod 640 tree/a.txt
truncate -s 10M tree/sparse.bin
ln -s ../a.txt tree/sub/link
"""
READS = ["bad/missing", "bad/adir", "bad/link/f", "bad/locked", "bad/fifo", "bad/big.bin", "bad/locked-dir/f"]
WRITES = ["bad/link/new", "bad/adir", "bad/locked-dir/new", "bad/missing-dir/../../../out"]
EXPECTED = {
    "bad/missing": "not_found",
    "bad/adir": "is_directory",
    "bad/link/f": "symlink",
    "bad/locked": "permission",
    "bad/fifo": "not_regular",
    "bad/big.bin": "too_large",
    "bad/locked-dir/f": "permission",
}


@pytest.fixture(scope="module")
def pair(backend_name: str) -> Iterator[dict[str, Sandbox]]:
    """A disk sandbox (host paths) and a memory one (the channel), holding the same files."""
    need_storage_pool()
    with (
        Sandbox(
            backend=backend_name, workspace="disk", disk="256m", security_policy=POLICY, timeout=300
        ) as disk,
        Sandbox(
            backend=backend_name,
            workspace="memory",
            workspace_size="64m",
            security_policy=POLICY,
            timeout=300,
        ) as memory,
    ):
        for sb in (disk, memory):
            sh(sb, BAD + TREE)
        yield {"disk": disk, "memory": memory}


def outcome(call: Any) -> str:
    try:
        call()
    except FileAccessError as exc:
        return exc.code
    return "ok"


def codes(sb: Sandbox, paths: list[str], *, write: bool) -> dict[str, str]:
    """The FileAccessError code (or ``ok``) of reading, or writing, each path."""
    if write:
        return {p: outcome(lambda p=p: sb.write_file(p, b"w")) for p in paths}
    return {p: outcome(lambda p=p: sb.read_file(p, encoding=None)) for p in paths}


def test_file_errors_are_the_same_on_both_paths(
    pair: dict[str, Sandbox], backend_name: str, pool: StoragePool
) -> None:
    disk = pair["disk"]
    # The disk sandbox takes the host paths, for reads and writes on both runtimes; the other not.
    assert _host_workspace(disk) == pool.path(disk.id) and _host_workspace(pair["memory"]) is None
    assert _host_workspace(disk, write=True) == pool.path(disk.id)
    reads = {m: codes(sb, READS, write=False) for m, sb in pair.items()}
    assert reads["disk"] == reads["memory"] == EXPECTED
    # The host path itself answers so, not a fallback to the channel; on gVisor a name the
    # host cannot find is left to the agent (FIFOs and sockets made inside live in its kernel).
    limit = core_of(disk).guard.policy.read_limit
    direct = {p: outcome(lambda p=p: hostfiles.read(disk, p, limit)) for p in READS}
    deferred = {"bad/missing": "ok", "bad/fifo": "ok"} if backend_name == "gvisor" else {}
    assert direct == {**EXPECTED, **deferred}
    if backend_name == "gvisor":
        assert hostfiles.read(disk, "bad/missing", limit) is None
    writes = {m: codes(sb, WRITES, write=True) for m, sb in pair.items()}
    assert writes["disk"] == writes["memory"]
    assert writes["disk"]["bad/link/new"] == "symlink" and writes["disk"]["bad/adir"] != "ok"
    assert writes["disk"]["bad/missing-dir/../../../out"] == "outside_workspace"
    # Nothing was made where a write was refused.
    for sb in pair.values():
        assert not sb.exists("bad/adir/new") and sb.read_file("bad/adir/f") == "inside\n"
        assert sb.exec_shell("test -e /workspace/../out || test -e bad/link/new").exit_code != 0


def test_files_written_on_the_host_are_seen_inside_at_once(backend_name: str) -> None:
    """Host-side write_file is coherent with what the sandbox's kernel sees (gVisor's Sentry too)."""
    with Sandbox(backend=backend_name, workspace="disk", disk="256m", timeout=300) as sb:
        assert _host_workspace(sb, write=True) is not None
        listing = "import json, os, sys; print(json.dumps(sorted(os.listdir(sys.argv[1]))))"
        for i in range(8):
            # The sandbox makes and removes files and directories; the host replaces and adds.
            here, there = f"d{i % 2}", f"d{(i + 1) % 2}"
            sh(sb, f"echo inside{i} > f.txt && rm -rf {there} && mkdir -p {here}/m && echo z > {here}/m/z")
            sb.write_file("f.txt", f"host{i}")
            sb.write_file(f"{here}/m/new{i}.txt", "n")
            sb.write_file(f"{there}/deep/er/file.txt", f"deep{i}")
            assert sh(sb, "cat f.txt") == f"host{i}"
            seen = json.loads(sb.exec(["python3", "-c", listing, f"{here}/m"]).check().stdout)
            assert f"new{i}.txt" in seen and "z" in seen
            assert sh(sb, f"cat {there}/deep/er/file.txt") == f"deep{i}"


WALK = r"""
import json, os
out = {}
for root, dirs, files in os.walk("."):
    out[root + "/"] = sorted(dirs)
    for f in files:
        out[os.path.join(root, f)] = open(os.path.join(root, f)).read()
print(json.dumps(out, sort_keys=True))
"""


def test_a_restore_on_the_host_is_what_the_sandbox_sees(backend_name: str, tmp_path: Path) -> None:
    """The host-side extractor's swap (directories renamed on the host) is seen inside at once."""
    with Sandbox(backend=backend_name, workspace="disk", disk="256m", timeout=300) as sb:
        assert _host_workspace(sb, write=True) is not None
        sh(sb, "mkdir -p a/one a/two b && echo A1 > a/one/f && echo A2 > a/two/g && echo AB > b/x")
        first = sb.exec_json(WALK)
        sb.snapshot(tmp_path / "first.tar")
        sh(sb, "rm -rf a b && mkdir -p a/three c && echo B3 > a/three/h && echo BC > c/y")
        second = sb.exec_json(WALK)
        sb.snapshot(tmp_path / "second.tar")
        session = sb.python_session()
        session.run("import os").check()
        for _ in range(3):
            for name, want in (("first", first), ("second", second)):
                sb.restore(tmp_path / f"{name}.tar")
                assert sb.exec_json(WALK) == want  # a new process's view
                # and a process that lived through the swap, looking the names up again
                assert session.run("sorted(os.listdir('a'))").check().result == repr(want["./a/"])


def test_bytes_ownership_and_modes_are_the_same_on_both_paths(
    pair: dict[str, Sandbox], pool: StoragePool
) -> None:
    data = os.urandom(3 * MiB + 17)
    probe = r"""
import hashlib, json, os
out = {}
for p in ("made", "made/deep", "made/deep/f.bin"):
    st = os.stat(p)
    out[p] = [st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)]
out["sha"] = hashlib.sha256(open("made/deep/f.bin", "rb").read()).hexdigest()
print(json.dumps(out))
"""
    seen = {}
    for medium, sb in pair.items():
        sb.write_file("made/deep/f.bin", data, mode=0o640)
        assert sb.read_file("made/deep/f.bin", encoding=None) == data
        if medium == "disk":  # what the host path itself reads
            assert hostfiles.read(sb, "made/deep/f.bin", len(data)) == data
        inside = sb.exec_shell("sha256sum tree/sub/blob.bin").check().stdout.split()[0]
        assert hashlib.sha256(sb.read_file("tree/sub/blob.bin", encoding=None)).hexdigest() == inside
        seen[medium] = sb.exec_json(probe, timeout=60)
    assert seen["disk"] == seen["memory"]
    assert seen["disk"]["sha"] == hashlib.sha256(data).hexdigest()
    assert seen["disk"]["made/deep/f.bin"] == [SANDBOX_UID, SANDBOX_UID, "0o640"]
    assert seen["disk"]["made"][:2] == seen["disk"]["made/deep"][:2] == [SANDBOX_UID, SANDBOX_UID]
    # And on the host, in the pool: the sandbox's user, never root.
    on_host = pool.path(pair["disk"].id) / "made/deep/f.bin"
    st = on_host.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (SANDBOX_UID, SANDBOX_UID, 0o640)
    assert on_host.parent.stat().st_uid == on_host.parent.parent.stat().st_uid == SANDBOX_UID


def tree_of(root: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(base) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_symlink():
                found[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                found[rel] = ("dir", st.st_mode & 0o777)
            else:
                found[rel] = ("file", st.st_mode & 0o777, hashlib.sha256(p.read_bytes()).hexdigest())
    return found


def snapshot_members(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with tarfile.open(path) as tar:
        for m in tar:
            f = tar.extractfile(m) if m.isfile() else None
            digest = hashlib.sha256(f.read()).hexdigest() if f is not None else ""
            found[m.name] = (m.type, m.mode, m.size, m.uid, m.gid, m.linkname, digest)
    return found


def test_artifacts_download_and_snapshots_are_the_same_on_both_paths(
    pair: dict[str, Sandbox], tmp_path: Path
) -> None:
    results: dict[str, dict[str, Any]] = {}
    for medium, sb in pair.items():
        sh(sb, "chmod 700 bad/locked-dir && rm -rf bad made")  # what a snapshot refuses
        got: dict[str, Any] = {"artifacts": sb.artifacts("tree/**")}
        meta = sb.snapshot(tmp_path / medium / "snap.tar")
        got["snapshot"] = snapshot_members(meta.path)
        got["counts"] = (meta.files, meta.entries)
        # A link is refused by download, as a whole tree or alone.
        out = tmp_path / medium
        got["link"] = [
            outcome(lambda p=p, sb=sb, out=out: sb.download(p, out / "l")) for p in ("tree", "tree/sub/link")
        ]
        sh(sb, "rm tree/sub/link")
        got["download"] = tree_of(sb.download("tree", out / "dl"))
        got["file"] = sb.download("tree/a.txt", out / "one").read_bytes()
        results[medium] = got
        sh(sb, "ln -s ../a.txt tree/sub/link && " + BAD)  # as the fixture left them, for any test after
    disk, memory = results["disk"], results["memory"]
    assert disk["artifacts"] == memory["artifacts"]
    assert {a.path for a in disk["artifacts"]} >= {"tree/a.txt", "tree/sub/blob.bin", "tree/sparse.bin"}
    assert disk["download"] == memory["download"] and "sub/blob.bin" in disk["download"]
    assert disk["file"] == memory["file"] == b"hello\n"
    assert disk["link"] == memory["link"] == ["link", "link"]
    assert disk["counts"] == memory["counts"]
    payload = {k: v for k, v in disk["snapshot"].items() if k != "agentnest-snapshot.json"}
    assert payload == {k: v for k, v in memory["snapshot"].items() if k != "agentnest-snapshot.json"}
    assert "workspace/tree/sub/link" in payload and "workspace/tree/sparse.bin" in payload


def test_snapshots_report_the_same_skipped_fifos_on_both_paths(
    pair: dict[str, Sandbox], tmp_path: Path, request: pytest.FixtureRequest, backend_name: str
) -> None:
    xfail_on(
        request,
        backend_name,
        "gvisor",
        "product bug: on gVisor a FIFO made inside lives in gVisor's own kernel, so the host-side "
        "snapshot of a disk workspace never sees it and SnapshotMetadata.skipped is empty, while "
        "the channel path (workspace='memory') lists workspace/pipes/p",
    )
    skipped = {}
    for medium, sb in pair.items():
        sh(sb, "chmod 700 bad/locked-dir && rm -rf bad && mkdir pipes && mkfifo pipes/p")
        try:
            meta = sb.snapshot(tmp_path / f"{medium}.tar")
        finally:
            sh(sb, "rm -rf pipes && " + BAD)
        skipped[medium] = meta.skipped
        assert "workspace/pipes/p" not in snapshot_members(meta.path)
    assert skipped["memory"] == ("workspace/pipes/p",)
    assert skipped["disk"] == skipped["memory"]


# -- restore into a workspace too small --------------------------------------------------------


@pytest.fixture(scope="module")
def big_snapshot(backend_name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot holding 24 MiB of incompressible data."""
    with Sandbox(backend=backend_name, workspace="disk", disk="128m", timeout=120) as source:
        sh(source, "head -c 24M /dev/urandom > big.bin")
        return source.snapshot(tmp_path_factory.mktemp("big") / "big.tar").path


def test_restoring_a_snapshot_bigger_than_disk_fails_and_keeps_the_files(
    backend_name: str, big_snapshot: Path
) -> None:
    with Sandbox(backend=backend_name, workspace="disk", disk="16m", timeout=120) as target:
        target.write_file("old.txt", "old")
        sh(target, "mkdir -p keep && head -c 12M /dev/urandom > keep/k")
        digest = target.exec_shell("sha256sum keep/k").check().stdout
        with pytest.raises(SnapshotError) as info:
            target.restore(big_snapshot)
        assert info.value.rule == "size" and info.value.member == "workspace/big.bin"
        assert target.read_file("old.txt") == "old"
        assert target.exec_shell("sha256sum keep/k").check().stdout == digest
        assert sorted(e.path for e in target.list_files()) == ["keep", "old.txt"]
    # It fits disk=, but not beside the old files while it stages: the kernel refuses (EDQUOT).
    with Sandbox(backend=backend_name, workspace="disk", disk="40m", timeout=120) as target:
        sh(target, "mkdir -p keep && head -c 20M /dev/urandom > keep/k")
        digest = target.exec_shell("sha256sum keep/k").check().stdout
        with pytest.raises(SnapshotError) as info:
            target.restore(big_snapshot)
        assert info.value.rule == "no_space" and "old and the new files" in str(info.value)
        assert target.exec_shell("sha256sum keep/k").check().stdout == digest
        assert sorted(e.path for e in target.list_files()) == ["keep"]
        # Nothing staged is left behind: the room is back.
        sh(target, "rm keep/k")
        assert target.restore(big_snapshot).files == 1
        assert stat_in(target, "big.bin", [])["size"] == 24 * MiB


def test_the_too_big_restore_error_names_the_fix(backend_name: str, big_snapshot: Path) -> None:
    with (
        Sandbox(backend=backend_name, workspace="disk", disk="16m", timeout=120) as target,
        pytest.raises(SnapshotError) as info,
    ):
        target.restore(big_snapshot)
    assert "disk=" in str(info.value) or "workspace_size=" in str(info.value)
