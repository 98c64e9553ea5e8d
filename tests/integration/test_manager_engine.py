"""The manager on the real engine, over real HTTP on loopback: fair admission between tenants.

A fairness load test (bounded: about 30 s): three tenants with weights 1:1:2 keep
more creates in flight than the server has room for, one of them ten times its
share; what each holds over the run matches its weight within 10 %, no polite
request waits past its max_wait, and every rejection carries Retry-After.
Plus: a queued create on runc and runsc is admitted when room frees, and the
server's capacity is the engine's (docker info), not a guess.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentnest.runtime.docker import base_image
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling, TokenStore
from agentnest.server.service import Service
from agentnest.server.service_admit import UNBOUNDED_CPUS
from agentnest.server.tenants import Tenant
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

CAPACITY = 8
WEIGHTS = {"small-a": 1.0, "small-b": 1.0, "double": 2.0}
#: Clients per tenant, each creating, using and deleting sandboxes in a loop: "small-a" asks for ten
#: times its share of 2; the others keep a few more than their share in flight, so that they stay
#: backlogged while a deleted sandbox of theirs is being removed.
IN_FLIGHT = {"small-a": 20, "small-b": 4, "double": 8}
WARM_UP = 12.0
MEASURE = 20.0


def _server(root: Path, backends: dict[str, str], **settings: Any) -> tuple[ServerSettings, dict[str, str]]:
    store = TokenStore(root / "tokens.json")
    secrets = {}
    for name, weight in WEIGHTS.items():
        store.create_tenant(
            Tenant(name, weight=weight, rate=100.0, burst=100, max_queued=32, default_wait=60, max_wait=120)
        )
        ceiling = Ceiling(max_sandboxes=32, max_memory=64 << 20, max_timeout=300.0, backends=tuple(backends))
        secrets[name] = store.create(name, ceiling, tenant=name)[1]
    return ServerSettings(tokens=store, backends=backends, image=base_image(), **settings), secrets


@pytest.fixture
def engine_backends(backend_name: str) -> dict[str, str]:
    return {backend_name: backend_name}


def test_a_queued_create_is_admitted_when_room_frees_and_capacity_is_the_engine_s(
    tmp_path: Path, engine_backends: dict[str, str], docker_client: Any
) -> None:
    settings, secrets = _server(tmp_path, engine_backends, max_sandboxes=1)
    app = create_app(settings)
    service: Service = app.state.service
    with serve_in_thread(app) as url:
        a = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secrets['small-a']}"}, timeout=120)
        b = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secrets['double']}"}, timeout=120)
        with a, b:
            first = a.post("/v1/sandboxes", json={"memory": "64m"})
            assert first.status_code == 201, first.text
            info = docker_client.info()
            capacity = service.admission.capacity
            # Memory is the host's; CPU limits are ceilings on a shared resource, not a capacity.
            assert capacity.memory == info["MemTotal"] and capacity.cpus == UNBOUNDED_CPUS
            refused = b.post("/v1/sandboxes", json={"memory": "64m", "max_wait": 0})
            assert refused.status_code == 429 and refused.json()["code"] == "capacity"
            assert int(refused.headers["retry-after"]) >= 1
            result: dict[str, httpx.Response] = {}
            waiter = threading.Thread(
                target=lambda: result.setdefault("r", b.post("/v1/sandboxes", json={"memory": "64m"}))
            )
            waiter.start()
            wait_until(lambda: service.admission.queued == 1, "the second create being queued", within=30)
            assert a.delete(f"/v1/sandboxes/{first.json()['id']}").status_code == 200
            waiter.join(120)
            second = result["r"]
            assert second.status_code == 201, second.text
            ran = b.post(f"/v1/sandboxes/{second.json()['id']}/exec", json={"shell": "echo admitted"})
            assert ran.json()["stdout"] == "admitted\n"
            assert service.admission.holdings("double").sandboxes == 1
            assert service.admission.holdings("small-a").sandboxes == 0
    assert not service.entries


@pytest.mark.parametrize("backend_name", [pytest.param("docker", id="runc")])
def test_shares_follow_the_weights_under_load_and_every_rejection_says_when_to_retry(
    tmp_path: Path, engine_backends: dict[str, str]
) -> None:
    settings, secrets = _server(tmp_path, engine_backends, max_sandboxes=CAPACITY)
    app = create_app(settings)
    service: Service = app.state.service
    stop = threading.Event()
    outcomes: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in WEIGHTS}
    late: list[tuple[str, float]] = []
    no_retry_after: list[str] = []
    lock = threading.Lock()

    def client(url: str, tenant: str) -> None:
        headers = {"Authorization": f"Bearer {secrets[tenant]}"}
        # small-a is impatient (5 s) so its surplus is refused; the polite tenants wait up to 60 s.
        max_wait = 5.0 if tenant == "small-a" else 60.0
        with httpx.Client(base_url=url, headers=headers, timeout=180) as http:
            while not stop.is_set():
                started = time.monotonic()
                made = http.post(
                    "/v1/sandboxes", json={"memory": "64m", "timeout": 120, "max_wait": max_wait}
                )
                waited = time.monotonic() - started
                with lock:
                    if made.status_code == 201:
                        outcomes[tenant]["granted"] += 1
                    else:
                        outcomes[tenant][made.json().get("code", str(made.status_code))] += 1
                        if made.status_code == 429 and "retry-after" not in made.headers:
                            no_retry_after.append(made.text)
                    if tenant != "small-a" and made.status_code != 201:
                        late.append((tenant, waited))
                if made.status_code != 201:
                    stop.wait(float(made.headers.get("retry-after", "1")))
                    continue
                sandbox = made.json()["id"]
                http.post(f"/v1/sandboxes/{sandbox}/exec", json={"shell": "sleep 0.5"})
                http.delete(f"/v1/sandboxes/{sandbox}")

    held: dict[str, float] = dict.fromkeys(WEIGHTS, 0.0)
    with serve_in_thread(app) as url:
        threads = [
            threading.Thread(target=client, args=(url, tenant), daemon=True)
            for i in range(max(IN_FLIGHT.values()))
            for tenant in WEIGHTS
            if i < IN_FLIGHT[tenant]
        ]
        for thread in threads:
            thread.start()
        try:
            start = time.monotonic()
            # Holdings are sampled (the sampling paces the integral; it signals nothing).
            last = None
            while (now := time.monotonic()) < start + WARM_UP + MEASURE:
                if now >= start + WARM_UP:
                    if last is not None:
                        for name in WEIGHTS:
                            held[name] += service.admission.holdings(name).sandboxes * (now - last)
                    last = now
                time.sleep(0.05)
        finally:
            stop.set()
            for thread in threads:
                thread.join(120)
    assert not service.entries, "the server's end destroyed every sandbox"
    total = sum(held.values())
    shares = {name: held[name] / total for name in WEIGHTS}
    fair = {name: w / sum(WEIGHTS.values()) for name, w in WEIGHTS.items()}
    normalised = [shares[n] / WEIGHTS[n] for n in WEIGHTS]
    jain = sum(normalised) ** 2 / (len(normalised) * sum(x * x for x in normalised))
    print(f"\nshares {shares} (fair {fair}); Jain's index {jain:.4f}; outcomes {dict(outcomes)}")
    for name in WEIGHTS:
        assert abs(shares[name] - fair[name]) <= 0.10 * fair[name], (name, shares, fair)
    assert not late, f"polite requests refused: {late}"
    assert not no_retry_after, no_retry_after
    assert (
        outcomes["small-a"]["granted"] > 0
        and sum(outcomes["small-a"].values()) > outcomes["small-a"]["granted"]
    )
    assert all(outcomes[n]["granted"] > 0 for n in WEIGHTS)
    assert service.admission.held.sandboxes == 0 and service.admission.queued == 0


#: Tries a TCP connection and prints the error's name (a pool sandbox has no network).
CONNECT_PROBE = """
import socket
try:
    socket.create_connection(("127.0.0.1", 9), 2)
