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
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ._aliases import deprecated, renamed
from .errors import ConfigurationError, RuntimeNotAvailableError, TemplateBuildError

# MIRROR_ARG, STAGING and wheel_files: re-exported for the engine's builder.
from .template_recipe import MIRROR_ARG as MIRROR_ARG
from .template_recipe import RECIPE_VERSION, render_dockerfile
from .template_recipe import STAGING as STAGING
from .template_values import (
    check_commands,
    check_environment,
    check_files,
    check_packages,
    check_requirements,
    check_wheel_dir,
    check_wheels_cover,
    read_spec,
    spec_arguments,
)
from .template_values import wheel_files as wheel_files

if TYPE_CHECKING:
    import docker

#: Repository of every template image; the tag is the spec's digest.
TEMPLATE_REPOSITORY = "agentnest/template"
#: Label on every template image: the full SHA-256 of its canonical spec.
LABEL = "agentnest.template"
#: Label on every template image: the ID of the image it was built on.
LABEL_BASE = "agentnest.template.base"

# An image reference one can tag (github.com/distribution/reference): [domain[:port]/]path[:tag].
_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
)
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG_REFERENCE = re.compile(
    rf"(?P<repository>(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*)(?::(?P<tag>[\w][\w.-]{{0,127}}))?", re.ASCII
)


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
        set_(self, "pip_packages", check_requirements(pip_packages))
        set_(self, "apt_packages", check_packages(apt_packages))
        set_(self, "environment", check_environment({} if environment is None else environment))
        set_(self, "commands", check_commands(commands))
        set_(self, "wheels", check_wheel_dir(wheels))
        set_(self, "files", check_files({} if files is None else files))
        if self.pip_packages and self.wheels:
            check_wheels_cover(self.pip_packages, self.wheels)

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
        return cls(**spec_arguments(data, Path(root) if root is not None else Path.cwd()))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Template:
        """A template from a spec file: ``.json``, ``.toml`` or ``.yaml``/``.yml``.

        Relative paths in it (``wheels``, ``files`` sources) are relative to the file.
        TOML needs Python 3.11 or ``tomli``; YAML needs ``pyyaml`` (the ``profiles`` extra).
        """
        spec = Path(path)
        data = read_spec(spec)
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
