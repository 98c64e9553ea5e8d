"""The fault matrix (issue 17): every public operation under injected engine and agent faults
either succeeds or raises an ``AgentNestError`` in bounded time; never a raw requests/urllib3/
OSError, never a hang.  Faults go to a private dockerd (``doubles.dockerd``), runc only.

Each test injects one fault, runs every operation as a cell (``conftest.Cells``: a thread with a
hard cap, so a hang is recorded instead of freezing the suite), recovers and checks the sandbox
works again; it fails listing its untyped errors and hangs.  The last test counts the whole
matrix and the leaks after a prune.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentnest import AsyncSandbox, Sandbox, SandboxPool
from agentnest.channel.client import STALL_AFTER
from agentnest.errors import (
    AgentNestError,
    ChannelError,
    FileAccessError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
    SessionLostError,
)
from agentnest.session import PythonSession

from .conftest import Cell, Cells, Private

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(150),
    # A socket a failing docker-py call leaves behind must not fail an unrelated cell.
    pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"),
]

Op = tuple[str, Callable[[], object], "type[AgentNestError] | None"]


class ServerError(AgentNestError):
    """An error answer of the HTTP server other than its catch-all 500 (a typed error on the wire)."""


class ServerUntypedError(Exception):
    """The server's catch-all: ``500 {"code": "error"}`` (an unexpected exception in the server)."""


# -- the server ---------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    headers: dict[str, str]
    stop: Callable[[], None]

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def create(self, timeout: float = 30.0) -> str:
        with self.client(timeout) as c:
            return str(checked(c.post("/v1/sandboxes", json={"timeout": 120}))["id"])

    def exec(self, sid: str, timeout: float = 30.0) -> str:
        with self.client(timeout) as c:
            out = checked(c.post(f"/v1/sandboxes/{sid}/exec", json={"shell": "echo ok", "timeout": 5}))
            return f"exit={out['exit_code']}"

    def delete(self, sid: str) -> None:
        with self.client() as c:
            c.delete(f"/v1/sandboxes/{sid}")


def checked(response: httpx.Response) -> dict[str, Any]:
    if response.status_code < 400:
        return dict(response.json())
    try:
        code = response.json().get("code")
    except ValueError:
        code = None
    if code in (None, "error"):
        raise ServerUntypedError(f"HTTP {response.status_code}: {response.text[:200]}")
    raise ServerError(f"HTTP {response.status_code} {code}: {response.json().get('detail', '')[:200]}")


_SERVER: list[contextlib.ExitStack] = []


