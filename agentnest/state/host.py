"""The host side of the fast paths: whether they apply, and the programs run on this host.

With a disk workspace in the local storage pool, the in-sandbox programs
(:mod:`.programs`) run here over the workspace's directory instead of
through the agent channel: the extractor and the hasher as processes of
their own (:class:`_LocalProgram`), the tar writer in a thread of this
process (:class:`_InProcess`: no interpreter to start, ~25 ms a call).
Both act as the sandbox's UID and GID, so they can do no more to the files
than the sandbox's own copy could, and nothing as root.  The ``_start_*``
functions pick the channel or the host for their callers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING, Any

from ..channel.protocol import RawExit
from ..runtime.hostfs import become as become
from ..runtime.hostfs import host_workspace as _host_workspace
from ..runtime.launch import host_python as _host_python
from . import programs
from .programs import (
    _ERR_MAX,
    _EXTRACTOR,
    _F_SETPIPE_SZ,
    _HASHER,
    _MARK,
    _WRITER,
    _argv,
    _Feeder,
    _Program,
    _source,
    _timeout_for,
)
from .rules import MAX_ARTIFACTS, MAX_ENTRIES, MAX_FILE_SIZE, METADATA_NAME, PAYLOAD_PREFIX, MiB, _refuse

if TYPE_CHECKING:
    from .._core import SandboxCore


class _OnHost(_Program):
    """What the programs run on this host share: their limits, kept here rather than by the agent.

    The time limit (the same as through the channel), the output limit, and
    the exit they end with.  The two drivers below differ only in where the
    program runs: a process of its own, or a thread of this one.
    """

    def __init__(self, sandbox: SandboxCore, *, max_output: int, budget: int) -> None:
        self.sandbox = sandbox
        self.err = bytearray()
        self.exit = None
        self._started = time.monotonic()
        self._until = self._started + _timeout_for(budget)
        self._max_output = max_output
        self._sent = 0
        self._over = False
        self._timed_out = False

    def _counted(self, data: bytes) -> bool:
        """Count output; ``False`` once it passes the limit (the caller then cancels)."""
        self._sent += len(data)
        self._over = self._over or self._sent > self._max_output
        return not self._over

    def _ended(self, code: int, signal_number: int | None = None) -> None:
        self.exit = RawExit(
            code=code,
            signal=signal_number,
            timed_out=self._timed_out,
            truncated=self._over,
            cancelled=False,
            duration=time.monotonic() - self._started,
        )

    def _truncated(self) -> bool:
        return self._over


class _LocalProgram(_OnHost):
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
        sandbox: SandboxCore,
        program: str,
        args: dict[str, Any],
        *,
        stdin: bool,
        max_output: int,
        budget: int,
        cwd: Path,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        super().__init__(sandbox, max_output=max_output, budget=budget)
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
                pass_fds=pass_fds,
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
                    if not self._counted(data):
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
        self._ended(code if code >= 0 else 128 - code, -code if code < 0 else None)


class _InProcess(_OnHost):
    """A program run in a thread of this process, over a workspace directory on this host.

    For the tar writer (snapshots and downloads of a local disk workspace):
    its source, compiled once, is executed in a fresh namespace per run, in
    a new thread whose filesystem UID/GID are the sandbox's (:func:`become`),
    writing into a pipe this object reads.  What the script form does at
    its end (structured notes on stderr, an exit status) is done here, so
    :meth:`notes`, :meth:`failure` and :meth:`skipped` read the same.  The
    writer opens every path below the directory it is given without
    following symlinks; callers freeze the sandbox (or hand a read-only
    snapshot) so nothing changes under it.  ``cancel`` closes the pipe: the
    writer's next write fails and its thread ends.
    """

    def __init__(
        self,
        sandbox: SandboxCore,
        program: str,
        args: dict[str, Any],
        *,
        max_output: int,
        budget: int,
        cwd: Path,
    ) -> None:
        super().__init__(sandbox, max_output=max_output, budget=budget)
        self._code = 1
        uid, _, gid = sandbox.config.user.partition(":")
        self._r, self._w = os.pipe2(os.O_CLOEXEC)
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETPIPE_SZ, MiB)
        namespace: dict[str, Any] = {"__name__": f"agentnest_{program}"}
        exec(_code(program), namespace)  # noqa: S102 - our own agent/ module, compiled by _code
        # Opened here, as this process: the thread, acting as the sandbox's
        # user, could not pass through private host directories above it (a
        # thread has no working directory of its own to start from either).
        # The directory is the pool's (or its read-only copy): no component
        # of its path is the sandbox's to change.
        self._root = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        namespace.update(A={**args, "root_fd": self._root}, OUT=self._w)
        self._thread = threading.Thread(
            target=self._run,
            args=(namespace, int(uid), int(gid or uid)),
            name=f"agentnest-{program}",
            daemon=True,
        )
        self._thread.start()

    def _run(self, ns: dict[str, Any], uid: int, gid: int) -> None:
        note: dict[str, Any]
        try:
            become(uid, gid)
            ns["main"]()
            note = {"skipped": ns["skipped"][:1000], "nskipped": len(ns["skipped"])}
            self._code = 0
        except ns["Refused"] as exc:
            note = {"rule": exc.rule, "member": exc.member, "message": exc.message}
            self._code = 3
        except RecursionError:
            note = {
                "rule": "depth",
                "member": None,
                "message": "the tree is deeper than this interpreter recurses",
            }
            self._code = 3
        except OSError as exc:
            rule, message = ns["oserror"](exc)
            note = {"rule": rule, "member": ns["A"]["sub"] or None, "message": message}
            self._code = 3
        except BaseException as exc:  # reported through failure(), like a crashed script
            note = {"rule": "failed", "member": None, "message": f"{type(exc).__name__}: {exc}"[:500]}
        finally:
            os.close(self._w)
            os.close(self._root)
        self._note = (_MARK + json.dumps(note) + "\n").encode("utf-8", "replace")

    def pull(self) -> bytes:
        while self.exit is None:
            left = self._until - time.monotonic()
            if left <= 0:
                self._timed_out = True
                self.cancel()
                break
            ready, _, _ = select.select([self._r], [], [], min(left, 1.0))
            if not ready:
                continue
            data = os.read(self._r, MiB)
            if not data:
                self._reap()
                break
            if not self._counted(data):
                self.cancel()
                return b""
            return data
        return b""

    def write(self, data: bytes, *, eof: bool = False) -> None:
        raise NotImplementedError("the in-process writer takes no input")

    def cancel(self) -> None:
        if self.exit is None:
            self._reap()

    def _reap(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._r)  # a writer still writing gets EPIPE and ends
        self._thread.join()
        self.err += self._note[:_ERR_MAX]
        self._ended(self._code)


@lru_cache(maxsize=4)
def _code(program: str) -> CodeType:
    return compile(_source(program), f"<agentnest/{program}.py>", "exec")


#: A snapshot of a disk workspace holding up to this much data reads the
#: live workspace on the host with the sandbox frozen throughout (about a
#: quarter of a second at most here); a larger one reads a copy-on-write
#: snapshot taken while the sandbox was frozen for an instant.  The live
#: read saves the snapshot's cost, which is writing back the data written
#: since the last commit (~110 ms per 100 MiB here).
LIVE_READ_MAX = 256 * MiB


@contextlib.contextmanager
def _snapshot_view(sandbox: SandboxCore, *, live: bool) -> Iterator[tuple[Path | None, int | None]]:
    """Where a snapshot's writer reads: ``(host directory, byte budget)``, or ``(None, None)``: the channel.

    With ``live``, the live workspace with the sandbox frozen until the
    ``with`` ends, and a budget of :data:`LIVE_READ_MAX` (the writer gives
    up past it, and the caller starts again without ``live``).  Otherwise a
    read-only copy of the workspace at this instant.
    """
    if _host_workspace(sandbox) is None:
        yield None, None
        return
    backend, handle = sandbox.backend, sandbox.handle
    path = backend.workspace_path(handle)
    if live and path is not None:
        with backend.frozen(handle):
            yield path, LIVE_READ_MAX
        return
    with backend.frozen_workspace(handle) as copy:
        yield copy, None


@contextlib.contextmanager
def _frozen_live(sandbox: SandboxCore) -> Iterator[Path | None]:
    """The live workspace on this host with the sandbox frozen (fast path), or ``None`` (channel)."""
    path = _host_workspace(sandbox, write=True)
    if path is None:
        yield None
        return
    with sandbox.backend.frozen(sandbox.handle):
        yield path


def _start(
    sandbox: SandboxCore,
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


def _start_writer(
    sandbox: SandboxCore, args: dict[str, Any], local: Path | None = None, *, in_process: bool = False
) -> _Program:
    """Start the tar writer; with ``args["wait"]`` it waits for a ``g`` on its stdin first.

    On the host with ``in_process``, it runs in a thread of this process
    (:class:`_InProcess`); a tree deeper than this interpreter's recursion
    limit then fails with rule ``depth``, and the caller starts again
    without ``in_process`` (the writer as a process of its own).
    """
    # The agent's output limit is a backstop; the rules bound the stream first.
    limit = int(args["max_bytes"]) + MAX_ENTRIES * 2048
    if local is not None and in_process and not args.get("wait"):
        return _InProcess(sandbox, _WRITER, args, max_output=limit, budget=int(args["max_bytes"]), cwd=local)
    return _start(
        sandbox,
        _WRITER,
        args,
        stdin=bool(args.get("wait")),
        max_output=limit,
        budget=int(args["max_bytes"]),
        local=local,
    )


def _start_extractor(
    sandbox: SandboxCore, max_bytes: int, local: Path | None = None, *, file_fd: int | None = None
) -> tuple[_Program, _Feeder]:
    """Start the extractor; with ``file_fd`` (on the host only) it reads that snapshot file itself."""
    args: dict[str, Any] = {
        "root": ".",
        "token": os.urandom(6).hex(),
        "prefix": PAYLOAD_PREFIX,
        "max_bytes": max_bytes,
        "max_entries": MAX_ENTRIES,
        "max_file": MAX_FILE_SIZE,
        "ack": programs.ACK_EVERY,  # read now: tests shrink it
    }
    if file_fd is not None:
        if local is None:
            raise ValueError("a snapshot file is read by the extractor only on the host")
        args.update(file_fd=file_fd, stop_at=METADATA_NAME)
        program: _Program = _LocalProgram(
            sandbox,
            _EXTRACTOR,
            args,
            stdin=True,
            max_output=MiB,
            budget=max_bytes,
            cwd=local,
            pass_fds=(file_fd,),
        )
        return program, _Feeder(program, direct=True)
    program = _start(sandbox, _EXTRACTOR, args, stdin=True, max_output=MiB, budget=max_bytes, local=local)
    return program, _Feeder(program)


def _start_hasher(sandbox: SandboxCore, base: str, regex: str, local: Path | None = None) -> _Program:
    args = {"root": ".", "base": base, "regex": regex, "max_files": MAX_ARTIFACTS}
    budget = sandbox.config.limits.workspace
    return _start(sandbox, _HASHER, args, stdin=False, max_output=64 * MiB, budget=budget, local=local)
