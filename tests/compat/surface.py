"""Describe agentnest's public surface as JSON (stdlib only).

Run by the 0.3.0 parity test under *either* version's interpreter:
``python surface.py`` prints what the installed ``agentnest`` offers a caller:
every public name of the modules below, the signature of every function,
constructor and method, properties, dataclass fields, enum members and the
builtin exception bases (a ``ValueError`` subclass must stay one).  Nothing is
evaluated: annotations are kept as the strings the source wrote.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import json
import sys
from typing import Any

MODULES = (
    "agentnest",
    "agentnest.integrations",
    "agentnest.integrations.langchain",
    "agentnest.integrations.smolagents",
    "agentnest.git",
    "agentnest.presets",
)

#: Plain values whose presence (not value) is part of the surface.
_CONSTANT_TYPES = (str, int, float, bool, tuple, frozenset, type(None))


def _annotation(value: Any) -> str | None:
    if value is inspect.Parameter.empty:
        return None
    if isinstance(value, str):
        return value
    return getattr(value, "__qualname__", None) or repr(value)


def _signature(fn: Any) -> dict[str, Any] | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = []
    for p in sig.parameters.values():
        params.append(
            {
                "name": p.name,
                "kind": p.kind.name,
                "default": None if p.default is p.empty else repr(p.default),
                "required": p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD),
                "annotation": _annotation(p.annotation),
            }
        )
    return {"params": params, "returns": _annotation(sig.return_annotation)}


def _member(cls: type, name: str) -> dict[str, Any] | None:
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, property):
        return {"kind": "property", "returns": _annotation(_prop_annotation(raw))}
    if isinstance(raw, (classmethod, staticmethod)):
        kind = "classmethod" if isinstance(raw, classmethod) else "staticmethod"
        return {"kind": kind, "signature": _signature(getattr(cls, name))}
    if inspect.isfunction(raw) or (inspect.ismethoddescriptor(raw) and callable(raw)):
        fn = getattr(cls, name)
        unwrapped = inspect.unwrap(fn)
        return {"kind": "method", "signature": _signature(fn), "async": _async_kind(unwrapped)}
    # A slot (dataclass(slots=True) field), a constant, an enum member...
    return {"kind": "attribute"}


def _async_kind(fn: Any) -> str:
    if inspect.isasyncgenfunction(fn):
        return "asyncgen"
    if inspect.iscoroutinefunction(fn):
        return "coroutine"
    return "sync"


def _prop_annotation(prop: property) -> Any:
    fget = prop.fget
    if fget is None:
        return inspect.Parameter.empty
    return getattr(fget, "__annotations__", {}).get("return", inspect.Parameter.empty)


def _inherited_from_builtins(cls: type, name: str) -> bool:
    for base in cls.__mro__:
        if name in vars(base):
            return base.__module__ == "builtins" or not base.__module__.startswith("agentnest")
    return True


def _describe_class(cls: type) -> dict[str, Any]:
    info: dict[str, Any] = {
        "kind": "class",
        "defined_in": f"{cls.__module__}.{cls.__qualname__}",
        "bases": [f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:]],
        "builtin_bases": sorted(
            b.__qualname__ for b in cls.__mro__[1:] if b.__module__ == "builtins" and b is not object
        ),
        "agentnest_bases": sorted(
            b.__qualname__ for b in cls.__mro__[1:] if b.__module__.startswith("agentnest")
        ),
        "constructor": _signature(cls),
        "members": {},
    }
    if dataclasses.is_dataclass(cls):
        info["fields"] = [f.name for f in dataclasses.fields(cls)]
    if issubclass(cls, enum.Enum):
        # __members__ holds aliases too (EventType.CREATED is SANDBOX_CREATED).
        info["enum"] = {name: repr(m.value) for name, m in cls.__members__.items()}
    for name in dir(cls):
        if name.startswith("_") and name not in (
            "__enter__",
            "__exit__",
            "__iter__",
            "__aenter__",
            "__aexit__",
            "__aiter__",
            "__call__",
            "__len__",
            "__contains__",
        ):
            continue
        if _inherited_from_builtins(cls, name):
            continue
        if issubclass(cls, enum.Enum) and name in info.get("enum", {}):
            continue
        member = _member(cls, name)
        if member is not None:
            info["members"][name] = member
    return info


def _public_names(module: Any) -> list[str]:
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return sorted(declared)
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        origin = getattr(value, "__module__", None)
        if (inspect.isclass(value) or inspect.isfunction(value)) and not str(origin).startswith("agentnest"):
            continue  # imported helpers (Any, dataclass, ...)
        if not (inspect.isclass(value) or callable(value) or isinstance(value, _CONSTANT_TYPES)):
            continue
        names.append(name)
    return sorted(names)


def describe(module_name: str) -> dict[str, Any]:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return {"import_error": str(exc)}
    out: dict[str, Any] = {}
    for name in _public_names(module):
        if not hasattr(module, name):
            out[name] = {"kind": "missing"}
            continue
        value = getattr(module, name)
        if inspect.isclass(value):
            out[name] = _describe_class(value)
        elif callable(value):
            unwrapped = inspect.unwrap(value)
            out[name] = {
                "kind": "function",
                "signature": _signature(value),
                "async": _async_kind(unwrapped),
            }
        else:
            out[name] = {"kind": "constant", "type": type(value).__name__}
    return out


def main() -> int:
    modules = sys.argv[1:] or list(MODULES)
    json.dump({name: describe(name) for name in modules}, sys.stdout, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
