"""Disk workspaces without an engine: the medium's resolution, limits, and the pool's pure logic.

Nothing here touches the real storage pool: the pool-shaped directories are
temporary ones, and root, btrfs-progs and the mount table are faked where a
code path asks for them.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentnest.config import DEFAULT_DISK, MAX_DISK, ResourceLimits
from agentnest.errors import AgentNestError, BackendError, ConfigurationError, UnsupportedCapabilityError
from agentnest.ops import workspace_medium
from agentnest.runtime import storage
from agentnest.runtime.base import Capability
from agentnest.runtime.storage import ORPHAN_AGE, StoragePool, human_size, local_engine

MiB = 1024 * 1024
GiB = 1024 * MiB
HAS = frozenset({Capability.DISK_WORKSPACE})
NONE: frozenset[Capability] = frozenset()

# -- workspace_medium: Sandbox(workspace=, disk=, workspace_size=) ----------------------------


@pytest.mark.parametrize(
    ("workspace", "disk", "size", "caps", "expected"),
    [
        # No kind asked: the disk where there is a pool, memory otherwise.
        (None, None, None, HAS, ("disk", None)),
        (None, None, None, NONE, ("memory", None)),
        (None, None, "64m", HAS, ("disk", "64m")),
        (None, None, "64m", NONE, ("memory", "64m")),
        # disk= alone means the disk.
        (None, "1g", None, HAS, ("disk", "1g")),
        (None, "1g", "1g", HAS, ("disk", "1g")),
        ("disk", None, None, HAS, ("disk", None)),
        ("disk", "2g", None, HAS, ("disk", "2g")),
        ("disk", None, "2g", HAS, ("disk", "2g")),
        # Memory when asked, pool or not.
        ("memory", None, None, HAS, ("memory", None)),
        ("memory", None, None, NONE, ("memory", None)),
        ("memory", None, "64m", HAS, ("memory", "64m")),
        ("memory", None, 64 * MiB, NONE, ("memory", 64 * MiB)),
    ],
)
def test_workspace_medium_resolves(
    workspace: str | None,
    disk: str | None,
    size: int | str | None,
    caps: frozenset[Capability],
    expected: tuple[str, int | str | None],
) -> None:
    assert workspace_medium(workspace, disk, size, caps) == expected


@pytest.mark.parametrize(
    ("workspace", "disk", "size"),
    [("disk", None, None), ("disk", "1g", None), ("disk", None, "1g"), (None, "1g", None)],
)
def test_asking_for_the_disk_without_a_pool_is_refused_naming_the_fix(
    workspace: str | None, disk: str | None, size: str | None
) -> None:
    with pytest.raises(UnsupportedCapabilityError) as info:
        workspace_medium(workspace, disk, size, NONE)
    message = str(info.value)
    assert "agentnest setup" in message and "workspace='memory'" in message
    assert "no sandbox was created" in message


@pytest.mark.parametrize("caps", [HAS, NONE])
def test_disk_and_memory_together_are_refused_naming_workspace_size(caps: frozenset[Capability]) -> None:
    with pytest.raises(ConfigurationError) as info:
        workspace_medium("memory", "1g", None, caps)
    assert "workspace_size=" in str(info.value) and "workspace='memory'" in str(info.value)


@pytest.mark.parametrize("workspace", [None, "disk", "memory"])
@pytest.mark.parametrize("caps", [HAS, NONE])
def test_two_different_sizes_are_refused(workspace: str | None, caps: frozenset[Capability]) -> None:
    with pytest.raises(ConfigurationError) as info:
        workspace_medium(workspace, "1g", "2g", caps)
    assert "pass one of them" in str(info.value)


@pytest.mark.parametrize("kind", ["tmpfs", "DISK", "", "ssd"])
def test_an_unknown_workspace_kind_is_refused_naming_the_kinds(kind: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        workspace_medium(kind, None, None, HAS)
    assert "'disk' or 'memory'" in str(info.value)


def test_refusals_are_in_the_exception_tree() -> None:
    calls: list[Callable[[], object]] = [
        lambda: workspace_medium("disk", None, None, NONE),
        lambda: workspace_medium("memory", "1g", None, HAS),
        lambda: workspace_medium("nvme", None, None, HAS),
    ]
    for call in calls:
        with pytest.raises(AgentNestError):
            call()


# -- ResourceLimits with a disk workspace ------------------------------------------------------


def test_a_disk_workspace_defaults_to_room_for_a_project() -> None:
    limits = ResourceLimits(workspace_medium="disk")
    assert limits.workspace == DEFAULT_DISK == 8 * GiB
    # The memory default is unchanged, and far below the workspace.
    assert limits.memory == 512 * MiB
    assert ResourceLimits.build(workspace_medium="disk").workspace == DEFAULT_DISK
    # In memory the default still follows the memory limit.
    assert ResourceLimits().workspace == 256 * MiB
    assert ResourceLimits.build(memory="128m").workspace == 64 * MiB


def test_a_disk_workspace_does_not_count_against_memory() -> None:
    limits = ResourceLimits.build(memory="128m", workspace="512m", workspace_medium="disk")
    assert (limits.memory, limits.workspace) == (128 * MiB, 512 * MiB)
    assert ResourceLimits.build(memory="64m", workspace="64g", workspace_medium="disk").workspace == 64 * GiB
    # The same sizes in memory are refused, and the message names the disk as a fix.
    with pytest.raises(ConfigurationError) as info:
        ResourceLimits.build(memory="128m", workspace="512m", workspace_medium="memory")
    assert "workspace (512m)" in str(info.value) and "on disk" in str(info.value)


def test_with_a_disk_workspace_only_scratch_counts_against_memory() -> None:
    # 128m leaves 32m for processes: 96m of scratch fits, 97m does not.
    ok = ResourceLimits.build(memory="128m", scratch="96m", workspace="100g", workspace_medium="disk")
    assert ok.scratch == 96 * MiB
    with pytest.raises(ConfigurationError) as info:
        ResourceLimits.build(memory="128m", scratch="97m", workspace_medium="disk")
    message = str(info.value)
    assert message.startswith("scratch (97m) must leave at least 32m of memory (128m)")
    assert "workspace (" not in message  # the disk workspace is not part of the sum
    assert "raise memory" in message


def test_a_disk_workspace_beyond_max_disk_is_refused() -> None:
    assert ResourceLimits(workspace=MAX_DISK, workspace_medium="disk").workspace == MAX_DISK
    with pytest.raises(ConfigurationError) as info:
        ResourceLimits(workspace=MAX_DISK + MiB, workspace_medium="disk")
    assert "out of range" in str(info.value) and "at most 65536g" in str(info.value)
    with pytest.raises(ConfigurationError):
        ResourceLimits.build(workspace="65537g", workspace_medium="disk")


def test_a_disk_workspace_still_needs_a_megabyte() -> None:
    with pytest.raises(ConfigurationError) as info:
        ResourceLimits(workspace=4096, workspace_medium="disk")
    assert "at least 1m" in str(info.value)


@pytest.mark.parametrize("medium", ["ssd", "Disk", "", "tmpfs"])
def test_an_invalid_medium_is_refused(medium: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ResourceLimits(workspace_medium=medium)
    assert "'disk' or 'memory'" in str(info.value)


# -- the pool's names ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "0123456789ab", "A_b.c-d", "x" * 64, "9"])
def test_valid_workspace_names_map_below_ws(tmp_path: Path, name: str) -> None:
    assert StoragePool(tmp_path).path(name) == tmp_path / "ws" / name


@pytest.mark.parametrize(
    "name", ["", ".", "..", "../x", "a/b", "-a", ".hidden", "_a", "x" * 65, "a b", "a\x00", "é", 12, None]
)
def test_invalid_workspace_names_are_refused(tmp_path: Path, name: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        StoragePool(tmp_path).path(name)
    assert "is invalid" in str(info.value)


def test_names_lists_only_valid_workspace_names(tmp_path: Path) -> None:
    pool = StoragePool(tmp_path)
    assert pool.names() == []  # no ws/ at all
    for name in ("bbb", "aaa", ".tmp", "-x"):
        (tmp_path / "ws" / name).mkdir(parents=True)
    assert pool.names() == ["aaa", "bbb"]


# -- orphans ---------------------------------------------------------------------------------


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    pid = proc.pid
    assert not os.path.exists(f"/proc/{pid}")
    return pid


def test_orphans_are_old_unowned_workspaces_and_snapshots_of_exited_processes(tmp_path: Path) -> None:
    now = time.time()
    old, new = now - ORPHAN_AGE - 5, now - ORPHAN_AGE / 2
    ws = tmp_path / "ws"
    for name, when in (("oldlive", old), ("oldgone", old), ("newgone", new), ("newlive", new)):
        (ws / name).mkdir(parents=True)
        os.utime(ws / name, (when, when))
    snap = tmp_path / "snap"
    live_snap, dead_snap = f"{os.getpid()}-abc123", f"{_dead_pid()}-def456"
    for entry in (live_snap, dead_snap, "notapid-0"):
        (snap / entry).mkdir(parents=True)
    pool = StoragePool(tmp_path)
    found = pool.orphans({"oldlive", "newlive"}, now=now)
    # A live name is kept however old; a young one may be a sandbox being created.
    assert sorted(found) == sorted(["ws/oldgone", f"snap/{dead_snap}", "snap/notapid-0"])
    # Later, the young unowned one is due too; the live reader's snapshot never is.
    later = pool.orphans({"oldlive", "newlive"}, now=now + ORPHAN_AGE)
    assert sorted(later) == sorted(["ws/oldgone", "ws/newgone", f"snap/{dead_snap}", "snap/notapid-0"])
    everyone = {"oldlive", "newlive", "oldgone", "newgone"}
    assert sorted(pool.orphans(everyone, now=now + ORPHAN_AGE)) == sorted(
        [f"snap/{dead_snap}", "snap/notapid-0"]
    )


def test_orphans_of_an_empty_pool(tmp_path: Path) -> None:
    assert StoragePool(tmp_path).orphans(set()) == []
    assert StoragePool(tmp_path / "missing").orphans(set()) == []


# -- delete_entry ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "ws",
        "ws/",
        "ws/..",
        "ws/.",
        "ws/a/b",
        "snap/../ws",
        "other/abc",
        "/ws/abc",
        "ws/-x",
        "../ws/a",
        "ws/a b",
    ],
)
def test_delete_entry_refuses_what_is_not_a_pool_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    deleted: list[Path] = []
    monkeypatch.setattr(storage, "_delete", deleted.append)
    with pytest.raises(ConfigurationError) as info:
        StoragePool(tmp_path).delete_entry(entry)
    assert "is not a storage pool entry" in str(info.value)
    assert deleted == []


@pytest.mark.parametrize("entry", ["ws/0123456789ab", "snap/123-abcdef"])
def test_delete_entry_deletes_below_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    deleted: list[Path] = []
    monkeypatch.setattr(storage, "_delete", deleted.append)
    StoragePool(tmp_path).delete_entry(entry)
    assert deleted == [tmp_path / entry]


# -- human_size, local_engine ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0b"),
        (1023, "1023b"),
        (MiB - 1, f"{MiB - 1}b"),
        (MiB, "1m"),
        (300 * MiB, "300m"),
        (1536 * MiB, "1.5g"),
        (GiB, "1g"),
        (8 * GiB, "8g"),
        (10 * GiB, "10g"),
        (100 * GiB, "100g"),
        (int(7.5 * GiB), "7.5g"),
        (1023 * MiB, "1023m"),
    ],
)
def test_human_size(n: int, text: str) -> None:
    assert human_size(n) == text


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("", True),
        ("unix:///var/run/docker.sock", True),
        ("unix:///run/user/1000/docker.sock", True),
        ("tcp://127.0.0.1:2375", False),
        ("tcp://engine.example:2376", False),
        ("ssh://user@engine.example", False),
        ("npipe:////./pipe/docker_engine", False),
    ],
)
def test_local_engine(host: str, local: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    assert local_engine(host) is local
    # None reads $DOCKER_HOST; unset is the local default socket.
    monkeypatch.setenv("DOCKER_HOST", host)
    assert local_engine(None) is local
    monkeypatch.delenv("DOCKER_HOST")
    assert local_engine(None) is True
    # An explicit value wins over the environment.
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    assert local_engine(host) is local


# -- probe -----------------------------------------------------------------------------------


def _fake_mountinfo(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """Make storage.py read ``text`` as /proc/self/mountinfo (and nothing else changes)."""
    real_open = open

    def fake_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == "/proc/self/mountinfo":
            return io.StringIO(text)
        return real_open(path, *args, **kwargs)

    # A module global named open shadows the builtin for storage.py only.
    monkeypatch.setattr(storage, "open", fake_open, raising=False)


def _as_root_with_btrfs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/sbin/{name}")


def test_probe_without_root_says_root_is_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    status = storage.probe(str(tmp_path))
    assert not status.ready and status.root == str(tmp_path)
    assert "need root" in status.detail
    assert storage.find_pool(str(tmp_path)) is None


def test_probe_without_btrfs_progs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    status = storage.probe(str(tmp_path))
    assert not status.ready and status.detail == "btrfs-progs is not installed"


def test_probe_without_a_btrfs_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_root_with_btrfs(monkeypatch)
    root = str(tmp_path / "storage")
    # The directory is mounted, but ext4; another path is btrfs.
    _fake_mountinfo(
        monkeypatch,
        f"36 35 98:0 / {root} rw,noatime master:1 - ext4 /dev/sda1 rw\n"
        "37 35 7:1 / /elsewhere rw shared:2 - btrfs /dev/loop1 rw\n",
    )
    status = storage.probe(root)
    assert not status.ready
    assert status.detail == f"no btrfs storage pool is mounted at {root}"
    assert storage.find_pool(root) is None
    # An unreadable mount table is "not mounted", not a crash.
    monkeypatch.setattr(
        storage, "open", lambda *a, **k: (_ for _ in ()).throw(OSError("no /proc")), raising=False
    )
    assert storage.probe(root).detail == f"no btrfs storage pool is mounted at {root}"


def test_probe_without_quotas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_root_with_btrfs(monkeypatch)
    root = str(tmp_path)
    _fake_mountinfo(monkeypatch, f"37 35 7:1 / {root} rw shared:2 - btrfs /dev/loop1 rw\n")
    calls: list[list[str]] = []

    def no_quotas(argv: list[str], what: str) -> str:
        calls.append(argv)
        raise BackendError(f"{what}: ERROR: can't list qgroups: quotas not enabled")

    monkeypatch.setattr(storage, "_run", no_quotas)
    status = storage.probe(root)
    assert not status.ready
    assert status.detail.startswith(f"quotas are not enabled on {root}")
    assert "quotas not enabled" in status.detail
    assert calls and calls[0][1:3] == ["qgroup", "show"]


def test_probe_of_a_ready_pool_reports_its_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_root_with_btrfs(monkeypatch)
    root = str(tmp_path)
    _fake_mountinfo(monkeypatch, f"37 35 7:1 / {root} rw shared:2 - btrfs /dev/loop1 rw\n")
    monkeypatch.setattr(storage, "_run", lambda argv, what: "qgroupid rfer excl\n")
    (tmp_path / "ws" / "abc").mkdir(parents=True)
    status = storage.probe(root)
    assert status.ready and status.detail == "ready"
    assert status.size > 0 and 0 <= status.free <= status.size
    assert status.workspaces == 1


def test_setup_without_root_is_refused_naming_sudo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(AgentNestError) as info:
        storage.setup(str(tmp_path / "pool"))
    assert "sudo agentnest setup" in str(info.value)
    assert not (tmp_path / "pool").exists() and not (tmp_path / "pool.img").exists()


def test_check_size_refuses_more_than_the_pool_holds(tmp_path: Path) -> None:
    pool = StoragePool(tmp_path)
    total, _ = pool.capacity()
    pool.check_size(total)
    with pytest.raises(ConfigurationError) as info:
        pool.check_size(total + MiB)
    assert "agentnest setup --size" in str(info.value) and str(tmp_path) in str(info.value)


@pytest.mark.parametrize(
    ("quota", "status"),
    [(8 * GiB, "ok"), (4 * GiB, "ok"), (None, "fail"), (16 * GiB, "fail"), (0, "fail")],
)
def test_verify_judges_a_disk_workspace_by_its_host_side_quota(quota: int | None, status: str) -> None:
    from agentnest import verify

    limits = ResourceLimits(workspace_medium="disk")
    # Inside, statfs shows the whole pool (38 GiB here): not what is judged.
    findings = verify.judge({"workspace_bytes": 38 * GiB}, limits, gvisor=False, workspace_quota=quota)
    (finding,) = [f for f in findings if f.name == "workspace size"]
    assert finding.status == status, finding
    if status == "fail":
        assert "agentnest setup" in finding.hint
