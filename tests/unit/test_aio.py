"""AsyncSandbox (aio.py) over the real agent, run as an unsandboxed child process.

A tiny backend in this file puts each sandbox's agent in a temporary
directory on this machine (``doubles.local_agent.LocalAgent``), so the
async face, the guard and the channel all run for real without an engine.
Commands here are harmless; every command whose processes are checked
carries a unique environment tag, and what survives a test is killed by the
fixture after checking that tag.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from doubles.local_agent import LocalBackend
from server_fakes import tagged

from agentnest import (
    AsyncExecutionStream,
    AsyncSandbox,
    ConfigurationError,
    ExecutionChunk,
    ExecutionError,
    ExecutionTimeoutError,
    FileAccessError,
    MemoryObserver,
    PolicyDeniedError,
    Sandbox,
    SandboxDestroyedError,
    SandboxEvent,
)
from agentnest._bridge import _LoopBridge, _ThreadIterator
from agentnest._core import core_of
from agentnest.guard import ApprovalRequest
from agentnest.policy import SecurityPolicy
from agentnest.runtime.base import Capability
from agentnest.sandbox import wrap

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

WAIT = 15.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


#: What these tests' backend claims (it enforces none of it).
CAPS = frozenset({Capability.NETWORK_DENIED, Capability.RESOURCE_LIMITS, Capability.READ_ONLY_ROOT})


async def wait_for(predicate: Callable[[], Any], what: str, within: float = WAIT) -> None:
    """Poll a condition (sync or async) with a deadline."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if hasattr(value, "__await__"):
            value = await value
        if value:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        await anyio.sleep(0.01)


@pytest.fixture
def tag() -> Iterator[str]:
    value = uuid.uuid4().hex
    yield value
    for pid in tagged(value):  # a failed test must not leave processes behind
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path, CAPS)


@pytest.fixture
async def sandbox(backend: LocalBackend) -> AsyncIterator[AsyncSandbox]:
    async with AsyncSandbox.create("local", 120, backend=backend) as sb:
        yield sb


# -- creation and lifecycle -------------------------------------------------------------


async def test_create_await_and_destroy(backend: LocalBackend) -> None:
    sb = await AsyncSandbox.create("local", 60, backend=backend)
    try:
        assert sb.config.image == "local" and sb.config.lifetime == 60
        assert sb.backend is backend
        assert time.time() < sb.deadline <= time.time() + 60
        assert sb.id in repr(sb) and "running" in repr(sb)
    finally:
        await sb.destroy()
    assert sb.destroyed and backend.destroyed == [sb.id]
    await sb.destroy()  # idempotent
    assert backend.destroyed == [sb.id]
    with pytest.raises(SandboxDestroyedError):
        await sb.exec(["true"])


async def test_async_with_destroys_on_exit_and_on_error(backend: LocalBackend) -> None:
    async with AsyncSandbox.create("local", backend=backend) as sb:
        assert (await sb.exec_shell("echo hi")).stdout == "hi\n"
    assert sb.destroyed
    with pytest.raises(KeyError):
        async with await AsyncSandbox.create("local", backend=backend) as other:
            raise KeyError("boom")
    assert other.destroyed and backend.destroyed == [sb.id, other.id]


async def test_bad_arguments_surface_on_await(backend: LocalBackend) -> None:
    creation = AsyncSandbox.create("local", backend=backend, memory="lots")
    with pytest.raises(ConfigurationError):
        await creation
    assert backend.agents == {}


async def test_cancelled_create_destroys_the_sandbox(backend: LocalBackend) -> None:
    backend.gate.clear()  # provisioning blocks in the engine
    with anyio.move_on_after(WAIT) as scope:
        async with anyio.create_task_group() as tg:

            async def create() -> None:
                await AsyncSandbox.create("local", backend=backend)
                raise AssertionError("create was not cancelled")

            tg.start_soon(create)
            await anyio.to_thread.run_sync(backend.creating.wait, WAIT)
            tg.cancel_scope.cancel()
    assert not scope.cancelled_caught  # the cancellation was ours, not the guard timeout's
    backend.gate.set()  # the engine finishes; the abandoned creation cleans up after itself
    await wait_for(lambda: len(backend.destroyed) == 1, "destruction of the abandoned sandbox")
    assert backend.agents == {}


