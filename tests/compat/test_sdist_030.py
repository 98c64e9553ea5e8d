"""agentnest 0.3.0's own Docker integration tests (tests/test_*integration*.py), run against ours.

pytest runs the released test files (see conftest.py) in a subprocess with
this interpreter, as 0.3.0's CI would: rootdir and config are the unpacked
sdist (its ``integration`` marker, ``--strict-markers``), the switch its
tests read (``AGENTNEST_DOCKER_TESTS=1``) is set, ``python:3.12-slim`` is
mapped to our base image, and its ``agentnest/`` package is not there, so
``import agentnest`` is ours.  One run per session; each of its tests is then
one test here, so a failure names the 0.3.0 test and shows its report.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

FILES = (
    "tests/test_docker_integration.py",
    "tests/test_egress_integration.py",
    "tests/test_fork_integration.py",
    "tests/test_session_integration.py",
)

#: Every test in FILES (the sdist is pinned by hash, so this list is complete).
TESTS = (
    "tests/test_docker_integration.py::test_python_files_shell_and_security_defaults",
    "tests/test_docker_integration.py::test_network_is_disabled_by_default",
    "tests/test_egress_integration.py::test_allowlisted_domain_is_reachable",
    "tests/test_egress_integration.py::test_unlisted_domain_is_blocked",
    "tests/test_egress_integration.py::test_denied_policy_has_no_network",
    "tests/test_fork_integration.py::test_fork_copies_state_then_diverges",
    "tests/test_fork_integration.py::test_fork_preserves_installed_workspace_packages",
    "tests/test_session_integration.py::test_session_persists_state_across_calls",
    "tests/test_session_integration.py::test_session_reports_errors_without_dying",
    "tests/test_session_integration.py::test_command_timeout_keeps_sandbox_alive",
)

#: Tests not run, with the reason (passed to pytest as --deselect).
DESELECTED: dict[str, str] = {
    "tests/test_egress_integration.py::test_allowlisted_domain_is_reachable": (
        "needs the internet: a verified TLS connection to the real https://pypi.org/simple/ "
        "through the egress proxy; a machine behind an intercepting proxy or a local mirror "
        "cannot pass it (tests/integration/test_egress.py points allowed names at local servers)"
    ),
    "tests/test_fork_integration.py::test_fork_preserves_installed_workspace_packages": (
        "needs the internet: `pip install --user cowsay==6.1` from PyPI in a network_enabled "
        "sandbox (and pip in the image, which python:3.12-slim has and our base image does not)"
    ),
}


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """node id -> (passed | failed | error | skipped, report) from pytest's JUnit XML."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        # classname is the dotted module path ("tests.test_fork_integration"), name the function.
        module = str(case.get("classname", "")).replace(".", "/") + ".py"
        node = f"{module}::{case.get('name')}"
        outcome, report = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = "failed" if kind == "failure" else kind
                report = f"{found.get('message', '')}\n{found.text or ''}"
                break
        out[node] = (outcome, report)
    return out


@pytest.fixture(scope="module")
def sdist_run(
    sdist_030: Path, env_030: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, tuple[str, str]], str]:
    """Run FILES once; return each test's outcome and pytest's own output."""
    env = dict(env_030)
    env["AGENTNEST_DOCKER_TESTS"] = "1"
    work = tmp_path_factory.mktemp("sdist-030-run")
    junit = work / "junit.xml"
    argv = [
        *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"),
        *("--rootdir", str(sdist_030), "-c", str(sdist_030 / "pyproject.toml")),
        *("--junitxml", str(junit), "-o", "junit_family=xunit1"),
        *(arg for node in DESELECTED for arg in ("--deselect", node)),
        *FILES,
    ]
    # cwd is the sdist root: node ids and FILES are relative to it, as in 0.3.0's own runs;
    # `python -m` puts the cwd on sys.path, which is safe because the package was not unpacked.
    proc = subprocess.run(argv, cwd=sdist_030, env=env, capture_output=True, text=True, timeout=840)
    output = f"pytest exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    assert junit.is_file(), output
    return _outcomes(junit), output


def test_ours_is_what_runs(sdist_030: Path, env_030: dict[str, str]) -> None:
    # The same interpreter, path and cwd as the run: `import agentnest` must find ours.
    proc = subprocess.run(
        [sys.executable, "-c", "import agentnest; print(agentnest.__file__)"],
        cwd=sdist_030,
        env=env_030,
        capture_output=True,
        text=True,
        check=True,
    )
    assert not Path(proc.stdout.strip()).is_relative_to(sdist_030)
    assert not (sdist_030 / "agentnest").exists()


def test_every_test_is_run_or_deselected_with_a_reason(
    sdist_run: tuple[dict[str, tuple[str, str]], str],
) -> None:
    outcomes, output = sdist_run
    assert set(DESELECTED) <= set(TESTS)
    assert set(outcomes) == set(TESTS) - set(DESELECTED), output


@pytest.mark.parametrize("node", TESTS)
def test_030_integration_test_passes(node: str, sdist_run: tuple[dict[str, tuple[str, str]], str]) -> None:
    if node in DESELECTED:
        pytest.skip(f"{node}: {DESELECTED[node]}")
    outcomes, output = sdist_run
    assert node in outcomes, f"{node} did not run\n{output}"
    outcome, report = outcomes[node]
    assert outcome == "passed", f"{node}: {outcome}\n{report}"
