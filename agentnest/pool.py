"""Pools of warm sandboxes: :class:`SandboxPool` and its async twin :class:`AsyncSandboxPool`.

A pool keeps up to ``size`` sandboxes made by a factory, created ahead of
time in background threads, and lends them out::

    with SandboxPool(lambda: Sandbox(timeout=3600), size=4) as pool:
        with pool.acquire() as sandbox:
            sandbox.exec_shell("echo hi")

Rules (the same for both faces; the async one drives the same core):

* **Bounded.**  Every sandbox the pool owns holds one of ``size`` slots from
  the moment its creation starts until its ``destroy()`` has returned, so
  there are never more than ``size`` alive, in use or not.
* **Health-checked on acquire.**  A sandbox that was destroyed, is close to
  its deadline, or whose agent does not answer a ping (``health_check``) is
  destroyed and replaced, and the acquire goes on with another one.
* **Reset after use, in the background.**  Leaving ``with pool.acquire()``
  returns at once; the reset runs in the pool's threads and only a sandbox
  whose reset has finished is lent again, so an acquire never waits for a
  reset unless every sandbox is in use or being reset.
  ``reset="clean"`` (the default) kills every process of the use (background
  jobs, ``nohup``, double-forked daemons, Python sessions and the sockets they
  held), closes the agent's sessions, empties the workspace, ``/tmp`` (which
  is ``$HOME``), ``/dev/shm`` and ``/dev/mqueue``, removes SysV IPC objects
  (runc) and forgets the egress log, then lends the same sandbox again, up to
  ``max_uses`` times.  With the default read-only root that is every place a
  use can write, so the next use starts as a fresh sandbox would; a sandbox
  with a writable root is destroyed after its use instead.  Still the same
  container: its engine identity, deadline and ``add_secret`` redactions stay.
  ``reset="destroy"`` destroys every sandbox after one use and creates a fresh
  one: nothing, not even the container, is shared; use it between tenants.
* **Waiting.**  When every slot is in use, ``acquire`` waits up to
  ``acquire_timeout`` seconds, then raises :class:`PoolExhaustedError`.
* **A failing factory** does not break the pool: its exception reaches a
  waiting ``acquire`` as :class:`PoolFactoryError` (``__cause__`` is the
  original), and the next acquire tries again.  While the factory keeps
  failing, the pool tries one creation at a time, only for waiting callers.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from importlib import resources
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from ._bridge import _Abandoned, _Handoff
from ._core import core_of
from .aio import AsyncSandbox
from .errors import ConfigurationError, PoolExhaustedError, PoolFactoryError
from .sandbox import Sandbox, wrap

__all__ = ["AsyncSandboxPool", "PoolStats", "SandboxPool"]

#: How long the health check waits for the agent's answer to a ping.
PING_TIMEOUT = 5.0
#: A sandbox with less lifetime left than this (or than a tenth of its whole
#: lifetime, if that is shorter) is retired instead of lent out.
MIN_LIFETIME_LEFT = 10.0
#: How long the ``clean`` reset may take before the sandbox is destroyed instead.
CLEAN_TIMEOUT = 30.0
#: A sandbox whose clean reset (its commands and session list answered by the
#: agent) ended less than this many seconds ago, and whose channel is still
#: open, is lent without another ping: the reset just proved what the ping
#: would.  Back to back, this saves a round trip per acquire.
FRESH_RESET = 0.5

#: The ``clean`` reset (``agent/clean.sh``), a POSIX shell script run as the sandbox's user (a shell
#: starts in ~1 ms where Python takes ~15 ms: the reset must be done before
#: the next acquire needs the sandbox).  Only builtins run when the use left
#: nothing behind; ``rm``/``chmod``/``ipcrm`` run only for what is there.
#:
#: 1. It refuses to run anywhere but in a sandbox: the first two lines of
#:    PID 1's command line (NULs dropped by the shell) must be those of
#:    AgentNest's keeper (``python3 -S -c`` and the loader's first line,
#:    ``import sys``, from runtime/bootstrap.py; if that ever changes, every clean fails and the
#:    pool destroys instead: safe).
#:    On a host, "kill every process but my parent" would be a disaster.
#: 2. It SIGKILLs every process except PID 1, its parent (the agent) and
#:    itself, again and again until ``/proc`` lists no other (a zombie stays
#:    listed until the agent or PID 1 reaps it, which they do at once):
#:    background jobs, ``nohup``, double-forked daemons, session
#:    interpreters, and the sockets they listen on.  Only a glob of ``/proc``
#:    per round, no file reads: the shell reads files a byte per system call,
#:    which costs tens of milliseconds on gVisor.
#: 3. It empties the workspace, ``/tmp``, ``/dev/shm`` and ``/dev/mqueue``,
#:    dotfiles and locked directories included, restoring the modes of the
#:    first two when they no longer let the sandbox's user in (or ``/tmp``
#:    lost its sticky bit), and removes SysV IPC objects where the kernel
#:    lists them (``/proc/sysvipc``; gVisor does not): ``ipcrm -a`` always,
#:    one program is cheaper than the shell reading those files byte by byte.
#:
#: It prints ``killed`` if it had processes to kill, then ``clean`` only if
#: everything is gone; anything else (a process that outlives SIGKILL, an
#: entry it cannot remove) exits non-zero and the pool destroys the sandbox
#: instead of lending it again.
CLEAN_SCRIPT = resources.files("agentnest.agent").joinpath("clean.sh").read_text("utf-8")


def _ping(sandbox: Sandbox) -> None:
    """Raise unless the sandbox's agent answers (reconnecting a lost agent first)."""
    core_of(sandbox).link().request({"t": "ping"}, time.monotonic() + PING_TIMEOUT)


