"""``AsyncSandbox``: the asynchronous face of AgentNest.

Every public method and property of :class:`~agentnest.sandbox.Sandbox` has a
twin here with the same name and the same parameters, to be awaited (streams
are iterated with ``async for``).  The documentation lives on ``Sandbox``;
what differs is said here.  ``tests/unit/test_parity.py`` keeps the two faces
identical.

How it works: engine SDKs and the agent channel block, so ``AsyncSandbox``
runs the calls of the same :class:`~agentnest._core.SandboxCore` as
``Sandbox`` in worker threads (:mod:`agentnest._bridge`); requests are shaped
by :mod:`agentnest.ops`, and validation, approvals, redaction and events stay
in the shared guard.  A command is started by the core and its events are
awaited in a worker thread that the task abandons if it is cancelled.

Cancellation:

* cancelling an awaited command (``exec*``, ``run_code``, ``exec_json``) or
  the task iterating a stream kills the command's whole process tree in the
  sandbox, exactly as its timeout would; the sandbox lives on;
* cancelling an awaited ``session.run`` (or a session stream) interrupts the
  code with ``KeyboardInterrupt``; the session keeps its state;
* file operations, ``snapshot``, ``restore``, ``download``, ``logs`` and
  ``destroy`` finish in their thread before the cancellation is delivered
  (they are bounded by their own deadlines);
* a sandbox whose ``create``, ``from_snapshot`` or ``fork`` is cancelled is
  destroyed as soon as the engine hands it over.

Hooks: approval hooks and observers given to :meth:`AsyncSandbox.create` may
be coroutine functions.  The guard calls them from the worker thread; a
coroutine they return is awaited in the event loop (shielded from the
caller's cancellation, as a sync hook cannot be interrupted either) and its
result is used exactly as a sync hook's would be: falsy or raising denies.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

import anyio
import anyio.to_thread

from . import ops
from . import state as _state
from ._aliases import renamed
from ._bridge import MAX_AWAITED_COMMANDS as MAX_AWAITED_COMMANDS
from ._bridge import Commands, _Creation, _LoopBridge, provision
from ._core import SandboxCore, bind, core_of
from .aio_streams import AsyncExecutionStream, AsyncPythonSession, AsyncSessionStream
from .approvals import ApprovalHook
from .config import Artifact, ExecutionResult, FileInfo, SandboxConfig, SnapshotMetadata
from .events import Observer
from .ops import with_profile
from .policy import SecurityPolicy
from .profiles import Profile
from .runtime.base import RuntimeBackend, SandboxHandle
from .sandbox import Sandbox
from .secrets import Secret
from .session import PythonSessionInfo, list_python_sessions, open_python_session

if TYPE_CHECKING:
    from .browser.aio import AsyncBrowser

__all__ = ["AsyncExecutionStream", "AsyncPythonSession", "AsyncSandbox", "AsyncSessionStream"]


class AsyncSandbox:
    """The asynchronous twin of :class:`~agentnest.Sandbox`: same methods, awaited.

    Create one with :meth:`create`, which takes exactly the arguments of
    ``Sandbox(...)``; either await it or use it as an async context manager::

        async with AsyncSandbox.create("python:3.12-slim", timeout=60) as sandbox:
            await sandbox.write_file("main.py", "print('hello from isolation')")
            print((await sandbox.exec_shell("python main.py")).stdout)
            async for chunk in sandbox.stream_shell("python long_job.py"):
                print(chunk.data, end="")

        sandbox = await AsyncSandbox.create()
        try:
            ...
        finally:
            await sandbox.destroy()

    Each method is documented on :class:`~agentnest.Sandbox`; cancellation and
    async hooks are described in the module :mod:`agentnest.aio`.  Use an
    ``AsyncSandbox`` from one event loop.

    .. versionadded:: 0.4.0
    """

    def __init__(self, sandbox: Sandbox) -> None:  # a face of the same core
        """Wrap a running :class:`Sandbox`.

        Prefer :meth:`create`: only a sandbox made by it can await async
        approval hooks and observers (a wrapped one refuses async hooks, as
        ``Sandbox`` does).
        """
        self._core = core_of(sandbox)
        bind(self, self._core)
        self._bridge = Commands()

    @classmethod
    def _of(cls, core: SandboxCore) -> AsyncSandbox:
        sandbox = cls.__new__(cls)
        sandbox._core = core
        bind(sandbox, core)
        sandbox._bridge = Commands()
        return sandbox

    @classmethod
    @with_profile(image=False)
    def create(
        cls,
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
    ) -> _Creation[AsyncSandbox]:
        """Provision a sandbox; the twin of ``Sandbox(...)`` (see there for the arguments).

        Returns an awaitable that is also an async context manager:
        ``sandbox = await AsyncSandbox.create(...)`` or
        ``async with AsyncSandbox.create(...) as sandbox:`` (destroyed on exit).
        ``observers`` and ``approval_hook`` may be coroutine functions.
        """
        options: dict[str, Any] = {
            "environment": environment,
            "workdir": workdir,
            "network_enabled": network_enabled,
            "memory": memory,
            "cpus": cpus,
            "pids": pids,
            "gpus": gpus,
            "workspace_size": workspace_size,
            "scratch_size": scratch_size,
            "backend": backend,
            "read_only_root": read_only_root,
            "security_policy": security_policy,
            "verify": verify,
            "disk": disk,
            "workspace": workspace,
            "preset": preset,
        }
        image = renamed(
            image,
            runtime,
            "image",
            "runtime",
            ours_given=image is not None,
            where="AsyncSandbox.create()",
            stacklevel=4,
        )

        async def make() -> AsyncSandbox:
            hooks = _LoopBridge().wrap_hooks(
                {"observers": observers, "approval_hook": approval_hook, "security_policy": security_policy}
            )
            # Built in the thread by Sandbox(...): a preset's image may be built there.
            build = functools.partial(Sandbox, image, timeout, **{**options, **hooks})
            return cls._of(await provision(lambda: core_of(build())))

        return _Creation(make)

    @classmethod
    def from_snapshot(
        cls, path: str | os.PathLike[str], *, image: str | None = None, **sandbox_kwargs: Any
    ) -> _Creation[AsyncSandbox]:
        """See :meth:`Sandbox.from_snapshot`; await it or ``async with`` it, as :meth:`create`."""

        async def make() -> AsyncSandbox:
            kwargs = {**sandbox_kwargs, **_LoopBridge().wrap_hooks(sandbox_kwargs)}
            build = functools.partial(Sandbox.from_snapshot, path, image=image, **kwargs)
            return cls._of(await provision(lambda: core_of(build())))

        return _Creation(make)

    @classmethod
    def from_checkpoint(
        cls,
        sandbox_id: str,
        *,
        backend: str | RuntimeBackend = "gvisor",
        security_policy: SecurityPolicy | None = None,
        observers: Sequence[Observer] = (),
        approval_hook: ApprovalHook | None = None,
    ) -> _Creation[AsyncSandbox]:
        """See :meth:`Sandbox.from_checkpoint`; await it or ``async with`` it, as :meth:`create`.

        .. versionadded:: 0.4.0
        """

        async def make() -> AsyncSandbox:
            hooks = _LoopBridge().wrap_hooks(
                {"observers": observers, "approval_hook": approval_hook, "security_policy": security_policy}
            )
            hooks.setdefault("observers", observers)
            hooks.setdefault("approval_hook", approval_hook)
            hooks.setdefault("security_policy", security_policy)
            build = functools.partial(
                _state.from_checkpoint,
                sandbox_id,
                backend,
                hooks["security_policy"],
                hooks["observers"],
                hooks["approval_hook"],
            )
            return cls._of(await provision(build))

        return _Creation(make)

    # -- properties ------------------------------------------------------------

    @property
    def id(self) -> str:
        """See :attr:`Sandbox.id`."""
        return self._core.id

    @property
    def config(self) -> SandboxConfig:
        """See :attr:`Sandbox.config`."""
        return self._core.config

    @property
    def destroyed(self) -> bool:
        """See :attr:`Sandbox.destroyed`."""
        return self._core.destroyed

    @property
    def deadline(self) -> float:
        """See :attr:`Sandbox.deadline`."""
        return self._core.deadline

    @property
    def backend(self) -> RuntimeBackend:
        """See :attr:`Sandbox.backend`."""
        return self._core.backend

    @property
    def handle(self) -> SandboxHandle:
        """See :attr:`Sandbox.handle`."""
        return self._core.handle

    # -- commands --------------------------------------------------------------

    async def exec(
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
        """See :meth:`Sandbox.exec`.  Cancelling the await kills the command's process tree."""
        return await self._bridge.run(
            self._core,
            ops.exec_(
                command,
                timeout=timeout,
                env=env,
                cwd=cwd,
                input=input,
                environment=environment,
                workdir=workdir,
                display_command=display_command,
            ),
        )

    async def exec_shell(
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
        """See :meth:`Sandbox.exec_shell`."""
        command = ops.exec_shell(
            script, timeout=timeout, env=env, cwd=cwd, input=input, environment=environment, workdir=workdir
        )
        return await self._bridge.run(self._core, command)

    async def exec_python(
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
        """See :meth:`Sandbox.exec_python`."""
        command = ops.exec_python(
            code, timeout=timeout, env=env, cwd=cwd, input=input, environment=environment, workdir=workdir
        )
        return await self._bridge.run(self._core, command)

    async def run_code(
        self, code: str, language: str = "python", *, timeout: float | None = None
    ) -> ExecutionResult:
        """See :meth:`Sandbox.run_code`."""
        return await self._bridge.run(self._core, ops.run_code(code, language, timeout=timeout))

    async def exec_json(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> Any:
        """See :meth:`Sandbox.exec_json`."""
        command = ops.exec_json(
            code, timeout=timeout, env=env, cwd=cwd, environment=environment, workdir=workdir
        )
        return ops.parse_json(await self._bridge.run(self._core, command))

    async def browser(
        self, *, timeout: float = 30.0, viewport: tuple[int, int] = (1280, 720)
    ) -> AsyncBrowser:
        """See :meth:`Sandbox.browser`; the browser's actions are awaited."""
        from .browser.aio import AsyncBrowser
        from .browser.driver import Browser

        def make() -> Browser:
            self._core.check_alive()
            return Browser(self._core, timeout=timeout, viewport=viewport)

        return AsyncBrowser(await self._bridge.call(make))

    async def python_session(
        self, *, name: str | None = None, start_timeout: float = 30.0
    ) -> AsyncPythonSession:
        """See :meth:`Sandbox.python_session`; the session's methods are awaited."""
        session = await self._bridge.call(
            open_python_session, self._core, name=name, start_timeout=start_timeout
        )
        return AsyncPythonSession(session, self._bridge.limiter)

    async def sessions(self) -> tuple[PythonSessionInfo, ...]:
        """See :meth:`Sandbox.sessions`."""
        return await self._bridge.call(list_python_sessions, self._core)

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
    ) -> AsyncExecutionStream:
        """See :meth:`Sandbox.stream_exec`; iterate the result with ``async for``.

        The command starts at the first iteration, or on ``async with``
        (which also kills it on exit if it still runs); argument errors and
        approval refusals surface there.

        ``interactive=True`` keeps the command's stdin open after ``input``:
        feed it with :meth:`AsyncExecutionStream.send_input` and end it with
        :meth:`~AsyncExecutionStream.close_input`.  ``pty=(rows, cols)`` runs
        it on a terminal of that size (output arrives as ``stdout``; resize
        with :meth:`~AsyncExecutionStream.resize`).

        .. versionadded:: 0.4.0 ``interactive`` and ``pty``.
        """
        command = ops.exec_(
            argv,
            timeout=timeout,
            env=env,
            cwd=cwd,
            input=input,
            environment=environment,
            workdir=workdir,
            display_command=display_command,
            interactive=interactive,
            pty=pty,
        )
        return AsyncExecutionStream(self._core, command, self._bridge)

    def stream_shell(
        self,
        script: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> AsyncExecutionStream:
        """See :meth:`Sandbox.stream_shell` and :meth:`stream_exec`."""
        command = ops.stream_shell(
            script, timeout=timeout, env=env, cwd=cwd, environment=environment, workdir=workdir
        )
        return AsyncExecutionStream(self._core, command, self._bridge)

    def stream_python(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> AsyncExecutionStream:
        """See :meth:`Sandbox.stream_python` and :meth:`stream_exec`."""
        command = ops.stream_python(
            code, timeout=timeout, env=env, cwd=cwd, environment=environment, workdir=workdir
        )
        return AsyncExecutionStream(self._core, command, self._bridge)

    # -- files -----------------------------------------------------------------

    async def write_file(
        self, path: str, content: str | bytes, *, encoding: str = "utf-8", mode: int = 0o644
    ) -> None:
        """See :meth:`Sandbox.write_file`."""
        await self._bridge.call(self._core.write_file, path, content, encoding, mode)

    @overload
    async def read_file(self, path: str) -> str: ...
    @overload
    async def read_file(self, path: str, encoding: str) -> str: ...
    @overload
    async def read_file(self, path: str, encoding: None) -> bytes: ...
    @overload
    async def read_file(self, path: str, *, encoding: str | None) -> str | bytes: ...
    async def read_file(self, path: str, encoding: str | None = "utf-8") -> str | bytes:
        """See :meth:`Sandbox.read_file`."""
        return await self._bridge.call(self._core.read_file, path, encoding)

    async def list_files(
        self, path: str = ".", *, recursive: bool = False, max_entries: int = 10000
    ) -> list[FileInfo]:
        """See :meth:`Sandbox.list_files`."""
        return await self._bridge.call(self._core.list_files, path, recursive, max_entries)

    async def stat(self, path: str) -> FileInfo:
        """See :meth:`Sandbox.stat`."""
        return await self._bridge.call(self._core.stat, path)

    async def exists(self, path: str) -> bool:
        """See :meth:`Sandbox.exists`."""
        return await self._bridge.call(self._core.exists, path)

    async def rename(self, source: str, destination: str) -> None:
        """See :meth:`Sandbox.rename`."""
        await self._bridge.call(self._core.rename, source, destination)

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        """See :meth:`Sandbox.mkdir`."""
        await self._bridge.call(self._core.mkdir, path, parents=parents)

    async def remove_file(self, path: str, *, recursive: bool = False) -> None:
        """See :meth:`Sandbox.remove_file`."""
        await self._bridge.call(self._core.remove_file, path, recursive=recursive)

    async def upload_file(self, source: str | os.PathLike[str], destination: str | None = None) -> None:
        """See :meth:`Sandbox.upload_file`."""
        await self._bridge.call(self._core.upload_file, source, destination)

    async def download_file(self, source: str, destination: str | os.PathLike[str]) -> None:
        """See :meth:`Sandbox.download_file`."""
        await self._bridge.call(self._core.download_file, source, destination)

    # -- state -----------------------------------------------------------------

    async def fork(self, *, timeout: float | None = None, live: bool | None = None) -> AsyncSandbox:
        """See :meth:`Sandbox.fork`.  A child whose fork is cancelled is destroyed."""
        return AsyncSandbox._of(
            await provision(functools.partial(_state.fork, self._core, timeout=timeout, live=live))
        )

    async def snapshot(
        self, destination: str | os.PathLike[str], *, compress: bool = False
    ) -> SnapshotMetadata:
        """See :meth:`Sandbox.snapshot`."""
        return await self._bridge.call(_state.snapshot, self._core, destination, compress=compress)

    async def restore(self, source: str | os.PathLike[str]) -> SnapshotMetadata:
        """See :meth:`Sandbox.restore`."""
        return await self._bridge.call(_state.restore, self._core, source)

    async def artifacts(self, pattern: str = "**/*") -> tuple[Artifact, ...]:
        """See :meth:`Sandbox.artifacts`."""
        return await self._bridge.call(_state.artifacts, self._core, pattern)

    async def download(self, path: str, dest: str | os.PathLike[str]) -> Path:
        """See :meth:`Sandbox.download`."""
        return await self._bridge.call(_state.download, self._core, path, dest)

    # -- lifecycle ---------------------------------------------------------------

    async def add_secret(self, value: str | Secret) -> None:
        """See :meth:`Sandbox.add_secret`."""
        self._core.add_secret(value)  # in memory only: no thread needed

    async def network_log(self) -> list[dict[str, Any]]:
        """See :meth:`Sandbox.network_log`."""
        return self._core.network_log()  # a copy of an in-memory log: no I/O, no thread

    async def extend(self, seconds: float) -> float:
        """See :meth:`Sandbox.extend`."""
        return await self._bridge.call(self._core.extend, seconds)

    @property
    def paused(self) -> bool:
        """See :attr:`Sandbox.paused`."""
        return self._core.paused

    async def pause(self) -> None:
        """See :meth:`Sandbox.pause`."""
        await self._bridge.call(self._core.pause)

    async def resume(self) -> None:
        """See :meth:`Sandbox.resume`.  Runs to the end even if the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._core.resume)

    async def logs(self, tail: int = 200) -> str:
        """See :meth:`Sandbox.logs`."""
        return await self._bridge.call(self._core.logs, tail)

    async def destroy(self) -> None:
        """See :meth:`Sandbox.destroy`.  Runs to the end even if the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._core.destroy)

    close = destroy
    aclose = destroy

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.destroy()

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else "running"
        return f"<AsyncSandbox {self.id} image={self.config.image!r} {state}>"
