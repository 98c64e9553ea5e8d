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

On the Kubernetes backend (opt-in): ``AGENTNEST_ESCAPES_ON=kubernetes-double``
runs every attempt through the cluster double (pods as containers of the
local engine: runc, and runsc for ``runtimeClassName: gvisor``);
``AGENTNEST_ESCAPES_ON=kubernetes`` with ``AGENTNEST_K8S_TESTS=1`` runs them on
a real cluster (``AGENTNEST_K8S_NAMESPACE``, ``AGENTNEST_K8S_CONTEXT``,
``AGENTNEST_IMAGE``: an image the nodes can pull; "runc" is then the
cluster's default runtime, "runsc" the ``gvisor`` RuntimeClass).  The names
``docker`` and ``gvisor`` then stand for those backends; the attempts that
inspect Docker containers from the host (``docker_client``) are skipped.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import backend_name, shared_sandbox

__all__ = ["backend_name", "shared_sandbox"]

CATEGORIES = ("privileges", "kernel", "files", "network", "resources", "secrets", "host_api")
RUNTIMES = {"docker": "runc", "gvisor": "runsc"}
HERE = Path(__file__).parent
#: ``kubernetes-double`` or ``kubernetes`` (a real cluster): where the attempts run instead of Docker.
ON = os.environ.get("AGENTNEST_ESCAPES_ON", "")
if ON not in ("", "kubernetes-double", "kubernetes"):
    raise pytest.UsageError(f"AGENTNEST_ESCAPES_ON={ON!r}: use kubernetes-double or kubernetes")

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
        if ON and "docker_client" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.skip(reason=f"inspects Docker containers from the host: not on {ON}"))


@pytest.fixture(scope="session", autouse=True)
def _kubernetes_backends() -> Iterator[None]:
    """With ``AGENTNEST_ESCAPES_ON``, the backend names the attempts use stand for Kubernetes ones."""
    if not ON:
        yield
        return
    from agentnest.runtime import registry
    from agentnest.runtime.kubernetes import KubernetesBackend, KubernetesSpec

    closers: list[Any] = []
    if ON == "kubernetes-double":
        from doubles.kube.apiserver import FakeKubeAPI
        from doubles.kube.cluster import ClusterState
        from doubles.kube.node import DockerNode

        node = DockerNode()
        state = ClusterState(node=node)
        state.add_namespace("agentnest", {"pod-security.kubernetes.io/enforce": "restricted"})
        state.add_runtime_class("gvisor", "runsc")
        api = FakeKubeAPI(cluster=state).start()
        closers += [node.close, api.stop]
        base = KubernetesSpec(namespace="agentnest", kubeconfig=str(api.write_kubeconfig()))
    else:
        if os.environ.get("AGENTNEST_K8S_TESTS") != "1":
            pytest.exit("AGENTNEST_ESCAPES_ON=kubernetes needs AGENTNEST_K8S_TESTS=1 and a cluster", 4)
        base = KubernetesSpec(
            namespace=os.environ.get("AGENTNEST_K8S_NAMESPACE", "agentnest"),
            context=os.environ.get("AGENTNEST_K8S_CONTEXT") or None,
        )
    import dataclasses

    saved = dict(registry._shared)
    for name, runtime_class in (("docker", None), ("gvisor", "gvisor")):
        backend = KubernetesBackend(dataclasses.replace(base, runtime_class_name=runtime_class))
        registry._shared[name] = backend
        closers.insert(0, backend.close)
    try:
        yield
    finally:
        registry._shared.clear()
        registry._shared.update(saved)
        for close in closers:
            close()


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
