"""``agentnest image``: build the default base image offline, list AgentNest images."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ._output import Commands, add_command, error, human_bytes, table

_EPILOG = """\
`image base` builds agentnest/base:<suite>-<hash of the recipe> with
debootstrap from the Debian mirror in this machine's apt sources (or
--mirror), as root, without pulling anything from a registry.  An image
whose recipe is unchanged is never built twice: the command then only says
it is up to date.

examples:
  sudo agentnest image base
  sudo agentnest image base --mirror http://deb.debian.org/debian --force
  agentnest image list
"""


def register(commands: Commands) -> None:
    """Add ``image base`` and ``image list`` to the command line."""
    parser = add_command(
        commands, "image", "build or list AgentNest images", "Build or list AgentNest images.", _EPILOG
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", title="actions")
    base = actions.add_parser(
        "base",
        help="build the default base image if it is missing",
        description="Build the default image (Debian + python3) offline with debootstrap.",
        epilog="example:\n  sudo agentnest image base --force\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    base.add_argument("--force", action="store_true", help="rebuild even if the image is up to date")
    base.add_argument(
        "--mirror", metavar="URL", help="Debian mirror (default: the first one in /etc/apt/sources)"
    )
    base.set_defaults(handler=handle_base)
    listing = actions.add_parser(
        "list",
        help="list AgentNest images on the engine",
        description="List the base images and images built from AgentNest recipes.",
        epilog="example:\n  agentnest image list\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.set_defaults(handler=handle_list)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_usage(sys.stderr)
    error("choose an action: base or list (see `agentnest image --help`)")
    return 2


def _docker_api() -> Any:
    from ..errors import ConfigurationError
    from ..runtime.docker import DockerBackend
    from ..runtime.registry import get_backend

    backend = get_backend("docker")
    if not isinstance(backend, DockerBackend):  # pragma: no cover - "docker" is built in
        raise ConfigurationError("the docker backend is not a Docker engine backend")
    return backend.api


def handle_base(args: argparse.Namespace) -> int:
    """Build the default image if needed; say which image and whether it was built."""
    from ..runtime.docker.images import build_base_image

    image, built = build_base_image(
        _docker_api(),
        mirror=args.mirror,
        force=args.force,
        progress=lambda message: print(f"  {message}", flush=True),
    )
    print(f"{image}: {'built' if built else 'up to date (use --force to rebuild)'}")
    return 0


def handle_list(args: argparse.Namespace) -> int:
    """Print a table of AgentNest images; the default one is starred."""
    from ..runtime.docker import map_docker_errors
    from ..runtime.docker.images import BASE_REPOSITORY, base_image

    api = _docker_api()
    with map_docker_errors("listing images"):
        found = list(api.images(name=BASE_REPOSITORY)) + list(
            api.images(filters={"label": "agentnest.recipe"})
        )
    seen: set[str] = set()
    rows: list[list[str]] = []
    default = base_image()
    for entry in sorted(found, key=lambda e: -int(e.get("Created") or 0)):
        if entry["Id"] in seen:
            continue
        seen.add(entry["Id"])
        tags = [t for t in entry.get("RepoTags") or [] if t != "<none>:<none>"] or ["<untagged>"]
        rows.append(
            [
                ", ".join(tags),
                str(entry["Id"]).removeprefix("sha256:")[:12],
                time.strftime("%Y-%m-%d %H:%M", time.localtime(int(entry.get("Created") or 0))),
                human_bytes(int(entry.get("Size") or 0)),
                "*" if default in tags else "",
            ]
        )
    if not rows:
        print("no AgentNest images on this engine; build the default one with `agentnest image base`")
        return 0
    print(table(["IMAGE", "ID", "CREATED", "SIZE", "DEFAULT"], rows))
    return 0