async def test_logs(sandbox: AsyncSandbox) -> None:
    assert isinstance(await sandbox.logs(), str)


# -- commands ------------------------------------------------------------------------------


async def test_exec_family_matches_the_sync_face(sandbox: AsyncSandbox) -> None:
    sync: Sandbox = wrap(core_of(sandbox))
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("exec", (["printf", "%s|", "a b", "$HOME"],), {}),
        ("exec_shell", ("echo out; echo err >&2; exit 3",), {}),
        ("exec_shell", ("cat; cat",), {"input": "fed\n"}),
        ("exec_shell", ('printf %s "$AN_X"',), {"env": {"AN_X": "per call"}}),
        ("exec_python", ("import sys; print(sys.stdin.read().upper())",), {"input": b"abc"}),
        ("exec_python", ("x = 1\n" * 60_000 + "print(x)",), {}),  # > 100 KiB: sent on stdin
        ("run_code", ("a = 10; print(a * 2)",), {}),
        ("run_code", ("echo sh", "shell"), {}),
    ]
    outputs = []
    for name, args, kwargs in cases:
        ours = await getattr(sandbox, name)(*args, **kwargs)
        theirs = await anyio.to_thread.run_sync(functools.partial(getattr(sync, name), *args, **kwargs))
        assert (ours.stdout, ours.stderr, ours.exit_code) == (theirs.stdout, theirs.stderr, theirs.exit_code)
        outputs.append((ours.stdout, ours.exit_code))
    assert outputs == [
        ("a b|$HOME|", 0),
        ("out\n", 3),
        ("fed\n", 0),
        ("per call", 0),
        ("ABC\n", 0),
        ("1\n", 0),
        ("20\n", 0),
        ("sh\n", 0),
    ]
    assert await sandbox.exec_json("import json; print(json.dumps({'a': [1, 2]}))") == {"a": [1, 2]}
    with pytest.raises(ExecutionError, match="not JSON"):
        await sandbox.exec_json("print('nope')")
    with pytest.raises(ConfigurationError):
        await sandbox.run_code("1", "cobol")
    with pytest.raises(ConfigurationError):
        await sandbox.exec_python("x = 1\n" * 60_000, input="no")
    with pytest.raises(ConfigurationError):
        await sandbox.exec([])


async def test_exec_timeout_is_non_destructive(sandbox: AsyncSandbox, tag: str) -> None:
    with pytest.raises(ExecutionTimeoutError) as info:
        await sandbox.exec_shell("echo partial; sleep 30", timeout=0.5, env={"AN_TAG": tag})
    result = info.value.result
    assert result is not None and result.timed_out and result.stdout == "partial\n"
    assert tagged(tag) == []
    assert (await sandbox.exec_shell("echo alive")).stdout == "alive\n"


async def test_cancelling_an_awaited_exec_kills_its_process_tree(sandbox: AsyncSandbox, tag: str) -> None:
    script = "sleep 100 & sleep 100 & touch started; wait"
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            await sandbox.exec_shell(script, env={"AN_TAG": tag})
            raise AssertionError("the command was not cancelled")

        tg.start_soon(run)
        await wait_for(lambda: sandbox.exists("started"), "the command to start")
        # A child caught between fork and exec shows no environment for a moment.
        await wait_for(lambda: len(tagged(tag)) == 3, "sh and both sleeps to run")
        tg.cancel_scope.cancel()
    await wait_for(lambda: tagged(tag) == [], "the command's process tree to die")
    # The abandoned wait let go of the channel, and the sandbox works on.
    channel = core_of(sandbox).channel
    assert channel is not None
    await wait_for(lambda: not channel._pending, "the channel to forget the cancelled command")
    assert (await sandbox.exec_shell("echo alive")).stdout == "alive\n"


