"""The seed's side of ``bench.py --compare-seed``: runs with agentnest 0.3.0, in 0.3.0's venv.

Started by seed.py as ``<venv>/bin/python -I seed_driver.py SPEC`` (``-I``: neither this
checkout nor ``PYTHONPATH`` is on ``sys.path``, so ``import agentnest`` is 0.3.0's).  It imports
the standard library and 0.3.0 only, and measures what bench.py measures on our side, with
0.3.0's own API and defaults (``Sandbox(runtime=image)``, read-only root, ``SandboxPool``).

SPEC is JSON: ``{"backend": "docker", "image": "...", "rows": {"F1": {"n": 5, "size": 1048576},
...}}``.  Output on stdout, one JSON object per line: first ``{"version", "module"}``, then
one ``{"key", "samples" (seconds), "notes"}`` or ``{"key", "error"}`` per row as it is done.
A row that fails is reported, not raised; SIGTERM cleans up like Ctrl-C.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agentnest
from agentnest import Sandbox, SandboxPool


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:600]


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Seed:
    def __init__(self, backend: str, image: str) -> None:
        self.backend = backend
        self.image = image

    def sandbox(self) -> Sandbox:
        # 0.3.0's name for the image is ``runtime``; everything else is its default.
        return Sandbox(runtime=self.image, timeout=900, backend=self.backend)

    @staticmethod
    def fill(sandbox: Sandbox, size: int) -> str:
        """Random data in the workspace, as bench.py's _fill; its sha256."""
        out = sandbox.exec_shell(f"head -c {size} /dev/urandom > data.bin && sha256sum data.bin", timeout=120)
        if out.exit_code != 0:
            raise RuntimeError(f"filling the workspace failed: {out.stderr[-300:]}")
        return str(out.stdout.split()[0])

    @staticmethod
    def digest(sandbox: Sandbox) -> str:
        return str(sandbox.exec_shell("sha256sum data.bin").stdout.split()[0])

    def fork(self, key: str, size: int, n: int) -> None:
        samples: list[float] = []
        with self.sandbox() as parent:
            digest = self.fill(parent, size)
            child = parent.fork()  # warm-up, and the copy is checked once
            try:
                if self.digest(child) != digest:
                    raise RuntimeError("the fork's data differs from the parent's")
            finally:
                child.destroy()
            for _ in range(n):
                t0 = time.perf_counter()
                child = parent.fork()
                samples.append(time.perf_counter() - t0)
                child.destroy()
        notes = ["0.3.0: shutil.copytree of the host workspace directory, then a new container"]
        emit(key=key, samples=samples, notes=notes)

    def snapshot(self, keys: dict[str, dict[str, int]]) -> None:
        """T1 snapshot and T2 restore of the same file, alternating as bench.py does."""
        size, n = next(iter(keys.values()))["size"], next(iter(keys.values()))["n"]
        snaps: list[float] = []
        restores: list[float] = []
        with self.sandbox() as sandbox, tempfile.TemporaryDirectory(prefix="agentnest-bench-seed-") as tmp:
            path = Path(tmp) / "snap.tar"
            digest = self.fill(sandbox, size)
            sandbox.snapshot(path)  # warm-up
            restore_error: str | None = None
            try:
                sandbox.restore(path)
            except Exception as exc:  # 0.3.0's restore writes to "/", which its read-only root refuses
                restore_error = error_text(exc)
            else:
                if self.digest(sandbox) != digest:
                    raise RuntimeError("restore changed the data")
            for _ in range(n):
                snaps.append(timed(lambda: sandbox.snapshot(path)))
                if restore_error is None:
                    restores.append(timed(lambda: sandbox.restore(path)))
            snap_size = path.stat().st_size
        if "T1" in keys:
            notes = [f"0.3.0: get_archive of /workspace into a host file ({snap_size / 1e6:.1f} MB), hashed"]
            emit(key="T1", samples=snaps, notes=notes)
        if "T2" in keys:
            if restore_error is not None:
                emit(key="T2", error=restore_error)
            else:
                emit(key="T2", samples=restores, notes=["0.3.0: put_archive of the file at /"])

    def files(self, keys: dict[str, dict[str, int]]) -> None:
        """4w write_file then 4r read_file of the same bytes, as bench.py's step 4."""
        size, n = next(iter(keys.values()))["size"], next(iter(keys.values()))["n"]
        data = os.urandom(size)
        writes: list[float] = []
        reads: list[float] = []
        with self.sandbox() as sandbox:
            sandbox.write_file("bench.bin", data)
            if sandbox.read_file("bench.bin", encoding=None) != data:
                raise RuntimeError("read_file returned different bytes")
            for _ in range(n):
                t0 = time.perf_counter()
                sandbox.write_file("bench.bin", data)
                t1 = time.perf_counter()
                back = sandbox.read_file("bench.bin", encoding=None)
                reads.append(time.perf_counter() - t1)
                writes.append(t1 - t0)
                if len(back) != size:
                    raise RuntimeError("short read")
        note = ["0.3.0: the host writes/reads the bind-mounted workspace directory directly"]
        if "4w" in keys:
            emit(key="4w", samples=writes, notes=note)
        if "4r" in keys:
            emit(key="4r", samples=reads, notes=note)

    def pool(self, key: str, size: int, n: int) -> None:
        served: set[str] = set()
        samples: list[float] = []
        pool = SandboxPool(self.sandbox, size=size)  # 0.3.0 creates them here, synchronously

        def one() -> None:
            with pool.acquire() as sandbox:
                served.add(sandbox.id)
                if sandbox.exec_shell("true").exit_code != 0:
                    raise RuntimeError("exec_shell('true') failed")

        try:
            for _ in range(2 * size):
                one()
            served.clear()
            for _ in range(n):
                samples.append(timed(one))
        finally:
            pool.close()
        notes = [
            f"0.3.0: SandboxPool(factory, size={size}) with its defaults (max_uses=25): it lends the same "
            f"sandbox again with no reset; {len(served)} distinct sandboxes served",
        ]
        emit(key=key, samples=samples, notes=notes)


def guarded(keys: list[str], fn: Callable[[], None]) -> None:
    """Run one group of rows (each emits its rows last); on an error, report it for each of them."""
    try:
        fn()
    except Exception as exc:
        for key in keys:
            emit(key=key, error=error_text(exc))


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    spec = json.loads(sys.argv[1])
    rows: dict[str, dict[str, int]] = spec["rows"]
    seed = Seed(spec["backend"], spec["image"])
    emit(version=agentnest.__version__, module=agentnest.__file__)
    for key, row in rows.items():
        if key.startswith("F"):
            guarded([key], functools.partial(seed.fork, key, row["size"], row["n"]))
    snap = {k: v for k, v in rows.items() if k in ("T1", "T2")}
    if snap:
        guarded(list(snap), lambda: seed.snapshot(snap))
    files = {k: v for k, v in rows.items() if k in ("4w", "4r")}
    if files:
        guarded(list(files), lambda: seed.files(files))
    if "P3" in rows:
        guarded(["P3"], lambda: seed.pool("P3", rows["P3"]["size"], rows["P3"]["n"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
