"""Nothing outlives its client: a client process SIGKILLed at each stage leaves no sandbox and no quota.

Each case starts a real client process (Python with httpx, or the stock E2B code interpreter
SDK in its own venv) against ``agentnest serve`` on loopback (runc, a fresh SQLite or
PostgreSQL database), waits until the client says it is where the case wants it (a line it
prints once a marker file exists in the sandbox, or the server holding the lease), then kills
it with SIGKILL.  Within lease + 5 s of the kill its sandbox is gone (the server's record, its
tenant's quota and the container), and a command it was running had its process tree killed
at the disconnect, long before the sandbox was reaped (seen with ``docker top``, which does
not touch the sandbox's lease).  A create it left queued leaves the queue.  An E2B background
command (envd's ``Process.Start``) runs on as envd has it, but holds the lease only while its
client's stream is attached.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentnest.runtime.docker import base_image
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling, TokenStore
from agentnest.server.service import Service
from agentnest.server.tenants import Tenant
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

#: The idle lease of the cases' sandboxes: long enough that a killed command is seen gone before
#: the sandbox is reaped on a loaded machine, short enough to keep the test quick.
IDLE = 6.0
#: The session lease's grace.
GRACE = 2.0
#: The bound the issue sets: a killed client's sandboxes gone and its quota free within lease + 5 s.
SLACK = 5.0
#: The sleeps of a case's command (``sleep 987`` in the background, ``sleep 986`` in front: a tree).
TREE = ("sleep 987", "sleep 986")
#: The E2B case's command, run by the kernel through subprocess.
KERNEL_SLEEP = "sleep 985"

CLIENT = """
import sys, threading, time
import httpx

url, secret, case, idle = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
http = httpx.Client(base_url=url, headers={"Authorization": "Bearer " + secret}, timeout=600)
tree = "touch started; sleep 987 & sleep 986; wait"

def say(*words):
    print(*words, flush=True)

def background(method, path, **kwargs):
    threading.Thread(target=http.request, args=(method, path), kwargs=kwargs, daemon=True).start()

if case == "queued":
    say("sandbox", "-")
    background("POST", "/v1/sandboxes", json={"memory": "64m", "max_wait": 120})
    say("ready")
    sys.stdin.read()
lease = {"lease": "session"} if case == "session" else {"lease": "idle", "idle_timeout": idle}
made = http.post("/v1/sandboxes", json={"memory": "64m", **lease})
made.raise_for_status()
sid = made.json()["id"]
say("sandbox", sid)

def wait_started(exists):
    while not exists():
        time.sleep(0.05)

def started():
    return http.get("/v1/sandboxes/" + sid + "/files/started").status_code == 200

if case == "session":
    # Both kept: either one dropped (collected) closes the connection.
    holding = http.stream("GET", "/v1/sandboxes/" + sid + "/lease")
    lines = holding.__enter__().iter_lines()
    next(lines)
elif case == "exec":
    background("POST", "/v1/sandboxes/" + sid + "/exec", json={"shell": tree, "timeout": 600})
    wait_started(started)
elif case == "stream":
    run = {"shell": tree, "timeout": 600}
    streaming = http.stream("POST", "/v1/sandboxes/" + sid + "/exec/stream", json=run)
    streaming.__enter__()
    wait_started(started)
elif case == "upload":
    def body():
        yield b"x" * 65536
        threading.Event().wait()  # the rest of the upload never comes
    background("PUT", "/v1/sandboxes/" + sid + "/files/big", content=body())
elif case == "execute":
    from e2b_code_interpreter import Sandbox
    sbx = Sandbox.connect(sid)
    code = "import subprocess\\nopen('started', 'w').close()\\nsubprocess.run(['sleep', '985'])"
    threading.Thread(target=sbx.run_code, args=(code,), kwargs={"timeout": 600}, daemon=True).start()
    wait_started(lambda: sbx.files.exists("started"))
elif case == "envd":
    from e2b import Sandbox
    sbx = Sandbox.connect(sid)
    command = sbx.commands.run("touch started; sleep 984", background=True, timeout=600)
    wait_started(lambda: sbx.files.exists("started"))