async def test_move_on_after_cancels_the_command(sandbox: AsyncSandbox, tag: str) -> None:
    t0 = time.monotonic()
    with anyio.move_on_after(0.5) as scope:
        await sandbox.exec_shell("sleep 100 & sleep 100", env={"AN_TAG": tag})
    assert scope.cancelled_caught and time.monotonic() - t0 < 5
    await wait_for(lambda: tagged(tag) == [], "the command's process tree to die")


async def test_concurrent_execs_on_one_sandbox(sandbox: AsyncSandbox) -> None:
    """Eight commands wait for one another inside the sandbox: they can only finish together."""
    n = 8
    script = (
        "touch arrived-$I; i=0; "
        f'while [ "$(ls arrived-* | wc -l)" -lt {n} ]; do sleep 0.02; i=$((i+1)); '
        '[ $i -gt 500 ] && { echo alone; exit 1; }; done; echo "together $I"'
    )
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        results[i] = (await sandbox.exec_shell(script, env={"I": str(i)}, timeout=30)).stdout

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    assert results == {i: f"together {i}\n" for i in range(n)}


# -- streams -------------------------------------------------------------------------------


async def test_stream_is_incremental(sandbox: AsyncSandbox) -> None:
    """The command prints, then waits for a file that only the test creates after the first chunk."""
    script = "echo first; while [ ! -e go ]; do sleep 0.01; done; echo second >&2; echo third"
    chunks: list[ExecutionChunk] = []
    stream = sandbox.stream_shell(script, timeout=30)
    assert isinstance(stream, AsyncExecutionStream)
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.data == "first\n":
            await sandbox.write_file("go", "")
    assert chunks[0] == ExecutionChunk("stdout", "first\n")
    assert sorted((c.stream, c.data) for c in chunks[1:-1]) == [("stderr", "second\n"), ("stdout", "third\n")]
    assert chunks[-1] == ExecutionChunk("status", exit_code=0)  # the last one, as in 0.3.0
    assert stream.result is not None and stream.result.ok
    assert (stream.result.stdout, stream.result.stderr) == ("first\nthird\n", "second\n")


async def test_stream_exec_and_python(sandbox: AsyncSandbox) -> None:
    chunks = [(c.stream, c.data, c.exit_code) async for c in sandbox.stream_exec(["printf", "a"])]
    assert chunks == [("stdout", "a", None), ("status", "", 0)]
    stream = sandbox.stream_python("print(6 * 7)")
    assert "".join([c.data async for c in stream]) == "42\n"
    assert stream.result is not None and stream.result.stdout == "42\n"
    assert [c async for c in stream] == []  # iterated once


async def test_stream_timeout_raises_after_the_output(sandbox: AsyncSandbox, tag: str) -> None:
    seen: list[str] = []
    stream = sandbox.stream_shell("echo partial; sleep 30", timeout=0.5, env={"AN_TAG": tag})
    with pytest.raises(ExecutionTimeoutError) as info:
        async for chunk in stream:
            seen.append(chunk.data)
    assert seen == ["partial\n"]
    assert info.value.result is not None and info.value.result.timed_out
    assert tagged(tag) == []


async def test_stream_async_with_and_aclose_kill_the_command(sandbox: AsyncSandbox, tag: str) -> None:
    script = "sleep 100 & echo ready; sleep 100"
    async with sandbox.stream_shell(script, env={"AN_TAG": tag}) as stream:
        async for chunk in stream:
            assert chunk.data == "ready\n"
            break
        await wait_for(lambda: len(tagged(tag)) == 3, "sh and both sleeps to run")
    await wait_for(lambda: tagged(tag) == [], "async with to kill the tree")
    assert stream.result is None

    stream = sandbox.stream_shell(script, env={"AN_TAG": tag})
    assert (await stream.__anext__()).data == "ready\n"
    await stream.aclose()
    await wait_for(lambda: tagged(tag) == [], "aclose to kill the tree")
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_cancelling_a_stream_kills_the_command(sandbox: AsyncSandbox, tag: str) -> None:
    with anyio.move_on_after(0.5) as scope:
        async for _ in sandbox.stream_shell("echo tick; sleep 100 & sleep 100", env={"AN_TAG": tag}):
            pass
    assert scope.cancelled_caught
    await wait_for(lambda: tagged(tag) == [], "the stream's process tree to die")