def reusable(sandbox: Sandbox) -> bool:
    """Whether the ``clean`` reset can give ``sandbox`` back as it was created.

    Only with a read-only root: a writable root filesystem keeps whatever a
    use changed outside the places the reset empties, so such a sandbox is
    destroyed after each use even with ``reset="clean"``.
    """
    return bool(sandbox.config.read_only_root)


def _clean(sandbox: Sandbox) -> bool:
    """Reset a sandbox for its next use (see :data:`CLEAN_SCRIPT`); ``False``: destroy it instead."""
    if not reusable(sandbox):
        return False
    deadline = time.monotonic() + CLEAN_TIMEOUT
    result = sandbox.exec(
        ["/bin/sh", "-c", CLEAN_SCRIPT, "agentnest-clean", sandbox.config.workdir], timeout=CLEAN_TIMEOUT
    )
    if result.exit_code != 0 or result.stdout not in ("clean\n", "killed\nclean\n"):
        return False
    # Python sessions: their interpreters died with every other process; the
    # agent unlists a session when it notices, so close what it still lists
    # (named ones too: the next use's python_session(name=...) starts afresh).
    # A session is a process (its interpreter, or a zombie until the agent
    # reaps it and unlists the session): when the script killed nothing,
    # there is none to close, and the round trip is spared.
    ch = core_of(sandbox).link()
    caps = ch.hello.capabilities if ch.hello is not None else frozenset()
    if "session-names" in caps and result.stdout.startswith("killed"):
        listed = ch.list_sessions(deadline)
        for info in listed:
            ch.session_call({"t": "session.close", "session": info.session}, deadline)
        if listed and ch.list_sessions(deadline):  # the agent unlists a closed session at once
            return False
    if sandbox.config.secret_files:
        # Secret(..., as_file=True) values live in /tmp, which the script emptied:
        # write them again, as the sandbox had them when it was created.
        try:
            core_of(sandbox).write_secret_files(sandbox.config.secret_files)
        except Exception:
            return False
    _forget_network_log(sandbox)
    return True


