"""The sync and async faces stay twins: same public names, same parameters.

A method added to ``Sandbox`` (or ``SandboxPool``) without its async twin
fails here, which is the point.  Return annotations may differ (an awaited
result, an async iterator); everything else about the parameters must not.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from agentnest import (
    AsyncExecutionStream,
    AsyncSandbox,
    AsyncSandboxPool,
    ExecutionStream,
    PythonSession,
    Sandbox,
    SandboxPool,
    ops,
)
from agentnest.aio import AsyncPythonSession

#: Names only the async face has, on purpose.
ASYNC_ONLY = {
    AsyncSandbox: {"create", "aclose"},
    AsyncSandboxPool: {"aclose"},
}


def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def params(fn: Any) -> list[tuple[str, Any, Any, Any]]:
    """Name, kind, default and annotation of every parameter but self/cls."""
    found = [(p.name, p.kind, p.default, p.annotation) for p in inspect.signature(fn).parameters.values()]
    return found[1:] if found and found[0][0] in ("self", "cls") else found


def kind(cls: type, name: str) -> str:
    attr = inspect.getattr_static(cls, name)
    if isinstance(attr, property):
        return "property"
    if isinstance(attr, classmethod):
        return "classmethod"
    if isinstance(attr, staticmethod):
        return "staticmethod"
    return "method" if callable(attr) else "attribute"


def is_async(cls: type, name: str) -> bool:
    """Awaited: a coroutine function (an async context manager counts, as ``acquire``)."""
    fn = inspect.unwrap(getattr(cls, name))
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


PAIRS = [(Sandbox, AsyncSandbox), (SandboxPool, AsyncSandboxPool), (PythonSession, AsyncPythonSession)]
#: Methods that return something to iterate (``async for``) rather than to await.
ITERATORS = {"stream_exec", "stream_shell", "stream_python", "stream"}


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=lambda c: c.__name__)
def test_every_public_name_has_an_async_twin(sync: type, aio: type) -> None:
    missing = public_names(sync) - public_names(aio)
    assert not missing, f"{aio.__name__} lacks twins of {sorted(missing)}"


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=lambda c: c.__name__)
def test_async_only_names_are_deliberate(sync: type, aio: type) -> None:
    assert public_names(aio) - public_names(sync) == ASYNC_ONLY.get(aio, set())


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=lambda c: c.__name__)
def test_twins_have_the_same_kind_and_parameters(sync: type, aio: type) -> None:
    for name in sorted(public_names(sync)):
        assert kind(aio, name) == kind(sync, name), name
        if kind(sync, name) == "property":
            continue
        assert params(getattr(aio, name)) == params(getattr(sync, name)), name


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=lambda c: c.__name__)
def test_methods_are_awaited_except_iterators(sync: type, aio: type) -> None:
    """Every method is a coroutine function, but those whose result is iterated with ``async for``."""
    for name in sorted(public_names(sync)):
        if kind(sync, name) not in ("method", "classmethod"):
            continue
        if name in ("create", "from_snapshot", "from_checkpoint"):
            continue  # awaitable async context managers, checked below
        assert is_async(aio, name) == (name not in ITERATORS), name
        if name in ITERATORS:
            returned = str(inspect.signature(getattr(aio, name)).return_annotation)
            assert returned.startswith("Async"), (name, returned)


def test_create_takes_exactly_the_arguments_of_sandbox() -> None:
    assert params(AsyncSandbox.create) == params(Sandbox.__init__)
    creation = AsyncSandbox.create()  # nothing happens until it is awaited
    assert hasattr(creation, "__await__") and hasattr(creation, "__aenter__")


def test_from_checkpoint_is_an_awaitable_context_manager_like_create() -> None:
    creation = AsyncSandbox.from_checkpoint("0123456789ab")  # nothing happens until it is awaited
    assert hasattr(creation, "__await__") and hasattr(creation, "__aenter__")


def test_aliases_match() -> None:
    assert Sandbox.close is Sandbox.destroy
    assert AsyncSandbox.close is AsyncSandbox.destroy
    assert AsyncSandbox.aclose is AsyncSandbox.destroy
    assert AsyncSandboxPool.aclose is AsyncSandboxPool.close


def test_async_stream_mirrors_the_sync_stream() -> None:
    assert hasattr(AsyncExecutionStream, "__aiter__")
    assert hasattr(AsyncExecutionStream, "__aenter__")
    assert public_names(ExecutionStream) - public_names(AsyncExecutionStream) == set()
    assert is_async(AsyncExecutionStream, "close")


@pytest.mark.parametrize(("sync", "aio"), PAIRS, ids=lambda c: c.__name__)
def test_async_docstrings_point_at_the_sync_face(sync: type, aio: type) -> None:
    """Documentation is written once, on the sync face (STYLE pattern 8)."""
    for name in sorted(public_names(sync)):
        if getattr(sync, name) is getattr(sync, "destroy", None) and name != "destroy":
            continue  # an alias
        doc = inspect.getdoc(getattr(aio, name)) or ""
        assert f"{sync.__name__}.{name}" in doc, name


#: Each face method and the ``ops`` function that shapes its request.
SHAPERS: dict[str, Callable[..., Any]] = {
    "exec": ops.exec_,
    "exec_shell": ops.exec_shell,
    "exec_python": ops.exec_python,
    "exec_json": ops.exec_json,
    "stream_exec": ops.exec_,
    "stream_shell": ops.stream_shell,
    "stream_python": ops.stream_python,
}


@pytest.mark.parametrize("name", sorted(SHAPERS))
def test_shapers_take_the_face_parameters_in_order(name: str) -> None:
    # Sandbox passes its arguments to ops positionally: after the subject (argv, script or code),
    # the same names in the same order.
    face = [p[0] for p in params(getattr(Sandbox, name))]
    shaper = list(inspect.signature(SHAPERS[name]).parameters)
    assert shaper[1 : len(face)] == face[1:], name
