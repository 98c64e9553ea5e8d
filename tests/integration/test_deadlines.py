"""Deadlines on the real engine: extend() moves them where the keeper and prune read them,
sandbox code cannot forge one, and a host killed with SIGKILL leaves nothing behind prune.
"""

from __future__ import annotations

import signal
import textwrap
import time
from typing import Any

import pytest

from agentnest import BackendError, NetworkPolicy, PolicyDeniedError, Sandbox, SecurityPolicy
from agentnest.errors import ConfigurationError
from agentnest.runtime.docker.prune import prune

from .helpers import containers_of, spawn_host, wait_until_stopped


def wait_past(moment: float, sb: Sandbox) -> None:
    """Keep using the sandbox until the wall clock passes ``moment`` (the subject here is time)."""
    while time.time() < moment:
        assert sb.exec_shell("echo alive").stdout == "alive\n"
        time.sleep(0.25)


def test_extend_keeps_the_sandbox_past_its_first_deadline(backend_name: str, docker_client: Any) -> None:
    with Sandbox(backend=backend_name, timeout=4) as sb:
        first = sb.deadline
        new = sb.extend(60)
        assert new == pytest.approx(first + 60) and sb.deadline == new
        wait_past(first + 2, sb)
        (container,) = containers_of(docker_client, sb.id)
        assert container.status == "running"
        # The label still says the first deadline; prune reads the moved one and keeps it.
        assert float(container.labels["agentnest.deadline"]) == pytest.approx(first, abs=0.01)
        report = prune(docker_client.api, sandbox=sb.id)
        assert report.containers == () and report.ok
        assert sb.exec_shell("echo still").stdout == "still\n"


def test_an_extended_deadline_still_stops_the_sandbox(backend_name: str, docker_client: Any) -> None:
    with Sandbox(backend=backend_name, timeout=3) as sb:
        first = sb.deadline
        sb.extend(3)
        took = wait_until_stopped(docker_client, sb.id, within=25)
        assert took is not None, "the container outlived its extended deadline"
        stopped = time.time()
        assert stopped >= first + 2.5, "it stopped at the first deadline, not the extended one"


PLANT = (
    "import os, signal, time\n"
    "open('/tmp/.agentnest-deadline', 'w').write(str(time.time() + 3600))\n"
    "os.kill(1, signal.SIGUSR1)\n"
    "print('planted')\n"
)


def test_sandbox_code_cannot_forge_a_deadline(backend_name: str, docker_client: Any) -> None:
    # The first deadline leaves a loaded machine room for the exec; the planted one is an hour.
    with Sandbox(backend=backend_name, timeout=10) as sb:
        first = sb.deadline
        # Plant a far deadline where the keeper reads it, and poke PID 1 to re-read it.
        assert sb.exec_python(PLANT).stdout == "planted\n"
        took = wait_until_stopped(docker_client, sb.id, within=40)
        assert took is not None, "a deadline planted by sandbox code kept the sandbox alive"
        assert time.time() < first + 60


def test_a_planted_file_cannot_hijack_extend(backend_name: str, docker_client: Any) -> None:
    # 15 s leaves a loaded machine room for the exec and the extend before the first deadline;
    # the planted deadline is an hour away, so stopping within a minute proves it was ignored.
    with Sandbox(backend=backend_name, timeout=15) as sb:
        first = sb.deadline
        assert sb.exec_python(PLANT).stdout == "planted\n"
        if backend_name == "docker":
            # runc: root without CAP_FOWNER cannot replace the sandbox's file in the
            # sticky /tmp, so extend refuses loudly and the first deadline holds.
            with pytest.raises(BackendError, match="old deadline stays"):
                sb.extend(3600)
            assert sb.deadline == first
            assert wait_until_stopped(docker_client, sb.id, within=40) is not None
        else:
            # gVisor lets root replace it: the host's own value wins, not the planted one.
            assert sb.extend(2) == pytest.approx(first + 2)
            assert wait_until_stopped(docker_client, sb.id, within=40) is not None
            assert time.time() < first + 60


