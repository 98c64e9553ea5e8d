"""0.3.0 behaviours that signatures cannot show, on the real engine (issue 11).

Each test is a call a 0.3.0 program makes, and asserts the 0.3.0 outcome.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentnest import (
    EventType,
    ExecutionTimeoutError,
    NetworkPolicy,
    PythonSession,
    Sandbox,
    SandboxEvent,
    Secret,
    SecurityPolicy,
    UnsupportedCapabilityError,
)
from agentnest.errors import AgentNestError, ConfigurationError
from agentnest.events import JsonLogObserver
from agentnest.runtime.docker import hardening

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker, id="runc"),
    pytest.param("gvisor", marks=pytest.mark.gvisor, id="runsc"),
]


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    with Sandbox(timeout=600) as sandbox:
        yield sandbox


def containers(docker_client: Any, **labels: str) -> list[Any]:
    wanted = [f"{k}={v}" for k, v in labels.items()]
    return list(docker_client.containers.list(all=True, filters={"label": wanted}, ignore_removed=True))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("memory", ["128m", "256m"])
def test_small_memory_limits_work_with_default_settings(backend: str, memory: str) -> None:
    """0.3.0 took any memory; ours refused under 352m while the workspace was a fixed 256m."""
    with Sandbox(memory=memory, backend=backend, timeout=120) as sandbox:
        limits = sandbox.config.limits
        # What lives in memory fits in it (a disk workspace, the default with a
        # storage pool, does not count; a tmpfs one does).
        on_disk = limits.workspace_medium == "disk"
        assert limits.scratch + (0 if on_disk else limits.workspace) < limits.memory
        out = sandbox.exec_shell("id -u; df -k /workspace | tail -1").check().stdout.split()
        assert out[0] == "65532"  # the workload's UID, as in 0.3.0
        if not on_disk:
            assert int(out[2]) * 1024 == limits.workspace  # the workspace is as big as the defaults say


@pytest.mark.docker
def test_exec_takes_030_keywords(sb: Sandbox) -> None:
    sb.exec(["mkdir", "-p", "sub"]).check()
    result = sb.exec(
        ["sh", "-c", 'echo "$TOKEN $PLAIN"; pwd'],
        environment={"TOKEN": Secret("s3cr3t-030"), "PLAIN": "p"},
        workdir="/workspace/sub",
        display_command="show token",
    )
    assert result.stdout == "[REDACTED] p\n/workspace/sub\n"
    assert result.command == "show token"
    shell = sb.exec_shell("echo $V", environment={"V": "v"}, workdir="sub")
    assert (shell.stdout, shell.command) == ("v\n", "echo $V")
    python = sb.exec_python("import os; print(os.getcwd())", workdir="/workspace/sub")
    assert python.stdout == "/workspace/sub\n"
    assert sb.exec_json("import os, json; print(json.dumps(os.environ['J']))", environment={"J": "j"}) == "j"
    with pytest.raises(ConfigurationError, match="not both"):
        sb.exec(["true"], env={"A": "1"}, environment={"A": "2"})


@pytest.mark.docker
def test_stream_shell_ends_with_a_status_chunk(sb: Sandbox) -> None:
    chunks = list(sb.stream_shell("echo one; exit 3", environment={"X": "1"}, workdir="/workspace"))
    assert [(c.stream, c.data) for c in chunks[:-1]] == [("stdout", "one\n")]
    assert (chunks[-1].stream, chunks[-1].exit_code) == ("status", 3)
    assert all(c.timestamp > 0 for c in chunks)


@pytest.mark.docker
def test_files_with_030_names(sb: Sandbox, tmp_path: Path) -> None:
    sb.write_file("latin.txt", content="café", encoding="latin-1")
    assert sb.read_file("latin.txt", encoding=None) == "café".encode("latin-1")
    assert sb.read_file("latin.txt", encoding="latin-1") == "café"
    assert isinstance(sb.read_file("latin.txt", "latin-1"), str)
    local = tmp_path / "upload.bin"
    local.write_bytes(b"\x00\x01")
    sb.upload_file(local)  # 0.3.0: the destination defaults to the file's name
    sb.download_file(source="upload.bin", destination=tmp_path / "deep" / "down.bin")  # parents created
    assert (tmp_path / "deep" / "down.bin").read_bytes() == b"\x00\x01"
    meta = sb.snapshot(destination=tmp_path / "snap.tar")
    assert meta.created_at == meta.created > 0 and meta.path == tmp_path / "snap.tar"
    sb.write_file("latin.txt", "changed")
    sb.restore(source=tmp_path / "snap.tar")
    assert sb.read_file("latin.txt", encoding="latin-1") == "café"
    artifacts = sb.artifacts("*.bin")
    assert isinstance(artifacts, tuple) and [a.path for a in artifacts] == ["upload.bin"]


@pytest.mark.docker
def test_a_read_over_max_file_read_bytes_is_a_value_error() -> None:
    """0.3.0 raised ValueError for a read over its limit; ours' FileTooLargeError is one too."""
    policy = SecurityPolicy(max_file_read_bytes=1024)
    with Sandbox(security_policy=policy, timeout=120) as sandbox:
        sandbox.write_file("big.bin", b"x" * 4096)  # writes are bounded by max_file_bytes
        with pytest.raises(ValueError, match=r"big\.bin"):
            sandbox.read_file("big.bin", encoding=None)
        sandbox.write_file("small.txt", "ok")
        assert sandbox.read_file("small.txt") == "ok"


