"""Thread and event-loop plumbing for the async face.

This module decides how blocking work of a :class:`~agentnest._core.SandboxCore`
is awaited without blocking the event loop, and what cancelling an await
does: a command's wait runs in a worker thread that the task abandons on
cancellation, and the command's process tree is killed (:class:`Commands`);
a sandbox made in a thread is destroyed if its awaiting task has gone
(:func:`provision`); hooks that return coroutines are awaited in the loop
(:class:`_LoopBridge`); blocking iterators are iterated with ``async for``
(:class:`_ThreadIterator`).  Nothing here knows a face.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Generator, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from ._core import Command, SandboxCore
from .channel.client import ExecHandle
from .config import ExecutionResult
from .errors import ChannelError
from .policy import SecurityPolicy

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


async def provision(build: Callable[[], SandboxCore]) -> SandboxCore:
    """Make a sandbox in a worker thread; if the task is cancelled, it is destroyed, never leaked."""
    handoff: _Handoff[SandboxCore] = _Handoff()

    def make() -> SandboxCore:
        core = build()
        if not handoff.give(core):
            core.destroy()  # the awaiting task was cancelled meanwhile
            raise _Abandoned
        return core

    try:
        return await anyio.to_thread.run_sync(make, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        made = handoff.abandon()
        if made is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(made.destroy)
        raise


class Commands:
    """The awaited commands of one sandbox: each waits in a worker thread; cancelling kills it."""

    def __init__(self) -> None:
        self.limiter = anyio.CapacityLimiter(MAX_AWAITED_COMMANDS)

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a bounded blocking call in a worker thread (not abandoned on cancel)."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    async def wait(self, fn: Callable[[], T], handoff: _Handoff[ExecHandle]) -> T:
        """Wait in a worker thread for a command; cancelling kills its process tree."""
        try:
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=self.limiter)
        except anyio.get_cancelled_exc_class():
            handle = handoff.abandon()
            if handle is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_kill, handle)
            raise

    async def run(self, core: SandboxCore, command: Command) -> ExecutionResult:
        """``core.run(command)``, awaited; cancelling the await kills the command's process tree."""
        handoff: _Handoff[ExecHandle] = _Handoff()
        return await self.wait(functools.partial(_run, core, command, handoff), handoff)


def _run(core: SandboxCore, command: Command, handoff: _Handoff[ExecHandle]) -> ExecutionResult:
    """:meth:`SandboxCore.run`, line for line, but cancellable through ``handoff``."""
    handle = core.start(command)
    if not handoff.give(handle):
        _kill(handle)
        raise _Abandoned
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        for event in handle.events(core.wait_deadline(command.timeout)):
            if isinstance(event, tuple):
                (out if event[0] == 1 else err).append(event[1])
    except ChannelError as exc:
        if handoff.abandoned:
            raise _Abandoned from None
        raise core.lost(exc) from None
    except BaseException:
        _kill(handle)
        raise
    return core.result(handle, b"".join(out), b"".join(err), command.timeout)


class _Creation(Generic[T]):
    """What :meth:`AsyncSandbox.create` returns: await it, or ``async with`` it (destroyed on exit)."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, T]]) -> None:
        self._make = make
        self._sandbox: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    async def __aenter__(self) -> T:
        self._sandbox = await self._make()
        return self._sandbox

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.destroy()  # type: ignore[attr-defined]


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