async def test_stream_refusal_surfaces_at_async_with(sandbox: AsyncSandbox) -> None:
    with pytest.raises(ConfigurationError):
        async with sandbox.stream_exec([]):
            raise AssertionError("not reached")


# -- files ---------------------------------------------------------------------------------


async def test_files(sandbox: AsyncSandbox, tmp_path: Path) -> None:
    await sandbox.write_file("dir/a.txt", "héllo")
    await sandbox.write_file("b.bin", b"\x00\xff", mode=0o600)
    assert await sandbox.read_file("dir/a.txt") == "héllo"
    assert await sandbox.read_file("b.bin", encoding=None) == b"\x00\xff"
    assert await sandbox.exists("dir/a.txt") and not await sandbox.exists("nope")
    await sandbox.mkdir("made/deep")
    names = {f.path for f in await sandbox.list_files(".", recursive=True)}
    assert {"dir", "dir/a.txt", "b.bin", "made", "made/deep"} <= names
    await sandbox.remove_file("dir", recursive=True)
    assert not await sandbox.exists("dir")
    source = tmp_path / "up.txt"
    source.write_text("uploaded")
    await sandbox.upload_file(source, "up.txt")
    await sandbox.download_file("up.txt", tmp_path / "down.txt")
    assert (tmp_path / "down.txt").read_text() == "uploaded"
    with pytest.raises(FileAccessError):
        await sandbox.read_file("../escape")


# -- hooks and observers -----------------------------------------------------------------------


async def test_async_approval_hook_allows_and_denies(backend: LocalBackend) -> None:
    seen: list[ApprovalRequest] = []
    loop_thread = threading.get_ident()
    threads: set[bool] = set()

    async def hook(request: ApprovalRequest) -> bool:
        await anyio.sleep(0)
        threads.add(threading.get_ident() == loop_thread)
        seen.append(request)
        return "forbidden" not in " ".join(request.details.get("argv", ()))

    async with AsyncSandbox.create("local", backend=backend, approval_hook=hook) as sb:
        assert (await sb.exec_shell("echo allowed")).stdout == "allowed\n"
        with pytest.raises(PolicyDeniedError) as info:
            await sb.exec_shell("echo forbidden")
        assert info.value.request.kind == "exec"
        await sb.write_file("f.txt", "x")
        with pytest.raises(PolicyDeniedError):
            async for _ in sb.stream_shell("echo forbidden"):
                pass
    assert [r.kind for r in seen] == ["exec", "exec", "file.write", "exec"]
    assert threads == {True}  # awaited in the event loop


async def test_failing_or_sync_hooks_on_the_async_face(backend: LocalBackend) -> None:
    async def broken(request: ApprovalRequest) -> bool:
        raise RuntimeError("hook bug")

    async with AsyncSandbox.create("local", backend=backend, approval_hook=broken) as sb:
        with pytest.raises(PolicyDeniedError, match="hook bug"):
            await sb.exec(["true"])

    def no_reads(request: ApprovalRequest) -> bool:
        return request.kind != "file.read"

    async with AsyncSandbox.create("local", backend=backend, approval_hook=no_reads) as sb:
        await sb.write_file("f", "x")
        with pytest.raises(PolicyDeniedError):
            await sb.read_file("f")


async def test_async_hook_on_a_wrapped_sync_sandbox_runs_in_its_own_loop(backend: LocalBackend) -> None:
    # A sync Sandbox has no event loop of its own: the guard runs an async
    # hook's coroutine on a private loop in the hook's thread.
    seen: list[str] = []

    async def only_exec(request: ApprovalRequest) -> bool:
        await anyio.sleep(0)
        seen.append(request.kind)
        return request.kind == "exec"

    sync = await anyio.to_thread.run_sync(lambda: Sandbox("local", backend=backend, approval_hook=only_exec))
    try:
        assert (await AsyncSandbox(sync).exec(["true"])).exit_code == 0
        with pytest.raises(PolicyDeniedError, match="refused"):
            await AsyncSandbox(sync).write_file("f", "x")
        assert seen == ["exec", "file.write"]
    finally:
        await AsyncSandbox(sync).destroy()


