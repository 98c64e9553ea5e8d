"""``AsyncSandbox``: the asynchronous face of AgentNest.

Every public method and property of :class:`~agentnest.sandbox.Sandbox` has a
twin here with the same name and the same parameters, to be awaited (streams
are iterated with ``async for``).  The documentation lives on ``Sandbox``;
what differs is said here.  ``tests/unit/test_parity.py`` keeps the two faces
identical.

How it works: engine SDKs and the agent channel block, so ``AsyncSandbox``
wraps a :class:`Sandbox` and runs its blocking calls in worker threads
(``anyio.to_thread.run_sync``); validation, approvals, redaction and events
stay in the shared guard.  A command is started by the synchronous machinery
and its events are awaited in a worker thread that the task abandons if it is
cancelled.

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

import dataclasses
import functools
import inspect
import json
import os
import threading
from collections.abc import (
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from ._aliases import either, renamed
from .approvals import ApprovalHook
from .channel.client import ExecHandle
from .channel.protocol import RawExit
from .config import Artifact, ExecutionChunk, ExecutionResult, FileInfo, SandboxConfig, SnapshotMetadata
from .errors import ChannelError, ConfigurationError, ExecutionError, ExecutionTimeoutError
from .events import Observer
from .guard import StreamDecoder
from .policy import SecurityPolicy
from .profiles import Profile
from .runtime.base import RuntimeBackend, SandboxHandle
from .sandbox import _MAX_INLINE_CODE, Sandbox, _text, with_profile
from .secrets import Secret
from .session import PythonSession, PythonSessionInfo, SessionResult, SessionStream

if TYPE_CHECKING:
    from .browser.aio import AsyncBrowser

__all__ = ["AsyncExecutionStream", "AsyncPythonSession", "AsyncSandbox", "AsyncSessionStream"]

T = TypeVar("T")

#: Commands of one sandbox whose events are awaited at once (each holds a
#: worker thread while it runs).  Their own limiter keeps long commands from
#: starving anyio's default one, which file operations and other libraries use.
MAX_AWAITED_COMMANDS = 128


class _Abandoned(Exception):
    """Raised in a worker thread whose awaiting task has gone; nobody sees it."""


class _Handoff(Generic[T]):
    """Passes an object from a worker thread to the task awaiting it.

    If the task was cancelled first, the thread learns it from :meth:`give`
    and cleans up itself; if the thread was first, the task gets the object
    from :meth:`abandon` and cleans up.  Either way, exactly one side owns it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: T | None = None
        self.abandoned = False

    def give(self, value: T) -> bool:
        with self._lock:
            if self.abandoned:
                return False
            self._value = value
            return True

    def abandon(self) -> T | None:
        with self._lock:
            self.abandoned = True
            return self._value


def _kill(handle: ExecHandle) -> None:
    """Kill a command's process tree and stop listening to it."""
    handle.cancel()
    handle.abandon()