except OSError as exc:
    print(type(exc).__name__)
"""

#: A client that takes a session-lease sandbox through the remote backend and then waits to die.
CLIENT = """
import sys
from agentnest import Sandbox
from agentnest.runtime.remote import RemoteBackend
url, secret, backend, image = sys.argv[1:5]
remote = RemoteBackend(url, secret, backend=backend, lease="session")
sandbox = Sandbox(image, timeout=300, memory="64m", backend=remote)
assert sandbox.exec_shell("echo up").stdout == "up\\n"
print(sandbox.id, flush=True)
sys.stdin.read()
"""


def test_a_crashed_client_s_session_sandbox_is_reaped_within_the_grace_and_its_quota_is_free(
    tmp_path: Path, engine_backends: dict[str, str], backend_name: str, docker_client: Any
) -> None:
    grace = 2.0
    store = TokenStore(tmp_path / "tokens.json")
    store.create_tenant(Tenant("solo", max_sandboxes=1))
    ceiling = Ceiling(max_sandboxes=4, max_memory=64 << 20, max_timeout=300.0, backends=(backend_name,))
    _, secret = store.create("solo", ceiling, tenant="solo")
    settings = ServerSettings(
        tokens=store, backends=engine_backends, image=base_image(), session_grace=grace, reap_interval=0.5
    )
    app = create_app(settings)
    service: Service = app.state.service
    with serve_in_thread(app) as url:
        with subprocess.Popen(
            [sys.executable, "-c", CLIENT, url, secret, backend_name, base_image()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as client:
            try:
                assert client.stdout is not None
                sandbox = client.stdout.readline().strip()
                assert sandbox in service.entries, "the client's sandbox is live"
                assert service.admission.holdings("solo").sandboxes == 1
            finally:
                client.kill()  # SIGKILL: no destroy, no goodbye; its agent channel's socket closes
                client.wait(30)
        killed = time.monotonic()
        label = {"label": f"agentnest.sandbox={sandbox}"}
        wait_until(
            lambda: (
                sandbox not in service.entries and not docker_client.api.containers(all=True, filters=label)
            ),
            "the crashed client's sandbox being reaped and its container removed",
            within=30,
        )
        reaped = time.monotonic() - killed
        print(f"\nreaped and removed {reaped:.2f} s after the kill (grace {grace:g} s)")
        assert reaped <= grace + 5.0
        assert service.admission.holdings("solo").sandboxes == 0
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=120) as http:
            again = http.post("/v1/sandboxes", json={"memory": "64m", "max_wait": 0})
            assert again.status_code == 201, "the tenant's one slot is free again: " + again.text


def test_a_warm_pool_claim_on_the_engine_is_a_ready_sandbox_and_the_pool_refills(
    tmp_path: Path, engine_backends: dict[str, str], backend_name: str
) -> None:
    from agentnest.server.pools import PoolSpec

    pool = PoolSpec("py", backend=backend_name, memory=64 << 20, min=1, max=2, refill_rate=5.0)
    settings, secrets = _server(tmp_path, engine_backends, max_sandboxes=4, pools=(pool,))
    app = create_app(settings)
    service: Service = app.state.service
    warm = service.pools["py"]
    with serve_in_thread(app) as url:
        headers = {"Authorization": f"Bearer {secrets['double']}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
            wait_until(lambda: len(warm.ready) == 1, "the pool's first warm sandbox", within=120)
            ready_id = warm.ready[0].sandbox.id
            started = time.monotonic()
            made = http.post("/v1/sandboxes", json={"pool": "py", "timeout": 120})
            ran = http.post(f"/v1/sandboxes/{made.json()['id']}/exec", json={"shell": "echo warm; id -u"})
            took = time.monotonic() - started
            assert made.status_code == 201 and made.json()["id"] == ready_id
            assert ran.json()["stdout"].startswith("warm\n") and ran.json()["stdout"].split()[1] != "0"
            print(f"\nwarm claim + first command over HTTP: {took * 1e3:.1f} ms ({backend_name})")
            # The claimed sandbox has no network, as every pool sandbox.
            probe = http.post(f"/v1/sandboxes/{ready_id}/exec", json={"python": CONNECT_PROBE})
            assert probe.json()["stdout"].strip() in {"ConnectionRefusedError", "OSError", "PermissionError"}
            wait_until(lambda: len(warm.ready) == 1, "the pool refilling after the claim", within=120)
            assert warm.ready[0].sandbox.id != ready_id
            assert service.admission.holdings("double").sandboxes == 1
    assert not service.entries and not warm.ready


def test_a_real_sandbox_s_history_and_usage_land_in_the_postgresql_database(
    tmp_path: Path, engine_backends: dict[str, str], postgres_server: Any
) -> None:
    database = postgres_server.create_database(f"engine_{tmp_path.name[-20:].lower().replace('-', '_')}")
    settings, secrets = _server(tmp_path, engine_backends, database=database)
    _, admin = settings.tokens.create("ops", Ceiling(), admin=True)
    app = create_app(settings)
    with serve_in_thread(app) as url:
        http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {secrets['double']}"}, timeout=120
        )
        ops = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=120)
        with http, ops:
            made = http.post("/v1/sandboxes", json={"memory": "64m", "cpus": 0.5})
            assert made.status_code == 201, made.text
            sandbox = made.json()["id"]
            ran = http.post(f"/v1/sandboxes/{sandbox}/exec", json={"shell": "id -u; echo in-the-engine"})
            assert ran.json()["stdout"].endswith("in-the-engine\n")
            assert http.delete(f"/v1/sandboxes/{sandbox}").status_code == 200
            events = ops.get("/v1/audit", params={"sandbox": sandbox, "limit": 1000}).json()["events"]
            types = [e["type"] for e in events]
            assert types[0] == "sandbox.created" and types[-1] == "sandbox.destroyed"
            assert {e["tenant"] for e in events} == {"double"}
            started = next(e for e in events if e["type"] == "exec.started")
            assert "in-the-engine" in str(started["data"])
            (usage,) = ops.get("/v1/usage", params={"tenant": "double"}).json()["usage"]
            assert usage["creates"] == 1 and usage["sandbox_seconds"] > 0
            # Held memory is what the sandbox was given: 64 MiB for as long as it lived.
            assert usage["memory_gib_seconds"] == pytest.approx(usage["sandbox_seconds"] / 16, rel=1e-6)
            assert usage["cpu_seconds"] == pytest.approx(usage["sandbox_seconds"] * 0.5, rel=1e-6)


def test_a_sandbox_removed_behind_the_manager_s_back_is_ended_and_its_share_freed(
    tmp_path: Path, engine_backends: dict[str, str], database_url: str, docker_client: Any
) -> None:
    """The backend is the truth of what exists: a container removed with ``docker rm -f`` while
    the manager runs it is noticed, its row ends as ``gone`` and its tenant's share is free."""
    import sqlalchemy as sa

    from agentnest.runtime.docker import labels

    settings, secrets = _server(tmp_path, engine_backends, database=database_url, verify_interval=0.5)
    app = create_app(settings)
    service: Service = app.state.service
    with (
        serve_in_thread(app) as url,
        httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {secrets['double']}"}, timeout=120
        ) as http,
    ):
        made = http.post("/v1/sandboxes", json={"memory": "64m"})
        assert made.status_code == 201, made.text
        sandbox = made.json()["id"]
        kept = http.post("/v1/sandboxes", json={"memory": "64m"}).json()["id"]
        (container,) = docker_client.containers.list(filters={"label": f"{labels.SANDBOX}={sandbox}"})
        container.remove(force=True)
        wait_until(lambda: sandbox not in service.entries, "the removed sandbox being ended", within=30)
        assert service.admission.holdings("double").sandboxes == 1  # the other one's
        assert http.get(f"/v1/sandboxes/{sandbox}").status_code == 404
        assert http.post(f"/v1/sandboxes/{kept}/exec", json={"argv": ["true"]}).json()["exit_code"] == 0
        assert kept in service.entries  # a running sandbox is left alone
        recorder = service.recorder
        assert recorder is not None
        wait_until(lambda: recorder.queued == 0, "the end being written", within=30)
        engine = sa.create_engine(recorder.database.url)
        try:
            with engine.connect() as conn:
                reason = conn.execute(
                    sa.text("SELECT end_reason FROM sandboxes WHERE sandbox_id = :s"), {"s": sandbox}
                ).scalar()
        finally:
            engine.dispose()
        assert reason == "gone"
