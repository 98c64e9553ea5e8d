"""``agentnest shell``: an interactive terminal in a fresh sandbox, removed on exit.

On a terminal the command runs on a pseudo-terminal inside the sandbox (the
agent's ``pty`` exec): this terminal goes into raw mode, every keystroke is
sent as it is typed (^C included: it interrupts the program in the sandbox,
not this one), window-size changes follow, and the terminal is restored
however the session ends.  Without a terminal (a pipe or a file on stdin or
stdout) the shell runs without one, reading its commands from stdin, like
``docker exec -i``.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._core import Command, core_of
from ..errors import ChannelError
from ._output import Commands, add_command, add_sandbox_options, status
from .run import TIMEOUT_EXIT, command_argv, sandbox_options

if TYPE_CHECKING:
    from .._core import SandboxCore
    from ..channel.client import ExecHandle
    from ..channel.protocol import RawExit

#: The lifetime of the sandbox when neither --lifetime nor the profile says.
DEFAULT_LIFETIME = 3600.0
#: bash if the image has it, else sh; either way interactive, since stdin is a terminal.
DEFAULT_SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; fi; exec sh"]
#: Output of an interactive session is not cut at ``max_output_bytes``: it goes
#: straight to this terminal and is never held in memory (frames stay bounded).
UNBOUNDED = 1 << 62
#: What a terminal type may look like before it is passed on as $TERM.
_TERM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_READ = 64 * 1024

_EPILOG = """\
On a terminal, the shell (bash if the image has it, else sh) runs on a
pseudo-terminal inside the sandbox: line editing, ^C, full-screen programs
and window resizing work.  Leave it with `exit` or ^D; the exit code is the
shell's.  The sandbox, its files and every process in it are destroyed when
the shell exits (or when this command is interrupted or killed); it stops by
itself after --lifetime seconds even if this process dies.  There is no way
to keep it: a sandbox belongs to the process that created it.

Without a terminal (stdin or stdout redirected), the shell runs without one
and reads its commands from stdin; stdout and stderr stay apart.

Output of an interactive session is not cut at the policy's max_output_bytes
(it is shown, never stored); without a terminal the limit applies as for
`agentnest run`.  Exit code 124 when --timeout killed the shell, 1 when the
sandbox could not be created.

examples:
  agentnest shell                                  # bash or sh in the default image
  agentnest shell --backend gvisor --memory 1g
  agentnest shell --profile strict --lifetime 7200
  agentnest shell --image python:3.12-slim -- python3   # any interactive program
  echo 'uname -a; id' | agentnest shell            # no terminal: commands from stdin
"""


def register(commands: Commands) -> None:
    """Add ``shell`` to the command line."""
    parser = add_command(
        commands,
        "shell",
        "an interactive shell in a fresh sandbox, removed on exit",
        "Create a sandbox, open an interactive shell (or CMD) in it on a terminal, and destroy the "
        "sandbox when it exits.",
        _EPILOG,
    )
    add_sandbox_options(parser, "the shell", lifetime=f"the profile's timeout, else {DEFAULT_LIFETIME:g}")
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD [ARGS...]",
        help="what to run instead of the shell",
    )
    parser.set_defaults(handler=handle, verify=False, approve=None)


def shell_argv(words: Sequence[str]) -> list[str]:
    """The command to run: what followed the options, or the default shell."""
    if not [w for w in words if w != "--"]:
        return list(DEFAULT_SHELL)
    return command_argv(words)


def terminal_type(value: str | None) -> str:
    """$TERM for the sandbox: this terminal's type when it looks like one, else ``xterm``."""
    if value and _TERM.fullmatch(value) and value != "dumb":
        return value
    return "xterm"


