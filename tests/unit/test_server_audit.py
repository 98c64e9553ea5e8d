"""The manager's central audit and usage: every sandbox event lands in its database tagged with
tenant and token, ``/v1/audit`` pages and long-polls it within a tenant's scope, ``/v1/usage``
sums what each tenant held, ``/readyz`` checks the database, and a server without one says so.
Over real HTTP on loopback (uvicorn), local agent processes behind the server (no engine)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fakes import IMAGE, LocalBackend, auth, make_settings

from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling
from agentnest.server.service import Service
from agentnest.server.tenants import Tenant
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(90)


class Live:
    def __init__(self, url: str, service: Service, settings: ServerSettings) -> None:
        self.url, self.service, self.settings = url, service, settings

    def client(self, name: str, tenant: str = "default", admin: bool = False) -> httpx.Client:
        ceiling = Ceiling(images=(IMAGE,), max_sandboxes=4)
        _, secret = self.settings.tokens.create(name, ceiling, tenant=tenant, admin=admin)
        return httpx.Client(base_url=self.url, headers=auth(secret), timeout=60)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalBackend]:
    b = LocalBackend(tmp_path / "sandboxes")
    b.root.mkdir()
    yield b
    b.kill_all()


def _serve(settings: ServerSettings) -> Iterator[Live]:
    app = create_app(settings)
    with serve_in_thread(app) as url:
        yield Live(url, app.state.service, settings)


@pytest.fixture
def live(tmp_path: Path, backend: LocalBackend, database_url: str) -> Iterator[Live]:
    """A server on a SQLite file, and one on the private PostgreSQL server."""
    settings = make_settings(tmp_path, backend, database=database_url)
    settings.tokens.create_tenant(Tenant("team-a", max_sandboxes=1, rate=100.0, burst=100))
    settings.tokens.create_tenant(Tenant("team-b", rate=100.0, burst=100))
    yield from _serve(settings)


def _events(http: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    answer = http.get("/v1/audit", params=params)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["events"])


def test_sandbox_events_land_in_the_database_tagged_with_tenant_and_token(live: Live) -> None:
    with live.client("a1", "team-a") as a, live.client("ops", admin=True) as admin:
        made = a.post("/v1/sandboxes", json={}).json()
        ran = a.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": "echo audited"}).json()
        assert ran["stdout"] == "audited\n"
        assert a.delete(f"/v1/sandboxes/{made['id']}").status_code == 200
        mine = _events(a, sandbox=made["id"])
        types = [e["type"] for e in mine]
        assert types[0] == "sandbox.created" and "exec.finished" in types and types[-1] == "sandbox.destroyed"
        started = next(e for e in mine if e["type"] == "exec.started")
        finished = next(e for e in mine if e["type"] == "exec.finished")
        assert started["tenant"] == finished["tenant"] == "team-a"
        assert started["token"] == next(t.id for t in live.settings.tokens.list() if t.name == "a1")
        assert "echo audited" in str(started["data"]) and finished["data"]["exit_code"] == 0
        # The admission decision is there too (no sandbox id), in the admin's view.
        decisions = _events(admin, type="admission.admitted", tenant="team-a")
        assert len(decisions) == 1 and decisions[0]["sandbox_id"] == ""
        usage = admin.get("/v1/usage").json()["usage"]
        team_a = next(u for u in usage if u["tenant"] == "team-a")
        assert team_a["creates"] == 1 and team_a["sandbox_seconds"] > 0
        assert team_a["memory_gib_seconds"] > 0 and team_a["cpu_seconds"] > 0


def test_a_tenant_reads_only_its_own_history_and_an_admin_reads_all(live: Live) -> None:
    with (
        live.client("a1", "team-a") as a,
        live.client("b1", "team-b") as b,
        live.client("ops", admin=True) as admin,
    ):
        for http in (a, b):
            made = http.post("/v1/sandboxes", json={}).json()
            http.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": "true"})
        assert {e["tenant"] for e in _events(a)} == {"team-a"}
        assert {e["tenant"] for e in _events(b)} == {"team-b"}
        assert {e["tenant"] for e in _events(admin)} == {"team-a", "team-b"}
        refused = a.get("/v1/audit", params={"tenant": "team-b"})
        assert refused.status_code == 403 and refused.json()["code"] == "policy_denied"
        assert a.get("/v1/usage", params={"tenant": "team-b"}).status_code == 403
        assert [u["tenant"] for u in a.get("/v1/usage").json()["usage"]] == ["team-a"]


def test_pages_follow_the_cursor_without_gaps_or_repeats(live: Live) -> None:
    with live.client("a1", "team-a") as a:
        made = a.post("/v1/sandboxes", json={}).json()
        for i in range(7):
            a.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": f"echo {i}"})
        everything = _events(a, limit=1000)
        seen: list[int] = []
        after = 0
        while True:
            page = a.get("/v1/audit", params={"after": after, "limit": 4}).json()
            if not page["events"]:
                assert page["next"] == after
                break
            seen += [e["id"] for e in page["events"]]
            after = page["next"]
        assert seen == [e["id"] for e in everything] and len(seen) == len(set(seen)) >= 8


def test_a_long_poll_answers_when_a_new_event_is_written(live: Live) -> None:
    with live.client("a1", "team-a") as a, live.client("a2", "team-a") as other:
        made = a.post("/v1/sandboxes", json={}).json()
        cursor = _events(a, limit=1000)[-1]["id"]
        answer: dict[str, Any] = {}

        def poll() -> None:
            started = time.monotonic()
            answer["page"] = other.get("/v1/audit", params={"after": cursor, "wait": 25}).json()
            answer["took"] = time.monotonic() - started

        waiter = threading.Thread(target=poll)
        waiter.start()
        recorder = live.service.recorder
        assert recorder is not None
        wait_until(lambda: recorder.waiters == 1, "the long poll waiting for news", within=20)
        assert waiter.is_alive()
        a.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": "echo wake"})
        waiter.join(30)
        assert not waiter.is_alive()
        events = answer["page"]["events"]
        assert events and all(e["id"] > cursor for e in events)
        # The poll answers at the first news: the exec's start (its end may come later).
        assert any(e["type"] in ("exec.started", "exec.finished") for e in events)
        assert answer["took"] < 20  # woken by the write, not by the end of the wait


def test_a_long_poll_with_nothing_new_returns_an_empty_page_after_its_wait(live: Live) -> None:
    with live.client("a1", "team-a") as a:
        started = time.monotonic()
        page = a.get("/v1/audit", params={"after": 10**9, "wait": 1}).json()
        assert page == {"events": [], "next": 10**9}
        assert time.monotonic() - started >= 0.9


def test_rejected_creates_are_audited_and_counted_in_usage(live: Live) -> None:
    with live.client("a1", "team-a") as a, live.client("ops", admin=True) as admin:
        assert a.post("/v1/sandboxes", json={}).status_code == 201
        refused = a.post("/v1/sandboxes", json={"max_wait": 0})
        assert refused.status_code == 429, refused.text
        rejected = _events(admin, type="admission.rejected")
        assert [e["tenant"] for e in rejected] == ["team-a"]
        assert rejected[0]["data"]["reason"]
        usage = {u["tenant"]: u for u in admin.get("/v1/usage").json()["usage"]}
        assert usage["team-a"]["rejections"] == 1 and usage["team-a"]["creates"] == 1


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"limit": 0}, 422),
        ({"limit": 1001}, 422),
        ({"wait": 31}, 422),
        ({"after": -1}, 422),
        ({"type": [f"t{i}" for i in range(33)]}, 400),
    ],
)
def test_bad_audit_queries_are_refused(live: Live, params: dict[str, Any], status: int) -> None:
    with live.client("a1", "team-a") as a:
        assert a.get("/v1/audit", params=params).status_code == status
        assert a.get("/v1/usage", params={"since": 100, "until": 50}).status_code == 400


def test_readyz_reports_the_database(live: Live) -> None:
    ready = httpx.get(f"{live.url}/readyz", timeout=30)
    assert ready.status_code == 200
    assert ready.json()["checks"]["database"] == "ok"


def test_a_server_without_a_database_says_so(tmp_path: Path, backend: LocalBackend) -> None:
    for live in _serve(make_settings(tmp_path, backend)):
        with live.client("a1") as a:
            for path in ("/v1/audit", "/v1/usage"):
                answer = a.get(path)
                assert answer.status_code == 409
                assert answer.json()["code"] == "unsupported", answer.text
            assert "database" not in httpx.get(f"{live.url}/readyz", timeout=30).json()["checks"]


def test_history_outlives_the_server_and_open_rows_are_closed_on_restart(
    tmp_path: Path, backend: LocalBackend
) -> None:
    url = f"sqlite:///{tmp_path / 'manager.db'}"
    for live in _serve(make_settings(tmp_path, backend, database=url)):
        with live.client("a1") as a:
            made = a.post("/v1/sandboxes", json={}).json()
            a.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": "true"})
    # The server destroyed its sandbox on the way out and recorded why.
    for live in _serve(make_settings(tmp_path, backend, database=url)):
        with live.client("ops", admin=True) as admin:
            types = [e["type"] for e in _events(admin, sandbox=made["id"])]
            assert "exec.finished" in types and types[-1] == "sandbox.destroyed"
            assert admin.get("/v1/usage").json()["usage"][0]["creates"] == 1
        from agentnest.server.db import Database

        with Database(url).engine.connect() as conn:
            import sqlalchemy as sa

            row = conn.execute(sa.text("SELECT ended, end_reason FROM sandboxes")).one()
        assert row.ended is not None and row.end_reason == "server_stopped"


def test_an_unmigrated_database_with_no_migrate_refuses_creates_and_names_the_fix(
    tmp_path: Path, backend: LocalBackend, database_url: str
) -> None:
    for live in _serve(make_settings(tmp_path, backend, database=database_url, migrate=False)):
        ready = httpx.get(f"{live.url}/readyz", timeout=30)
        assert ready.status_code == 503
        assert "agentnest serve db upgrade" in ready.json()["checks"]["database"]
        with live.client("a1") as a:
            refused = a.post("/v1/sandboxes", json={})
            assert refused.status_code == 503 and refused.json()["code"] == "database_unavailable"
            assert "agentnest serve db upgrade" in refused.json()["detail"]
        from agentnest.server.db import Database

        database = Database(database_url)
        try:
            assert database.revision() is None  # --no-migrate: the server did not touch the schema
        finally:
            database.close()


def test_a_backend_that_fails_every_create_leaves_nothing_held_and_every_failure_audited(
    tmp_path: Path, backend: LocalBackend
) -> None:
    from agentnest.errors import BackendError

    class Failing(LocalBackend):
        failing = True

        def create(self, config: Any) -> Any:
            if self.failing:
                raise BackendError("the engine refused: no space left on device")
            return super().create(config)

    broken = Failing(tmp_path / "broken")
    broken.root.mkdir()
    settings = make_settings(tmp_path, broken, database=f"sqlite:///{tmp_path / 'm.db'}")
    try:
        for live in _serve(settings):
            with live.client("a1") as a, live.client("ops", admin=True) as admin:
                for _ in range(3):
                    failed = a.post("/v1/sandboxes", json={})
                    assert failed.status_code == 502 and failed.json()["code"] == "backend", failed.text
                    assert "no space left on device" in failed.json()["detail"]
                assert live.service.admission.holdings("default").sandboxes == 0
                assert not live.service.entries
                events = _events(admin, type="sandbox.create_failed")
                assert len(events) == 3 and {e["tenant"] for e in events} == {"default"}
                assert events[0]["data"]["backend"] == "local"
                assert "no space left" in events[0]["data"]["message"]
                assert len(_events(admin, type="admission.admitted")) == 3
                metrics = admin.get("/metrics").text
                assert 'agentnest_backend_errors_total{backend="local"} 3.0' in metrics
                assert admin.get("/v1/usage").json()["usage"] == []  # nothing was held
                # The backend recovers: so does the server, with no state left from the failures.
                broken.failing = False
                assert a.post("/v1/sandboxes", json={}).status_code == 201
                assert live.service.admission.holdings("default").sandboxes == 1
    finally:
        broken.kill_all()


def test_two_live_servers_never_share_a_sqlite_file(tmp_path: Path, backend: LocalBackend) -> None:
    import asyncio
    import subprocess

    from agentnest.errors import ConfigurationError
    from agentnest.server.db import Database

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    second = create_app(make_settings(tmp_path, backend, database=url))
    for _ in _serve(make_settings(tmp_path, backend, database=url)):
        with pytest.raises(ConfigurationError, match="in use by another agentnest serve"):
            asyncio.run(second.state.service.open_database())
    # Stopped cleanly, the first one deregistered: the file is free.
    assert asyncio.run(second.state.service.open_database()) is True
    asyncio.run(second.state.service.close())  # it stops cleanly too
    # A server killed on this host (its process is gone) does not hold the file either.
    gone = subprocess.Popen(["true"])
    gone.wait()
    database = Database(url)
    try:
        database.heartbeat("killed", host=socket.gethostname(), pid=gone.pid, started=time.time())
    finally:
        database.close()
    third = create_app(make_settings(tmp_path, backend, database=url))
    assert asyncio.run(third.state.service.open_database()) is True
