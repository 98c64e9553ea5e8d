"""``tests/e2b/sdks.py``: the cached SDK venvs (no engine, no package index)."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest

from agentnest.errors import ConfigurationError, MissingDependencyError

from . import sdks as e2bsdk


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTNEST_E2B_SDK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_venv(where: Path, requirements: list[str]) -> Path:
    (where / "bin").mkdir(parents=True)
    (where / "bin" / "python").symlink_to(sys.executable)
    (where / e2bsdk.STAMP).write_text(json.dumps({"requirements": requirements, "installed": {"e2b": "0"}}))
    return where / "bin" / "python"


def test_the_matrix_pins_every_requirement() -> None:
    assert e2bsdk.NEWEST in e2bsdk.MATRIX
    for requirements in e2bsdk.MATRIX.values():
        assert all("==" in r for r in requirements), requirements
    assert any(r.startswith("smolagents==") for r in e2bsdk.MATRIX[e2bsdk.NEWEST])


def test_cache_root_follows_the_environment(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert e2bsdk.cache_root() == cache
    monkeypatch.delenv("AGENTNEST_E2B_SDK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert e2bsdk.cache_root() == Path("/x/agentnest/e2b-sdk")


def test_bad_names_and_requirements_are_configuration_errors(cache: Path) -> None:
    for name in ("", ".hidden", "a/b", "a b"):
        with pytest.raises(ConfigurationError, match="name"):
            e2bsdk.sdk_venv(name, ["e2b"])
    for requirements in ([], [""], ["--index-url=http://x"]):
        with pytest.raises(ConfigurationError, match="requirements"):
            e2bsdk.sdk_venv("ok", requirements)
    assert not (cache / "ok").exists()


def test_a_finished_venv_is_reused_as_it_is(cache: Path) -> None:
    # The requirement could not be installed: a build would fail, so none was tried.
    python = fake_venv(cache / "set", ["./no-such-project"])
    assert e2bsdk.sdk_venv("set", ["./no-such-project"]) == python
    assert e2bsdk.stamp(cache / "set")["installed"] == {"e2b": "0"}


def test_a_failed_install_leaves_nothing_and_keeps_the_old_venv(cache: Path) -> None:
    old = fake_venv(cache / "set", ["e2b==0.0.1"])
    with pytest.raises(MissingDependencyError, match="no-such-project") as caught:
        e2bsdk.sdk_venv("set", ["./no-such-project"])  # another list: rebuilt, and pip fails
    assert "could not install" in str(caught.value)
    assert old.exists() and e2bsdk.stamp(cache / "set")["requirements"] == ["e2b==0.0.1"]
    assert sorted(p.name for p in cache.iterdir()) == [".set.lock", "set"]  # no half-built venv


def test_a_half_built_venv_is_not_used(cache: Path) -> None:
    (cache / "set" / "bin").mkdir(parents=True)  # no stamp: a build that died
    with pytest.raises(MissingDependencyError):
        e2bsdk.sdk_venv("set", ["./no-such-project"])


def test_latest_is_named_for_the_day_and_old_ones_are_pruned(cache: Path) -> None:
    ((name, requirements),) = e2bsdk.latest_matrix(datetime.date(2026, 12, 1)).items()
    assert name == "latest-2026-12-01"
    assert requirements[:2] == ("e2b", "e2b-code-interpreter")
    fake_venv(cache / "latest-2026-11-30", list(requirements))
    fake_venv(cache / name, list(requirements))
    gone = e2bsdk.prune(keep=[name])
    assert [p.name for p in gone] == ["latest-2026-11-30"]
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [name]


def test_unsupported_reason_names_the_python_it_needs() -> None:
    if sys.version_info >= e2bsdk.MIN_PYTHON:
        assert e2bsdk.unsupported_reason() is None
    else:
        assert "3.11" in str(e2bsdk.unsupported_reason())
