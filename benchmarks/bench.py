#!/usr/bin/env python3
"""AgentNest benchmarks, each next to a floor measured in the same run on plain docker-py.

Usage::

    python benchmarks/bench.py [--quick] [--backend docker|gvisor|runc|runsc|all] [--only KEYS] [--json PATH]
                               [--compare-seed]

For every selected backend (``docker`` = runc, ``gvisor`` = runsc) this prints one line
per measurement: n, p50 and p95 of AgentNest, the same for the floor (the closest thing
docker-py does on its own, same image, same OCI runtime, ``network_mode="none"``), and the
ratio ours/floor.  A summary table with the targets and PASS/MISS closes the report; a
miss is reported, never raised.  ``--json PATH`` writes every sample.

``--compare-seed`` also measures agentnest 0.3.0, the release this project replaces, on the
rows it has (fork, snapshot/restore, read/write_file, pool back to back) in the same run
and prints them next to ours with the ratio ours/0.3.0 (seed.py, seed_driver.py).

Shared pieces live beside this file: harness.py (plans, statistics, the report, cleanup,
the docker-py floor), egress.py (step E) and kube.py (step K: the Kubernetes
backend through the cluster double).

What each measurement is, and why, is in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import inspect
import io
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tarfile
import threading
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Run from a checkout without installing: `python benchmarks/bench.py`.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# seed, egress and harness are siblings in benchmarks/ (the script's directory is on sys.path).
import docker  # noqa: E402
import docker.errors  # noqa: E402
import seed  # noqa: E402
from browser import bench_browser  # noqa: E402
from disk import bench_disk  # noqa: E402
from docker.models.containers import Container  # noqa: E402
from e2b import bench_e2b  # noqa: E402
from egress import bench_egress  # noqa: E402
from harness import (  # noqa: E402
    BACKENDS,
    FLOOR_LABELS,
    MB,
    MIB,
    Floor,
    Plan,
    Reaper,
    Result,
    Series,
    Target,
    exec_ok,
    fmt,
    percentile,
    remove_quietly,
    report,
    summary,
    timed,
)
from kube import bench_kube  # noqa: E402
from live import bench_live  # noqa: E402
from manager import bench_manager  # noqa: E402

import agentnest  # noqa: E402
from agentnest import Sandbox, SandboxPool, SecurityPolicy  # noqa: E402
from agentnest._core import core_of  # noqa: E402
from agentnest.runtime.base import Capability  # noqa: E402
from agentnest.runtime.docker import DockerBackend  # noqa: E402
from agentnest.runtime.registry import get_backend  # noqa: E402
from agentnest.sandbox import default_image  # noqa: E402
from agentnest.state import SPARES  # noqa: E402

FILE_SIZE = 10 * MIB
STDOUT_SIZE = 50 * 2**20  # 52428800 bytes
STDOUT_CMD = f"head -c {STDOUT_SIZE} /dev/zero"
BIG_OUTPUT_LIMIT = 64_000_000
PAR_SANDBOXES = 16
PAR_EXECS = 20
TRACED = 2  # sandboxes created under tracemalloc in the memory child


# -- measurements ------------------------------------------------------------------------


def bench_cold_start(backend: str, floor: Floor, plan: Plan) -> Result:
    ours = Series("Sandbox()+exec_shell+destroy", "ms")
    base = Series("run(true)+wait+remove", "ms")
    # Phase times of every sample: where a miss comes from.
    ours_phases: dict[str, list[float]] = {"Sandbox()": [], "first exec": [], "destroy": []}
    base_phases: dict[str, list[float]] = {"run": [], "wait": [], "remove": []}
    with Reaper() as reaper:

        def one_ours() -> list[float]:
            t0 = time.perf_counter()
            sandbox = reaper.sandbox(backend)
            t1 = time.perf_counter()
            result = sandbox.exec_shell("echo hi")
            t2 = time.perf_counter()
            sandbox.destroy()
            t3 = time.perf_counter()
            if result.stdout != "hi\n":
                raise RuntimeError(f"unexpected output {result.stdout!r}")
            return [t1 - t0, t2 - t1, t3 - t2]

        def one_floor() -> list[float]:
            t0 = time.perf_counter()
            container = floor.run(["true"])
            t1 = time.perf_counter()
            reaper.add(lambda: remove_quietly(container))
            status = container.wait()
            t2 = time.perf_counter()
            container.remove()
            t3 = time.perf_counter()
            if status.get("StatusCode") != 0:
                raise RuntimeError(f"floor container exited with {status}")
            return [t1 - t0, t2 - t1, t3 - t2]

        one_ours()  # warm-up: imports, engine info, image lookup, page cache
        one_floor()
        for _ in range(plan.cold):  # ABAB, so drift hits both sides alike
            for side, phases, fn in ((ours, ours_phases, one_ours), (base, base_phases, one_floor)):
                parts = fn()
                side.samples.append(sum(parts))
                for name, value in zip(phases, parts, strict=True):
                    phases[name].append(value)

    def breakdown(phases: dict[str, list[float]]) -> str:
        return ", ".join(f"{name} {percentile(v, 50) * 1e3:.0f} ms" for name, v in phases.items())

    notes = [f"p50 by phase: ours {breakdown(ours_phases)}; floor {breakdown(base_phases)}"]
    return Result(backend, "1", "cold start", ours, base, Target("ratio_le", 1.1), notes=notes)


def bench_warm_exec(backend: str, floor: Floor, plan: Plan) -> list[Result]:
    """Warm exec_shell, without and with a timeout (a timed command's top is made a
    child subreaper so nothing it starts escapes the timeout: this row measures that cost)."""
    ours = Series('exec_shell("echo hi")', "ms")
    timed_ours = Series('exec_shell("echo hi", timeout=60)', "ms")
    base = Series('exec_run(["true"])', "ms")
    inside: list[float] = []
    with Reaper() as reaper:
        sandbox = reaper.sandbox(backend)
        for _ in range(20):
            sandbox.exec_shell("echo hi")
            sandbox.exec_shell("echo hi", timeout=60)
        # Interleaved, so that both rows see the same machine.
        for _ in range(plan.warm):
            t0 = time.perf_counter()
            result = sandbox.exec_shell("echo hi")
            ours.samples.append(time.perf_counter() - t0)
            inside.append(result.duration)
            t0 = time.perf_counter()
            sandbox.exec_shell("echo hi", timeout=60)
            timed_ours.samples.append(time.perf_counter() - t0)
        container = floor.idle(reaper)
        for _ in range(5):
            exec_ok(container, ["true"], b"")
        for _ in range(plan.warm_floor):
            base.samples.append(timed(lambda: exec_ok(container, ["true"], b"")))
    notes = [
        f"process time inside the sandbox (ExecutionResult.duration, sh -c 'echo hi'): "
        f"p50 {percentile(inside, 50) * 1e3:.2f} ms, p95 {percentile(inside, 95) * 1e3:.2f} ms"
    ]
    return [
        Result(backend, "2", "warm exec", ours, base, Target("p50_le", 2.0), notes=notes),
        Result(
            backend,
            "2",
            "warm exec with a timeout (subreaper top)",
            timed_ours,
            base,
            Target("p50_le", 2.0),
            notes=[f"untimed p50 {ours.p50 or 0:.2f} ms in the same run"],
        ),
    ]


def bench_approvals(backend: str, plan: Plan) -> list[Result]:
    """What an approval hook adds to a warm exec: the floor is the same exec with no hook."""
    from agentnest.approvals import ApprovalRule, RuleApprover

    def allow(request: object) -> bool:
        return True

    hooks: list[tuple[str, Any]] = [
        ("RuleApprover (inline)", RuleApprover([ApprovalRule("exec", "*", "allow")])),
        ("python callable (bounded thread)", allow),
    ]
    results = []
    with Reaper() as reaper:
        plain = reaper.sandbox(backend)
        base = Series('exec_shell("true"), no hook', "ms")
        for _ in range(10):
            plain.exec_shell("true")
        for _ in range(plan.warm):
            base.samples.append(timed(lambda: plain.exec_shell("true")))
        for label, hook in hooks:
            sandbox = reaper.sandbox(backend, approval_hook=hook)
            ours = Series(f'exec_shell("true"), {label}', "ms")
            for _ in range(10):
                sandbox.exec_shell("true")
            run = functools.partial(sandbox.exec_shell, "true")
            for _ in range(plan.warm):
                ours.samples.append(timed(run))
            results.append(Result(backend, "G", f"exec with approval hook: {label}", ours, base))
    return results


def bench_exec_python(backend: str, floor: Floor, plan: Plan) -> list[Result]:
    ours = Series('exec_python("print(6*7)")', "ms")
    base = Series("exec_run(python3 -c print(6*7))", "ms")
    ref = Series('exec(["python3","-c","pass"])', "ms")
    inside: list[float] = []
    with Reaper() as reaper:
        sandbox = reaper.sandbox(backend)
        for _ in range(3):
            sandbox.exec_python("print(6*7)")
        for _ in range(plan.python):
            t0 = time.perf_counter()
            result = sandbox.exec_python("print(6*7)")
            ours.samples.append(time.perf_counter() - t0)
            if result.stdout != "42\n":
                raise RuntimeError(f"unexpected output {result.stdout!r}")
        for _ in range(plan.python):
            t0 = time.perf_counter()
            result = sandbox.exec(["python3", "-c", "pass"])
            ref.samples.append(time.perf_counter() - t0)
            inside.append(result.duration)
        container = floor.idle(reaper)
        argv = ["python3", "-c", "print(6*7)"]
        exec_ok(container, argv, b"42\n")
        for _ in range(plan.python_floor):
            base.samples.append(timed(lambda: exec_ok(container, argv, b"42\n")))
    in50 = percentile(inside, 50) * 1e3
    notes = [
        f"interpreter start dominates: `python3 -c pass` takes p50 {in50:.1f} ms "
        f"(p95 {percentile(inside, 95) * 1e3:.1f} ms) inside the sandbox (ExecutionResult.duration)",
    ]
    ref_notes = [
        f"of which in-sandbox process time p50 {in50:.1f} ms; the rest "
        f"({(ref.p50 or 0) - in50:.1f} ms) is the channel round trip and spawning"
    ]
    return [
        Result(backend, "3", "exec_python", ours, base, Target("p50_le", 25.0), notes=notes),
        Result(backend, "3r", "python3 -c pass (reference)", ref, notes=ref_notes),
    ]


def _tar_one(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _untar_one(chunks: Iterator[bytes], name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = tar.extractfile(name)
        if member is None:
            raise RuntimeError(f"{name} is not a file in the archive")
        return member.read()


def bench_files(backend: str, floor: Floor, plan: Plan) -> list[Result]:
    """4: ``write_file`` then ``read_file`` of 10 MiB; 4w and 4r are the two halves of each sample."""
    ours = Series("write_file+read_file 10 MiB", "ms")
    base = Series("put_archive+get_archive (/tmp)", "ms")
    writes, reads = Series("write_file 10 MiB", "ms"), Series("read_file 10 MiB", "ms")
    puts, gets = Series("tar + put_archive (/tmp)", "ms"), Series("get_archive + untar (/tmp)", "ms")
    data = os.urandom(FILE_SIZE)
    notes: list[str] = []
    with Reaper() as reaper:
        sandbox = reaper.sandbox(backend)

        def one_ours() -> tuple[bytes, float, float]:
            t0 = time.perf_counter()
            sandbox.write_file("bench.bin", data)
            t1 = time.perf_counter()
            back: bytes = sandbox.read_file("bench.bin", encoding=None)
            return back, t1 - t0, time.perf_counter() - t1

        if one_ours()[0] != data:
            raise RuntimeError("read_file returned different bytes")
        for _ in range(plan.files):
            back, wrote, read = one_ours()
            ours.samples.append(wrote + read)
            writes.samples.append(wrote)
            reads.samples.append(read)
            if len(back) != len(data):
                raise RuntimeError("short read")

        container = floor.idle(reaper)

        def one_floor() -> tuple[bytes, float, float]:
            t0 = time.perf_counter()
            if not container.put_archive("/tmp", _tar_one("bench.bin", data)):
                raise RuntimeError("put_archive failed")
            t1 = time.perf_counter()
            chunks, _stat = container.get_archive("/tmp/bench.bin")
            return _untar_one(chunks, "bench.bin"), t1 - t0, time.perf_counter() - t1

        if one_floor()[0] != data:
            raise RuntimeError("get_archive returned different bytes")
        for _ in range(plan.files):
            back, wrote, read = one_floor()
            base.samples.append(wrote + read)
            puts.samples.append(wrote)
            gets.samples.append(read)
            if len(back) != len(data):
                raise RuntimeError("short read (floor)")
        # The engine copies archives into the container's filesystem as the daemon sees it;
        # a tmpfs mount exists only inside the container, so check where the file went.
        code, _out = container.exec_run(["test", "-f", "/tmp/bench.bin"])
        notes.append(
            "ours writes to /workspace (a tmpfs) through the agent; floor builds/unpacks the tar on "
            "the host (included) and uses the engine's archive API on /tmp"
        )
        if code != 0:
            notes.append(
                "the floor's file is NOT visible in the container's tmpfs /tmp: the engine's archive "
                "API wrote it under the mount point in the container's writable layer"
            )
    return [
        Result(backend, "4", "10 MiB file round trip", ours, base, notes=notes),
        Result(backend, "4w", "write_file 10 MiB", writes, puts, Target("p50_le", 30.0)),  # issue 12
        Result(backend, "4r", "read_file 10 MiB", reads, gets, Target("p50_le", 8.0)),
    ]


def bench_stdout(backend: str, floor: Floor, plan: Plan) -> list[Result]:
    work = STDOUT_SIZE / MB
    ours = Series(f"exec_shell(head -c {STDOUT_SIZE})", "MB/s", work=work)
    base = Series("exec_run(same command)", "MB/s", work=work)
    cut = Series("default 10 MB limit", "ms")
    cut_sizes: set[int] = set()
    cut_exits: set[tuple[int, int | None]] = set()
    inside: list[float] = []
    cut_inside: list[float] = []
    with Reaper() as reaper:
        sandbox = reaper.sandbox(backend, security_policy=SecurityPolicy(max_output_bytes=BIG_OUTPUT_LIMIT))
        sandbox.exec_shell("head -c 1000000 /dev/zero")
        for _ in range(plan.stdout):
            t0 = time.perf_counter()
            result = sandbox.exec_shell(STDOUT_CMD)
            ours.samples.append(time.perf_counter() - t0)
            inside.append(result.duration)
            if result.truncated or len(result.stdout) != STDOUT_SIZE:
                raise RuntimeError(f"got {len(result.stdout)} bytes, truncated={result.truncated}")
        del result
        limited = reaper.sandbox(backend)  # default SecurityPolicy: max_output_bytes=10_000_000
        for _ in range(plan.stdout):
            t0 = time.perf_counter()
            result = limited.exec_shell(STDOUT_CMD)
            cut.samples.append(time.perf_counter() - t0)
            if not result.truncated:
                raise RuntimeError("a 50 MiB producer was not truncated at the default limit")
            cut_sizes.add(len(result.stdout))
            cut_exits.add((result.exit_code, result.signal))
            cut_inside.append(result.duration)
        del result
        container = floor.idle(reaper)
        argv = ["/bin/sh", "-c", STDOUT_CMD]
        for _ in range(plan.stdout):
            t0 = time.perf_counter()
            output = exec_ok(container, argv)
            base.samples.append(time.perf_counter() - t0)
            if len(output) != STDOUT_SIZE:
                raise RuntimeError(f"floor got {len(output)} bytes")
        del output
    exits = ", ".join(f"exit {code}" + (f" signal {sig}" if sig else "") for code, sig in sorted(cut_exits))
    cut_note = [
        f"returned truncated=True with {sorted(cut_sizes)} bytes of stdout ({exits}); the producer's "
        f"run time inside the sandbox was p50 {percentile(cut_inside, 50) * 1e3:.0f} ms: the agent "
        "keeps draining the pipe and drops what is over the limit, so only the limit crosses to the host"
    ]
    notes = [
        f"the producer's own run time inside the sandbox (ExecutionResult.duration) p50 "
        f"{percentile(inside, 50) * 1e3:.0f} ms: close to the total means the transfer to the host "
        "(agent, attach stream, host reader) paces it, not the producer"
    ]
    return [
        Result(backend, "5", "50 MiB stdout throughput", ours, base, Target("p50_ge", 200.0), True, notes),
        Result(backend, "5c", "50 MiB stdout, cut at the default limit", cut, notes=cut_note),
    ]


def _threads_round(workers: list[Callable[[], list[float]]]) -> tuple[float, list[float]]:
    """Start every worker, release them together, return (wall seconds, latencies)."""
    barrier = threading.Barrier(len(workers) + 1)
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def body(work: Callable[[], list[float]]) -> None:
        try:
            barrier.wait()
            lat = work()
            with lock:
                latencies.extend(lat)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=body, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, latencies


def bench_parallel(backend: str, floor: Floor, plan: Plan) -> Result:
    total = PAR_SANDBOXES * PAR_EXECS
    floor_total = PAR_SANDBOXES * plan.par_floor_execs
    ours = Series(f"{PAR_SANDBOXES} threads x {PAR_EXECS} exec_shell", "execs/s", work=total)
    base = Series(f"{PAR_SANDBOXES} threads x {plan.par_floor_execs} exec_run", "execs/s", work=floor_total)
    ours_lat: list[float] = []
    base_lat: list[float] = []
    with Reaper() as reaper:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=PAR_SANDBOXES) as pool:
            sandboxes = list(pool.map(lambda _i: reaper.sandbox(backend), range(PAR_SANDBOXES)))
        created = time.perf_counter() - t0
        for sandbox in sandboxes:
            sandbox.exec_shell("echo hi")

        def ours_worker(sandbox: Sandbox) -> Callable[[], list[float]]:
            def work() -> list[float]:
                lat = []
                for _ in range(PAR_EXECS):
                    t = time.perf_counter()
                    if sandbox.exec_shell("echo hi").stdout != "hi\n":
                        raise RuntimeError("unexpected output")
                    lat.append(time.perf_counter() - t)
                return lat

            return work

        for _ in range(plan.par_rounds):
            wall, lat = _threads_round([ours_worker(s) for s in sandboxes])
            ours.samples.append(wall)
            ours_lat.extend(lat)

        with ThreadPoolExecutor(max_workers=PAR_SANDBOXES) as pool:
            containers = list(pool.map(lambda _i: floor.idle(reaper), range(PAR_SANDBOXES)))
        for container in containers:
            exec_ok(container, ["true"], b"")

        def floor_worker(container: Container) -> Callable[[], list[float]]:
            def work() -> list[float]:
                return [timed(lambda: exec_ok(container, ["true"], b"")) for _ in range(plan.par_floor_execs)]

            return work

        wall, lat = _threads_round([floor_worker(c) for c in containers])
        base.samples.append(wall)
        base_lat.extend(lat)
    notes = [
        f"creating the {PAR_SANDBOXES} sandboxes from {PAR_SANDBOXES} threads took {created:.2f} s "
        "(not counted)",
        f"per-exec latency under load: ours p50 {percentile(ours_lat, 50) * 1e3:.1f} ms "
        f"p95 {percentile(ours_lat, 95) * 1e3:.1f} ms; floor p50 {percentile(base_lat, 50) * 1e3:.1f} ms "
        f"p95 {percentile(base_lat, 95) * 1e3:.1f} ms",
        f"n counts rounds of {total} execs (ours) and {floor_total} execs (floor)",
    ]
    return Result(backend, "6", "parallel execs", ours, base, Target("p50_ge", 500.0), True, notes)


# -- pools -------------------------------------------------------------------------------

POOL_SIZE = 4
POOL_BURST_SIZE = 2  # issue 12's pool row
POOL_MANY = 32
POOL_MANY_EXECS = 20


def _wait_warm(pool: SandboxPool, within: float = 60.0) -> None:
    """Poll until every sandbox of the pool is idle again (between samples, not timed)."""
    deadline = time.monotonic() + within
    while pool.stats.idle < pool.size:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the pool did not get warm again: {pool.stats}")
        time.sleep(0.0005)


def bench_pool(backend: str, plan: Plan) -> list[Result]:
    """P1: acquire + exec_shell("true") + release on a warm pool; P2: 32 sandboxes x 20 execs."""
    n = plan.python * 2
    ours = Series('acquire + exec_shell("true") + release', "ms")
    burst: list[float] = []

    def factory() -> Sandbox:
        return Sandbox(backend=backend, timeout=1800)

    with SandboxPool(factory, size=POOL_SIZE, reset="clean", max_uses=10_000) as pool:
        t0 = time.perf_counter()
        pool.start(wait=True)
        warm_up = time.perf_counter() - t0
        for _ in range(POOL_SIZE * 5):
            with pool.acquire() as sandbox:
                sandbox.exec_shell("true")
            _wait_warm(pool)
        for _ in range(n):
            t0 = time.perf_counter()
            with pool.acquire() as sandbox:
                result = sandbox.exec_shell("true")
            ours.samples.append(time.perf_counter() - t0)
            if not result.ok:
                raise RuntimeError(f"exec_shell('true') failed: {result}")
            _wait_warm(pool)
        # Back to back, without waiting for the reset: what a busy caller sees.
        for _ in range(n):
            burst.append(timed(lambda: _pool_exec(pool)))
        stats = pool.stats
    notes = [
        f"SandboxPool(size={POOL_SIZE}, reset='clean'): health ping on acquire, clean reset after "
        f"release (in the pool's threads); start(wait=True) took {warm_up:.2f} s",
        f"back to back, not waiting for the resets: p50 {percentile(burst, 50) * 1e3:.2f} ms, "
        f"p95 {percentile(burst, 95) * 1e3:.2f} ms (a caller may wait for a sandbox being cleaned)",
        f"pool stats at the end: created {stats.created}, destroyed {stats.destroyed}, failed {stats.failed}",
    ]
    results = [Result(backend, "P1", "pool acquire + exec", ours, target=Target("p50_le", 2.0), notes=notes)]
    results.append(_bench_pool_many(backend))
    results.append(_bench_pool_back_to_back(backend, plan))
    return results


def _bench_pool_back_to_back(backend: str, plan: Plan) -> Result:
    """P3: ``SandboxPool(factory, size=2)`` with its defaults (a clean reset after every use),
    ``with pool.acquire()`` back to back.

    Issue 12's row, measured the same way with 0.3.0 (seed.py): each sample is one
    ``with pool.acquire() as sandbox: sandbox.exec_shell("true")``, the next starts at once.
    """
    ours = Series(f'with acquire(): exec_shell("true"), size {POOL_BURST_SIZE}', "ms")
    served: set[str] = set()

    def factory() -> Sandbox:
        return Sandbox(backend=backend, timeout=1800)

    def one() -> None:
        with pool.acquire() as sandbox:
            served.add(sandbox.id)
            if not sandbox.exec_shell("true").ok:
                raise RuntimeError("exec_shell('true') failed")

    with SandboxPool(factory, size=POOL_BURST_SIZE) as pool:
        pool.start(wait=True)
        for _ in range(2 * POOL_BURST_SIZE):  # warm-up: code paths, and the first refills
            one()
        _wait_warm(pool)
        served.clear()
        for _ in range(plan.pool_burst):
            ours.samples.append(timed(one))
        stats = pool.stats
    defaults = {k: v.default for k, v in inspect.signature(SandboxPool).parameters.items()}
    notes = [
        f"SandboxPool(factory, size={POOL_BURST_SIZE}) with its defaults (reset={defaults['reset']!r}, "
        f"max_uses={defaults['max_uses']}); warm before the first sample, never waited for after; "
        f"{len(served)} distinct sandboxes served; created {stats.created}, failed {stats.failed}",
    ]
    return Result(
        backend,
        "P3",
        f"pool (size {POOL_BURST_SIZE}), acquire back to back",
        ours,
        target=Target("p50_le", 5.0),  # issue 12: warm and clean every use
        notes=notes,
    )


def _pool_exec(pool: SandboxPool) -> None:
    with pool.acquire() as sandbox:
        if not sandbox.exec_shell("true").ok:
            raise RuntimeError("exec_shell('true') failed")


def _bench_pool_many(backend: str) -> Result:
    total = POOL_MANY * POOL_MANY_EXECS
    ours = Series(f"{POOL_MANY} threads x {POOL_MANY_EXECS} exec_shell", "execs/s", work=total)

    def factory() -> Sandbox:
        return Sandbox(backend=backend, timeout=1800)

    with SandboxPool(factory, size=POOL_MANY, acquire_timeout=120.0) as pool:
        t0 = time.perf_counter()
        pool.start(wait=True)
        created = time.perf_counter() - t0

        def worker() -> list[float]:
            lat = []
            with pool.acquire() as sandbox:
                for i in range(POOL_MANY_EXECS):
                    t = time.perf_counter()
                    if sandbox.exec_shell(f"echo {i}").stdout != f"{i}\n":
                        raise RuntimeError("unexpected output")
                    lat.append(time.perf_counter() - t)
            return lat

        wall, lat = _threads_round([worker for _ in range(POOL_MANY)])
        ours.samples.append(wall)
        t0 = time.perf_counter()
    closed = time.perf_counter() - t0
    notes = [
        f"{POOL_MANY} sandboxes at once from SandboxPool(size={POOL_MANY}); start(wait=True) created them "
        f"in {created:.2f} s; close() destroyed them in {closed:.2f} s (neither counted)",
        f"all {total} execs succeeded; per-exec latency p50 {percentile(lat, 50) * 1e3:.1f} ms "
        f"p95 {percentile(lat, 95) * 1e3:.1f} ms",
    ]
    name = f"{POOL_MANY} sandboxes x {POOL_MANY_EXECS} execs"
    return Result(backend, "P2", name, ours, higher_is_better=True, notes=notes)


# -- memory (measured in child processes, so the host RSS baseline is clean) -------------


def vm_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def memory_of(api: docker.APIClient, cid: str) -> dict[str, Any]:
    stats = api.stats(cid, stream=False)
    mem = stats.get("memory_stats") or {}
    usage = mem.get("usage")
    inner = mem.get("stats") or {}
    key = next((k for k in ("cache", "inactive_file") if k in inner), None)
    # What `docker stats` shows: usage minus the inactive file pages (cgroup v1 or v2 name).
    inactive = inner.get("total_inactive_file", inner.get("inactive_file"))
    return {
        "usage": usage,
        "cache_key": key,
        "cache": inner.get(key) if key else None,
        "no_cache": usage - inner[key] if usage is not None and key else None,
        "mapped_file": inner.get("mapped_file"),
        "docker_stats": usage - inactive if usage is not None and inactive is not None else None,
        "keys": sorted(mem),
    }


def memory_child(backend: str, side: str, count: int, stats_count: int) -> dict[str, Any]:
    """Create ``count`` idle sandboxes (or floor containers); RSS and engine stats."""
    client = docker.from_env(max_pool_size=32)
    floor = Floor(client, default_image(), BACKENDS[backend])
    with Reaper() as reaper:
        cids: list[str] = []
        if side == "ours":
            warm = reaper.sandbox(backend)  # loads every code path an idle sandbox uses
            warm.exec_shell("true")
            warm.destroy()

            def make() -> str:
                sandbox = reaper.sandbox(backend)
                return f"agentnest-{sandbox.id}"  # the Docker backend's container name

        else:
            remove_quietly(floor.idle(reaper))

            def make() -> str:
                return str(floor.idle(reaper).id)  # the reaper keeps the Container object

        gc.collect()
        time.sleep(0.2)
        before = vm_rss_kib()
        for _ in range(count):
            cids.append(make())
        gc.collect()
        after = vm_rss_kib()
        time.sleep(1.0)  # let the agents settle before sampling the engine's stats
        with ThreadPoolExecutor(max_workers=stats_count) as pool:
            mems = list(pool.map(lambda cid: memory_of(client.api, cid), cids[:stats_count]))
        # What Python allocates per object, resident or not (a large buffer that was never
        # touched costs address space, not RSS).  Traced separately: tracemalloc inflates RSS.
        tracemalloc.start()
        snap = tracemalloc.take_snapshot()
        for _ in range(TRACED):
            make()
        gc.collect()
        traced = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(snap, "filename"))
        tracemalloc.stop()
    return {
        "rss_before_kib": before,
        "rss_after_kib": after,
        "count": count,
        "stats": mems,
        "traced_bytes_per_object": traced / TRACED,
    }


def run_memory_child(backend: str, side: str, plan: Plan) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--memory-child", f"{backend}:{side}"]
    argv += ["--memory-count", str(plan.mem_rss), "--memory-stats", str(plan.mem_stats)]
    # Not subprocess.run: on Ctrl-C it SIGKILLs the child, whose sandboxes would then leak.
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=600)
        except BaseException:
            proc.terminate()  # the child turns SIGTERM into SystemExit and cleans up
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if proc.returncode != 0:
        raise RuntimeError(f"memory child ({side}) failed: {err.strip()[-800:]}")
    data: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return data


def bench_memory(backend: str, plan: Plan) -> list[Result]:
    ours_raw = run_memory_child(backend, "ours", plan)
    base_raw = run_memory_child(backend, "floor", plan)

    def series(data: dict[str, Any], field_name: str, label: str) -> Series:
        values = [m[field_name] / MB for m in data["stats"] if m.get(field_name) is not None]
        return Series(label, "MB", values)

    def rss(data: dict[str, Any], label: str) -> Series:
        per = (data["rss_after_kib"] - data["rss_before_kib"]) * 1024 / data["count"] / MB
        return Series(label, "MB", [per], count=data["count"])

    keys = {m.get("cache_key") for m in ours_raw["stats"]}
    notes = [f"engine stats of {plan.mem_stats} idle sandboxes vs idle `sleep infinity` containers"]
    if backend == "gvisor":
        notes.append(
            "runsc: the container's cgroup holds the gVisor Sentry and Gofer, so usage counts the "
            "user-space kernel too (the floor pays it as well)"
        )
    if not ours_raw["stats"] or all(m.get("usage") is None for m in ours_raw["stats"]):
        fields = sorted({k for m in ours_raw["stats"] for k in m.get("keys", [])})
        notes.append(f"the engine reported no memory usage for this runtime (memory_stats keys: {fields})")
    no_cache_notes = [f"usage minus memory_stats.stats[{', '.join(sorted(k or 'none' for k in keys))}]"]
    extra = {name: series(ours_raw, name, name).p50 for name in ("cache", "mapped_file", "docker_stats")}
    if extra["cache"] is not None:
        no_cache_notes.append(
            f"ours p50: cache {fmt(extra['cache'], 'MB')}, "
            f"of which mapped {fmt(extra['mapped_file'], 'MB')}; "
            f"`docker stats` (usage - inactive_file) would show {fmt(extra['docker_stats'], 'MB')}"
        )
    if backend == "gvisor":
        no_cache_notes.append(
            "runsc: the sandbox's memory lives in the Sentry's memfd (shmem), which cgroup v1 counts as "
            "mapped cache; it is not reclaimable, so this line understates: read the raw usage above"
        )
    rss_notes = [
        f"VmRSS of a fresh process before/after creating {ours_raw['count']} sandboxes: "
        f"{ours_raw['rss_before_kib'] / 1024:.1f} -> {ours_raw['rss_after_kib'] / 1024:.1f} MiB "
        f"(floor: {base_raw['rss_before_kib'] / 1024:.1f} -> {base_raw['rss_after_kib'] / 1024:.1f} MiB "
        f"for {base_raw['count']} docker-py Container objects)",
        f"Python allocations per sandbox (tracemalloc, resident or not): "
        f"{ours_raw['traced_bytes_per_object'] / 2**20:.2f} MiB; per floor Container object "
        f"{base_raw['traced_bytes_per_object'] / 2**20:.2f} MiB",
    ]
    return [
        Result(
            backend,
            "7a",
            "idle sandbox memory (usage)",
            series(ours_raw, "usage", "engine stats usage"),
            series(base_raw, "usage", "idle sleep container"),
            Target("p50_le", 10.0),
            notes=notes,
        ),
        Result(
            backend,
            "7b",
            "idle sandbox memory (usage - cache)",
            series(ours_raw, "no_cache", "engine stats usage - cache"),
            series(base_raw, "no_cache", "idle sleep container"),
            Target("p50_le", 10.0),
            notes=no_cache_notes,
        ),
        Result(
            backend,
            "7c",
            "host RSS per idle sandbox",
            rss(ours_raw, "VmRSS delta / sandboxes"),
            rss(base_raw, "VmRSS delta / containers"),
            Target("p50_le", 1.0),
            notes=rss_notes,
        ),
    ]


# -- python sessions ---------------------------------------------------------------------


def bench_session(backend: str, plan: Plan) -> Result:
    """S: ``session.run("x += 1")`` on a warm session, interleaved with the same sandbox's
    warm ``exec_shell("true")`` (docker-py has no persistent interpreter: no engine floor)."""
    ours = Series('session.run("x += 1")', "ms")
    ref = Series('exec_shell("true"), same sandbox', "ms")
    inside: list[float] = []
    pings: list[float] = []
    with Reaper() as reaper:
        sandbox = reaper.sandbox(backend)
        t0 = time.perf_counter()
        session = sandbox.python_session()
        opened = time.perf_counter() - t0
        session.run("x = 0").check()
        for _ in range(50):
            session.run("x += 1")
            sandbox.exec_shell("true")
        for _ in range(plan.warm):  # ABAB, so drift hits both sides alike
            t0 = time.perf_counter()
            result = session.run("x += 1")
            ours.samples.append(time.perf_counter() - t0)
            inside.append(result.duration)
            ref.samples.append(timed(lambda: sandbox.exec_shell("true")))
        if session.run("x").result != str(50 + plan.warm):
            raise RuntimeError("the session lost count")
        channel = core_of(sandbox).link()  # the bare host <-> agent round trip, for scale
        for _ in range(plan.warm):
            pings.append(timed(lambda: channel.request({"t": "ping"}, time.monotonic() + 10)))
        session.close()
    notes = [
        "no engine floor (docker-py has no persistent interpreter); the reference column is this "
        "sandbox's warm exec_shell('true'), which forks a process per call",
        f"in-sandbox time (agent -> interpreter -> agent, SessionResult.duration) p50 "
        f"{percentile(inside, 50) * 1e3:.2f} ms; a bare host <-> agent ping p50 "
        f"{percentile(pings, 50) * 1e3:.2f} ms, p95 {percentile(pings, 95) * 1e3:.2f} ms",
        f"python_session() started its interpreter in {opened * 1e3:.0f} ms",
    ]
    return Result(backend, "S", "session call", ours, ref, Target("p50_le", 1.0), notes=notes)


# -- fork, snapshot and restore (issue 3) ------------------------------------------------

#: Workspace sizes for fork (random, so nothing compresses) and snapshot: issue 12's rows.
FORK_SIZES = (1 * MIB, 100 * MIB)
SNAP_SIZE = 100 * MIB
#: As a sandbox mounts it: owned by the image user (Docker copies the image directory's mode up).
FLOOR_TMPFS = {"/workspace": "rw,nosuid,nodev,size=256m,uid=65532,gid=65532,mode=0755"}


def _fill(sandbox: Sandbox, size: int) -> str:
    """Random data in the workspace; return its sha256 (checked in copies, never timed)."""
    out = sandbox.exec_shell(
        f"head -c {size} /dev/urandom > data.bin && sha256sum data.bin", timeout=120
    ).check()
    return out.stdout.split()[0]


def _floor_exec_out(api: docker.APIClient, cid: str, argv: list[str]) -> Iterator[bytes]:
    """Stream a command's stdout from a floor container (the engine's exec stream)."""
    eid = api.exec_create(cid, argv, stdout=True, stderr=False)["Id"]
    yield from api.exec_start(eid, stream=True)
    code = api.exec_inspect(eid)["ExitCode"]
    if code != 0:
        raise RuntimeError(f"floor exec {argv[:3]} exited {code}")


def _floor_exec_in(api: docker.APIClient, cid: str, argv: list[str], chunks: Iterator[bytes]) -> None:
    """Feed ``chunks`` to a command's stdin in a floor container and wait for it."""
    import socket
    from typing import cast

    eid = api.exec_create(cid, argv, stdin=True, stdout=True, stderr=True)["Id"]
    wrapper = api.exec_start(eid, socket=True)
    sock = cast(socket.socket, getattr(wrapper, "_sock", wrapper))  # the socket under the wrapper
    try:
        for chunk in chunks:
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    finally:
        sock.close()
    code = api.exec_inspect(eid)["ExitCode"]
    if code != 0:
        raise RuntimeError(f"floor exec {argv[:3]} exited {code}")


