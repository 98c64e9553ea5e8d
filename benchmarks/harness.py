"""What every benchmark shares: sample plans, statistics, results and their report, cleanup, floors.

Imported by bench.py (and seed.py, egress.py) from the same directory; not a public API.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from agentnest import Sandbox

# The doubles of other people's systems (tests/doubles: the Kubernetes cluster, PostgreSQL) are
# imported as `doubles.*`, as pytest's `pythonpath = ["tests"]` makes them.  Appended, not put first:
# tests/e2b (a package) must not hide this directory's e2b.py.
TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))

#: Backend name -> OCI runtime the floor uses.
BACKENDS: dict[str, str] = {"docker": "runc", "gvisor": "runsc"}
#: Label on every floor container, so a leftover one is easy to find (`docker ps -f label=...`).
FLOOR_LABELS = {"agentnest-bench.role": "floor"}
MB = 1_000_000  # throughput and memory are reported in MB = 10^6 bytes
MIB = 2**20  # data sizes (files, workspaces) are MiB, as the issues state them

# -- plan --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Sample counts: full run or ``--quick``."""

    quick: bool
    cold: int
    warm: int
    warm_floor: int
    python: int
    python_floor: int
    files: int
    stdout: int
    par_rounds: int
    par_floor_execs: int
    mem_stats: int
    mem_rss: int
    # fork of a small / a large workspace, snapshot+restore pairs, back-to-back pool acquires:
    # the seed (seed.py) takes the same counts, so both sides have the same n.
    fork_small: int
    fork_large: int
    snapshots: int
    pool_burst: int

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(True, 8, 100, 20, 20, 10, 8, 3, 1, 5, 8, 8, 5, 3, 3, 40)
        return cls(False, 20, 300, 50, 50, 20, 20, 5, 3, 10, 8, 16, 12, 7, 7, 100)


# -- statistics --------------------------------------------------------------------------


