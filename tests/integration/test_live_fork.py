"""``fork(live=True)``: the child gets the parent's running processes (gVisor checkpoints).

On gVisor with an engine that checkpoints (Docker's experimental mode; see
``checkpointing`` in test_pause.py), the child's Python sessions hold the
parent's variables, a command running in the parent runs on in both, and the
parent is intact afterwards, also when the child's copy cannot be restored.
Everywhere else ``live=True`` is refused with the fix (``live=False``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentnest import ConfigurationError, Sandbox, SnapshotError, UnsupportedCapabilityError
from agentnest.runtime.base import Capability
from agentnest.runtime.docker import checkpoint
from agentnest.runtime.docker.backend import DockerBackend
from agentnest.testing.wait import wait_until

from .test_pause import checkpointing

pytestmark = pytest.mark.timeout(300)
__all__ = ["checkpointing"]  # the fixture, used by name

#: Counts in /tmp/count (not the workspace: the fork copies /tmp only when live).
COUNTER = ["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.02; done"]


def count(sb: Sandbox) -> int:
    text = sb.exec(["sh", "-c", "cat /tmp/count 2>/dev/null"]).stdout.strip()
    return int(text) if text.isdigit() else 0


@pytest.fixture
def parent(checkpointing: DockerBackend) -> Iterator[Sandbox]:
    with Sandbox(backend=checkpointing, timeout=240) as sb:
        yield sb


@pytest.mark.gvisor
def test_the_child_holds_the_parents_sessions(parent: Sandbox) -> None:
    assert Capability.LIVE_FORK in parent.backend.capabilities()
    parent.python_session(name="main").run("x = 41")
    parent.write_file("f.txt", "from the parent")
    child = parent.fork()  # live by default here
    try:
        assert child.python_session(name="main").run("x + 1").result == "42"
        assert child.read_file("f.txt") == "from the parent"
        # Independent afterwards, both ways.
        child.python_session(name="main").run("x = 1")
        assert parent.python_session(name="main").run("x").result == "41"
        assert child.python_session(name="main").run("x").result == "1"
        child.write_file("f.txt", "child")
        assert parent.read_file("f.txt") == "from the parent"
        assert parent.exec(["echo", "p"]).stdout == "p\n" and child.exec(["echo", "c"]).stdout == "c\n"
    finally:
        child.destroy()


@pytest.mark.gvisor
def test_a_running_command_keeps_running_in_both(parent: Sandbox) -> None:
    stream = parent.stream_exec(COUNTER, timeout=200)
    wait_until(lambda: count(parent) > 2, "the counter to start")
    child = parent.fork(live=True)
    try:
        for sb in (parent, child):
            seen = count(sb)

            def went_on(sb: Sandbox = sb, seen: int = seen) -> bool:
                return count(sb) > seen

            wait_until(went_on, f"the counter to go on in {sb.id}")
    finally:
        stream.close()
        child.destroy()


@pytest.mark.gvisor
def test_a_session_holding_100_mib_forks_live(parent: Sandbox) -> None:
    parent.python_session(name="main").run("big = b'x' * (100 * 2**20)")
    started = time.monotonic()
    child = parent.fork()
    took = time.monotonic() - started
    try:
        assert child.python_session(name="main").run("len(big)").result == str(100 * 2**20)
    finally:
        child.destroy()
    print(f"live fork of a session holding 100 MiB: {took:.2f}s")


@pytest.mark.gvisor
def test_a_child_that_cannot_be_restored_leaves_the_parent_intact(
    parent: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent.python_session(name="main").run("x = 41")
    real_copy = checkpoint.copy

    def truncating_copy(source: Path, target: Path) -> None:
        real_copy(source, target)
        image = target / checkpoint.IMAGE_FILE
        data = image.read_bytes()
        image.unlink()  # a hard link to the parent's: replace it, never write through it
        image.write_bytes(data[: len(data) // 2])

    monkeypatch.setattr(checkpoint, "copy", truncating_copy)
    with pytest.raises(SnapshotError, match="parent is intact") as info:
        parent.fork()
    assert info.value.rule == "checkpoint"
    assert parent.python_session(name="main").run("x + 1").result == "42"
    assert parent.exec(["echo", "ok"]).stdout == "ok\n"


@pytest.mark.gvisor
def test_live_is_refused_for_a_memory_workspace(checkpointing: DockerBackend) -> None:
    with Sandbox(backend=checkpointing, timeout=120, workspace="memory") as sb:
        with pytest.raises(UnsupportedCapabilityError, match=r"live=False"):
            sb.fork(live=True)
        sb.python_session(name="main").run("x = 41")
        with sb.fork() as child:  # the default falls back to the files
            got = child.python_session(name="main").run("x")
            assert got.error is not None and "NameError" in got.error


@pytest.mark.docker
def test_runc_refuses_live_and_forks_the_files_by_default() -> None:
    with Sandbox(backend="docker", timeout=120) as sb:
        assert Capability.LIVE_FORK not in sb.backend.capabilities()
        with pytest.raises(UnsupportedCapabilityError, match=r"CRIU.*live=False"):
            sb.fork(live=True)
        sb.python_session(name="main").run("x = 41")
        sb.write_file("f.txt", "kept")
        with sb.fork() as child:
            assert child.read_file("f.txt") == "kept"
            got = child.python_session(name="main").run("x")
            assert got.error is not None and "NameError" in got.error  # sessions restart in the child


@pytest.mark.docker
def test_live_must_be_a_bool_or_none() -> None:
    with Sandbox(backend="docker", timeout=60) as sb, pytest.raises(ConfigurationError, match="live="):
        sb.fork(live="yes")  # type: ignore[arg-type]


@pytest.mark.gvisor
def test_a_restored_sandbox_forks_its_files_by_default_and_refuses_live(parent: Sandbox) -> None:
    parent.python_session(name="main").run("x = 41")
    child = parent.fork()
    try:
        # The child (and the parent) were restored from a checkpoint once: not again.
        with pytest.raises(UnsupportedCapabilityError, match=r"restored.*live=False"):
            child.fork(live=True)
        with child.fork() as grandchild:
            got = grandchild.python_session(name="main").run("x")
            assert got.error is not None and "NameError" in got.error
        assert child.python_session(name="main").run("x + 1").result == "42"
    finally:
        child.destroy()
