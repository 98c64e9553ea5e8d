"""Warm pools in ``agentnest serve``: kept warm, claimed through admission, refilled, drained
policies, and bad pool specs.  In process over local agent processes (no engine)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fakes import IMAGE, LocalBackend, auth, make_settings

from agentnest.errors import ConfigurationError
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling
from agentnest.server.pools import PoolSpec, load_pools
from agentnest.server.service import Service
from agentnest.server.tenants import Tenant

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


POOLS = (
    PoolSpec("py", memory=128 << 20, min=2, max=3, refill_rate=50.0),
    PoolSpec("strict", memory=128 << 20, min=0, max=1, refill_rate=50.0, when_drained="fail"),
    PoolSpec("huge", memory=4 << 30, min=0, max=1),
)


@pytest.fixture
def settings(tmp_path: Path, backend: LocalBackend) -> ServerSettings:
    s = make_settings(
        tmp_path, backend, max_sandboxes=8, capacity_memory=16 << 30, capacity_cpus=16.0, pools=POOLS
    )
    s.tokens.create_tenant(Tenant("team-a", max_sandboxes=2, rate=100.0, burst=100))
    return s


@pytest.fixture
async def app_client(
    settings: ServerSettings, backend: LocalBackend
) -> AsyncIterator[tuple[Service, httpx.AsyncClient, dict[str, str]]]:
    _, secret = settings.tokens.create("a1", Ceiling(images=(IMAGE,), max_sandboxes=8), tenant="team-a")
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as c:
            yield app.state.service, c, auth(secret)
    assert backend.live_agents() == 0, "shutdown destroyed warm and claimed sandboxes alike"


async def until(predicate: Any, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {within}s"
        await asyncio.sleep(0.02)


async def test_a_pool_keeps_its_minimum_warm_and_a_claim_takes_one_and_is_refilled(
    app_client: tuple[Service, httpx.AsyncClient, dict[str, str]],
) -> None:
    service, client, a = app_client
    pool = service.pools["py"]
    await until(lambda: len(pool.ready) == 2, "the pool warming its minimum")
    warm_ids = {w.sandbox.id for w in pool.ready}
    assert service.admission.holdings("pool:py").sandboxes == 2
    made = await client.post("/v1/sandboxes", json={"pool": "py", "timeout": 30}, headers=a)
    assert made.status_code == 201, made.text
    claimed = made.json()
    assert claimed["id"] in warm_ids, "the claim is one of the warm sandboxes"
    assert claimed["deadline"] <= time.time() + 31, "the claim's own timeout, not the warm lifetime"
    assert service.admission.holdings("team-a").sandboxes == 1
    ran = await client.post(f"/v1/sandboxes/{claimed['id']}/exec", json={"shell": "echo warm"}, headers=a)
    assert ran.json()["stdout"] == "warm\n"
    await until(lambda: len(pool.ready) == 2, "the pool refilling to its minimum")
    assert claimed["id"] not in {w.sandbox.id for w in pool.ready}, "a claimed sandbox is never lent again"
    extended = await client.post(f"/v1/sandboxes/{claimed['id']}/extend", json={"seconds": 60}, headers=a)
    assert extended.status_code == 200 and extended.json()["deadline"] > claimed["deadline"] + 59
    info = (await client.get("/v1/info", headers=a)).json()
    assert [p["name"] for p in info["pools"]] == ["huge", "py", "strict"]


async def test_a_claim_counts_against_the_tenant_and_waits_its_turn(
    app_client: tuple[Service, httpx.AsyncClient, dict[str, str]],
) -> None:
    service, client, a = app_client
    pool = service.pools["py"]
    await until(lambda: len(pool.ready) == 2, "the pool warming")
    for _ in range(2):
        assert (await client.post("/v1/sandboxes", json={"pool": "py"}, headers=a)).status_code == 201
    refused = await client.post("/v1/sandboxes", json={"pool": "py", "max_wait": 0}, headers=a)
    assert refused.status_code == 429 and refused.json()["code"] == "tenant_cap"
    await until(lambda: len(pool.ready) == 2, "the pool refilling")
    assert len(pool.ready) == 2, "the refused claim's warm sandbox went back to the pool"


async def test_drained_pools_fail_start_cold_or_wait_as_asked(
    app_client: tuple[Service, httpx.AsyncClient, dict[str, str]],
) -> None:
    service, client, a = app_client
    empty = await client.post("/v1/sandboxes", json={"pool": "strict"}, headers=a)
    assert empty.status_code == 429 and empty.json()["code"] == "pool_empty"
    assert int(empty.headers["retry-after"]) >= 1
    cold = await client.post("/v1/sandboxes", json={"pool": "strict", "when_drained": "cold"}, headers=a)
    assert cold.status_code == 201 and cold.json()["memory"] == 128 << 20
    await client.delete(f"/v1/sandboxes/{cold.json()['id']}", headers=a)
    # "wait": the pool (min 0) starts one for the waiting claim.
    waited = await client.post(
        "/v1/sandboxes", json={"pool": "strict", "when_drained": "wait", "max_wait": 20}, headers=a
    )
    assert waited.status_code == 201, waited.text
    assert service.pools["strict"].claimed == 1
    assert service.metrics is not None
    text = service.metrics.render().decode()
    for outcome in ("warm", "cold", "empty"):
        assert f'agentnest_pool_claims_total{{outcome="{outcome}",pool="strict"}} 1.0' in text
    assert 'agentnest_pool_sandboxes{pool="py",state="ready"}' in text


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"pool": "nope"}, 400, "no pool 'nope'"),
        ({"pool": "py", "memory": "1g"}, 400, "drop ['memory']"),
        ({"pool": "py", "environment": {"A": "1"}, "image": IMAGE}, 400, "drop ['environment', 'image']"),
        ({"pool": "huge"}, 403, "beyond this token's ceiling: memory"),
    ],
)
async def test_bad_claims_are_refused_naming_the_problem(
    app_client: tuple[Service, httpx.AsyncClient, dict[str, str]],
    body: dict[str, Any],
    status: int,
    needle: str,
) -> None:
    _, client, a = app_client
    refused = await client.post("/v1/sandboxes", json=body, headers=a)
    assert refused.status_code == status and needle in refused.json()["detail"]


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ("{", "not valid JSON"),
        ('{"pool": []}', 'expected {"pools": [ ... ]}'),
        ('{"pools": [{"name": "a", "size": 3}]}', "unknown fields ['size']"),
        ('{"pools": [{"name": "a", "min": 5, "max": 2}]}', "min <= max"),
        ('{"pools": [{"name": "a", "when_drained": "later"}]}', "when_drained='later'"),
        ('{"pools": [{"name": "A"}]}', "lowercase"),
        ('{"pools": [{"name": "a"}, {"name": "a"}]}', "unique"),
        ('{"pools": [{"name": "a", "memory": "lots"}]}', "memory"),
    ],
)
def test_a_malformed_pools_file_is_a_clear_error(tmp_path: Path, doc: str, needle: str) -> None:
    path = tmp_path / "pools.json"
    path.write_text(doc)
    with pytest.raises(ConfigurationError) as refused:
        load_pools(path)
    assert needle in str(refused.value)


def test_a_pools_file_loads_json_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps({"pools": [{"name": "py", "memory": "512m", "min": 1}]}))
    (tmp_path / "p.yaml").write_text("pools:\n  - name: py\n    max: 6\n")
    assert load_pools(tmp_path / "p.json")[0].memory == 512 << 20
    assert load_pools(tmp_path / "p.yaml")[0].max == 6
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_pools(tmp_path / "missing.json")