def _forget_network_log(sandbox: Sandbox) -> None:
    """Drop the previous use's egress records, so the next user's ``network_log()`` starts empty."""
    log = sandbox.handle.info.get("egress")
    clear = getattr(log, "clear", None)  # EgressLog's, for an allowlisted sandbox
    if callable(clear):
        clear()


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Counters of a pool at one moment.

    .. versionadded:: 0.4.0
    """

    size: int
    """The most sandboxes the pool keeps alive at once."""
    created: int
    """Sandboxes the factory made so far."""
    destroyed: int
    """Sandboxes the pool retired so far (destroyed, or found destroyed)."""
    in_use: int
    """Sandboxes lent out right now."""
    idle: int
    """Warm sandboxes ready to be lent."""
    creating: int
    """Creations running right now."""
    failed: int
    """Factory calls that raised so far."""


class _Entry:
    """A sandbox the pool owns, and how often it was lent."""

    __slots__ = ("cleaned", "margin", "sandbox", "uses")

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.uses = 0
        #: ``time.monotonic()`` when its last clean reset ended (0: never).
        self.cleaned = 0.0
        #: Retire it when less lifetime than this is left.
        self.margin = min(MIN_LIFETIME_LEFT, 0.1 * (sandbox.deadline - time.time()))


class SandboxPool:
    """A bounded pool of warm sandboxes (rules in :mod:`agentnest.pool`).

    Example::

        pool = SandboxPool(lambda: Sandbox(timeout=3600), size=8)
        pool.start()                          # warm up in the background
        with pool.acquire() as sandbox:       # waits up to acquire_timeout
            print(sandbox.exec_shell("echo hi").stdout)
        pool.close()                          # destroys every sandbox

    Args:
        factory: makes one sandbox; called in the pool's threads.  Give its
            sandboxes a lifetime (``timeout``) long enough to wait idle.
        size: the most sandboxes alive at once (warm, lent out, being
            created or destroyed).
        max_uses: with ``reset="clean"``, how many times one sandbox is lent
            before it is replaced (defence in depth, and a bound on what the
            agent's process accumulates).
        acquire_timeout: seconds :meth:`acquire` waits for a free sandbox.
        reset: ``"clean"`` a sandbox after each use (kill its processes,
            close its sessions, empty its workspace, ``/tmp``, ``/dev/shm``)
            and reuse it, or ``"destroy"`` it and create a fresh one.
        health_check: ping a sandbox's agent before lending it out.

    Raises:
        ConfigurationError: an argument is invalid.

    The pool is thread-safe.  It starts creating sandboxes on :meth:`start`,
    on ``with pool:`` or on the first :meth:`acquire`.

    .. versionadded:: 0.4.0
    """

    def __init__(
        self,
        factory: Callable[[], Sandbox],
        size: int = 2,
        *,
        max_uses: int = 100,
        acquire_timeout: float = 30.0,
        reset: Literal["destroy", "clean"] = "clean",
        health_check: bool = True,
    ) -> None:
        if not callable(factory):
            raise ConfigurationError("factory must be a callable that returns a Sandbox")
        for name, value in (("size", size), ("max_uses", max_uses)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name}={value!r} must be a positive int")
        if (
            isinstance(acquire_timeout, bool)
            or not isinstance(acquire_timeout, (int, float))
            or not acquire_timeout > 0
        ):
            raise ConfigurationError(
                f"acquire_timeout={acquire_timeout!r} must be a positive number of seconds"
            )
        if reset not in ("destroy", "clean"):
            raise ConfigurationError(f"reset={reset!r} must be 'destroy' or 'clean'")
        self._factory = factory
        self._size = size
        self._max_uses = max_uses
        self._acquire_timeout = float(acquire_timeout)
        self._reset = reset
        self._health_check = bool(health_check)
        self._cond = threading.Condition()
        self._idle: deque[_Entry] = deque()
        self._leased: set[_Entry] = set()
        self._alive = 0  # slots held: creating, idle, lent, cleaning or being destroyed
        self._creating = 0
        self._created = 0
        self._destroyed = 0
        self._failed = 0
        self._waiters = 0
        self._errors: deque[BaseException] = deque()  # factory failures owed to waiters
        self._last_error: BaseException | None = None
        self._failing = False
        self._started = False
        self._closed = False
        self._jobs = ThreadPoolExecutor(max_workers=size, thread_name_prefix="agentnest-pool")

    # -- public ------------------------------------------------------------------

    @property
    def size(self) -> int:
        """The most sandboxes alive at once."""
        return self._size

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def stats(self) -> PoolStats:
        """The pool's counters (a consistent snapshot)."""
        with self._cond:
            return PoolStats(
                size=self._size,
                created=self._created,
                destroyed=self._destroyed,
                in_use=len(self._leased),
                idle=len(self._idle),
                creating=self._creating,
                failed=self._failed,
            )

    def start(self, wait: bool = False) -> None:
        """Start creating sandboxes in the background, up to ``size``.

        Args:
            wait: block until every creation started here has finished.

        Raises:
            PoolFactoryError: with ``wait=True``, a creation failed.
            PoolExhaustedError: the pool is closed.
        """
        with self._cond:
            self._check_open()
            failed = self._failed
            self._started = True
            self._fill()
            if not wait:
                return
            while self._creating and not self._closed:
                self._cond.wait()
            self._check_open()
            if self._failed > failed:
                raise self._factory_error(self._last_error)

    @contextmanager
    def acquire(self, timeout: float | None = None) -> Iterator[Sandbox]:
        """Lend a healthy sandbox for the ``with`` block, then reset it.

        Args:
            timeout: seconds to wait for one; ``None`` uses ``acquire_timeout``.

        Raises:
            PoolExhaustedError: none became free in time, or the pool is closed.
            PoolFactoryError: the factory failed while this call waited.
        """
        entry = self._checkout(timeout)
        try:
            yield entry.sandbox
        finally:
            self._release(entry)

    def close(self) -> None:
        """Destroy every sandbox of the pool, lent ones included.  Idempotent.

        Waiting acquires raise :class:`PoolExhaustedError`; creations still
        running finish and their sandboxes are destroyed before this returns.
        """
        with self._cond:
            victims = [] if self._closed else [*self._idle, *self._leased]
            self._closed = True
            self._idle.clear()
            self._leased.clear()
            self._cond.notify_all()
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(victims)))) as destroyers:
            for entry in victims:
                destroyers.submit(self._destroy, entry)
            self._jobs.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats
        state = "closed" if self._closed else f"{s.idle} idle, {s.in_use} in use"
        return f"<SandboxPool size={self._size} reset={self._reset!r} {state}>"

    # -- lending ---------------------------------------------------------------

    def _checkout(self, timeout: float | None, cancelled: Callable[[], bool] | None = None) -> _Entry:
        wait = self._acquire_timeout if timeout is None else timeout
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
            raise ConfigurationError(f"timeout={timeout!r} must be a number of seconds >= 0 or None")
        deadline = time.monotonic() + wait
        while True:
            entry = self._take(deadline, wait, cancelled)
            if self._healthy(entry):
                return entry
            with self._cond:
                if entry in self._leased:  # else close() took it and destroys it
                    self._leased.remove(entry)
                    self._submit(self._destroy_job, entry)

    def _take(self, deadline: float, wait: float, cancelled: Callable[[], bool] | None) -> _Entry:
        with self._cond:
            self._check_open()
            self._started = True
            self._waiters += 1
            try:
                while True:
                    if cancelled is not None and cancelled():
                        raise _Abandoned
                    if self._errors:
                        raise self._factory_error(self._errors.popleft())
                    if self._idle:
                        entry = self._idle.pop()  # the most recently used: its caches are warm
                        entry.uses += 1
                        self._leased.add(entry)
                        return entry
                    self._fill()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise PoolExhaustedError(
                            f"no sandbox became free within {wait:g}s: "
                            f"all {self._size} are in use or being prepared ({self._describe()}); "
                            "raise size or acquire_timeout, or release sandboxes sooner"
                        )
                    self._cond.wait(remaining)
                    self._check_open()
            finally:
                self._waiters -= 1
                if not self._waiters:
                    self._errors.clear()  # owed to nobody any more

    def _healthy(self, entry: _Entry) -> bool:
        sandbox = entry.sandbox
        if sandbox.destroyed:
            return False
        if sandbox.deadline - time.time() < entry.margin:
            return False
        if not self._health_check:
            return True
        channel = core_of(sandbox).channel
        if time.monotonic() - entry.cleaned < FRESH_RESET and channel is not None and channel.alive:
            return True
        try:
            _ping(sandbox)
        except Exception:
            return False
        return True

    def _release(self, entry: _Entry) -> None:
        with self._cond:
            if entry not in self._leased:
                return  # closed meanwhile: close() destroys it
            self._leased.remove(entry)
            reuse = self._reset == "clean" and entry.uses < self._max_uses and not entry.sandbox.destroyed
            if self._submit(self._clean_job if reuse else self._destroy_job, entry):
                return
        self._destroy(entry)  # closed: nothing may be queued any more

    def _give_back(self, entry: _Entry) -> None:
        """Return an entry that was taken but never used (its taker was cancelled)."""
        with self._cond:
            if entry not in self._leased:
                return
            self._leased.remove(entry)
            entry.uses -= 1
            self._idle.append(entry)
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- background work (never raises) --------------------------------------

    def _fill(self) -> None:
        """Start creations up to ``size`` (one at a time while the factory fails).  Holds the lock."""
        if self._closed or not self._started:
            return
        wanted = self._size - self._alive
        if self._failing:
            # Probe, only for callers who wait, instead of hammering a broken factory.
            wanted = min(wanted, 1 if self._waiters > len(self._idle) and not self._creating else 0)
        for _ in range(max(wanted, 0)):
            self._alive += 1
            self._creating += 1
            if not self._submit(self._create_job):
                self._alive -= 1
                self._creating -= 1

    def _submit(self, job: Callable[..., None], *args: Any) -> bool:
        """Queue a job unless the pool is closed.  Holds the lock."""
        if self._closed:
            return False
        self._jobs.submit(job, *args)
        return True

    def _create_job(self) -> None:
        try:
            sandbox = self._factory()
        except Exception as exc:
            with self._cond:
                self._alive -= 1
                self._creating -= 1
                self._failed += 1
                self._failing = True
                self._last_error = exc
                if self._waiters:
                    self._errors.append(exc)
                self._cond.notify_all()
            return
        entry = _Entry(sandbox)
        with self._cond:
            self._creating -= 1
            self._created += 1
            self._failing = False
            if not self._closed:
                self._idle.append(entry)
                self._fill()
                self._cond.notify_all()
                return
        self._destroy(entry)

    def _clean_job(self, entry: _Entry) -> None:
        try:
            ok = _clean(entry.sandbox)
        except Exception:
            ok = False
        if ok:
            entry.cleaned = time.monotonic()
            with self._cond:
                if not self._closed:
                    self._idle.append(entry)
                    self._cond.notify_all()
                    return
        self._destroy_job(entry)

    def _destroy_job(self, entry: _Entry) -> None:
        self._destroy(entry)
        with self._cond:
            self._fill()

    def _destroy(self, entry: _Entry) -> None:
        """Destroy a sandbox and free its slot."""
        try:
            entry.sandbox.destroy()
        except Exception:  # noqa: S110 - the engine's deadline and `agentnest prune` reap it
            pass
        with self._cond:
            self._alive -= 1
            self._destroyed += 1
            self._cond.notify_all()

    # -- helpers -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PoolExhaustedError("the pool is closed; no sandbox can be acquired from it")

    def _describe(self) -> str:
        return f"{len(self._leased)} in use, {self._creating} being created"

    def _factory_error(self, exc: BaseException | None) -> PoolFactoryError:
        error = PoolFactoryError(
            f"the pool's factory failed: {type(exc).__name__}: {exc}; "
            "the pool will call it again on the next acquire"
        )
        error.__cause__ = exc
        return error


