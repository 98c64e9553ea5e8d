"""The escape suite: real escape and abuse attempts, on runc and on gVisor.

Every test here is one attempt.  Its module (one per category) carries
``pytest.mark.attempt(CATEGORY)``; a test may override it.  Every test is
also marked ``escapes`` (``make escapes`` runs just these), and at the end of
the run the terminal summary counts attempts and blocked attempts (= passed
tests) per runtime and category.  A known hole is an ``xfail(strict=True)``
test: it counts as an attempt that was *not* blocked.  A hole that opens only
sometimes (the gVisor fork bomb) calls ``pytest.xfail`` when it does.

Fixtures: the module-scoped ``backend_name`` (runc and runsc, with the
``docker``/``gvisor`` markers) and ``shared_sandbox`` (one sandbox per runtime
and module, for attempts that leave no trace) come from the integration
suite's conftest, so both suites parametrise the same way; ``docker_client``
from tests/conftest.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from integration.conftest import backend_name, shared_sandbox

__all__ = ["backend_name", "shared_sandbox"]

CATEGORIES = ("privileges", "kernel", "files", "network", "resources", "secrets", "host_api")
RUNTIMES = {"docker": "runc", "gvisor": "runsc"}
HERE = Path(__file__).parent

#: nodeid -> (runtime, category) of every collected attempt.
_ATTEMPTS: dict[str, tuple[str, str]] = {}
#: nodeid -> outcome of every attempt that ran: blocked, hole, failed or skipped.
_RESULTS: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "attempt(category): an escape-suite attempt and its category, one of " + ", ".join(CATEGORIES),
    )


@pytest.hookimpl(tryfirst=True)  # before -m escapes deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE not in item.path.parents:
            continue
        item.add_marker(pytest.mark.escapes)
        marker = item.get_closest_marker("attempt")
        if marker is None or marker.args[0] not in CATEGORIES:
            raise pytest.UsageError(f"{item.nodeid}: an escape attempt needs @pytest.mark.attempt(CATEGORY)")
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("backend_name") if callspec is not None else None
        if backend not in RUNTIMES:
            raise pytest.UsageError(f"{item.nodeid}: an escape attempt must run per runtime (backend_name)")
        _ATTEMPTS[item.nodeid] = (RUNTIMES[backend], marker.args[0])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid not in _ATTEMPTS:
        return
    outcome = None
    if hasattr(report, "wasxfail"):
        outcome = "hole" if report.skipped else ("blocked" if report.passed else None)
    elif report.when == "call":
        outcome = {"passed": "blocked", "failed": "failed", "skipped": "skipped"}[report.outcome]
    elif report.outcome == "failed":  # setup or teardown error
        outcome = "failed"
    elif report.when == "setup" and report.skipped:
        outcome = "skipped"
    # One outcome per attempt; an error in teardown still makes it a failure.
    if outcome is not None and _RESULTS.get(report.nodeid) != "failed":
        _RESULTS[report.nodeid] = outcome


_OUTCOME_NAMES = ("blocked", "hole", "failed", "skipped")


def _row(runtime: str, category: str, counts: Counter[str] | dict[str, int]) -> str:
    cells = [sum(counts.values()), *(counts[o] for o in _OUTCOME_NAMES)]
    return f"{runtime:<8} {category:<11}" + "".join(f"{c:>9}" for c in cells)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not _RESULTS:
        return
    outcomes = Counter((*_ATTEMPTS[nodeid], outcome) for nodeid, outcome in _RESULTS.items())
    tr = terminalreporter
    tr.write_sep("=", "escape suite: attempts and blocked attempts per runtime")
    headers = ("attempts", "blocked", "holes", "failed", "skipped")
    tr.write_line(f"{'runtime':<8} {'category':<11}" + "".join(f"{h:>9}" for h in headers))
    for runtime in RUNTIMES.values():
        totals = Counter[str]()
        for category in CATEGORIES:
            row = {o: outcomes[(runtime, category, o)] for o in _OUTCOME_NAMES}
            if sum(row.values()):
                totals.update(row)
                tr.write_line(_row(runtime, category, row))
        if totals:
            tr.write_line(_row(runtime, "TOTAL", totals), bold=True)
    tr.write_line(
        "blocked = the attempt failed as it should; hole = a known, reported attempt that succeeds "
        "(an xfail, see docs/security.md)"
    )
