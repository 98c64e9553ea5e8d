"""``Sandbox.from_checkpoint``: a sandbox paused to disk resumes in another process (gVisor).

On gVisor with an engine that checkpoints (see ``checkpointing`` in
test_pause.py), ``pause()`` leaves a record beside the checkpoint; a new
process resumes the sandbox from it with its Python sessions, processes,
files, secrets (still redacted) and deadline, and owns it from then on.
``prune --orphans`` leaves a paused sandbox alone although its creator is
gone.  Every wrong call is refused with an error from the AgentNest tree
and leaves the sandbox paused and resumable (or, past its deadline, to
``prune``); nothing is left behind: no container, no record.
"""

from __future__ import annotations

import json
import os
import secrets
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentnest import (
    AsyncSandbox,
    BackendError,
    ConfigurationError,
    MemoryObserver,
    NetworkPolicy,
    PolicyDeniedError,
    Sandbox,
    SandboxDestroyedError,
    SecurityPolicy,
    SnapshotError,
    UnsupportedCapabilityError,
)
from agentnest.runtime import storage
from agentnest.runtime.docker import checkpoint, labels
from agentnest.runtime.docker.backend import DockerBackend
from agentnest.runtime.docker.prune import EXPIRED, prune
from agentnest.testing.wait import wait_until

from .helpers import containers_of, owned_containers, owner_label, spawn_host
from .test_pause import checkpointing

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(180)]
__all__ = ["checkpointing"]  # the fixture, used by name

#: Counts in /tmp (the scratch tmpfs: part of the checkpoint), detached from the exec that starts it.
#: Each count is written aside and renamed into place, so a reader never sees the file between
#: its truncation and its write (an empty read, seen once as "the counter is 0" under load).
COUNTER = (
    "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; "
    "sleep 0.02; done' "
    ">/dev/null 2>&1 </dev/null &"
)

#: Another process: creates a sandbox, leaves state in it, pauses it to disk and exits normally.
CREATOR = textwrap.dedent(
    f"""
    import json, os
    from agentnest import Sandbox, Secret
    from agentnest.runtime.docker import labels
    from agentnest.runtime.docker import DockerBackend, DockerSpec
    from agentnest.testing.wait import wait_until

    host = os.environ.get("AGENTNEST_TEST_CHECKPOINT_DOCKER_HOST") or None
    backend = DockerBackend(DockerSpec(docker_host=host, oci_runtime="runsc"), name="gvisor")
    sb = Sandbox(backend=backend, timeout=240, environment={{"TOKEN": Secret("s3cr3t-value"), "PLAIN": "p"}})
    print(sb.id, flush=True)  # first, so that the test can clean up whatever happens next
    sb.python_session(name="main").run("x = 41")
    sb.write_file("kept.txt", "written before the pause")
    sb.exec_shell({COUNTER!r})
    wait_until(lambda: sb.exec_shell("cat /tmp/count 2>/dev/null").stdout.strip(), "the counter to start")
    sb.pause()
    print(json.dumps({{"deadline": sb.deadline, "owner": labels.owner()}}), flush=True)
    """
)


def record_path(sandbox_id: str) -> Path:
    return checkpoint.record_dir() / f"{sandbox_id}.json"


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def count(sb: Sandbox) -> int:
    text = sb.exec_shell("cat /tmp/count 2>/dev/null").stdout.strip()
    return int(text) if text.isdigit() else 0


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """A docker-py client of the engine that checkpoints (the default one, or the test's own)."""
    import docker

    host = os.environ.get("AGENTNEST_TEST_CHECKPOINT_DOCKER_HOST")
    client = docker.DockerClient(base_url=host, timeout=60) if host else docker.from_env(timeout=60)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def made(checkpointing: DockerBackend, engine: Any) -> Iterator[list[str]]:
    """Ids of the sandboxes a test makes: none may leave a container, a record or a workspace behind.

    A sandbox another process made carries that process's owner label, so
    it is looked for by its id; ours by owner as well.
    """
    pool = storage.find_pool()
    before = owned_containers(engine)
    ids: list[str] = []
    yield ids
    left = [
        sid
        for sid in ids
        if containers_of(engine, sid) or record_path(sid).exists() or (pool and pool.path(sid).exists())
    ]
    for sid in left:  # a failed test's leftovers: removed (the workspace too), then reported
        prune(checkpointing.api, everything=True, sandbox=sid, pool=pool)
        checkpoint.remove_record(sid)
    assert not left, f"sandboxes left behind (containers, records or workspaces): {left}"
    assert owned_containers(engine) == before


