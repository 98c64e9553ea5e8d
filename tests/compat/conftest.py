"""The released agentnest 0.3.0's sdist (its examples/ and tests/), fetched once and cached.

The sdist comes from the package index through pip (``pip download --no-deps
--no-binary :all: agentnest==0.3.0``) into ``${XDG_CACHE_HOME:-~/.cache}/agentnest/compat/``,
outside the checkout, and is reused from there while its SHA-256 matches the
release's; a fresh machine fetches it on first use.  Each test session unpacks
its own copy, *without* 0.3.0's ``agentnest/`` package, so that whatever runs
there (examples, 0.3.0's tests) can only import ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

VERSION = "0.3.0"
#: SHA-256 of agentnest-0.3.0.tar.gz as published on PyPI: the examples and
#: tests run are exactly the released ones, and a corrupt cache is refetched.
SDIST_SHA256 = "f982a8602779780c4665cba40c6353fe471a957a3ba5a185f4b2af3737b964d5"
SDIST_NAME = f"agentnest-{VERSION}.tar.gz"
#: The image reference 0.3.0's examples and tests ask for; mapped to our base image.
IMAGE_030 = "python:3.12-slim"


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/agentnest/compat`` (``~/.cache`` when unset or not absolute, as the spec says)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "agentnest" / "compat"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    # Two test runs on one machine fetch once: the second waits and finds the file.
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def fetch_sdist() -> Path:
    """The cached sdist, downloaded first if it is missing or does not match its hash."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / SDIST_NAME
    with _locked(directory):
        if target.is_file() and _sha256(target) == SDIST_SHA256:
            return target
        with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as tmp:
            proc = subprocess.run(
                [
                    *(sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"),
                    *("--disable-pip-version-check", "--quiet", "-d", tmp, f"agentnest=={VERSION}"),
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            got = Path(tmp) / SDIST_NAME
            if proc.returncode != 0 or not got.is_file():
                pytest.fail(
                    f"could not download agentnest {VERSION}'s sdist from the package index "
                    f"(pip download exited {proc.returncode}); it is needed once, then cached in "
                    f"{directory}:\n{(proc.stderr or proc.stdout)[-2000:]}",
                    pytrace=False,
                )
            if _sha256(got) != SDIST_SHA256:
                pytest.fail(
                    f"the downloaded {SDIST_NAME} has SHA-256 {_sha256(got)}, not the released "
                    f"{SDIST_SHA256}: refusing to run it",
                    pytrace=False,
                )
            os.replace(got, target)
    return target


def unpack(sdist: Path, destination: Path) -> Path:
    """Unpack ``sdist`` into ``destination`` without its ``agentnest/`` package; return its root."""
    root = f"agentnest-{VERSION}"
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not parts or parts[0] != root:
                raise AssertionError(f"unexpected member {member.name!r} in {sdist}")
            if len(parts) > 1 and parts[1] == "agentnest":
                continue  # 0.3.0's own code: never importable from here
            members.append(member)
        tar.extractall(destination, members=members, filter="data")
    return destination / root


@pytest.fixture(scope="session")
def sdist_030(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root of 0.3.0's unpacked sdist (examples/, tests/, pyproject.toml...), minus its package."""
    return unpack(fetch_sdist(), tmp_path_factory.mktemp("sdist-030"))


@pytest.fixture(scope="session")
def env_030() -> dict[str, str]:
    """The environment 0.3.0's code runs in: ours, with ``python:3.12-slim`` mapped to our base image."""
    from agentnest.runtime.docker import base_image
    from agentnest.runtime.docker.images import ALIASES_ENV

    env = dict(os.environ)
    env[ALIASES_ENV] = f"{IMAGE_030}={base_image()}"
    # Nothing is written into the unpacked sdist.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
