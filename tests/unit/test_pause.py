"""``Sandbox.pause`` / ``resume`` without an engine: the agent is a local process stopped with SIGSTOP.

The engine-backed behaviour (docker pause on runc and gVisor) is in
tests/integration/test_pause.py; here the sandbox's own rules: new calls are
refused while paused, calls in flight wait through the pause, both are
idempotent, events, and the refusals (no capability, destroyed).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from doubles import local_agent as process

from agentnest import (
    MemoryObserver,
    Sandbox,
    SandboxDestroyedError,
    SandboxPausedError,
    UnsupportedCapabilityError,
)
from agentnest.channel import client
from agentnest.runtime.base import Capability, SandboxHandle
from agentnest.testing.fake import FakeBackend
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)


class StoppingBackend(process.LocalBackend):
    """Pauses a sandbox by stopping its agent processes (SIGSTOP), resumes with SIGCONT."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, process.LOCAL_CAPABILITIES | {Capability.PAUSE})
        self.calls: list[str] = []

    def _signal(self, handle: SandboxHandle, sig: int) -> None:
        for agent in self.agents.get(handle.id, []):
            if agent.proc.poll() is None:
                os.kill(agent.proc.pid, sig)

    def pause(self, handle: SandboxHandle) -> str:
        self.calls.append("pause")
        self._signal(handle, signal.SIGSTOP)
        return "freezer"

    def resume(self, handle: SandboxHandle) -> bool:
        self.calls.append("resume")
        self._signal(handle, signal.SIGCONT)
        return False


@pytest.fixture
def events() -> MemoryObserver:
    return MemoryObserver()


@pytest.fixture
def backend(tmp_path: Path) -> StoppingBackend:
    return StoppingBackend(tmp_path)


@pytest.fixture
def sandbox(backend: StoppingBackend, events: MemoryObserver) -> Iterator[Sandbox]:
    sb = Sandbox("local", timeout=60, backend=backend, observers=[events])
    try:
        yield sb
    finally:
        sb.destroy()


def test_calls_are_refused_while_paused_and_work_after(sandbox: Sandbox, backend: StoppingBackend) -> None:
    session = sandbox.python_session(name="main")
    session.run("n = 1")
    sandbox.pause()
    assert "paused" in repr(sandbox)
    states = [sandbox.paused]
    for call in (
        lambda: sandbox.exec(["true"]),
        lambda: sandbox.read_file("x"),
        lambda: sandbox.python_session(name="main").run("n"),
        sandbox.sessions,
        sandbox.fork,
    ):
        with pytest.raises(SandboxPausedError, match=r"resume\(\)"):
            call()
    sandbox.resume()
    states.append(sandbox.paused)
    assert states == [True, False]
    assert session.run("n += 1; n").result == "2"
    assert sandbox.exec(["echo", "ok"]).stdout.strip() == "ok"
    assert backend.calls == ["pause", "resume"]


def test_pause_and_resume_are_idempotent(
    sandbox: Sandbox, backend: StoppingBackend, events: MemoryObserver
) -> None:
    sandbox.resume()  # not paused: nothing to do
    sandbox.pause()
    sandbox.pause()
    sandbox.resume()
    sandbox.resume()
    assert backend.calls == ["pause", "resume"]
    kinds = [t for t in events.types() if t.startswith("sandbox.")]
    assert kinds == ["sandbox.created", "sandbox.paused", "sandbox.resumed"]
    assert all(e.attributes["seconds"] >= 0 for e in events.events if e.type.value == "sandbox.paused")


def test_a_call_in_flight_waits_through_the_pause(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    # The stall detector would take a frozen agent's silence for a stuck channel;
    # while paused it must not.  A short stall window makes that quick to show.
    monkeypatch.setattr(client, "STALL_AFTER", 0.3)
    marker = Path(sandbox.handle.info["workspace"]) / "started"
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["out"] = sandbox.exec(["sh", "-c", "touch started; sleep 1; echo done"]).stdout
        except Exception as exc:  # reported below
            result["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    wait_until(marker.exists, "the command to start")
    sandbox.pause()
    paused_at = time.monotonic()
    # The pause must outlast the stall window (0.3 s): elapsed time is the condition here.
    wait_until(lambda: time.monotonic() - paused_at > 1.0, "a pause longer than the stall window")
    sandbox.resume()
    worker.join(30)
    assert result.get("error") is None, result
    assert result["out"] == "done\n"


def test_pause_without_the_capability_names_the_fix(tmp_path: Path) -> None:
    with Sandbox("local", timeout=60, backend=process.LocalBackend(tmp_path)) as sb:
        with pytest.raises(UnsupportedCapabilityError, match="cannot pause"):
            sb.pause()
        assert not sb.paused
        assert sb.exec(["true"]).exit_code == 0


def test_the_default_backend_refuses_pause() -> None:
    handle = SandboxHandle("x", "bare", 0.0)
    with pytest.raises(UnsupportedCapabilityError, match="cannot pause"):
        FakeBackend().pause(handle)  # RuntimeBackend's own pause and resume
    with pytest.raises(UnsupportedCapabilityError):
        FakeBackend().resume(handle)


def test_pause_of_a_destroyed_sandbox(sandbox: Sandbox) -> None:
    sandbox.destroy()
    with pytest.raises(SandboxDestroyedError):
        sandbox.pause()
    with pytest.raises(SandboxDestroyedError):
        sandbox.resume()


def test_destroy_while_paused(sandbox: Sandbox, backend: StoppingBackend) -> None:
    sandbox.pause()
    sandbox.destroy()
    assert sandbox.destroyed and sandbox.id in backend.destroyed
