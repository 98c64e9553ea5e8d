"""``bench.py --compare-seed``: agentnest 0.3.0, the release this project replaces, in the same run.

0.3.0 comes from the package index into the throwaway venv tests/compat uses
(``${XDG_CACHE_HOME:-~/.cache}/agentnest/compat/venv-0.3.0``, made once, then reused; the
same code makes it, see :func:`seed_python`).  It runs in its own interpreter:
seed_driver.py, started with that venv's python, measures the rows in :data:`ROWS` with
0.3.0's own API and defaults on the same image and OCI runtime as ours, and prints one JSON
line per row.  :func:`comparison` then prints each next to ours: ours p50/p95, the floor,
0.3.0's p50/p95 and ours/0.3.0.  A row 0.3.0 cannot do (its restore, refused by its
read-only root) is shown as "fails" with the error.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import Plan, Result, Series, fmt, fmt_series, table

SEED_VERSION = "0.3.0"
DRIVER = Path(__file__).resolve().with_name("seed_driver.py")


@dataclass(frozen=True)
class Row:
    """One row 0.3.0 is measured on: the bench.py step that measures ours, and our rows it faces."""

    step: str
    name: str
    ours: tuple[str, ...]


#: Row key (the driver's) -> the row.  P3 faces both of our pool configurations.
ROWS: dict[str, Row] = {
    "F1": Row("F", "fork, 1 MiB workspace", ("F1",)),
    "F100": Row("F", "fork, 100 MiB workspace", ("F100",)),
    "T1": Row("T", "snapshot, 100 MiB", ("T1",)),
    "T2": Row("T", "restore, 100 MiB", ("T2",)),
    "4w": Row("4", "write_file 10 MiB", ("4w",)),
    "4r": Row("4", "read_file 10 MiB", ("4r",)),
    "P3": Row("P", "pool (size 2), acquire back to back", ("P3",)),
}


class SeedError(Exception):
    """0.3.0 could not be installed or started (the message says why)."""


@dataclass
class SeedRow:
    """0.3.0's side of one row: samples (seconds), or the error it failed with."""

    backend: str
    key: str
    series: Series | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "key": self.key,
            "seed": self.series.to_json() if self.series is not None else None,
            "error": self.error,
            "notes": self.notes,
        }


def seed_python() -> Path:
    """The python of the venv with agentnest 0.3.0, installed by pip on first use.

    The venv is tests/compat's (test_surface_030.venv_030: same directory, lock and
    completion marker), so a test run and a bench run install it once between them.
    """
    import pytest

    from tests.compat.test_surface_030 import venv_030

    try:
        return venv_030()
    except pytest.fail.Exception as exc:  # how the test helper reports a failed pip install
        raise SeedError(str(exc)) from None


def plan_rows(plan: Plan, only: set[str] | None, sizes: dict[str, int]) -> dict[str, dict[str, int]]:
    """The driver's rows for the selected steps: the same n and sizes as ours."""
    counts = {
        "F1": plan.fork_small,
        "F100": plan.fork_large,
        "T1": plan.snapshots,
        "T2": plan.snapshots,
        "4w": plan.files,
        "4r": plan.files,
        "P3": plan.pool_burst,
    }
    return {
        key: {"n": counts[key], "size": sizes[key]}
        for key, row in ROWS.items()
        if only is None or row.step in only
    }


def report_row(row: SeedRow) -> None:
    head = f"[{row.backend}] {row.key} agentnest {SEED_VERSION}"
    if row.series is None:
        print(f"{head}: fails: {row.error}", flush=True)
        return
    print(f"{head}: {fmt_series(row.series)}", flush=True)
    for note in row.notes:
        print(f"    - {note}", flush=True)