class _LoopBridge:
    """Awaits, in the event loop, the coroutines that hooks and observers return.

    The guard calls hooks synchronously, from the worker threads of
    ``AsyncSandbox`` (or of a pool); the wrapped hook hands a coroutine to the
    loop and waits for its result there.
    """

    def __init__(self) -> None:
        self._token = anyio.lowlevel.current_token()
        self._loop_thread = threading.get_ident()

    def wrap(self, fn: Callable[[Any], Any], timeout: float | None = None) -> Callable[[Any], Any]:
        """``fn`` for the guard's threads; a coroutine it returns is awaited in this loop.

        With ``timeout``, the coroutine is cancelled after that many seconds
        (the guard has denied by then: it waits ``approval_timeout``, and
        approval hooks get one second more here).
        """

        def call(arg: Any) -> Any:
            answer = fn(arg)
            return self.resolve(answer, timeout) if inspect.isawaitable(answer) else answer

        return call

    def wrap_hooks(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``observers``, ``approval_hook`` and the policy's hook of Sandbox arguments, wrapped."""
        hooks: dict[str, Any] = {}
        policy = kwargs.get("security_policy")
        limit = (
            policy.approval_timeout
            if isinstance(policy, SecurityPolicy)
            else SecurityPolicy().approval_timeout
        ) + 1
        if "observers" in kwargs:
            hooks["observers"] = tuple(self.wrap(o) for o in kwargs["observers"])
        if kwargs.get("approval_hook") is not None:
            hooks["approval_hook"] = self.wrap(kwargs["approval_hook"], limit)
        hook = policy.approval_hook if isinstance(policy, SecurityPolicy) else None
        if (
            isinstance(policy, SecurityPolicy)
            and hook is not None
            and not getattr(hook, "agentnest_inline", False)
        ):
            # Awaited in this loop, like the sandbox's own hook.
            hooks["security_policy"] = dataclasses.replace(policy, approval_hook=self.wrap(hook, limit))
        return hooks

    def resolve(self, awaitable: Any, timeout: float | None = None) -> Any:
        if threading.get_ident() == self._loop_thread:
            # Blocking the loop's own thread on the loop would deadlock.
            _close(awaitable)
            raise RuntimeError("an async hook cannot be awaited from its event loop's own thread")

        async def wait() -> Any:
            # Shielded from the caller's cancellation (a sync hook cannot be
            # interrupted either), but not from its own deadline.
            with anyio.CancelScope(shield=True):
                if timeout is None:
                    return await awaitable
                with anyio.move_on_after(timeout):
                    return await awaitable
                return None  # no answer in time: a no

        try:
            # Always the loop that created the sandbox: the token also works
            # from threads that anyio did not start (a pool's).
            return anyio.from_thread.run(wait, token=self._token)
        except BaseException:
            _close(awaitable)  # never started: no "never awaited" warning
            raise


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


async def _provision(build: Callable[[], Sandbox]) -> AsyncSandbox:
    """Make a sandbox in a worker thread; if the task is cancelled, it is destroyed, never leaked."""
    handoff: _Handoff[Sandbox] = _Handoff()

    def provision() -> Sandbox:
        sandbox = build()
        if not handoff.give(sandbox):
            sandbox.destroy()  # the awaiting task was cancelled meanwhile
            raise _Abandoned
        return sandbox

    try:
        sandbox = await anyio.to_thread.run_sync(provision, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        made = handoff.abandon()
        if made is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(made.destroy)
        raise
    return AsyncSandbox(sandbox)


class _Creation:
    """What :meth:`AsyncSandbox.create` returns: await it, or ``async with`` it."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, AsyncSandbox]]) -> None:
        self._make = make
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._make().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._make()
        return self._sandbox

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.destroy()


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

    def __init__(self, sandbox: Sandbox) -> None:
        """Wrap a running :class:`Sandbox`.

        Prefer :meth:`create`: only a sandbox made by it can await async
        approval hooks and observers (a wrapped one refuses async hooks, as
        ``Sandbox`` does).
        """
        self._sandbox = sandbox
        self._waits = anyio.CapacityLimiter(MAX_AWAITED_COMMANDS)

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
    ) -> _Creation:
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
            return await _provision(functools.partial(Sandbox, image, timeout, **{**options, **hooks}))

        return _Creation(make)

    @classmethod
    def from_snapshot(
        cls, path: str | os.PathLike[str], *, image: str | None = None, **sandbox_kwargs: Any
    ) -> _Creation:
        """See :meth:`Sandbox.from_snapshot`; await it or ``async with`` it, as :meth:`create`."""

        async def make() -> AsyncSandbox:
            kwargs = {**sandbox_kwargs, **_LoopBridge().wrap_hooks(sandbox_kwargs)}
            return await _provision(functools.partial(Sandbox.from_snapshot, path, image=image, **kwargs))

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
    ) -> _Creation:
        """See :meth:`Sandbox.from_checkpoint`; await it or ``async with`` it, as :meth:`create`.

        .. versionadded:: 0.4.0
        """

        async def make() -> AsyncSandbox:
            hooks = _LoopBridge().wrap_hooks(
                {"observers": observers, "approval_hook": approval_hook, "security_policy": security_policy}
            )
            return await _provision(
                functools.partial(Sandbox.from_checkpoint, sandbox_id, backend=backend, **hooks)
            )

        return _Creation(make)

    # -- properties ------------------------------------------------------------

    @property
    def id(self) -> str:
        """See :attr:`Sandbox.id`."""
        return self._sandbox.id

    @property
    def config(self) -> SandboxConfig:
        """See :attr:`Sandbox.config`."""
        return self._sandbox.config

    @property
    def destroyed(self) -> bool:
        """See :attr:`Sandbox.destroyed`."""
        return self._sandbox.destroyed

    @property
    def deadline(self) -> float:
        """See :attr:`Sandbox.deadline`."""
        return self._sandbox.deadline

    @property
    def backend(self) -> RuntimeBackend:
        """See :attr:`Sandbox.backend`."""
        return self._sandbox.backend

    @property
    def handle(self) -> SandboxHandle:
        """See :attr:`Sandbox.handle`."""
        return self._sandbox.handle

    # -- plumbing --------------------------------------------------------------

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run a bounded blocking call in a worker thread (not abandoned on cancel)."""
        return await anyio.to_thread.run_sync(fn)

    async def _command(self, fn: Callable[[], T], handoff: _Handoff[ExecHandle]) -> T:
        """Wait in a worker thread for a command; cancelling kills its process tree."""
        try:
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=self._waits)
        except anyio.get_cancelled_exc_class():
            handle = handoff.abandon()
            if handle is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_kill, handle)
            raise

    def _run(
        self, handoff: _Handoff[ExecHandle], start: Callable[[], ExecHandle], timeout: float | None
    ) -> ExecutionResult:
        """:meth:`Sandbox.exec`, line for line, but cancellable through ``handoff``."""
        sandbox = self._sandbox
        handle = start()
        if not handoff.give(handle):
            _kill(handle)
            raise _Abandoned
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            for event in handle.events(sandbox._wait_deadline(timeout)):
                if isinstance(event, tuple):
                    (out if event[0] == 1 else err).append(event[1])
        except ChannelError as exc:
            if handoff.abandoned:
                raise _Abandoned from None
            raise sandbox._lost(exc) from None
        except BaseException:
            _kill(handle)
            raise
        return sandbox._result(handle, b"".join(out), b"".join(err), timeout)

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
        handoff: _Handoff[ExecHandle] = _Handoff()
        start = functools.partial(
            self._sandbox._start,
            command,
            timeout,
            either(env, environment, "env", "environment"),
            either(cwd, workdir, "cwd", "workdir"),
            input,
            display_command=display_command,
        )
        return await self._command(functools.partial(self._run, handoff, start, timeout), handoff)

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
        return await self.exec(
            ["/bin/sh", "-c", _text(script, "script")],
            timeout=timeout,
            env=either(env, environment, "env", "environment"),
            cwd=either(cwd, workdir, "cwd", "workdir"),
            input=input,
            display_command=script,
        )

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
        code = _text(code, "code")
        env = either(env, environment, "env", "environment")
        cwd = either(cwd, workdir, "cwd", "workdir")
        if len(code.encode("utf-8", "surrogateescape")) > _MAX_INLINE_CODE:
            if input is not None:
                raise ConfigurationError(
                    "code longer than 100 KiB is sent on stdin, so input= cannot be used with it; "
                    "write the code to a file with write_file and run it instead"
                )
            return await self.exec(
                ["python3", "-"],
                timeout=timeout,
                env=env,
                cwd=cwd,
                input=code,
                display_command="python -c <code>",
            )
        return await self.exec(
            self._sandbox._python_argv(code),
            timeout=timeout,
            env=env,
            cwd=cwd,
            input=input,
            display_command="python -c <code>",
        )

    async def run_code(
        self, code: str, language: str = "python", *, timeout: float | None = None
    ) -> ExecutionResult:
        """See :meth:`Sandbox.run_code`."""
        if language in ("python", "py", "python3"):
            return await self.exec_python(code, timeout=timeout)
        if language in ("shell", "sh", "bash"):
            return await self.exec_shell(code, timeout=timeout)
        raise ConfigurationError(f"language {language!r} is not supported; use 'python' or 'shell'")

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
        result = (
            await self.exec_python(
                code,
                timeout=timeout,
                env=either(env, environment, "env", "environment"),
                cwd=either(cwd, workdir, "cwd", "workdir"),
            )
        ).check()
        try:
            return json.loads(result.stdout)
        except ValueError as exc:
            raise ExecutionError(f"the code's stdout is not JSON: {exc}", result) from None

    async def browser(
        self, *, timeout: float = 30.0, viewport: tuple[int, int] = (1280, 720)
    ) -> AsyncBrowser:
        """See :meth:`Sandbox.browser`; the browser's actions are awaited."""
        from .browser.aio import AsyncBrowser

        browser = await self._call(
            functools.partial(self._sandbox.browser, timeout=timeout, viewport=viewport)
        )
        return AsyncBrowser(browser)

    async def python_session(
        self, *, name: str | None = None, start_timeout: float = 30.0
    ) -> AsyncPythonSession:
        """See :meth:`Sandbox.python_session`; the session's methods are awaited."""
        session = await self._call(
            functools.partial(self._sandbox.python_session, name=name, start_timeout=start_timeout)
        )
        return AsyncPythonSession(session, self._waits)

    async def sessions(self) -> tuple[PythonSessionInfo, ...]:
        """See :meth:`Sandbox.sessions`."""
        return await self._call(self._sandbox.sessions)

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
        if not isinstance(interactive, bool):
            raise ConfigurationError("interactive must be True or False")
        start = functools.partial(
            self._sandbox._start,
            argv,
            timeout,
            either(env, environment, "env", "environment"),
            either(cwd, workdir, "cwd", "workdir"),
            input,
            display_command=display_command,
            keep_stdin_open=interactive or pty is not None,
            pty=pty,
        )
        return AsyncExecutionStream(self, start, timeout)

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
        return self.stream_exec(
            ["/bin/sh", "-c", _text(script, "script")],
            timeout=timeout,
            env=either(env, environment, "env", "environment"),
            cwd=either(cwd, workdir, "cwd", "workdir"),
            display_command=script,
        )

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
        return self.stream_exec(
            self._sandbox._python_argv(code),
            timeout=timeout,
            env=either(env, environment, "env", "environment"),
            cwd=either(cwd, workdir, "cwd", "workdir"),
            display_command="python -c <code>",
        )

    # -- files -----------------------------------------------------------------

    async def write_file(
        self, path: str, content: str | bytes, *, encoding: str = "utf-8", mode: int = 0o644
    ) -> None:
        """See :meth:`Sandbox.write_file`."""
        await self._call(
            functools.partial(self._sandbox.write_file, path, content, encoding=encoding, mode=mode)
        )

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
        return await self._call(functools.partial(self._sandbox.read_file, path, encoding))

    async def list_files(
        self, path: str = ".", *, recursive: bool = False, max_entries: int = 10000
    ) -> list[FileInfo]:
        """See :meth:`Sandbox.list_files`."""
        return await self._call(
            functools.partial(self._sandbox.list_files, path, recursive=recursive, max_entries=max_entries)
        )

    async def stat(self, path: str) -> FileInfo:
        """See :meth:`Sandbox.stat`."""
        return await self._call(functools.partial(self._sandbox.stat, path))

    async def exists(self, path: str) -> bool:
        """See :meth:`Sandbox.exists`."""
        return await self._call(functools.partial(self._sandbox.exists, path))

    async def rename(self, source: str, destination: str) -> None:
        """See :meth:`Sandbox.rename`."""
        await self._call(functools.partial(self._sandbox.rename, source, destination))

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        """See :meth:`Sandbox.mkdir`."""
        await self._call(functools.partial(self._sandbox.mkdir, path, parents=parents))

    async def remove_file(self, path: str, *, recursive: bool = False) -> None:
        """See :meth:`Sandbox.remove_file`."""
        await self._call(functools.partial(self._sandbox.remove_file, path, recursive=recursive))

    async def upload_file(self, source: str | os.PathLike[str], destination: str | None = None) -> None:
        """See :meth:`Sandbox.upload_file`."""
        await self._call(functools.partial(self._sandbox.upload_file, source, destination))

    async def download_file(self, source: str, destination: str | os.PathLike[str]) -> None:
        """See :meth:`Sandbox.download_file`."""
        await self._call(functools.partial(self._sandbox.download_file, source, destination))

    # -- state -----------------------------------------------------------------

    async def fork(self, *, timeout: float | None = None, live: bool | None = None) -> AsyncSandbox:
        """See :meth:`Sandbox.fork`.  A child whose fork is cancelled is destroyed."""
        return await _provision(functools.partial(self._sandbox.fork, timeout=timeout, live=live))

    async def snapshot(
        self, destination: str | os.PathLike[str], *, compress: bool = False
    ) -> SnapshotMetadata:
        """See :meth:`Sandbox.snapshot`."""
        return await self._call(functools.partial(self._sandbox.snapshot, destination, compress=compress))

    async def restore(self, source: str | os.PathLike[str]) -> SnapshotMetadata:
        """See :meth:`Sandbox.restore`."""
        return await self._call(functools.partial(self._sandbox.restore, source))

    async def artifacts(self, pattern: str = "**/*") -> tuple[Artifact, ...]:
        """See :meth:`Sandbox.artifacts`."""
        return await self._call(functools.partial(self._sandbox.artifacts, pattern))

    async def download(self, path: str, dest: str | os.PathLike[str]) -> Path:
        """See :meth:`Sandbox.download`."""
        return await self._call(functools.partial(self._sandbox.download, path, dest))

    # -- lifecycle ---------------------------------------------------------------

    async def add_secret(self, value: str | Secret) -> None:
        """See :meth:`Sandbox.add_secret`."""
        self._sandbox.add_secret(value)  # in memory only: no thread needed

    async def network_log(self) -> list[dict[str, Any]]:
        """See :meth:`Sandbox.network_log`."""
        return self._sandbox.network_log()  # a copy of an in-memory log: no I/O, no thread

    async def extend(self, seconds: float) -> float:
        """See :meth:`Sandbox.extend`."""
        return await self._call(functools.partial(self._sandbox.extend, seconds))

    @property
    def paused(self) -> bool:
        """See :attr:`Sandbox.paused`."""
        return self._sandbox.paused

    async def pause(self) -> None:
        """See :meth:`Sandbox.pause`."""
        await self._call(self._sandbox.pause)

    async def resume(self) -> None:
        """See :meth:`Sandbox.resume`.  Runs to the end even if the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._sandbox.resume)

    async def logs(self, tail: int = 200) -> str:
        """See :meth:`Sandbox.logs`."""
        return await self._call(functools.partial(self._sandbox.logs, tail))

    async def destroy(self) -> None:
        """See :meth:`Sandbox.destroy`.  Runs to the end even if the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._sandbox.destroy)

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