def _floor_filled(floor: Floor, reaper: Reaper, size: int) -> Container:
    container = floor.run(["sleep", "infinity"], tmpfs=FLOOR_TMPFS)
    reaper.add(lambda: remove_quietly(container))
    exec_ok(container, ["sh", "-c", f"head -c {size} /dev/urandom > /workspace/data.bin"])
    return container


def _floor_fork(floor: Floor, reaper: Reaper, parent: Container) -> tuple[float, list[float]]:
    """docker commit of the parent, a container from that image, the workspace piped across.

    Returns (seconds, [commit, start child, copy]); cleanup is not timed.
    """
    api = floor.client.api
    t0 = time.perf_counter()
    image = api.commit(str(parent.id), pause=False)["Id"]
    t1 = time.perf_counter()
    child = floor.client.containers.run(
        image,
        ["sleep", "infinity"],
        detach=True,
        runtime=floor.runtime,
        network_mode="none",
        labels=FLOOR_LABELS,
        tmpfs=FLOOR_TMPFS,
    )
    t2 = time.perf_counter()
    source = _floor_exec_out(api, str(parent.id), ["tar", "-C", "/workspace", "-cf", "-", "."])
    _floor_exec_in(api, str(child.id), ["tar", "-C", "/workspace", "-xf", "-"], source)
    t3 = time.perf_counter()
    remove_quietly(child)
    with contextlib.suppress(docker.errors.APIError):
        api.remove_image(image, force=True)
    return t3 - t0, [t1 - t0, t2 - t1, t3 - t2]


