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
import struct
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..channel.client import ExecHandle
from ..channel.protocol import RawExit
from ..errors import AgentNestError, ChannelError, SnapshotError, UnsupportedCapabilityError
from ..runtime.base import Capability
from .archive import _Gate, _read_archive
from .rules import (
    MAX_ENTRIES,
    MAX_NAME_BYTES,
    PAYLOAD_PREFIX,
    MiB,
    TarRules,
    _refuse,
    _Stream,
)

if TYPE_CHECKING:
    from .._core import SandboxCore

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
        sandbox: SandboxCore,
        program: str,
        args: dict[str, Any],
        *,
        stdin: bool,
        max_output: int,
        budget: int,
    ) -> None:
        self.sandbox = sandbox
        timeout = _timeout_for(budget)
        self.deadline = sandbox.wait_deadline(timeout)
        self.err = bytearray()
        self.exit: RawExit | None = None
        try:
            self.handle: ExecHandle = sandbox.link().start_exec(
                _argv(program, args),
                env={},
                # The agent's workspace: every program works below "." there.
                cwd=None,
                timeout=timeout,
                max_output=max_output,
                keep_stdin_open=stdin,
            )
        except ChannelError as exc:
            raise sandbox.lost(exc) from None

    def pull(self) -> bytes:
        """The next chunk of stdout; ``b""`` once the program has exited."""
        while self.exit is None:
            try:
                event = self.handle.next_event(self.deadline)
            except ChannelError as exc:
                raise self.sandbox.lost(exc) from None
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
            raise self.sandbox.lost(exc) from None

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
        redact = self.sandbox.guard.redact  # file names are the sandbox's, secrets included
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


class _Feeder:
    """Feeds an extractor's stdin: length-prefixed chunks under flow control.

    With ``direct`` the extractor reads a snapshot file itself: nothing is
    sent but the final decision.
    """

    def __init__(self, program: _Program, *, direct: bool = False) -> None:
        self.program = program
        self.direct = direct
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
            decision = b"C" if commit else b"A"
            self.program.write(decision if self.direct else struct.pack(">I", 0) + decision, eof=True)
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


def _writer_args(sandbox: SandboxCore, *, sub: str = "", prefix: str = PAYLOAD_PREFIX) -> dict[str, Any]:
    return {
        "root": ".",
        "sub": sub,
        "prefix": prefix,
        "max_bytes": sandbox.config.limits.workspace,
        "max_entries": MAX_ENTRIES,
    }


def _read_program(program: _Program, gate: _Gate, rules: TarRules, **kw: Any) -> _Stream:
    """``_read_archive`` over a program's output; a program that failed explains itself."""
    try:
        return _read_archive(gate, rules, snapshot_file=False, **kw)
    except SnapshotError:
        if program.exit is not None and program.exit.code != 0:
            raise program.failure("the tar writer") from None
        raise


def _require(sandbox: SandboxCore, capability: Capability, what: str) -> None:
    if capability not in sandbox.backend.capabilities():
        raise UnsupportedCapabilityError(
            f"the {sandbox.backend.name!r} backend does not support {what} (capability {capability.value!r})"
        )
