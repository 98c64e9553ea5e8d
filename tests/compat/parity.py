"""Compare two surfaces from ``surface.py``: what 0.3.0 accepts that ours would refuse.

Pure: takes the two JSON descriptions and returns a list of :class:`Break`.  A
break is anything that makes a call 0.3.0 accepted fail, or mean something
else, on ours:

* a public name, method, property, field or enum member gone;
* a positional parameter moved or turned keyword-only, a keyword renamed
  (an alias of the old name, keyword-only, counts as kept), ``*args`` or
  ``**kwargs`` gone, a parameter that had a default now required, a new
  required parameter;
* a function turned into a coroutine (or back);
* a builtin exception base gone (``except ValueError`` must still catch it) or
  an agentnest base gone (``except AgentNestError`` likewise);
* a changed default or return annotation, unless the caller lists it as a
  reviewed difference (``allowed``) with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Surface = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Break:
    """One incompatibility: ``where`` names the thing, ``what`` says how it broke."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


_POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
#: ``with``/``async with`` call these with exactly three arguments, whatever
#: the signature spells (0.3.0 wrote ``__exit__(self, *_)``): presence is the contract.
_PROTOCOL_DUNDERS = frozenset({"__exit__", "__aexit__", "__enter__", "__aenter__"})
_KEYWORD = ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")


def normalise_annotation(text: str | None) -> str | None:
    """Spell an annotation one way: no quotes, ``typing.`` prefixes or ``Optional``."""
    if text is None:
        return None
    text = text.replace("'", "").replace('"', "").replace(" ", "")
    text = re.sub(r"\btyping\.", "", text)
    text = re.sub(r"\bcollections\.abc\.", "", text)
    text = re.sub(r"\bOptional\[([^\[\]]+)\]", r"\1|None", text)
    return "|".join(sorted(text.split("|"))) if "[" not in text else text


