"""``Sandbox``: the synchronous face of AgentNest (thin; the logic is in the guard)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from . import ops
from . import state as _state
from ._aliases import renamed
from ._core import SandboxCore, bind
from .approvals import ApprovalHook
from .config import Artifact, ExecutionResult, FileInfo, SandboxConfig, SnapshotMetadata
from .events import Observer
from .guard import scrub_errors
from .ops import default_image as default_image
from .policy import SecurityPolicy
from .profiles import Profile
from .runtime.base import RuntimeBackend, SandboxHandle
from .secrets import Secret
from .session import PythonSession, PythonSessionInfo, list_python_sessions, open_python_session
from .stream import ExecutionStream as ExecutionStream

if TYPE_CHECKING:
    from .browser.driver import Browser


#: The live ``Sandbox`` face of each core, so that a core wrapped again is the same object.
_FACE_OF: weakref.WeakKeyDictionary[SandboxCore, weakref.ref[Sandbox]] = weakref.WeakKeyDictionary()


def wrap(core: SandboxCore) -> Sandbox:
    """The ``Sandbox`` face of ``core`` (a fork's child, a resumed sandbox, an AsyncSandbox's core).

    The face that already holds ``core``, if it lives; else a new one.
    """
    sandbox = _FACE_OF[core]() if core in _FACE_OF else None
    if sandbox is None:
        sandbox = Sandbox.__new__(Sandbox)
        sandbox._hold(core)
    return sandbox


@scrub_errors
class Sandbox:
    """A disposable, policy-controlled sandbox.

    Example::

        with Sandbox("python:3.12-slim", timeout=60) as sandbox:
            sandbox.write_file("main.py", "print('hello from isolation')")
            print(sandbox.exec_shell("python main.py").stdout)

    Args:
        image: image reference; ``None`` uses the default base image.
        timeout: lifetime in seconds; the sandbox stops itself then, even if
            this process has died.
        environment: variables for every command; ``Secret`` values are
            redacted from all output.
        workdir: the workspace mount point.
        network_enabled: 0.3.0 switch for open networking; prefer
            ``security_policy=SecurityPolicy(network=...)``.
        memory, cpus, pids, gpus: resource limits.
        workspace_size, scratch_size: sizes of ``/workspace`` and ``/tmp``.
            ``/tmp`` is memory-backed (counted against ``memory``): by default
            an eighth of it, at most 64m.  The workspace's default depends on
            where it lives (``workspace``): 8g on disk, and in memory half of
            ``memory``, at most 256m.
        disk: the size of a disk workspace (``"10g"``); implies
            ``workspace="disk"``.  The kernel refuses writes beyond it
            (EDQUOT inside the sandbox); only what is written costs host disk.
        workspace: ``"disk"`` (the storage pool: bounded, copy-on-write, not
            counted against ``memory``; see docs/state.md), ``"memory"`` (a
            tmpfs: small, fast, RAM only) or ``None``: disk when the backend
            has a storage pool, else memory.
        backend: a backend name (``docker``, ``gvisor``, ``kata`` or a
            plug-in) or a :class:`RuntimeBackend` instance.
        read_only_root: keep the image read-only.
        security_policy: what the sandbox may do.
        observers: callables receiving every :class:`SandboxEvent`.
        approval_hook: called with an :class:`ApprovalRequest` before each
            operation; a falsy answer, an exception or no answer within the
            policy's ``approval_timeout`` denies it.  May be async.  The
            policy's own ``approval_hook`` is asked too; both must allow.
        verify: check from inside, before handing the sandbox out, that the
            policy holds (user, capabilities, seccomp, read-only root,
            network, limits); a sandbox that fails is destroyed and
            :class:`VerificationError` raised.  Costs one probe (a Python start inside).
        profile: a profile name (looked up in ``agentnest.yaml``, see
            docs/profiles.md) or a :class:`Profile`; arguments passed
            explicitly override the profile's.
        runtime: 0.3.0's name of ``image`` (deprecated; 0.3.0 took it as the
            first positional argument, which ``image`` is).
        preset: ``"browser"``: a sandbox with Chromium and Playwright (the
            image is built offline on first use; see docs/presets.md), 2g of
            memory, 512 processes and a 256m ``/tmp`` unless given here; drive
            it with :meth:`browser`.

    Raises:
        ConfigurationError: an argument is invalid.
        PolicyDeniedError: the policy or the approval hook refused.
        ImageNotFoundError, RuntimeNotAvailableError, BackendError: the engine
            could not provide the sandbox.
    """

    @ops.with_profile
    def __init__(
        self,
        image: str | None = None,
        timeout: float = 300,
        *,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str = "/workspace",
        network_enabled: bool = False,
        memory: int | str = "512m",
        cpus: float = 1.0,
        pids: int = 256,
        gpus: int = 0,
        workspace_size: int | str | None = None,
        scratch_size: int | str | None = None,
        backend: str | RuntimeBackend = "docker",
        read_only_root: bool = True,
        security_policy: SecurityPolicy | None = None,
        observers: Sequence[Observer] = (),
        approval_hook: ApprovalHook | None = None,
        verify: bool = False,
        profile: str | Profile | None = None,
        runtime: str | None = None,
        disk: int | str | None = None,
        workspace: str | None = None,
        preset: str | None = None,
    ) -> None:
        # stacklevel 4: past this __init__ and with_profile's wrapper, to the caller.
        image = renamed(
            image, runtime, "image", "runtime", ours_given=image is not None, where="Sandbox()", stacklevel=4
        )
        runtime_backend, config, policy = ops.sandbox_setup(
            image,
            timeout,
            environment=environment,
            workdir=workdir,
            network_enabled=network_enabled,
            memory=memory,
            cpus=cpus,
            pids=pids,
            gpus=gpus,
            workspace_size=workspace_size,
            scratch_size=scratch_size,
            backend=backend,
            read_only_root=read_only_root,
            security_policy=security_policy,
            disk=disk,
            workspace=workspace,
            preset=preset,
        )
        self._hold(SandboxCore(runtime_backend, config, policy, observers, approval_hook, verify=verify))

    def _hold(self, core: SandboxCore) -> None:
        self._core = core
        self._guard = core.guard  # scrub_errors redacts this face's errors with it
        bind(self, core)
        _FACE_OF[core] = weakref.ref(self)

    # -- properties ------------------------------------------------------------
    @property
    def id(self) -> str:
        """AgentNest's id of this sandbox (also on its engine labels)."""
        return self._core.id

    @property
    def config(self) -> SandboxConfig:
        return self._core.config

    @property
    def destroyed(self) -> bool:
        return self._core.destroyed

    @property
    def deadline(self) -> float:
        """Epoch seconds at which the sandbox stops itself."""
        return self._core.deadline

    @property
    def backend(self) -> RuntimeBackend:
        return self._core.backend

    @property
    def handle(self) -> SandboxHandle:
        """The backend's handle of this sandbox (for backends and servers built on top).

        .. versionadded:: 0.4.0
        """
        return self._core.handle

    def add_secret(self, value: str | Secret) -> None:
        """Redact ``value`` (and its encoded forms) from everything this sandbox returns, from now on.

        For values that reach the sandbox another way than ``environment``
        (a token a tool passes on stdin, a credential a helper writes).

        .. versionadded:: 0.4.0
        """
        self._core.add_secret(value)

    def network_log(self) -> list[dict[str, Any]]:
        """Every connection the sandbox tried through its egress proxy, oldest first.

        One dict per connection, allowed or refused: ``type``
        (``egress.allowed``/``egress.denied``), ``host``, ``port``,
        ``address`` (the resolved address the proxy checked), ``reason``,
        ``detail``, ``method``, ``bytes_up``, ``bytes_down``, ``duration``
        and ``time``; the most recent 1000 are kept.  Empty for a sandbox
        without an allowlist.  Host names and details are redacted (code
        can put a secret in a name it asks for).  docs/egress.md.

        .. versionadded:: 0.4.0
        """
        return self._core.network_log()

    # -- commands --------------------------------------------------------------
    def exec(
        self,
        command: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
        display_command: str | None = None,
    ) -> ExecutionResult:
        """Run ``command``, an argument vector (no shell), and wait for it.

        Args:
            command: program and arguments.
            timeout: seconds before the command and its whole process tree
                are killed; ``None`` bounds it only by the sandbox's lifetime.
            env: extra environment for this command (``environment`` is the
                same, 0.3.0's name).
            cwd: working directory inside the workspace, relative or absolute
                (``workdir`` is the same, 0.3.0's name).
            input: data for the command's stdin.
            display_command: how ``ExecutionResult.command`` and the audit
                event name the command (default: the quoted argv).

        Returns:
            The :class:`ExecutionResult`; a non-zero exit is not an error.

        Raises:
            ExecutionTimeoutError: the command ran past ``timeout``; ``.result``
                has the partial output.  The sandbox lives on.
        """
        shaped = ops.exec_(command, timeout, env, cwd, input, environment, workdir, display_command)
        return self._core.run(shaped)

    def exec_shell(
        self,
        script: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> ExecutionResult:
        """Run ``script`` with ``/bin/sh -c``.  See :meth:`exec`."""
        return self._core.run(ops.exec_shell(script, timeout, env, cwd, input, environment, workdir))

    def exec_python(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> ExecutionResult:
        """Run Python ``code`` in a fresh ``python3`` process.  See :meth:`exec`.

        Code too long for one command-line argument is fed on stdin instead
        (then ``input`` must be None).
        """
        return self._core.run(ops.exec_python(code, timeout, env, cwd, input, environment, workdir))

    def run_code(
        self, code: str, language: str = "python", *, timeout: float | None = None
    ) -> ExecutionResult:
        """Run a snippet (``python`` or ``shell``); read ``.output`` for its output."""
        return self._core.run(ops.run_code(code, language, timeout=timeout))

    def exec_json(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> Any:
        """Run Python ``code`` that prints one JSON document; return it parsed.  See :meth:`exec`."""
        return ops.parse_json(self._core.run(ops.exec_json(code, timeout, env, cwd, environment, workdir)))

    def browser(self, *, timeout: float = 30.0, viewport: tuple[int, int] = (1280, 720)) -> Browser:
        """The Chromium of a browser sandbox (``Sandbox(preset="browser")``), driven from here.

        Each call returns a new handle on the same browser and page (they live in
        the sandbox's ``agentnest.browser`` Python session).  See
        :class:`agentnest.browser.Browser` and docs/presets.md.

        Args:
            timeout: default seconds per action; a page past it is closed
                (:class:`BrowserTimeoutError`), the sandbox goes on.
            viewport: the page's size in CSS pixels.

        .. versionadded:: 0.4.0
        """
        from .browser.driver import Browser

        self._core.check_alive()
        return Browser(self._core, timeout=timeout, viewport=viewport)

    def python_session(self, *, name: str | None = None, start_timeout: float = 30.0) -> PythonSession:
        """Start a persistent Python interpreter in the sandbox, or return the live one of ``name``.

        Variables, imports and open handles live across its ``run()`` calls;
        the value of a trailing expression comes back as ``result``.  See
        :class:`PythonSession` and docs/sessions.md.

        Example::

            with sandbox.python_session() as session:
                session.run("import json; x = 41")
                print(session.run("x + 1").check().result)   # "42"

            sandbox.python_session(name="main").run("x = 41")
            sandbox.python_session(name="main").run("x + 1").result   # "42": the same interpreter

        Args:
            name: without one, a new anonymous session.  With one, the live
                session of that name (the same object on this channel; the
                in-sandbox agent keeps the names, so a new channel to the
                agent finds it too), started under that name if there is none
                or it ended.  1 to 64 letters, digits, ``_``, ``.``, ``-``.
            start_timeout: seconds the interpreter may take to start.

        Raises:
            ConfigurationError: the name is invalid.
            SessionLostError: the interpreter could not start.

        .. versionchanged:: 0.4.0
           Served by the in-sandbox agent (0.3.0 polled files in the workspace); ``name``.
        """
        return open_python_session(self._core, name=name, start_timeout=start_timeout)

    def sessions(self) -> tuple[PythonSessionInfo, ...]:
        """The sandbox's live Python sessions, named and anonymous, oldest first.

        The in-sandbox agent reports them (closed sessions and ones whose
        interpreter ended are not listed), so any host connected to it sees
        the same list.  ``id`` matches :attr:`PythonSession.id`.

        .. versionadded:: 0.4.0
        """
        return list_python_sessions(self._core)

    def stream_exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
        display_command: str | None = None,
        interactive: bool = False,
        pty: tuple[int, int] | None = None,
    ) -> ExecutionStream:
        """Run ``argv`` and iterate over its output as it arrives.  Arguments as for :meth:`exec`.

        Returns an :class:`ExecutionStream`: iterate it for
        :class:`ExecutionChunk` items, the last of which is a ``"status"``
        chunk with the ``exit_code``; ``.result`` holds the
        :class:`ExecutionResult` afterwards.  Leaving the iteration early
        (or ``close()``) kills the command's process tree.

        ``interactive=True`` keeps the command's stdin open after ``input``:
        feed it with :meth:`ExecutionStream.send_input` and end it with
        :meth:`~ExecutionStream.close_input`.  ``pty=(rows, cols)`` runs it on
        a terminal of that size (its output arrives as ``stdout``).

        .. versionadded:: 0.4.0 ``interactive`` and ``pty``.
        """
        command = ops.exec_(
            argv, timeout, env, cwd, input, environment, workdir, display_command, interactive, pty
        )
        return ExecutionStream(self._core, self._core.start(command), timeout)

    def stream_shell(
        self,
        script: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> ExecutionStream:
        """Stream ``/bin/sh -c script``.  See :meth:`stream_exec`."""
        command = ops.stream_shell(script, timeout, env, cwd, environment, workdir)
        return ExecutionStream(self._core, self._core.start(command), timeout)

    def stream_python(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> ExecutionStream:
        """Stream ``python3 -c code``.  See :meth:`stream_exec`."""
        command = ops.stream_python(code, timeout, env, cwd, environment, workdir)
        return ExecutionStream(self._core, self._core.start(command), timeout)

    # -- files -----------------------------------------------------------------
    def write_file(
        self, path: str, content: str | bytes, *, encoding: str = "utf-8", mode: int = 0o644
    ) -> None:
        """Write ``content`` to ``path`` in the workspace (atomically; parents created).

        ``str`` content is encoded with ``encoding``; ``mode`` sets the permission bits.

        Raises:
            FileAccessError: the path is outside the workspace, crosses a
                symlink, or the write failed (e.g. the workspace is full).
        """
        self._core.write_file(path, content, encoding, mode)

    @overload
    def read_file(self, path: str) -> str: ...
    @overload
    def read_file(self, path: str, encoding: str) -> str: ...
    @overload
    def read_file(self, path: str, encoding: None) -> bytes: ...
    @overload
    def read_file(self, path: str, *, encoding: str | None) -> str | bytes: ...
    def read_file(self, path: str, encoding: str | None = "utf-8") -> str | bytes:
        """Read a workspace file: ``str`` (decoded), or ``bytes`` with ``encoding=None``.

        Secrets in the content are redacted in the ``str`` form.

        Raises:
            FileAccessError: missing, not a regular file, outside the
                workspace, over ``max_file_bytes``, or not valid in ``encoding``.
        """
        return self._core.read_file(path, encoding)

    def list_files(
        self, path: str = ".", *, recursive: bool = False, max_entries: int = 10000
    ) -> list[FileInfo]:
        """List a workspace directory (links are listed, never followed)."""
        return self._core.list_files(path, recursive, max_entries)

    def stat(self, path: str) -> FileInfo:
        """Describe one workspace entry, without following a final link.

        A symlink is reported as ``type="symlink"`` (its own size and mode), not
        as what it points to; a link on the way to ``path`` is refused.  The
        returned ``path`` is workspace-relative (``"."`` for the workspace
        itself) with secrets redacted, as in :meth:`list_files`.

        Example::

            info = sandbox.stat("out/report.csv")
            if info.type == "file" and info.size > 0: ...

        Raises:
            FileAccessError: ``code="not_found"`` if nothing is there;
                ``outside_workspace``, ``symlink`` or ``not_directory`` for
                a path that leaves the workspace or crosses a link or a file.
            PolicyDeniedError: an approval hook refused (kind ``file.list``).

        .. versionadded:: 0.4.0
        """
        return self._core.stat(path)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists in the workspace (without following a final link)."""
        return self._core.exists(path)

    def rename(self, source: str, destination: str) -> None:
        """Move the file, link or directory ``source`` to ``destination`` in the workspace.

        Parent directories of ``destination`` are created (as by
        :meth:`write_file`); otherwise this is POSIX ``rename``: an existing
        destination file is replaced atomically, an empty destination
        directory is replaced by a directory, a non-empty one is refused.  A
        link is moved (or replaced) as the link itself; a link on the way to
        either path is refused, as everywhere in the file API.

        Two approvals are asked, since rules match on one path: ``file.remove``
        for ``source`` (details ``path``, ``to``) and ``file.write`` for
        ``destination`` (details ``path``, ``from``).  Emits ``file.moved``
        (``path``, ``to``: workspace-relative).

        Example::

            sandbox.write_file("draft.txt", "v2")
            sandbox.rename("draft.txt", "final/report.txt")

        Raises:
            FileAccessError: with ``code``: ``not_found`` (no ``source``),
                ``not_empty`` (``destination`` is a non-empty directory),
                ``is_directory`` / ``not_directory`` (a file onto a directory
                or the reverse), ``invalid_path`` (the workspace root as
                either path, or a directory moved into itself),
                ``outside_workspace``, ``symlink`` (a link on the way).
            PolicyDeniedError: an approval hook refused.
            UnsupportedCapabilityError: the sandbox's agent predates rename
                (e.g. restored from an older checkpoint); recreate the sandbox.

        .. versionadded:: 0.4.0
        """
        self._core.rename(source, destination)

    def mkdir(self, path: str, *, parents: bool = True) -> None:
        """Create a directory in the workspace."""
        self._core.mkdir(path, parents)

    def remove_file(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file (or a directory tree with ``recursive=True``)."""
        self._core.remove_file(path, recursive)

    def upload_file(self, source: str | os.PathLike[str], destination: str | None = None) -> None:
        """Copy the host file ``source`` into the workspace, to ``destination`` (default: its name)."""
        self._core.upload_file(source, destination)

    def download_file(self, source: str, destination: str | os.PathLike[str]) -> None:
        """Copy the workspace file ``source`` to ``destination`` on the host.

        Parent directories are created; the file is written atomically.
        """
        self._core.download_file(source, destination)

    # -- state: fork, snapshot, restore, artifacts (logic in state.py) ----------
    def fork(self, *, timeout: float | None = None, live: bool | None = None) -> Sandbox:
        """Branch this sandbox into an independent copy of its workspace.

        The child has the same image, limits, environment, policy, observers,
        approval hook and backend, but its own id, labels and deadline
        (``timeout`` seconds from now; the parent's lifetime by default).
        The workspace is streamed from the parent's tar writer straight into
        the child's extractor through the host (no temporary file); sparse
        files stay sparse.  Afterwards neither sees the other's writes.

        With ``live`` (the default where the backend has
        ``Capability.LIVE_FORK``: gVisor on an experimental local engine, for
        a network-denied sandbox with a disk workspace), the child also gets
        the parent's running processes, memory and ``/tmp``: its Python
        sessions hold the parent's variables (``python_session(name=...)``
        finds them) and its commands keep running, in both.  The parent is
        stopped (checkpointed) for the copy and restored.  ``live=False``
        copies the files only: running processes and Python sessions are not
        copied, a session in the child starts empty, and only the workspace
        is copied, not ``/tmp`` or changes to a writable root filesystem.
        docs/state.md explains why.

        Raises:
            SandboxDestroyedError: this sandbox was destroyed.
            UnsupportedCapabilityError: the backend cannot fork, or ``live=True``
                where it cannot (runc; a network that is not denied): the message names ``live=False``.
            SandboxPausedError: the sandbox is paused.
            PolicyDeniedError: the approval hook refused ``fork``.
            SnapshotError: the workspace holds what cannot be copied safely
                (e.g. a symlink pointing outside it); ``.member`` names it.

        .. versionadded:: 0.4.0
        """
        return wrap(_state.fork(self._core, timeout=timeout, live=live))

    def snapshot(self, destination: str | os.PathLike[str], *, compress: bool = False) -> SnapshotMetadata:
        """Save the workspace to ``destination`` on the host as a tar with metadata.

        The file is a POSIX tar (gzip with ``compress=True``) of the
        workspace below ``workspace/``, ending with an
        ``agentnest-snapshot.json`` member (image, time, counts and the
        payload's SHA-256); sparse files stay sparse.  It is written to a
        temporary file next to ``destination`` and renamed into place.  The returned
        :class:`SnapshotMetadata` has the file's ``size`` and ``sha256`` (as
        in 0.3.0) and what the metadata member records.  docs/state.md has
        the format.

        Raises:
            SnapshotError: the workspace holds what a snapshot refuses.
            UnsupportedCapabilityError: the backend cannot snapshot.
            PolicyDeniedError: the approval hook refused ``snapshot``.

        .. versionadded:: 0.4.0
        """
        return _state.snapshot(self._core, destination, compress=compress)

    def restore(self, source: str | os.PathLike[str]) -> SnapshotMetadata:
        """Replace the workspace's contents with those of the snapshot file ``source``.

        Every member is checked on the host and again in the sandbox (no
        absolute paths, no ``..``, no links out, no devices, bounded size
        and entry count), and so are the checksum and the end of the file.
        The new files are staged inside the workspace and swapped in only
        when all of it checked out: after an error the old files are intact.
        The workspace must have room for both while it stages.

        Raises:
            SnapshotError: the file breaks a rule, is corrupt or truncated;
                ``.member`` and ``.rule`` say where and which.

        .. versionadded:: 0.4.0
        """
        return _state.restore(self._core, source)

    @classmethod
    def from_snapshot(
        cls, path: str | os.PathLike[str], *, image: str | None = None, **sandbox_kwargs: Any
    ) -> Sandbox:
        """Create a sandbox from a snapshot file and restore it.

        The image is the one recorded in the snapshot unless ``image`` is
        given; ``sandbox_kwargs`` go to :class:`Sandbox` (the security
        policy still decides whether that image is allowed).  The file is
        validated completely before anything is created.

        .. versionadded:: 0.4.0
        """
        meta = _state.read_snapshot(path)
        sandbox = cls(image if image is not None else (meta.image or None), **sandbox_kwargs)
        try:
            sandbox.restore(path)
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    @classmethod
    def from_checkpoint(
        cls,
        sandbox_id: str,
        *,
        backend: str | RuntimeBackend = "gvisor",
        security_policy: SecurityPolicy | None = None,
        observers: Sequence[Observer] = (),
        approval_hook: ApprovalHook | None = None,
    ) -> Sandbox:
        """Resume a sandbox that a process, this one or another, paused to disk.

        On gVisor with a local engine in experimental mode, :meth:`pause`
        checkpoints the sandbox to disk and releases its memory; the sandbox
        then outlives the process that paused it.  Given its :attr:`id`, this
        restores it here with its processes, Python sessions
        (``python_session(name=...)`` finds them), ``/tmp`` and workspace,
        its configuration (image, limits, environment, secrets) and its
        deadline, which kept counting.  The policy, observers and approval
        hook are this caller's; the policy must allow what the sandbox
        already is.  This process owns it from now on.

        Raises:
            SandboxDestroyedError: no sandbox with that id is paused to disk here,
                or its deadline passed while it was paused.
            SnapshotError: its checkpoint or record is missing, corrupt, or from
                another gVisor or AgentNest version (it stays paused).
            UnsupportedCapabilityError: the backend does not pause to disk.
            BackendError: the sandbox runs: it was never paused to disk, or
                another process resumed it.
            ConfigurationError: ``sandbox_id`` is not a sandbox id, or the
                policy would change the sandbox (its network, profiles, rootless).
            PolicyDeniedError: the policy refuses the sandbox as it is.

        .. versionadded:: 0.4.0
        """
        return wrap(_state.from_checkpoint(sandbox_id, backend, security_policy, observers, approval_hook))

    def artifacts(self, pattern: str = "**/*") -> tuple[Artifact, ...]:
        """An :class:`Artifact` (path, size, sha256) per matching regular file, sorted by path.

        ``pattern`` is a glob relative to the workspace (or absolute below
        it): ``*`` and ``?`` stay within a path component, ``**`` spans any
        number of them; dotfiles match too.  Symlinks are never followed or
        listed.  Files are hashed inside the sandbox.  A tuple, as in 0.3.0.

        Raises:
            ConfigurationError: the pattern is empty or leaves the workspace.

        .. versionchanged:: 0.4.0
           Hashed by a streaming program in the sandbox; ``**`` also matches files.
        """
        return _state.artifacts(self._core, pattern)

    def download(self, path: str, dest: str | os.PathLike[str]) -> Path:
        """Copy a workspace file, or a directory tree, into the host directory ``dest``.

        The copy keeps the last component of ``path`` (``output`` lands in
        ``dest/output``; the workspace root's contents land in ``dest``).
        Nothing is written outside ``dest`` or through a link in it; links
        in the sandbox are refused, not copied.  Returns the copy's path.

        Raises:
            FileAccessError: the path is missing, holds a link, or the
                destination has a link or a file in the way.

        .. versionadded:: 0.4.0
        """
        return _state.download(self._core, path, dest)

    # -- lifecycle ---------------------------------------------------------------
    def extend(self, seconds: float) -> float:
        """Move the sandbox's deadline ``seconds`` later; return the new deadline (epoch seconds).

        The new deadline holds like the first one: the sandbox stops itself
        then even if this process has died, and ``agentnest prune`` honours
        it.  The policy's ``max_timeout`` bounds the whole lifetime,
        extensions included.

        Raises:
            ConfigurationError: ``seconds`` is not a positive number.
            PolicyDeniedError: the new lifetime would pass ``max_timeout``.
            UnsupportedCapabilityError: the backend cannot move deadlines.
            SandboxDestroyedError: the sandbox is gone.

        .. versionadded:: 0.4.0
        """
        return self._core.extend(seconds)

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` stopped the sandbox (until :meth:`resume`).

        .. versionadded:: 0.4.0
        """
        return self._core.paused

    def pause(self) -> None:
        """Stop every process in the sandbox where it is, until :meth:`resume`.

        On runc and gVisor this is the engine's freezer (``docker pause``):
        processes, Python sessions and memory are kept, nothing runs, and the
        deadline keeps counting.  While paused, every new call (``exec``,
        files, sessions, fork, snapshot) raises :class:`SandboxPausedError`;
        calls already in flight wait for the resume (their own timeouts still
        count, in the sandbox too: a command's timeout may expire during a
        long pause).  ``destroy()`` works while paused.  Idempotent.

        Raises:
            SandboxDestroyedError: the sandbox was destroyed or has stopped.
            UnsupportedCapabilityError: the backend cannot pause (``Capability.PAUSE``).

        .. versionadded:: 0.4.0
        """
        self._core.pause()

    def resume(self) -> None:
        """Continue a sandbox stopped by :meth:`pause`.  Idempotent (a running sandbox stays so).

        Raises:
            SandboxDestroyedError: the sandbox was destroyed or has stopped.

        .. versionadded:: 0.4.0
        """
        self._core.resume()

    def logs(self, tail: int = 200) -> str:
        """The container's own log (the keeper and agent diagnostics), redacted."""
        return self._core.logs(tail)

    def destroy(self) -> None:
        """Remove the sandbox and everything in it.  Idempotent."""
        self._core.destroy()

    close = destroy

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()

    def __repr__(self) -> str:
        return repr(self._core)