def bench_fork(backend: str, floor: Floor, plan: Plan) -> list[Result]:
    """F1, F100: ``fork()`` of a sandbox with 1 MiB and 100 MiB of workspace data.

    With a disk workspace on runc the child is a warm spare (``Capability.WARM_FORK``)
    that takes a copy-on-write snapshot of the parent's workspace: the spare is made
    again in the background after each fork, and the loop waits for it between samples
    (not timed), as P1 lets its pool get warm again.  A note gives the cold fork (no
    spare: ``DockerSpec(warm_forks=False)``) and a bare ``Sandbox()``.

    Floor: ``docker commit`` of an equivalent container, a container from the committed
    image, and the workspace copied between them with ``tar`` over the engine's exec
    streams (``docker commit`` does not capture a tmpfs or bind mount).
    """
    results: list[Result] = []
    shared = get_backend(backend)
    cold_backend = (
        DockerBackend(dataclasses.replace(shared.spec, warm_forks=False), name=backend)
        if isinstance(shared, DockerBackend)
        else shared
    )
    for size in FORK_SIZES:
        n = plan.fork_small if size <= MIB else plan.fork_large
        label = f"{size // MIB} MiB"
        ours = Series(f"fork(), {label} workspace", "ms")
        base = Series("commit + run + tar pipe", "ms")
        creates: list[float] = []
        colds: list[float] = []
        phases: list[list[float]] = []
        warm = 0
        with Reaper() as reaper:
            parent = reaper.sandbox(backend, timeout=900)
            digest = _fill(parent, size)
            child = parent.fork()  # warm-up, and the copy is checked once
            copied = child.exec_shell("sha256sum data.bin").check().stdout.split()[0]
            child.destroy()
            if copied != digest:
                raise RuntimeError("the fork's data differs from the parent's")
            for _ in range(n):
                SPARES.wait_idle(120)  # the next spare is ready (or failed): not timed
                warm += SPARES.ready() > 0
                t0 = time.perf_counter()
                child = parent.fork()
                ours.samples.append(time.perf_counter() - t0)
                child.destroy()
                # The part no copy can avoid without a spare: creating a sandbox.
                t0 = time.perf_counter()
                bare = reaper.sandbox(backend)
                creates.append(time.perf_counter() - t0)
                bare.destroy()
            cold_parent = Sandbox(backend=cold_backend, timeout=900)
            reaper.add(cold_parent.destroy)
            _fill(cold_parent, size)
            for _ in range(min(n, 3)):
                t0 = time.perf_counter()
                child = cold_parent.fork()
                colds.append(time.perf_counter() - t0)
                child.destroy()
            container = _floor_filled(floor, reaper, size)
            _floor_fork(floor, reaper, container)  # warm-up
            for _ in range(n):
                total, parts = _floor_fork(floor, reaper, container)
                base.samples.append(total)
                phases.append(parts)
        caps = shared.capabilities()
        how = (
            f"{warm} of {n} samples took a warm spare; a cold fork (warm_forks=False) p50 "
            f"{percentile(colds, 50) * 1e3:.0f} ms over {len(colds)}, a bare Sandbox() p50 "
            f"{percentile(creates, 50) * 1e3:.0f} ms: what the spare saves"
            if Capability.WARM_FORK in caps
            else f"no warm spares here (gVisor's gofer never sees a mount made after the start); "
            f"a bare Sandbox() p50 {percentile(creates, 50) * 1e3:.0f} ms"
        )
        if Capability.LIVE_FORK in caps:
            how += "; fork() is live by default here (processes and sessions too: checkpoint and restore)"
        notes = [
            how,
            "floor by phase (p50): "
            + ", ".join(
                f"{name} {percentile([p[i] for p in phases], 50) * 1e3:.0f} ms"
                for i, name in enumerate(("docker commit", "run child", "tar pipe"))
            )
            + "; it copies no more than ours (commit sees no mount), validates nothing",
        ]
        target = Target("p50_le", 100.0 if size <= MIB else 150.0)  # issue 12
        key = f"F{size // MIB}"
        results.append(Result(backend, key, f"fork, {label} workspace", ours, base, target, notes=notes))
    return results


