"""Helpers shared by the commands: sub-parsers, argument types, tables, marks, errors, progress.

One look for every command.  On a terminal, tables and progress use
`rich <https://rich.readthedocs.io>`_ when it is installed (``pip install
'agentnest[cli]'``) and a plain spinner otherwise; anywhere else (pipes,
files, tests) the output is plain, stable text with no escape codes, so
scripts can parse it.  ``NO_COLOR`` and ``TERM=dumb`` are honoured.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias

from ..errors import ConfigurationError
from ..verify import human_bytes

if TYPE_CHECKING:
    from ..profiles import Profile

#: What ``ArgumentParser.add_subparsers`` returns (a private class, hence the alias).
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_command(
    commands: Commands, name: str, summary: str, description: str, epilog: str
) -> argparse.ArgumentParser:
    """Add the sub-parser ``name``; ``epilog`` holds the examples shown by ``--help``."""
    return commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_profile_options(parser: argparse.ArgumentParser, what: str = "take settings and policy") -> None:
    """``--profile NAME`` and ``--profile-file PATH``; read them with :func:`profile_from_args`."""
    parser.add_argument("--profile", metavar="NAME", help=f"{what} from this profile of agentnest.yaml")
    parser.add_argument(
        "--profile-file",
        metavar="PATH",
        help="the profile file (default: $AGENTNEST_PROFILE_FILE, ./agentnest.yaml)",
    )


def env_pair(text: str) -> tuple[str, str]:
    """argparse type: ``NAME=VALUE`` (the value may be empty or hold more ``=``)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def add_sandbox_options(parser: argparse.ArgumentParser, subject: str, *, lifetime: str) -> None:
    """The options of commands that make one sandbox for ``subject`` (``run``, ``shell``).

    ``lifetime`` says what ``--lifetime`` defaults to.  Read them with ``run.sandbox_options``.
    """
    parser.add_argument(
        "--image", help="image to run (default: the AgentNest base image, or $AGENTNEST_IMAGE)"
    )
    parser.add_argument(
        "--backend", help="docker (runc), gvisor (runsc), kata or a plug-in (default: docker)"
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help=f"kill {subject} and its process tree after SECONDS (exit code 124)",
    )
    parser.add_argument(
        "--lifetime",
        type=positive_float,
        metavar="SECONDS",
        help=f"the sandbox stops itself after SECONDS even if this process dies (default: {lifetime})",
    )
    parser.add_argument("--memory", help="memory limit, e.g. 512m or 2g (default: 512m)")
    parser.add_argument("--cpus", type=positive_float, help="CPU limit (default: 1.0)")
    parser.add_argument(
        "--network",
        choices=("denied", "open"),
        help="denied (default: loopback only) or open (unfiltered, runc only: use with care)",
    )
    add_profile_options(parser)
    parser.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        type=env_pair,
        metavar="NAME=VALUE",
        help=f"set an environment variable for {subject} (repeatable)",
    )


def profile_from_args(args: argparse.Namespace) -> Profile | None:
    """The profile ``--profile`` names (``None`` without it); errors name the fix."""
    from ..profiles import find_profile_file, load_profiles

    if args.profile_file and not args.profile:
        raise ConfigurationError("--profile-file needs --profile NAME")
    if not args.profile:
        return None
    path = find_profile_file(args.profile_file)
    if path is None:
        raise ConfigurationError(
            f"--profile {args.profile}: no profile file; pass --profile-file, set "
            "$AGENTNEST_PROFILE_FILE or create agentnest.yaml here"
        )
    return load_profiles(path).get(args.profile)


def int_in(low: int, high: int, what: str = "a whole number") -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} from {low} to {high}")
        return value

    return parse


def positive_float(text: str) -> float:
    """argparse type: a number of seconds greater than zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number greater than 0")
    return value


def _can_encode(text: str, stream: TextIO) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def mark(ok: bool, stream: TextIO | None = None) -> str:
    """``✓`` or ``✗``, or ``OK``/``FAIL`` on a terminal that cannot show them."""
    symbol = "✓" if ok else "✗"
    if _can_encode(symbol, stream or sys.stdout):
        return symbol
    return "OK" if ok else "FAIL"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart, with a header line."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip()
        for line in [list(headers), *[list(r) for r in rows]]
    ]
    return "\n".join(lines)


def error(message: str) -> None:
    """Print ``error: message`` on stderr."""
    print(f"error: {message}", file=sys.stderr)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal that takes escape codes."""
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _rich_console(stream: TextIO) -> Any:
    """A ``rich`` console on ``stream`` if it is a terminal and rich is installed, else None."""
    if not is_terminal(stream):
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=stream, highlight=False)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], stream: TextIO | None = None) -> None:
    """Print a table: a ``rich`` one on a terminal, else :func:`table`'s plain columns."""
    out = stream or sys.stdout
    console = _rich_console(out)
    if console is None:
        print(table(headers, rows), file=out)
        return
    from rich import box
    from rich.table import Table

    grid = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    for header in headers:
        grid.add_column(header, overflow="fold")
    for row in rows:
        grid.add_row(*row, style=None)
    console.print(grid)


#: How long work may take before a spinner shows (quick work shows none).
SPINNER_DELAY = 0.3


@contextlib.contextmanager
def status(message: str, stream: TextIO | None = None) -> Iterator[None]:
    """Show ``message`` with a spinner on stderr while the block runs, on a terminal only.

    The spinner appears after :data:`SPINNER_DELAY` seconds and is erased when
    the block ends, so it never mixes with the block's own output.  Elsewhere
    nothing is printed: progress is not data.
    """
    out = stream or sys.stderr
    if not is_terminal(out):
        yield
        return
    console = _rich_console(out)
    if console is not None:
        with console.status(message, spinner="dots"):
            yield
        return
    with _PlainSpinner(out, message):
        yield


class _PlainSpinner:
    """A one-line spinner with ``\r`` redraws, for terminals without ``rich``."""

    _FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
    _ASCII = "|/-\\"

    def __init__(self, stream: TextIO, message: str) -> None:
        self.stream = stream
        self.message = message
        self.frames = self._FRAMES if _can_encode(self._FRAMES, stream) else self._ASCII
        self._stop = threading.Event()
        self._drawn = False
        self._thread = threading.Thread(target=self._spin, name="agentnest-spinner", daemon=True)

    def __enter__(self) -> _PlainSpinner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def _spin(self) -> None:
        if self._stop.wait(SPINNER_DELAY):
            return
        tick = 0
        while not self._stop.is_set():
            self.stream.write(f"\r\x1b[K{self.frames[tick % len(self.frames)]} {self.message}...")
            self.stream.flush()
            self._drawn = True
            tick += 1
            self._stop.wait(0.1)


__all__ = [
    "Commands",
    "add_command",
    "add_profile_options",
    "add_sandbox_options",
    "env_pair",
    "error",
    "human_bytes",
    "int_in",
    "is_terminal",
    "mark",
    "positive_float",
    "print_table",
    "profile_from_args",
    "status",
    "table",
]
