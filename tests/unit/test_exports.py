"""The public surface: ``agentnest.__all__`` and what ``import agentnest`` loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import agentnest
import agentnest.errors
import agentnest.exceptions

#: Optional dependencies (extras) and the engine SDK: importing agentnest loads none of them.
HEAVY = ("docker", "fastapi", "mcp", "kubernetes", "yaml", "uvicorn", "httpx", "pydantic", "opentelemetry")


def test_all_is_sorted_and_unique() -> None:
    assert agentnest.__all__ == sorted(agentnest.__all__)
    assert len(set(agentnest.__all__)) == len(agentnest.__all__)


def test_every_exported_name_exists() -> None:
    for name in agentnest.__all__:
        assert getattr(agentnest, name, None) is not None, name


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from agentnest import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(agentnest.__all__)


def test_public_classes_claim_the_public_module_or_a_submodule() -> None:
    for name in agentnest.__all__:
        obj = getattr(agentnest, name)
        module = getattr(obj, "__module__", "agentnest")
        assert module.startswith("agentnest"), (name, module)


def test_version_is_a_string() -> None:
    assert isinstance(agentnest.__version__, str)
    assert agentnest.__version__


def test_errors_are_exported_and_aliased() -> None:
    for name in agentnest.errors.__all__:
        assert getattr(agentnest, name) is getattr(agentnest.errors, name), name
        assert getattr(agentnest.exceptions, name) is getattr(agentnest.errors, name), name
    assert vars(agentnest.exceptions)["__all__"] == agentnest.errors.__all__


def test_import_loads_no_optional_dependency() -> None:
    code = (
        "import json, sys\n"
        "import agentnest\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    root = Path(agentnest.__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
