"""The real agent, run as a plain child process over a socketpair, driven by the real Channel.

Nothing here is sandboxed: the agent works in a temporary workspace as this
user.  Commands that leave processes behind write their PIDs to files in the
workspace; tests check those PIDs through /proc and the fixtures kill any
survivor (after checking it carries this test's tag) so nothing leaks.
"""

from __future__ import annotations

import fcntl
import os
import platform
import signal
import stat
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from doubles.local_agent import LocalAgent

from agentnest.agent import loop
from agentnest.agent.wire import PROTOCOL_VERSION, Decoder, encode
from agentnest.channel import client
from agentnest.channel.client import Channel, ExecHandle
from agentnest.channel.protocol import HOST_MAX_BODY, RawExit
from agentnest.errors import ChannelError, FileAccessError
from agentnest.runtime import launch
from agentnest.testing.peer import Peer

pytestmark = pytest.mark.timeout(60)

#: How long any single wait in these tests may take before it counts as a hang.
WAIT = 15.0
#: fcntl command that reads a pipe's capacity (Linux).
F_GETPIPE_SZ = 1032


# -- helpers -------------------------------------------------------------------------


def proc_state(pid: int) -> bytes:
    """The one-letter state of ``pid`` in /proc (``b""`` if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return proc_state(pid) not in (b"", b"Z", b"X")


def wait_until(predicate: Callable[[], bool], within: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        time.sleep(0.01)


def still_alive(pids: list[int], within: float = 5.0) -> list[int]:
    """Poll until every pid is gone; return those still alive at the deadline."""
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def read_pid(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip() != "", what=f"{path.name} written")
    return int(path.read_text().strip())


@dataclass
class Outcome:
    raw: RawExit
    stdout: bytes
    stderr: bytes
    handle: ExecHandle


def collect(handle: ExecHandle, within: float = WAIT) -> Outcome:
    out: list[bytes] = []
    err: list[bytes] = []
    for event in handle.events(time.monotonic() + within):
        if isinstance(event, tuple):
            (out if event[0] == 1 else err).append(event[1])
    assert handle.result is not None
    return Outcome(handle.result, b"".join(out), b"".join(err), handle)


class Agent:
    """A running agent, its channel and its workspace."""

    def __init__(self, workspace: Path, tag: str) -> None:
        self.workspace = workspace
        self.tag = tag
        self.local = LocalAgent(str(workspace))
        self.channel = Channel.connect(self.local.stream, launch.bundle(), timeout=WAIT)
        self.pids: list[int] = []

    def start(
        self,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = 10.0,
        max_output: int = 1 << 30,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        keep_stdin_open: bool = False,
    ) -> ExecHandle:
        return self.channel.start_exec(
            argv,
            env={"UNIT_TEST_TAG": self.tag, **(env or {})},
            cwd=cwd,
            timeout=timeout,
            max_output=max_output,
            stdin=stdin,
            keep_stdin_open=keep_stdin_open,
        )

    def run(self, argv: list[str], **kwargs: Any) -> Outcome:
        return collect(self.start(argv, **kwargs))

    def sh(self, script: str, **kwargs: Any) -> Outcome:
        return self.run(["/bin/sh", "-c", script], **kwargs)

    def track(self, *names: str) -> list[int]:
        """Read PIDs the command wrote to workspace files; they are killed at teardown."""
        pids = [read_pid(self.workspace / n) for n in names]
        self.pids.extend(pids)
        return pids

    def deadline(self, seconds: float = WAIT) -> float:
        return time.monotonic() + seconds

    def close(self) -> None:
        self.channel.close()
        try:
            self.local.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.local.kill()
        for pid in self.pids:
            if alive(pid) and self._ours(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _ours(self, pid: int) -> bool:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return f"UNIT_TEST_TAG={self.tag}".encode() in env.split(b"\x00")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def agent(workspace: Path) -> Iterator[Agent]:
    a = Agent(workspace, uuid.uuid4().hex)
    try:
        yield a
    finally:
        a.close()


# -- hello and plain commands ------------------------------------------------------------


def test_hello_fields(agent: Agent) -> None:
    hello = agent.channel.hello
    assert hello is not None
    assert hello.version == PROTOCOL_VERSION
    assert hello.agent == loop.AGENT_VERSION
    assert hello.pid == agent.local.proc.pid
    assert hello.uid == os.getuid()
    assert hello.python == platform.python_version()
    assert hello.capabilities >= {"exec", "stream", "stdin", "files", "tree-kill"}
    assert agent.channel.alive


def test_ping(agent: Agent) -> None:
    assert agent.channel.request({"t": "ping"}, agent.deadline())["t"] == "pong"


def test_exec_stdout_stderr_and_exit_code(agent: Agent) -> None:
    got = agent.sh("echo out; echo err >&2; exit 3")
    assert got.stdout == b"out\n"
    assert got.stderr == b"err\n"
    assert got.raw.code == 3
    assert got.raw.signal is None
    assert not got.raw.timed_out
    assert not got.raw.truncated
    assert not got.raw.cancelled
    assert 0 <= got.raw.duration < 5


def test_exec_binary_output_is_preserved(agent: Agent) -> None:
    got = agent.run(["printf", "\\000\\377\\200abc"])
    assert got.stdout == b"\x00\xff\x80abc"


def test_exec_environment_and_cwd(agent: Agent) -> None:
    (agent.workspace / "sub").mkdir()
    got = agent.sh(
        'echo "$FOO"; echo "${AGENTNEST_WORKSPACE-unset}"; pwd; test -n "$AGENTNEST_EXEC" && echo marked',
        env={"FOO": "bar baz"},
        cwd=str(agent.workspace / "sub"),
    )
    lines = got.stdout.decode().splitlines()
    assert lines[0] == "bar baz"
    assert lines[1] == "unset"  # the agent's own AGENTNEST_ settings do not leak into commands
    assert os.path.realpath(lines[2]) == os.path.realpath(agent.workspace / "sub")
    assert lines[3] == "marked"


def test_exec_default_cwd_is_the_workspace(agent: Agent) -> None:
    got = agent.run(["pwd"])
    assert os.path.realpath(got.stdout.decode().strip()) == os.path.realpath(agent.workspace)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV])
def test_exit_code_of_a_signal_killed_process(agent: Agent, sig: signal.Signals) -> None:
    got = agent.sh(f"kill -{int(sig)} $$")
    assert got.raw.code == 128 + int(sig)
    assert got.raw.signal == int(sig)
    assert not got.raw.timed_out


def test_nonexistent_program(agent: Agent) -> None:
    got = agent.run(["definitely-not-a-program-xyz", "arg"])
    assert got.raw.code == 127
    assert got.raw.spawn_error
    assert b"definitely-not-a-program-xyz" in got.stderr
    assert b"No such file" in got.stderr
    assert got.stdout == b""


def test_program_not_executable(agent: Agent) -> None:
    script = agent.workspace / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    got = agent.run([str(script)])
    assert got.raw.code == 126
    assert got.raw.spawn_error
    assert b"script.sh" in got.stderr


def test_missing_working_directory(agent: Agent) -> None:
    got = agent.run(["pwd"], cwd=str(agent.workspace / "nope"))
    assert got.raw.code == 127
    assert b"working directory" in got.stderr


def test_stdin_large_round_trip(agent: Agent) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    got = agent.run(["cat"], stdin=data)
    assert got.raw.code == 0
    assert len(got.stdout) == len(data)
    assert got.stdout == data


def test_empty_stdin_is_eof(agent: Agent) -> None:
    got = agent.run(["cat"], stdin=b"")
    assert got.raw.code == 0
    assert got.stdout == b""


def test_no_stdin_is_dev_null(agent: Agent) -> None:
    got = agent.run(["cat"])
    assert got.raw.code == 0
    assert got.stdout == b""


def test_interactive_stdin(agent: Agent) -> None:
    handle = agent.start(["cat"], keep_stdin_open=True)
    handle.write_stdin(b"first\n")
    event = handle.next_event(agent.deadline())
    assert event == (1, b"first\n")  # echoed before we send EOF: the pipe is live
    handle.write_stdin(b"second\n", eof=True)
    got = collect(handle)
    assert got.stdout == b"second\n"
    assert got.raw.code == 0


def test_output_limit_truncates_at_exactly_max_output(agent: Agent) -> None:
    got = agent.sh("head -c 500000 /dev/zero", max_output=1000)
    assert got.raw.truncated
    assert got.stdout == b"\x00" * 1000
    assert got.raw.code == 0


def test_output_limit_counts_both_streams(agent: Agent) -> None:
    got = agent.sh("head -c 3000 /dev/zero; head -c 3000 /dev/zero >&2", max_output=4000)
    assert got.raw.truncated
    assert len(got.stdout) + len(got.stderr) == 4000


def test_output_under_the_limit_is_not_truncated(agent: Agent) -> None:
    got = agent.sh("head -c 1000 /dev/zero", max_output=1000)
    assert not got.raw.truncated
    assert len(got.stdout) == 1000


# -- timeouts, cancellation and process trees ----------------------------------------------

#: Starts a tree that a plain kill of the main process would miss: a double-forked
#: daemon in its own session, a child that ignores SIGTERM, and a grandchild.
TREE = """
( setsid sh -c 'echo $$ > daemon.pid; exec sleep 60' & )
sh -c 'trap "" TERM; echo $$ > stubborn.pid; while :; do sleep 1; done' &
sleep 60 &
echo $! > child.pid
while [ ! -s daemon.pid ] || [ ! -s stubborn.pid ]; do sleep 0.01; done
echo ready
wait
"""
TREE_PIDS = ("daemon.pid", "stubborn.pid", "child.pid")


def test_timeout_kills_the_whole_tree(agent: Agent) -> None:
    started = time.monotonic()
    got = agent.sh(TREE, timeout=1.0)
    elapsed = time.monotonic() - started
    assert got.stdout == b"ready\n"
    assert got.raw.timed_out
    assert not got.raw.cancelled
    assert got.raw.signal == signal.SIGKILL
    assert got.raw.code == 128 + signal.SIGKILL
    assert 1.0 <= got.raw.duration < 5
    assert elapsed < 6
    pids = agent.track(*TREE_PIDS)
    assert still_alive(pids) == []


def test_timeout_leaves_other_commands_alone(agent: Agent) -> None:
    survivor = agent.start(["cat"], timeout=30, keep_stdin_open=True)
    victim = agent.sh("sleep 30", timeout=0.5)
    assert victim.raw.timed_out
    survivor.write_stdin(b"still here", eof=True)
    got = collect(survivor)
    assert got.stdout == b"still here"
    assert got.raw.code == 0
    assert not got.raw.timed_out


def test_cancel_kills_the_whole_tree(agent: Agent) -> None:
    handle = agent.start(["/bin/sh", "-c", TREE], timeout=30)
    assert handle.next_event(agent.deadline()) == (1, b"ready\n")
    pids = agent.track(*TREE_PIDS)
    assert all(alive(p) for p in pids)
    cancelled_at = time.monotonic()
    handle.cancel()
    got = collect(handle)
    assert time.monotonic() - cancelled_at < 5
    assert got.raw.cancelled
    assert not got.raw.timed_out
    assert got.raw.signal == signal.SIGKILL
    assert still_alive(pids) == []
    assert agent.channel.alive


def test_background_process_holding_stdout_does_not_block_the_result(agent: Agent) -> None:
    started = time.monotonic()
    got = agent.sh("sleep 30 & echo $! > bg.pid; echo hi", timeout=20)
    elapsed = time.monotonic() - started
    agent.track("bg.pid")  # killed at teardown: outliving the command is allowed
    assert got.stdout == b"hi\n"
    assert got.raw.code == 0
    assert got.raw.duration < 2
    assert elapsed < 2


def test_concurrent_execs_get_their_own_output(agent: Agent) -> None:
    # Output only: concurrent stdin also races into the agent bug that
    # test_stdin_closed_earlier_in_the_same_batch_does_not_crash_the_agent pins down.
    results: dict[int, Outcome] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            results[i] = agent.sh(f"yes line-{i} | head -c 300000; echo stderr-{i} >&2")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a concurrent exec hung"
    assert errors == []
    for i in range(8):
        line = f"line-{i}\n".encode()
        assert results[i].stdout == (line * (300000 // len(line) + 1))[:300000]
        assert results[i].stderr == f"stderr-{i}\n".encode()
        assert results[i].raw.code == 0


def test_concurrent_stdin_on_one_channel(agent: Agent) -> None:
    # Sequential starts, overlapping lifetimes: every command gets its own stdin.
    handles = {i: agent.start(["cat"], keep_stdin_open=True) for i in range(6)}
    for i, handle in reversed(handles.items()):
        handle.write_stdin(f"input-{i}".encode() * 1000, eof=True)
    for i, handle in handles.items():
        assert collect(handle).stdout == f"input-{i}".encode() * 1000


def test_stdin_closed_earlier_in_the_same_batch_does_not_crash_the_agent(workspace: Path) -> None:
    # Deterministic set-up of the race: the command's stdin pipe is full with 100 bytes
    # still queued in the agent; the agent is stopped while the host sends EOF and the
    # command drains the pipe, so one select() returns "host readable" then "stdin writable".
    r, w = os.pipe()
    capacity = fcntl.fcntl(w, F_GETPIPE_SZ)
    os.close(r)
    os.close(w)
    tag = uuid.uuid4().hex
    local = LocalAgent(str(workspace))
    sock = local.stream._sock  # drive the raw protocol: the Channel would hide the order
    sock.settimeout(WAIT)
    decoder = Decoder(max_body_bytes=1 << 24)
    frames: list[tuple[dict[str, Any], bytes]] = []

    def receive() -> dict[str, Any] | None:
        while not frames:
            data = sock.recv(1 << 20)
            if not data:
                return None
            decoder.feed(data)
            frames.extend(decoder.frames())
        return frames.pop(0)[0]

    script = (
        "echo $$ > cmd.pid; while [ ! -e go ]; do sleep 0.01; done; "
        f"head -c {capacity} >/dev/null; touch drained; exec cat >/dev/null"
    )
    cmd_pid = None
    try:
        sock.sendall(launch.bundle())
        hello = receive()
        assert hello is not None and hello["t"] == "hello"
        exec_frame = {
            "t": "exec",
            "id": 1,
            "argv": ["/bin/sh", "-c", script],
            "env": {"UNIT_TEST_TAG": tag},
            "cwd": None,
            "timeout": None,
            "max_output": 1000,
            "stdin": True,
        }
        sock.sendall(encode(exec_frame))
        sock.sendall(encode({"t": "stdin", "id": 1}, b"x" * (capacity + 100)))
        sock.sendall(encode({"t": "ping", "id": 2}))
        pong = receive()
        assert pong is not None and pong["t"] == "pong"  # both frames above were handled
        cmd_pid = read_pid(workspace / "cmd.pid")
        os.kill(local.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: proc_state(local.proc.pid) == b"T", what="the agent stopping")
            sock.sendall(encode({"t": "stdin", "id": 1, "eof": True}))
            (workspace / "go").touch()
            wait_until((workspace / "drained").exists, what="the command draining its stdin")
        finally:
            os.kill(local.proc.pid, signal.SIGCONT)
        reply = receive()
        assert reply is not None, "the agent died"
        assert reply["t"] == "exit"
        assert reply["code"] == 0
    finally:
        local.kill()
        if cmd_pid is not None and alive(cmd_pid):
            environ = Path(f"/proc/{cmd_pid}/environ").read_bytes().split(b"\x00")
            if f"UNIT_TEST_TAG={tag}".encode() in environ:
                os.kill(cmd_pid, signal.SIGKILL)


# -- files -------------------------------------------------------------------------------


def test_write_read_round_trip_10mb(agent: Agent) -> None:
    data = os.urandom(10 * 1024 * 1024 + 3)
    assert agent.channel.write_file("big.bin", data, 0o644, agent.deadline()) == len(data)
    assert (agent.workspace / "big.bin").read_bytes() == data
    assert agent.channel.read_file("big.bin", len(data), agent.deadline()) == data


def test_write_empty_file(agent: Agent) -> None:
    assert agent.channel.write_file("empty", b"", 0o644, agent.deadline()) == 0
    assert (agent.workspace / "empty").read_bytes() == b""
    assert agent.channel.read_file("empty", 10, agent.deadline()) == b""


def test_write_creates_parent_directories(agent: Agent) -> None:
    agent.channel.write_file("a/b/c/file.txt", b"nested", 0o644, agent.deadline())
    assert (agent.workspace / "a" / "b" / "c" / "file.txt").read_bytes() == b"nested"
    assert (agent.workspace / "a" / "b").is_dir()


def test_write_replaces_atomically_and_leaves_no_temp_files(agent: Agent) -> None:
    agent.channel.write_file("f.txt", b"old", 0o644, agent.deadline())
    agent.channel.write_file("f.txt", b"new contents", 0o644, agent.deadline())
    assert (agent.workspace / "f.txt").read_bytes() == b"new contents"
    assert sorted(os.listdir(agent.workspace)) == ["f.txt"]


def test_write_mode_never_setuid(agent: Agent) -> None:
    agent.channel.write_file("tool", b"#!/bin/sh\n", 0o6755, agent.deadline())
    assert stat.S_IMODE((agent.workspace / "tool").stat().st_mode) == 0o755


def test_list(agent: Agent) -> None:
    ws = agent.workspace
    (ws / "d" / "e").mkdir(parents=True)
    (ws / "d" / "e" / "deep.txt").write_bytes(b"123")
    (ws / "d" / "f.txt").write_bytes(b"12")
    (ws / "top.txt").write_bytes(b"1")
    os.symlink("/etc", ws / "link")

    def listing(path: str, recursive: bool, max_entries: int = 10000) -> tuple[list[Any], bool]:
        return agent.channel.list_entries(path, recursive, max_entries, agent.deadline())

    flat, truncated = listing("", False)
    assert [e[:2] for e in flat] == [["d", "dir"], ["link", "symlink"], ["top.txt", "file"]]
    assert truncated is False
    deep, _ = listing("", True)
    paths = [e[0] for e in deep]
    assert paths == ["d", "d/e", "d/e/deep.txt", "d/f.txt", "link", "top.txt"]  # the link is not followed
    sizes = {e[0]: e[2] for e in deep}
    assert sizes["d/e/deep.txt"] == 3
    sub, _ = listing("d", True)
    assert [e[0] for e in sub] == ["d/e", "d/e/deep.txt", "d/f.txt"]
    capped, truncated = listing("", True, 2)
    assert len(capped) == 2
    assert truncated is True


def test_a_crowded_directory_is_listed_in_several_frames(agent: Agent) -> None:
    crowded = agent.workspace / "crowded"
    crowded.mkdir()
    names = [f"{i:05d}-{'x' * 200}" for i in range(3000)]  # ~700 KB of entries: three frames
    for name in names:
        (crowded / name).write_bytes(b"")
    entries, truncated = agent.channel.list_entries("crowded", False, 10000, agent.deadline())
    assert [e[0] for e in entries] == [f"crowded/{n}" for n in names]
    assert truncated is False
    assert agent.channel.request({"t": "ping"}, agent.deadline())["t"] == "pong"  # the channel is fine


def test_list_through_a_symlink_refused(agent: Agent) -> None:
    os.symlink("/etc", agent.workspace / "link")
    with pytest.raises(FileAccessError) as info:
        agent.channel.list_entries("link", False, 10, agent.deadline())
    assert info.value.code in ("symlink", "not_directory")


def test_stat(agent: Agent) -> None:
    (agent.workspace / "f.txt").write_bytes(b"hello")
    (agent.workspace / "f.txt").chmod(0o640)
    entry = agent.channel.request({"t": "stat", "path": "f.txt"}, agent.deadline())["entry"]
    assert entry[:4] == ["f.txt", "file", 5, 0o640]
    assert abs(entry[4] - (agent.workspace / "f.txt").stat().st_mtime) < 1
    root = agent.channel.request({"t": "stat", "path": ""}, agent.deadline())["entry"]
    assert root[:2] == [".", "dir"]
    with pytest.raises(FileAccessError) as info:
        agent.channel.request({"t": "stat", "path": "missing"}, agent.deadline())
    assert info.value.code == "not_found"


def test_stat_does_not_follow_a_final_symlink(agent: Agent) -> None:
    os.symlink("/etc/passwd", agent.workspace / "flink")
    entry = agent.channel.request({"t": "stat", "path": "flink"}, agent.deadline())["entry"]
    assert entry[1] == "symlink"


def test_mkdir(agent: Agent) -> None:
    ch = agent.channel
    ch.request({"t": "mkdir", "path": "x", "parents": False}, agent.deadline())
    assert (agent.workspace / "x").is_dir()
    with pytest.raises(FileAccessError) as info:
        ch.request({"t": "mkdir", "path": "x", "parents": False}, agent.deadline())
    assert info.value.code == "exists"
    ch.request({"t": "mkdir", "path": "x", "parents": True}, agent.deadline())  # idempotent
    with pytest.raises(FileAccessError) as info:
        ch.request({"t": "mkdir", "path": "p/q/r", "parents": False}, agent.deadline())
    assert info.value.code == "not_found"
    ch.request({"t": "mkdir", "path": "p/q/r", "parents": True}, agent.deadline())
    assert (agent.workspace / "p" / "q" / "r").is_dir()


def test_remove(agent: Agent) -> None:
    ws = agent.workspace
    (ws / "tree" / "sub").mkdir(parents=True)
    (ws / "tree" / "sub" / "f").write_bytes(b"x")
    (ws / "file").write_bytes(b"x")
    ch = agent.channel
    ch.request({"t": "remove", "path": "file"}, agent.deadline())
    assert not (ws / "file").exists()
    with pytest.raises(FileAccessError) as info:
        ch.request({"t": "remove", "path": "tree", "recursive": False}, agent.deadline())
    assert info.value.code == "not_empty"
    ch.request({"t": "remove", "path": "tree", "recursive": True}, agent.deadline())
    assert not (ws / "tree").exists()
    with pytest.raises(FileAccessError) as info:
        ch.request({"t": "remove", "path": "tree"}, agent.deadline())
    assert info.value.code == "not_found"
    with pytest.raises(FileAccessError) as info:
        ch.request({"t": "remove", "path": "", "recursive": True}, agent.deadline())
    assert info.value.code == "invalid_path"
    assert ws.is_dir()


def test_a_large_recursive_remove_does_not_stall_the_agent() -> None:
    # 100,000 entries take the agent a good fraction of a second to remove, even on a
    # tmpfs.  It removes them a few hundred at a time between turns of its loop, so
    # other requests are answered meanwhile (and heartbeats flow): a ping sent while
    # the tree is going comes back while it is still there.
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        a = Agent(Path(shm), uuid.uuid4().hex)
        try:
            tree = a.workspace / "tree"
            for d in range(100):
                sub = tree / f"d{d}"
                sub.mkdir(parents=True)
                for f in range(1000):
                    os.close(os.open(sub / str(f), os.O_CREAT | os.O_WRONLY, 0o644))
            done: list[BaseException | None] = []

            def remove() -> None:
                try:
                    a.channel.request(
                        {"t": "remove", "path": "tree", "recursive": True}, a.deadline(), stall=10.0
                    )
                    done.append(None)
                except BaseException as exc:
                    done.append(exc)

            thread = threading.Thread(target=remove)
            thread.start()
            wait_until(lambda: len(os.listdir(tree)) < 100, what="the remove to start")
            a.channel.request({"t": "ping"}, a.deadline())
            answered_midway = tree.exists()
            thread.join(WAIT)
            assert answered_midway, "the ping was answered only after the whole tree was gone"
            assert done == [None] and not tree.exists()
        finally:
            a.close()


def test_removing_yields_between_steps(workspace: Path) -> None:
    from agentnest.agent import files

    (workspace / "t").mkdir()
    for i in range(1000):
        (workspace / "t" / str(i)).write_bytes(b"")
    steps = sum(1 for _ in files.Workspace(str(workspace)).removing("t", True))
    assert steps == 1000 // files.REMOVE_STEP and not (workspace / "t").exists()


def test_recursive_remove_never_follows_links(agent: Agent, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep me")
    ws = agent.workspace
    (ws / "tree").mkdir()
    os.symlink(outside, ws / "tree" / "link")
    os.symlink(outside, ws / "toplink")
    agent.channel.request({"t": "remove", "path": "tree", "recursive": True}, agent.deadline())
    agent.channel.request({"t": "remove", "path": "toplink", "recursive": True}, agent.deadline())
    assert not (ws / "tree").exists()
    assert not os.path.lexists(ws / "toplink")
    assert (outside / "precious").read_bytes() == b"keep me"


def test_read_through_a_directory_symlink_refused(agent: Agent) -> None:
    os.symlink("/etc", agent.workspace / "link")
    with pytest.raises(FileAccessError) as info:
        agent.channel.read_file("link/passwd", 1 << 20, agent.deadline())
    # ELOOP (O_NOFOLLOW) or ENOTDIR (with O_DIRECTORY), depending on how the walk opens it.
    assert info.value.code in ("symlink", "not_directory")


def test_read_final_symlink_refused(agent: Agent) -> None:
    os.symlink("/etc/passwd", agent.workspace / "flink")
    with pytest.raises(FileAccessError) as info:
        agent.channel.read_file("flink", 1 << 20, agent.deadline())
    assert info.value.code == "symlink"


def test_read_symlink_to_device_refused(agent: Agent) -> None:
    os.symlink("/dev/zero", agent.workspace / "zero")
    with pytest.raises(FileAccessError) as info:
        agent.channel.read_file("zero", 1 << 20, agent.deadline())
    assert info.value.code == "symlink"


def test_write_through_a_directory_symlink_refused(agent: Agent, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, agent.workspace / "link")
    with pytest.raises(FileAccessError) as info:
        agent.channel.write_file("link/evil", b"x", 0o644, agent.deadline())
    assert info.value.code in ("symlink", "not_directory")
    assert list(outside.iterdir()) == []


def test_write_over_a_final_symlink_replaces_the_link_not_the_target(agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_bytes(b"original")
    os.symlink(target, agent.workspace / "flink")
    agent.channel.write_file("flink", b"new", 0o644, agent.deadline())
    assert target.read_bytes() == b"original"
    assert not (agent.workspace / "flink").is_symlink()
    assert (agent.workspace / "flink").read_bytes() == b"new"


def test_read_fifo_refused_without_hanging(agent: Agent) -> None:
    os.mkfifo(agent.workspace / "fifo")
    started = time.monotonic()
    with pytest.raises(FileAccessError) as info:
        agent.channel.read_file("fifo", 1 << 20, agent.deadline(5))
    assert info.value.code == "not_regular"
    assert time.monotonic() - started < 3
    assert agent.channel.alive


def test_fifo_on_the_path_refused_without_hanging(agent: Agent) -> None:
    os.mkfifo(agent.workspace / "fifo")
    started = time.monotonic()
    for request in (
        {"t": "read", "path": "fifo/x", "max_bytes": 100},
        {"t": "list", "path": "fifo"},
        {"t": "stat", "path": "fifo/x"},
    ):
        with pytest.raises(FileAccessError) as info:
            agent.channel.request(request, agent.deadline(5))
        assert info.value.code == "not_directory", request
    with pytest.raises(FileAccessError) as info:
        agent.channel.write_file("fifo/x", b"data", 0o644, agent.deadline(5))
    assert info.value.code == "not_directory"
    assert time.monotonic() - started < 5
    assert agent.channel.alive


def test_read_device_file_refused(agent: Agent) -> None:
    try:
        os.mknod(agent.workspace / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as exc:
        pytest.skip(f"cannot create a device node here: {exc}")
    with pytest.raises(FileAccessError) as info:
        agent.channel.read_file("null", 1 << 20, agent.deadline(5))
    assert info.value.code == "not_regular"


def test_read_too_large_refused(agent: Agent) -> None:
    (agent.workspace / "f").write_bytes(b"x" * 2000)
    with pytest.raises(FileAccessError) as info:
        agent.channel.read_file("f", 1000, agent.deadline())
    assert info.value.code == "too_large"
    assert agent.channel.read_file("f", 2000, agent.deadline()) == b"x" * 2000


def test_read_a_directory_refused(agent: Agent) -> None:
    (agent.workspace / "d").mkdir()
    for path in ("d", ""):
        with pytest.raises(FileAccessError) as info:
            agent.channel.read_file(path, 1000, agent.deadline())
        assert info.value.code == "is_directory"


def test_write_over_a_directory_refused(agent: Agent) -> None:
    (agent.workspace / "d").mkdir()
    (agent.workspace / "d" / "keep").write_bytes(b"k")
    with pytest.raises(FileAccessError) as info:
        agent.channel.write_file("d", b"data", 0o644, agent.deadline())
    assert info.value.code == "is_directory"
    assert (agent.workspace / "d" / "keep").read_bytes() == b"k"
    assert sorted(os.listdir(agent.workspace)) == ["d"]  # the temp file was cleaned up


def test_write_below_a_regular_file_refused(agent: Agent) -> None:
    (agent.workspace / "f").write_bytes(b"x")
    with pytest.raises(FileAccessError) as info:
        agent.channel.write_file("f/child", b"data", 0o644, agent.deadline())
    assert info.value.code == "not_directory"


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("../escape", "outside_workspace"),
        ("/etc/passwd", "outside_workspace"),
        ("a/./b", "outside_workspace"),
        ("a//b", "outside_workspace"),
        ("a/", "outside_workspace"),
        ("a\x00b", "invalid_path"),
        ("x" * 256, "invalid_path"),
    ],
)
def test_agent_checks_paths_itself(agent: Agent, path: str, code: str) -> None:
    # The host normalises paths, but the protocol must be safe on its own.
    with pytest.raises(FileAccessError) as info:
        agent.channel.read_file(path, 1000, agent.deadline())
    assert info.value.code == code
    with pytest.raises(FileAccessError) as info:
        agent.channel.write_file(path, b"x", 0o644, agent.deadline())
    assert info.value.code == code
    assert agent.channel.request({"t": "ping"}, agent.deadline())["t"] == "pong"


def test_unknown_request_type(agent: Agent) -> None:
    with pytest.raises(ChannelError, match="unknown"):
        agent.channel.request({"t": "format-disk"}, agent.deadline())
    assert agent.channel.request({"t": "ping"}, agent.deadline())["t"] == "pong"


def test_invalid_exec_request_reported(agent: Agent) -> None:
    handle = agent.channel.start_exec([], env={}, cwd=None, timeout=5, max_output=100)
    with pytest.raises(ChannelError, match="invalid"):
        handle.next_event(agent.deadline())
    assert agent.channel.alive


# -- heartbeats and stalls ----------------------------------------------------------------


def test_heartbeat_keeps_a_silent_command_alive(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "STALL_AFTER", 1.5)
    got = agent.run(["sleep", "2.6"], timeout=10)  # silent for longer than STALL_AFTER
    assert got.raw.code == 0
    assert agent.channel.alive


def test_exec_after_an_idle_spell_is_not_a_stall(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "STALL_AFTER", 1.0)
    idle_since = time.monotonic()
    wait_until(lambda: time.monotonic() - idle_since > 1.3, what="an idle spell longer than STALL_AFTER")
    got = agent.sh("sleep 0.2; echo hi")
    assert got.stdout == b"hi\n"
    assert agent.channel.alive


# -- a dying or misbehaving agent ------------------------------------------------------------


def test_killed_agent_fails_pending_and_later_calls(agent: Agent) -> None:
    handle = agent.start(["sh", "-c", "echo $$ > sleeper.pid; exec sleep 30"], timeout=30)
    agent.track("sleeper.pid")
    agent.local.kill()
    started = time.monotonic()
    with pytest.raises(ChannelError):
        collect(handle, within=WAIT)
    assert time.monotonic() - started < 5
    wait_until(lambda: not agent.channel.alive, within=5, what="the channel noticing the dead agent")
    assert agent.channel.broken_reason
    with pytest.raises(ChannelError):
        agent.channel.request({"t": "ping"}, agent.deadline())
    with pytest.raises(ChannelError):
        agent.start(["true"])


def test_agent_exits_on_a_garbage_frame(agent: Agent) -> None:
    agent.local.stream.write(struct.pack(">II", 0, 0))
    wait_until(lambda: not agent.channel.alive, within=5, what="the channel closing")
    assert agent.local.proc.wait(timeout=5) == 0


def test_agent_exits_when_the_host_goes_away(agent: Agent) -> None:
    handle = agent.start(["sh", "-c", "echo $$ > orphan.pid; exec sleep 30"], timeout=None)
    (pid,) = agent.track("orphan.pid")
    assert handle.id > 0
    agent.channel.close()
    assert agent.local.proc.wait(timeout=5) == 0
    assert still_alive([pid]) == []  # its running commands die with it


# -- a hostile peer ------------------------------------------------------------------------


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    try:
        yield p
    finally:
        p.close()


def connected(peer: Peer) -> Channel:
    peer.hello()
    ch = Channel.connect(peer.stream, None, timeout=5)
    assert ch.hello is not None and ch.hello.agent == "9.9.9"
    return ch


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(struct.pack(">II", 9, HOST_MAX_BODY + 1), id="oversized-body"),
        pytest.param(struct.pack(">II", 64 * 1024 + 1, 0), id="oversized-header"),
        pytest.param(struct.pack(">II", 0xFFFFFFFF, 0xFFFFFFFF), id="huge-lengths"),
        pytest.param(struct.pack(">II", 0, 0), id="zero-header"),
        pytest.param(struct.pack(">II", 5, 0) + b"nope!", id="not-json"),
        pytest.param(struct.pack(">II", 2, 0) + b"[]", id="not-an-object"),
        pytest.param(struct.pack(">II", 8, 0) + b'{"id":1}', id="no-type"),
        pytest.param(struct.pack(">II", 4, 0) + b"\xff\xfe\xfd\xfc", id="invalid-utf8"),
    ],
)
def test_garbage_from_the_peer_breaks_the_channel(peer: Peer, garbage: bytes) -> None:
    ch = connected(peer)
    handle = ch.start_exec(["true"], env={}, cwd=None, timeout=5, max_output=100)
    peer.receive()  # the exec request
    started = time.monotonic()
    peer.sock.sendall(garbage)
    with pytest.raises(ChannelError):
        handle.next_event(time.monotonic() + WAIT)
    assert time.monotonic() - started < 5
    wait_until(lambda: not ch.alive, within=5, what="the channel closing")
    assert "invalid frame" in (ch.broken_reason or "")
    with pytest.raises(ChannelError):
        ch.request({"t": "ping"}, time.monotonic() + 1)


def test_peer_that_never_says_hello(peer: Peer) -> None:
    started = time.monotonic()
    with pytest.raises(ChannelError, match="could not start"):
        Channel.connect(peer.stream, None, timeout=0.5)
    assert time.monotonic() - started < 3


def test_peer_that_closes_at_once(peer: Peer) -> None:
    peer.sock.close()
    started = time.monotonic()
    with pytest.raises(ChannelError):
        Channel.connect(peer.stream, None, timeout=WAIT)
    assert time.monotonic() - started < 5


def test_peer_that_sends_unsolicited_frames_before_hello(peer: Peer) -> None:
    peer.send({"t": "out", "id": 99, "fd": 1}, b"x")
    peer.send({"t": "log", "message": "starting"})
    peer.hello()
    ch = Channel.connect(peer.stream, None, timeout=5)
    assert ch.hello is not None
    assert ch.alive


@pytest.mark.parametrize(
    "changes",
    [{"v": PROTOCOL_VERSION + 1}, {"caps": "all"}, {"pid": True}, {"agent": "x" * 100}],
    ids=repr,
)
def test_peer_with_a_bad_hello(peer: Peer, changes: dict[str, Any]) -> None:
    peer.hello(**changes)
    with pytest.raises(ChannelError, match="could not start"):
        Channel.connect(peer.stream, None, timeout=5)


def test_peer_bundle_is_sent_before_hello(peer: Peer) -> None:
    result: dict[str, Any] = {}

    def connect() -> None:
        try:
            result["channel"] = Channel.connect(peer.stream, b"BUNDLE\n", timeout=5)
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=connect)
    t.start()
    assert peer.sock.recv(100) == b"BUNDLE\n"
    peer.hello()
    t.join(WAIT)
    assert not t.is_alive()
    assert "channel" in result, result.get("error")


def test_peer_that_stalls_mid_frame_during_a_command(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "STALL_AFTER", 0.5)
    ch = connected(peer)
    handle = ch.start_exec(["sleep", "60"], env={}, cwd=None, timeout=None, max_output=100)
    request, _ = peer.receive()
    peer.sock.sendall(encode({"t": "out", "id": request["id"], "fd": 1}, b"half")[:10])  # then nothing
    started = time.monotonic()
    with pytest.raises(ChannelError, match="stalled"):
        handle.next_event(None)  # no deadline: only the stall detection can end this wait
    assert time.monotonic() - started < 3
    assert not ch.alive


def test_peer_beats_keep_a_command_waiting(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "STALL_AFTER", 0.5)
    ch = connected(peer)
    handle = ch.start_exec(["sleep", "1"], env={}, cwd=None, timeout=None, max_output=100)
    request, _ = peer.receive()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.1):
            peer.send({"t": "beat"})

    beater = threading.Thread(target=beat)
    beater.start()
    started = time.monotonic()
    try:
        result: list[object] = []
        waiter = threading.Thread(target=lambda: result.append(handle.next_event(time.monotonic() + WAIT)))
        waiter.start()
        wait_until(lambda: time.monotonic() - started > 1.2, what="beats for longer than STALL_AFTER")
        assert waiter.is_alive() and ch.alive
    finally:
        stop.set()
        beater.join(WAIT)
    peer.send({"t": "exit", "id": request["id"], "code": 0, "signal": None, "duration": 1.2})
    waiter.join(WAIT)
    assert isinstance(result[0], RawExit)


def test_peer_that_stops_answering(peer: Peer) -> None:
    ch = connected(peer)
    started = time.monotonic()
    with pytest.raises(ChannelError, match="in time"):
        ch.request({"t": "ping"}, time.monotonic() + 0.5)
    assert 0.4 < time.monotonic() - started < 3
    assert not ch.alive  # a peer that misses a deadline is dropped


@pytest.mark.parametrize(
    "exit_changes",
    [{"code": 999}, {"code": True}, {"signal": 0}, {"signal": "9"}, {"duration": -1}, {"duration": 1e9}],
    ids=repr,
)
def test_peer_with_an_invalid_exit_frame(peer: Peer, exit_changes: dict[str, Any]) -> None:
    ch = connected(peer)
    handle = ch.start_exec(["true"], env={}, cwd=None, timeout=5, max_output=100)
    request, _ = peer.receive()
    frame = {"t": "exit", "id": request["id"], "code": 0, "signal": None, "duration": 0.1}
    frame.update(exit_changes)
    peer.send(frame)
    with pytest.raises(ChannelError, match="protocol"):
        handle.next_event(time.monotonic() + WAIT)
    assert not ch.alive


def test_peer_output_on_an_invalid_fd(peer: Peer) -> None:
    ch = connected(peer)
    handle = ch.start_exec(["true"], env={}, cwd=None, timeout=5, max_output=100)
    request, _ = peer.receive()
    peer.send({"t": "out", "id": request["id"], "fd": 3}, b"x")
    with pytest.raises(ChannelError, match="fd"):
        handle.next_event(time.monotonic() + WAIT)
    assert not ch.alive


def test_peer_output_beyond_max_output_is_cut_by_the_host(peer: Peer) -> None:
    ch = connected(peer)
    handle = ch.start_exec(["yes"], env={}, cwd=None, timeout=5, max_output=1000)
    request, _ = peer.receive()
    for _ in range(5):
        peer.send({"t": "out", "id": request["id"], "fd": 1}, b"y" * 600)
    peer.send({"t": "exit", "id": request["id"], "code": 0, "signal": None, "duration": 0.1})
    got = collect(handle)
    assert got.stdout == b"y" * 1000
    assert handle.truncated
    assert not got.raw.truncated  # the peer lied; the host caught it anyway


def test_peer_sending_more_file_data_than_allowed(peer: Peer) -> None:
    ch = connected(peer)
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            result["data"] = ch.read_file("f", 1000, time.monotonic() + WAIT)
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=read)
    t.start()
    request, _ = peer.receive()
    assert request["t"] == "read"
    assert request["max_bytes"] == 1000
    peer.send({"t": "data", "id": request["id"]}, b"z" * 800)
    peer.send({"t": "data", "id": request["id"]}, b"z" * 800)
    t.join(WAIT)
    assert not t.is_alive()
    assert isinstance(result.get("error"), ChannelError)
    assert not ch.alive


def test_peer_file_size_mismatch(peer: Peer) -> None:
    ch = connected(peer)
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            result["data"] = ch.read_file("f", 1000, time.monotonic() + WAIT)
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=read)
    t.start()
    request, _ = peer.receive()
    peer.send({"t": "data", "id": request["id"]}, b"abc")
    peer.send({"t": "done", "id": request["id"], "size": 4})
    t.join(WAIT)
    assert not t.is_alive()
    assert isinstance(result.get("error"), ChannelError)


@pytest.mark.parametrize(
    ("frames", "closes"),
    [
        pytest.param(
            [(b'["a","file",1,420,0.0]\n' * 3, None), (None, {"count": 3, "truncated": False})],
            True,
            id="more-entries-than-asked",
        ),
        pytest.param([(b"not json\n", None)], True, id="malformed"),
        pytest.param(
            [(b'["a","file",1,420,0.0]\n', None), (None, {"count": 2, "truncated": False})],
            False,
            id="count-mismatch",
        ),
        pytest.param([(None, {"count": 0, "truncated": "no"})], False, id="bad-truncated"),
    ],
)
def test_peer_sending_a_bad_listing(
    peer: Peer, frames: list[tuple[bytes | None, dict[str, Any] | None]], closes: bool
) -> None:
    ch = connected(peer)
    result: dict[str, Any] = {}

    def listing() -> None:
        try:
            result["entries"] = ch.list_entries("", False, 2, time.monotonic() + WAIT)
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=listing)
    t.start()
    request, _ = peer.receive()
    assert request["t"] == "list" and request["max_entries"] == 2
    try:
        for body, done in frames:
            if body is not None:
                peer.send({"t": "data", "id": request["id"]}, body)
            if done is not None:
                peer.send({"t": "done", "id": request["id"], **done})
    except BrokenPipeError:
        assert closes  # the host hung up on the first bad frame
    t.join(WAIT)
    assert not t.is_alive()
    assert isinstance(result.get("error"), ChannelError), result
    assert ch.alive is not closes


def test_peer_error_codes_map_to_errors(peer: Peer) -> None:
    ch = connected(peer)
    result: dict[str, Any] = {}

    def stat(path: str) -> None:
        try:
            result[path] = ch.request({"t": "stat", "path": path}, time.monotonic() + WAIT)
        except BaseException as exc:
            result[path] = exc

    for path, code in (("a", "not_found"), ("b", "internal"), ("c", "some.module.EvilError")):
        t = threading.Thread(target=stat, args=(path,))
        t.start()
        request, _ = peer.receive()
        peer.send({"t": "error", "id": request["id"], "code": code, "message": "m"})
        t.join(WAIT)
        assert not t.is_alive()
    assert isinstance(result["a"], FileAccessError) and result["a"].code == "not_found"
    assert isinstance(result["b"], ChannelError)
    # An unknown code is never turned into a class: it stays a FileAccessError with that code.
    assert type(result["c"]) is FileAccessError
    assert ch.alive
