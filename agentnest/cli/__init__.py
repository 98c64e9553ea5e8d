"""The ``agentnest`` command line: ``main(argv) -> int``, one module per command.

Exit codes: 0 success, 1 an AgentNest error (``error: ...`` on stderr, no
traceback), 2 a usage error; ``run`` returns the command's own exit code
(124 when it timed out); 130 follows Ctrl-C and 141 a closed pipe.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import AgentNestError, ConfigurationError
from . import (
    audit,
    backends,
    demo,
    doctor,
    image,
    kubernetes,
    mcp,
    profiles,
    prune,
    run,
    serve,
    setup,
    shell,
)
from ._output import error

#: The commands in the order ``agentnest --help`` lists them.
COMMANDS = (demo, doctor, setup, run, shell, backends, image, profiles, prune, audit, serve, mcp, kubernetes)

_EPILOG = """\
examples:
  agentnest demo                        # a guided tour of what a sandbox blocks
  agentnest doctor                      # check the engine and that limits are enforced
  sudo agentnest setup                  # the storage pool for disk workspaces
  agentnest run -- python3 -c 'print(6 * 7)'
  agentnest shell --backend gvisor        # an interactive shell, removed on exit
  agentnest prune --dry-run             # what expired sandboxes left behind
  agentnest audit --since 1h --follow   # recent sandbox events, then new ones
  agentnest run --profile strict -- python3 -V

Run `agentnest COMMAND --help` for a command's options and examples.
"""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="agentnest",
        description="Disposable, policy-controlled sandboxes for AI agents on Docker or gVisor.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"agentnest {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for module in COMMANDS:
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help, --version and usage errors
        return _exit_code(exc.code)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler(args))
    except ConfigurationError as exc:
        error(str(exc))
        return 2
    except AgentNestError as exc:
        error(str(exc))
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`agentnest run ... | head`): stop quietly, like other tools.
        _silence_stdout()
        return 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (tests capture it): nothing to flush there


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


__all__ = ["build_parser", "main"]