def pid_of(session: PythonSession) -> int | None:
    return session.pid


@pytest.mark.docker
def test_sessions_start_as_in_030(sb: Sandbox) -> None:
    session = sb.python_session(start_timeout=30)
    assert session.pid is not None  # python_session() starts it, as 0.3.0 did
    session.start()  # idempotent
    session.run("x = 41")
    assert session.run("x + 1").check().result == "42"
    lazy = PythonSession(sb, start_timeout=30)
    assert pid_of(lazy) is None  # 0.3.0: constructed, not started
    lazy.start()
    assert pid_of(lazy) not in (None, session.pid)
    assert lazy.run("'x' in globals()").result == "False"  # its own interpreter
    lazy.close()
    session.close()


@pytest.mark.docker
def test_timeout_keeps_the_sandbox_and_run_code_output(sb: Sandbox) -> None:
    with pytest.raises(ExecutionTimeoutError) as info:
        sb.exec_shell("echo partial; sleep 60", timeout=1)
    assert info.value.result is not None
    assert info.value.result.timed_out and info.value.result.stdout == "partial\n"
    assert isinstance(info.value, TimeoutError)
    assert sb.run_code("a = 10; print(a * 2)").output == "20\n"


class EmitOnly:
    """A 0.3.0 observer: an object with ``emit`` and no ``__call__``."""

    def __init__(self) -> None:
        self.events: list[SandboxEvent] = []

    def emit(self, event: SandboxEvent) -> None:
        self.events.append(event)


@pytest.mark.docker
def test_030_observers_receive_every_event(caplog: pytest.LogCaptureFixture) -> None:
    observer = EmitOnly()
    logger = logging.getLogger("agentnest.test.audit030")
    with (
        caplog.at_level(logging.INFO, logger=logger.name),
        Sandbox(observers=(observer, JsonLogObserver(logger)), timeout=120) as sandbox,
    ):
        sandbox.exec_shell("true")
    kinds = [e.type for e in observer.events]
    assert kinds[0] is EventType.CREATED and EventType.DESTROYED in kinds
    assert EventType.EXECUTION_STARTED in kinds and EventType.EXECUTION_FINISHED in kinds
    first = observer.events[0]
    assert first.timestamp == first.time and first.attributes == first.data and len(first.event_id) == 32
    assert first.attributes["resolved_image"]  # what the engine ran
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == logger.name]
    assert [entry["event_id"] for entry in logged] == [e.event_id for e in observer.events]