class AsyncExecutionStream:
    """Output of a running command for ``async for``; the twin of :class:`ExecutionStream`.

    Iterate it once for :class:`ExecutionChunk` items; ``.result`` holds the
    :class:`ExecutionResult` afterwards (a timeout raises
    :class:`ExecutionTimeoutError` after the last chunk, as in the sync face).
    Cancelling the iterating task, ``await stream.aclose()`` or leaving an
    ``async with stream:`` block kills the command's process tree.  Breaking
    out of a bare ``async for`` leaves the command running until the stream
    is garbage-collected: use ``async with`` to stop it at once.
    """

    def __init__(self, sandbox: AsyncSandbox, start: Callable[[], ExecHandle], timeout: float | None) -> None:
        self._owner = sandbox
        self._start = start
        self._timeout = timeout
        self._handoff: _Handoff[ExecHandle] = _Handoff()
        self._handle: ExecHandle | None = None
        self._deadline = 0.0
        self._decoder: StreamDecoder | None = None
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._tail: list[ExecutionChunk] = []
        self._error: ExecutionError | None = None
        self._finished = False
        self.result: ExecutionResult | None = None

    # -- worker-thread side ----------------------------------------------------

    def _begin(self) -> ExecHandle:
        handle = self._handle
        if handle is None:
            sandbox = self._owner._sandbox
            handle = self._start()
            if not self._handoff.give(handle):
                _kill(handle)
                raise _Abandoned
            self._deadline = sandbox._wait_deadline(self._timeout)
            self._decoder = sandbox._guard.stream_decoder()
            self._handle = handle
        return handle

    def _step(self) -> tuple[int, bytes] | RawExit:
        handle = self._begin()
        try:
            return handle.next_event(self._deadline)
        except ChannelError as exc:
            if self._handoff.abandoned:
                raise _Abandoned from None
            raise self._owner._sandbox._lost(exc) from None

    def _finish(self, raw: RawExit) -> ExecutionResult:
        assert self._handle is not None and self._handle.result is raw
        return self._owner._sandbox._result(
            self._handle, b"".join(self._out), b"".join(self._err), self._timeout
        )

    # -- task side ---------------------------------------------------------------

    def __aiter__(self) -> AsyncExecutionStream:
        return self

    async def __anext__(self) -> ExecutionChunk:
        while True:
            if self._tail:
                return self._tail.pop(0)
            if self._finished:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            try:
                event = await self._owner._command(self._step, self._handoff)
            except BaseException:
                await self.aclose()
                raise
            assert self._decoder is not None
            if isinstance(event, tuple):
                fd, data = event
                (self._out if fd == 1 else self._err).append(data)
                chunk = self._decoder.feed(fd, data)
                if chunk is not None:
                    return chunk
                continue
            self._finished = True
            self._tail = self._decoder.flush()
            try:
                # In a thread: finishing emits events, and observers may block.
                self.result = await anyio.to_thread.run_sync(self._finish, event)
            except ExecutionTimeoutError as exc:
                self._error = exc
            else:
                self._tail.append(ExecutionChunk("status", exit_code=self.result.exit_code))

    async def aclose(self) -> None:
        """Kill the command's process tree if it still runs (see :meth:`ExecutionStream.close`)."""
        self._finished = True
        handle = self._handoff.abandon()
        if handle is not None and handle.result is None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_kill, handle)

    close = aclose

    def _running(self) -> ExecHandle:
        handle = self._handle
        if handle is None:
            raise ConfigurationError("the command has not started yet: use `async with stream:` first")
        return handle

    async def send_input(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin (started with ``interactive=True`` or a ``pty``).

        Input to a command that has ended is dropped, as a pipe would.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise ConfigurationError("input must be bytes")
        handle = self._running()
        if handle.result is None:
            await self._owner._call(functools.partial(handle.write_stdin, bytes(data)))

    async def close_input(self) -> None:
        """Close the command's stdin: it reads end of file."""
        handle = self._running()
        if handle.result is None:
            await self._owner._call(functools.partial(handle.write_stdin, b"", True))

    async def kill(self) -> None:
        """Kill the command's process tree; the iteration still ends, with its status."""
        handle = self._running()
        if handle.result is None:
            await self._owner._call(handle.cancel)

    async def resize(self, rows: int, cols: int) -> None:
        """Set the size of the command's terminal (started with ``pty=``)."""
        handle = self._running()
        await self._owner._call(functools.partial(handle.resize, rows, cols))

    async def __aenter__(self) -> AsyncExecutionStream:
        if not self._finished:
            await self._owner._command(self._begin, self._handoff)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # The twin of a sync stream's generator being closed by the garbage
        # collector: a forgotten command must not run on until its timeout.
        handle = self._handle
        if handle is not None and handle.result is None and not self._handoff.abandoned:
            try:
                _kill(handle)
            except Exception:  # noqa: S110 - nothing can be reported from __del__
                pass


_END = object()
_It = TypeVar("_It", bound="_ThreadIterator[Any]")


class _ThreadIterator(Generic[T]):
    """``async for`` over a blocking iterator: each item is fetched in a worker thread.

    Cancelling the iterating task calls ``interrupt`` (if given), waits for
    the blocked fetch to return, and closes the iterator; so does
    :meth:`aclose` (or leaving ``async with``).
    """

    def __init__(
        self,
        open: Callable[[], Iterable[T]],
        interrupt: Callable[[], None] | None,
        limiter: anyio.CapacityLimiter,
    ) -> None:
        self._open = open
        self._interrupt = interrupt
        self._limiter = limiter
        self._iterator: Iterator[T] | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._done = False

    def _step(self) -> Any:
        try:
            if self._iterator is None:
                self._iterator = iter(self._open())
            return next(self._iterator, _END)
        finally:
            self._idle.set()

    def __aiter__(self: _It) -> _It:
        return self

    async def __anext__(self) -> T:
        if self._done:
            raise StopAsyncIteration
        self._idle.clear()
        try:
            item = await anyio.to_thread.run_sync(self._step, abandon_on_cancel=True, limiter=self._limiter)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if self._interrupt is not None:
                    await anyio.to_thread.run_sync(self._interrupt)
                await anyio.to_thread.run_sync(self._idle.wait)  # the fetch returns once stopped
                await self.aclose()
            raise
        except BaseException:
            await self.aclose()
            raise
        if item is _END:
            self._done = True
            raise StopAsyncIteration
        return cast(T, item)

    async def aclose(self) -> None:
        """Stop: close the underlying iterator (what it runs is stopped)."""
        self._done = True
        iterator, self._iterator = self._iterator, None
        close = getattr(iterator, "close", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(close)

    close = aclose

    async def __aenter__(self: _It) -> _It:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSessionStream(_ThreadIterator[ExecutionChunk]):
    """Output of session code for ``async for``; the twin of :class:`SessionStream`.

    ``.result`` holds the :class:`SessionResult` afterwards.  Cancelling the
    iterating task, ``aclose()`` or leaving ``async with`` interrupts the
    code (``KeyboardInterrupt``); the session stays.

    .. versionadded:: 0.4.0
    """

    def __init__(self, stream: SessionStream, session: PythonSession, limiter: anyio.CapacityLimiter) -> None:
        super().__init__(lambda: stream, session.interrupt, limiter)
        self._stream = stream

    @property
    def result(self) -> SessionResult | None:
        """See :attr:`SessionStream.result`."""
        return self._stream.result


class AsyncPythonSession:
    """A persistent Python interpreter, awaited; the twin of :class:`PythonSession`.

    Use ``await sandbox.python_session()`` on an :class:`AsyncSandbox`::

        async with await sandbox.python_session() as session:
            await session.run("x = 41")
            print((await session.run("x + 1")).check().result)   # "42"

    Each method is documented on :class:`PythonSession`.  Cancelling an
    awaited :meth:`run` interrupts the code (``KeyboardInterrupt``): the
    session and what it defined before stay.

    .. versionadded:: 0.4.0
    """

    def __init__(self, session: PythonSession, limiter: anyio.CapacityLimiter) -> None:
        self._session = session
        self._limiter = limiter

    @property
    def id(self) -> str:
        """See :attr:`PythonSession.id`."""
        return self._session.id

    @property
    def name(self) -> str | None:
        """See :attr:`PythonSession.name`."""
        return self._session.name

    @property
    def closed(self) -> bool:
        """See :attr:`PythonSession.closed`."""
        return self._session.closed

    @property
    def pid(self) -> int | None:
        """See :attr:`PythonSession.pid`."""
        return self._session.pid

    async def start(self) -> None:
        """See :meth:`PythonSession.start`."""
        await anyio.to_thread.run_sync(self._session.start)

    async def run(self, code: str, *, timeout: float | None = 30.0) -> SessionResult:
        """See :meth:`PythonSession.run`."""
        stream = self.stream(code, timeout=timeout)
        async for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream(self, code: str, *, timeout: float | None = None) -> AsyncSessionStream:
        """See :meth:`PythonSession.stream`; iterate the result with ``async for``."""
        return AsyncSessionStream(self._session.stream(code, timeout=timeout), self._session, self._limiter)

    async def interrupt(self) -> None:
        """See :meth:`PythonSession.interrupt`."""
        await anyio.to_thread.run_sync(self._session.interrupt)

    async def reset(self) -> None:
        """See :meth:`PythonSession.reset`."""
        await anyio.to_thread.run_sync(self._session.reset)

    async def close(self) -> None:
        """See :meth:`PythonSession.close`.  Runs to the end even if the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._session.close)

    async def __aenter__(self) -> AsyncPythonSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return "<Async" + repr(self._session)[1:]