def percentile(samples: list[float], q: int) -> float:
    """The q-th percentile (1..99), interpolated between closest ranks."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(sorted(samples), n=100, method="inclusive")[q - 1]


@dataclass
class Series:
    """Samples of one side of a measurement.

    ``samples`` are seconds for ``ms`` and rate units (a rate is ``work / seconds``, so
    its p95 is the slow tail: the rate of the 95th-percentile duration), and plain values
    for ``MB``.
    """

    label: str
    unit: str  # "ms" | "MB/s" | "execs/s" | "MB"
    samples: list[float] = field(default_factory=list)
    work: float = 1.0
    count: int | None = None  # shown as n when a sample aggregates several objects

    @property
    def n(self) -> int:
        return self.count if self.count is not None else len(self.samples)

    def _show(self, value: float) -> float:
        if self.unit == "ms":
            return value * 1e3
        if self.unit.endswith("/s"):
            return self.work / value if value > 0 else float("inf")
        return value

    @property
    def p50(self) -> float | None:
        return self._show(percentile(self.samples, 50)) if self.samples else None

    @property
    def p95(self) -> float | None:
        return self._show(percentile(self.samples, 95)) if self.samples else None

    @property
    def p99(self) -> float | None:
        return self._show(percentile(self.samples, 99)) if self.samples else None

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "unit": self.unit,
            "n": self.n,
            "p50": self.p50,
            "p95": self.p95,
            "p99": self.p99,
            "work": self.work,
            "samples": self.samples,
        }


@dataclass(frozen=True)
class Target:
    """A goal from the issue: ``ratio_le`` (ours/floor <=), ``p50_le``, ``p50_ge`` or ``p99_le``."""

    kind: str
    value: float

    def text(self, unit: str) -> str:
        if self.kind == "ratio_le":
            return f"p50 <= {self.value:g}x floor"
        if self.kind == "p99_le":
            return f"p99 <= {self.value:g} {unit}"
        op = "<=" if self.kind == "p50_le" else ">="
        return f"p50 {op} {self.value:g} {unit}"

    def check(self, result: Result) -> bool | None:
        p50 = result.ours.p50
        if self.kind == "p99_le":
            p99 = result.ours.p99
            return None if p99 is None else p99 <= self.value
        if self.kind == "ratio_le":
            ratio = result.ratio
            return None if ratio is None else ratio <= self.value
        if p50 is None:
            return None
        return p50 <= self.value if self.kind == "p50_le" else p50 >= self.value


@dataclass
class Result:
    backend: str
    key: str
    name: str
    ours: Series
    floor: Series | None = None
    target: Target | None = None
    higher_is_better: bool = False
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        ours = self.ours.p50
        floor = self.floor.p50 if self.floor is not None else None
        if ours is None or not floor:
            return None
        return ours / floor

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "ERROR"
        if self.target is None:
            return "-"
        ok = self.target.check(self)
        return "n/a" if ok is None else ("PASS" if ok else "MISS")

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "key": self.key,
            "name": self.name,
            "better": "higher" if self.higher_is_better else "lower",
            "ours": self.ours.to_json(),
            "floor": self.floor.to_json() if self.floor else None,
            "ratio": self.ratio,
            "target": self.target.text(self.ours.unit) if self.target else None,
            "verdict": self.verdict,
            "notes": self.notes,
            "error": self.error,
        }


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit in ("ms", "MB") and value < 10:
        return f"{value:.2f} {unit}"
    return f"{value:.1f} {unit}"


def fmt_series(s: Series) -> str:
    return f"n={s.n} p50={fmt(s.p50, s.unit)} p95={fmt(s.p95, s.unit)} p99={fmt(s.p99, s.unit)}"


def report(result: Result) -> None:
    """Print one measurement as soon as it is done."""
    head = f"[{result.backend}] {result.key} {result.name}"
    if result.error is not None:
        print(f"{head}: ERROR {result.error}", flush=True)
        return
    line = f"{head}: {fmt_series(result.ours)}"
    if result.floor is not None:
        line += f" | floor {result.floor.label}: {fmt_series(result.floor)}"
        ratio = result.ratio
        better = "higher" if result.higher_is_better else "lower"
        line += f" | ours/floor {ratio:.2f}x ({better} is better)" if ratio is not None else " | ratio n/a"
    if result.target is not None:
        line += f" | target {result.target.text(result.ours.unit)}: {result.verdict}"
    print(line, flush=True)
    for note in result.notes:
        print(f"    - {note}", flush=True)


def summary(results: list[Result]) -> str:
    header: tuple[str, ...] = ("backend", "#", "measurement", "n", "ours p50", "ours p95", "floor p50")
    header += ("ours/floor", "target", "result")
    rows: list[tuple[str, ...]] = [header]
    for r in results:
        ratio = r.ratio
        rows.append(
            (
                r.backend,
                r.key,
                r.name,
                str(r.ours.n) if r.error is None else "-",
                fmt(r.ours.p50, r.ours.unit) if r.error is None else "-",
                fmt(r.ours.p95, r.ours.unit) if r.error is None else "-",
                fmt(r.floor.p50, r.floor.unit) if r.floor is not None else "-",
                f"{ratio:.2f}x" if ratio is not None else "-",
                r.target.text(r.ours.unit) if r.target is not None else "-",
                r.verdict,
            )
        )
    return table(rows)


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns; the first row is the header, underlined."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- resources ---------------------------------------------------------------------------


class Reaper:
    """Removes every sandbox and floor container it was given, even on errors or Ctrl-C."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def add(self, undo: Callable[[], None]) -> None:
        with self._lock:
            self._undo.append(undo)

    def sandbox(self, backend: str, **kwargs: Any) -> Sandbox:
        sandbox = Sandbox(backend=backend, **kwargs)
        self.add(sandbox.destroy)
        return sandbox

    def container(self, floor: Floor, command: list[str]) -> Container:
        container = floor.run(command)
        self.add(lambda: remove_quietly(container))
        return container

    def close(self) -> None:
        with self._lock:
            undo, self._undo = self._undo[::-1], []
        if not undo:
            return
        with ThreadPoolExecutor(max_workers=min(8, len(undo))) as pool:
            for future in [pool.submit(fn) for fn in undo]:
                try:
                    future.result()
                except Exception as exc:
                    print(f"    ! cleanup failed: {exc}", file=sys.stderr, flush=True)

    def __enter__(self) -> Reaper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_quietly(container: Container) -> None:
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True)


class Floor:
    """Plain docker-py on the same image and OCI runtime, no network: the floor."""

    def __init__(self, client: docker.DockerClient, image: str, runtime: str) -> None:
        self.client = client
        self.image = image
        self.runtime = runtime

    def run(self, command: list[str], **kwargs: Any) -> Container:
        container: Container = self.client.containers.run(
            self.image,
            command,
            detach=True,
            runtime=self.runtime,
            network_mode="none",
            labels=FLOOR_LABELS,
            **kwargs,
        )
        return container

    def idle(self, reaper: Reaper) -> Container:
        """A running container to exec into; /tmp is a tmpfs, as in a sandbox."""
        container = self.run(["sleep", "infinity"], tmpfs={"/tmp": "rw,size=64m,mode=1777"})
        reaper.add(lambda: remove_quietly(container))
        return container


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def exec_ok(container: Container, argv: list[str], expect: bytes | None = None) -> bytes:
    code, output = container.exec_run(argv)
    if not isinstance(output, bytes):  # only streamed exec_run yields an iterator
        raise TypeError("exec_run returned a stream")
    if code != 0 or (expect is not None and output != expect):
        raise RuntimeError(f"floor exec {argv[:3]} failed: exit {code}, output {output[:200]!r}")
    return output
