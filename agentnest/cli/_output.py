"""Helpers shared by the commands: sub-parsers, argument types, tables, marks, errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO, TypeAlias

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


__all__ = [
    "Commands",
    "add_command",
    "add_profile_options",
    "error",
    "human_bytes",
    "mark",
    "positive_float",
    "profile_from_args",
    "table",
]
