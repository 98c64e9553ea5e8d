"""Tenants and fair admission through the HTTP API (in process, over local agent processes).

The admission logic itself is tested in test_admission.py; here: what a client
sees (status, code, Retry-After, the queued stream), the tenant API and its
authorization, and that a client that goes away leaves the queue.  No engine.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fakes import IMAGE, LocalBackend, auth, make_settings

from agentnest.errors import AdmissionRefusedError
from agentnest.server import schemas
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling
from agentnest.server.refused import Refused
from agentnest.server.service import Service
from agentnest.server.tenants import Tenant
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalBackend]:
    b = LocalBackend(tmp_path / "sandboxes")
    b.root.mkdir()
    yield b
    b.kill_all()


@pytest.fixture
def settings(tmp_path: Path, backend: LocalBackend) -> ServerSettings:
    s = make_settings(tmp_path, backend, max_sandboxes=3, capacity_memory=4 << 30, capacity_cpus=8.0)
    s.tokens.create_tenant(Tenant("team-a", max_sandboxes=1, rate=100.0, burst=100))
    s.tokens.create_tenant(Tenant("team-b", weight=2.0, rate=100.0, burst=100, priority="normal"))
    return s


def token(
    settings: ServerSettings, name: str, tenant: str = "default", admin: bool = False
) -> dict[str, str]:
    ceiling = Ceiling(images=(IMAGE,), max_sandboxes=8)
    _, secret = settings.tokens.create(name, ceiling, tenant=tenant, admin=admin)
    return auth(secret)


@pytest.fixture
async def app_client(
    settings: ServerSettings, backend: LocalBackend
) -> AsyncIterator[tuple[Service, httpx.AsyncClient]]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as c:
            yield app.state.service, c
    assert backend.live_agents() == 0


async def test_a_tenant_at_its_cap_gets_429_tenant_cap_with_retry_after_and_the_client_error_keeps_both(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient]
) -> None:
    _, client = app_client
    a = token(settings, "a1", "team-a")
    assert (await client.post("/v1/sandboxes", json={}, headers=a)).status_code == 201
    refused = await client.post("/v1/sandboxes", json={"max_wait": 0}, headers=a)
    assert refused.status_code == 429
    assert refused.json()["code"] == "tenant_cap" and "caps" in refused.json()["detail"]
    assert int(refused.headers["retry-after"]) >= 1
    rebuilt = schemas.rebuild_error(refused.json()["code"], refused.json()["detail"], 3.0)
    assert isinstance(rebuilt, AdmissionRefusedError) and rebuilt.reason == "tenant_cap"
    assert rebuilt.retry_after == 3.0


async def test_a_queued_create_is_admitted_when_its_tenant_frees_a_sandbox(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient]
) -> None:
    service, client = app_client
    a = token(settings, "a1", "team-a")
    first = (await client.post("/v1/sandboxes", json={}, headers=a)).json()
    waiting = asyncio.create_task(client.post("/v1/sandboxes", json={"max_wait": 20}, headers=a))
    while service.admission.queued == 0:  # the signal: it is in the queue
        await asyncio.sleep(0.01)
    assert not waiting.done()
    assert (await client.delete(f"/v1/sandboxes/{first['id']}", headers=a)).status_code == 200
    second = await waiting
    assert second.status_code == 201, second.text
    assert service.admission.holdings("team-a").sandboxes == 1


async def test_the_server_s_capacity_is_shared_and_a_full_server_answers_capacity(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient]
) -> None:
    _, client = app_client
    b = token(settings, "b1", "team-b")
    for _ in range(3):
        assert (await client.post("/v1/sandboxes", json={}, headers=b)).status_code == 201
    refused = await client.post("/v1/sandboxes", json={"max_wait": 0.2}, headers=token(settings, "d1"))
    assert refused.status_code == 429 and refused.json()["code"] == "capacity"
    assert "max_wait=0.2s" in refused.json()["detail"] and "retry-after" in refused.headers


async def test_the_event_stream_ends_with_an_error_event_carrying_the_reason(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient]
) -> None:
    _, client = app_client
    a = token(settings, "a1", "team-a")
    await client.post("/v1/sandboxes", json={}, headers=a)
    headers = {**a, "Accept": "text/event-stream"}
    response = await client.post("/v1/sandboxes", json={"max_wait": 0.1}, headers=headers)
    last = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")][-1]
    assert last["code"] == "tenant_cap" and last["status"] == 429 and last["retry_after"] >= 1


async def test_a_client_gone_while_queued_leaves_the_queue_at_once(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient]
) -> None:
    service, client = app_client
    a = token(settings, "a1", "team-a")
    await client.post("/v1/sandboxes", json={}, headers=a)
    tok = settings.tokens.list()[-1]
    gone = asyncio.Event()
    create = asyncio.create_task(
        service.create(tok, schemas.CreateSandbox(max_wait=30), client_gone=gone.wait)
    )
    while service.admission.queued == 0:
        await asyncio.sleep(0.01)
    gone.set()
    with pytest.raises(Refused) as refused:
        await create
    assert refused.value.code == "client_gone" and service.admission.queued == 0
    assert service.admission.holdings("team-a").sandboxes == 1


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"max_wait": 400}, "beyond tenant 'team-a''s ceiling of 300s"),
        ({"priority": "high"}, "above tenant 'team-a''s band 'normal'"),
        ({"timeout": 90000}, "max_timeout"),
    ],
)
async def test_asking_beyond_the_tenant_is_a_403_naming_the_limit(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient], body: dict[str, Any], needle: str
) -> None:
    _, client = app_client
    refused = await client.post("/v1/sandboxes", json=body, headers=token(settings, "a1", "team-a"))
    assert refused.status_code == 403 and refused.json()["code"] == "policy_denied"
    assert needle in refused.json()["detail"]


async def test_tenants_are_managed_by_admin_tokens_and_read_by_their_own(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient]
) -> None:
    service, client = app_client
    root = token(settings, "root", admin=True)
    a = token(settings, "a1", "team-a")
    assert (await client.post("/v1/tenants", json={"name": "team-c"}, headers=a)).status_code == 403
    made = await client.post(
        "/v1/tenants", json={"name": "team-c", "weight": 3, "max_memory": "2g"}, headers=root
    )
    assert made.status_code == 201 and made.json()["settings"]["max_memory"] == 2 << 30
    dup = await client.post("/v1/tenants", json={"name": "team-c"}, headers=root)
    assert dup.status_code == 400 and "exists" in dup.json()["detail"]
    bad = await client.post("/v1/tenants", json={"name": "Team C"}, headers=root)
    assert bad.status_code == 400 and "lowercase" in bad.json()["detail"]
    assert [t["name"] for t in (await client.get("/v1/tenants", headers=a)).json()["tenants"]] == ["team-a"]
    assert (await client.get("/v1/tenants/team-b", headers=a)).status_code == 404
    everyone = [t["name"] for t in (await client.get("/v1/tenants", headers=root)).json()["tenants"]]
    assert everyone == ["default", "team-a", "team-b", "team-c"]
    # Raising a cap admits a queued request at once.
    await client.post("/v1/sandboxes", json={}, headers=a)
    waiting = asyncio.create_task(client.post("/v1/sandboxes", json={"max_wait": 20}, headers=a))
    while service.admission.queued == 0:
        await asyncio.sleep(0.01)
    raised = await client.patch("/v1/tenants/team-a", json={"max_sandboxes": 2}, headers=root)
    assert raised.status_code == 200 and raised.json()["settings"]["max_sandboxes"] == 2
    assert (await waiting).status_code == 201
    held = (await client.get("/v1/tenants/team-a", headers=a)).json()
    assert held["held_sandboxes"] == 2 and held["queued"] == 0
    in_use = await client.delete("/v1/tenants/team-a", headers=root)
    assert in_use.status_code == 400 and "still has tokens" in in_use.json()["detail"]
    assert (await client.delete("/v1/tenants/team-c", headers=root)).status_code == 200
    assert (await client.get("/v1/tenants/team-c", headers=root)).status_code == 404


async def test_info_names_the_token_s_tenant(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient]
) -> None:
    _, client = app_client
    assert (await client.get("/v1/info", headers=token(settings, "a1", "team-a"))).json()[
        "tenant"
    ] == "team-a"


def test_a_token_needs_an_existing_tenant(settings: ServerSettings) -> None:
    from agentnest.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="agentnest serve tenant create team-x"):
        settings.tokens.create("x", tenant="team-x")


# -- over real HTTP (uvicorn on loopback): streaming and disconnects ---------------------------


@pytest.fixture
def live(settings: ServerSettings, backend: LocalBackend) -> Iterator[tuple[str, Service]]:
    app = create_app(settings)
    with serve_in_thread(app) as url:
        yield url, app.state.service
    assert backend.live_agents() == 0


def test_the_event_stream_shows_the_queue_position_then_the_sandbox(
    settings: ServerSettings, live: tuple[str, Service]
) -> None:
    url, service = live
    a = token(settings, "a1", "team-a")
    with httpx.Client(base_url=url, headers=a, timeout=30) as client:
        first = client.post("/v1/sandboxes", json={}).json()
        events: list[tuple[str, dict[str, Any]]] = []
        headers = {"Accept": "text/event-stream"}
        with client.stream("POST", "/v1/sandboxes", json={"max_wait": 20}, headers=headers) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            name = ""
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
                    if len(events) == 1:  # queued: now free the tenant's one sandbox
                        assert client.delete(f"/v1/sandboxes/{first['id']}").status_code == 200
    name, queued = events[0]
    assert name == "queued" and queued["position"] == 1 and queued["blocked_by"] == "tenant_cap"
    assert queued["ahead_same_tenant"] == 0 and queued["queued"] == 1
    assert events[-1][0] == "created" and events[-1][1]["image"] == IMAGE
    assert service.admission.holdings("team-a").sandboxes == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "event-stream"])
def test_a_client_that_hangs_up_while_queued_leaves_the_queue_at_once(
    settings: ServerSettings, live: tuple[str, Service], stream: bool
) -> None:
    url, service = live
    a = token(settings, "a1", "team-a")
    with httpx.Client(base_url=url, headers=a, timeout=30) as client:
        assert client.post("/v1/sandboxes", json={}).status_code == 201
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"max_wait": 60}).encode()
    accept = "text/event-stream" if stream else "application/json"
    request = (
        f"POST /v1/sandboxes HTTP/1.1\r\nHost: {host}\r\nAuthorization: {a['Authorization']}\r\n"
        f"Accept: {accept}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        wait_until(lambda: service.admission.queued == 1, "the create being queued", within=10)
    # The socket is closed: the request leaves the queue long before its max_wait of 60 s.
    wait_until(lambda: service.admission.queued == 0, "the queue entry being dropped", within=10)
    assert service.admission.holdings("team-a").sandboxes == 1


def test_the_remote_backend_raises_admission_refused_with_reason_and_retry_after(
    settings: ServerSettings, live: tuple[str, Service]
) -> None:
    from agentnest import Sandbox
    from agentnest.runtime.remote import RemoteBackend

    url, _ = live
    secret = token(settings, "a1", "team-a")["Authorization"].removeprefix("Bearer ")
    remote = RemoteBackend(url, secret, max_wait=0)
    try:
        with Sandbox(IMAGE, timeout=60, backend=remote), pytest.raises(AdmissionRefusedError) as refused:
            Sandbox(IMAGE, timeout=60, backend=remote)
    finally:
        remote.close()
    assert refused.value.reason == "tenant_cap" and refused.value.retry_after is not None
    assert refused.value.retry_after >= 1


# -- metrics and probes ------------------------------------------------------------------------


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


async def test_metrics_count_decisions_and_show_holdings_for_admin_tokens_only(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient]
) -> None:
    _, client = app_client
    root = token(settings, "root", admin=True)
    a = token(settings, "a1", "team-a")
    assert (await client.get("/metrics", headers=a)).status_code == 403
    assert (await client.get("/metrics")).status_code == 401
    assert (await client.post("/v1/sandboxes", json={}, headers=a)).status_code == 201
    assert (await client.post("/v1/sandboxes", json={"max_wait": 0}, headers=a)).status_code == 429
    scraped = await client.get("/metrics", headers=root)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    got = _samples(scraped.text)
    assert got[("agentnest_sandboxes", frozenset({("tenant", "team-a"), ("state", "running")}))] == 1
    assert got[("agentnest_sandboxes", frozenset({("tenant", "team-a"), ("state", "queued")}))] == 0
    granted = {("tenant", "team-a"), ("outcome", "granted"), ("reason", "")}
    rejected = {("tenant", "team-a"), ("outcome", "rejected"), ("reason", "tenant_cap")}
    assert got[("agentnest_admissions_total", frozenset(granted))] == 1
    assert got[("agentnest_admissions_total", frozenset(rejected))] == 1
    assert got[("agentnest_queue_wait_seconds_count", frozenset({("tenant", "team-a")}))] == 2
    assert (
        got[("agentnest_sandbox_create_seconds_count", frozenset({("backend", "local"), ("launch", "cold")}))]
        == 1
    )
    assert got[("agentnest_capacity", frozenset({("resource", "sandboxes")}))] == 3
    assert got[("agentnest_tenant_memory_bytes", frozenset({("tenant", "team-a")}))] > 0


async def test_liveness_and_readiness_need_no_token_and_readiness_names_what_failed(
    settings: ServerSettings, app_client: tuple[Service, httpx.AsyncClient], backend: LocalBackend
) -> None:
    from agentnest.errors import RuntimeNotAvailableError

    _, client = app_client
    assert (await client.get("/healthz")).json()["status"] == "ok"
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"tokens": "ok", "backend:local": "ok"}

    def down() -> None:
        raise RuntimeNotAvailableError("the engine is not running (test)")

    backend.ping = down  # type: ignore[method-assign]
    settings.tokens.path.write_text("not json")
    not_ready = await client.get("/readyz")
    assert not_ready.status_code == 503 and not_ready.json()["status"] == "not ready"
    checks = not_ready.json()["checks"]
    assert "not a token file" in checks["tokens"] and "engine is not running" in checks["backend:local"]
