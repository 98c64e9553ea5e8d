"""Fork, snapshot/restore, artifacts and download on the real engine (runc and runsc).

The workspace is a tmpfs inside the container and every byte goes through
the agent channel; these tests check what the unit suite cannot: real
isolation between forks, sparse files on a real tmpfs, a read-only root,
the UID the sandbox runs as, and that failures leave no container behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentnest import (
    Artifact,
    EventType,
    FileAccessError,
    MemoryObserver,
    Sandbox,
    SandboxDestroyedError,
    SnapshotError,
    state,
)
from agentnest._core import core_of

from .helpers import container_of, listing, need_storage_pool, owned_containers

MiB = 1024 * 1024
GiB = 1024 * MiB

pytestmark = pytest.mark.timeout(600)

#: Workspace usage (bytes in use on the tmpfs) and a few bytes at offsets of a file.
USAGE = r"""
import json, os, sys
s = os.statvfs(".")
out = {"used": (s.f_blocks - s.f_bfree) * s.f_frsize}
if len(sys.argv) > 1:
    with open(sys.argv[1], "rb") as f:
        out["size"] = os.fstat(f.fileno()).st_size
        out["at"] = {}
        for off in json.loads(sys.argv[2]):
            f.seek(off)
            out["at"][str(off)] = f.read(8).hex()
