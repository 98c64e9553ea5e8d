"""``agentnest run``: run one command in a fresh sandbox, streaming its output."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigurationError, ExecutionTimeoutError
from ..policy import SecurityPolicy
from ._output import Commands, add_command, add_sandbox_options, profile_from_args, status

#: The exit code of a command killed by ``--timeout``, as coreutils ``timeout`` uses.
TIMEOUT_EXIT = 124

_EPILOG = """\
Everything after `--` is the command and its arguments, run without a shell.
For pipes, redirections or `&&`, run a shell yourself: `-- sh -c '...'`.
A single quoted string with spaces is split into words like a shell would
(quotes respected), but still run without a shell.

The exit code is the command's own; 124 if it ran past --timeout (its output
so far is printed), 1 if the sandbox could not be created.

Options left out come from --profile (a profile of agentnest.yaml, found by
--profile-file, $AGENTNEST_PROFILE_FILE or the working directory), else from
the defaults shown.  --approve prompt asks on this terminal before every
operation (each question waits up to 5 minutes, then the answer is no).

examples:
  agentnest run -- python3 -c 'print(6 * 7)'
  agentnest run --profile strict -- python3 -V
  agentnest run --approve prompt -- sh -c 'rm -rf /workspace/*'
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
    add_sandbox_options(
        parser,
        "the command",
        lifetime="the profile's timeout, else 600, or --timeout + 60 if that is longer",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="check from inside that the policy holds before running (fail closed)",
    )
    parser.add_argument(
        "--approve",
        choices=("allow", "deny", "prompt"),
        help="an approval hook for every operation: allow, deny, or prompt (ask on this terminal)",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help="the command to run"
    )
    parser.set_defaults(handler=handle)


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


#: How long ``--approve prompt`` waits for a person's answer.
PROMPT_TIMEOUT = 300.0


def sandbox_options(args: argparse.Namespace, timeout: float | None) -> dict[str, Any]:
    """``Sandbox`` arguments from the options given (a profile fills in the rest).

    Warns on stderr when ``--network open`` asks for unfiltered networking.
    """
    from ..approvals import builtin

    options: dict[str, Any] = {}
    profile = profile_from_args(args)
    if profile is not None:
        options["profile"] = profile
    lifetime: float | None = args.lifetime
    profile_lifetime = options["profile"].timeout if "profile" in options else None
    if lifetime is None and profile_lifetime is None:
        lifetime = max(600.0, (timeout or 0.0) + 60.0)
    effective = lifetime if lifetime is not None else profile_lifetime
    if timeout is not None and effective is not None and timeout >= effective:
        raise ConfigurationError(f"--timeout {timeout:g} must be shorter than the lifetime {effective:g}")
    if lifetime is not None:
        options["timeout"] = lifetime
    for name in ("image", "memory", "cpus", "backend"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    if args.env:
        options["environment"] = dict(args.env)
    if args.network is not None:
        options["network_enabled"] = args.network == "open"
        if args.network == "open":
            print(
                "agentnest: warning: the sandbox has unfiltered network access (--network open)",
                file=sys.stderr,
            )
    if args.verify:
        options["verify"] = True
    if args.approve is not None:
        options["approval_hook"] = builtin(args.approve)
        if args.approve == "prompt":
            # A person needs longer than a program to answer; keep the rest of the policy.
            base = options["profile"].security_policy if "profile" in options else SecurityPolicy()
            options["security_policy"] = dataclasses.replace(base, approval_timeout=PROMPT_TIMEOUT)
    return options


def handle(args: argparse.Namespace) -> int:
    """Create the sandbox, stream the command, destroy the sandbox; return its exit code."""
    from ..sandbox import Sandbox

    argv = command_argv(args.command)
    timeout: float | None = args.timeout
    options = sandbox_options(args, timeout)
    with status("creating a sandbox"):
        sandbox = Sandbox(**options)
    with sandbox:
        stream = sandbox.stream_exec(argv, timeout=timeout)
        try:
            for chunk in stream:
                if chunk.stream == "status":  # the end; the exit code is returned below
                    continue
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
