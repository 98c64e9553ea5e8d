"""The default base image, built offline from Debian packages.

``debootstrap`` installs a minimal Debian with python3 into a directory,
which is imported as an image.  The tag is a hash of the recipe's inputs
(suite, variant, packages, recipe version), so an unchanged recipe is never
built twice and a changed one never reuses a stale image.  The mirror is read
from the machine's own apt sources at build time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from ...errors import BackendError, RuntimeNotAvailableError

BASE_REPOSITORY = "agentnest/base"
RECIPE_VERSION = 1
SUITE = "bookworm"
VARIANT = "minbase"
PACKAGES = ("python3",)


def recipe() -> dict[str, object]:
    return {
        "recipe": RECIPE_VERSION,
        "suite": SUITE,
        "variant": VARIANT,
        "packages": sorted(PACKAGES),
    }


def base_tag() -> str:
    digest = hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:12]
    return f"{SUITE}-{digest}"


def base_image() -> str:
    """The default image reference: ``agentnest/base:<suite>-<hash of inputs>``."""
    return f"{BASE_REPOSITORY}:{base_tag()}"


def apt_mirror() -> str:
    """The first Debian mirror in this machine's apt sources."""
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^\s*URIs:\s*(\S+)", text, re.MULTILINE):
            if "security" not in m.group(1):
                return m.group(1)
        for m in re.finditer(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.MULTILINE):
            if "security" not in m.group(1):
                return m.group(1)
    raise BackendError("no Debian mirror found in /etc/apt/sources.list(.d); pass mirror=...")


def image_exists(api: object, image: str) -> bool:
    import docker.errors

    try:
        api.inspect_image(image)  # type: ignore[attr-defined]
    except docker.errors.ImageNotFound:
        return False
    return True


def build_base_image(
    api: object,
    *,
    mirror: str | None = None,
    force: bool = False,
    progress: Callable[[str], None] = lambda _msg: None,
) -> tuple[str, bool]:
    """Build the default image if it is missing.  Returns (image, built)."""
    image = base_image()
    if not force and image_exists(api, image):
        progress(f"{image} is up to date")
        return image, False
    if shutil.which("debootstrap") is None:
        raise RuntimeNotAvailableError(
            "debootstrap is not installed; `apt-get install debootstrap` (Debian) or use your own image"
        )
    if os.geteuid() != 0:
        raise RuntimeNotAvailableError("building the base image needs root (debootstrap chroots)")
    mirror = mirror or apt_mirror()
    with tempfile.TemporaryDirectory(prefix="agentnest-base-") as tmp:
        root = Path(tmp) / "root"
        progress(f"debootstrap {SUITE} ({VARIANT}, +{','.join(PACKAGES)}) from {mirror}")
        proc = subprocess.run(
            [
                "debootstrap",
                f"--variant={VARIANT}",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
                mirror,
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise BackendError(f"debootstrap failed: {proc.stderr.strip()[-1500:] or proc.stdout[-1500:]}")
        # Downloaded packages are not part of the image.
        for deb in (root / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        progress("importing into the engine")
        tar = Path(tmp) / "root.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tar), "."], check=True)
        repo, tag = image.split(":", 1)
        api.import_image(  # type: ignore[attr-defined]
            src=str(tar),
            repository=repo,
            tag=tag,
            changes=[
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "ENV LANG=C.UTF-8",
                f"LABEL agentnest.recipe={base_tag()}",
                "USER 65532:65532",
                "WORKDIR /workspace",
            ],
        )
    if not image_exists(api, image):
        raise BackendError(f"importing {image} did not produce the image")
    progress(f"built {image}")
    return image, True