class AsyncSandboxPool:
    """The asynchronous twin of :class:`SandboxPool`; it lends :class:`AsyncSandbox` objects.

    Example::

        async with AsyncSandboxPool(lambda: AsyncSandbox.create(timeout=3600), size=4) as pool:
            async with pool.acquire() as sandbox:
                print((await sandbox.exec_shell("echo hi")).stdout)

    Arguments and rules are those of :class:`SandboxPool`, except that
    ``factory`` returns an awaitable of an :class:`AsyncSandbox` (such as
    ``AsyncSandbox.create(...)``), which is awaited in the event loop that
    started the pool.  Use the pool from that event loop.  Cancelling a
    waiting :meth:`acquire` gives up the wait.

    .. versionadded:: 0.4.0
    """

    def __init__(
        self,
        factory: Callable[[], Awaitable[AsyncSandbox]],
        size: int = 2,
        *,
        max_uses: int = 100,
        acquire_timeout: float = 30.0,
        reset: Literal["destroy", "clean"] = "clean",
        health_check: bool = True,
    ) -> None:
        if not callable(factory):
            raise ConfigurationError("factory must be a callable that returns an awaitable AsyncSandbox")
        self._factory = factory
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._pool = SandboxPool(
            self._make,
            size,
            max_uses=max_uses,
            acquire_timeout=acquire_timeout,
            reset=reset,
            health_check=health_check,
        )

    def _make(self) -> Sandbox:
        """The core's factory: await the user's in the pool's event loop (from a pool thread)."""
        token = self._token
        if token is None:  # pragma: no cover - _bind() runs before anything starts the core
            raise RuntimeError("the pool was not started from an event loop")

        async def make() -> AsyncSandbox:
            sandbox = await self._factory()
            if not isinstance(sandbox, AsyncSandbox):
                raise TypeError(f"the factory returned {type(sandbox).__name__}, not an AsyncSandbox")
            return sandbox

        return wrap(core_of(anyio.from_thread.run(make, token=token)))

    def _bind(self) -> None:
        if self._token is None:
            self._token = anyio.lowlevel.current_token()

    @property
    def size(self) -> int:
        """See :attr:`SandboxPool.size`."""
        return self._pool.size

    @property
    def closed(self) -> bool:
        """See :attr:`SandboxPool.closed`."""
        return self._pool.closed

    @property
    def stats(self) -> PoolStats:
        """See :attr:`SandboxPool.stats`."""
        return self._pool.stats

    async def start(self, wait: bool = False) -> None:
        """See :meth:`SandboxPool.start`."""
        self._bind()
        await anyio.to_thread.run_sync(self._pool.start, wait, abandon_on_cancel=True)

    @asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[AsyncSandbox]:
        """See :meth:`SandboxPool.acquire`; use it with ``async with``."""
        self._bind()
        handoff: _Handoff[_Entry] = _Handoff()

        def checkout() -> _Entry:
            entry = self._pool._checkout(timeout, lambda: handoff.abandoned)
            if not handoff.give(entry):
                self._pool._give_back(entry)
                raise _Abandoned
            return entry

        try:
            entry = await anyio.to_thread.run_sync(checkout, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            taken = handoff.abandon()
            self._pool._wake()  # the waiting thread sees the abandonment and gives up
            if taken is not None:
                self._pool._give_back(taken)
            raise
        try:
            yield AsyncSandbox(entry.sandbox)
        finally:
            self._pool._release(entry)  # bookkeeping only: the reset runs in the pool's threads

    async def close(self) -> None:
        """See :meth:`SandboxPool.close`.  Runs to the end even if the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._pool.close)

    aclose = close

    async def __aenter__(self) -> AsyncSandboxPool:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return repr(self._pool).replace("<SandboxPool", "<AsyncSandboxPool", 1)