def test_extend_refuses_bad_input_and_policy_ceilings(backend_name: str) -> None:
    policy = SecurityPolicy(max_timeout=120)
    with Sandbox(backend=backend_name, timeout=100, security_policy=policy) as sb:
        first = sb.deadline
        for bad in (0, -1, float("nan"), float("inf"), True, "10"):
            with pytest.raises(ConfigurationError):
                sb.extend(bad)  # type: ignore[arg-type]
        with pytest.raises(PolicyDeniedError, match="max_timeout 120s"):
            sb.extend(30)
        assert sb.deadline == first
        assert sb.extend(20) == pytest.approx(first + 20)


CHILD = textwrap.dedent(
    """
    import sys, time
    from agentnest import NetworkPolicy, Sandbox, Secret, SecurityPolicy
    backend = sys.argv[1]
    made = [
        Sandbox(backend=backend, timeout=600),
        Sandbox(backend=backend, timeout=600, environment={"K": Secret("v4lue", as_file=True)}),
        Sandbox(backend=backend, timeout=600,
                security_policy=SecurityPolicy(network=NetworkPolicy.allowlist(domains=["allowed.test"]))),
    ]
    made[0].extend(600)
    print(" ".join(sb.id for sb in made), flush=True)
    time.sleep(600)
    """
)


def test_prune_leaves_nothing_after_the_host_is_killed(backend_name: str, docker_client: Any) -> None:
    child = spawn_host(CHILD, backend_name)
    ids: list[str] = []
    try:
        assert child.stdout is not None
        ids = child.stdout.readline().split()
        assert len(ids) == 3, "the child did not create its sandboxes"
        # The allowlisted sandbox brought a proxy container and networks.
        assert len(containers_of(docker_client, ids[2])) == 2
        assert docker_client.networks.list(filters={"label": f"agentnest.sandbox={ids[2]}"})
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        # Nothing is due yet by deadline: a plain prune keeps running sandboxes ...
        for sid in ids:
            assert prune(docker_client.api, sandbox=sid).resources == ()
        # ... and prune --orphans (the owner process is gone) reaps all of it.
        for sid in ids:
            report = prune(docker_client.api, sandbox=sid, orphans=True)
            assert report.ok, report.errors
        for sid in ids:
            assert containers_of(docker_client, sid) == []
            assert docker_client.networks.list(filters={"label": f"agentnest.sandbox={sid}"}) == []
            assert docker_client.volumes.list(filters={"label": f"agentnest.sandbox={sid}"}) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
        for sid in ids:
            for container in containers_of(docker_client, sid):
                container.remove(force=True, v=True)
            for network in docker_client.networks.list(filters={"label": f"agentnest.sandbox={sid}"}):
                network.remove()


def test_extend_moves_the_egress_proxy_deadline_too(backend_name: str, docker_client: Any) -> None:
    policy = SecurityPolicy(network=NetworkPolicy.allowlist(domains=["allowed.test"]))
    # 15 s: an allowlisted sandbox (its proxy container too) can take several seconds to start
    # on a loaded machine, and its first deadline must still be ahead when extend() runs.
    with Sandbox(backend=backend_name, timeout=15, security_policy=policy) as sb:
        first = sb.deadline
        sb.extend(60)
        wait_past(first + 2, sb)
        running = {c.labels["agentnest.role"]: c.status for c in containers_of(docker_client, sb.id)}
        assert running == {"sandbox": "running", "proxy": "running"}
        # The proxy still answers: the sandbox's way out did not die at the first deadline.
        proxy = sb.exec_python("import os; print(os.environ['HTTP_PROXY'])").stdout.strip()
        host, port = proxy.split("//")[1].rsplit(":", 1)
        probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=5).close(); print('up')"
        assert sb.exec_python(probe).stdout == "up\n"
        assert prune(docker_client.api, sandbox=sb.id).resources == ()
