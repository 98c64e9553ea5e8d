"""The browser preset's image: Debian's Chromium and Playwright for Python, built offline.

The image is an ordinary :class:`~agentnest.Template` on AgentNest's default
base image:

* Debian packages: ``chromium``, ``chromium-headless-shell`` (what headless
  pages run in: no crash reporter to spawn, faster to start), and fonts so
  that pages render text (``fonts-liberation``: metric-compatible with the
  common web fonts; ``fonts-dejavu-core``: wide Unicode coverage).
* Playwright for Python, from local wheels (its wheel carries its Node
  driver).  They are fetched once into a cache on the host with
  ``pip download`` (PyPI only; or point ``AGENTNEST_BROWSER_WHEELS`` at a
  directory that has them, for air-gapped hosts).  Playwright never
  downloads a browser: ``agent/browser_setup.py`` links the paths it expects
  to Debian's Chromium at build time and renders a test page, so the build
  fails rather than ship a browser that does not start.

Its tag is content-addressed like every template's; :data:`BROWSER_IMAGE`
is added as a stable name for the newest build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, TemplateBuildError
from ..templates import BuildEvent, ProgressCallback, Template, _image_tag

#: The stable name of the newest browser image on the engine.
BROWSER_IMAGE = "agentnest/preset:browser"
#: Playwright's release.  It drives Chromium 156, which Debian 12 ships (its
#: point release has 150, close enough: tested); a Playwright far from the
#: Chromium it drives may use DevTools calls that Chromium lacks.
PLAYWRIGHT_VERSION = "1.64.1"
#: Debian packages of the image.
PACKAGES = ("chromium", "chromium-headless-shell", "fonts-dejavu-core", "fonts-liberation")
#: Where Playwright looks for browsers (links to Debian's, see agent/browser_setup.py).
BROWSERS_PATH = "/opt/agentnest/browsers"
#: The setup script's place in the image.
SETUP_SCRIPT = "/opt/agentnest/browser_setup.py"
#: A directory of wheels to use instead of the cache (air-gapped hosts).
WHEELS_ENV = "AGENTNEST_BROWSER_WHEELS"
#: The Python of the default base image (Debian 12): the wheels must match it.
BASE_PYTHON = "3.11"
#: How long fetching the wheels may take.
DOWNLOAD_TIMEOUT = 900.0

_lock = threading.Lock()
#: The tag each engine client found or built in this process (gone with the client).
_built: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def setup_source() -> str:
    """The source of the build-time setup script (``agent/browser_setup.py``)."""
    return resources.files("agentnest.agent").joinpath("browser_setup.py").read_text(encoding="utf-8")


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "agentnest" / "wheels"


def _has_wheels(directory: Path, version: str) -> bool:
    names = [p.name for p in directory.glob("*.whl")] if directory.is_dir() else []
    return any(n.startswith(f"playwright-{version}-") for n in names) and any(
        n.startswith("greenlet-") for n in names
    )


def browser_wheels(arch: str = "x86_64", *, version: str = PLAYWRIGHT_VERSION) -> Path:
    """A directory with Playwright's wheel and its dependencies for the image's Python.

    ``$AGENTNEST_BROWSER_WHEELS`` if set (it must hold them); else a cache
    directory, filled once with ``pip download`` from the host's package index.

    Raises:
        TemplateBuildError: the wheels are not there and cannot be fetched;
            the message says how to provide them.
    """
    given = os.environ.get(WHEELS_ENV)
    if given:
        directory = Path(given).expanduser()
        if not _has_wheels(directory, version):
            raise TemplateBuildError(
                f"${WHEELS_ENV}={given!r} has no playwright-{version} and greenlet wheels; fill it with "
                f"`pip download --only-binary=:all: --platform manylinux_2_28_{arch} --platform "
                f"manylinux1_{arch} --python-version {BASE_PYTHON} --implementation cp "
                f"-d {given} playwright=={version}`"
            )
        return directory
    if arch not in ("x86_64", "aarch64"):
        raise TemplateBuildError(f"the browser preset has no Playwright build for the {arch!r} architecture")
    directory = _cache_dir() / f"playwright-{version}-{arch}"
    if _has_wheels(directory, version):
        return directory
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        # Download into a fresh directory and rename it into place: a download
        # that stops half-way never looks like a complete cache.
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=directory.parent))
    except OSError as exc:
        raise TemplateBuildError(
            f"cannot keep Playwright's wheels in {str(directory.parent)!r} ({exc.strerror}); "
            f"set XDG_CACHE_HOME to a writable directory, or ${WHEELS_ENV} to a directory of the wheels"
        ) from None
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        *(f"--platform={tag}_{arch}" for tag in ("manylinux_2_28", "manylinux2014", "manylinux1")),
        f"--python-version={BASE_PYTHON}",
        "--implementation=cp",
        f"--dest={staging}",
        f"playwright=={version}",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, check=False)
        if done.returncode != 0 or not _has_wheels(staging, version):
            raise TemplateBuildError(
                f"could not fetch Playwright {version}'s wheels with pip ({done.stderr.strip()[-600:]}); "
                f"download them where PyPI is reachable and set ${WHEELS_ENV} to their directory"
            )
        if directory.exists():  # another process finished first
            return directory
        staging.rename(directory)
        return directory
    except subprocess.TimeoutExpired:
        raise TemplateBuildError(
            f"fetching Playwright's wheels took more than {DOWNLOAD_TIMEOUT:g} s; set ${WHEELS_ENV}"
        ) from None
    except OSError as exc:  # pip could not be started, or the rename failed
        raise TemplateBuildError(
            f"could not fetch Playwright {version}'s wheels ({exc}); "
            f"download them where PyPI is reachable and set ${WHEELS_ENV} to their directory"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def browser_template(wheels: str | os.PathLike[str], base_image: str | None = None) -> Template:
    """The browser image's :class:`~agentnest.Template` (wheels from ``wheels``)."""
    return Template(
        base_image,
        pip_packages=(f"playwright=={PLAYWRIGHT_VERSION}",),
        apt_packages=PACKAGES,
        environment={
            "PLAYWRIGHT_BROWSERS_PATH": BROWSERS_PATH,
            # Loopback stays direct with the egress proxy set, as in Chromium
            # itself (Playwright would send it to the proxy, which refuses it):
            # a page served inside the sandbox is the sandbox's own.
            "PLAYWRIGHT_DISABLE_FORCED_CHROMIUM_PROXIED_LOOPBACK": "1",
        },
        wheels=wheels,
        files={SETUP_SCRIPT: setup_source()},
        commands=(f"python3 {SETUP_SCRIPT} && rm {SETUP_SCRIPT}",),
    )