def bench_snapshot(backend: str, floor: Floor, plan: Plan) -> list[Result]:
    """T1, T2: ``snapshot(path)`` and ``restore(path)`` of 100 MiB of workspace data.

    Floor: ``tar -cf -`` of the workspace over the engine's exec stream into a host file,
    and that file fed to ``tar -xf -`` over an exec stdin (no validation, no staging).
    """
    import tempfile

    n = plan.snapshots
    label = f"{SNAP_SIZE // MIB} MiB"
    snap = Series(f"snapshot(), {label}", "ms")
    rest = Series(f"restore(), {label}", "ms")
    snap_floor = Series("exec tar -c > host file", "ms")
    rest_floor = Series("host file > exec tar -x", "ms")
    writes: list[float] = []
    with Reaper() as reaper, tempfile.TemporaryDirectory(prefix="agentnest-bench-") as tmp:
        path = Path(tmp) / "snap.tar"
        sandbox = reaper.sandbox(backend, timeout=900)
        digest = _fill(sandbox, SNAP_SIZE)
        sandbox.snapshot(path)  # warm-up
        sandbox.restore(path)
        if sandbox.exec_shell("sha256sum data.bin").check().stdout.split()[0] != digest:
            raise RuntimeError("restore changed the data")
        for _ in range(n):  # ABAB: snapshot, then restore of that snapshot
            snap.samples.append(timed(lambda: sandbox.snapshot(path)))
            rest.samples.append(timed(lambda: sandbox.restore(path)))
        size_on_disk = path.stat().st_size
        # What no restore can avoid: writing the data into the workspace's file system.
        where = sandbox.backend.workspace_path(sandbox.handle)
        if where is not None:
            payload = os.urandom(SNAP_SIZE)
            target = where / ".bench-write-floor"
            for _ in range(n):
                writes.append(timed(lambda: target.write_bytes(payload)))
                target.unlink()
        api = floor.client.api
        container = _floor_filled(floor, reaper, SNAP_SIZE)
        floor_path = Path(tmp) / "floor.tar"

        def floor_out() -> None:
            with open(floor_path, "wb") as f:
                for chunk in _floor_exec_out(
                    api, str(container.id), ["tar", "-C", "/workspace", "-cf", "-", "."]
                ):
                    f.write(chunk)

        def floor_in() -> None:
            with open(floor_path, "rb") as f:
                chunks = iter(lambda: f.read(1 << 20), b"")
                _floor_exec_in(api, str(container.id), ["tar", "-C", "/workspace", "-xf", "-"], chunks)

        floor_out()
        floor_in()
        for _ in range(n):
            snap_floor.samples.append(timed(floor_out))
            rest_floor.samples.append(timed(floor_in))
    notes = [
        f"random data in one file; the snapshot file is {size_on_disk / MB:.1f} MB, written next to "
        "its path and exchanged with the old one; the host validates every member and hashes the payload "
        "(SHA-256, in a second thread); a disk workspace under 256 MiB is read live with the sandbox "
        "frozen, by the tar writer in a thread of this process",
    ]
    rest_notes = [
        "on a disk workspace the extractor (a process of the sandbox's user on the host) reads the "
        "snapshot file itself and stages it while the host checks the file (rules, SHA-256) on the other "
        "core, then swaps it in; elsewhere the file streams through the host's validation into the "
        "extractor; the floor extracts over the old files in place",
    ]
    if writes:
        rest_notes.append(
            f"writing {label} into a new file of the workspace from the host (no tar, no check) "
            f"p50 {percentile(writes, 50) * 1e3:.0f} ms: the data a restore must write"
        )
    return [
        Result(backend, "T1", f"snapshot, {label}", snap, snap_floor, Target("p50_le", 150.0), notes=notes),
        Result(
            backend, "T2", f"restore, {label}", rest, rest_floor, Target("p50_le", 150.0), notes=rest_notes
        ),
    ]


