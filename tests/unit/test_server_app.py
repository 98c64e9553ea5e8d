"""The HTTP API in process (httpx.ASGITransport) over local agent processes: auth, ceilings,
ownership, bad input.  No engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fakes import IMAGE, LocalBackend, add_token, auth, make_settings

from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling

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
    return make_settings(tmp_path, backend, max_body_bytes=64 * 1024, max_upload_bytes=256 * 1024)


@pytest.fixture
async def client(settings: ServerSettings, backend: LocalBackend) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield c
    # The lifespan's end destroyed every sandbox: no agent process is left.
    assert backend.live_agents() == 0


@pytest.fixture
def alice(settings: ServerSettings) -> dict[str, str]:
    return auth(add_token(settings, "alice", max_memory="256m", max_timeout=600.0))


@pytest.fixture
def bob(settings: ServerSettings) -> dict[str, str]:
    return auth(add_token(settings, "bob"))


async def create(client: httpx.AsyncClient, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/sandboxes", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return dict(response.json())


# -- auth -----------------------------------------------------------------------------


async def test_health_needs_no_token_and_everything_else_does(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/health")).json()["status"] == "ok"
    for method, path in (("GET", "/v1/info"), ("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes")):
        response = await client.request(method, path, json={})
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["code"] == "unauthorized"


@pytest.mark.parametrize(
    "header",
    [
        "Bearer nope",
        "Bearer ant_aaaaaaaaaaaa_" + "A" * 43,
        "Basic dXNlcjpwYXNz",
        "Bearer " + "x" * 5000,
    ],
)
async def test_unknown_tokens_are_refused(
    client: httpx.AsyncClient, alice: dict[str, str], header: str
) -> None:
    response = await client.get("/v1/sandboxes", headers={"Authorization": header})
    assert response.status_code == 401
    assert "Bearer" in response.headers["www-authenticate"]


async def test_a_wrong_secret_for_a_known_id_is_refused(
    client: httpx.AsyncClient, alice: dict[str, str]
) -> None:
    secret = alice["Authorization"].split()[1]
    forged = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    response = await client.get("/v1/info", headers=auth(forged))
    assert response.status_code == 401


async def test_expired_and_revoked_tokens_are_refused(
    client: httpx.AsyncClient, settings: ServerSettings
) -> None:
    token, secret = settings.tokens.create("short", Ceiling(), expires_in=3600)
    doc = json.loads(settings.tokens.path.read_text())
    for record in doc["tokens"]:
        if record["id"] == token.id:
            record["expires"] = record["created"] - 1  # as if an hour had passed
    settings.tokens.path.write_text(json.dumps(doc))
    response = await client.get("/v1/info", headers=auth(secret))
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    _, secret2 = settings.tokens.create("revoked", Ceiling())
    assert (await client.get("/v1/info", headers=auth(secret2))).status_code == 200
    settings.tokens.revoke("revoked")
    assert (await client.get("/v1/info", headers=auth(secret2))).status_code == 401


async def test_info_shows_the_token_its_own_ceiling(client: httpx.AsyncClient, alice: dict[str, str]) -> None:
    info = (await client.get("/v1/info", headers=alice)).json()
    assert info["token_name"] == "alice"
    assert info["ceiling"]["max_memory"] == 256 * 1024 * 1024
    assert [b["name"] for b in info["backends"]] == ["local"]
    assert "network.denied" in info["backends"][0]["capabilities"]


# -- sandboxes and ownership ----------------------------------------------------------


async def test_lifecycle_exec_files_sessions(client: httpx.AsyncClient, alice: dict[str, str]) -> None:
    made = await create(client, alice, timeout=60)
    sid = made["id"]
    assert made["image"] == IMAGE and made["running"] and made["memory"] == 256 * 1024 * 1024
    base = f"/v1/sandboxes/{sid}"
    result = (
        await client.post(f"{base}/exec", json={"shell": "echo out; echo err >&2; exit 3"}, headers=alice)
    ).json()
    assert (result["stdout"], result["stderr"], result["exit_code"], result["ok"]) == (
        "out\n",
        "err\n",
        3,
        False,
    )
    result = (
        await client.post(f"{base}/exec", json={"argv": ["cat"], "stdin": "piped"}, headers=alice)
    ).json()
    assert result["stdout"] == "piped"
    result = (await client.post(f"{base}/exec", json={"python": "print(6 * 7)"}, headers=alice)).json()
    assert result["stdout"] == "42\n"
    assert (await client.put(f"{base}/files/d/x.bin", content=b"\x00\x01", headers=alice)).status_code == 204
    assert (await client.get(f"{base}/files/d/x.bin", headers=alice)).content == b"\x00\x01"
    listing = (await client.get(f"{base}/files", params={"path": "d"}, headers=alice)).json()
    assert [(e["path"], e["type"], e["size"]) for e in listing["entries"]] == [("d/x.bin", "file", 2)]
    assert (await client.delete(f"{base}/files/d/x.bin", headers=alice)).status_code == 204
    missing = await client.get(f"{base}/files/d/x.bin", headers=alice)
    assert (missing.status_code, missing.json()["code"]) == (404, "file_not_found")
    outside = await client.get(f"{base}/files/../../etc/passwd", headers=alice)
    assert outside.status_code in (400, 404)
    session = (await client.post(f"{base}/sessions", headers=alice)).json()["id"]
    run = f"{base}/sessions/{session}/run"
    assert (await client.post(run, json={"code": "x = 41"}, headers=alice)).json()["ok"]
    assert (await client.post(run, json={"code": "x + 1"}, headers=alice)).json()["result"] == "42"
    assert (await client.delete(f"{base}/sessions/{session}", headers=alice)).status_code == 200
    assert (await client.post(run, json={"code": "x"}, headers=alice)).status_code == 404
    timed = (
        await client.post(f"{base}/exec", json={"shell": "sleep 5", "timeout": 0.3}, headers=alice)
    ).json()
    assert timed["timed_out"] and not timed["ok"]
    assert (await client.delete(base, headers=alice)).json() == {"id": sid, "destroyed": True}
    assert (await client.get(base, headers=alice)).status_code == 404
    assert (await client.delete(base, headers=alice)).status_code == 404


async def test_sandboxes_belong_to_their_token(
    client: httpx.AsyncClient, alice: dict[str, str], bob: dict[str, str], backend: LocalBackend
) -> None:
    sid = (await create(client, alice))["id"]
    base = f"/v1/sandboxes/{sid}"
    never = await client.get("/v1/sandboxes/000000000000", headers=bob)
    for method, path, body in (
        ("GET", base, None),
        ("DELETE", base, None),
        ("POST", f"{base}/exec", {"shell": "echo pwned > /tmp/x"}),
        ("GET", f"{base}/files/a.txt", None),
        ("PUT", f"{base}/files/a.txt", None),
        ("GET", f"{base}/files", None),
        ("POST", f"{base}/sessions", None),
        ("POST", f"{base}/extend", {"seconds": 10}),
        ("POST", f"{base}/fork", None),
        ("GET", f"{base}/snapshot", None),
        ("GET", f"{base}/logs", None),
    ):
        response = await client.request(method, path, json=body, headers=bob)
        assert response.status_code == 404, (method, path, response.text)
        # The same answer as for an id that never existed: existence does not leak.
        assert response.json()["code"] == never.json()["code"] == "not_found"
        assert response.json()["detail"].replace(sid, "X") == never.json()["detail"].replace(
            "000000000000", "X"
        )
    assert (await client.get("/v1/sandboxes", headers=bob)).json()["sandboxes"] == []
    mine = (await client.get("/v1/sandboxes", headers=alice)).json()
    assert [s["id"] for s in mine["sandboxes"]] == [sid] and mine["available"] == 3
    assert (await client.get(base, headers=alice)).json()["running"]


# -- ceilings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"memory": "1g"}, "max_memory"),
        ({"cpus": 4}, "max_cpus"),
        ({"pids": 1000}, "max_pids"),
        ({"timeout": 3000}, "max_timeout"),
        ({"image": "docker.io/evil:latest"}, "image"),
        ({"backend": "docker"}, "backend"),
        ({"network": {"mode": "open"}}, "network mode"),
        ({"network": {"mode": "allowlist", "domains": ["example.com"]}}, "network mode"),
        ({"read_only_root": False}, "writable root"),
        ({"workspace_size": "2g"}, "max_workspace"),
        ({"policy": {"max_output_bytes": 1 << 30}}, "max_output_bytes"),
        ({"policy": {"max_file_bytes": 1 << 35}}, "max_file_bytes"),
    ],
)
async def test_asking_for_more_than_the_ceiling_is_refused(
    client: httpx.AsyncClient, alice: dict[str, str], backend: LocalBackend, body: dict[str, Any], words: str
) -> None:
    response = await client.post("/v1/sandboxes", json=body, headers=alice)
    assert response.status_code == 403, response.text
    assert response.json()["code"] == "policy_denied"
    assert words in response.json()["detail"]
    assert backend.created == []  # refused before anything was created


async def test_narrowing_is_allowed_and_holds(client: httpx.AsyncClient, alice: dict[str, str]) -> None:
    made = await create(client, alice, memory="128m", cpus=0.5, timeout=30, policy={"max_output_bytes": 2048})
    assert made["memory"] == 128 * 1024 * 1024 and made["cpus"] == 0.5
    out = (
        await client.post(
            f"/v1/sandboxes/{made['id']}/exec", json={"python": "print('x' * 10000)"}, headers=alice
        )
    ).json()
    assert out["truncated"] and len(out["stdout"]) <= 2048


async def test_max_sandboxes_and_extend_past_the_ceiling(
    client: httpx.AsyncClient, settings: ServerSettings
) -> None:
    headers = auth(add_token(settings, "two", max_sandboxes=2, max_timeout=100.0))
    first = await create(client, headers, timeout=60)
    await create(client, headers, timeout=60)
    refused = await client.post("/v1/sandboxes", json={}, headers=headers)
    assert (refused.status_code, refused.json()["code"]) == (429, "quota")
    fork = await client.post(f"/v1/sandboxes/{first['id']}/fork", headers=headers)
    assert fork.status_code == 429
    ok = await client.post(f"/v1/sandboxes/{first['id']}/extend", json={"seconds": 30}, headers=headers)
    assert ok.status_code == 200 and ok.json()["deadline"] > first["deadline"] + 29
    over = await client.post(f"/v1/sandboxes/{first['id']}/extend", json={"seconds": 30}, headers=headers)
    assert over.status_code == 403 and "max_timeout" in over.json()["detail"]
    await client.delete(f"/v1/sandboxes/{first['id']}", headers=headers)
    assert (await client.post("/v1/sandboxes", json={}, headers=headers)).status_code == 201


async def test_secrets_are_redacted(client: httpx.AsyncClient, alice: dict[str, str]) -> None:
    sid = (await create(client, alice, secrets={"API_KEY": "s3cr3t-value"}))["id"]
    out = (
        await client.post(
            f"/v1/sandboxes/{sid}/exec",
            json={"shell": "echo $T; echo s3cr3t-value", "env": {"T": "plain"}},
            headers=alice,
        )
    ).json()
    assert out["stdout"] == "plain\n[REDACTED]\n"


# -- bad input ------------------------------------------------------------------------------


async def test_malformed_json_gets_fastapi_422(client: httpx.AsyncClient, alice: dict[str, str]) -> None:
    headers = {**alice, "Content-Type": "application/json"}
    response = await client.post("/v1/sandboxes", content=b'{"image": ', headers=headers)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert isinstance(detail, list) and detail[0]["type"] == "json_invalid"
    for body in ({"imagee": "x"}, {"timeout": -1}, {"memory": ["x"]}, [1, 2], "text"):
        response = await client.post("/v1/sandboxes", json=body, headers=alice)
        assert response.status_code == 422, body
        assert {"loc", "msg", "type"} <= set(response.json()["detail"][0])


async def test_exec_needs_exactly_one_command(client: httpx.AsyncClient, alice: dict[str, str]) -> None:
    sid = (await create(client, alice))["id"]
    bodies: list[dict[str, Any]] = [{}, {"shell": "true", "argv": ["true"]}, {"argv": []}]
    for body in bodies:
        response = await client.post(f"/v1/sandboxes/{sid}/exec", json=body, headers=alice)
        assert response.status_code == 422, body


async def test_oversized_bodies_get_413(client: httpx.AsyncClient, alice: dict[str, str]) -> None:
    big = json.dumps({"environment": {"A": "x" * 100_000}}).encode()
    response = await client.post(
        "/v1/sandboxes", content=big, headers={**alice, "Content-Type": "application/json"}
    )
    assert (response.status_code, response.json()["code"]) == (413, "too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(100):
            yield b" " * 1024

    response = await client.post(
        "/v1/sandboxes", content=chunks(), headers={**alice, "Content-Type": "application/json"}
    )
    assert response.status_code == 413
    sid = (await create(client, alice))["id"]
    # Uploads have their own, larger limit.
    ok = await client.put(f"/v1/sandboxes/{sid}/files/up.bin", content=b"u" * 200_000, headers=alice)
    assert ok.status_code == 204
    over = await client.put(f"/v1/sandboxes/{sid}/files/up.bin", content=b"u" * 300_000, headers=alice)
    assert over.status_code == 413
    assert (await client.get(f"/v1/sandboxes/{sid}/files/up.bin", headers=alice)).content == b"u" * 200_000


async def test_unknown_routes_and_methods(client: httpx.AsyncClient, alice: dict[str, str]) -> None:
    assert (await client.get("/v2/nothing", headers=alice)).status_code == 404
    assert (await client.put("/v1/sandboxes", headers=alice)).status_code == 405