def engine_arch(api: Any) -> str:
    """The engine's CPU architecture, as Python wheels name it."""
    from ..runtime.docker.engine import map_docker_errors

    with map_docker_errors("asking the engine for its architecture"):
        arch = str(api.info().get("Architecture") or "x86_64")
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def browser_image(*, api: Any = None, progress: ProgressCallback | None = None, force: bool = False) -> str:
    """The browser image's tag on the engine, built first if it is not there.

    The first call in a process checks (and builds, about half a minute on a
    fast mirror); later calls return the same tag at once.

    Raises:
        TemplateBuildError: the build failed (the message has its output) or
            the wheels could not be fetched.
        RuntimeNotAvailableError: no Docker engine.
    """
    from ..runtime.docker.builder import add_tag
    from ..runtime.registry import docker_api

    api = api if api is not None else docker_api()
    with _lock:
        known = _built.get(api)
        if known is not None and not force:
            if progress is not None:
                progress(BuildEvent("cached", f"{known} was checked in this process: nothing to build"))
            return known
        template = browser_template(browser_wheels(engine_arch(api)))
        tag = template.build(api=api, progress=progress, force=force)
        add_tag(api, tag, *_image_tag(BROWSER_IMAGE))
        _built[api] = tag
        return tag


#: What ``preset="browser"`` sets when the caller did not: Chromium needs
#: room (a renderer per page, its GPU process, Node's driver), and its
#: profile and shared memory live in ``/tmp``.
PRESET_DEFAULTS: dict[str, Any] = {"memory": "2g", "pids": 512, "scratch_size": "256m"}
#: Backends whose engine is this host's Docker, where the image can be built.
_LOCAL_BACKENDS = ("docker", "gvisor")


def preset_kwargs(given: dict[str, Any], *, image: bool = True) -> dict[str, Any]:
    """``Sandbox(...)``'s arguments with the preset's defaults filled in where not given.

    The image is built (once) on the engine of a local Docker backend; any
    other backend needs ``image=`` (the browser image pushed where it runs).
    ``image=False`` fills in everything but the image.
    """
    from ..config import PRESETS
    from ..runtime.docker.backend import DockerBackend

    preset = given.get("preset")
    if preset not in PRESETS:
        raise ConfigurationError(
            f"preset={preset!r} is not a preset; choose one of {', '.join(map(repr, PRESETS))}"
        )
    out = {**PRESET_DEFAULTS, **given}
    if image and out.get("image") is None and out.get("runtime") is None:
        backend = out.get("backend", "docker")
        if isinstance(backend, DockerBackend):
            out["image"] = browser_image(api=backend.api)
        elif backend in _LOCAL_BACKENDS:
            out["image"] = browser_image()
        else:
            raise ConfigurationError(
                f"preset='browser' on backend {backend!r}: build the browser image with "
                "`agentnest image browser`, push it where the backend runs, and pass image="
            )
    return out
