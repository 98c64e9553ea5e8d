"""The fault suite's engine: a private dockerd behind a proxy that can refuse or blackhole.

Faults are injected into that engine only (``doubles.dockerd``); the
main engine is never touched.  Every cell (fault x operation) is recorded by
:class:`Cells`; the terminal summary prints the table and writes it to
``.faults-report.json`` in the repository root.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from doubles.dockerd import BlackholeProxy, PrivateEngine, leftovers

from agentnest.errors import AgentNestError

REQUIRE_ENGINE = os.environ.get("AGENTNEST_REQUIRE_ENGINE") == "1"

REPORT = Path(__file__).resolve().parents[2] / ".faults-report.json"
#: A cell still running after this many seconds is a hang (its thread is left behind).
HANG_CAP = 12.0
#: The engine API timeout of every backend here (``DockerSpec.api_timeout``): a blackholed engine
#: call must give up after this, well inside the cap.
API_TIMEOUT = 6.0


@dataclass
class Cell:
    fault: str
    op: str
    outcome: str  # "ok", "typed", "untyped", "hang"
    raised: str = ""  # the exception's class (module-qualified when not AgentNest's)
    message: str = ""
    seconds: float = 0.0
    frames: list[str] = field(default_factory=list)  # the last frames, innermost last
    expected: str = ""  # the AgentNestError subclass this fault should raise, if clear
    note: str = ""


class Cells:
    """Every cell of the matrix, plus the suite's counts."""

    def __init__(self) -> None:
        self.cells: list[Cell] = []
        self.faults = 0
        self.leaks: dict[str, Any] = {}
        #: Per fault: the agentnest containers still on the engine after its sandboxes were closed.
        self.left_by_fault: dict[str, list[str]] = {}
        self.recoveries: dict[str, dict[str, Any]] = {}
        #: The suite's own time: from its private engine's start to its end (not
        #: the whole pytest session's, of which it is one package).
        self.started = time.monotonic()
        self.finished: float | None = None
        #: Hung cells still running: (cell, thread, box, start), settled later (see settle()).
        self.pending: list[tuple[Cell, threading.Thread, dict[str, Any], float]] = []

    def fault(self, name: str) -> None:
        self.faults += 1

    def run(
        self,
        fault: str,
        op: str,
        fn: Callable[[], object],
        *,
        expected: type[AgentNestError] | None = None,
        cap: float = HANG_CAP,
    ) -> Cell:
        """Run ``fn`` in a thread, at most ``cap`` seconds; record how it ended."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # recorded, judged below
                box["exc"] = exc

        start = time.monotonic()
        thread = threading.Thread(target=target, name=f"cell-{fault}-{op}", daemon=True)
        thread.start()
        thread.join(cap)
        seconds = round(time.monotonic() - start, 2)
        cell = Cell(fault, op, "ok", seconds=seconds, expected=expected.__name__ if expected else "")
        if thread.is_alive():
            cell.outcome = "hang"
            cell.message = f"still running after {cap}s"
            cell.frames = sys_frames(thread)
            self.pending.append((cell, thread, box, start))
        elif "exc" in box:
            exc = box["exc"]
            cls = type(exc)
            typed = isinstance(exc, AgentNestError)
            cell.outcome = "typed" if typed else "untyped"
            cell.raised = (
                cls.__name__ if cls.__module__.startswith("agentnest") else f"{cls.__module__}.{cls.__name__}"
            )
            cell.message = str(exc)[:300]
            cell.frames = last_frames(exc)
        elif isinstance(box.get("value"), str):
            cell.note = box["value"]
        self.cells.append(cell)
        return cell

    def settle(self, within: float = 0.0) -> None:
        """Note how the hung cells ended since (``late: ...``), or that they still run."""
        for cell, thread, box, start in list(self.pending):
            thread.join(within)
            if thread.is_alive():
                cell.note = f"still running after {time.monotonic() - start:.0f}s"
                continue
            self.pending.remove((cell, thread, box, start))
            exc = box.get("exc")
            how = (
                f"{type(exc).__name__}: {str(exc)[:120]}"
                if exc is not None
                else f"returned {box.get('value')!r:.60}"
            )
            cell.note = f"late: after {time.monotonic() - start:.1f}s {how}"

    def counts(self) -> dict[str, Any]:
        by = {k: sum(c.outcome == k for c in self.cells) for k in ("ok", "typed", "untyped", "hang")}
        return {
            "faults_injected": self.faults,
            "operations": len(self.cells),
            "succeeded": by["ok"],
            "typed_errors": by["typed"],
            "untyped_errors": by["untyped"],
            "hangs": by["hang"],
            "unexpected_class": sum(
                c.outcome == "typed" and bool(c.expected) and c.expected != c.raised and not _subclass(c)
                for c in self.cells
            ),
            "leaks": self.leaks,
            "seconds": round((self.finished or time.monotonic()) - self.started, 1),
        }

    def write(self) -> None:
        REPORT.write_text(
            json.dumps(
                {
                    "counts": self.counts(),
                    "recoveries": self.recoveries,
                    "left_by_fault": self.left_by_fault,
                    "cells": [asdict(c) for c in self.cells],
                },
                indent=1,
            )
        )


def _subclass(cell: Cell) -> bool:
    import agentnest.errors as errors

    raised, expected = getattr(errors, cell.raised, None), getattr(errors, cell.expected, None)
    return isinstance(raised, type) and isinstance(expected, type) and issubclass(raised, expected)


def last_frames(exc: BaseException, n: int = 4) -> list[str]:
    """The innermost ``n`` frames of ``exc``'s traceback (and of its cause/context, innermost first)."""
    frames = traceback.extract_tb(exc.__traceback__)
    out = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames if "/agentnest/" in f.filename]
    return out[-n:]


