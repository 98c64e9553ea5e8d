"""The Dockerfile a :class:`~agentnest.templates.Template` builds with (pure).

This module decides what a build runs, in which order and as whom: Debian
packages (with this machine's mirror for images that have no apt sources),
the wheels installed offline with pip, the files, the environment, the
commands, then the sandbox user and ``/workspace``.  It writes text only; the
engine's builder (:mod:`agentnest.runtime.docker.builder`) stages the context
and runs it.  Every value it writes was validated by :mod:`agentnest.templates`
(see :mod:`agentnest.template_values`) before it gets here.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Protocol

#: Version of the build recipe (this module).  Bump it whenever the generated
#: Dockerfile changes what a spec produces, so old tags are not reused.
RECIPE_VERSION = 1


class Recipe(Protocol):
    """What :func:`render_dockerfile` reads of a spec (a :class:`~agentnest.templates.Template`)."""

    @property
    def apt_packages(self) -> Sequence[str]: ...
    @property
    def pip_packages(self) -> Sequence[str]: ...
    @property
    def wheels(self) -> str | None: ...
    @property
    def files(self) -> Mapping[str, str | bytes]: ...
    @property
    def environment(self) -> Mapping[str, str]: ...
    @property
    def commands(self) -> Sequence[str]: ...


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


def render_dockerfile(template: Recipe, base_image_id: str, *, installer: bool) -> tuple[str, list[str]]:
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


__all__ = ["MIRROR_ARG", "RECIPE_VERSION", "STAGING", "Recipe", "render_dockerfile"]