def pause_elsewhere(made: list[str]) -> tuple[str, dict[str, Any]]:
    """Run :data:`CREATOR`; return the id of the sandbox it paused and what it printed about it."""
    child = spawn_host(CREATOR)
    try:
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    lines = out.splitlines()
    made.extend(lines[:1])  # whatever became of it: cleaned up and reported by `made`
    assert child.returncode == 0 and len(lines) == 2, (
        f"the creating process failed: {child.returncode} {out!r}"
    )
    return lines[0], json.loads(lines[1])


def test_a_sandbox_paused_by_another_process_resumes_here(
    checkpointing: DockerBackend, engine: Any, made: list[str]
) -> None:
    sid, paused = pause_elsewhere(made)
    (container,) = containers_of(engine, sid)
    assert container.status == "exited"  # checkpointed: stopped, memory released
    record = checkpoint.read_record(sid)
    assert record["paused"] is True and record["owner"] == paused["owner"]
    assert stat_mode(record_path(sid)) == 0o600

    # Its creator is gone, but a paused sandbox is resumable until its deadline: prune --orphans keeps it.
    assert labels.owner_alive(paused["owner"]) is False
    assert prune(checkpointing.api, orphans=True, sandbox=sid, dry_run=True).resources == ()
    report = prune(checkpointing.api, orphans=True, sandbox=sid)
    assert report.resources == () and report.ok, report.errors
    assert len(containers_of(engine, sid)) == 1 and record_path(sid).exists()

    events = MemoryObserver()
    started = time.monotonic()
    sb = Sandbox.from_checkpoint(sid, backend=checkpointing, observers=[events])
    took = time.monotonic() - started
    try:
        assert (sb.id, sb.paused) == (sid, False)
        first = events.events[0]
        assert first.type.value == "sandbox.resumed" and first.data["from_checkpoint"] is True
        assert first.data["reconnected"] is True  # the restored agent answered: its sessions are kept
        assert sb.deadline == paused["deadline"]  # it kept counting while paused
        # Its interpreter, its files, and a process that counts on.
        assert sb.python_session(name="main").run("x + 1").result == "42"
        assert sb.read_file("kept.txt") == "written before the pause"
        seen = count(sb)
        assert seen > 0
        wait_until(lambda: count(sb) > seen, "the counter to go on")
        # The environment came back, its secret redacted (and still the real value inside).
        assert sb.exec_shell("echo $TOKEN").stdout == "[REDACTED]\n"
        assert sb.exec_shell('[ "$TOKEN" = s3cr3t-value ] && echo same').stdout == "same\n"
        assert sb.exec_shell("echo $PLAIN").stdout == "p\n"

        # This process owns it now; prune --orphans keeps it, and nobody else can take it over.
        record = checkpoint.read_record(sid)
        assert record["owner"] == owner_label() and record["paused"] is False
        assert prune(checkpointing.api, orphans=True, sandbox=sid, dry_run=True).resources == ()
        with pytest.raises(BackendError, match="not paused"):
            Sandbox.from_checkpoint(sid, backend=checkpointing)

        sb.pause()
        assert sb.paused
        sb.resume()
        assert sb.exec(["echo", "again"]).stdout == "again\n"
    finally:
        sb.destroy()
    assert containers_of(engine, sid) == [] and not record_path(sid).exists()
    types = events.types()
    assert "sandbox.created" not in types and "agent.restarted" not in types  # reconnected, not replaced
    assert types[-1] == "sandbox.destroyed"
    print(f"from_checkpoint in another process: {took:.2f}s")


def test_ids_that_name_no_paused_sandbox_are_refused(checkpointing: DockerBackend) -> None:
    with pytest.raises(SandboxDestroyedError, match="prune"):
        Sandbox.from_checkpoint(secrets.token_hex(6), backend=checkpointing)
    with pytest.raises(ConfigurationError, match="12 hex digits"):
        Sandbox.from_checkpoint("not-an-id", backend=checkpointing)


