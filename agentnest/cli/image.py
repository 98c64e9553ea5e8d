"""``agentnest image``: build the default base image offline, build templates, list AgentNest images."""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from ._output import Commands, _can_encode, add_command, error, human_bytes, mark, print_table

if TYPE_CHECKING:
    from ..templates import BuildEvent

_EPILOG = """\
`image base` builds agentnest/base:<suite>-<hash of the recipe> with
debootstrap from the Debian mirror in this machine's apt sources (or
--mirror), as root, without pulling anything from a registry.  An image
whose recipe is unchanged is never built twice: the command then only says
it is up to date.

`image build` builds a template image from a spec file (JSON, TOML or
YAML): a base image plus Debian packages, local wheels, files, environment
and commands.  Its tag, agentnest/template:<hash>, is computed from the
spec's content and the base image's ID, so the same spec is built once and
then found in the engine ("cached").  See docs/templates.md.

examples:
  sudo agentnest image base
  sudo agentnest image base --mirror http://deb.debian.org/debian --force
  agentnest image build template.json
  agentnest image list
"""

_BUILD_EPILOG = """\
A spec file holds the fields of agentnest.Template; every key is optional:

  {
    "base_image": "agentnest/base:bookworm-...",
    "apt_packages": ["jq", "ripgrep"],
    "wheels": "dist/",
    "files": {"/etc/app/prompt.txt": "be brief",
              "/opt/app/tool.py": {"source": "tool.py"}},
    "environment": {"APP_MODE": "strict"},
    "commands": ["jq --version > /etc/app/jq-version"]
  }

Relative paths (wheels, file sources) are relative to the spec file.  The
tag is printed on stdout, progress on stderr.

examples:
  agentnest image build template.json
  agentnest image build template.toml --force -v
  docker run --rm "$(agentnest image build -q template.json)" jq --version
"""


