"""agentnest 0.3.0's own examples/*.py, unchanged, run against ours.

Each example runs as a script with this interpreter (ours installed) in an
empty working directory, with ``python:3.12-slim`` mapped to our base image
(``AGENTNEST_IMAGE_ALIASES``); it must exit 0 and print what it prints under
0.3.0.  The examples are the released files (see conftest.py: the sdist is
checked against its published hash).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

SECRET = "never-log-me"  # advanced_security.py's Secret: it must show up nowhere

#: Each example's exact standard output under 0.3.0 (read from the example).
EXPECTED: dict[str, str] = {
    # Its exec_python prints the file's contents; then the shell's file is read back.
    "basic.py": "Hello, AgentNest!\nfinished\n",
    # The sandbox upper-cases the uploaded file; the example prints the downloaded one.
    "upload_download.py": "A TEMPORARY EXAMPLE\n",
    # Prints nothing itself ("policy active" is the sandbox's, checked by .check()); its
    # JsonLogObserver is audit, not output.
    "advanced_security.py": "",
    # Three lines as they arrive, then the final status chunk's exit code.
    "async_streaming.py": "stream:1\nstream:2\nstream:3\nexit=0\n",
    # sum(n * n for n in range(5)), through the LangChain tool.
    "langchain_tool.py": "30\n",
    # The sieve prints nothing; the second action prints the primes above `threshold`.
    "smolagents_executor.py": (
        "first action output: (no output)\nsecond action output: [11, 13, 17, 19]\nfinal answer? False\n"
    ),
}

#: Examples that cannot run on any machine `make test` runs on, with the reason.
SKIPPED: dict[str, str] = {
    "install_packages.py": (
        "needs the internet: `pip install requests` from PyPI inside a network_enabled sandbox "
        "(and pip in the image, which python:3.12-slim has and our base image does not)"
    ),
}

#: Run against the Kubernetes cluster double (tests/doubles/kube): each prints its pod's host name.
THROUGH_CLUSTER_DOUBLE: dict[str, str] = {"kubernetes.py": r"agentnest-[0-9a-f]{12}\n"}


def test_every_example_is_run_or_skipped_with_a_reason(sdist_030: Path) -> None:
    found = {p.name for p in (sdist_030 / "examples").glob("*.py")}
    assert found == set(EXPECTED) | set(SKIPPED) | set(THROUGH_CLUSTER_DOUBLE)


@pytest.mark.parametrize("name", sorted(EXPECTED) + sorted(SKIPPED))
def test_example_runs_unchanged(name: str, sdist_030: Path, env_030: dict[str, str], tmp_path: Path) -> None:
    if name in SKIPPED:
        pytest.skip(f"examples/{name}: {SKIPPED[name]}")
    env = dict(env_030)
    # Our JsonLogObserver() writes a file: into this test's directory, not the user's state dir.
    env["AGENTNEST_AUDIT_LOG"] = str(tmp_path / "audit.jsonl")
    work = tmp_path / "cwd"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, str(sdist_030 / "examples" / name)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    report = (
        f"examples/{name} exited {proc.returncode}\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    assert proc.returncode == 0, report
    assert proc.stdout == EXPECTED[name], report
    leaked = [
        str(p) for p in tmp_path.rglob("*") if p.is_file() and SECRET in p.read_text("utf-8", "replace")
    ]
    assert SECRET not in proc.stdout + proc.stderr, report
    assert not leaked, f"the Secret's value was written to {leaked}"


@pytest.mark.gvisor  # the example asks for the default RuntimeClass, gvisor: runsc on the double's node
def test_the_kubernetes_example_runs_unchanged_on_the_cluster_double(
    sdist_030: Path, env_030: dict[str, str], tmp_path: Path
) -> None:
    pytest.importorskip("kubernetes")
    pytest.importorskip("aiohttp")
    from doubles.kube.apiserver import FakeKubeAPI
    from doubles.kube.cluster import ClusterState
    from doubles.kube.node import DockerNode

    from agentnest.runtime.docker import base_image

    # The node has the example's image (as a node with a registry mirror would).
    state = ClusterState(node=DockerNode(images={"python:3.12-slim": base_image()}))
    state.add_namespace("agentnest", {"pod-security.kubernetes.io/enforce": "restricted"})
    state.add_runtime_class("gvisor", "runsc")
    try:
        with FakeKubeAPI(cluster=state) as api:
            env = {**env_030, "KUBECONFIG": str(api.write_kubeconfig())}
            work = tmp_path / "cwd"
            work.mkdir()
            # Run as its own script from its directory, the file would shadow the
            # `kubernetes` package (0.3.0's backend imports it too): run it from
            # the working directory instead, unchanged.
            script = str(sdist_030 / "examples" / "kubernetes.py")
            proc = subprocess.run(
                [sys.executable, "-c", f"import runpy; runpy.run_path({script!r}, run_name='__main__')"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert proc.returncode == 0, proc.stderr[-4000:]
            assert re.fullmatch(THROUGH_CLUSTER_DOUBLE["kubernetes.py"], proc.stdout), proc.stdout
            pods = [path for method, path in state.calls if method == "POST" and path.endswith("/pods")]
            assert len(pods) == 1
            assert state.list("pods", "agentnest") == []  # the with block deleted it
    finally:
        state.node.close()
