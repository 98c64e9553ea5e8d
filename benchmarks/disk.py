"""Step D: what disk workspaces cost the host's disk (issue 12's targets), measured on the host.

Each row reads the storage pool's backing file (its allocated blocks: what the host's disk
really gave) before and after, not what the sandbox reports:

* D1: a 3 GiB sparse file (3 MiB of data) through fork, snapshot and restore: the host bytes
  each writes (a dense copy would be 3 GiB).
* D2: a 5 GiB workspace written to the brim: the write must fail inside (EDQUOT), the host's
  disk may give at most the workspace's size, and destroy + prune must give it all back.
* D3: an idle sandbox: host disk for a fresh workspace (target <= 1 MiB).

Imported by bench.py from the same directory; needs the storage pool (`agentnest setup`).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from harness import MIB, Plan, Result, Series, Target

from agentnest import Sandbox
from agentnest.runtime import storage

GIB = 1024 * MIB
SPARSE = r"""
import os
fd = os.open("sparse.img", os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 3 << 30)
os.pwrite(fd, os.urandom(3 << 20), 1 << 30)
os.close(fd)
"""
FILL = r"""
import errno, json, os
n, err = 0, None
block = os.urandom(1 << 20)
try:
    with open("fill.bin", "wb", buffering=0) as f:
        while True:
            n += f.write(block)
except OSError as exc:
    err = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps({"written": n, "errno": err}))
"""


def _pool() -> tuple[storage.StoragePool, Path]:
    pool = storage.find_pool()
    if pool is None:
        raise RuntimeError(f"no storage pool: {storage.probe().detail}; run `agentnest setup`")
    image = pool.backing_file()
    if image is None:
        raise RuntimeError(f"the pool at {pool.root} is not on a loop file: its host cost cannot be read")
    return pool, image


def _host_bytes(pool: storage.StoragePool, image: Path) -> int:
    """The pool file's allocated bytes, with the pool's writes flushed and freed blocks trimmed."""
    pool.reclaim()
    os.sync()
    return os.stat(image).st_blocks * 512


def bench_disk(backend: str, plan: Plan) -> list[Result]:
    pool, image = _pool()
    n = 2 if plan.quick else 3
    fork, snap, restore = (
        Series(f"host MB written by {what}", "MB") for what in ("fork", "snapshot", "restore")
    )
    results: list[Result] = []
    with Sandbox(backend=backend, timeout=900, disk="4g") as sb, tempfile.TemporaryDirectory() as tmp:
        sb.exec_python(SPARSE, timeout=120).check()
        path = Path(tmp) / "sparse.tar"
        for _ in range(n):
            before = _host_bytes(pool, image)
            with sb.fork() as child:
                child.exec_shell("test -s sparse.img").check()
                fork.samples.append((_host_bytes(pool, image) - before) / 1e6)
            before = _host_bytes(pool, image)
            meta = sb.snapshot(path)
            snap.samples.append((_host_bytes(pool, image) - before + meta.size) / 1e6)
            before = _host_bytes(pool, image)
            sb.restore(path)
            restore.samples.append((_host_bytes(pool, image) - before) / 1e6)
    for key, series in (("D1f", fork), ("D1s", snap), ("D1r", restore)):
        results.append(
            Result(
                backend,
                key,
                f"3 GiB sparse file: {series.label.rsplit(' ', 1)[-1]}",
                series,
                target=Target("p50_le", 64.0),
                notes=["host bytes: the pool file's allocated blocks (snapshot: plus the snapshot file)"],
            )
        )
    results.append(_bench_fill(backend, pool, image))
    results.append(_bench_idle(backend, pool, image, n))
    return results


def _bench_fill(backend: str, pool: storage.StoragePool, image: Path) -> Result:
    size = 5 * GIB
    grew = Series("host disk the 5 GiB fill took", "MB")
    back = Series("host disk still taken after destroy + prune", "MB")
    notes: list[str] = []
    before = _host_bytes(pool, image)
    free_before = os.statvfs(image.parent).f_bavail * os.statvfs(image.parent).f_frsize
    t0 = time.perf_counter()
    with Sandbox(backend=backend, timeout=900, disk=size) as sb:
        found = sb.exec_json(FILL, timeout=600)
        grew.samples.append((_host_bytes(pool, image) - before) / 1e6)
        free_after = os.statvfs(image.parent).f_bavail * os.statvfs(image.parent).f_frsize
        took = time.perf_counter() - t0
        fell = (free_before - free_after) / GIB
        notes.append(
            f"inside: {found['written'] / GIB:.2f} GiB written, then {found['errno']}; host free disk fell "
            f"{fell:.2f} GiB (limit {size / GIB:.0f} GiB); {took:.0f} s"
        )
    back.samples.append((_host_bytes(pool, image) - before) / 1e6)
    notes.append(f"after destroy + reclaim: {back.samples[0]:.1f} MB still allocated")
    return Result(
        backend,
        "D2",
        "5 GiB workspace filled to the brim",
        grew,
        target=Target("p50_le", size / 1e6),
        notes=notes,
    )


def _bench_idle(backend: str, pool: storage.StoragePool, image: Path, n: int) -> Result:
    idle = Series("host disk of a fresh, idle sandbox's workspace", "MB")
    for _ in range(n):
        before = _host_bytes(pool, image)
        with Sandbox(backend=backend, timeout=300):
            idle.samples.append((_host_bytes(pool, image) - before) / 1e6)
    return Result(backend, "D3", "idle sandbox: host disk", idle, target=Target("p50_le", 1.048576))
