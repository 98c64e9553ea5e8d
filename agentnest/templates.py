"""``Template``: a sandbox image described as data, built once per content.

A template names a base image and what to add to it: Debian packages, Python
wheels from a local directory, files, environment values and build commands.
Its tag is content-addressed::

    agentnest/template:<first 12 hex digits of sha256(canonical spec)>

where the canonical spec holds the recipe version, the base image's *ID* (not
its name, so a rebuilt base gives new template tags), the sorted package
names, the SHA-256 of every wheel and file, the environment and the commands.
Building a spec whose tag already exists on the engine (with a matching
``agentnest.template`` label) does nothing: the same spec never builds twice.

The tag names the spec, not the bytes: ``apt-get`` installs whatever version
the mirror offers on the day of the build, so two builds of one spec on two
machines (or days) can differ.  Pin versions (``"jq=1.6-2.1+deb12u2"``) where
that matters.

Example::

    from agentnest import Sandbox, Template

    template = Template(
        apt_packages=("jq",),
        files={"/etc/agent/prompt.txt": "be brief"},
        environment={"TOOL_MODE": "strict"},
        commands=("jq --version > /etc/agent/jq-version",),
    )
    tag = template.build(progress=print)
    with Sandbox(tag) as sandbox:
        print(sandbox.exec_shell("jq -n '1 + 1'").stdout)

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import posixpath
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from .errors import ConfigurationError, MissingDependencyError
from .secrets import Secret

if TYPE_CHECKING:
    import docker

#: Repository of every template image; the tag is the spec's digest.
TEMPLATE_REPOSITORY = "agentnest/template"
#: Version of the build recipe (``runtime/docker/builder.py``).  Bump it whenever
#: the generated Dockerfile changes what a spec produces, so old tags are not reused.
RECIPE_VERSION = 1
#: Label on every template image: the full SHA-256 of its canonical spec.
LABEL = "agentnest.template"
#: Label on every template image: the ID of the image it was built on.
LABEL_BASE = "agentnest.template.base"

# Debian policy 5.6.1: lower case letters, digits, '+', '-', '.'; at least two
# characters; starting with a letter or digit.  Versions (policy 5.6.12) start
# with a digit and use letters, digits and ". + ~ - :".  Neither can start an
# option or carry a shell metacharacter.
_DEB_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_DEB_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~:-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(-[0-9][A-Za-z0-9_.]*)?-[^-]+-[^-]+-[^-]+\.whl$")
#: Control characters a Dockerfile line cannot carry (tab is fine).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

#: Mounted empty (tmpfs) or provided by the kernel when a sandbox starts:
#: a file put there at build time would be hidden at run time.
_HIDDEN_AT_RUN_TIME = ("/workspace", "/tmp", "/proc", "/sys", "/dev")
#: Set by the sandbox for every command; a value baked into the image would be overridden.
_SET_BY_SANDBOX = frozenset({"PATH", "HOME", "LANG", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})

_SPEC_KEYS = ("base", "apt_packages", "wheels", "files", "environment", "commands")


# -- progress ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BuildEvent:
    """One step of :meth:`Template.build`, handed to its ``progress`` callback.

    Attributes:
        kind: ``"resolved"`` (the tag is known), ``"cached"`` (an image with
            that tag exists: nothing is built), ``"step"`` (a Dockerfile step
            starts; ``step``/``total`` count them), ``"output"`` (a line the
            step printed) or ``"built"`` (the image is tagged).
        message: what happened, one line.
        step: the current step number, from 1 (``"step"`` and ``"output"``).
        total: the number of steps (``"step"`` and ``"output"``).

    .. versionadded:: 0.4.0
    """

    kind: Literal["resolved", "cached", "step", "output", "built"]
    message: str
    step: int | None = None
    total: int | None = None


ProgressCallback = Callable[[BuildEvent], None]


# -- the spec ---------------------------------------------------------------------------


def _default_base() -> str:
    from .runtime.docker.images import base_image

    return base_image()


@dataclass(frozen=True, slots=True)
class Template:
    """A deterministic image build: base image plus packages, wheels, files, environment, commands.

    The build runs in this order, as root: Debian packages, wheels, files,
    environment, commands; the image then ends with ``USER 65532:65532`` and
    ``WORKDIR /workspace``, like the default image.  Values are validated
    here, so an invalid spec never reaches the engine.

    .. versionadded:: 0.4.0
    """

    base: str = field(default_factory=_default_base)
    """Image to build on (default: AgentNest's default image).  Must be on the
    engine or pullable; its ID, not its name, enters the tag."""
    apt_packages: tuple[str, ...] = ()
    """Debian packages, installed with ``apt-get install --no-install-recommends``
    from the base image's apt sources.  ``name`` or ``name=version``.  Order does
    not matter: they are kept sorted and de-duplicated."""
    wheels: str | None = None
    """A local directory of ``.whl`` files.  Every wheel at its top level is
    installed offline (``pip install --no-index --find-links``), dependencies
    resolved from the same directory only.  Their content, not the path, enters the tag."""
    files: Mapping[str, str | bytes] = field(default_factory=lambda: MappingProxyType({}))
    """Absolute destination path in the image -> content (``str`` is written as
    UTF-8).  Contents, not host paths: the spec carries what it installs, and the
    tag hashes exactly that.  Files are owned by root, mode 0644; missing parent
    directories are created (root, 0755) and existing ones are left as they are."""
    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Environment baked into the image (``ENV``), visible to ``commands`` and to
    every sandbox command.  Never secrets: ``Secret`` values are refused."""
    commands: tuple[str, ...] = ()
    """Shell commands (``/bin/sh -c``) run at build time as root, in order, after
    everything else is in place; each is one build step."""

    def __hash__(self) -> int:
        # The generated hash would fail on the mappings; hash their frozen items instead.
        return hash(
            (
                self.base,
                self.apt_packages,
                self.wheels,
                tuple(self.files.items()),
                tuple(self.environment.items()),
                self.commands,
            )
        )

    def __post_init__(self) -> None:
        if not isinstance(self.base, str) or not self.base or re.search(r"\s", self.base):
            raise ConfigurationError(f"base={self.base!r} is not an image reference")
        object.__setattr__(self, "apt_packages", _packages(self.apt_packages))
        object.__setattr__(self, "wheels", _wheel_dir(self.wheels))
        object.__setattr__(self, "files", _files(self.files))
        object.__setattr__(self, "environment", _environment(self.environment))
        object.__setattr__(self, "commands", _commands(self.commands))

    # -- identity ------------------------------------------------------------

    def canonical(self, base_image_id: str) -> dict[str, Any]:
        """The canonical form of the spec on top of ``base_image_id``, as hashed into the tag.

        Reads the wheel directory (their SHA-256), so a rebuilt wheel gives a new tag.
        """
        wheels = wheel_digests(self.wheels) if self.wheels else {}
        return self._canonical(base_image_id, wheels, _installer_digest() if wheels else None)

    def digest(self, base_image_id: str) -> str:
        """The full SHA-256 (hex) of :meth:`canonical`; the image's ``agentnest.template`` label."""
        return digest_of(self.canonical(base_image_id))

    def tag_for(self, base_image_id: str) -> str:
        """The image tag of this spec built on the image with ID ``base_image_id``."""
        return tag_of(self.digest(base_image_id))

    @property
    def tag(self) -> str:
        """The content-addressed image tag: ``agentnest/template:<sha256-12>``.

        Asks the Docker engine for the base image's ID; see :meth:`tag_for` for the
        pure computation.
        """
        from .runtime.docker.builder import default_api, resolve_base

        return self.tag_for(resolve_base(default_api(), self.base))

    def _canonical(
        self, base_image_id: str, wheels: Mapping[str, str], installer: str | None
    ) -> dict[str, Any]:
        if not isinstance(base_image_id, str) or not base_image_id:
            raise ConfigurationError("base_image_id must be a non-empty image ID")
        return {
            "recipe": RECIPE_VERSION,
            "base": base_image_id,
            "apt_packages": list(self.apt_packages),
            "wheels": dict(sorted(wheels.items())),
            # Which pip installs the wheels when the base image has none.
            "installer": installer if wheels else None,
            "files": {path: _sha256(content_bytes(data)) for path, data in sorted(self.files.items())},
            "environment": dict(sorted(self.environment.items())),
            "commands": list(self.commands),
        }

    # -- building ------------------------------------------------------------

    def build(
        self,
        api: docker.APIClient | None = None,
        *,
        progress: ProgressCallback | None = None,
        force: bool = False,
    ) -> str:
        """Build the image unless it exists; return its tag.

        Args:
            api: a docker-py ``APIClient``; default: the ``docker`` backend's.
            progress: called with a :class:`BuildEvent` for each step and line
                of build output, and once with ``"cached"`` or ``"built"``.
            force: build even if the tag exists, without the engine's build cache.

        Returns:
            The tag, ``agentnest/template:<sha256-12>``, usable as ``Sandbox(image=...)``.

        Raises:
            ImageNotFoundError: the base image is missing and cannot be pulled.
            BackendError: the build failed; the message has the failing step's output.
            RuntimeNotAvailableError: no Docker engine.
        """
        from .runtime.docker.builder import build_template

        return build_template(self, api, progress=progress, force=force)

    # -- loading -------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], root: str | os.PathLike[str] | None = None) -> Template:
        """A template from plain data, as found in a JSON, TOML or YAML spec file.

        Keys are the field names.  A ``files`` value may be ``{"source": PATH}``
        instead of the content: the file is read now, relative to ``root``
        (default: the current directory), and so is a relative ``wheels`` path.
        """
        if not isinstance(data, Mapping):
            raise ConfigurationError("a template spec must be a mapping (a JSON object or TOML table)")
        unknown = sorted(set(data) - set(_SPEC_KEYS))
        if unknown:
            raise ConfigurationError(
                f"unknown template key(s) {', '.join(map(repr, unknown))}; known: {', '.join(_SPEC_KEYS)}"
            )
        here = Path(root) if root is not None else Path.cwd()
        kwargs: dict[str, Any] = {}
        if "base" in data:
            kwargs["base"] = data["base"]
        for key in ("apt_packages", "commands"):
            if key in data:
                value = data[key]
                if not isinstance(value, list):
                    raise ConfigurationError(f"{key} must be a list of strings")
                kwargs[key] = tuple(value)
        if data.get("wheels") is not None:
            wheels = data["wheels"]
            if not isinstance(wheels, str):
                raise ConfigurationError("wheels must be a directory path (a string)")
            kwargs["wheels"] = str(here / wheels)
        if "environment" in data:
            kwargs["environment"] = data["environment"]
        if "files" in data:
            kwargs["files"] = _files_from_spec(data["files"], here)
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Template:
        """A template from a spec file: ``.json``, ``.toml`` or ``.yaml``/``.yml``.

        Relative paths in it (``wheels``, ``files`` sources) are relative to the file.
        TOML needs Python 3.11 or ``tomli``; YAML needs ``pyyaml`` (the ``profiles`` extra).
        """
        spec = Path(path)
        try:
            raw = spec.read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read template spec {str(spec)!r}: {exc.strerror}") from None
        suffix = spec.suffix.lower()
        if suffix == ".json":
            try:
                data = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ConfigurationError(f"{spec}: not valid JSON: {exc}") from None
        elif suffix == ".toml":
            data = _parse_toml(raw, spec)
        elif suffix in (".yaml", ".yml"):
            data = _parse_yaml(raw, spec)
        else:
            raise ConfigurationError(
                f"{spec}: unknown spec format {suffix or '(no suffix)'!r}; use .json, .toml or .yaml"
            )
        return cls.from_dict(data, root=spec.resolve().parent)


def tag_of(digest: str) -> str:
    """The image tag for a spec digest."""
    return f"{TEMPLATE_REPOSITORY}:{digest[:12]}"


def content_bytes(data: str | bytes) -> bytes:
    """A file's content as bytes (``str`` as UTF-8)."""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def wheel_digests(directory: str | os.PathLike[str]) -> dict[str, str]:
    """File name -> SHA-256 of every ``.whl`` at the top of ``directory``."""
    return {p.name: file_sha256(p) for p in wheel_files(directory)}


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


def installer_wheel() -> Path | None:
    """A pip wheel on this host, used to install wheels into a base image without pip.

    Python's own ``ensurepip`` bundle first, then Debian's ``python3-pip-whl``.
    """
    candidates: list[Path] = []
    try:
        import ensurepip

        candidates += sorted(Path(ensurepip.__file__).parent.joinpath("_bundled").glob("pip-*.whl"))
    except ImportError:  # pragma: no cover - Debian's python3 without python3-venv
        pass
    candidates += sorted(Path("/usr/share/python-wheels").glob("pip-*.whl"))
    return candidates[0] if candidates else None


def _installer_digest() -> str | None:
    wheel = installer_wheel()
    return file_sha256(wheel) if wheel else None


def digest_of(canonical: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of a canonical spec, serialised as sorted, compact, ASCII JSON."""
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- validation -------------------------------------------------------------------------


def _strings(value: object, what: str) -> tuple[str, ...]:
    # A bare string is a sequence of characters: refuse it rather than install "j", "q".
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigurationError(f"{what} must be a list or tuple of strings, not {type(value).__name__}")
    for item in value:
        if not isinstance(item, str):
            raise ConfigurationError(f"{what} must hold strings, not {type(item).__name__} ({item!r})")
    return tuple(value)


def _packages(value: object) -> tuple[str, ...]:
    out = set()
    for spec in _strings(value, "apt_packages"):
        name, sep, version = spec.partition("=")
        if not _DEB_NAME.match(name):
            raise ConfigurationError(
                f"apt package {spec!r} is not a Debian package name: use lower case letters, digits, "
                "'+', '-' and '.', at least two characters, starting with a letter or digit"
            )
        if sep and not _DEB_VERSION.match(version):
            raise ConfigurationError(
                f"apt package {spec!r} has an invalid version: it must start with a digit and use "
                "letters, digits and '.+~:-'"
            )
        out.add(spec)
    return tuple(sorted(out))


def _wheel_dir(value: object) -> str | None:
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


def _files(value: object) -> Mapping[str, str | bytes]:
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


def _environment(value: object) -> Mapping[str, str]:
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


def _commands(value: object) -> tuple[str, ...]:
    commands = _strings(value, "commands")
    for command in commands:
        if not command.strip():
            raise ConfigurationError("commands must not be empty")
        if "\x00" in command:
            raise ConfigurationError(f"command {command[:40]!r} contains a NUL byte")
    return commands


# -- spec files -------------------------------------------------------------------------


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
    "LABEL",
    "LABEL_BASE",
    "RECIPE_VERSION",
    "TEMPLATE_REPOSITORY",
    "BuildEvent",
    "ProgressCallback",
    "Template",
    "content_bytes",
    "digest_of",
    "file_sha256",
    "installer_wheel",
    "tag_of",
    "wheel_digests",
]
