"""Driving the programs that run inside the sandbox: the tar writer, the extractor, the hasher.

Their sources are modules of :mod:`agentnest.agent` (``tar_writer.py``,
``tar_extract.py``, ``hasher.py``) but not part of the agent's bundle: each
runs as its own process, ``python3 -I -S -c SOURCE ARGS_JSON``, through an
:class:`ExecHandle` of the agent channel, and :class:`_Program` is the one
interface to it (pull its stdout, write its stdin, wait, cancel, and read
its structured stderr notes).  :class:`_Feeder` streams a tar into the
extractor under flow control.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..channel.client import ExecHandle
from ..channel.protocol import RawExit
from ..errors import AgentNestError, ChannelError, SnapshotError, UnsupportedCapabilityError
from ..runtime.base import Capability
from .archive import _Gate, _read_archive, _Stream
from .rules import (
    MAX_ARTIFACTS,
    MAX_ENTRIES,
    MAX_FILE_SIZE,
    MAX_NAME_BYTES,
    PAYLOAD_PREFIX,
    MiB,
    TarRules,
    _refuse,
)

if TYPE_CHECKING:
    from ..sandbox import Sandbox

#: Flow control of streams into the extractor: bytes sent but not yet
#: acknowledged, and how often the extractor acknowledges.  Bounds what the
#: in-sandbox agent queues in memory (it reads its channel eagerly).  The
#: window must exceed the acknowledgement interval, or both ends would wait.
ACK_WINDOW = 8 * MiB
ACK_EVERY = 1 * MiB
#: One stdin frame to the extractor: a 4-byte length and this much data at
#: most, 256 KiB in all.  Measured: with 1 MiB frames a 100 MB restore took
#: twice as long, because the agent re-slices a frame's unwritten remainder
#: after every partial write into the command's pipe.
_PIECE = 256 * 1024 - 4
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
#: Marker of the programs' structured stderr lines.
_MARK = "agentnest-state: "
_ERR_MAX = 64 * 1024

#: The programs: modules of :mod:`agentnest.agent` whose sources run as scripts.
_WRITER = "tar_writer"  # a workspace tree to stdout, as tar members
_EXTRACTOR = "tar_extract"  # a tar stream from stdin into the workspace: staged, swapped in on commit
_HASHER = "hasher"  # one line [path, size, sha256] per file that a pattern matches


@lru_cache(maxsize=8)  # three programs
def _source(program: str) -> str:
    """The source of ``program`` (one of :data:`_WRITER`, :data:`_EXTRACTOR`, :data:`_HASHER`).

    What the three share (``agent/_prelude.py``) comes first; the program's own
    ``from __future__`` line goes (it must open a file, and the prelude's does).
    """
    files = resources.files("agentnest.agent")
    own = files.joinpath(f"{program}.py").read_text("utf-8")
    future = "from __future__ import annotations\n"
    if future not in own:
        raise RuntimeError(f"agent/{program}.py must import annotations from __future__")
    return files.joinpath("_prelude.py").read_text("utf-8") + own.replace(future, "", 1)


def _argv(program: str, args: dict[str, Any]) -> list[str]:
    # -I: the workspace is not on sys.path (a planted tarfile.py is not
    # imported) and PYTHON* variables are ignored; -S: no site-packages.
    return ["python3", "-I", "-S", "-c", _source(program), json.dumps(args)]


# -- driving the programs ----------------------------------------------------------------


def _timeout_for(nbytes: int) -> float:
    # A generous floor plus time per MiB at a slow 4 MiB/s: a bound for a
    # hung program, not a performance expectation.
    return 120.0 + nbytes / (4 * MiB)


class _Program:
    """One of the programs above, running in a sandbox through an ExecHandle.

    ``pull`` reads its stdout, ``write`` its stdin; ``wait`` and ``check`` wait
    for its exit, ``cancel`` kills it; ``notes``, ``failure`` and ``skipped``
    read the structured lines it wrote to stderr.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        program: str,
        args: dict[str, Any],
        *,
        stdin: bool,
        max_output: int,
        budget: int,
    ) -> None:
        self.sandbox = sandbox
        timeout = _timeout_for(budget)
        self.deadline = sandbox._wait_deadline(timeout)
        self.err = bytearray()
        self.exit: RawExit | None = None
        try:
            self.handle: ExecHandle = sandbox._ch().start_exec(
                _argv(program, args),
                env={},
                # The agent's workspace: every program works below "." there.
                cwd=None,
                timeout=timeout,
                max_output=max_output,
                keep_stdin_open=stdin,
            )
        except ChannelError as exc:
            raise sandbox._lost(exc) from None

    def pull(self) -> bytes:
        """The next chunk of stdout; ``b""`` once the program has exited."""
        while self.exit is None:
            try:
                event = self.handle.next_event(self.deadline)
            except ChannelError as exc:
                raise self.sandbox._lost(exc) from None
            if isinstance(event, tuple):
                fd, data = event
                if fd == 1:
                    return data
                room = _ERR_MAX - len(self.err)
                if room > 0:
                    self.err += data[:room]
            else:
                self.exit = event
        return b""

    def write(self, data: bytes, *, eof: bool = False) -> None:
        try:
            self.handle.write_stdin(data, eof=eof)
        except ChannelError as exc:
            raise self.sandbox._lost(exc) from None

    def wait(self) -> RawExit:
        while self.exit is None:
            self.pull()
        return self.exit

    def cancel(self) -> None:
        """Kill the program's process tree and stop listening to it."""
        if self.exit is None:
            self.handle.cancel()
            self.handle.abandon()

    def notes(self) -> list[dict[str, Any]]:
        found = []
        for line in bytes(self.err).decode("utf-8", "replace").splitlines():
            if line.startswith(_MARK):
                with contextlib.suppress(ValueError):
                    doc = json.loads(line[len(_MARK) :])
                    if isinstance(doc, dict):
                        found.append(doc)
        return found

    def failure(self, what: str) -> SnapshotError:
        """The error a program that did not succeed stands for."""
        raw = self.exit
        redact = self.sandbox._guard.redact  # file names are the sandbox's, secrets included
        for doc in self.notes():
            if "rule" in doc:
                member = doc.get("member")
                return _refuse(
                    redact(member) if isinstance(member, str) else None,
                    str(doc.get("rule"))[:40],
                    redact(f"{what}: {str(doc.get('message'))[:1000]}"),
                )
        if raw is not None and raw.timed_out:
            return _refuse(None, "timeout", f"{what} took too long and was stopped")
        tail = bytes(self.err).decode("utf-8", "replace").strip()[-800:]
        code = raw.code if raw is not None else "?"
        return _refuse(None, "failed", f"{what} failed (exit {code}): {redact(tail)}")

    def check(self, what: str) -> None:
        """Raise unless the program exited 0 with all of its output delivered."""
        raw = self.wait()
        if raw.code != 0 or raw.timed_out:
            raise self.failure(what)
        if self._truncated() or raw.truncated:
            raise _refuse(None, "size", f"{what}: the stream exceeded its limit")

    def _truncated(self) -> bool:
        return self.handle.truncated

    def skipped(self) -> list[str]:
        for doc in self.notes():
            names = doc.get("skipped")
            if isinstance(names, list):
                return [str(n)[:MAX_NAME_BYTES] for n in names][:1000]
        return []


