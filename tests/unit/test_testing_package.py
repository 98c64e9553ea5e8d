"""What ``agentnest.testing`` may hold: doubles of AgentNest's own contract only (house rule, issue 32).

The wheel ships all of ``agentnest/`` (pyproject.toml, ``[tool.hatch.build.targets.wheel]``).
Doubles of other people's systems (Kubernetes, dockerd, PostgreSQL, an unsandboxed agent, the
E2B SDK venvs) live in tests/doubles and tests/e2b, and the package must never reach them: an
installed wheel has no tests/.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "agentnest"
TESTING = PACKAGE / "testing"
#: Top-level names only the test tree provides (tests/, tests/unit, tests/doubles, tests/e2b ...).
TEST_TREE = {"tests", "doubles", "conftest", "server_fakes", "e2b"}
#: Modules of the doubles of other people's systems, as they were called in the wheel.
FOREIGN_MODULES = {"kubeapi", "kubecluster", "kubenode", "engine", "dockerd", "postgres", "process", "e2bsdk"}
#: Their classes: none may be defined anywhere in the wheel.
FOREIGN_CLASSES = {
    "FakeKubeAPI",
    "ClusterState",
    "DockerNode",
    "NullNode",
    "LocalPod",
    "DockerPod",
    "PrivateEngine",
    "BlackholeProxy",
    "PostgresServer",
    "LocalAgent",
    "LocalBackend",
}
#: Issue 32: the shipped test helpers stay small.
MAX_LINES = 600


def imported(path: Path) -> set[str]:
    """The top-level names a module imports (relative imports stay in the package: skipped)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_agentnest_testing_imports_nothing_from_the_test_tree() -> None:
    for path in sorted(TESTING.glob("*.py")):
        names = imported(path)
        assert not names & TEST_TREE, f"{path.relative_to(REPO)} imports {sorted(names & TEST_TREE)}"
        assert "aiohttp" not in names, f"{path.relative_to(REPO)} needs a dev-only dependency"


def test_the_wheel_holds_no_double_of_someone_elses_system() -> None:
    for path in sorted(TESTING.glob("*.py")):
        assert path.stem not in FOREIGN_MODULES, f"{path.relative_to(REPO)} belongs in tests/doubles"
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"), str(path))
        classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        foreign = sorted(classes & FOREIGN_CLASSES)
        assert not foreign, f"{path.relative_to(REPO)} defines {foreign}: it belongs in tests/doubles"


def test_agentnest_testing_stays_small() -> None:
    lines = sum(len(path.read_text("utf-8").splitlines()) for path in TESTING.glob("*.py"))
    assert lines <= MAX_LINES, f"agentnest/testing has {lines} lines (at most {MAX_LINES})"