@pytest.mark.docker
def test_rootless_and_apparmor_are_refused_when_the_engine_cannot_honour_them(docker_client: Any) -> None:
    options = " ".join(docker_client.info().get("SecurityOptions") or ())
    if "rootless" in options or "apparmor" in options:
        pytest.skip(f"this engine is rootless or has AppArmor ({options}); the refusal cannot be shown")
    before = {c.id for c in containers(docker_client, **{"agentnest.managed": "true"})}
    with pytest.raises(UnsupportedCapabilityError, match="rootless"):
        Sandbox(security_policy=SecurityPolicy(rootless=True), timeout=60)
    with pytest.raises(UnsupportedCapabilityError, match="AppArmor"):
        Sandbox(security_policy=SecurityPolicy(apparmor_profile="docker-default"), timeout=60)
    after = {c.id for c in containers(docker_client, **{"agentnest.managed": "true"})}
    assert after <= before  # nothing was created for the refused sandboxes


@pytest.mark.docker
def test_a_policy_seccomp_profile_replaces_ours(tmp_path: Path) -> None:
    doc = json.loads(hardening.profile_json("x86_64" if os.uname().machine == "x86_64" else "aarch64"))
    # Ours allows by default and refuses a list; this one refuses mkdir as well.
    doc["syscalls"].append({"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1})
    profile = tmp_path / "no-mkdir.json"
    profile.write_text(json.dumps(doc))
    with Sandbox(security_policy=SecurityPolicy(seccomp_profile=str(profile)), timeout=120) as sandbox:
        refused = sandbox.exec_shell("mkdir /workspace/d")
        assert refused.exit_code != 0 and "not permitted" in refused.stderr.lower()
    with Sandbox(timeout=120) as sandbox:  # the default profile allows it
        sandbox.exec_shell("mkdir /workspace/d").check()
    with pytest.raises(ConfigurationError, match="cannot be read"):
        Sandbox(security_policy=SecurityPolicy(seccomp_profile=str(tmp_path / "missing.json")), timeout=60)
    with pytest.raises(ConfigurationError, match="unconfined"):
        SecurityPolicy(seccomp_profile="unconfined")


@pytest.mark.docker
def test_egress_proxy_image_is_the_one_the_proxy_runs(docker_client: Any) -> None:
    from agentnest.runtime.docker import base_image

    tag = "agentnest-test/proxy-030:1"
    docker_client.images.get(base_image()).tag(tag)
    try:
        policy = SecurityPolicy(
            network=NetworkPolicy.allowlist(domains=("example.test",)), egress_proxy_image=tag
        )
        with Sandbox(security_policy=policy, timeout=120) as sandbox:
            proxies = containers(
                docker_client, **{"agentnest.sandbox": sandbox.id, "agentnest.role": "proxy"}
            )
            assert [p.attrs["Config"]["Image"] for p in proxies] == [tag]
    finally:
        docker_client.images.remove(tag, noprune=True)


@pytest.mark.docker
def test_030_bad_input_raises_030_types() -> None:
    from agentnest.runtime.docker import base_image

    with pytest.raises(ValueError):  # 0.3.0: ValueError
        Sandbox(backend="no-such-backend")
    with pytest.raises(ValueError):
        Sandbox(memory="lots")
    with pytest.raises(ValueError):
        SecurityPolicy(max_output_bytes=0)
    with pytest.raises(ValueError):
        SecurityPolicy(allowed_images=("python:3.12-slim",)).validate_image("other:1")
    with pytest.raises(AgentNestError, match="Kubernetes backend"):
        Sandbox(backend="kubernetes")
    with pytest.deprecated_call():
        assert NetworkPolicy.allowed() == NetworkPolicy.open()
    with pytest.deprecated_call(), Sandbox(runtime=base_image(), timeout=60) as sandbox:
        assert sandbox.config.image == base_image()  # 0.3.0's name of image=