def handle(args: argparse.Namespace) -> int:
    """Create the sandbox, run the shell on a terminal (or piped), destroy the sandbox."""
    from ..sandbox import Sandbox

    argv = shell_argv(args.command)
    timeout: float | None = args.timeout
    options = sandbox_options(args, timeout)
    profile = options.get("profile")
    if args.lifetime is None and (profile is None or profile.timeout is None):
        options["timeout"] = max(DEFAULT_LIFETIME, (timeout or 0.0) + 60.0)
    interactive = _is_terminal(sys.stdin) and _is_terminal(sys.stdout)
    with status("creating a sandbox"):
        sandbox = Sandbox(**options)
    with sandbox:
        if interactive:
            env = {"TERM": terminal_type(os.environ.get("TERM")), **dict(args.env)}
            return interactive_session(core_of(sandbox), argv, env, timeout)
        return piped_session(core_of(sandbox), argv, dict(args.env), timeout)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def terminal_size(fd: int) -> tuple[int, int]:
    """``(rows, cols)`` of the terminal on ``fd`` (24x80 when it cannot say)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        fallback = shutil.get_terminal_size((80, 24))
        return max(fallback.lines, 1), max(fallback.columns, 1)
    return size.lines or 24, size.columns or 80


def _start(
    sandbox: SandboxCore,
    argv: list[str],
    env: dict[str, str],
    timeout: float | None,
    *,
    pty: tuple[int, int] | None,
) -> ExecHandle:
    """Start ``argv`` through the guard (approval, audit event) with stdin kept open."""
    return sandbox.start(
        Command(
            argv,
            timeout,
            dict(env),
            keep_stdin_open=True,
            pty=pty,
            max_output=UNBOUNDED if pty is not None else None,
        )
    )


def _exit_code(sandbox: SandboxCore, raw: RawExit, truncated: bool, timeout: float | None) -> int:
    """Record the end (audit event) and turn it into this command's exit code."""
    sandbox.guard.finish_exec(raw, b"", b"", truncated)
    if raw.timed_out:
        print(
            f"agentnest: the shell ran past --timeout {timeout:g}s and was killed with every process "
            "it started",
            file=sys.stderr,
        )
        return TIMEOUT_EXIT
    if raw.signal:
        return 128 + raw.signal
    return raw.code if 0 <= raw.code <= 255 else 1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Pump(threading.Thread):
    """Copies the command's output to local file descriptors until its result arrives."""

    def __init__(self, handle: ExecHandle, deadline: float, outputs: dict[int, int], wake: int) -> None:
        super().__init__(name="agentnest-shell-output", daemon=True)
        self.handle = handle
        self.deadline = deadline
        self.outputs = outputs
        self.wake = wake
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.handle.result is None:
                event = self.handle.next_event(self.deadline)
                if isinstance(event, tuple):
                    _write_all(self.outputs[event[0]], event[1])
        except BaseException as exc:  # handed to the main thread, which raises it
            self.error = exc
        finally:
            try:
                os.write(self.wake, b"x")
            except OSError:
                pass