def machine_info(client: docker.DockerClient) -> dict[str, Any]:
    info = client.info()
    version = client.version()

    def command_version(argv: list[str]) -> str | None:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        return out.splitlines()[0].strip() if out else None

    meminfo = Path("/proc/meminfo").read_text().split()
    others = [c for c in client.containers.list() if not (c.name or "").startswith("agentnest-")]
    return {
        "docker": version.get("Version"),
        "api": version.get("ApiVersion"),
        "runtimes": sorted(info.get("Runtimes") or {}),
        "runc": command_version(["runc", "--version"]),
        "runsc": command_version(["runsc", "--version"]),
        "os": info.get("OperatingSystem"),
        "kernel": platform.release(),
        "cgroup": f"v{info.get('CgroupVersion', '?')} ({info.get('CgroupDriver', '?')})",
        "cpus": os.cpu_count(),
        "memory_gib": round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20, 1),
        "python": platform.python_version(),
        "agentnest": agentnest.__version__,
        "docker_py": docker.__version__,
        "image": default_image(),
        "loadavg_start": os.getloadavg(),
        "agentnest_sandboxes_running_at_start": len(client.containers.list()) - len(others),
        "other_containers_running_at_start": len(others),
    }


#: The sizes of the rows seed.py measures with 0.3.0: the ones ours use.
SEED_SIZES = {
    "F1": FORK_SIZES[0],
    "F100": FORK_SIZES[1],
    "T1": SNAP_SIZE,
    "T2": SNAP_SIZE,
    "4w": FILE_SIZE,
    "4r": FILE_SIZE,
    "P3": POOL_BURST_SIZE,
}


