"""Step L: live state on gVisor (issue 12's targets): live fork, and pause/resume to disk.

* L1: ``fork(live=True)`` of a sandbox whose Python session holds 100 MiB: the child has the
  session (checked: its variable answers), the parent too.
* L2, L3: ``pause()`` (a checkpoint to disk: the container stops, its memory is released) and
  ``resume()`` of such a sandbox.

Every sample takes a fresh sandbox (not timed): a container restored from a checkpoint is not
checkpointed again (docs/state.md says why).  Floor: the engine's own checkpoint and restore of
a runsc container running ``python3`` holding 100 MiB (``POST /containers/{id}/checkpoints``,
``POST /containers/{id}/start?checkpoint=``, through agentnest.runtime.docker.checkpoint's thin
wrappers, which add only the workaround every restore here needs); for L1, the checkpoint, the
copy's restore into a new container and the original's restore, one after the other.  On runc
there is nothing to measure (CRIU fails on this kernel): the step says so.

Imported by bench.py from the same directory.
"""

from __future__ import annotations

import time
from typing import Any

from harness import MIB, Floor, Plan, Reaper, Result, Series, Target, percentile, timed

from agentnest import Sandbox
from agentnest.runtime.base import Capability
from agentnest.runtime.docker import checkpoint
from agentnest.runtime.registry import get_backend

HOLD = 100 * MIB
HOLDER = f"blob = bytearray({HOLD}); blob[::4096] = b'x' * len(blob[::4096]); x = 41"
FLOOR_HOLDER = (
    f"import time; blob = bytearray({HOLD}); blob[::4096] = b'x' * len(blob[::4096]); time.sleep(3600)"
)


def _holder(reaper: Reaper, backend: str) -> Sandbox:
    sandbox = reaper.sandbox(backend, timeout=900, memory="1g")
    sandbox.python_session(name="main").run(HOLDER).check()
    return sandbox


def bench_live(backend: str, floor: Floor, plan: Plan) -> list[Result]:
    """L1, L2, L3 (gVisor with an experimental local engine only)."""
    caps = get_backend(backend).capabilities()
    if Capability.LIVE_FORK not in caps:
        why = "runc: CRIU fails on this kernel" if backend == "docker" else "the engine cannot checkpoint"
        return [Result(backend, "L", "live state", Series("", "ms"), notes=[f"skipped: {why}"])]
    n = plan.fork_large
    fork = Series("fork(live=True), a session holding 100 MiB", "ms")
    pause = Series("pause() to disk", "ms")
    resume = Series("resume() from disk", "ms")
    fork_floor = Series("checkpoint + restore copy + restore original", "ms")
    pause_floor = Series("engine checkpoint", "ms")
    resume_floor = Series("engine restore", "ms")
    with Reaper() as reaper:
        for _ in range(n + 1):  # the first is a warm-up
            parent = _holder(reaper, backend)
            t0 = time.perf_counter()
            child = parent.fork(live=True)
            took = time.perf_counter() - t0
            reaper.add(child.destroy)
            if child.python_session(name="main").run("x + 1").check().result != "42":
                raise RuntimeError("the live fork's child lost the session")
            fork.samples.append(took)
            child.destroy()
            parent.destroy()
        fork.samples.pop(0)
        for _ in range(n + 1):
            sandbox = _holder(reaper, backend)
            pause.samples.append(timed(sandbox.pause))
            resume.samples.append(timed(sandbox.resume))
            if sandbox.python_session(name="main").run("x + 1").check().result != "42":
                raise RuntimeError("the resumed sandbox lost the session")
            sandbox.destroy()
        pause.samples.pop(0)
        resume.samples.pop(0)
        api = floor.client.api
        info: dict[str, Any] = api.info()
        for i in range(n + 1):
            original = reaper.container(floor, ["python3", "-c", FLOOR_HOLDER])
            _wait_rss(original)
            cid = str(original.id)
            t0 = time.perf_counter()
            checkpoint.create(api, cid, checkpoint.FORK_NAME)
            taken = time.perf_counter() - t0
            copy = floor.client.containers.create(
                floor.image, ["python3", "-c", FLOOR_HOLDER], runtime=floor.runtime, network_mode="none"
            )
            reaper.add(lambda c=copy: c.remove(force=True))
            t1 = time.perf_counter()
            source = checkpoint.directory(info, cid, checkpoint.FORK_NAME)
            checkpoint.copy(source, checkpoint.directory(info, str(copy.id), checkpoint.FORK_NAME))
            checkpoint.restore(api, info, str(copy.id), checkpoint.FORK_NAME)
            t2 = time.perf_counter()
            checkpoint.restore(api, info, cid, checkpoint.FORK_NAME)
            t3 = time.perf_counter()
            if i:
                pause_floor.samples.append(taken)
                resume_floor.samples.append(t3 - t2)
                fork_floor.samples.append(taken + (t2 - t1) + (t3 - t2))
            original.remove(force=True)
            copy.remove(force=True)
    notes = [
        "each sample a fresh sandbox whose named session holds 100 MiB (touched); the child's session "
        "answers x + 1 == 42; parent and child are restored at the same time (runsc's restores overlap)",
        f"floor phases (p50): checkpoint {percentile(pause_floor.samples, 50) * 1e3:.0f} ms, "
        f"restore {percentile(resume_floor.samples, 50) * 1e3:.0f} ms: runsc {_runsc()} does the work",
    ]
    return [
        Result(
            backend,
            "L1",
            "live fork, session holding 100 MiB",
            fork,
            fork_floor,
            Target("p50_le", 1000.0),
            notes=notes,
        ),
        Result(backend, "L2", "pause to disk, 100 MiB session", pause, pause_floor),
        Result(
            backend, "L3", "resume from disk, 100 MiB session", resume, resume_floor, Target("p50_le", 1000.0)
        ),
    ]


def _wait_rss(container: Any, within: float = 60.0) -> None:
    """Poll until the floor's python3 holds its 100 MiB (its memory is what the checkpoint writes)."""
    until = time.monotonic() + within
    while time.monotonic() < until:
        stats = container.stats(stream=False)
        if (stats.get("memory_stats") or {}).get("usage", 0) >= HOLD:
            return
        time.sleep(0.05)
    raise RuntimeError("the floor's process did not fill its memory")


def _runsc() -> str:
    import subprocess

    try:
        out = subprocess.run(["runsc", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.splitlines()[0].split()[-1] if out else "?"