def register(commands: Commands) -> None:
    """Add ``image base``, ``image build``, ``image browser`` and ``image list`` to the command line."""
    parser = add_command(
        commands, "image", "build or list AgentNest images", "Build or list AgentNest images.", _EPILOG
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", title="actions")
    base = actions.add_parser(
        "base",
        help="build the default base image if it is missing",
        description="Build the default image (Debian + python3) offline with debootstrap.",
        epilog="examples:\n  sudo agentnest image base              # build it if missing\n"
        "  sudo agentnest image base --force\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    base.add_argument("--force", action="store_true", help="rebuild even if the image is up to date")
    base.add_argument(
        "--mirror", metavar="URL", help="Debian mirror (default: the first one in /etc/apt/sources)"
    )
    base.set_defaults(handler=handle_base)
    build = actions.add_parser(
        "build",
        help="build a template image from a spec file (once per spec)",
        description="Build a template image from a JSON, TOML or YAML spec, unless it is already built.",
        epilog=_BUILD_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    build.add_argument("spec", metavar="SPEC", help="the spec file (.json, .toml, .yaml)")
    build.add_argument("--force", action="store_true", help="rebuild, without the engine's build cache")
    output = build.add_mutually_exclusive_group()
    output.add_argument("-v", "--verbose", action="store_true", help="show every line of build output")
    output.add_argument("-q", "--quiet", action="store_true", help="print only the tag")
    build.set_defaults(handler=handle_build)
    browser = actions.add_parser(
        "browser",
        help="build the browser preset's image (Chromium + Playwright) if it is missing",
        description="Build the image of Sandbox(preset='browser') offline: Debian's Chromium and "
        "Playwright for Python (its wheels are fetched once with pip, or taken from "
        "$AGENTNEST_BROWSER_WHEELS).  See docs/presets.md.",
        epilog="examples:\n  agentnest image browser\n  agentnest image browser -q    # print only the tag\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    browser.add_argument("--force", action="store_true", help="rebuild, without the engine's build cache")
    output = browser.add_mutually_exclusive_group()
    output.add_argument("-v", "--verbose", action="store_true", help="show every line of build output")
    output.add_argument("-q", "--quiet", action="store_true", help="print only the tag")
    browser.set_defaults(handler=handle_browser)
    listing = actions.add_parser(
        "list",
        help="list AgentNest images on the engine",
        description="List the base images and template images AgentNest built.",
        epilog="examples:\n  agentnest image list\n  agentnest image list | grep template\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.set_defaults(handler=handle_list)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_usage(sys.stderr)
    error("choose an action: base, build, browser or list (see `agentnest image --help`)")
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


class BuildDisplay:
    """Shows a template build as it streams: one line per step, and on a terminal a spinner.

    On a terminal the current step is a status line redrawn in place (a
    spinner, the step counter, the latest output line) and each finished step
    stays as a line with a check mark; elsewhere each step is one plain line.
    ``verbose`` also prints every output line.
    """

    _FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
    _ASCII_FRAMES = "|/-\\"

    def __init__(self, stream: TextIO, *, verbose: bool = False, tty: bool | None = None) -> None:
        self.stream = stream
        self.verbose = verbose
        self.tty = stream.isatty() if tty is None else tty
        self.outcome: str | None = None  # "cached" or "built"
        self.steps = 0
        unicode = _can_encode(self._FRAMES + "·", stream)
        self._frames = self._FRAMES if unicode else self._ASCII_FRAMES
        self._separator = " · " if unicode else " - "
        self._tick = 0
        self._step = ""
        self._latest = ""
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, event: BuildEvent) -> None:
        with self._lock:
            if event.kind == "step":
                self._finish_step()
                self.steps += 1
                self._step = f"[{event.step}/{event.total}] {event.message}"
                self._latest = ""
                if not self.tty:
                    print(f"  {self._step}", file=self.stream, flush=True)
                else:
                    self._start_ticker()
            elif event.kind == "output":
                self._latest = event.message.strip()
                if self.verbose:
                    self._clear()
                    print(f"      {event.message}", file=self.stream, flush=True)
            elif event.kind in ("cached", "built"):
                self._finish_step()
                self.outcome = event.kind
            self._draw()

    def close(self) -> None:
        """Stop the spinner and clear its line (also after a failed build)."""
        self._stopped.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self._clear()
            self._step = ""

    def _finish_step(self) -> None:
        if self._step and self.tty:
            self._clear()
            print(f"  {mark(True, self.stream)} {self._step}", file=self.stream, flush=True)
        self._step = ""

    def _start_ticker(self) -> None:
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._spin, name="agentnest-build-spinner", daemon=True)
            self._ticker.start()

    def _spin(self) -> None:
        while not self._stopped.wait(0.1):
            with self._lock:
                self._tick += 1
                self._draw()

    def _draw(self) -> None:
        if not self.tty or not self._step:
            return
        width = shutil.get_terminal_size((100, 24)).columns - 1
        frame = self._frames[self._tick % len(self._frames)]
        text = f"{frame} {self._step}" + (f"{self._separator}{self._latest}" if self._latest else "")
        self.stream.write(f"\r\x1b[K{text[:width]}")
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def handle_build(args: argparse.Namespace) -> int:
    """Build the template in ``args.spec`` unless built; print its tag and whether it was built."""
    from ..templates import Template

    template = Template.from_file(args.spec)
    api = _docker_api()
    display = BuildDisplay(sys.stderr, verbose=args.verbose)
    started = time.monotonic()
    try:
        tag = template.build(api=api, progress=None if args.quiet else display, force=args.force)
    finally:
        display.close()
    _report(tag, "", display, started, args.quiet)
    return 0


def _report(tag: str, name: str, display: BuildDisplay, started: float, quiet: bool) -> None:
    """One line on stdout: the tag alone (``quiet``), or whether it was cached or built, and how fast."""
    shown = f"{tag} ({name})" if name else tag
    if quiet:
        print(tag)
    elif display.outcome == "cached":
        print(f"{shown}: cached (built before from the same spec; --force rebuilds)")
    else:
        print(f"{shown}: built in {time.monotonic() - started:.1f} s ({display.steps} steps)")


def handle_browser(args: argparse.Namespace) -> int:
    """Build the browser preset's image unless built; print its tag."""
    from ..browser.image import BROWSER_IMAGE, browser_image

    display = BuildDisplay(sys.stderr, verbose=args.verbose)
    started = time.monotonic()
    try:
        tag = browser_image(api=_docker_api(), progress=None if args.quiet else display, force=args.force)
    finally:
        display.close()
    _report(tag, BROWSER_IMAGE, display, started, args.quiet)
    return 0


def handle_list(args: argparse.Namespace) -> int:
    """Print a table of AgentNest images (base and templates); the default one is starred."""
    from ..runtime.docker import map_docker_errors
    from ..runtime.docker.images import BASE_REPOSITORY, base_image
    from ..templates import LABEL

    api = _docker_api()
    with map_docker_errors("listing images"):
        found = (
            list(api.images(name=BASE_REPOSITORY))
            + list(api.images(filters={"label": "agentnest.recipe"}))
            + list(api.images(filters={"label": LABEL}))
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
                # Templates inherit the base image's labels: theirs decides.
                "template" if LABEL in (entry.get("Labels") or {}) else "base",
                str(entry["Id"]).removeprefix("sha256:")[:12],
                time.strftime("%Y-%m-%d %H:%M", time.localtime(int(entry.get("Created") or 0))),
                human_bytes(int(entry.get("Size") or 0)),
                "*" if default in tags else "",
            ]
        )
    if not rows:
        print("no AgentNest images on this engine; build the default one with `agentnest image base`")
        return 0
    print_table(["IMAGE", "KIND", "ID", "CREATED", "SIZE", "DEFAULT"], rows)
    return 0
