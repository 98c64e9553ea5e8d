"""What a template spec may hold, and reading one from a file (pure).

This module decides which values a :class:`~agentnest.templates.Template` accepts
and in which normal form it keeps them: Debian package names and versions, pip
requirements (and that the wheel directory covers them: builds are offline),
file destinations (absolute, normalised, not hidden by a sandbox's mounts),
environment names and values (never a :class:`~agentnest.secrets.Secret`: a
template bakes them into the image) and commands.  It also turns a JSON, TOML
or YAML spec file into :class:`~agentnest.templates.Template` arguments.  It
raises :class:`~agentnest.errors.ConfigurationError` with the reason, so an
invalid spec never reaches the engine.
"""

from __future__ import annotations

import importlib
import json
import os
import posixpath
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .errors import ConfigurationError, MissingDependencyError
from .secrets import Secret

# Debian policy 5.6.1: lower case letters, digits, '+', '-', '.'; at least two
# characters; starting with a letter or digit.  Versions (policy 5.6.12) start
# with a digit and use letters, digits and ". + ~ - :".  Neither can start an
# option or carry a shell metacharacter.
_DEB_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_DEB_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~:-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_.]*)?-[^-]+-[^-]+-[^-]+\.whl$")
# A pip requirement (PEP 508) without markers, URLs or spaces: a project name
# (PEP 508's), optional extras, optional comma-separated version specifiers.
_PIP_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PIP_SPECIFIER = r"(?:===|==|!=|~=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+"
_REQUIREMENT = re.compile(
    rf"({_PIP_NAME})(?:\[{_PIP_NAME}(?:,{_PIP_NAME})*\])?(?:{_PIP_SPECIFIER}(?:,{_PIP_SPECIFIER})*)?"
)
#: Control characters a Dockerfile line cannot carry (tab is fine).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

#: Mounted empty (tmpfs) or provided by the kernel when a sandbox starts:
#: a file put there at build time would be hidden at run time.
_HIDDEN_AT_RUN_TIME = ("/workspace", "/tmp", "/proc", "/sys", "/dev")
#: Set by the sandbox for every command; a value baked into the image would be overridden.
_SET_BY_SANDBOX = frozenset({"PATH", "HOME", "LANG", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})

_SPEC_KEYS = ("base_image", "pip_packages", "apt_packages", "environment", "commands", "wheels", "files")


# -- values -----------------------------------------------------------------------------


