"""``agentnest run``: run one command in a fresh sandbox, streaming its output."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from ..errors import ConfigurationError, ExecutionTimeoutError
from ._output import Commands, add_command, positive_float

#: The exit code of a command killed by ``--timeout``, as coreutils ``timeout`` uses.
TIMEOUT_EXIT = 124

_EPILOG = """\
Everything after `--` is the command and its arguments, run without a shell.
For pipes, redirections or `&&`, run a shell yourself: `-- sh -c '...'`.
A single quoted string with spaces is split into words like a shell would
(quotes respected), but still run without a shell.

The exit code is the command's own; 124 if it ran past --timeout (its output
so far is printed), 1 if the sandbox could not be created.

examples:
  agentnest run -- python3 -c 'print(6 * 7)'
  agentnest run --timeout 5 -- sh -c 'echo start; sleep 60'      # exits 124 after 5 s
  agentnest run --memory 1g --image python:3.12-slim -- python3 -V
  agentnest run "ls -la /workspace"
"""


def register(commands: Commands) -> None:
    """Add ``run`` to the command line."""
    parser = add_command(
        commands,
        "run",
        "run one command in a fresh sandbox and remove it",
        "Create a sandbox, run CMD in it with its output streamed to this terminal, then destroy it.",
        _EPILOG,
    )
    parser.add_argument(
        "--image", help="image to run (default: the AgentNest base image, or $AGENTNEST_IMAGE)"
    )
    parser.add_argument(
        "--backend",
        default="docker",
        help="docker (runc), gvisor (runsc), kata or a plug-in (default: docker)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help="kill the command and its process tree after SECONDS (exit code 124)",
    )
    parser.add_argument(
        "--lifetime",
        type=positive_float,
        metavar="SECONDS",
        help="the sandbox stops itself after SECONDS even if this process dies (default: 600, "
        "or --timeout + 60 if that is longer)",
    )
    parser.add_argument("--memory", default="512m", help="memory limit, e.g. 512m or 2g (default: 512m)")
    parser.add_argument("--cpus", type=positive_float, default=1.0, help="CPU limit (default: 1.0)")
    parser.add_argument(
        "--network",
        choices=("denied", "open"),
        default="denied",
        help="denied (default: loopback only) or open (unfiltered, runc only: use with care)",
    )
    parser.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        type=_env_pair,
        metavar="NAME=VALUE",
        help="set an environment variable for the command (repeatable)",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help="the command to run"
    )
    parser.set_defaults(handler=handle)


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def command_argv(words: Sequence[str]) -> list[str]:
    """The argv to run from what followed the options (``--`` dropped, one string split)."""
    argv = list(words)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if len(argv) == 1 and any(c.isspace() for c in argv[0]):
        try:
            argv = shlex.split(argv[0])
        except ValueError as exc:
            raise ConfigurationError(f"cannot split the command {argv[0]!r} into words: {exc}") from None
    if not argv:
        raise ConfigurationError("no command given; usage: agentnest run [OPTIONS] -- CMD [ARGS...]")
    return argv


def handle(args: argparse.Namespace) -> int:
    """Create the sandbox, stream the command, destroy the sandbox; return its exit code."""
    from ..sandbox import Sandbox

    argv = command_argv(args.command)
    timeout: float | None = args.timeout
    lifetime: float = args.lifetime or max(600.0, (timeout or 0.0) + 60.0)
    if timeout is not None and timeout >= lifetime:
        raise ConfigurationError(f"--timeout {timeout:g} must be shorter than --lifetime {lifetime:g}")
    if args.network == "open":
        print(
            "agentnest: warning: the sandbox has unfiltered network access (--network open)", file=sys.stderr
        )
    with Sandbox(
        args.image,
        lifetime,
        environment=dict(args.env),
        memory=args.memory,
        cpus=args.cpus,
        backend=args.backend,
        network_enabled=args.network == "open",
    ) as sandbox:
        stream = sandbox.stream_exec(argv, timeout=timeout)
        try:
            for chunk in stream:
                out = sys.stdout if chunk.stream == "stdout" else sys.stderr
                out.write(chunk.data)
                out.flush()
        except ExecutionTimeoutError as exc:
            sys.stdout.flush()
            print(f"agentnest: {exc}", file=sys.stderr)
            return TIMEOUT_EXIT
        finally:
            stream.close()
        result = stream.result
        assert result is not None  # set once the iteration ends without an error
        if result.signal:
            return 128 + result.signal
        return result.exit_code if 0 <= result.exit_code <= 255 else 1