say("ready")
sys.stdin.read()
"""

CASES = ["idle", "session", "exec", "stream", "upload", "execute", "envd", "queued"]


@pytest.fixture
def server(tmp_path: Path, database_url: str) -> Iterator[tuple[str, str, Service]]:
    store = TokenStore(tmp_path / "tokens.json")
    store.create_tenant(Tenant("solo", max_sandboxes=1, default_wait=60, max_wait=120))
    ceiling = Ceiling(max_sandboxes=4, max_memory=64 << 20, max_timeout=600.0, backends=("docker",))
    _, secret = store.create("solo", ceiling, tenant="solo")
    settings = ServerSettings(
        tokens=store,
        backends={"docker": "docker"},
        image=base_image(),
        database=database_url,
        session_grace=GRACE,
        reap_interval=0.5,
    )
    app = create_app(settings)
    with serve_in_thread(app) as url:
        yield url, secret, app.state.service


def _client(case: str, url: str, secret: str) -> subprocess.Popen[str]:
    python, env = sys.executable, dict(os.environ)
    if case in ("execute", "envd"):
        from e2b.sdks import MATRIX, NEWEST, sdk_venv, unsupported_reason  # tests/e2b

        reason = unsupported_reason()
        if reason:
            pytest.skip(reason)
        from agentnest.server.e2b import e2b_key

        python = str(sdk_venv(NEWEST, MATRIX[NEWEST]))
        env = {
            k: v
            for k, v in env.items()
            if not k.startswith("E2B_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
        }
        env.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=e2b_key(secret), NO_PROXY="127.0.0.1")
    return subprocess.Popen(
        [python, "-c", CLIENT, url, secret, case, str(IDLE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _line(client: subprocess.Popen[str], first: str) -> list[str]:
    assert client.stdout is not None
    words = client.stdout.readline().split()
    assert words and words[0] == first, (
        f"the client said {words} (expected {first!r}); it exited {client.poll()}"
    )
    return words


def _container(docker_client: Any, sandbox: str) -> Any:
    found = docker_client.containers.list(filters={"label": f"agentnest.sandbox={sandbox}"})
    return found[0] if found else None


def _running(docker_client: Any, sandbox: str, commands: tuple[str, ...]) -> set[str]:
    """Which of ``commands`` run in the sandbox now (``docker top``: the lease is not touched)."""
    container = _container(docker_client, sandbox)
    if container is None:
        return set()
    import docker.errors

    try:
        rows = container.top(ps_args="-eo pid,args")["Processes"] or []
    except docker.errors.APIError:  # stopped or removed meanwhile: nothing runs in it
        return set()
    lines = [row[-1] for row in rows]
    return {c for c in commands if any(line.startswith(c) for line in lines)}


@pytest.mark.parametrize("case", CASES)
def test_a_killed_client_leaves_no_sandbox_and_no_quota(
    case: str, server: tuple[str, str, Service], docker_client: Any, database_url: str
) -> None:
    url, secret, service = server
    lease = GRACE if case == "session" else IDLE
    tree = KERNEL_SLEEP if case == "execute" else TREE
    commands = (tree,) if isinstance(tree, str) else tree
    blocker = None
    if case == "queued":
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=120) as http:
            made = http.post("/v1/sandboxes", json={"memory": "64m"})
            assert made.status_code == 201, made.text
            blocker = made.json()["id"]
    with _client(case, url, secret) as client:
        try:
            sandbox = _line(client, "sandbox")[1]
            _line(client, "ready")
            if case == "queued":
                wait_until(
                    lambda: service.admission.queued == 1, "the client's create being queued", within=30
                )
            else:
                entry = service.entries[sandbox]
                if case in ("session", "upload", "envd"):
                    wait_until(
                        lambda: entry.lease.holders == 1, f"the client's {case} holding the lease", within=30
                    )
                if case in ("exec", "stream", "execute"):
                    wait_until(
                        lambda: _running(docker_client, sandbox, commands) == set(commands),
                        "the client's command running in the sandbox",
                        within=30,
                    )
                    assert entry.lease.holders == 1, "a running request holds the lease"
        finally:
            client.kill()  # SIGKILL: no goodbye; its sockets close
            client.wait(30)
    killed = time.monotonic()
    timings: dict[str, float] = {}

    if case == "queued":
        wait_until(
            lambda: service.admission.queued == 0, "the killed client's create leaving the queue", within=30
        )
        timings["dropped"] = time.monotonic() - killed
        assert service.admission.holdings("solo").sandboxes == 1, "only the test's own sandbox is held"
        assert list(service.entries) == [blocker]
        assert timings["dropped"] <= SLACK
    else:
        if case in ("exec", "stream", "execute"):
            wait_until(
                lambda: not _running(docker_client, sandbox, commands),
                "the killed client's command tree being killed",
                within=lease + SLACK,
            )
            timings["tree killed"] = time.monotonic() - killed
            # Killed by the cancelled request, not by the sandbox's end.
            assert sandbox in service.entries, "the command's tree was killed before the sandbox was reaped"
            assert timings["tree killed"] < lease
        wait_until(
            lambda: sandbox not in service.entries and service.admission.holdings("solo").sandboxes == 0,
            "the killed client's sandbox being reaped and its quota freed",
            within=lease + SLACK + 30,
        )
        timings["quota free"] = time.monotonic() - killed
        wait_until(
            lambda: _container(docker_client, sandbox) is None,
            "the killed client's container being removed",
            within=30,
        )
        timings["container gone"] = time.monotonic() - killed
        assert timings["quota free"] <= lease + SLACK and timings["container gone"] <= lease + SLACK, timings
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=120) as http:
            again = http.post("/v1/sandboxes", json={"memory": "64m", "max_wait": 0})
            assert again.status_code == 201, "the tenant's one slot is free again: " + again.text
    dialect = database_url.split(":", 1)[0]
    said = ", ".join(f"{what} {seconds:.2f} s" for what, seconds in timings.items())
    print(f"\n[disconnect] {case} ({dialect}, lease {lease:g} s): after the SIGKILL: {said}")