def interactive_session(
    sandbox: SandboxCore, argv: list[str], env: dict[str, str], timeout: float | None
) -> int:
    """Run ``argv`` on a pseudo-terminal in ``sandbox`` wired to this terminal; its exit code.

    This terminal is in raw mode for the session and restored afterwards,
    whatever happens.  SIGWINCH becomes a resize; SIGTERM and SIGHUP end
    the command (and then the sandbox) instead of leaving it behind.
    """
    import termios
    import tty

    stdin_fd = sys.stdin.fileno()
    stdout_fd = sys.stdout.fileno()
    sys.stdout.flush()
    sys.stderr.flush()
    handle = _start(sandbox, argv, env, timeout, pty=terminal_size(stdout_fd))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    pump = _Pump(handle, sandbox.wait_deadline(timeout), {1: stdout_fd, 2: stdout_fd}, wake_w)

    def notify(tag: bytes) -> Any:
        def handler(signum: int, frame: FrameType | None) -> None:
            try:
                os.write(wake_w, tag)
            except OSError:
                pass

        return handler

    saved_attrs = termios.tcgetattr(stdin_fd)
    saved_handlers = {
        sig: signal.signal(sig, notify(tag))
        for sig, tag in ((signal.SIGWINCH, b"w"), (signal.SIGTERM, b"t"), (signal.SIGHUP, b"h"))
    }
    ended_by: int | None = None
    try:
        tty.setraw(stdin_fd, termios.TCSANOW)
        pump.start()
        reading = [stdin_fd, wake_r]
        while ended_by is None:
            ready, _, _ = select.select(reading, [], [])
            if wake_r in ready:
                tags = os.read(wake_r, 256)
                if b"x" in tags:
                    break
                if b"t" in tags or b"h" in tags:
                    ended_by = signal.SIGTERM if b"t" in tags else signal.SIGHUP
                    break
                if b"w" in tags:
                    handle.resize(*terminal_size(stdout_fd))
            if stdin_fd in ready:
                try:
                    data = os.read(stdin_fd, _READ)
                except OSError:  # EIO: the terminal hung up
                    data = b""
                if data:
                    handle.write_stdin(data)
                else:
                    # The terminal is gone: nobody is left to type; end the command.
                    reading.remove(stdin_fd)
                    handle.cancel()
    finally:
        termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved_attrs)
        for sig, previous in saved_handlers.items():
            signal.signal(sig, previous)
        if pump.is_alive() and handle.result is None:
            handle.cancel()
            if ended_by is not None:
                pump.join(5.0)
            if pump.is_alive():
                handle.abandon()
        pump.join(5.0)
        os.close(wake_r)
        os.close(wake_w)
    if ended_by is not None:
        return 128 + ended_by
    return _finish(sandbox, handle, pump, timeout)


def piped_session(sandbox: SandboxCore, argv: list[str], env: dict[str, str], timeout: float | None) -> int:
    """Run ``argv`` without a terminal, its stdin fed from ours until EOF; its exit code."""
    stdout_fd = sys.stdout.fileno()
    stderr_fd = sys.stderr.fileno()
    sys.stdout.flush()
    sys.stderr.flush()
    handle = _start(sandbox, argv, env, timeout, pty=None)
    wake_r, wake_w = os.pipe()
    pump = _Pump(handle, sandbox.wait_deadline(timeout), {1: stdout_fd, 2: stderr_fd}, wake_w)
    feeder = threading.Thread(target=_feed, args=(handle,), name="agentnest-shell-stdin", daemon=True)
    try:
        pump.start()
        feeder.start()  # blocked in read() when the command ends first: a daemon, left behind
        pump.join()
    finally:
        if pump.is_alive():  # interrupted (^C): end the command, then the sandbox goes
            handle.cancel()
            handle.abandon()
            pump.join(5.0)
        os.close(wake_r)
        os.close(wake_w)
    return _finish(sandbox, handle, pump, timeout)


def _feed(handle: ExecHandle) -> None:
    """Send our stdin to the command, then EOF; stop quietly when it is gone."""
    try:
        fd = sys.stdin.fileno()
        while handle.result is None:
            data = os.read(fd, _READ)
            if not data:
                break
            handle.write_stdin(data)
        handle.write_stdin(b"", eof=True)
    except (OSError, ValueError, ChannelError):
        pass  # the command ended, the sandbox went, or there is no stdin: nothing to feed


def _finish(sandbox: SandboxCore, handle: ExecHandle, pump: _Pump, timeout: float | None) -> int:
    if pump.error is not None:
        if isinstance(pump.error, ChannelError):
            raise sandbox.lost(pump.error) from None
        raise pump.error
    if handle.result is None:  # pragma: no cover - the pump ends only with a result or an error
        raise ChannelError("the shell ended without a result")
    return _exit_code(sandbox, handle.result, handle.truncated, timeout)


__all__ = ["handle", "interactive_session", "piped_session", "register", "shell_argv", "terminal_type"]