print(json.dumps(out))
"""


def usage(sb: Sandbox, path: str | None = None, offsets: list[int] | None = None) -> dict[str, Any]:
    argv = ["python3", "-c", USAGE]
    if path is not None:
        argv += [path, json.dumps(offsets or [])]
    result = sb.exec(argv, timeout=60).check()
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def sh(sb: Sandbox, script: str, timeout: float = 120) -> str:
    return sb.exec_shell(script, timeout=timeout).check().stdout


FILL = r"""
set -e
mkdir -p src/pkg data "sp ace/ünï" ro/inner empty
printf 'print("hi")\n' > src/main.py
printf '#!/bin/sh\necho tool\n' > src/tool.sh && chmod 755 src/tool.sh
head -c 300000 /dev/urandom > data/blob.bin
printf 'x' > "sp ace/ünï/file ✓.txt"
ln -s ../src/main.py src/pkg/link.py
ln -s data dlink
printf 'inner' > ro/inner/f && chmod 555 ro/inner ro
chmod 600 data/blob.bin
"""


@pytest.fixture(params=["disk", "memory"])
def workspace(request: pytest.FixtureRequest) -> str:
    """Both paths: "disk" works from the host (the storage pool), "memory" through the agent."""
    medium: str = request.param
    if medium == "disk":
        need_storage_pool()
    return medium


@pytest.fixture
def parent(backend_name: str, workspace: str) -> Iterator[Sandbox]:
    with Sandbox(backend=backend_name, workspace=workspace, timeout=600) as sb:
        sh(sb, FILL)
        yield sb


def test_fork_is_an_independent_copy(parent: Sandbox, docker_client: Any) -> None:
    before = listing(parent)
    events = MemoryObserver()
    core_of(parent).guard.observers = (*core_of(parent).guard.observers, events)
    with parent.fork() as child:
        assert child.id != parent.id
        assert listing(child) == before
        assert child.config.image == parent.config.image
        # Its own container, labels and deadline.
        labels_p = container_of(docker_client, parent).labels
        labels_c = container_of(docker_client, child).labels
        assert labels_c["agentnest.sandbox"] == child.id != labels_p["agentnest.sandbox"]
        assert child.deadline > parent.deadline
        # Neither sees the other's later writes.
        child.write_file("src/main.py", "child")
        sh(child, "rm -rf data && echo new > child-only")
        parent.write_file("parent-only", "p")
        assert parent.read_file("src/main.py") == 'print("hi")\n'
        assert parent.exists("data/blob.bin") and not parent.exists("child-only")
        assert child.read_file("src/main.py") == "child"
        assert not child.exists("parent-only")
        assert sh(child, "id -u").strip() == "65532"
        assert child.read_file("ro/inner/f") == "inner"
        assert "./ro dir 0o555" in listing(child)
    kinds = [e.type for e in events.events]
    assert EventType.SANDBOX_FORKED in kinds


def test_eight_parallel_forks_of_one_parent(parent: Sandbox) -> None:
    expected = listing(parent)
    children: list[Sandbox] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            child = parent.fork()
            with lock:
                children.append(child)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(400)
        assert not errors, errors
        assert len({c.id for c in children}) == 8
        for i, child in enumerate(children):
            child.write_file("mine", str(i))
        for i, child in enumerate(children):
            assert child.read_file("mine") == str(i)
            child.remove_file("mine")
            assert listing(child) == expected
        assert not parent.exists("mine")
    finally:
        for child in children:
            child.destroy()


def test_fork_of_a_destroyed_sandbox(backend_name: str, docker_client: Any, workspace: str) -> None:
    sb = Sandbox(backend=backend_name, workspace=workspace, timeout=120)
    sb.destroy()
    before = owned_containers(docker_client)
    with pytest.raises(SandboxDestroyedError):
        sb.fork()
    assert owned_containers(docker_client) == before


def test_a_refused_fork_leaves_no_child(backend_name: str, docker_client: Any, workspace: str) -> None:
    with Sandbox(backend=backend_name, workspace=workspace, timeout=300) as sb:
        sh(sb, "echo ok > ok.txt && ln -s /etc/passwd out")
        before = owned_containers(docker_client)
        if workspace == "disk":
            # A copy-on-write fork is the parent's file system exactly: the link
            # is copied as a link, and resolves inside the child, as in the parent.
            with sb.fork() as child:
                assert sh(child, "readlink out") == "/etc/passwd\n"
                assert child.read_file("ok.txt") == "ok\n"
            assert owned_containers(docker_client) == before
            return
        # Through the channel the tar rules refuse what a tar cannot carry safely.
        with pytest.raises(SnapshotError) as caught:
            sb.fork()
        assert (caught.value.rule, caught.value.member) == ("symlink", "workspace/out")
        assert owned_containers(docker_client) == before
        assert sb.read_file("ok.txt") == "ok\n"


def test_python_sessions_restart_in_the_child(backend_name: str, workspace: str) -> None:
    with Sandbox(backend=backend_name, workspace=workspace, timeout=300) as sb:
        session = sb.python_session()
        session.run("x = 41").check()
        with sb.fork() as child:
            fresh = child.python_session().run("x + 1")
            assert fresh.error is not None and "NameError" in fresh.error
        assert session.run("x + 1").check().result == "42"


#: Blocks a 1 GiB file with 3 MiB of data may take: btrfs allocates in its own
#: extent sizes (9 MiB measured); a dense copy would take 1 GiB.
SPARSE_MAX = 16 * MiB


def settled_usage(sb: Sandbox, path: str, offsets: list[int]) -> dict[str, Any]:
    """:func:`usage` once the filesystem's count has settled: btrfs counts the space it reserved
    for dirty pages until writeback and commits its quota groups' counts with a transaction, so a
    reading right after a write can be high under load.  A dense copy never settles under
    :data:`SPARSE_MAX`; the last reading is returned either way."""
    deadline = time.monotonic() + 30
    while True:
        sb.exec(["sync"], timeout=60).check()
        doc = usage(sb, path, offsets)
        if doc["used"] < SPARSE_MAX or time.monotonic() > deadline:
            return doc
        time.sleep(0.5)  # the poll's interval: the next reading after a commit


def test_sparse_files_stay_sparse(backend_name: str, tmp_path: Path, workspace: str) -> None:
    # A 1 GiB file in a 64 MiB workspace exists only because it is sparse; a
    # dense copy anywhere on the way would not fit (and would cost 1 GiB).
    offsets = [0, 100 * MiB, 700 * MiB, GiB - 8]
    make = (
        "import os\n"
        "fd = os.open('big.img', os.O_RDWR | os.O_CREAT, 0o644)\n"
        f"os.ftruncate(fd, {GiB})\n"
        f"for off in {offsets}:\n"
        "    os.pwrite(fd, off.to_bytes(8, 'big'), off)\n"
        "os.pwrite(fd, os.urandom(3 * 1024 * 1024), 300 * 1024 * 1024)\n"
    )
    with Sandbox(
        backend=backend_name,
        workspace=workspace,
        timeout=600,
        workspace_size="64m",
        memory="256m",
        scratch_size="16m",
    ) as sb:
        sb.exec_python(make, timeout=120).check()
        original = settled_usage(sb, "big.img", offsets)
        assert original["size"] == GiB
        assert original["used"] < SPARSE_MAX
        with sb.fork() as child:
            copy = settled_usage(child, "big.img", offsets)
            assert copy["size"] == GiB and copy["at"] == original["at"]
            assert copy["used"] < SPARSE_MAX
        path = tmp_path / "sparse.tar"
        meta = sb.snapshot(path)
        assert meta.workspace_size == GiB
        assert meta.size == path.stat().st_size < 8 * MiB
        sh(sb, "rm big.img")
        sb.restore(path)
        back = settled_usage(sb, "big.img", offsets)
        assert back["size"] == GiB and back["at"] == original["at"]
        assert back["used"] < SPARSE_MAX
        digest = sh(sb, "sha256sum big.img", timeout=300).split()[0]
        assert [a.sha256 for a in sb.artifacts("big.img")] == [digest]
        assert sb.artifacts("big.img")[0].size == GiB


def test_snapshot_and_restore_on_a_read_only_root(parent: Sandbox, tmp_path: Path) -> None:
    assert parent.config.read_only_root
    before = listing(parent)
    path = tmp_path / "snap.tar"
    events = MemoryObserver()
    core_of(parent).guard.observers = (*core_of(parent).guard.observers, events)
    meta = parent.snapshot(path)
    assert meta.image == parent.config.image and meta.sandbox_id == parent.id
    assert meta.files == 5
    with tarfile.open(path) as tar:
        names = tar.getnames()
    assert names[0] == "workspace" and names[-1] == state.METADATA_NAME
    assert "workspace/ro/inner/f" in names
    sh(parent, "chmod 755 ro ro/inner && rm -rf ro src && echo changed > data/blob.bin && echo n > new")
    restored = parent.restore(path)
    assert restored == meta
    assert meta.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert listing(parent) == before
    assert sh(parent, "ls -a | grep -c agentnest || true").strip() == "0"
    assert [e.type for e in events.events].count(EventType.SNAPSHOT_RESTORED) == 1
    assert EventType.SNAPSHOT_CREATED in [e.type for e in events.events]


def test_compressed_snapshot_and_from_snapshot(
    parent: Sandbox, tmp_path: Path, backend_name: str, workspace: str
) -> None:
    path = tmp_path / "snap.tar.gz"
    meta = parent.snapshot(path, compress=True)
    assert meta.compressed and path.read_bytes()[:2] == b"\x1f\x8b"
    with Sandbox.from_snapshot(path, backend=backend_name, workspace=workspace, timeout=300) as fresh:
        assert fresh.config.image == meta.image
        assert fresh.id != parent.id
        assert listing(fresh) == listing(parent)


def _hostile(tmp_path: Path, name: str, payload: bytes) -> Path:
    doc = {
        "format": state.FORMAT_NAME,
        "version": 1,
        "created": 0,
        "image": "x",
        "sandbox_id": "x",
        "skipped": [],
        "sha256": hashlib.sha256(payload).hexdigest(),
        "files": 0,
        "entries": 0,
        "size": 0,
    }
    path = tmp_path / name
    path.write_bytes(payload + state._metadata_member(doc, len(payload)))
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> bytes:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.size = len(data)
    ti.linkname = link
    out = ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data
    return out + bytes(-len(out) % 512)


def test_hostile_and_broken_snapshots_leave_the_sandbox_intact(parent: Sandbox, tmp_path: Path) -> None:
    good = tmp_path / "good.tar"
    parent.snapshot(good)
    raw = good.read_bytes()
    top = _member("workspace", tarfile.DIRTYPE)
    cases: dict[str, Path] = {
        "absolute": _hostile(tmp_path, "abs.tar", top + _member("/tmp/evil", data=b"x")),
        "dotdot": _hostile(tmp_path, "dotdot.tar", top + _member("workspace/../../tmp/evil", data=b"x")),
        "symlink": _hostile(tmp_path, "link.tar", top + _member("workspace/l", tarfile.SYMTYPE, link="/etc")),
        "hardlink": _hostile(
            tmp_path, "hard.tar", top + _member("workspace/h", tarfile.LNKTYPE, link="/etc/passwd")
        ),
        "device": _hostile(tmp_path, "dev.tar", top + _member("workspace/null", tarfile.CHRTYPE)),
        "fifo": _hostile(tmp_path, "fifo.tar", top + _member("workspace/p", tarfile.FIFOTYPE)),
        "truncated": tmp_path / "cut.tar",
        "corrupt": tmp_path / "corrupt.tar",
        "checksum": tmp_path / "tampered.tar",
    }
    cases["truncated"].write_bytes(raw[: len(raw) // 2])
    # The third header (workspace/data/blob.bin, names are sorted) becomes garbage.
    assert raw[1024 : 1024 + 23] == b"workspace/data/blob.bin"
    cases["corrupt"].write_bytes(raw[:1024] + b"\x5a" * 512 + raw[1536:])
    cases["checksum"].write_bytes(raw.replace(b'print("hi")', b'print("HI")', 1))
    before = listing(parent)
    for rule, path in cases.items():
        with pytest.raises(SnapshotError) as caught:
            parent.restore(path)
        assert caught.value.rule == rule, (rule, str(caught.value))
        assert listing(parent) == before, rule
    assert sh(parent, "ls -a /workspace | grep -c agentnest || true").strip() == "0"
    assert sh(parent, "test ! -e /tmp/evil && echo absent") == "absent\n"


def test_restore_needs_room_for_old_and_new(backend_name: str, tmp_path: Path, workspace: str) -> None:
    with Sandbox(
        backend=backend_name, workspace=workspace, timeout=300, workspace_size="24m", memory="256m"
    ) as sb:
        sh(sb, "head -c 14000000 /dev/urandom > a.bin")
        path = tmp_path / "s.tar"
        sb.snapshot(path)
        sh(sb, "head -c 14000000 /dev/urandom > a.bin")
        before = listing(sb)
        with pytest.raises(SnapshotError) as caught:
            sb.restore(path)
        assert caught.value.rule == "no_space"
        assert "old and the new" in str(caught.value)
        assert listing(sb) == before
        assert sh(sb, "ls -a | grep -c agentnest || true").strip() == "0"


def test_artifacts_and_download(parent: Sandbox, tmp_path: Path) -> None:
    found = list(parent.artifacts("src/**/*"))
    assert isinstance(parent.artifacts("src/**/*"), tuple)
    main = b'print("hi")\n'
    assert found == [
        Artifact("src/main.py", len(main), hashlib.sha256(main).hexdigest()),
        Artifact("src/tool.sh", 20, hashlib.sha256(b"#!/bin/sh\necho tool\n").hexdigest()),
    ]
    every = {a.path: a for a in parent.artifacts()}
    assert set(every) == {
        "src/main.py",
        "src/tool.sh",
        "data/blob.bin",
        "sp ace/ünï/file ✓.txt",
        "ro/inner/f",
    }
    inside = sh(parent, "sha256sum data/blob.bin").split()[0]
    assert every["data/blob.bin"].sha256 == inside and every["data/blob.bin"].size == 300000

    got = parent.download("data", tmp_path / "out")
    assert got == tmp_path / "out" / "data"
    assert hashlib.sha256((got / "blob.bin").read_bytes()).hexdigest() == inside
    assert (got / "blob.bin").stat().st_mode & 0o777 == 0o600
    assert parent.download("sp ace", tmp_path / "out").joinpath("ünï", "file ✓.txt").read_text() == "x"
    with pytest.raises(FileAccessError) as caught:
        parent.download("src", tmp_path / "out")  # holds a symlink
    assert caught.value.code == "link"
    one = parent.download("src/tool.sh", tmp_path / "one")
    assert one.read_text() == "#!/bin/sh\necho tool\n" and os.access(one, os.X_OK)
