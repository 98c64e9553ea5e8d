"""Build a :class:`~agentnest.templates.Template` with the engine's (classic) builder.

The engine side of templates (:class:`DockerTemplateEngine`, handed down to
:mod:`agentnest.templates` by the runtime registry): the default base's name,
a base's ID, building and tagging.  The spec becomes the Dockerfile that
:func:`agentnest.templates.render_dockerfile` writes (pure) and a build
context (a tar) in a temporary directory; nothing is pulled from a registry but the base image,
and only when it is missing.  The recipe, in build order:

1. ``FROM <base image ID>``: the ID the tag was computed from, so the image
   is built on exactly that base even if its name moves meanwhile.
2. ``apt-get update && apt-get install -y --no-install-recommends`` against
   the base image's own apt sources (the default image's point at the mirror
   it was debootstrapped from); an image without sources gets one line for
   this machine's mirror (:func:`~agentnest.runtime.docker.images.apt_mirror`),
   passed as a build argument.  The package lists are removed in the same step.
3. Wheels: ``ADD`` of a tar holding them, then ``pip install --no-index
   --find-links`` with the image's pip, or with the host's bundled pip wheel
   (run from the zip, not installed) when the image has none.  The staged
   wheels are deleted, but stay in the ``ADD`` layer: the image grows by
   their size (the classic builder has no build-time mounts).
4. Files: ``ADD`` of a tar with *file entries only*, so that parent
   directories that exist keep their owner and mode (a directory entry would
   reset ``/etc`` or ``/usr/local`` to whatever the tar says).
5. ``ENV``, then each command as its own ``RUN``, so progress shows them.
6. ``USER 65532:65532`` and ``WORKDIR /workspace``, as the default image.

A failed build removes the layers it left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import shutil
import tarfile
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import (
    BackendError,
    ConfigurationError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    TemplateBaseNotFoundError,
    TemplateBuildError,
)
from ...templates import (
    LABEL,
    LABEL_BASE,
    MIRROR_ARG,
    STAGING,
    BuildEvent,
    ProgressCallback,
    content_bytes,
    digest_of,
    file_sha256,
    installer_wheel,
    render_dockerfile,
    tag_of,
    wheel_digests,
    wheel_files,
)
from .engine import map_docker_errors

if TYPE_CHECKING:
    from ...templates import Template

#: Modification time of added files: fixed, so the same content makes the same layer.
_MTIME = 315532800  # 1980-01-01, the earliest time a zip file can hold
#: Output lines of the current step kept for the error message if it fails.
_TAIL = 25
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_LAYER = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
_BOOKKEEPING = re.compile(
    r"^( ---> Running in [0-9a-f]+| ---> Using cache|Removing intermediate container [0-9a-f]+"
    r"|Successfully built [0-9a-f]+|Successfully tagged \S+)$"
)
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def resolve_base(api: Any, base: str) -> str:
    """The ID of image ``base``, pulled first if it is missing (never the default image)."""
    import docker.errors

    from .images import BASE_REPOSITORY, split_ref

    try:
        with map_docker_errors("looking up the template's base image", base):
            return str(api.inspect_image(base)["Id"])
    except ImageNotFoundError:
        if base.startswith(BASE_REPOSITORY + ":"):
            raise
    repo, tag = split_ref(base)
    try:
        api.pull(repo, tag=tag)
    except (docker.errors.APIError, docker.errors.DockerException, OSError):
        raise ImageNotFoundError(
            f"the template's base image {base!r} is not on this engine and could not be pulled; "
            "pull or build it first (`docker pull`, `docker load`, `agentnest image base`)"
        ) from None
    with map_docker_errors("looking up the template's base image", base):
        return str(api.inspect_image(base)["Id"])


def add_tag(api: Any, image: str, repository: str, name: str) -> None:
    """Tag ``image`` as ``repository:name`` (the name moves here if another image had it)."""
    with map_docker_errors(f"tagging {image} as {repository}:{name}", image):
        # force: the name moves to this image if another had it, as `docker tag` does.
        if api.tag(image, repository, name, force=True) is False:
            raise BackendError(f"the engine did not tag {image} as {repository}:{name}")


class DockerTemplateEngine:
    """The :class:`~agentnest.templates.TemplateEngine` of the ``docker`` backend.

    What ``Template.build()``, ``Template.tag`` and ``Template()``'s default base
    ask for; the runtime registry hands it to :mod:`agentnest.templates`, with
    ``default_api``: the docker-py ``APIClient`` to use when the caller gives none
    (the shared ``docker`` backend's), asked only when needed.
    """

    def __init__(self, default_api: Callable[[], Any]) -> None:
        self.default_api = default_api

    def default_base(self) -> str:
        from .images import base_image

        return base_image()

    def base_id(self, base: str) -> str:
        return resolve_base(self.default_api(), base)

    def build(
        self,
        template: Template,
        reference: tuple[str, str] | None,
        *,
        api: Any,
        progress: ProgressCallback | None,
        force: bool,
    ) -> str:
        try:
            engine = api if api is not None else self.default_api()
            content_tag = build_template(template, engine, progress=progress, force=force)
            if reference is not None:
                add_tag(engine, content_tag, *reference)
        except (RuntimeNotAvailableError, ConfigurationError):
            raise  # no engine (a TemplateBuildError already), or a bad value: as they are
        except ImageNotFoundError as exc:
            raise TemplateBaseNotFoundError(str(exc)) from exc
        except BackendError as exc:
            raise TemplateBuildError(str(exc)) from exc
        return content_tag


# -- the build context and the build --------------------------------------------------


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = _MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def _add_file(tar: tarfile.TarFile, name: str, path: Path) -> None:
    info = tarfile.TarInfo(name)
    info.size = path.stat().st_size
    info.mode = 0o644
    info.mtime = _MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    with path.open("rb") as f:
        tar.addfile(info, f)


def _stage_wheels(template: Template, tmp: Path) -> tuple[dict[str, str], Path | None]:
    """Copy the wheels (and the host's pip wheel) into ``tmp``; hash the copies.

    Hashing the copies, not the originals, makes the tag name exactly what is built.
    """
    if not template.wheels:
        return {}, None
    staged = tmp / "wheels"
    staged.mkdir()
    for wheel in wheel_files(template.wheels):
        shutil.copyfile(wheel, staged / wheel.name)
    installer = installer_wheel()
    staged_installer = None
    if installer is not None:
        staged_installer = tmp / "pip.whl"
        shutil.copyfile(installer, staged_installer)
    return wheel_digests(staged), staged_installer


def _write_context(
    path: Path, dockerfile: str, template: Template, tmp: Path, installer: Path | None
) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as context:
        _add_bytes(context, "Dockerfile", dockerfile.encode("utf-8"))
        if template.files:
            # Only file entries: see the module docstring.
            buffer = tmp / "files.tar"
            with tarfile.open(buffer, "w", format=tarfile.PAX_FORMAT) as files:
                for dest, data in template.files.items():
                    _add_bytes(files, dest.lstrip("/"), content_bytes(data))
            _add_file(context, "files.tar", buffer)
        if template.wheels:
            buffer = tmp / "wheels.tar"
            staging = STAGING.lstrip("/")
            with tarfile.open(buffer, "w", format=tarfile.PAX_FORMAT) as wheels:
                for wheel in sorted((tmp / "wheels").iterdir()):
                    _add_file(wheels, f"{staging}/wheels/{wheel.name}", wheel)
                if installer is not None:
                    _add_file(wheels, f"{staging}/installer/pip.whl", installer)
            _add_file(context, "wheels.tar", buffer)


# -- building ---------------------------------------------------------------------------


def _existing(api: Any, tag: str) -> dict[str, Any] | None:
    import docker.errors

    with map_docker_errors("looking up the template image"):
        try:
            return dict(api.inspect_image(tag))
        except docker.errors.NotFound:  # ImageNotFound is one
            return None


def _lines(chunks: Iterator[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Whole lines of the build stream, and the chunks that carry no text (errors, aux)."""
    partial = ""
    for chunk in chunks:
        text = chunk.get("stream")
        if not isinstance(text, str):
            if partial:
                yield partial, {}
                partial = ""
            yield "", chunk
            continue
        partial += text
        *complete, partial = partial.split("\n")
        for line in complete:
            yield line.rstrip("\r"), {}
    if partial:
        yield partial, {}


@contextlib.contextmanager
def _build_lock(digest: str) -> Iterator[None]:
    """Serialise builds of one spec on this host, so that a second waits and finds it built.

    Best effort: where the lock file cannot be opened (another user's, a
    symlink planted in the shared temp directory), builds are not serialised.
    """
    path = os.path.join(tempfile.gettempdir(), f"agentnest-template-{digest[:16]}.lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        # Leave no file behind.  A build that waited on this (now unlinked) file
        # and one that opens a new file may then run side by side; both look
        # for the image first, so they only build twice if this build failed.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)  # releases the lock


def build_template(
    template: Template,
    api: Any,
    *,
    progress: ProgressCallback | None = None,
    force: bool = False,
) -> str:
    """Build ``template`` with docker-py ``APIClient`` ``api`` unless its tag exists with a
    matching label; return the tag.

    See :meth:`agentnest.templates.Template.build`.
    """
    emit: Callable[[BuildEvent], None] = progress or (lambda _event: None)
    base_id = resolve_base(api, template.base_image)
    with tempfile.TemporaryDirectory(prefix="agentnest-template-") as tmp_name:
        tmp = Path(tmp_name)
        wheel_hashes, installer = _stage_wheels(template, tmp)
        installer_hash = file_sha256(installer) if installer is not None else None
        digest = digest_of(template._canonical(base_id, wheel_hashes, installer_hash))
        tag = tag_of(digest)
        short_base = base_id.removeprefix("sha256:")[:12]
        emit(BuildEvent("resolved", f"{tag} (spec {digest[:12]} on base {short_base})"))
        with _build_lock(digest):
            found = _existing(api, tag)
            if found is not None and not force:
                labels = (found.get("Config") or {}).get("Labels") or {}
                if labels.get(LABEL) == digest:
                    emit(BuildEvent("cached", f"{tag} exists: nothing to build"))
                    return tag
                emit(BuildEvent("output", f"{tag} exists but was not built from this spec: rebuilding"))
            dockerfile, steps = render_dockerfile(template, base_id, installer=installer is not None)
            context = tmp / "context.tar"
            _write_context(context, dockerfile, template, tmp, installer)
            previous = str(found["Id"]) if found is not None else None
            _run_build(api, context, tag, digest, base_id, steps, template, emit, force, previous)
    return tag


def _run_build(
    api: Any,
    context: Path,
    tag: str,
    digest: str,
    base_id: str,
    steps: list[str],
    template: Template,
    emit: Callable[[BuildEvent], None],
    force: bool,
    previous: str | None,
) -> None:
    from .images import apt_mirror

    buildargs = {MIRROR_ARG: apt_mirror()} if template.apt_packages else None
    tail: deque[str] = deque(maxlen=_TAIL)
    layers: list[str] = []
    step = total = 0
    failure: str | None = None
    with map_docker_errors(f"building {tag}", template.base_image), context.open("rb") as body:
        stream = api.build(
            fileobj=body,
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            decode=True,
            pull=False,
            nocache=force,
            labels={LABEL: digest, LABEL_BASE: base_id},
            buildargs=buildargs,
            # Never copy the host's client proxy settings into the image's history.
            use_config_proxy=False,
        )
        for raw, chunk in _lines(stream):
            # Build output is whatever the commands printed: no escape sequences reach a terminal.
            # A carriage return redraws the line: keep what it ends up showing.
            line = _ESCAPES.sub("", raw.rsplit("\r", 1)[-1])
            if chunk.get("error"):
                # Keep reading: the engine ends the stream itself after an error.
                failure = failure or _ESCAPES.sub("", str(chunk.get("error"))).strip()
                continue
            if failure is not None:
                continue
            if not line.strip():
                continue
            match = _STEP.match(line)
            if match:
                step, total = int(match.group(1)), int(match.group(2))
                # Steps past the Dockerfile's are the engine's, one per label.
                what = steps[step - 1] if step <= len(steps) else _label_step(match.group(3))
                emit(BuildEvent("step", what, step, total))
                tail.clear()  # a failure shows its own step's output
                continue
            layer = _LAYER.match(line)
            if layer:
                layers.append(layer.group(1))
            if layer or _BOOKKEEPING.match(line):
                continue  # the engine's, not the build's, output
            tail.append(line)
            emit(BuildEvent("output", line, step or None, total or None))
    if failure is not None:
        _remove_leftovers(api, layers, base_id)
        where = f" at step {step}/{total} ({steps[step - 1]})" if 0 < step <= len(steps) else ""
        output = "\n".join(f"  {line}" for line in tail)
        raise BackendError(f"building {tag} failed{where}: {failure}" + (f"\n{output}" if output else ""))
    found = _existing(api, tag)
    labels = ((found or {}).get("Config") or {}).get("Labels") or {}
    if labels.get(LABEL) != digest:
        raise BackendError(f"the build of {tag} ended without producing the image")
    new_id = str((found or {}).get("Id", ""))
    if previous is not None and previous != new_id:
        _remove_replaced(api, previous)
    emit(BuildEvent("built", f"{tag} ({new_id.removeprefix('sha256:')[:12]})"))


def _label_step(instruction: str) -> str:
    name = instruction.removeprefix("LABEL ").split("=", 1)[0]
    return f"label {name}"


def _remove_replaced(api: Any, image_id: str) -> None:
    """Remove the image a rebuild took the tag from, unless something still uses it."""
    import docker.errors

    try:
        info = api.inspect_image(image_id)
        if not [t for t in info.get("RepoTags") or [] if t != "<none>:<none>"]:
            api.remove_image(image_id, noprune=False)
    except docker.errors.APIError:
        pass  # a sandbox (or another image) still uses it: the engine keeps it


def _remove_leftovers(api: Any, layers: list[str], base_id: str) -> None:
    """Remove the last layer a failed build committed; the engine prunes its untagged parents."""
    import docker.errors

    if not layers or base_id.removeprefix("sha256:").startswith(layers[-1]):
        return  # nothing was committed beyond the base
    try:
        info = api.inspect_image(layers[-1])
        if [t for t in info.get("RepoTags") or [] if t != "<none>:<none>"]:
            return  # a tagged image (reused from the build cache): never ours to remove
        api.remove_image(layers[-1], noprune=False)
    except docker.errors.APIError:
        pass  # still used by another image (shared build cache): leave it
