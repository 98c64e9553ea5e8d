"""agentnest 0.3.0's own examples/*.py, unchanged, run against ours.

Each example runs as a script with this interpreter (ours installed) in an
empty working directory, with ``python:3.12-slim`` mapped to our base image
(``AGENTNEST_IMAGE_ALIASES``); it must exit 0 and print what it prints under
0.3.0.  The examples are the released files (see conftest.py: the sdist is
checked against its published hash).
"""

from __future__ import annotations

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
    "kubernetes.py": "needs a configured Kubernetes cluster (backend='kubernetes')",
}


def test_every_example_is_run_or_skipped_with_a_reason(sdist_030: Path) -> None:
    found = {p.name for p in (sdist_030 / "examples").glob("*.py")}
    assert found == set(EXPECTED) | set(SKIPPED)


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