@pytest.fixture(scope="module")
def server(private: Private, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from agentnest.runtime.docker import base_image
    from agentnest.server.app import ServerSettings, create_app
    from agentnest.server.auth import Ceiling, TokenStore
    from agentnest.server.thread import serve_in_thread

    store = TokenStore(tmp_path_factory.mktemp("serve") / "tokens.json")
    _, secret = store.create("faults", Ceiling(max_sandboxes=8, max_timeout=600.0))
    # The manager's configuration: its database (SQLite) records every sandbox, and its
    # verify loop asks the engine every second whether each still runs, so the faults
    # below also hit the loop that must tell "the engine is down" from "the sandbox is gone".
    settings = ServerSettings(
        tokens=store,
        backends={"docker": private.backend()},
        image=base_image(),
        database=f"sqlite:///{tmp_path_factory.mktemp('manager') / 'manager.db'}",
        verify_interval=1.0,
    )
    stack = contextlib.ExitStack()
    url = stack.enter_context(serve_in_thread(create_app(settings)))
    _SERVER.append(stack)
    yield Server(url, {"Authorization": f"Bearer {secret}"}, stack.close)
    stack.close()


# -- operations -----------------------------------------------------------------------------------


def result_note(r: Any) -> str:
    return f"exit={r.exit_code}"


def sandbox_ops(sb: Sandbox, session: PythonSession, victim: Sandbox) -> list[Op]:
    """Operations on a sandbox made before the fault (``victim`` is destroyed, last)."""
    return [
        ("exec_shell", lambda: result_note(sb.exec_shell("echo ok", timeout=5)), None),
        ("exec", lambda: result_note(sb.exec(["true"], timeout=5)), None),
        ("stream_exec", lambda: f"{len(list(sb.stream_exec(['echo', 'x'], timeout=5)))} chunks", None),
        ("write_file", lambda: sb.write_file("w.txt", "data"), None),
        ("read_file", lambda: sb.read_file("keep.txt"), None),
        ("list_files", lambda: f"{len(sb.list_files('.'))} entries", None),
        ("session.run", lambda: repr(session.run("x + 1", timeout=5).result), None),
        ("extend", lambda: sb.extend(5) and "extended", None),
        ("destroy", victim.destroy, None),
    ]


def create_op(private: Private) -> str:
    with Sandbox(backend=private.backend(), timeout=60) as sb:
        return result_note(sb.exec_shell("true", timeout=5))


async def _async_op(private: Private) -> str:
    sb = await AsyncSandbox.create(backend=private.backend(), timeout=60)
    try:
        await sb.write_file("a.txt", "async")
        return result_note(await sb.exec_shell("cat a.txt", timeout=5))
    finally:
        await sb.destroy()


def pool_op(private: Private) -> str:
    backend = private.backend()
    pool = SandboxPool(
        lambda: Sandbox(backend=backend, timeout=60), size=1, acquire_timeout=8, reset="destroy"
    )
    try:
        with pool.acquire() as sb:
            return result_note(sb.exec_shell("true", timeout=5))
    finally:
        pool.close()


def server_create_op(server: Server) -> str:
    sid = server.create(timeout=40)
    server.delete(sid)
    return "created"


def engine_ops(
    private: Private, server: Server, server_sid: str, expected: type[AgentNestError] | None
) -> list[Op]:
    """Operations that need a new engine call (a fresh backend: no pooled connection)."""
    return [
        ("Sandbox()", lambda: create_op(private), expected),
        ("AsyncSandbox", lambda: asyncio.run(_async_op(private)), expected),
        ("SandboxPool", lambda: pool_op(private), None),
        ("server.create", lambda: server_create_op(server), None),
        ("server.exec", lambda: server.exec(server_sid, timeout=40), None),
    ]


# -- set-up, recovery, verdict --------------------------------------------------------------------


@dataclass
class Victims:
    sb: Sandbox
    session: PythonSession
    victim: Sandbox

    def close(self) -> None:
        for s in (self.sb, self.victim):
            with contextlib.suppress(Exception):
                s.close()


def make_victims(private: Private, **kwargs: Any) -> Victims:
    sb = Sandbox(backend=private.backend(), timeout=180, **kwargs)
    sb.write_file("keep.txt", "kept")
    session = sb.python_session()
    session.run("x = 41")
    return Victims(sb, session, Sandbox(backend=private.backend(), timeout=180))


def finish(private: Private, cells: Cells, fault: str, v: Victims) -> None:
    """Close the fault's sandboxes; note the containers the engine still has (left by this fault)."""
    private.note_sandboxes()
    v.close()
    cells.settle()
    cells.left_by_fault[fault] = [
        c["Names"][0] for c in private.engine.containers(label="agentnest.managed=true")
    ]


def recovery(cells: Cells, fault: str, v: Victims, **more: Callable[[], Any]) -> dict[str, str]:
    """After the fault is lifted: does the same sandbox work, keep its files, keep its session?"""
    checks = {
        "after.exec_shell": lambda: result_note(v.sb.exec_shell("echo ok", timeout=10)),
        "after.read_file": lambda: v.sb.read_file("keep.txt"),
        "after.session.run": lambda: repr(v.session.run("x + 1", timeout=10).result),
        **{f"after.{name}": check for name, check in more.items()},
    }
    seen = {}
    for op, fn in checks.items():
        cell = cells.run(fault, op, fn)
        seen[op] = (
            cell.note if cell.outcome == "ok" else f"{cell.outcome}: {cell.raised} {cell.message[:120]}"
        )
    cells.recoveries[fault] = seen
    return seen


def verdict(cells: Cells, fault: str) -> None:
    cells.settle()
    bad = [c for c in cells.cells if c.fault == fault and c.outcome in ("untyped", "hang")]
    assert not bad, "\n".join(describe(c) for c in bad)


def describe(c: Cell) -> str:
    where = " <- ".join(reversed(c.frames))
    return f"{c.fault} x {c.op}: {c.outcome} {c.raised} {c.seconds}s: {c.message[:160]} {c.note} | {where}"


def agent_pid(private: Private, sb: Sandbox) -> int:
    """The in-sandbox agent's host pid (runc): the child of the container's PID-1 keeper."""
    pid = int(private.engine.api().inspect_container(sb.handle.info["container"])["State"]["Pid"])
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert children, f"the keeper {pid} has no child"
    return int(children[0])


def run_cells(cells: Cells, fault: str, ops: list[Op], cap: float | None = None) -> None:
    for op, fn, expected in ops:
        cells.run(fault, op, fn, expected=expected, **({"cap": cap} if cap else {}))


# -- engine faults ----------------------------------------------------------------------------------


def engine_fault(
    private: Private,
    server: Server,
    cells: Cells,
    fault: str,
    inject: Callable[[], None],
    recover: Callable[[], None],
    expected: type[AgentNestError] | None,
    cap: float | None = None,
) -> dict[str, str]:
    v = make_victims(private)
    sid = server.create()
    try:
        inject()
        cells.fault(fault)
        run_cells(
            cells,
            fault,
            sandbox_ops(v.sb, v.session, v.victim) + engine_ops(private, server, sid, expected),
            cap,
        )
        recover()
        # The manager's sandbox, made before the fault, still serves (it was not taken for gone).
        return recovery(cells, fault, v, server_exec=lambda: server.exec(sid, timeout=40))
    finally:
        private.proxy.mode = "relay"
        if not private.engine.healthy():
            private.engine.start()
        with contextlib.suppress(Exception):
            server.delete(sid)
        finish(private, cells, fault, v)


def test_engine_stopped(private: Private, server: Server, cells: Cells) -> None:
    """SIGTERM dockerd (live-restore: the containers keep running); start it again after."""
    seen = engine_fault(
        private,
        server,
        cells,
        "engine_stopped",
        private.engine.stop,
        private.engine.start,
        RuntimeNotAvailableError,
    )
    verdict(cells, "engine_stopped")
    assert seen["after.read_file"] == "kept" and seen["after.server_exec"] == "exit=0", seen


def test_engine_restarted(private: Private, server: Server, cells: Cells) -> None:
    """dockerd stopped and started: the same sandbox is there, its files too, and it runs commands."""
    seen = engine_fault(
        private, server, cells, "engine_restarted", private.engine.restart, lambda: None, None
    )
    verdict(cells, "engine_restarted")
    assert seen["after.read_file"] == "kept" and seen["after.exec_shell"] == "exit=0", seen
    assert seen["after.server_exec"] == "exit=0", seen


def test_engine_blackhole(private: Private, server: Server, cells: Cells) -> None:
    """The engine socket accepts and never answers (connections made before keep going)."""

    def inject() -> None:
        private.proxy.mode = "blackhole"

    def recover() -> None:
        private.proxy.mode = "relay"

    seen = engine_fault(private, server, cells, "engine_blackhole", inject, recover, RuntimeNotAvailableError)
    verdict(cells, "engine_blackhole")
    assert seen["after.exec_shell"] == "exit=0" and seen["after.server_exec"] == "exit=0", seen


def test_engine_refused(private: Private, server: Server, cells: Cells) -> None:
    """The engine socket is gone (ENOENT on connect)."""

    def inject() -> None:
        private.proxy.mode = "refuse"

    def recover() -> None:
        private.proxy.mode = "relay"

    seen = engine_fault(private, server, cells, "engine_refused", inject, recover, RuntimeNotAvailableError)
    verdict(cells, "engine_refused")
    assert seen["after.exec_shell"] == "exit=0" and seen["after.server_exec"] == "exit=0", seen


# -- agent and container faults ---------------------------------------------------------------------


def test_agent_killed(private: Private, cells: Cells) -> None:
    v = make_victims(private)
    try:
        for s in (v.sb, v.victim):
            os.kill(agent_pid(private, s), signal.SIGKILL)
        cells.fault("agent_killed")
        run_cells(cells, "agent_killed", sandbox_ops(v.sb, v.session, v.victim))
        recovery(cells, "agent_killed", v)
    finally:
        finish(private, cells, "agent_killed", v)
    verdict(cells, "agent_killed")


def test_agent_stalled(private: Private, cells: Cells) -> None:
    """SIGSTOP the agent: every operation gives up in bounded time; SIGCONT and it works again."""
    v = make_victims(private)
    pids = [agent_pid(private, s) for s in (v.sb, v.victim)]
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        cells.fault("agent_stalled")
        ops = sandbox_ops(v.sb, v.session, v.victim)
        # The first call sees the stall (no frame, not even a heartbeat, for
        # STALL_AFTER seconds: ChannelError); the next waits as long for the
        # stopped agent to answer a reattach, then gets a new agent (its
        # Python session is lost with the old one).  Bounded: two stalls.
        run_cells(
            cells,
            "agent_stalled",
            [(n, f, SessionLostError if n.startswith("session") else ChannelError) for n, f, _ in ops],
            cap=2 * STALL_AFTER + 5,
        )
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        seen = recovery(cells, "agent_stalled", v)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        finish(private, cells, "agent_stalled", v)
    verdict(cells, "agent_stalled")
    assert seen["after.exec_shell"] == "exit=0", seen


ALLOCATE = "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1"


def test_container_oom(private: Private, cells: Cells) -> None:
    """A process allocating past memory= is OOM-killed: a result (exit 137) or a typed error."""
    v = make_victims(private, memory="96m")
    try:
        cells.fault("oom")
        cells.run(
            "oom", "exec(allocate)", lambda: result_note(v.sb.exec(["python3", "-c", ALLOCATE], timeout=30))
        )
        cells.run(
            "oom",
            "session.run(allocate)",
            lambda: repr(v.session.run(ALLOCATE, timeout=30).error),
            expected=SessionLostError,
        )
        run_cells(cells, "oom", sandbox_ops(v.sb, v.sb.python_session(), v.victim))
        v.session = v.sb.python_session()
        v.session.run("x = 41")
        seen = recovery(cells, "oom", v)
    finally:
        finish(private, cells, "oom", v)
    verdict(cells, "oom")
    assert seen["after.exec_shell"] == "exit=0", seen


def test_workspace_disk_full(private: Private, cells: Cells) -> None:
    v = make_victims(private, workspace="disk", disk="32m")
    try:
        fill = v.sb.exec_shell("dd if=/dev/zero of=fill bs=1M count=64 2>&1; sync", timeout=30)
        cells.fault("disk_full")
        ops = sandbox_ops(v.sb, v.session, v.victim)
        ops.insert(
            0, ("write_file(1m)", lambda: v.sb.write_file("big.bin", b"x" * (1 << 20)), FileAccessError)
        )
        ops.insert(
            1,
            (
                "session.run(write)",
                lambda: repr(v.session.run("open('s.bin','wb').write(b'x'*(1<<20))", timeout=10).error),
                None,
            ),
        )
        run_cells(cells, "disk_full", ops)
        v.sb.exec_shell("rm -f fill", timeout=10)
        seen = recovery(cells, "disk_full", v)
        cells.run("disk_full", "after.write_file", lambda: v.sb.write_file("after.txt", "room again"))
    finally:
        finish(private, cells, "disk_full", v)
    verdict(cells, "disk_full")
    assert fill.exit_code == 0 or "No space" in fill.stdout or "quota" in fill.stdout, fill
    assert seen["after.read_file"] == "kept", seen


# -- the whole matrix ---------------------------------------------------------------------------------


def test_zz_matrix_counts(private: Private, cells: Cells) -> None:
    """Across the suite: no hang, no untyped error, nothing left after a prune."""
    from agentnest.runtime.docker.prune import prune

    for stack in _SERVER:  # the server's sandboxes go with it
        stack.close()
    private.note_sandboxes()
    live = [c["Names"][0] for c in private.engine.containers(label="agentnest.managed=true")]
    pool = private.backend().storage_pool()
    names = set(pool.names()) if pool is not None else set()
    cells.leaks["containers_before_prune"] = live
    cells.leaks["workspaces_before_prune"] = sorted(names & private.seen)
    # The storage pool is the host's: a pool-wide prune through this engine
    # must not take the main engine's live sandboxes' workspaces for orphans
    # (they have no container here, but their containers have them mounted).
    if pool is not None:
        with (
            Sandbox(workspace="disk", disk="32m") as other,
            Sandbox(workspace="disk", disk="32m", backend="gvisor") as other_gvisor,
        ):
            assert {other.id, other_gvisor.id} <= set(pool.names())
            wide = prune(private.engine.api(), everything=True, pool=pool, dry_run=True)
            theirs = {f"ws/{other.id}", f"ws/{other_gvisor.id}"}
            assert {r.id for r in wide.workspaces} & theirs == set(), wide.workspaces
    reports = [
        prune(private.engine.api(), everything=True, sandbox=sid, pool=pool) for sid in sorted(private.seen)
    ]
    cells.leaks["prune"] = repr([r for r in reports if r.containers or r.workspaces or r.errors])[:300]
    left = [c["Names"][0] for c in private.engine.containers(label="agentnest.managed=true")]
    names = set(pool.names()) if pool is not None else set()
    cells.leaks["containers_after_prune"] = left
    cells.leaks["workspaces_after_prune"] = sorted(names & private.seen)
    counts = cells.counts()
    cells.write()
    bad = [describe(c) for c in cells.cells if c.outcome in ("untyped", "hang")]
    assert counts["hangs"] == 0 and counts["untyped_errors"] == 0, "\n".join(bad)
    assert not left and not cells.leaks["workspaces_after_prune"], cells.leaks


#: How many ``sleep 300`` processes the sandbox has (no ps in the base image).
COUNT_SLEEPERS = (
    "import os\n"
    "def cmd(p):\n"
    "    try:\n"
    "        return open('/proc/%s/cmdline' % p, 'rb').read()\n"
    "    except OSError:\n"
    "        return b''\n"
    "print(sum(cmd(p) == b'sleep\\x00300\\x00' for p in os.listdir('/proc') if p.isdigit()))"
)


@pytest.mark.gvisor
def test_engine_restarted_gvisor(private: Private, cells: Cells) -> None:
    """gVisor too: after dockerd restarts, the same agent answers, with its session and processes."""
    with Sandbox(backend=private.backend("runsc"), timeout=120) as sb:
        session = sb.python_session()
        session.run("x = 41", timeout=30)
        sb.write_file("keep.txt", "kept")
        sb.exec_shell("nohup sleep 300 >/dev/null 2>&1 &", timeout=30)
        cells.fault("engine_restarted_gvisor")
        private.engine.restart()
        cells.run(
            "engine_restarted_gvisor", "session.run", lambda: repr(session.run("x + 1", timeout=30).result)
        )
        cells.run("engine_restarted_gvisor", "read_file", lambda: sb.read_file("keep.txt"))
        cells.run(
            "engine_restarted_gvisor",
            "exec_shell",
            lambda: sb.exec(["python3", "-c", COUNT_SLEEPERS], timeout=30).stdout.strip(),
        )
    verdict(cells, "engine_restarted_gvisor")
    notes = {c.op: c.note for c in cells.cells if c.fault == "engine_restarted_gvisor"}
    assert notes == {"session.run": "'42'", "read_file": "kept", "exec_shell": "1"}, notes


def test_engine_restarted_without_live_restore(private: Private, cells: Cells) -> None:
    """An engine that does not keep containers: the sandbox reports precisely that it was killed, and why."""
    engine = private.engine
    engine.live_restore = False
    try:
        engine.restart()  # now without live-restore
        sb = Sandbox(backend=private.backend(), timeout=120)
        try:
            sb.write_file("keep.txt", "kept")
            cells.fault("engine_restarted_no_live_restore")
            engine.restart()  # stops every container
            cell = cells.run(
                "engine_restarted_no_live_restore",
                "exec_shell",
                lambda: sb.exec_shell("true", timeout=5),
                expected=SandboxDestroyedError,
            )
        finally:
            sb.destroy()
    finally:
        engine.live_restore = True
        engine.restart()
    verdict(cells, "engine_restarted_no_live_restore")
    assert cell.raised == "SandboxDestroyedError", cell
    assert "live-restore is off" in cell.message and "make engine" in cell.message, cell.message
