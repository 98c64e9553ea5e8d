"""Moving a sandbox's deadline after creation (``Sandbox.extend``).

Container labels cannot change, so an extended deadline lives in the
container itself, where both its deadline keeper (PID 1) and ``prune`` read
it: the file :data:`DEADLINE_FILE` on the sandbox's scratch tmpfs, written by
the host as root: straight into the container's mount namespace through
``/proc/PID/root`` when the engine runs on this host (:func:`write_local`,
microseconds), else through the engine (``docker exec --user 0``, :func:`write`).

Why sandbox code cannot use it to outlive its deadline:

* it runs as UID 65532 without capabilities, so it cannot write a root-owned
  file, nor replace or remove one in the sticky ``/tmp``;
* the keeper re-arms its timer from the file only if the file is owned by
  root, is a regular file and is not a link; a signal sent by sandbox code
  (SIGUSR1 reaches PID 1 because the keeper handles it) only makes it re-read
  that file;
* if sandbox code creates the file (or its temporary name) first, the host's
  write fails and ``extend`` raises: the old deadline stays (fail closed).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from typing import Any

from ...errors import BackendError, SandboxDestroyedError
from ..bootstrap import DEADLINE_FILE
from ..launch import script_command

#: ``agent/deadline_file.py`` runs as root in the sandbox: it writes the deadline
#: atomically, never through a link, and reads it only from a root-owned regular file.
_PROGRAM = "deadline_file"


def _run(api: Any, cid: str, argv: list[str], timeout: float = 30.0) -> tuple[int, bytes]:
    exec_id = api.exec_create(cid, argv, user="0", stdout=True, stderr=True)["Id"]
    output = api.exec_start(exec_id, demux=False)
    code = api.exec_inspect(exec_id).get("ExitCode")
    return (code if isinstance(code, int) else -1), (output or b"")


def write(api: Any, cid: str, python: str, deadline: float) -> None:
    """Record ``deadline`` in the container and tell its keeper (SIGUSR1).

    Raises:
        SandboxDestroyedError: the container is not running.
        BackendError: the file could not be written (sandbox code got in the way).
    """
    import docker.errors

    try:
        argv = script_command(python, _PROGRAM, "write", DEADLINE_FILE, f"{deadline:.3f}")
        code, output = _run(api, cid, argv)
        if code != 0:
            tail = output.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            raise BackendError(
                f"could not record the new deadline in the sandbox ({tail[0][:200]}); "
                "sandbox code may have created its file first; the old deadline stays"
            )
        api.kill(cid, signal="SIGUSR1")
    except docker.errors.NotFound:
        raise SandboxDestroyedError("the sandbox's container is gone") from None
    except docker.errors.APIError as exc:
        if exc.status_code == 409:
            raise SandboxDestroyedError("the sandbox's container is not running") from None
        raise BackendError(f"the engine refused to extend the sandbox: {exc.explanation or exc}") from None


def write_local(pid: int, cid: str, deadline: float) -> bool:
    """Record ``deadline`` in container ``cid``, whose PID 1 is host process ``pid``; tell its keeper.

    The same file :func:`write` makes, written by this (root) process through
    ``/proc/PID/root``: no engine call.  The process is pinned first (a pidfd,
    and its cgroup must name ``cid``), so a reused PID is never written to or
    signalled.  Every component below the container's root is opened without
    following symlinks, and the file is created exclusively under a temporary
    name, so nothing sandbox code planted is followed or overwritten; anything
    in the way makes this return ``False`` (the caller then goes through the
    engine, which fails closed).
    """
    if os.geteuid() != 0 or pid <= 1 or not hasattr(os, "pidfd_open"):
        return False
    folder, _, name = DEADLINE_FILE.rpartition("/")
    with contextlib.ExitStack() as close:
        try:
            pidfd = os.pidfd_open(pid)
            close.callback(os.close, pidfd)
            proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            close.callback(os.close, proc)
            with open(os.open("cgroup", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc), encoding="utf-8") as f:
                if cid not in f.read(65536):
                    return False
            # Alive now, so ``proc`` (opened before) is this very process's.
            signal.pidfd_send_signal(pidfd, 0)
            root = os.open("root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
            close.callback(os.close, root)
            tmp = os.open(
                folder.lstrip("/"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root
            )
            close.callback(os.close, tmp)
            fd = os.open(
                name + ".new",
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=tmp,
            )
            try:
                os.write(fd, f"{deadline:.3f}".encode())
            finally:
                os.close(fd)
            try:
                os.rename(name + ".new", name, src_dir_fd=tmp, dst_dir_fd=tmp)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(name + ".new", dir_fd=tmp)
                return False
            signal.pidfd_send_signal(pidfd, signal.SIGUSR1)  # the keeper re-reads the file
        except OSError:
            return False
    return True


def read(api: Any, cid: str, python: str) -> float | None:
    """The extended deadline recorded in a running container, or None (not extended, unreadable)."""
    try:
        code, output = _run(api, cid, script_command(python, _PROGRAM, "read", DEADLINE_FILE))
    except Exception:  # a container going away meanwhile: no extension to honour
        return None
    if code != 0:
        return None
    try:
        value = float(output.decode("ascii", "replace").strip() or "nan")
    except ValueError:
        return None
    return value if math.isfinite(value) else None