async def test_async_observers_receive_every_event(backend: LocalBackend) -> None:
    memory = MemoryObserver()
    received: list[SandboxEvent] = []

    async def observer(event: SandboxEvent) -> None:
        await anyio.sleep(0)
        received.append(event)

    async with AsyncSandbox.create(
        "local", backend=backend, observers=[observer, memory], environment={"AN_S": "x"}
    ) as sb:
        await sb.exec_shell("true")
        async for _ in sb.stream_shell("echo s"):
            pass
        await sb.write_file("a", "b")
    assert [e.type.value for e in received] == memory.types()
    assert memory.types() == [
        "sandbox.created",
        "exec.started",
        "exec.finished",
        "exec.started",
        "exec.finished",
        "file.written",
        "sandbox.destroyed",
    ]


async def test_bridge_refuses_to_block_the_loop_thread() -> None:
    bridge = _LoopBridge()

    async def hook(request: object) -> bool:
        return True

    wrapped = bridge.wrap(hook)
    with pytest.raises(RuntimeError, match="event loop's own thread"):
        wrapped(None)  # the coroutine is closed, so no "never awaited" warning follows
    assert await anyio.to_thread.run_sync(wrapped, None) is True


# -- twins of python_session and iterators ---------------------------------------------------


async def test_python_session_twin_interrupts_on_cancel(sandbox: AsyncSandbox) -> None:
    async with await sandbox.python_session() as session:
        await session.run("x = 41")
        assert (await session.run("x + 1")).result == "42"
        t0 = time.monotonic()
        with anyio.move_on_after(0.5) as scope:
            await session.run("import time\nwhile True:\n    time.sleep(0.01)")
        assert scope.cancelled_caught and time.monotonic() - t0 < 5
        assert (await session.run("x")).result == "41"  # interrupted, not lost
        async with session.stream("print(1); print(2)") as stream:
            assert "".join([c.data async for c in stream]) == "1\n2\n"
        assert stream.result is not None and stream.result.ok
        assert "AsyncPythonSession" in repr(session)
    assert session.closed and session.pid is None


async def test_thread_iterator_interrupts_and_closes_on_cancel() -> None:

    release = threading.Event()
    closed = threading.Event()

    def blocking() -> Iterator[int]:
        try:
            yield 1
            release.wait(WAIT)  # blocks until interrupted
            yield 2
            yield 3
        finally:
            closed.set()

    iterator = _ThreadIterator(blocking, release.set, anyio.CapacityLimiter(4))
    got = []
    with anyio.move_on_after(0.3) as scope:
        async for item in iterator:
            got.append(item)
    assert scope.cancelled_caught and got == [1]
    assert release.is_set() and closed.is_set()
    assert [i async for i in iterator] == []

    finished = _ThreadIterator(lambda: iter([1, 2]), None, anyio.CapacityLimiter(4))
    async with finished:
        assert [i async for i in finished] == [1, 2]


async def test_async_hook_that_never_answers_is_denied_and_cancelled(backend: LocalBackend) -> None:
    cancelled = anyio.Event()

    async def hang(request: ApprovalRequest) -> bool:
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return True

    policy = SecurityPolicy(approval_timeout=0.3)
    async with AsyncSandbox.create(
        "local", backend=backend, approval_hook=hang, security_policy=policy
    ) as sb:
        with anyio.fail_after(10):
            with pytest.raises(PolicyDeniedError, match=r"did not answer within 0\.3s"):
                await sb.exec(["true"])
            await cancelled.wait()  # the hook's coroutine did not linger in the loop


async def test_async_policy_hook_is_awaited_in_the_loop(backend: LocalBackend) -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    async def policy_hook(request: ApprovalRequest) -> bool:
        threads.append(threading.get_ident())
        return request.kind != "file.remove"

    policy = SecurityPolicy(approval_hook=policy_hook)
    async with AsyncSandbox.create("local", backend=backend, security_policy=policy) as sb:
        await sb.write_file("f", "x")
        with pytest.raises(PolicyDeniedError):
            await sb.remove_file("f")
        assert await sb.exists("f")
    assert threads and set(threads) == {loop_thread}