def test_refusals_leave_the_sandbox_paused_and_resumable(
    checkpointing: DockerBackend, engine: Any, made: list[str]
) -> None:
    with Sandbox(backend=checkpointing, timeout=180) as sb:
        made.append(sb.id)
        sb.python_session(name="main").run("x = 41")
        with pytest.raises(BackendError, match="running, not paused"):
            Sandbox.from_checkpoint(sb.id, backend=checkpointing)  # never paused
        sb.pause()

        with pytest.raises(UnsupportedCapabilityError, match="gVisor"):
            Sandbox.from_checkpoint(sb.id, backend="docker")  # runc
        allowlist = SecurityPolicy(network=NetworkPolicy.allowlist(domains=["example.com"]))
        with pytest.raises(ConfigurationError, match="network"):
            Sandbox.from_checkpoint(sb.id, backend=checkpointing, security_policy=allowlist)
        with pytest.raises(ConfigurationError, match="rootless"):
            Sandbox.from_checkpoint(
                sb.id, backend=checkpointing, security_policy=SecurityPolicy(rootless=True)
            )
        with pytest.raises(PolicyDeniedError, match="memory"):
            Sandbox.from_checkpoint(
                sb.id, backend=checkpointing, security_policy=SecurityPolicy(max_memory="64m")
            )

        path = record_path(sb.id)
        kept = path.read_bytes()
        doc = json.loads(kept)
        doc["version"] = checkpoint.RECORD_VERSION + 1
        path.write_text(json.dumps(doc))
        with pytest.raises(SnapshotError, match=f"record version {checkpoint.RECORD_VERSION + 1}") as info:
            Sandbox.from_checkpoint(sb.id, backend=checkpointing)
        assert info.value.rule == "checkpoint"
        path.write_bytes(kept)

        # Nothing was lost on the way: still paused, and it resumes.
        assert checkpoint.read_record(sb.id)["paused"] is True
        assert [c.status for c in containers_of(engine, sb.id)] == ["exited"]
        with Sandbox.from_checkpoint(sb.id, backend=checkpointing) as restored:
            assert restored.python_session(name="main").run("x + 1").result == "42"
            # The object that paused it cannot take it back: one host per agent.
            with pytest.raises(BackendError, match="another process resumed it"):
                sb.resume()
            assert restored.exec(["echo", "mine"]).stdout == "mine\n"


def test_a_truncated_checkpoint_is_refused_and_destroy_cleans_up(
    checkpointing: DockerBackend, engine: Any, made: list[str]
) -> None:
    with Sandbox(backend=checkpointing, timeout=180) as sb:
        made.append(sb.id)
        sb.write_file("keep.txt", "kept")
        sb.pause()
        image = (
            checkpoint.directory(
                checkpointing.engine_info(), sb.handle.info["container"], checkpoint.PAUSE_NAME
            )
            / checkpoint.IMAGE_FILE
        )
        with image.open("r+b") as f:
            f.truncate(image.stat().st_size // 2)
        with pytest.raises(SnapshotError, match="checkpoint") as info:
            Sandbox.from_checkpoint(sb.id, backend=checkpointing)
        assert info.value.rule == "checkpoint"
        assert checkpoint.read_record(sb.id)["paused"] is True
        workspace = checkpointing.workspace_path(sb.handle)
        assert workspace is not None and (workspace / "keep.txt").read_text() == "kept"
        sb.destroy()
    assert containers_of(engine, sb.id) == [] and not record_path(sb.id).exists()
    assert not workspace.exists()


def test_a_sandbox_whose_deadline_passed_while_paused_is_for_prune(
    checkpointing: DockerBackend, engine: Any, made: list[str]
) -> None:
    with Sandbox(backend=checkpointing, timeout=8) as sb:
        made.append(sb.id)
        sb.pause()
        wait_until(lambda: time.time() > sb.deadline, "the deadline to pass", within=15)
        with pytest.raises(SandboxDestroyedError, match="prune"):
            Sandbox.from_checkpoint(sb.id, backend=checkpointing)
        report = prune(checkpointing.api, sandbox=sb.id)
        assert report.ok, report.errors
        assert [r.reason for r in report.containers] == [EXPIRED]
        assert containers_of(engine, sb.id) == [] and not record_path(sb.id).exists()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_async_face_resumes_a_paused_sandbox(checkpointing: DockerBackend, made: list[str]) -> None:
    async with AsyncSandbox.create(backend=checkpointing, timeout=180) as sb:
        made.append(sb.id)
        await sb.write_file("kept.txt", "kept")
        await sb.pause()
        async with AsyncSandbox.from_checkpoint(sb.id, backend=checkpointing) as restored:
            assert restored.id == sb.id
            assert (await restored.exec(["cat", "kept.txt"])).stdout == "kept"
        assert restored.destroyed
