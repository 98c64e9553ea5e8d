"""Named sandbox profiles from a YAML file (``agentnest.yaml``).

A profile names a set of :class:`~agentnest.Sandbox` arguments and a
:class:`~agentnest.SecurityPolicy`, so that callers write ``strict`` instead of
repeating limits and policy.  Loading validates the whole file and every error
names the file and line: ``agentnest.yaml:12: profiles.strict.memory: '12x' is
not a size; write it like '512m'``.

Reading YAML needs ``pyyaml`` (the ``profiles`` extra); it is imported only when
a file is loaded, so ``import agentnest`` never loads it.

Secrets do not belong in a profile: ``environment`` holds plain strings that end
up in files under version control.  Pass ``Secret`` values to ``Sandbox`` instead.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .approvals import APPROVAL_KINDS, ApprovalRule, RuleApprover, use_rules_loader
from .config import _freeze_env
from .errors import ConfigurationError, MissingDependencyError, ProfileError
from .limits import ResourceLimits, parse_size
from .policy import NetworkPolicy, SecurityPolicy

ENV_VAR = "AGENTNEST_PROFILE_FILE"
"""Environment variable naming the profile file."""
DEFAULT_FILE = "agentnest.yaml"
"""File name looked for in the working directory."""

_PROFILE_KEYS = (
    "allowed_images",
    "approval_timeout",
    "approvals",
    "backend",
    "cpus",
    "environment",
    "extends",
    "image",
    "max_cpus",
    "max_file_bytes",
    "max_memory",
    "max_output_bytes",
    "max_pids",
    "max_timeout",
    "memory",
    "network",
    "pids",
    "read_only_root",
    "require_image_digest",
    "required_runtime",
    "scratch_size",
    "timeout",
    "verify",
    "workspace",
    "workspace_size",
)
_TOP_KEYS = ("default", "profiles")
_RULE_KEYS = ("action", "kind", "match")
_RULES_FILE_KEYS = ("default", "rules")
_ALLOWLIST_KEYS = ("cidrs", "domains", "ports")


def find_profile_file(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """Find the profile file.

    The order is: ``explicit`` if given (it must exist), else the file named by
    ``$AGENTNEST_PROFILE_FILE`` if set and non-empty (it must exist), else
    ``./agentnest.yaml`` in the working directory if it exists, else None.

    Args:
        explicit: a path given by the caller (``--profile-file``).

    Returns:
        The path, or None when no file is configured and none is in the working directory.

    Raises:
        ProfileError: an explicit or environment-named file does not exist.
    """
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise ProfileError(f"{path}: profile file not found")
        return path
    named = os.environ.get(ENV_VAR, "")
    if named:
        path = Path(named)
        if not path.is_file():
            raise ProfileError(f"{path}: profile file not found (named by ${ENV_VAR})")
        return path
    path = Path.cwd() / DEFAULT_FILE
    return path if path.is_file() else None


@dataclass(frozen=True, slots=True)
class Profile:
    """A named, validated set of sandbox settings (``extends`` already resolved).

    Fields left at None are not set by the profile, so ``Sandbox`` keeps its default.

    .. versionadded:: 0.4.0
    """

    name: str
    image: str | None = None
    backend: str | None = None
    timeout: float | None = None
    """Lifetime of the sandbox in seconds."""
    memory: int | None = None
    """Bytes."""
    cpus: float | None = None
    pids: int | None = None
    workspace_size: int | None = None
    """Bytes."""
    workspace: str | None = None
    """``"disk"`` or ``"memory"`` (see ``Sandbox(workspace=)``).  .. versionadded:: 0.4.0"""
    scratch_size: int | None = None
    """Bytes."""
    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Plain values only; secrets do not belong in a profile."""
    approvals: tuple[ApprovalRule, ...] = ()
    security_policy: SecurityPolicy = field(default_factory=SecurityPolicy)
    read_only_root: bool | None = None
    verify: bool | None = None
    """Check from inside that the policy holds before handing a sandbox out."""

    def sandbox_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`agentnest.Sandbox` (only what the profile sets, and the policy)."""
        out: dict[str, Any] = {}
        for name in (
            "image",
            "backend",
            "timeout",
            "memory",
            "cpus",
            "pids",
            "workspace_size",
            "workspace",
            "scratch_size",
            "read_only_root",
            "verify",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.environment:
            out["environment"] = dict(self.environment)
        out["security_policy"] = self.security_policy
        return out


@dataclass(frozen=True, slots=True)
class ProfileSet:
    """The profiles of one file.

    .. versionadded:: 0.4.0
    """

    path: Path
    profiles: Mapping[str, Profile]
    default: str | None = None

    def get(self, name: str | None = None) -> Profile:
        """The profile ``name`` (or the file's ``default``).

        Raises:
            ProfileError: no such profile, or no name and no default.
        """
        if name is None:
            name = self.default
            if name is None:
                raise ProfileError(f"{self.path}: no profile named and no 'default:' in the file")
        try:
            return self.profiles[name]
        except KeyError:
            available = ", ".join(sorted(self.profiles)) or "none"
            raise ProfileError(f"{self.path}: no profile {name!r}; available: {available}") from None


# -- YAML with line numbers ----------------------------------------------------


class _Map(dict[Any, Any]):
    """A YAML mapping that remembers the line of each key (and its own)."""

    line = 0
    lines: dict[Any, int]


class _Seq(list[Any]):
    """A YAML sequence that remembers the line of each item (and its own)."""

    line = 0
    lines: list[int]


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


def _import_yaml() -> Any:
    try:
        return importlib.import_module("yaml")
    except ImportError:
        raise MissingDependencyError(
            "reading profiles needs pyyaml: pip install 'agentnest[profiles]'"
        ) from None


def _loader(yaml: Any) -> Any:
    class LineLoader(yaml.SafeLoader):  # type: ignore[misc]
        """SafeLoader that records lines and refuses duplicate keys."""

        def construct_mapping(self, node: Any, deep: bool = False) -> _Map:
            explicit = len(node.value)
            self.flatten_mapping(node)  # '<<' merge keys come first and may be overridden
            merged = len(node.value) - explicit
            out = _Map()
            out.line = node.start_mark.line + 1
            out.lines = {}
            for i, (key_node, value_node) in enumerate(node.value):
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        None, None, "found an unhashable key", key_node.start_mark
                    ) from None
                if key in out and i >= merged and out.lines[key] >= 0:
                    raise _DuplicateKey(key, line, out.lines[key])
                out[key] = self.construct_object(value_node, deep=True)
                # Merged keys are marked negative: an explicit key may override them once.
                out.lines[key] = line if i >= merged else -line
            out.lines = {k: abs(v) for k, v in out.lines.items()}
            return out

        def construct_sequence(self, node: Any, deep: bool = False) -> _Seq:
            out = _Seq(self.construct_object(child, deep=True) for child in node.value)
            out.line = node.start_mark.line + 1
            out.lines = [child.start_mark.line + 1 for child in node.value]
            return out

    LineLoader.add_constructor("tag:yaml.org,2002:map", lambda loader, node: loader.construct_mapping(node))
    LineLoader.add_constructor("tag:yaml.org,2002:seq", lambda loader, node: loader.construct_sequence(node))
    return LineLoader


# -- validation ------------------------------------------------------------------


class _Where:
    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, line: int, where: str, message: str) -> ProfileError:
        return ProfileError(f"{self.path}:{line}: {where}: {message}")


def _check_keys(w: _Where, data: _Map, allowed: tuple[str, ...], where: str) -> None:
    for key, line in data.lines.items():
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(allowed)}"
        raise w.error(line, f"{where}.{key}" if where else str(key), f"unknown key{hint}")


def _mapping(w: _Where, value: Any, line: int, where: str) -> _Map:
    if not isinstance(value, _Map):
        raise w.error(line, where, f"must be a mapping, not {_kind(value)}")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "empty"
    if isinstance(value, _Map):
        return "a mapping"
    if isinstance(value, _Seq):
        return "a list"
    return f"{type(value).__name__} {value!r:.40}"


def _parse_profile(w: _Where, name: str, raw: _Map) -> dict[str, Any]:
    """Validate one profile's own keys into a dict of settings (without ``extends``)."""
    base = f"profiles.{name}"
    _check_keys(w, raw, _PROFILE_KEYS, base)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        line = raw.lines[key]
        where = f"{base}.{key}"
        if key == "workspace":
            if value not in ("disk", "memory"):
                raise w.error(line, where, f"must be 'disk' or 'memory', not {value!r:.40}")
            out[key] = value
        elif key in ("image", "backend", "extends", "required_runtime"):
            if not isinstance(value, str) or not value.strip():
                raise w.error(line, where, f"must be a non-empty string, not {_kind(value)}")
            out[key] = value
        elif key in (
            "memory",
            "workspace_size",
            "scratch_size",
            "max_output_bytes",
            "max_file_bytes",
            "max_memory",
        ):
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise w.error(line, where, f"must be a size like '512m' or a byte count, not {_kind(value)}")
            try:
                out[key] = parse_size(value, key)
            except ConfigurationError:
                if isinstance(value, str):
                    raise w.error(line, where, f"{value!r} is not a size; write it like '512m'") from None
                raise w.error(line, where, f"{value!r} must be a positive byte count") from None
        elif key in ("timeout", "cpus", "max_cpus", "max_timeout", "approval_timeout"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise w.error(line, where, f"must be a number, not {_kind(value)}")
            out[key] = float(value)
        elif key in ("pids", "max_pids"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise w.error(line, where, f"must be an integer, not {_kind(value)}")
            out[key] = value
        elif key in ("require_image_digest", "read_only_root", "verify"):
            if not isinstance(value, bool):
                raise w.error(line, where, f"must be true or false, not {_kind(value)}")
            out[key] = value
        elif key == "allowed_images":
            if not isinstance(value, _Seq):
                raise w.error(line, where, f"must be a list of image patterns, not {_kind(value)}")
            for item, item_line in zip(value, value.lines, strict=True):
                if not isinstance(item, str) or not item.strip():
                    raise w.error(item_line, where, f"must hold non-empty strings, not {_kind(item)}")
            out[key] = tuple(value)
        elif key == "environment":
            env = _mapping(w, value, line, where)
            for k, v in env.items():
                if not isinstance(v, str):
                    raise w.error(
                        env.lines[k], f"{where}.{k}", f"must be a string (quote it), not {_kind(v)}"
                    )
                try:
                    _freeze_env({k: v})
                except ConfigurationError as exc:
                    raise w.error(env.lines[k], f"{where}.{k}", str(exc)) from None
            out[key] = dict(env)
        elif key == "network":
            out[key] = _parse_network(w, value, line, where)
        elif key == "approvals":
            out[key] = _parse_approvals(w, value, line, where)
    return out


def _parse_network(w: _Where, value: Any, line: int, where: str) -> NetworkPolicy:
    if value in ("denied", "deny"):  # 'deny' and 'allow': 0.3.0's names of the modes
        return NetworkPolicy.denied()
    if value in ("open", "allow"):
        return NetworkPolicy.open()
    if not isinstance(value, _Map):
        raise w.error(line, where, f"must be 'denied', 'open' or {{allowlist: ...}}, not {_kind(value)}")
    _check_keys(w, value, ("allowlist",), where)
    if "allowlist" not in value:
        raise w.error(line, where, "a mapping here needs 'allowlist'")
    allow = _mapping(w, value["allowlist"], value.lines["allowlist"], f"{where}.allowlist")
    _check_keys(w, allow, (*_ALLOWLIST_KEYS, "subdomains"), f"{where}.allowlist")
    subdomains = allow.get("subdomains", True)
    if not isinstance(subdomains, bool):
        raise w.error(
            allow.lines["subdomains"],
            f"{where}.allowlist.subdomains",
            f"must be true or false, not {_kind(subdomains)}",
        )
    lists: dict[str, tuple[Any, ...]] = {}
    for key in _ALLOWLIST_KEYS:
        if key not in allow:
            continue
        items = allow[key]
        kwhere = f"{where}.allowlist.{key}"
        if not isinstance(items, _Seq):
            raise w.error(allow.lines[key], kwhere, f"must be a list, not {_kind(items)}")
        # Check item by item so that a refused pattern ('*.com') is reported at its own line.
        for item, item_line in zip(items, items.lines, strict=True):
            probe: dict[str, Any] = {"domains": ("example.com",), key: (item,)}
            try:
                NetworkPolicy.allowlist(**probe)
            except ConfigurationError as exc:
                raise w.error(item_line, kwhere, str(exc)) from None
        lists[key] = tuple(items)
    try:
        return NetworkPolicy.allowlist(**lists, subdomains=subdomains)
    except ConfigurationError as exc:
        raise w.error(value.lines["allowlist"], f"{where}.allowlist", str(exc)) from None


def _parse_approvals(w: _Where, value: Any, line: int, where: str) -> RuleApprover:
    """A rule list (first match wins, anything else denied) or ``{default: ..., rules: [...]}``."""
    default = "deny"
    if isinstance(value, _Map):
        _check_keys(w, value, _RULES_FILE_KEYS, where)
        if "default" in value:
            default = value["default"]
            if default not in ("allow", "deny"):
                raise w.error(value.lines["default"], f"{where}.default", "must be 'allow' or 'deny'")
        if "rules" not in value:
            raise w.error(value.line, where, "missing 'rules'")
        line, value, where = value.lines["rules"], value["rules"], f"{where}.rules"
    if not isinstance(value, _Seq):
        raise w.error(line, where, f"must be a list of rules, not {_kind(value)}")
    rules = []
    for i, (item, item_line) in enumerate(zip(value, value.lines, strict=True)):
        iwhere = f"{where}[{i}]"
        rule = _mapping(w, item, item_line, iwhere)
        _check_keys(w, rule, _RULE_KEYS, iwhere)
        for key in _RULE_KEYS:
            if key not in rule:
                raise w.error(rule.line, iwhere, f"missing {key!r}")
            if not isinstance(rule[key], str):
                raise w.error(rule.lines[key], f"{iwhere}.{key}", f"must be a string, not {_kind(rule[key])}")
        try:
            rules.append(ApprovalRule(rule["kind"], rule["match"], rule["action"]))
        except ConfigurationError as exc:
            bad = next((k for k in _RULE_KEYS if k in str(exc).split()[0]), "kind")
            raise w.error(rule.lines[bad], f"{iwhere}.{bad}", str(exc)) from None
    return RuleApprover(rules, default)


_POLICY_KEYS = (
    "network",
    "max_output_bytes",
    "max_file_bytes",
    "require_image_digest",
    "allowed_images",
    "read_only_root",
    "required_runtime",
    "max_memory",
    "max_cpus",
    "max_pids",
    "max_timeout",
    "approval_timeout",
)


def _build(w: _Where, name: str, settings: dict[str, Any], line: int) -> Profile:
    where = f"profiles.{name}"
    try:
        policy = SecurityPolicy(
            **{k: settings[k] for k in _POLICY_KEYS if k in settings},
            approval_hook=settings.get("approvals"),
        )
    except ConfigurationError as exc:
        raise w.error(line, where, str(exc)) from None
    try:
        # Cross-field checks (workspace + scratch must fit in memory), with Sandbox's defaults.
        limits = ResourceLimits.build(
            settings.get("memory", "512m"),
            settings.get("cpus", 1.0),
            settings.get("pids", 256),
            settings.get("workspace_size"),
            settings.get("scratch_size"),
            # Checked as memory unless the profile says disk: without it the
            # backend may pick memory at create, where the sizes must fit.
            workspace_medium=settings.get("workspace", "memory"),
        )
    except ConfigurationError as exc:
        raise w.error(line, where, str(exc)) from None
    if "timeout" in settings and not 1 <= settings["timeout"] <= 7 * 24 * 3600:
        raise w.error(line, f"{where}.timeout", "is out of range; use 1 to 604800 seconds")
    # A profile must not ask for more than its own ceilings allow.
    reason = policy.check_limits(limits, settings.get("timeout", 300.0))
    if reason:
        raise w.error(line, where, reason)
    return Profile(
        name=name,
        image=settings.get("image"),
        backend=settings.get("backend"),
        timeout=settings.get("timeout"),
        memory=settings.get("memory"),
        cpus=settings.get("cpus"),
        pids=settings.get("pids"),
        workspace_size=settings.get("workspace_size"),
        workspace=settings.get("workspace"),
        scratch_size=settings.get("scratch_size"),
        environment=MappingProxyType(dict(settings.get("environment", {}))),
        approvals=settings["approvals"].rules if "approvals" in settings else (),
        security_policy=policy,
        read_only_root=settings.get("read_only_root"),
        verify=settings.get("verify"),
    )


def profile_kwargs(profile: str | Profile, given: Mapping[str, Any]) -> dict[str, Any]:
    """Sandbox arguments: the profile's, overridden by those the caller passed explicitly.

    A profile named by a string is looked up in the file :func:`find_profile_file`
    finds.  ``environment`` is merged name by name (the caller wins); every other
    argument the caller passed replaces the profile's, ``security_policy``
    included (whole).
    """
    if isinstance(profile, str):
        path = find_profile_file()
        if path is None:
            raise ProfileError(
                f"profile {profile!r} asked for, but no profile file was found: set ${ENV_VAR} or put "
                f"{DEFAULT_FILE} in the working directory (or pass profile=load_profiles(path).get(name))"
            )
        profile = load_profiles(path).get(profile)
    if not isinstance(profile, Profile):
        raise ConfigurationError(f"profile must be a profile name or a Profile, not {type(profile).__name__}")
    merged = profile.sandbox_kwargs()
    env = {**merged.get("environment", {}), **dict(given.get("environment") or {})}
    merged.update(given)
    if env:
        merged["environment"] = env
    return merged


def _read_yaml(path: Path, what: str) -> tuple[_Where, Any]:
    yaml = _import_yaml()
    w = _Where(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read the {what}: {exc}") from None
    try:
        return w, yaml.load(text, Loader=_loader(yaml))  # a SafeLoader subclass
    except _DuplicateKey as dup:
        raise w.error(dup.line, str(dup.key), f"duplicate key (first at line {dup.first})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise ProfileError(f"{path}:{line}: not valid YAML: {problem}") from None


def load_rules(path: str | os.PathLike[str]) -> RuleApprover:
    """Load approval rules from a YAML file (``RuleApprover.from_yaml``).

    The file is ``{default: allow|deny, rules: [{kind, match, action}, ...]}``
    or just the list of rules (``default: deny``).

    Raises:
        ProfileError: unreadable, invalid YAML or schema; ``file:line:`` first.
    """
    path = Path(path)
    w, data = _read_yaml(path, "approval rules file")
    if not isinstance(data, (_Map, _Seq)):
        raise w.error(
            1, "(top level)", f"must be a list of rules or a mapping with 'rules:', not {_kind(data)}"
        )
    return _parse_approvals(w, data, getattr(data, "line", 1), "(top level)")


def load_profiles(path: str | os.PathLike[str]) -> ProfileSet:
    """Load and validate every profile of a YAML file.

    The file holds a top-level ``profiles:`` mapping of named profiles and an
    optional ``default: NAME``.  A profile may ``extends: OTHER`` (single
    inheritance): its keys override the parent's, ``environment`` is merged
    key by key.  docs/profiles.md shows an example.

    Raises:
        ProfileError: the file is unreadable, not valid YAML, or breaks the
            schema; the message starts with ``file:line:``.
        MissingDependencyError: pyyaml is not installed.
    """
    path = Path(path)
    w, data = _read_yaml(path, "profile file")
    if not isinstance(data, _Map):
        raise w.error(1, "(top level)", f"must be a mapping with 'profiles:', not {_kind(data)}")
    _check_keys(w, data, _TOP_KEYS, "")
    if "profiles" not in data:
        raise w.error(data.line, "(top level)", "missing 'profiles:'")
    profiles = _mapping(w, data["profiles"], data.lines["profiles"], "profiles")
    own: dict[str, dict[str, Any]] = {}
    for name, raw in profiles.items():
        line = profiles.lines[name]
        if not isinstance(name, str) or not name:
            raise w.error(line, "profiles", f"profile name {name!r} must be a non-empty string")
        own[name] = _parse_profile(w, name, _mapping(w, raw, line, f"profiles.{name}"))

    def resolve(name: str, chain: tuple[str, ...]) -> dict[str, Any]:
        settings = own[name]
        parent = settings.get("extends")
        if parent is None:
            return dict(settings)
        line = profiles[name].lines["extends"]
        if parent not in own:
            available = ", ".join(sorted(own))
            raise w.error(line, f"profiles.{name}.extends", f"no profile {parent!r}; available: {available}")
        if parent in chain:
            cycle = " -> ".join((*chain, parent))
            raise w.error(line, f"profiles.{name}.extends", f"inheritance cycle: {cycle}")
        merged = resolve(parent, (*chain, parent))
        child = dict(settings)
        if "environment" in child:
            child["environment"] = {**merged.get("environment", {}), **child["environment"]}
        merged.update(child)
        return merged

    resolved = {name: _build(w, name, resolve(name, (name,)), profiles.lines[name]) for name in own}
    default = data.get("default")
    if default is not None:
        line = data.lines["default"]
        if not isinstance(default, str):
            raise w.error(line, "default", f"must be a profile name, not {_kind(default)}")
        if default not in resolved:
            available = ", ".join(sorted(resolved)) or "none"
            raise w.error(line, "default", f"no profile {default!r}; available: {available}")
    return ProfileSet(path, MappingProxyType(resolved), default)


# RuleApprover.from_yaml reads through this module (approvals.py sits below it).
use_rules_loader(load_rules)


__all__ = [
    "APPROVAL_KINDS",
    "DEFAULT_FILE",
    "ENV_VAR",
    "ApprovalRule",
    "Profile",
    "ProfileError",
    "ProfileSet",
    "find_profile_file",
    "load_profiles",
    "load_rules",
    "profile_kwargs",
]
