"""``Template``: a sandbox image described as data, built once per content.

A template names a base image and what to add to it: Debian packages, Python
packages from a local directory of wheels, files, environment values and
build commands.  Its tag is content-addressed::

    agentnest/template:<first 12 hex digits of sha256(canonical spec)>

where the canonical spec holds the recipe version, the base image's *ID* (not
its name, so a rebuilt base gives new template tags), the sorted package
names and pip requirements, the SHA-256 of every wheel and file, the
environment and the commands.
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

0.3.0's builder calls mean the same here, built the same way::

    tag = (
        Template(wheels="wheelhouse/")        # pip installs come from local wheels only
        .apt_install("jq")
        .pip_install("requests==2.32.3")
        .with_environment(MODE="test")
        .run("jq --version > /etc/jq-version")
        .build()
    )

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import posixpath
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ._aliases import deprecated, renamed
from .errors import (
    ConfigurationError,
    MissingDependencyError,
    RuntimeNotAvailableError,
    TemplateBuildError,
)
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
# A pip requirement (PEP 508) without markers, URLs or spaces: a project name
# (PEP 508's), optional extras, optional comma-separated version specifiers.
_PIP_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PIP_SPECIFIER = r"(?:===|==|!=|~=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+"
_REQUIREMENT = re.compile(
    rf"({_PIP_NAME})(?:\[{_PIP_NAME}(?:,{_PIP_NAME})*\])?(?:{_PIP_SPECIFIER}(?:,{_PIP_SPECIFIER})*)?"
)
# An image reference one can tag (github.com/distribution/reference): [domain[:port]/]path[:tag].
_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
)
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG_REFERENCE = re.compile(
    rf"(?P<repository>(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*)(?::(?P<tag>[\w][\w.-]{{0,127}}))?", re.ASCII
)
#: Control characters a Dockerfile line cannot carry (tab is fine).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

#: Mounted empty (tmpfs) or provided by the kernel when a sandbox starts:
#: a file put there at build time would be hidden at run time.
_HIDDEN_AT_RUN_TIME = ("/workspace", "/tmp", "/proc", "/sys", "/dev")
#: Set by the sandbox for every command; a value baked into the image would be overridden.
_SET_BY_SANDBOX = frozenset({"PATH", "HOME", "LANG", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})

_SPEC_KEYS = ("base_image", "pip_packages", "apt_packages", "environment", "commands", "wheels", "files")


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


class TemplateEngine(Protocol):
    """The engine side of a template, as :class:`Template` asks for it.

    The spec is pure; naming the default base image, finding a base's ID and
    building belong to an engine.  The ``docker`` backend's builder
    (:mod:`agentnest.runtime.docker.builder`) is the one AgentNest has: the
    runtime registry hands it down with :func:`use_engine` (``import
    agentnest`` does), so this module imports nothing from ``runtime/``.

    .. versionadded:: 0.4.0
    """

    def default_base(self) -> str:
        """The default base image's reference (AgentNest's default image)."""
        ...

    def base_id(self, base: str) -> str:
        """The ID of image ``base`` on the default engine (pulled if missing)."""
        ...

    def build(
        self,
        template: Template,
        reference: tuple[str, str] | None,
        *,
        api: Any,
        progress: ProgressCallback | None,
        force: bool,
    ) -> str:
        """Build ``template`` (with ``api``, or the default engine's when None), also tag it
        ``reference`` (``(repository, tag)``) when given; return its content-addressed tag.

        Raises the errors :meth:`Template.build` documents.
        """
        ...


_engine_factory: Callable[[], TemplateEngine] | None = None


def use_engine(factory: Callable[[], TemplateEngine]) -> None:
    """Make ``factory`` (called on each use, so it may import lazily) the template engine."""
    global _engine_factory
    _engine_factory = factory


def _engine() -> TemplateEngine:
    if _engine_factory is None:  # pragma: no cover - agentnest.runtime hands one down at import
        raise RuntimeNotAvailableError(
            "no template engine: import agentnest (its runtime registry names one)"
        )
    return _engine_factory()


def _default_base() -> str:
    return _engine().default_base()


@dataclass(frozen=True, slots=True, init=False)
class Template:
    """A deterministic image build: base image plus packages, wheels, files, environment, commands.

    The build runs in this order, as root: Debian packages, Python packages
    (from local wheels only: builds are offline), files, environment,
    commands; the image then ends with ``USER 65532:65532`` and
    ``WORKDIR /workspace``, like the default image.  Values are validated
    here, so an invalid spec never reaches the engine.

    The first five parameters keep 0.3.0's positions, ``Template(base_image,
    packages, system_packages, environment, commands)``; 0.3.0's
    ``packages=`` and ``system_packages=`` keywords are accepted (deprecated)
    for ``pip_packages=`` and ``apt_packages=``.  A template is frozen: the
    builder methods (:meth:`apt_install`, :meth:`pip_install`, :meth:`run`,
    :meth:`with_environment`) return a new one.

    Args:
        base_image: image to build on; ``None``: AgentNest's default image.
        pip_packages: pip requirements (``"requests==2.32.3"``), installed
            from ``wheels`` with ``pip --no-index``.
        apt_packages: Debian packages (``"jq"``, ``"jq=1.6-2.1+deb12u2"``).
        environment: ``ENV`` values baked into the image.
        commands: shell commands run as root at build time, in order.
        wheels: a local directory of ``.whl`` files.
        files: absolute destination path in the image -> content.
        packages: 0.3.0's name of ``pip_packages`` (deprecated).
        system_packages: 0.3.0's name of ``apt_packages`` (deprecated).

    Raises:
        ConfigurationError: a value is invalid; the message says which and why.
        TypeError: a 0.3.0 keyword and its new name were both given.

    .. versionchanged:: 0.4.0
       Content-addressed offline builds; ``wheels``, ``files``; ``pip_packages``
       and ``apt_packages`` for 0.3.0's ``packages`` and ``system_packages``.
    """

    base_image: str
    """Image to build on (default: AgentNest's default image).  Must be on the
    engine or pullable; its ID, not its name, enters the tag."""
    pip_packages: tuple[str, ...]
    """pip requirements: a name with optional ``[extras]`` and version specifiers
    (``"requests"``, ``"requests[socks]>=2,<3"``).  A build reaches no package
    index, so they are resolved from ``wheels`` only (``pip install --no-index
    --find-links``), dependencies included; without ``wheels`` :meth:`build`
    refuses them and says how to get the wheels.  Kept sorted and de-duplicated."""
    apt_packages: tuple[str, ...]
    """Debian packages, installed with ``apt-get install --no-install-recommends``
    from the base image's apt sources.  ``name`` or ``name=version``.  Order does
    not matter: they are kept sorted and de-duplicated."""
    environment: Mapping[str, str]
    """Environment baked into the image (``ENV``), visible to ``commands`` and to
    every sandbox command.  Values are taken verbatim (``$HOME`` is not expanded).
    Never secrets: ``Secret`` values are refused."""
    commands: tuple[str, ...]
    """Shell commands (``/bin/sh -c``) run at build time as root, in order, after
    everything else is in place; each is one build step."""
    wheels: str | None
    """A local directory of ``.whl`` files.  Without ``pip_packages`` every wheel
    at its top level is installed; with them, the directory is where they (and
    their dependencies) are found, and only what they need is installed.  Offline
    either way.  Their content, not the path, enters the tag."""
    files: Mapping[str, str | bytes]
    """Absolute destination path in the image -> content (``str`` is written as
    UTF-8).  Contents, not host paths: the spec carries what it installs, and the
    tag hashes exactly that.  Files are owned by root, mode 0644; missing parent
    directories are created (root, 0755) and existing ones are left as they are."""

    def __init__(
        self,
        base_image: str | None = None,
        pip_packages: Sequence[str] = (),
        apt_packages: Sequence[str] = (),
        environment: Mapping[str, str] | None = None,
        commands: Sequence[str] = (),
        *,
        wheels: str | os.PathLike[str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        packages: Sequence[str] = (),
        system_packages: Sequence[str] = (),
    ) -> None:
        if packages != ():
            pip_packages = _renamed("packages", packages, "pip_packages", pip_packages)
        if system_packages != ():
            apt_packages = _renamed("system_packages", system_packages, "apt_packages", apt_packages)
        if base_image is None:
            base_image = _default_base()
        if not isinstance(base_image, str) or not base_image or re.search(r"\s", base_image):
            raise ConfigurationError(f"base_image={base_image!r} is not an image reference")
        set_ = object.__setattr__  # frozen: the one place fields are written
        set_(self, "base_image", base_image)
        set_(self, "pip_packages", _requirements(pip_packages))
        set_(self, "apt_packages", _packages(apt_packages))
        set_(self, "environment", _environment(MappingProxyType({}) if environment is None else environment))
        set_(self, "commands", _commands(commands))
        set_(self, "wheels", _wheel_dir(wheels))
        set_(self, "files", _files(MappingProxyType({}) if files is None else files))
        if self.pip_packages and self.wheels:
            _check_wheels_cover(self.pip_packages, self.wheels)

    def __hash__(self) -> int:
        # The generated hash would fail on the mappings; hash their frozen items instead.
        return hash(
            (
                self.base_image,
                self.pip_packages,
                self.apt_packages,
                tuple(self.environment.items()),
                self.commands,
                self.wheels,
                tuple(self.files.items()),
            )
        )

    # -- 0.3.0 names ---------------------------------------------------------

    @property
    def packages(self) -> tuple[str, ...]:
        """0.3.0's name of :attr:`pip_packages`.

        .. deprecated:: 0.4.0
           Use :attr:`pip_packages`.
        """
        deprecated("Template.packages", "Template.pip_packages")
        return self.pip_packages

    @property
    def system_packages(self) -> tuple[str, ...]:
        """0.3.0's name of :attr:`apt_packages`.

        .. deprecated:: 0.4.0
           Use :attr:`apt_packages`.
        """
        deprecated("Template.system_packages", "Template.apt_packages")
        return self.apt_packages

    # -- builder methods -----------------------------------------------------

    def apt_install(self, *packages: str) -> Template:
        """A copy with Debian ``packages`` added (each may hold several, space separated).

        Returns:
            A new template; this one is unchanged.
        """
        return dataclasses.replace(self, apt_packages=self.apt_packages + packages)

    def pip_install(self, *packages: str) -> Template:
        """A copy with pip requirements added; see :attr:`pip_packages` (they need ``wheels``).

        Returns:
            A new template; this one is unchanged.
        """
        return dataclasses.replace(self, pip_packages=self.pip_packages + packages)

    def run(self, *commands: str) -> Template:
        """A copy with build ``commands`` appended (run as root, in order, after the rest).

        Returns:
            A new template; this one is unchanged.
        """
        return dataclasses.replace(self, commands=self.commands + commands)

    def with_environment(self, **environment: str) -> Template:
        """A copy with ``environment`` merged over this one's (a name given again is replaced).

        Returns:
            A new template; this one is unchanged.
        """
        return dataclasses.replace(self, environment={**self.environment, **environment})

    def dockerfile(self) -> str:
        """The Dockerfile :meth:`build` runs for this spec, with the base named as given.

        The build itself pins the base by its image ID (``FROM sha256:...``);
        ``ADD wheels.tar`` and ``ADD files.tar`` refer to archives :meth:`build`
        stages in the build context.  No engine is asked.

        Returns:
            The Dockerfile's text.
        """
        text, _ = render_dockerfile(self, self.base_image, installer=self.wheels is not None)
        return text

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
        return self.tag_for(_engine().base_id(self.base_image))

    def _canonical(
        self, base_image_id: str, wheels: Mapping[str, str], installer: str | None
    ) -> dict[str, Any]:
        if not isinstance(base_image_id, str) or not base_image_id:
            raise ConfigurationError("base_image_id must be a non-empty image ID")
        canonical: dict[str, Any] = {
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
        if self.pip_packages:
            # Only when used, so that every tag from before pip_packages existed stays valid.
            canonical["pip_packages"] = list(self.pip_packages)
        return canonical

    # -- building ------------------------------------------------------------

    def build(
        self,
        tag: str | None = None,
        *,
        client: docker.DockerClient | None = None,
        api: docker.APIClient | None = None,
        progress: ProgressCallback | None = None,
        force: bool = False,
    ) -> str:
        """Build the image unless it exists; return its tag.

        The image is always tagged with its content-addressed tag
        (``agentnest/template:<sha256-12>``, see :attr:`tag`); ``tag`` adds a
        name of your choice, as 0.3.0 did.

        Args:
            tag: also tag the image with this reference (``"my/agent:1"``) and
                return it.  Default: return the content-addressed tag.
            client: a docker-py ``DockerClient`` (``docker.from_env()``), as in 0.3.0.
            api: a docker-py ``APIClient``.  At most one of ``client`` and
                ``api``; default: the ``docker`` backend's.
            progress: called with a :class:`BuildEvent` for each step and line
                of build output, and once with ``"cached"`` or ``"built"``.
            force: build even if the tag exists, without the engine's build cache.

        Returns:
            ``tag`` if given, else ``agentnest/template:<sha256-12>``; either is
            usable as ``Sandbox(image=...)``.

        Raises:
            ConfigurationError: ``tag``, ``client`` or ``api`` is not what it should be.
            TemplateBuildError: a step failed (the message has its output), or
                ``pip_packages`` were given without ``wheels``.
            TemplateBaseNotFoundError: the base image is missing and cannot be pulled.
            RuntimeNotAvailableError: no Docker engine.
        """
        reference = _image_tag(tag) if tag is not None else None
        engine = _engine_api(client, api)
        if self.pip_packages and not self.wheels:
            raise TemplateBuildError(_offline_pip_hint(self.pip_packages))
        content_tag = _engine().build(self, reference, api=engine, progress=progress, force=force)
        return tag if tag is not None else content_tag

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


# -- the Dockerfile (pure: the engine's builder runs it) ---------------------------------

#: Where wheels are staged inside the image during the build (deleted afterwards).
STAGING = "/tmp/agentnest-wheels"
#: Build argument with this machine's Debian mirror, for images without apt sources.
MIRROR_ARG = "AGENTNEST_APT_MIRROR"


def _run(script: str) -> str:
    # Exec form: the script reaches /bin/sh as one argument, with no Dockerfile
    # variable expansion or line continuation to get wrong.
    return "RUN " + json.dumps(["/bin/sh", "-c", script])


def _env_value(value: str) -> str:
    # Inside double quotes the Dockerfile parser unescapes \\, \" and \$ only.
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def _apt_script(packages: Sequence[str]) -> str:
    return "\n".join(
        [
            "set -eu",
            "if ! command -v apt-get >/dev/null 2>&1; then",
            "  echo 'agentnest: the base image has no apt-get; apt_packages need a Debian-based image' >&2",
            "  exit 100",
            "fi",
            # An image without sources (some minimal images) gets this machine's mirror.
            "if ! grep -qsE '^[[:space:]]*(deb[[:space:]]|URIs:)' "
            "/etc/apt/sources.list /etc/apt/sources.list.d/*; then",
            "  . /etc/os-release",
            f'  echo "deb ${MIRROR_ARG} ${{VERSION_CODENAME:?cannot tell the Debian release}} main"'
            " > /etc/apt/sources.list",
            '  echo "agentnest: the image has no apt sources; using $(cat /etc/apt/sources.list)"',
            "fi",
            "export DEBIAN_FRONTEND=noninteractive",
            "apt-get update",
            "apt-get install -y --no-install-recommends " + " ".join(shlex.quote(p) for p in packages),
            "apt-get clean",
            "rm -rf /var/lib/apt/lists/*",
        ]
    )


def _pip_script(requirements: Sequence[str] = ()) -> str:
    wheels = f"{STAGING}/wheels"
    # Requirements are resolved from the staged wheels; without any, every wheel is installed.
    targets = " ".join(shlex.quote(r) for r in requirements) if requirements else f"{wheels}/*.whl"
    return "\n".join(
        [
            "set -eu",
            "if python3 -m pip --version >/dev/null 2>&1; then :",
            f"elif [ -f {STAGING}/installer/pip.whl ]; then export PYTHONPATH={STAGING}/installer/pip.whl",
            "else",
            "  echo 'agentnest: the base image has no pip and this host has no pip wheel to lend it; "
            "add python3-pip to apt_packages' >&2",
            "  exit 100",
            "fi",
            # Offline, into the system's site-packages (an image is its own environment,
            # hence PEP 668's guard is lifted), with no cache left in the layer.
            "export PIP_NO_INDEX=1 PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore "
            "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1",
            f"python3 -m pip install --no-index --find-links {wheels} {targets}",
            f"rm -rf {STAGING}",
        ]
    )


def render_dockerfile(template: Template, base_image_id: str, *, installer: bool) -> tuple[str, list[str]]:
    """The Dockerfile for ``template`` on ``base_image_id``, and one description per instruction.

    ``installer`` says whether the context carries a pip wheel for images without pip.
    """
    lines: list[tuple[str, str]] = [
        (f"FROM {base_image_id}", f"base image {base_image_id.removeprefix('sha256:')[:12]}"),
        ("USER root", "build steps run as root"),
    ]
    if template.apt_packages:
        count = len(template.apt_packages)
        lines.append((f"ARG {MIRROR_ARG}", "Debian mirror for images without apt sources"))
        lines.append(
            (
                _run(_apt_script(template.apt_packages)),
                f"install {count} Debian package{'s' * (count != 1)}: {' '.join(template.apt_packages)}",
            )
        )
    if template.wheels:
        lines.append(("ADD wheels.tar /", "add the wheels"))
    if template.pip_packages:
        listed = " ".join(template.pip_packages)
        lines.append((_run(_pip_script(template.pip_packages)), f"pip install (offline): {listed}"[:120]))
    elif template.wheels:
        lines.append((_run(_pip_script()), "install the wheels with pip (offline)"))
    if template.files:
        count = len(template.files)
        lines.append(("ADD files.tar /", f"add {count} file{'s' * (count != 1)}"))
    if template.environment:
        pairs = " ".join(f"{k}={_env_value(v)}" for k, v in template.environment.items())
        lines.append((f"ENV {pairs}", f"set {', '.join(template.environment)}"))
    for command in template.commands:
        first = command.strip().splitlines()[0]
        lines.append((_run(command), f"run: {first[:100]}"))
    lines.append(("USER 65532:65532", "sandbox user 65532"))
    lines.append(("WORKDIR /workspace", "working directory /workspace"))
    header = f"# Generated by AgentNest (template recipe {RECIPE_VERSION}); do not edit.\n"
    return header + "".join(f"{line}\n" for line, _ in lines), [what for _, what in lines]


# -- 0.3.0 compatibility ----------------------------------------------------------------


def _renamed(old: str, value: Sequence[str], new: str, current: Sequence[str]) -> Sequence[str]:
    """``value`` of the 0.3.0 keyword ``old``, unless ``new`` was given as well."""
    given = not (isinstance(current, Sequence) and len(current) == 0)
    return renamed(current, value, new, old, ours_given=given, where="Template()", stacklevel=4)


def _engine_api(client: object, api: object) -> Any:
    """The ``APIClient`` to build with: ``api``, a ``DockerClient``'s, or ``None`` (the default)."""
    if client is not None and api is not None:
        raise ConfigurationError("build() takes client= (a DockerClient) or api= (an APIClient), not both")
    if client is not None:
        # A docker.DockerClient carries its low-level APIClient as .api.
        inner = getattr(client, "api", None)
        if inner is None or not callable(getattr(inner, "build", None)):
            raise ConfigurationError(
                f"client= takes a docker.DockerClient (docker.from_env()), not {type(client).__name__}; "
                "pass a docker.APIClient as api="
            )
        return inner
    if api is not None and not callable(getattr(api, "build", None)):
        raise ConfigurationError(f"api= takes a docker.APIClient, not {type(api).__name__}")
    return api


def _image_tag(tag: object) -> tuple[str, str]:
    """``tag`` as ``(repository, tag)``; ``latest`` when it names none, as ``docker tag`` does."""
    if not isinstance(tag, str):
        # Ours took the APIClient first before 0.3.0's tag took that place.
        raise ConfigurationError(
            f"build(tag) takes an image tag such as 'my/agent:1', not {type(tag).__name__}; "
            "pass an APIClient as build(api=...) or a DockerClient as build(client=...)"
        )
    match = _TAG_REFERENCE.fullmatch(tag)
    if match is None or len(tag) > 255:
        raise ConfigurationError(
            f"build(tag={tag!r}): not an image tag; use [registry/]name[:tag] with a lower-case "
            "name, such as 'my/agent:1' (no digest: a digest names content, it cannot be assigned)"
        )
    repository, name = match.group("repository"), match.group("tag") or "latest"
    if repository == TEMPLATE_REPOSITORY:
        raise ConfigurationError(
            f"build(tag={tag!r}): {TEMPLATE_REPOSITORY} holds content-addressed tags only; "
            "choose another name, or leave tag out to get the content-addressed one"
        )
    return repository, name


def _offline_pip_hint(requirements: Sequence[str]) -> str:
    listed = " ".join(requirements)
    return (
        f"the template's pip packages ({listed}) cannot be installed: template builds are "
        "offline (no package index is reachable from a build), so pip installs only from a "
        "local directory of wheels. Download them, with their dependencies, where an index is "
        f"reachable: `pip download --only-binary=:all: -d wheels {listed}` (for the image's "
        "Python; the default image has Debian's Python 3.11), then build "
        "Template(..., wheels='wheels').pip_install(...): pip installs them with --no-index"
    )


# -- validation -------------------------------------------------------------------------


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


def _packages(value: object) -> tuple[str, ...]:
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


def _requirements(value: object) -> tuple[str, ...]:
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


def _check_wheels_cover(requirements: Sequence[str], directory: str) -> None:
    """Refuse a requirement that no wheel in ``directory`` can satisfy by name."""
    present = {_distribution(p.name.split("-", 1)[0]) for p in wheel_files(directory)}
    missing = []
    for spec in requirements:
        match = _REQUIREMENT.fullmatch(spec)
        assert match is not None  # checked by _requirements
        if _distribution(match.group(1)) not in present:
            missing.append(spec)
    if missing:
        listed = " ".join(missing)
        raise ConfigurationError(
            f"pip package{'s' * (len(missing) != 1)} {listed} ha{'ve' if len(missing) != 1 else 's'} "
            f"no wheel in {directory!r}, and builds are offline; add them with their dependencies: "
            f"`pip download --only-binary=:all: -d {directory} {listed}`"
        )


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
    "TemplateEngine",
    "content_bytes",
    "digest_of",
    "file_sha256",
    "installer_wheel",
    "render_dockerfile",
    "tag_of",
    "use_engine",
    "wheel_digests",
]