def wheel_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Every ``.whl`` file at the top of ``directory``, sorted by name."""
    root = Path(directory)
    try:
        found = sorted(p for p in root.iterdir() if p.name.endswith(".whl") and p.is_file())
    except OSError as exc:
        raise ConfigurationError(f"wheels directory {str(root)!r} cannot be read: {exc.strerror}") from None
    if not found:
        raise ConfigurationError(f"wheels directory {str(root)!r} has no .whl files at its top level")
    for p in found:
        if not _WHEEL_NAME.match(p.name):
            raise ConfigurationError(
                f"{p.name!r} in {str(root)!r} is not a wheel file name (name-version-python-abi-platform.whl)"
            )
    return found


def _strings(value: object, what: str) -> tuple[str, ...]:
    # A bare string is a sequence of characters: refuse it rather than install "j", "q".
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigurationError(f"{what} must be a list or tuple of strings, not {type(value).__name__}")
    for item in value:
        if not isinstance(item, str):
            raise ConfigurationError(f"{what} must hold strings, not {type(item).__name__} ({item!r})")
    return tuple(value)


def _words(value: object, what: str) -> list[tuple[str, str]]:
    """Each name in ``value`` and how it was written (its item, or ``''`` when alone).

    "git curl" is two packages, as 0.3.0's shell line made it; each word is checked.
    """
    words = []
    for item in _strings(value, what):
        parts = item.split()
        if not parts:
            raise ConfigurationError(f"{what} holds an empty name ({item!r})")
        words += [(word, f" (in {item!r})" if parts != [item] else "") for word in parts]
    return words


def check_packages(value: object) -> tuple[str, ...]:
    out = set()
    for spec, where in _words(value, "apt_packages"):
        name, sep, version = spec.partition("=")
        if not _DEB_NAME.match(name):
            raise ConfigurationError(
                f"apt package {spec!r}{where} is not a Debian package name: use lower case letters, "
                "digits, '+', '-' and '.', at least two characters, starting with a letter or digit"
            )
        if sep and not _DEB_VERSION.match(version):
            raise ConfigurationError(
                f"apt package {spec!r}{where} has an invalid version: it must start with a digit and use "
                "letters, digits and '.+~:-'"
            )
        out.add(spec)
    return tuple(sorted(out))


def check_requirements(value: object) -> tuple[str, ...]:
    out = set()
    for spec, where in _words(value, "pip_packages"):
        if not _REQUIREMENT.fullmatch(spec):
            raise ConfigurationError(
                f"pip package {spec!r}{where} is not a requirement such as 'requests', "
                "'requests[socks]' or 'requests>=2.31,<3' (spaces separate packages); pip options, "
                "URLs and paths are not accepted: put the wheels in a directory and pass it as wheels="
            )
        out.add(spec)
    return tuple(sorted(out))


def _distribution(name: str) -> str:
    # PEP 503 normalisation; wheel file names spell '-' as '_'.
    return re.sub(r"[-_.]+", "-", name).lower()


def check_wheels_cover(requirements: Sequence[str], directory: str) -> None:
    """Refuse a requirement that no wheel in ``directory`` can satisfy by name."""
    present = {_distribution(p.name.split("-", 1)[0]) for p in wheel_files(directory)}
    missing = []
    for spec in requirements:
        match = _REQUIREMENT.fullmatch(spec)
        assert match is not None  # checked by check_requirements
        if _distribution(match.group(1)) not in present:
            missing.append(spec)
    if missing:
        listed = " ".join(missing)
        raise ConfigurationError(
            f"pip package{'s' * (len(missing) != 1)} {listed} ha{'ve' if len(missing) != 1 else 's'} "
            f"no wheel in {directory!r}, and builds are offline; add them with their dependencies: "
            f"`pip download --only-binary=:all: -d {directory} {listed}`"
        )


def check_wheel_dir(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigurationError(f"wheels must be a directory path, not {type(value).__name__}")
    path = os.path.abspath(os.fspath(value))
    if not os.path.isdir(path):
        raise ConfigurationError(f"wheels directory {path!r} does not exist or is not a directory")
    wheel_files(path)  # at least one valid wheel
    return path


def _dest_path(path: object) -> str:
    if not isinstance(path, str):
        raise ConfigurationError(f"file destination {path!r} must be a string")
    if not path.startswith("/") or path.startswith("//"):
        raise ConfigurationError(f"file destination {path!r} must be an absolute path such as /etc/app.conf")
    if _CONTROL.search(path) or "\t" in path:
        raise ConfigurationError(f"file destination {path!r} contains a control character")
    if posixpath.normpath(path) != path or path == "/":
        raise ConfigurationError(
            f"file destination {path!r} is not normalised; write it as {posixpath.normpath(path)!r} "
            "(no '.', '..', '//' or trailing '/')"
        )
    for hidden in _HIDDEN_AT_RUN_TIME:
        if path == hidden or path.startswith(hidden + "/"):
            raise ConfigurationError(
                f"file destination {path!r} is under {hidden}, which a sandbox mounts fresh at start, "
                "so the file would never be seen; put it elsewhere (e.g. /opt or /etc) and copy it "
                "into the workspace at run time"
            )
    return path


def check_files(value: object) -> Mapping[str, str | bytes]:
    if not isinstance(value, Mapping):
        raise ConfigurationError("files must be a mapping of absolute paths to str or bytes content")
    out: dict[str, str | bytes] = {}
    for path, content in value.items():
        dest = _dest_path(path)
        if isinstance(content, bytearray):
            content = bytes(content)
        if not isinstance(content, (str, bytes)):
            raise ConfigurationError(
                f"files[{dest!r}] must be the file's content (str or bytes), not {type(content).__name__}"
            )
        out[dest] = content
    for dest in out:
        # A file cannot also be a directory of another entry.
        parent = posixpath.dirname(dest)
        while parent != "/":
            if parent in out:
                raise ConfigurationError(f"files: {parent!r} is a file, so {dest!r} cannot be inside it")
            parent = posixpath.dirname(parent)
    return MappingProxyType(dict(sorted(out.items())))


def check_environment(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise ConfigurationError("environment must be a mapping of names to str values")
    out: dict[str, str] = {}
    for name, v in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ConfigurationError(
                f"environment name {name!r} is invalid; use letters, digits and '_', "
                "not starting with a digit"
            )
        if isinstance(v, Secret):
            raise ConfigurationError(
                f"environment[{name!r}] is a Secret: a template bakes its environment into the image "
                "(ENV and build arguments end up in image layers and `docker history`, readable by anyone "
                "who has the image); pass secrets when the sandbox starts instead: "
                "Sandbox(tag, environment={...: Secret(...)})"
            )
        if not isinstance(v, str):
            raise ConfigurationError(f"environment[{name!r}] must be a str, not {type(v).__name__}")
        if name.startswith("AGENTNEST_"):
            raise ConfigurationError(f"environment name {name!r} is reserved (AGENTNEST_ prefix)")
        if name in _SET_BY_SANDBOX:
            raise ConfigurationError(
                f"environment name {name!r} is set by the sandbox for every command, so a value baked "
                "into the image would never be seen; pass it as Sandbox(environment=...) instead"
            )
        if _CONTROL.search(v):
            raise ConfigurationError(
                f"environment[{name!r}] contains a newline or control character, which an image's "
                "environment cannot carry; write the value to a file instead"
            )
        out[name] = v
    return MappingProxyType(dict(sorted(out.items())))


def check_commands(value: object) -> tuple[str, ...]:
    commands = _strings(value, "commands")
    for command in commands:
        if not command.strip():
            raise ConfigurationError("commands must not be empty")
        if "\x00" in command:
            raise ConfigurationError(f"command {command[:40]!r} contains a NUL byte")
    return commands


# -- spec files -------------------------------------------------------------------------


def spec_arguments(data: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """``Template(...)`` keyword arguments from plain data (see ``Template.from_dict``).

    A ``files`` value may be ``{"source": PATH}``: the file is read now, relative to
    ``root``, and so is a relative ``wheels`` path.
    """
    if not isinstance(data, Mapping):
        raise ConfigurationError("a template spec must be a mapping (a JSON object or TOML table)")
    unknown = sorted(set(data) - set(_SPEC_KEYS))
    if unknown:
        raise ConfigurationError(
            f"unknown template key(s) {', '.join(map(repr, unknown))}; known: {', '.join(_SPEC_KEYS)}"
        )
    kwargs: dict[str, Any] = {}
    if "base_image" in data:
        kwargs["base_image"] = data["base_image"]
    for key in ("pip_packages", "apt_packages", "commands"):
        if key in data:
            value = data[key]
            if not isinstance(value, list):
                raise ConfigurationError(f"{key} must be a list of strings")
            kwargs[key] = tuple(value)
    if data.get("wheels") is not None:
        wheels = data["wheels"]
        if not isinstance(wheels, str):
            raise ConfigurationError("wheels must be a directory path (a string)")
        kwargs["wheels"] = str(root / wheels)
    if "environment" in data:
        kwargs["environment"] = data["environment"]
    if "files" in data:
        kwargs["files"] = _files_from_spec(data["files"], root)
    return kwargs


def read_spec(spec: Path) -> Any:
    """The data of spec file ``spec``: ``.json``, ``.toml`` or ``.yaml``/``.yml``."""
    try:
        raw = spec.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read template spec {str(spec)!r}: {exc.strerror}") from None
    suffix = spec.suffix.lower()
    if suffix == ".json":
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"{spec}: not valid JSON: {exc}") from None
    if suffix == ".toml":
        return _parse_toml(raw, spec)
    if suffix in (".yaml", ".yml"):
        return _parse_yaml(raw, spec)
    raise ConfigurationError(
        f"{spec}: unknown spec format {suffix or '(no suffix)'!r}; use .json, .toml or .yaml"
    )


def _files_from_spec(value: object, root: Path) -> dict[str, str | bytes]:
    if not isinstance(value, Mapping):
        raise ConfigurationError("files must be a table of destination paths to contents")
    out: dict[str, str | bytes] = {}
    for dest, entry in value.items():
        if isinstance(entry, str):
            out[dest] = entry
            continue
        if not isinstance(entry, Mapping) or set(entry) != {"source"} or not isinstance(entry["source"], str):
            raise ConfigurationError(
                f'files[{dest!r}] must be the content (a string) or {{"source": "path/relative/to/spec"}}'
            )
        source = root / entry["source"]
        try:
            out[dest] = source.read_bytes()
        except OSError as exc:
            raise ConfigurationError(
                f"files[{dest!r}]: cannot read {str(source)!r}: {exc.strerror}"
            ) from None
    return out


def _parse_toml(raw: bytes, spec: Path) -> Any:
    # tomllib is in the standard library from 3.11; tomli is its 3.10 backport.
    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"
    try:
        toml = importlib.import_module(name)
    except ImportError:
        raise MissingDependencyError(
            f"{spec}: reading TOML on Python {sys.version_info[0]}.{sys.version_info[1]} needs tomli "
            "(`pip install tomli`); or write the spec as JSON"
        ) from None
    try:
        return toml.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{spec}: not valid TOML: {exc}") from None


def _parse_yaml(raw: bytes, spec: Path) -> Any:
    try:
        yaml = importlib.import_module("yaml")
    except ImportError:
        raise MissingDependencyError(
            f"{spec}: reading YAML needs pyyaml: pip install 'agentnest[profiles]' "
            "(or write the spec as JSON or TOML)"
        ) from None
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{spec}: not valid YAML: {exc}") from None


__all__ = [
    "check_commands",
    "check_environment",
    "check_files",
    "check_packages",
    "check_requirements",
    "check_wheel_dir",
    "check_wheels_cover",
    "read_spec",
    "spec_arguments",
    "wheel_files",
]
