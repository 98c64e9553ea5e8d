"""Full disks without an engine: the audit log's torn line, the file errors' words, the pool's reserve.

The engine-backed cases (real quotas, a real pool on a small tmpfs, a real
full audit disk) are in tests/integration/test_full_disk.py.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentnest.agent.files import _oserror
from agentnest.audit import JsonLogObserver
from agentnest.errors import AuditError, BackendError
from agentnest.events import EventType, SandboxEvent
from agentnest.runtime import btrfs, storage
from agentnest.runtime.storage import StoragePool

MiB = 1024 * 1024
GiB = 1024 * MiB


def event(i: int) -> SandboxEvent:
    return SandboxEvent(EventType.EXEC_STARTED, "sb", attributes={"command": "x" * 200, "i": i})


def parsed(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n")
    return [json.loads(line) for line in raw.splitlines()]


def disk_fills_after(monkeypatch: pytest.MonkeyPatch, room: int, also: bytes = b"") -> None:
    """``os.write`` as on a disk with ``room`` bytes left: a short write, then ENOSPC.

    ``also``: bytes another process appends to the file just after the short write.
    """
    real = os.write
    left = [room]

    def write(fd: int, data: Any) -> int:
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(fd, bytes(data)[: left[0]])
        left[0] -= n
        if also and left[0] == 0:
            with open(f"/proc/self/fd/{fd}", "ab") as other:
                other.write(also)
        return n

    monkeypatch.setattr(os, "write", write)


def test_a_line_cut_short_by_a_full_disk_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLogObserver(path)
    for i in range(3):
        log(event(i))
    before = path.read_bytes()
    disk_fills_after(monkeypatch, 50)
    with pytest.raises(AuditError, match="No space left"):
        log(event(3))
    assert path.read_bytes() == before
    monkeypatch.undo()  # room again: the log goes on, each line whole
    log(event(4))
    assert [e["data"]["i"] for e in parsed(path)] == [0, 1, 2, 4]


def test_another_writers_line_after_a_torn_one_is_never_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLogObserver(path)
    log(event(0))
    theirs = b'{"from":"another process"}\n'
    disk_fills_after(monkeypatch, 50, also=theirs)
    with pytest.raises(AuditError):
        log(event(1))
    assert path.read_bytes().endswith(theirs)


def test_a_full_workspace_is_named_with_its_fix() -> None:
    quota = _oserror(OSError(errno.EDQUOT, "Disk quota exceeded"), "a/b.txt")
    assert quota.code == "no_space"
    assert "'a/b.txt'" in quota.message and "workspace is full" in quota.message
    assert "larger disk=" in quota.message and "delete files" in quota.message
    full = _oserror(OSError(errno.ENOSPC, "No space left on device"), "x")
    assert full.code == "no_space" and "workspace_size=" in full.message and "agentnest prune" in full.message


def pool_with(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    pool_free: int,
    host_free: int | None,
    read_only: bool = False,
) -> StoragePool:
    pool = StoragePool(tmp_path)
    monkeypatch.setattr(pool, "capacity", lambda: (GiB, pool_free))
    image = tmp_path / "host" / "pool.img"
    monkeypatch.setattr(pool, "backing_file", lambda: image if host_free is not None else None)
    monkeypatch.setattr(
        pool, "host_capacity", lambda image=None: (10 * GiB, host_free) if host_free is not None else None
    )
    monkeypatch.setattr(storage, "_read_only", lambda root: read_only)
    return pool


@pytest.mark.parametrize(
    ("pool_free", "host_free", "read_only", "reason", "words"),
    [
        (10 * MiB, 50 * GiB, False, "no_space", "storage pool at"),
        (500 * MiB, 100 * MiB, False, "no_space", "host disk under the storage pool"),
        (500 * MiB, None, False, None, ""),  # not a loop file: only the pool's own space counts
        (500 * MiB, 5 * GiB, False, None, ""),
        (500 * MiB, 100 * MiB, True, "read_only", "is read-only"),
    ],
)
def test_a_workspace_is_refused_below_the_reserve(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pool_free: int,
    host_free: int | None,
    read_only: bool,
    reason: str | None,
    words: str,
) -> None:
    pool = pool_with(tmp_path, monkeypatch, pool_free=pool_free, host_free=host_free, read_only=read_only)
    made: list[Path] = []
    monkeypatch.setattr(btrfs, "create", made.append)
    monkeypatch.setattr(pool, "_limit", lambda path, size: None)
    monkeypatch.setattr(os, "chown", lambda *a: None)
    monkeypatch.setattr(os, "chmod", lambda *a: None)
    if reason is None:
        pool.create("w", 64 * MiB, 1, 1)
        assert made == [pool.path("w")] and pool.status().detail == "ready"
        return
    with pytest.raises(BackendError, match=words) as info:
        pool.create("w", 64 * MiB, 1, 1)
    assert info.value.reason == reason and made == []  # refused before any subvolume was made
    assert pool.status().detail == str(info.value)
    if reason == "no_space":
        assert "agentnest prune" in str(info.value)
    else:
        assert f"umount {tmp_path}" in str(info.value) and "written before is kept" in str(info.value)


def test_the_reserve_scales_down_on_a_small_filesystem() -> None:
    assert storage._reserve(1000 * GiB, storage.HOST_RESERVE) == storage.HOST_RESERVE
    assert storage._reserve(300 * MiB, storage.HOST_RESERVE) == 15 * MiB
    assert storage._reserve(GiB, storage.POOL_RESERVE) < storage.POOL_RESERVE
