"""The one error tree (errors.py)."""

from __future__ import annotations

import pytest

from agentnest import errors
from agentnest.config import ExecutionResult


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_derives_from_the_root(name: str) -> None:
    assert issubclass(getattr(errors, name), errors.AgentNestError)


def test_the_root_is_the_only_root() -> None:
    assert errors.AgentNestError.__bases__ == (Exception,)


@pytest.mark.parametrize(
    ("cls", "also"),
    [
        (errors.ConfigurationError, ValueError),
        (errors.MissingDependencyError, ImportError),
        (errors.ExecutionTimeoutError, TimeoutError),
        (errors.ExecutionTimeoutError, errors.ExecutionError),
        (errors.RuntimeNotAvailableError, errors.BackendError),
        (errors.ImageNotFoundError, errors.BackendError),
    ],
)
def test_documented_second_parents(cls: type[Exception], also: type[Exception]) -> None:
    assert issubclass(cls, also)


def test_policy_denied_is_not_a_value_error() -> None:
    assert not issubclass(errors.PolicyDeniedError, ValueError)


def test_errors_carry_their_subject() -> None:
    result = ExecutionResult("false", 1, "", "boom", 0.1)  # 0.3.0's positional order
    assert errors.ExecutionError("failed", result).result is result
    assert errors.ExecutionTimeoutError("slow", result).result is result
    denied = errors.PolicyDeniedError("no", request={"kind": "exec"})
    assert denied.request == {"kind": "exec"}
    refused = errors.FileAccessError("nope", path="a/b", code="symlink")
    assert (refused.path, refused.code, str(refused)) == ("a/b", "symlink", "nope")
    assert errors.FileAccessError("x").code == "io"