def sys_frames(thread: threading.Thread, n: int = 4) -> list[str]:
    """Where a hung thread waits: its innermost frame, after the innermost ``n`` of the library."""
    import sys

    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return []
    stack = traceback.extract_stack(frame)
    ours = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack if "/agentnest/" in f.filename]
    last = stack[-1]
    return [*ours[-n:], f"{Path(last.filename).name}:{last.lineno} {last.name}"]


_CELLS = Cells()


@pytest.fixture(scope="session")
def cells() -> Cells:
    return _CELLS


@dataclass
class Private:
    engine: PrivateEngine
    proxy: BlackholeProxy
    seen: set[str] = field(default_factory=set)  # every agentnest sandbox id the engine ran

    def backend(self, oci_runtime: str = "runc") -> Any:
        """A fresh Docker backend on the proxy (a new process would have one: no pooled connection)."""
        from agentnest.runtime.docker.backend import DockerBackend
        from agentnest.runtime.docker.spec import DockerSpec

        spec = DockerSpec(
            docker_host=self.proxy.docker_host, oci_runtime=oci_runtime, api_timeout=API_TIMEOUT
        )
        return DockerBackend(spec)

    def note_sandboxes(self) -> None:
        for c in self.engine.containers(label="agentnest.managed=true"):
            sid = (c.get("Labels") or {}).get("agentnest.sandbox")
            if sid:
                self.seen.add(sid)


# The package: the private engine stops right after these tests, not at the end of `make test`.
@pytest.fixture(scope="package")
def private() -> Iterator[Private]:
    if os.geteuid() != 0:
        if REQUIRE_ENGINE:
            pytest.fail("the fault suite starts a private dockerd: it needs root")
        pytest.skip("the fault suite starts a private dockerd: it needs root")
    from agentnest.runtime.docker import base_image

    engine = PrivateEngine()
    proxy = BlackholeProxy(engine.socket)
    _CELLS.started = time.monotonic()
    try:
        engine.start()
        engine.load_image(base_image())
        proxy.start()
        yield Private(engine, proxy)
    finally:
        proxy.close()
        engine.close()
        # Connections the faults cut short (docker-py does not close the socket of
        # a failed request) are collected here, not in whichever test runs next.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        left = leftovers()
        _CELLS.finished = time.monotonic()
        _CELLS.leaks["processes_after_close"] = left
        assert left == [], f"the private engine left processes: {left}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _CELLS.cells:
        return
    _CELLS.write()
    tr = terminalreporter
    tr.section("fault matrix")
    for c in _CELLS.cells:
        what = f"{c.raised} {c.note}".strip()
        tr.write_line(f"{c.fault:18} {c.op:16} {c.outcome:8} {c.seconds:6.2f}s {what[:60]}")
    tr.write_line(json.dumps(_CELLS.counts()))
    tr.write_line(f"report: {REPORT}")
