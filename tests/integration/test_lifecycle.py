"""Lifecycle: destroy is final and idempotent; the deadline holds even if the host process dies."""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from agentnest import Sandbox, SandboxDestroyedError

from .helpers import containers_of, spawn_host, wait_until_stopped


def test_context_manager_removes_the_container(backend_name: str, docker_client: Any) -> None:
    with Sandbox(backend=backend_name, timeout=60) as sb:
        assert [c.status for c in containers_of(docker_client, sb.id)] == ["running"]
    assert sb.destroyed
    assert containers_of(docker_client, sb.id) == []


def test_destroy_is_idempotent_and_final(backend_name: str, docker_client: Any) -> None:
    sb = Sandbox(backend=backend_name, timeout=60)
    sb.write_file("f.txt", "x")
    sb.destroy()
    sb.destroy()
    assert sb.destroyed
    assert containers_of(docker_client, sb.id) == []
    calls: dict[str, Callable[[], object]] = {
        "exec": lambda: sb.exec(["true"]),
        "exec_shell": lambda: sb.exec_shell("true"),
        "exec_python": lambda: sb.exec_python("pass"),
        "run_code": lambda: sb.run_code("pass"),
        "stream_shell": lambda: list(sb.stream_shell("true")),
        "write_file": lambda: sb.write_file("g.txt", "x"),
        "read_file": lambda: sb.read_file("f.txt"),
        "list_files": lambda: sb.list_files(),
        "exists": lambda: sb.exists("f.txt"),
        "mkdir": lambda: sb.mkdir("d"),
        "remove_file": lambda: sb.remove_file("f.txt"),
    }
    for name, call in calls.items():
        with pytest.raises(SandboxDestroyedError):
            call()
            pytest.fail(f"{name} worked after destroy()")


def test_deadline_stops_the_container_by_itself(backend_name: str, docker_client: Any) -> None:
    with Sandbox(backend=backend_name, timeout=3) as sb:
        assert sb.exec_shell("echo alive").stdout == "alive\n"
        # The host stays alive but does nothing: the container must stop itself.
        took = wait_until_stopped(docker_client, sb.id, within=20)
        assert took is not None, "the container outlived its deadline by more than 17s"
        with pytest.raises(SandboxDestroyedError) as info:
            sb.exec_shell("echo hi")
        assert "deadline" in str(info.value)
    assert containers_of(docker_client, sb.id) == []


CHILD = textwrap.dedent(
    """
    import sys, time
    from agentnest import Sandbox
    sb = Sandbox(backend=sys.argv[1], timeout=4)
    print(sb.id, flush=True)
    time.sleep(600)
    """
)


def test_deadline_holds_after_the_host_process_is_killed(backend_name: str, docker_client: Any) -> None:
    child = spawn_host(CHILD, backend_name)
    sandbox_id = ""
    try:
        assert child.stdout is not None
        sandbox_id = child.stdout.readline().strip()
        assert sandbox_id, "the child did not create a sandbox"
        (container,) = containers_of(docker_client, sandbox_id)
        assert container.status == "running"
        assert container.labels["agentnest.owner"].endswith(f":{child.pid}")
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert wait_until_stopped(docker_client, sandbox_id, within=15) is not None, (
            "the orphaned container did not stop at its deadline"
        )
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
        for container in containers_of(docker_client, sandbox_id) if sandbox_id else []:
            container.remove(force=True, v=True)