def run(python: Path, backend: str, image: str, rows: dict[str, dict[str, int]]) -> list[SeedRow]:
    """Measure ``rows`` with 0.3.0 in a child interpreter; every row comes back, as samples or an error."""
    if not rows:
        return []
    spec = json.dumps({"backend": backend, "image": image, "rows": rows})
    # -I: neither this checkout nor PYTHONPATH on sys.path, so the child imports 0.3.0, never ours.
    argv = [str(python), "-I", str(DRIVER), spec]
    got: dict[str, SeedRow] = {}
    refused: str | None = None
    with tempfile.TemporaryFile("w+") as stderr:
        # Not subprocess.run: on Ctrl-C it SIGKILLs the child, whose containers would then leak.
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd="/") as proc:
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if not line.startswith("{"):
                        continue  # not the driver's (a library printing): its lines are JSON objects
                    message = json.loads(line)
                    if "version" in message:
                        if message["version"] != SEED_VERSION:  # never compare ours with ours
                            refused = (
                                f"{python} imports agentnest {message['version']} from {message['module']}, "
                                f"not {SEED_VERSION}: remove {python.parent.parent} so it is made again"
                            )
                            proc.terminate()
                            break
                        continue
                    row = _row(backend, message)
                    got[row.key] = row
                    report_row(row)
                proc.wait()
            except BaseException:
                proc.terminate()  # the driver turns SIGTERM into SystemExit and cleans up
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
        stderr.seek(0)
        tail = stderr.read()[-1500:].strip()
    for key in [key for key in rows if key not in got]:
        why = refused or f"the {SEED_VERSION} driver exited {proc.returncode} before measuring this"
        got[key] = SeedRow(backend, key, error=f"{why}: {tail}" if tail and not refused else why)
        report_row(got[key])
    return [got[key] for key in rows]


def _row(backend: str, message: dict[str, Any]) -> SeedRow:
    key = str(message["key"])
    if "error" in message:
        return SeedRow(backend, key, error=str(message["error"]))
    series = Series(f"agentnest {SEED_VERSION}", "ms", [float(x) for x in message["samples"]])
    return SeedRow(backend, key, series, notes=[str(n) for n in message.get("notes", [])])


def comparison(results: list[Result], seed_rows: list[SeedRow]) -> str:
    """The rows measured with 0.3.0, each next to ours and the floor."""
    ours = {(r.backend, r.key): r for r in results}  # a step that failed has the step's key
    header: tuple[str, ...] = ("backend", "#", "measurement", "ours p50", "ours p95", "floor p50")
    header += (f"{SEED_VERSION} p50", f"{SEED_VERSION} p95", f"ours/{SEED_VERSION}")
    lines: list[tuple[str, ...]] = [header]
    failures: list[str] = []
    for row in seed_rows:
        theirs = row.series
        if theirs is None:
            failures.append(f"{row.backend} {row.key}: agentnest {SEED_VERSION} fails: {row.error}")
        spec = ROWS[row.key]
        for key in spec.ours:
            result = ours.get((row.backend, key)) or ours.get((row.backend, spec.step))
            if result is None:
                continue  # not measured on our side (a row only some backends have)
            mine = result.ours if result.error is None else None
            floor = result.floor
            ratio = None
            if mine is not None and mine.p50 is not None and theirs is not None and theirs.p50:
                ratio = mine.p50 / theirs.p50
            lines.append(
                (
                    row.backend,
                    key,
                    result.name if result.error is None else spec.name,
                    fmt(mine.p50, mine.unit) if mine is not None else "ERROR",
                    fmt(mine.p95, mine.unit) if mine is not None else "-",
                    fmt(floor.p50, floor.unit) if floor is not None else "-",
                    fmt(theirs.p50, theirs.unit) if theirs is not None else "fails",
                    fmt(theirs.p95, theirs.unit) if theirs is not None else "-",
                    f"{ratio:.2f}x" if ratio is not None else "-",
                )
            )
    text = table(lines)
    text += f"\n(ours/{SEED_VERSION} below 1: ours is faster; lower is better on every row)"
    return "\n".join([text, *failures])