class _LocalProgram(_Program):
    """The same program on this host, over the sandbox's workspace directory (the fast path).

    For a workspace in the local storage pool: no agent channel, so no
    per-byte framing.  It runs with the same ``-I -S`` isolation, as the
    sandbox's UID and GID (so it can do no more to the files than the
    sandbox's own copy could, and nothing as root), with an empty
    environment, in its own session (``cancel`` kills the group), under the
    same output limit and timeout.  Its cwd is the workspace; the programs
    open every path below it through directory descriptors without following
    symlinks, and callers freeze the sandbox (or hand a read-only snapshot)
    so nothing changes under them.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        program: str,
        args: dict[str, Any],
        *,
        stdin: bool,
        max_output: int,
        budget: int,
        cwd: Path,
    ) -> None:
        self.sandbox = sandbox
        self.err = bytearray()
        self.exit = None
        self._started = time.monotonic()
        self._until = self._started + _timeout_for(budget)
        self._max_output = max_output
        self._sent = 0
        self._over = False
        self._timed_out = False
        uid, _, gid = sandbox.config.user.partition(":")
        python = _host_python()
        assert python is not None  # _host_workspace said so
        argv = [python, *_argv(program, args)[1:]]
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env={},
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                user=int(uid),
                group=int(gid or uid),
                extra_groups=[],
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise _refuse(None, "failed", f"cannot start {program} on the host: {exc}") from None
        assert self.proc.stdout is not None and self.proc.stderr is not None
        for pipe in (self.proc.stdout, self.proc.stdin):
            if pipe is not None:
                # 1 MiB pipes instead of 64 KiB: 16 times fewer reads and wake-ups
                # for a 100 MiB tar (F_SETPIPE_SZ; the default maximum is 1 MiB).
                with contextlib.suppress(OSError):
                    fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, MiB)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ, 1)
        self._sel.register(self.proc.stderr, selectors.EVENT_READ, 2)

    def pull(self) -> bytes:
        while self.exit is None:
            if not self._sel.get_map():
                self._reap()
                break
            left = self._until - time.monotonic()
            if left <= 0:
                self._timed_out = True
                self.cancel()
                break
            for key, _ in self._sel.select(min(left, 1.0)):
                data = os.read(key.fd, MiB)
                if not data:
                    self._sel.unregister(key.fileobj)
                    continue
                if key.data == 1:
                    self._sent += len(data)
                    if self._sent > self._max_output:
                        self._over = True
                        self.cancel()
                        return b""
                    return data
                room = _ERR_MAX - len(self.err)
                if room > 0:
                    self.err += data[:room]
        return b""

    def write(self, data: bytes, *, eof: bool = False) -> None:
        pipe = self.proc.stdin
        if pipe is None:
            return
        try:
            if data:
                pipe.write(data)
                pipe.flush()
            if eof:
                pipe.close()
        except (BrokenPipeError, ValueError):
            pass  # it exited: what it said (pull, failure) explains why

    def cancel(self) -> None:
        if self.exit is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self._reap()

    def _reap(self) -> None:
        code = self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._sel.close()
        self.exit = RawExit(
            code=code if code >= 0 else 128 - code,
            signal=-code if code < 0 else None,
            timed_out=self._timed_out,
            truncated=self._over,
            cancelled=False,
            duration=time.monotonic() - self._started,
        )

    def _truncated(self) -> bool:
        return self._over


class _Feeder:
    """Feeds an extractor's stdin: length-prefixed chunks under flow control."""

    def __init__(self, program: _Program) -> None:
        self.program = program
        self.sent = 0
        self.acked = 0
        self._lines = bytearray()
        self.final: dict[str, Any] | None = None

    def send(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            piece, view = view[:_PIECE], view[_PIECE:]
            while self.sent - self.acked > ACK_WINDOW:
                if not self._pump():
                    raise self.program.failure("the extractor")
            self.program.write(struct.pack(">I", len(piece)) + piece)
            self.sent += 4 + len(piece)

    def _pump(self) -> bool:
        chunk = self.program.pull()
        if not chunk:
            return False
        self._lines += chunk
        while True:
            end = self._lines.find(b"\n")
            if end < 0:
                break
            line = bytes(self._lines[:end])
            del self._lines[: end + 1]
            if line.startswith(b"a "):
                with contextlib.suppress(ValueError):
                    self.acked = max(self.acked, int(line[2:]))
            elif line.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    doc = json.loads(line)
                    if isinstance(doc, dict):
                        self.final = doc
        if len(self._lines) > 64 * 1024:
            raise _refuse(None, "failed", "the extractor wrote an overlong line")
        return True

    def finish(self, *, commit: bool) -> dict[str, Any]:
        """End the stream; on ``commit`` the extractor swaps the new files in."""
        if self.program.exit is None:
            self.program.write(struct.pack(">I", 0) + (b"C" if commit else b"A"), eof=True)
        while self._pump():
            pass
        raw = self.program.wait()
        if raw.code != 0 or self.final is None or self.final.get("ok") is not True:
            raise self.program.failure("the extractor")
        return self.final

    def drop(self, exc: BaseException) -> None:
        """After ``exc``: the extractor drops what it staged (an error), or is killed (an interrupt)."""
        if isinstance(exc, Exception):
            self.abort()
        else:
            self.program.cancel()

    def abort(self) -> None:
        """Best effort: tell the extractor to drop what it staged, and wait for it."""
        if self.program.exit is not None:
            return
        try:
            self.finish(commit=False)
        except (AgentNestError, OSError):
            self.program.cancel()


def _writer_args(sandbox: Sandbox, *, sub: str = "", prefix: str = PAYLOAD_PREFIX) -> dict[str, Any]:
    return {
        "root": ".",
        "sub": sub,
        "prefix": prefix,
        "max_bytes": sandbox.config.limits.workspace,
        "max_entries": MAX_ENTRIES,
    }


def _start(
    sandbox: Sandbox,
    program: str,
    args: dict[str, Any],
    *,
    stdin: bool,
    max_output: int,
    budget: int,
    local: Path | None,
) -> _Program:
    """The program in the sandbox, or with ``local`` (a host directory) on this host."""
    if local is None:
        return _Program(sandbox, program, args, stdin=stdin, max_output=max_output, budget=budget)
    return _LocalProgram(sandbox, program, args, stdin=stdin, max_output=max_output, budget=budget, cwd=local)


def _start_writer(sandbox: Sandbox, args: dict[str, Any], local: Path | None = None) -> _Program:
    """Start the tar writer; with ``args["wait"]`` it waits for :func:`_go` first."""
    # The agent's output limit is a backstop; the rules bound the stream first.
    limit = int(args["max_bytes"]) + MAX_ENTRIES * 2048
    return _start(
        sandbox,
        _WRITER,
        args,
        stdin=bool(args.get("wait")),
        max_output=limit,
        budget=int(args["max_bytes"]),
        local=local,
    )


def _start_extractor(sandbox: Sandbox, max_bytes: int, local: Path | None = None) -> tuple[_Program, _Feeder]:
    args = {
        "root": ".",
        "token": os.urandom(6).hex(),
        "prefix": PAYLOAD_PREFIX,
        "max_bytes": max_bytes,
        "max_entries": MAX_ENTRIES,
        "max_file": MAX_FILE_SIZE,
        "ack": ACK_EVERY,
    }
    program = _start(sandbox, _EXTRACTOR, args, stdin=True, max_output=MiB, budget=max_bytes, local=local)
    return program, _Feeder(program)


def _start_hasher(sandbox: Sandbox, base: str, regex: str, local: Path | None = None) -> _Program:
    args = {"root": ".", "base": base, "regex": regex, "max_files": MAX_ARTIFACTS}
    budget = sandbox.config.limits.workspace
    return _start(sandbox, _HASHER, args, stdin=False, max_output=64 * MiB, budget=budget, local=local)


@lru_cache(maxsize=1)
def _host_python() -> str | None:
    """An interpreter on this host that any user may run, or ``None``.

    The programs run as the sandbox's UID, which cannot run an interpreter
    in a private directory (a venv or pyenv under /root); -I -S need nothing
    of a venv, so the real interpreter, or the system's, does.
    """
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(os.path.realpath(candidate))
        try:
            if not path.is_file() or path.stat().st_mode & 0o005 != 0o005:
                continue
            if all(parent.stat().st_mode & 0o001 for parent in path.parents):
                return str(path)
        except OSError:
            continue
    return None


def _host_workspace(sandbox: Sandbox, *, write: bool = False) -> Path | None:
    """The sandbox's workspace directory on this host when the fast path applies, else ``None``."""
    path = sandbox.backend.workspace_path(sandbox.handle, write=write)
    if path is None or _host_python() is None or not sandbox.config.user.replace(":", "").isdigit():
        return None
    return path


@contextlib.contextmanager
def _frozen_workspace(sandbox: Sandbox) -> Iterator[Path | None]:
    """A read-only host copy of the workspace at this instant (fast path), or ``None`` (channel)."""
    if _host_workspace(sandbox) is None:
        yield None
        return
    with sandbox.backend.frozen_workspace(sandbox.handle) as path:
        yield path


@contextlib.contextmanager
def _frozen_live(sandbox: Sandbox) -> Iterator[Path | None]:
    """The live workspace on this host with the sandbox frozen (fast path), or ``None`` (channel)."""
    path = _host_workspace(sandbox, write=True)
    if path is None:
        yield None
        return
    with sandbox.backend.frozen(sandbox.handle):
        yield path


def _read_program(program: _Program, gate: _Gate, rules: TarRules, **kw: Any) -> _Stream:
    """``_read_archive`` over a program's output; a program that failed explains itself."""
    try:
        return _read_archive(gate, rules, snapshot_file=False, **kw)
    except SnapshotError:
        if program.exit is not None and program.exit.code != 0:
            raise program.failure("the tar writer") from None
        raise


def _require(sandbox: Sandbox, capability: Capability, what: str) -> None:
    if capability not in sandbox.backend.capabilities():
        raise UnsupportedCapabilityError(
            f"the {sandbox.backend.name!r} backend does not support {what} (capability {capability.value!r})"
        )