def compare_signature(
    where: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> list[Break]:
    """Every call ``old`` accepted must bind the same way to ``new``."""
    if old is None:
        return []
    if new is None:
        return [Break(where, "signature can no longer be read")]
    breaks: list[Break] = []
    old_params = [p for p in old["params"] if p["name"] not in ("self", "cls")]
    new_params = [p for p in new["params"] if p["name"] not in ("self", "cls")]
    by_name = {p["name"]: p for p in new_params}
    new_positional = [p for p in new_params if p["kind"] in _POSITIONAL]
    has_var_args = any(p["kind"] == "VAR_POSITIONAL" for p in new_params)
    has_var_kwargs = any(p["kind"] == "VAR_KEYWORD" for p in new_params)
    position = 0
    for p in old_params:
        name, kind = p["name"], p["kind"]
        if kind == "VAR_POSITIONAL":
            if not has_var_args:
                breaks.append(Break(where, f"*{name} is gone"))
            continue
        if kind == "VAR_KEYWORD":
            if not has_var_kwargs:
                breaks.append(Break(where, f"**{name} is gone"))
            continue
        if kind in _POSITIONAL:
            if position < len(new_positional):
                theirs = new_positional[position]
                if kind == "POSITIONAL_OR_KEYWORD" and theirs["name"] != name:
                    # Only a keyword-only alias keeps ``name=`` working without
                    # moving what the old position means.
                    alias = by_name.get(name)
                    if alias is None or alias["kind"] != "KEYWORD_ONLY":
                        breaks.append(
                            Break(
                                where,
                                f"positional parameter {position} was {name!r}, now "
                                f"{theirs['name']!r}, and {name!r} is not a keyword-only alias",
                            )
                        )
                if theirs["required"] and not p["required"]:
                    breaks.append(Break(where, f"{theirs['name']!r} (was {name!r}) is now required"))
            elif not has_var_args:
                breaks.append(Break(where, f"positional parameter {position} ({name!r}) is gone"))
            position += 1
            continue
        # keyword-only in 0.3.0
        theirs = by_name.get(name)
        if theirs is None or theirs["kind"] not in _KEYWORD:
            if not has_var_kwargs:
                breaks.append(Break(where, f"keyword {name!r} is gone"))
        elif theirs["required"] and not p["required"]:
            breaks.append(Break(where, f"keyword {name!r} is now required"))
    old_names = {p["name"] for p in old_params}
    for p in new_params:
        if p["required"] and p["name"] not in old_names:
            if p["kind"] in _POSITIONAL and new_positional.index(p) < position:
                continue  # a renamed positional, reported above if it matters
            breaks.append(Break(where, f"new required parameter {p['name']!r}"))
    return breaks


def differences(where: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[Break]:
    """Defaults and return annotations that changed (reviewed, not always breaks)."""
    if old is None or new is None:
        return []
    out: list[Break] = []
    by_name = {p["name"]: p for p in new["params"]}
    for p in old["params"]:
        theirs = by_name.get(p["name"])
        if theirs is not None and p["default"] is not None and theirs["default"] != p["default"]:
            out.append(Break(f"{where}({p['name']}=)", f"default {p['default']} -> {theirs['default']}"))
    a, b = normalise_annotation(old.get("returns")), normalise_annotation(new.get("returns"))
    if a is not None and b is not None and a != b:
        out.append(Break(f"{where} ->", f"returns {old['returns']} -> {new['returns']}"))
    return out


def _compare_class(
    where: str, old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[list[Break], list[Break]]:
    breaks: list[Break] = []
    diffs: list[Break] = []
    if new.get("kind") != "class":
        if new.get("kind") == "function":
            breaks += compare_signature(where, old.get("constructor"), new.get("signature"))
            return breaks, diffs
        return [Break(where, f"was a class, now {new.get('kind')}")], diffs
    for base in old.get("builtin_bases", ()):
        if base not in new.get("builtin_bases", ()):
            breaks.append(Break(where, f"no longer a subclass of {base}"))
    for base in old.get("agentnest_bases", ()):
        if base not in new.get("agentnest_bases", ()):
            breaks.append(Break(where, f"no longer a subclass of agentnest's {base}"))
    breaks += compare_signature(f"{where}()", old.get("constructor"), new.get("constructor"))
    diffs += differences(f"{where}()", old.get("constructor"), new.get("constructor"))
    new_members = new.get("members", {})
    new_fields = set(new.get("fields", ())) | set(new_members)
    for field in old.get("fields", ()):
        if field not in new_fields:
            breaks.append(Break(f"{where}.{field}", "field is gone"))
    for member, value in old.get("enum", {}).items():
        theirs = new.get("enum", {}).get(member)
        if theirs is None:
            breaks.append(Break(f"{where}.{member}", "enum member is gone"))
        elif theirs != value:
            # The member still works (EventType.EXECUTION_STARTED); what it
            # compares equal to as a string changed: a reviewed difference.
            diffs.append(Break(f"{where}.{member}", f"value {value} -> {theirs}"))
    for name, info in old.get("members", {}).items():
        here = f"{where}.{name}"
        theirs = new_members.get(name)
        if theirs is None:
            if name not in new.get("fields", ()) and name not in old.get("fields", ()):
                breaks.append(Break(here, f"{info['kind']} is gone"))
            continue
        if name in _PROTOCOL_DUNDERS:
            continue  # called by the interpreter with a fixed shape
        b, d = _compare_member(here, info, theirs)
        breaks += b
        diffs += d
    return breaks, diffs


def _compare_member(
    here: str, old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[list[Break], list[Break]]:
    kind, theirs = old["kind"], new["kind"]
    if kind in ("property", "attribute"):
        if theirs not in ("property", "attribute"):
            return [Break(here, f"was a {kind}, now a {theirs}")], []
        if kind == "property" and theirs == "property":
            a, b = normalise_annotation(old.get("returns")), normalise_annotation(new.get("returns"))
            if a is not None and b is not None and a != b:
                return [], [Break(f"{here} ->", f"returns {old['returns']} -> {new['returns']}")]
        return [], []
    if theirs not in ("method", "classmethod", "staticmethod"):
        return [Break(here, f"was a {kind}, now a {theirs}")], []
    breaks: list[Break] = []
    if (kind != theirs and "staticmethod" in (kind, theirs)) or (
        (kind == "classmethod") != (theirs == "classmethod") and kind == "classmethod"
    ):
        breaks.append(Break(here, f"was a {kind}, now a {theirs}"))
    if _awaitable(old) != _awaitable(new):
        breaks.append(Break(here, f"was {_awaitable(old)}, now {_awaitable(new)}"))
    breaks += compare_signature(here, old.get("signature"), new.get("signature"))
    return breaks, differences(here, old.get("signature"), new.get("signature"))


def _awaitable(info: Mapping[str, Any]) -> str:
    """How a caller uses the call: ``await f()``, ``async for x in f()`` or plainly.

    An async generator function and a plain method returning an async
    iterator are used the same way (``async for``), so both read ``async for``.
    """
    kind = info.get("async")
    if kind is True or kind == "coroutine":
        return "awaited"
    if kind == "asyncgen":
        return "async for"
    returns = (info.get("signature") or {}).get("returns") or ""
    if kind == "sync" and ("AsyncIterator" in returns or "AsyncExecutionStream" in returns):
        return "async for"
    return "called"


def compare(
    old: Surface,
    new: Surface,
    forwards: Mapping[str, str] = {},
) -> tuple[list[Break], list[Break]]:
    """Return ``(breaks, differences)`` between two surfaces.

    ``forwards`` maps a 0.3.0 callable that took ``*args, **kwargs`` and passed
    them on (``AsyncSandbox.create``) to the callable it passed them to
    (``agentnest.Sandbox``): ours must accept what that one accepted.
    """
    breaks: list[Break] = []
    diffs: list[Break] = []
    seen: set[str] = set()  # a class re-exported by several modules is compared once
    for module, names in old.items():
        theirs_module = new.get(module)
        if theirs_module is None or "import_error" in theirs_module:
            breaks.append(Break(module, "module cannot be imported"))
            continue
        for name, info in names.items():
            where = f"{module}.{name}"
            theirs = theirs_module.get(name)
            if theirs is None or theirs.get("kind") == "missing":
                breaks.append(Break(where, "name is gone"))
                continue
            if info["kind"] == "class":
                origin = info.get("defined_in", where)
                if origin in seen:
                    continue
                seen.add(origin)
                b, d = _compare_class(where, info, theirs)
                skipped = {f"{f}" for f in forwards if f.startswith(f"{where}.")}
                b = [x for x in b if x.where not in skipped]
                b += _forwarded(where, info, theirs, old, forwards)
            elif info["kind"] == "function":
                if theirs["kind"] == "function":
                    b = compare_signature(where, info.get("signature"), theirs.get("signature"))
                    if _awaitable(info) != _awaitable(theirs):
                        b.append(Break(where, f"was {_awaitable(info)}, now {_awaitable(theirs)}"))
                    d = differences(where, info.get("signature"), theirs.get("signature"))
                elif theirs["kind"] == "class":
                    b = compare_signature(where, info.get("signature"), theirs.get("constructor"))
                    d = []
                else:
                    b, d = [Break(where, f"was a function, now {theirs['kind']}")], []
            else:
                b, d = [], []
            breaks += b
            diffs += d
    return breaks, diffs


def _forwarded(
    where: str, info: Mapping[str, Any], theirs: Mapping[str, Any], old: Surface, forwards: Mapping[str, str]
) -> list[Break]:
    out: list[Break] = []
    for member in info.get("members", {}):
        target = forwards.get(f"{where}.{member}")
        if target is None:
            continue
        module, _, name = target.rpartition(".")
        old_target = old[module][name]
        old_sig = old_target.get("constructor") or old_target.get("signature")
        new_member = theirs.get("members", {}).get(member, {})
        out += compare_signature(f"{where}.{member} (as {target})", old_sig, new_member.get("signature"))
    return out


def unexplained(found: Iterable[Break], allowed: Mapping[str, str]) -> list[Break]:
    """The entries of ``found`` whose ``str()`` is not a key of ``allowed``."""
    return [b for b in found if str(b) not in allowed]