def run_backend(
    backend: str, client: docker.DockerClient, plan: Plan, only: set[str] | None = None
) -> list[Result]:
    floor = Floor(client, default_image(), BACKENDS[backend])
    steps: list[tuple[str, str, Callable[[], Result | list[Result]]]] = [
        ("1", "cold start", lambda: bench_cold_start(backend, floor, plan)),
        ("2", "warm exec", lambda: bench_warm_exec(backend, floor, plan)),
        ("3", "exec_python", lambda: bench_exec_python(backend, floor, plan)),
        ("4", "10 MiB file round trip", lambda: bench_files(backend, floor, plan)),
        ("5", "50 MiB stdout throughput", lambda: bench_stdout(backend, floor, plan)),
        ("6", "parallel execs", lambda: bench_parallel(backend, floor, plan)),
        ("7", "idle memory", lambda: bench_memory(backend, plan)),
        ("G", "approval hooks", lambda: bench_approvals(backend, plan)),
        ("S", "python session", lambda: bench_session(backend, plan)),
        ("P", "pools", lambda: bench_pool(backend, plan)),
        ("F", "fork", lambda: bench_fork(backend, floor, plan)),
        ("T", "snapshot and restore", lambda: bench_snapshot(backend, floor, plan)),
        ("L", "live state (gVisor)", lambda: bench_live(backend, floor, plan)),
        ("E", "egress allowlist", lambda: bench_egress(backend, plan)),
        ("B", "browser preset", lambda: bench_browser(backend, floor, plan)),
        ("D", "disk workspaces: host disk", lambda: bench_disk(backend, plan)),
        ("K", "kubernetes backend (cluster double)", lambda: bench_kube(backend, plan)),
        ("M", "manager: admission", lambda: bench_manager(backend, plan)),
        ("Z", "E2B face (stock SDK)", lambda: bench_e2b(backend, plan)),
    ]
    results: list[Result] = []
    for key, name, step in steps:
        if only is not None and key not in only:
            continue
        t0 = time.perf_counter()
        try:
            got = step()
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            got = Result(backend, key, name, Series("", "ms"), error=f"{type(exc).__name__}: {exc}")
        for result in got if isinstance(got, list) else [got]:
            report(result)
            results.append(result)
        print(f"    ({key} took {time.perf_counter() - t0:.1f} s)", flush=True)
    return results


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples (about 2 minutes)")
    runtimes = {runtime: name for name, runtime in BACKENDS.items()}  # --backend runc is docker
    parser.add_argument(
        "--backend", choices=[*BACKENDS, *runtimes, "all"], default="all", help="a backend or its OCI runtime"
    )
    parser.add_argument("--json", metavar="PATH", help="write every result and sample here")
    parser.add_argument("--only", metavar="KEYS", help="run only these steps, e.g. 2,G (default: all)")
    parser.add_argument(
        "--compare-seed",
        action="store_true",
        help=f"also measure agentnest {seed.SEED_VERSION} (pip-installed once into a cached venv) on "
        "the fork, snapshot/restore, file and pool rows of the selected steps, and print ours/seed",
    )
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    parser.add_argument("--memory-count", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--memory-stats", type=int, default=8, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # `kill` / `timeout` end the run through the same finally blocks as Ctrl-C: nothing leaks.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # Parallel sandbox creation briefly needs more engine connections than the default pool.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)

    if args.memory_child:
        backend, _, side = args.memory_child.partition(":")
        data = memory_child(backend, side, args.memory_count, args.memory_stats)
        print(json.dumps(data))
        return 0

    plan = Plan.make(args.quick)
    seed_python: Path | None = None
    if args.compare_seed:  # before any measurement: a missing seed fails fast
        try:
            seed_python = seed.seed_python()
        except seed.SeedError as exc:
            print(f"--compare-seed: {exc}", file=sys.stderr)
            return 2
    client = docker.from_env(max_pool_size=32)
    meta = machine_info(client)
    print(f"AgentNest {meta['agentnest']} benchmarks ({'quick' if plan.quick else 'full'} run)")
    print(
        f"docker {meta['docker']} (API {meta['api']}), runtimes {', '.join(meta['runtimes'])}; "
        f"{meta['runc']}; {meta['runsc']}"
    )
    print(
        f"{meta['os']}, kernel {meta['kernel']}, cgroup {meta['cgroup']}, {meta['cpus']} CPUs, "
        f"{meta['memory_gib']} GiB; Python {meta['python']}, docker-py {meta['docker_py']}"
    )
    print(
        f"image {meta['image']}; load average {', '.join(f'{x:.2f}' for x in meta['loadavg_start'])}; "
        f"other running containers: {meta['other_containers_running_at_start']}, "
        f"AgentNest sandboxes: {meta['agentnest_sandboxes_running_at_start']}",
        flush=True,
    )
    if seed_python is not None:
        meta["seed"] = {"version": seed.SEED_VERSION, "python": str(seed_python)}
        print(f"seed: agentnest {seed.SEED_VERSION} in {seed_python.parent.parent}", flush=True)

    only = set(args.only.split(",")) if args.only else None
    seed_rows: list[seed.SeedRow] = []
    selected = list(BACKENDS) if args.backend == "all" else [runtimes.get(args.backend, args.backend)]
    results: list[Result] = []
    skipped: list[str] = []
    started = time.perf_counter()
    for backend in selected:
        runtime = BACKENDS[backend]
        if runtime not in meta["runtimes"]:
            print(f"\n== {backend}: skipped, the engine has no {runtime!r} runtime ==", flush=True)
            skipped.append(backend)
            continue
        print(f"\n== {backend} (runtime {runtime}) ==", flush=True)
        results += run_backend(backend, client, plan, only)
        if seed_python is not None:
            rows = seed.plan_rows(plan, only, SEED_SIZES)
            if rows:
                print(f"\n-- {backend}: agentnest {seed.SEED_VERSION} (the seed), same rows --", flush=True)
                t0 = time.perf_counter()
                seed_rows += seed.run(seed_python, backend, default_image(), rows)
                print(f"    (seed took {time.perf_counter() - t0:.1f} s)", flush=True)
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    meta["loadavg_end"] = os.getloadavg()
    meta["quick"] = plan.quick
    meta["skipped"] = skipped

    print(f"\nSummary ({meta['elapsed_s']} s; load average at end ", end="")
    print(f"{', '.join(f'{x:.2f}' for x in meta['loadavg_end'])})\n")
    print(summary(results))
    print("(for rates, p95 is the slow tail: the rate at the 95th-percentile duration)")
    verdicts = [r.verdict for r in results]
    print(
        f"\n{verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS, {verdicts.count('ERROR')} ERROR "
        "(misses are reported, not raised)"
    )
    if seed_rows:
        print(f"\nAgainst agentnest {seed.SEED_VERSION} (the seed; same run, image and OCI runtime)\n")
        print(seed.comparison(results, seed_rows))
    if args.json:
        payload: dict[str, Any] = {"meta": meta, "results": [r.to_json() for r in results]}
        if seed_python is not None:
            payload["seed"] = [r.to_json() for r in seed_rows]
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if "ERROR" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
