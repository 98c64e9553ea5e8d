"""AsyncSandbox against the real engine, on runc and runsc."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from agentnest import (
    AsyncSandbox,
    ExecutionChunk,
    ExecutionTimeoutError,
    FileAccessError,
    PolicyDeniedError,
    Sandbox,
)
from agentnest.guard import ApprovalRequest

from .helpers import PROCESSES, containers_of

pytestmark = pytest.mark.anyio

WAIT = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sandbox(shared_sandbox: Sandbox) -> AsyncSandbox:
    """The async face over the module's shared sandbox of this runtime."""
    return AsyncSandbox(shared_sandbox)


@pytest.fixture
def workdir(shared_sandbox: Sandbox) -> Iterator[str]:
    name = f"aio-{os.urandom(4).hex()}"
    shared_sandbox.mkdir(name)
    yield name
    shared_sandbox.remove_file(name, recursive=True)


async def processes(sandbox: AsyncSandbox) -> list[list[str]]:
    found: list[list[str]] = await sandbox.exec_json(PROCESSES, timeout=30)
    return found


async def poll(check: Callable[[], Any], what: str, within: float = WAIT) -> Any:
    """Await ``check()`` until it returns something truthy, with a deadline."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        await anyio.sleep(0.05)


async def test_create_exec_and_destroy(backend_name: str, docker_client: Any) -> None:
    async with AsyncSandbox.create(backend=backend_name, timeout=120) as sb:
        assert sb.backend.name in (backend_name, "docker")
        result = await sb.exec_shell("echo hi; id -u")
        assert result.stdout == "hi\n65532\n" and result.ok
        assert len(containers_of(docker_client, sb.id)) == 1
    assert sb.destroyed
    assert containers_of(docker_client, sb.id) == []


async def test_exec_family(sandbox: AsyncSandbox, workdir: str) -> None:
    assert (await sandbox.exec(["printf", "%s|", "a b", "*"])).stdout == "a b|*|"
    result = await sandbox.exec_shell("pwd; echo err >&2; exit 4", cwd=workdir)
    assert (result.stdout, result.stderr, result.exit_code) == (f"/workspace/{workdir}\n", "err\n", 4)
    assert (await sandbox.exec_python("print(6 * 7)")).stdout == "42\n"
    assert (await sandbox.run_code("echo sh", "shell")).output == "sh\n"
    assert await sandbox.exec_json("import json; print(json.dumps([1, 'x']))") == [1, "x"]
    assert (await sandbox.exec_shell("cat", input="fed")).stdout == "fed"


async def test_stream_with_async_for_is_incremental(sandbox: AsyncSandbox, workdir: str) -> None:
    """The command prints, then waits for a file the test writes only after the first chunk."""
    script = "echo first; while [ ! -e go ]; do sleep 0.01; done; echo second"
    chunks: list[ExecutionChunk] = []
    stream = sandbox.stream_shell(script, cwd=workdir, timeout=60)
    async for chunk in stream:
        chunks.append(chunk)
        if chunk.data == "first\n":
            await sandbox.write_file(f"{workdir}/go", "")
    assert [(c.stream, c.data) for c in chunks] == [
        ("stdout", "first\n"),
        ("stdout", "second\n"),
        ("status", ""),
    ]
    assert chunks[-1].exit_code == 0
    assert stream.result is not None and stream.result.ok and stream.result.stdout == "first\nsecond\n"


async def test_files(sandbox: AsyncSandbox, workdir: str) -> None:
    await sandbox.write_file(f"{workdir}/a.txt", "héllo")
    await sandbox.write_file(f"{workdir}/b.bin", os.urandom(3 * 2**20))
    assert await sandbox.read_file(f"{workdir}/a.txt") == "héllo"
    assert len(await sandbox.read_file(f"{workdir}/b.bin", encoding=None)) == 3 * 2**20
    assert await sandbox.exists(f"{workdir}/a.txt")
    listing = {f.path: f.size for f in await sandbox.list_files(workdir)}
    assert listing == {f"{workdir}/a.txt": 6, f"{workdir}/b.bin": 3 * 2**20}  # workspace paths
    await sandbox.remove_file(f"{workdir}/a.txt")
    assert not await sandbox.exists(f"{workdir}/a.txt")
    with pytest.raises(FileAccessError):
        await sandbox.read_file("/etc/passwd")


async def test_timeout_is_an_execution_timeout_error(sandbox: AsyncSandbox) -> None:
    t0 = time.monotonic()
    with pytest.raises(ExecutionTimeoutError) as info:
        await sandbox.exec_shell("echo partial; sleep 100", timeout=1)
    assert time.monotonic() - t0 < 15
    assert info.value.result is not None
    assert info.value.result.timed_out and info.value.result.stdout == "partial\n"
    assert (await sandbox.exec_shell("echo alive")).stdout == "alive\n"


async def test_cancelling_an_awaited_command_kills_its_process_tree(sandbox: AsyncSandbox) -> None:
    with anyio.move_on_after(2) as scope:
        await sandbox.exec_shell("sleep 100 & sleep 100")
    assert scope.cancelled_caught

    async def none_left() -> bool:
        return ["sleep", "100"] not in await processes(sandbox)

    await poll(none_left, "the cancelled command's sleeps to die")
    assert (await sandbox.exec_shell("echo alive")).stdout == "alive\n"


async def test_cancelling_a_stream_kills_its_process_tree(sandbox: AsyncSandbox) -> None:
    with anyio.move_on_after(2) as scope:
        async for _ in sandbox.stream_shell("echo tick; sleep 101 & sleep 101"):
            pass
    assert scope.cancelled_caught

    async def none_left() -> bool:
        return ["sleep", "101"] not in await processes(sandbox)

    await poll(none_left, "the cancelled stream's sleeps to die")


async def test_concurrent_execs_in_a_task_group(sandbox: AsyncSandbox, workdir: str) -> None:
    """Eight commands wait for one another inside the sandbox: they finish only if they run at once."""
    n = 8
    script = (
        "touch arrived-$I; i=0; "
        f'while [ "$(ls | grep -c arrived-)" -lt {n} ]; do sleep 0.02; i=$((i+1)); '
        '[ $i -gt 1000 ] && { echo alone; exit 1; }; done; echo "together $I"'
    )
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        result = await sandbox.exec_shell(script, env={"I": str(i)}, cwd=workdir, timeout=60)
        results[i] = result.stdout

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    assert results == {i: f"together {i}\n" for i in range(n)}


async def test_async_approval_hook_allows_and_denies(backend_name: str) -> None:
    seen: list[str] = []

    async def hook(request: ApprovalRequest) -> bool:
        await anyio.sleep(0)
        seen.append(request.kind)
        return request.kind != "file.read"

    async with AsyncSandbox.create(backend=backend_name, timeout=120, approval_hook=hook) as sb:
        assert (await sb.exec_shell("echo allowed")).stdout == "allowed\n"
        await sb.write_file("secret.txt", "s")
        with pytest.raises(PolicyDeniedError) as info:
            await sb.read_file("secret.txt")
        assert info.value.request.kind == "file.read"
    assert seen == ["exec", "file.write", "file.read"]


async def test_python_session_twin(sandbox: AsyncSandbox) -> None:
    async with await sandbox.python_session() as session:
        assert session.pid is not None and not session.closed
        await session.run("import json; x = 41")
        assert (await session.run("x + 1")).check().result == "42"
        stream = session.stream("print('a'); print('b'); 'done'")
        assert "".join([c.data async for c in stream]) == "a\nb\n"
        assert stream.result is not None and stream.result.result == "'done'"
        with anyio.move_on_after(1) as scope:  # cancelling interrupts the code, the session stays
            await session.run("import time\nwhile True:\n    time.sleep(0.05)")
        assert scope.cancelled_caught
        assert (await session.run("x")).result == "41"
        await session.reset()
        assert (await session.run("'x' in dir()")).result == "False"
    assert session.closed


async def test_state_twins(backend_name: str, tmp_path: Any, docker_client: Any) -> None:
    snapshot = tmp_path / "ws.tar"
    async with AsyncSandbox.create(backend=backend_name, timeout=120) as sb:
        await sb.write_file("out/a.txt", "A")
        meta = await sb.snapshot(snapshot)
        assert snapshot.exists() and meta.image == sb.config.image
        found = await sb.artifacts("out/**")
        assert [(a.path, a.size) for a in found] == [("out/a.txt", 1)]
        child = await sb.fork()
        try:
            assert child.id != sb.id and await child.read_file("out/a.txt") == "A"
            await child.write_file("out/a.txt", "child")
            assert await sb.read_file("out/a.txt") == "A"
        finally:
            await child.destroy()
        assert containers_of(docker_client, child.id) == []
        await sb.write_file("out/a.txt", "changed")
        await sb.restore(snapshot)
        assert await sb.read_file("out/a.txt") == "A"
        copied = await sb.download("out", tmp_path / "dl")
        assert (copied / "a.txt").read_text() == "A"
    async with AsyncSandbox.from_snapshot(snapshot, backend=backend_name, timeout=120) as restored:
        assert await restored.read_file("out/a.txt") == "A"
    assert restored.destroyed
