"""The input rules every surface of ``agentnest serve`` shares (server/inputs.py, config.env_name_problem)."""

from __future__ import annotations

import json

import pytest

from agentnest.config import env_name_problem
from agentnest.errors import ConfigurationError
from agentnest.server.inputs import (
    check_env,
    check_metadata,
    confine,
    finite,
    is_json,
    json_safe,
    media_type,
    metadata_key_problem,
)


@pytest.mark.parametrize("name", ["A", "_x", "PATH", "a1_B2", "A" * 128])
def test_good_env_names(name: str) -> None:
    assert env_name_problem(name) is None
    check_env({name: "value"})


@pytest.mark.parametrize(
    "name", ["", "1A", "A=B", "A\x00", "A\n", "CAFÉ", "A B", "A-B", "A" * 129, "AGENTNEST_X", 5, None]
)
def test_bad_env_names(name: object) -> None:
    assert env_name_problem(name) is not None
    with pytest.raises(ConfigurationError, match="where: environment name"):
        check_env({name: "x"}, "where")


def test_env_values() -> None:
    with pytest.raises(ConfigurationError, match="without NUL"):
        check_env({"A": "x\x00"})
    with pytest.raises(ConfigurationError, match="without NUL"):
        check_env({"A": 5})


@pytest.mark.parametrize("key", ["owner", "user-id", "a.b/c:d", "k" * 256])
def test_good_metadata_keys(key: str) -> None:
    assert metadata_key_problem(key) is None
    check_metadata({key: "v"})


@pytest.mark.parametrize("key", ["", "a b", "a=b", "a&b", "k\x00", "clé", "\t", "k" * 257, 3])
def test_bad_metadata_keys(key: object) -> None:
    assert metadata_key_problem(key) is not None
    with pytest.raises(ConfigurationError, match="metadata key"):
        check_metadata({key: "v"})


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        (".", "/workspace"),
        ("a/b", "/workspace/a/b"),
        ("a/../b", "/workspace/b"),
        ("/workspace", "/workspace"),
        ("/workspace/x/", "/workspace/x"),
        ("//workspace/x", "/workspace/x"),
    ],
)
def test_confine_inside(path: str, inside: str) -> None:
    assert confine("/workspace", path) == inside


@pytest.mark.parametrize(
    "path", ["..", "../../../../", "/", "/etc", "/workspace/..", "/workspacex", "a/../../b"]
)
def test_confine_refuses_escapes(path: str) -> None:
    with pytest.raises(ConfigurationError, match="outside the workspace /workspace"):
        confine("/workspace", path)


def test_confine_names_the_path_the_client_gave() -> None:
    with pytest.raises(ConfigurationError, match=r"'\.\./\.\.'"):
        confine("/workspace", "/", shown="../..")
    with pytest.raises(ConfigurationError, match="NUL"):
        confine("/workspace", "a\x00")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), -1, 11, True, "3", None])
def test_finite_refuses(value: object) -> None:
    with pytest.raises(ConfigurationError):
        finite(value, "x", 0, 10)


def test_finite_accepts() -> None:
    assert finite(3, "x", 0, 10) == 3.0
    assert finite(10.0, "x", 0, 10) == 10.0


def test_media_types() -> None:
    assert media_type(" Application/JSON; charset=utf-8") == "application/json"
    assert media_type(None) == ""
    assert is_json("application/json") and is_json("application/problem+json") and is_json(None)
    assert not is_json(None, empty=False)
    assert not is_json("text/plain") and not is_json("application/grpc") and not is_json("text/json+x")


def test_json_safe_renders_non_finite_numbers() -> None:
    doc = {
        "input": float("nan"),
        "ctx": [float("inf"), {"le": -float("inf")}],
        "ok": 1.5,
        "obj": ValueError("x"),
    }
    safe = json_safe(doc)
    assert json.dumps(safe, allow_nan=False)
    assert safe == {"input": "nan", "ctx": ["inf", {"le": "-inf"}], "ok": 1.5, "obj": "x"}
