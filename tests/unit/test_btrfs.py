"""The btrfs ioctls and the storage pool's slots, on a real btrfs of this test's own.

No engine, but the kernel: a small sparse file formatted with ``mkfs.btrfs``,
loop-mounted with quotas on, so every ioctl of :mod:`agentnest.runtime.btrfs`
and every bind mount of :mod:`agentnest.runtime.mounts` runs for real (the
shared storage pool is never touched).  Needs root and btrfs-progs; skipped
with the reason otherwise.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from agentnest.errors import ConfigurationError
from agentnest.runtime import btrfs, mounts
from agentnest.runtime.storage import ORPHAN_AGE, StoragePool

MiB = 1024 * 1024
SANDBOX_UID = 65532
_names = itertools.count()


def fresh(prefix: str) -> str:
    """A name no other test of this module uses (they share one file system)."""
    return f"{prefix}{next(_names)}"


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd=cwd)


@pytest.fixture(scope="module")
def fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 300 MiB btrfs with quotas on, loop-mounted in a temporary directory."""
    if os.geteuid() != 0:
        pytest.skip("btrfs ioctls, loop mounts and qgroups need root")
    missing = [tool for tool in ("mkfs.btrfs", "btrfs", "setpriv") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (btrfs-progs, util-linux)")
    base = tmp_path_factory.mktemp("btrfs")
    image, root = base / "fs.img", base / "mnt"
    with open(image, "wb") as f:
        f.truncate(300 * MiB)  # sparse: costs what is written
    root.mkdir()
    made = run("mkfs.btrfs", "-q", str(image))
    assert made.returncode == 0, made.stderr
    mounted = run("mount", "-o", "loop", str(image), str(root))
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount here: {mounted.stderr.strip()}")
    try:
        quotas = run("btrfs", "quota", "enable", str(root))
        assert quotas.returncode == 0, quotas.stderr
        yield root
    finally:
        # -R: slots left mounted by a failed test are below it.
        if run("umount", "-R", str(root)).returncode != 0:
            run("umount", "-l", str(root))


def sync(root: Path) -> None:
    """Commit the file system: qgroup counts are updated at commits."""
    done = run("btrfs", "filesystem", "sync", str(root))
    assert done.returncode == 0, done.stderr


def shown_id(path: Path) -> int:
    """The subvolume id ``btrfs subvolume show`` reports (btrfs-progs, not our ioctl)."""
    done = run("btrfs", "subvolume", "show", str(path))
    assert done.returncode == 0, done.stderr
    (line,) = [raw for raw in done.stdout.splitlines() if raw.strip().startswith("Subvolume ID:")]
    return int(line.split(":")[1])


def as_sandbox_user(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``cwd`` as uid/gid 65532 without supplementary groups, as sandbox code runs.

    The directory is entered as root first: the temporary directories above it
    are private to root, as a sandbox never sees the pool's parents either.
    """
    return run(
        "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", *argv, cwd=cwd
    )


# -- subvolumes ------------------------------------------------------------------------------


def test_create_makes_a_subvolume(fs: Path) -> None:
    path = fs / fresh("sub")
    btrfs.create(path)
    # The root of a subvolume is inode 256, in a subvolume (a qgroup) of its own.
    assert path.is_dir() and os.stat(path).st_ino == 256
    sid = btrfs.subvolume_id(path)
    assert sid >= 256 and sid != btrfs.subvolume_id(fs) == 5
    assert shown_id(path) == sid
    # A plain directory inside is in its subvolume, not one of its own.
    (path / "plain").mkdir()
    assert btrfs.subvolume_id(path / "plain") == sid


def test_snapshot_copies_the_files_and_is_independent(fs: Path) -> None:
    source, copy = fs / fresh("src"), fs / fresh("copy")
    btrfs.create(source)
    (source / "a.txt").write_text("before")
    (source / "dir").mkdir()
    (source / "dir" / "b.bin").write_bytes(os.urandom(100_000))
    btrfs.snapshot(source, copy)
    assert btrfs.subvolume_id(copy) not in (btrfs.subvolume_id(source), 5)
    assert shown_id(copy) == btrfs.subvolume_id(copy)
    assert (copy / "a.txt").read_text() == "before"
    assert (copy / "dir" / "b.bin").read_bytes() == (source / "dir" / "b.bin").read_bytes()
    # Writes on either side stay on that side.
    (source / "a.txt").write_text("source later")
    (copy / "a.txt").write_text("copy later")
    (copy / "copy-only").write_text("c")
    (source / "dir" / "b.bin").unlink()
    assert (source / "a.txt").read_text() == "source later"
    assert (copy / "a.txt").read_text() == "copy later"
    assert not (source / "copy-only").exists() and (copy / "dir" / "b.bin").exists()


def test_a_read_only_snapshot_refuses_writes(fs: Path) -> None:
    source, frozen = fs / fresh("src"), fs / fresh("ro")
    btrfs.create(source)
    (source / "f").write_text("kept")
    btrfs.snapshot(source, frozen, read_only=True)
    assert (frozen / "f").read_text() == "kept"
    # Not even root may change it: EROFS, whatever the permission bits say.
    for change in (
        lambda: (frozen / "new").write_text("x"),
        lambda: (frozen / "f").write_text("changed"),
        lambda: (frozen / "f").unlink(),
        lambda: os.chmod(frozen / "f", 0o600),
    ):
        with pytest.raises(OSError) as info:
            change()
        assert info.value.errno == errno.EROFS
    assert (frozen / "f").read_text() == "kept"
    # The writable source is not affected.
    (source / "new").write_text("ok")


def test_delete_removes_the_subvolume(fs: Path) -> None:
    path = fs / fresh("gone")
    btrfs.create(path)
    (path / "data").write_bytes(b"x" * 4096)
    sid = btrfs.subvolume_id(path)
    btrfs.delete(path)
    assert not os.path.lexists(path)
    listed = run("btrfs", "subvolume", "list", str(fs)).stdout
    assert f"ID {sid} " not in listed
    # Its name is free again.
    btrfs.create(path)
    assert btrfs.subvolume_id(path) != sid


# -- quotas ----------------------------------------------------------------------------------


def test_the_limit_is_enforced_and_reported(fs: Path) -> None:
    path = fs / fresh("quota")
    btrfs.create(path)
    os.chown(path, SANDBOX_UID, SANDBOX_UID)
    btrfs.limit(path, 8 * MiB)
    assert btrfs.qgroup_usage(path)[1] == 8 * MiB
    # Within the limit: fine, and counted once committed.
    within = as_sandbox_user(path, "dd", "if=/dev/urandom", "of=within", "bs=1M", "count=4")
    assert within.returncode == 0, within.stderr
    sync(fs)
    referenced, cap = btrfs.qgroup_usage(path)
    assert cap == 8 * MiB
    assert 4 * MiB <= referenced <= 4 * MiB + 512 * 1024  # the data and a little metadata
    # Beyond it, the kernel refuses the write (EDQUOT), not this process.
    beyond = as_sandbox_user(path, "dd", "if=/dev/zero", "of=beyond", "bs=1M", "count=16")
    assert beyond.returncode != 0 and "Disk quota exceeded" in beyond.stderr, beyond.stderr
    sync(fs)
    assert btrfs.qgroup_usage(path)[0] <= 8 * MiB
    # A new limit replaces the old one: now the same write fits.
    (path / "beyond").unlink()
    btrfs.limit(path, 32 * MiB)
    again = as_sandbox_user(path, "dd", "if=/dev/zero", "of=beyond", "bs=1M", "count=16")
    assert again.returncode == 0, again.stderr
    assert btrfs.qgroup_usage(path)[1] == 32 * MiB


def test_a_subvolume_without_a_limit_reports_none(fs: Path) -> None:
    path = fs / fresh("free")
    btrfs.create(path)
    (path / "f").write_bytes(b"x" * 65536)
    sync(fs)
    referenced, cap = btrfs.qgroup_usage(path)
    assert cap is None and referenced >= 65536


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [".", "..", "a/b", ""])
def test_bad_names_are_refused_before_the_kernel(fs: Path, name: str) -> None:
    before = sorted(os.listdir(fs))
    # pathlib folds "." and "a/b" away; the functions check the name they are given anyway.
    bad = cast(Path, SimpleNamespace(name=name, parent=fs))
    source = fs / fresh("src")
    btrfs.create(source)
    calls: list[Callable[[], None]] = [
        lambda: btrfs.create(bad),
        lambda: btrfs.delete(bad),
        lambda: btrfs.snapshot(source, bad),
    ]
    for call in calls:
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == errno.EINVAL
    assert sorted(os.listdir(fs)) == sorted([*before, source.name])
    # What a Path can spell reaches the same check.
    with pytest.raises(OSError) as info:
        btrfs.create(fs / "sub" / "..")
    assert info.value.errno == errno.EINVAL


def test_kernel_errors_surface_with_their_errno(fs: Path) -> None:
    path = fs / fresh("twice")
    btrfs.create(path)
    cases: list[tuple[Callable[[], object], int]] = [
        (lambda: btrfs.create(path), errno.EEXIST),  # already there
        (lambda: btrfs.create(fs / "missing-dir" / "x"), errno.ENOENT),  # no parent
        (lambda: btrfs.snapshot(fs / "missing", fs / fresh("s")), errno.ENOENT),  # no source
        (lambda: btrfs.delete(fs / "missing"), errno.ENOENT),
        (lambda: btrfs.create(fs / ("x" * 300)), errno.ENAMETOOLONG),
    ]
    plain = fs / fresh("plain")
    plain.mkdir()
    cases.append((lambda: btrfs.delete(plain), errno.EINVAL))  # a directory, not a subvolume
    for call, expected in cases:
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == expected, (info.value, expected)
    # Not btrfs at all: the ioctl is not there (ENOTTY).
    with pytest.raises(OSError) as info:
        btrfs.subvolume_id(fs.parent)
    assert info.value.errno == errno.ENOTTY


# -- the storage pool's slots ----------------------------------------------------------------


def mounts_at(path: Path) -> list[tuple[str, str]]:
    """``(root in its file system, optional fields)`` of each mount at ``path``, oldest first."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(path):
                found.append((fields[3], " ".join(fields[6 : fields.index("-")])))
    return found


@pytest.fixture(scope="module")
def pool(fs: Path) -> StoragePool:
    """The private file system as a storage pool."""
    return StoragePool(fs)


def test_make_slot_is_an_empty_shared_read_only_mount_point(pool: StoragePool) -> None:
    name = fresh("slot")
    path = pool.make_slot(name)
    try:
        assert path == pool.root / "slot" / name
        st = os.stat(path)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o555)
        assert os.listdir(path) == []
        # Bound onto itself and shared: what is mounted on it later propagates to its copies.
        (seen,) = mounts_at(path)
        assert seen[0] == f"/slot/{name}" and "shared:" in seen[1]
        # The sandbox's user cannot put anything in it.
        made = as_sandbox_user(path, "touch", "x")
        assert made.returncode != 0 and "Permission denied" in made.stderr and not (path / "x").exists()
    finally:
        pool.remove_slot(name)


def test_fill_slot_shows_the_workspace_and_remove_slot_undoes_it(pool: StoragePool) -> None:
    name = fresh("w")
    workspace = pool.create(name, 16 * MiB, SANDBOX_UID, SANDBOX_UID)
    (workspace / "hello.txt").write_text("from the workspace")
    path = pool.make_slot(name)
    pool.fill_slot(name, name)
    assert (path / "hello.txt").read_text() == "from the workspace"
    # The same files, not a copy: a write on one side is on the other.
    (path / "via-slot").write_text("s")
    assert (workspace / "via-slot").read_text() == "s"
    assert os.stat(path).st_ino == 256 and btrfs.subvolume_id(path) == btrfs.subvolume_id(workspace)
    assert [root for root, _ in mounts_at(path)] == [f"/slot/{name}", f"/ws/{name}"]
    assert mounts.top_mount(str(path)) == f"/ws/{name}"
    pool.remove_slot(name)
    assert mounts_at(path) == [] and not os.path.lexists(path)
    pool.remove_slot(name)  # idempotent
    # The workspace itself is untouched, and deletable now that nothing holds it.
    assert (workspace / "hello.txt").read_text() == "from the workspace"
    pool.remove(name)
    assert not os.path.lexists(workspace)


def test_fill_slot_of_a_missing_workspace_fails_and_leaves_the_slot_empty(pool: StoragePool) -> None:
    name = fresh("empty")
    path = pool.make_slot(name)
    try:
        with pytest.raises(Exception, match="mounting workspace"):
            pool.fill_slot(name, fresh("nosuch"))
        assert len(mounts_at(path)) == 1 and os.listdir(path) == []
    finally:
        pool.remove_slot(name)


def test_orphans_list_an_old_slot_before_its_workspace_and_delete_entry_removes_both(
    pool: StoragePool,
) -> None:
    gone, live, young = fresh("gone"), fresh("live"), fresh("young")
    old = time.time() - ORPHAN_AGE - 60
    for name in (gone, live, young):
        pool.create(name, 16 * MiB, SANDBOX_UID, SANDBOX_UID)
        pool.make_slot(name)
        pool.fill_slot(name, name)
    try:
        for name in (gone, live):
            os.utime(pool.slot(name), (old, old))
            os.utime(pool.path(name), (old, old))
        ours = {gone, live, young}
        found = [e for e in pool.orphans({live}) if e.partition("/")[2] in ours]
        # The old unowned one, slot first (its workspace is busy while mounted there); the
        # live one is kept however old, the young one may be a sandbox being created.
        assert found == [f"slot/{gone}", f"ws/{gone}"]
        for entry in found:
            pool.delete_entry(entry)
        assert not os.path.lexists(pool.slot(gone)) and not os.path.lexists(pool.path(gone))
        assert mounts_at(pool.slot(gone)) == []
        assert os.path.isdir(pool.slot(live)) and os.path.isdir(pool.slot(young))
        later = [e for e in pool.orphans(set(), now=time.time() + ORPHAN_AGE) if e.partition("/")[2] in ours]
        assert later == [f"slot/{live}", f"slot/{young}", f"ws/{live}", f"ws/{young}"]
    finally:
        for name in (gone, live, young):
            pool.remove_slot(name)
            pool.remove(name)


@pytest.mark.parametrize("entry", ["slot/../x", "slot/", "slot/a/b", "slots/x", "slot/.hidden"])
def test_delete_entry_refuses_what_is_not_a_slot(pool: StoragePool, entry: str) -> None:
    with pytest.raises(ConfigurationError):
        pool.delete_entry(entry)
