"""The manager while its PostgreSQL database is down: creates are refused with 503
``database_unavailable`` (Retry-After), running sandboxes keep working, ``/readyz`` says why,
and when the server is back everything recorded meanwhile is written, once.  A private
PostgreSQL server is stopped and started under a real uvicorn server (local agent processes
behind it, no engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from doubles.postgres import PostgresServer
from doubles.postgres import postgres_server as start_postgres
from server_fakes import IMAGE, LocalBackend, auth, make_settings

from agentnest.server.app import create_app
from agentnest.server.auth import Ceiling
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pg(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """A server of this test's own (it is stopped and started), beside the session's."""
    with start_postgres() as server:  # the session fixture skipped or failed if it cannot start
        yield server


def test_creates_wait_for_the_database_and_nothing_recorded_meanwhile_is_lost(
    tmp_path: Path, pg: PostgresServer
) -> None:
    backend = LocalBackend(tmp_path / "sandboxes")
    backend.root.mkdir()
    settings = make_settings(tmp_path, backend, database=pg.create_database("manager"))
    _, secret = settings.tokens.create("t", Ceiling(images=(IMAGE,), max_sandboxes=4))
    _, admin_secret = settings.tokens.create("ops", Ceiling(images=(IMAGE,)), admin=True)
    app = create_app(settings)
    try:
        with (
            serve_in_thread(app) as url,
            httpx.Client(base_url=url, headers=auth(secret), timeout=60) as http,
            httpx.Client(base_url=url, headers=auth(admin_secret), timeout=60) as admin,
        ):
            made = http.post("/v1/sandboxes", json={}).json()
            assert http.get("/readyz").json()["checks"]["database"] == "ok"

            pg.stop()
            wait_until(lambda: http.get("/readyz").status_code == 503, "readyz failing", within=30)
            assert "127.0.0.1" in http.get("/readyz").json()["checks"]["database"]
            refused = http.post("/v1/sandboxes", json={})
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "database_unavailable"
            assert refused.headers["Retry-After"] == "5"
            # The sandbox already running keeps working; its events wait in the queue.
            ran = http.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": "echo during-outage"})
            assert ran.status_code == 200 and ran.json()["stdout"] == "during-outage\n"
            down = admin.get("/v1/audit")
            assert down.status_code == 503 and down.json()["code"] == "database_unavailable"

            pg.start()
            wait_until(lambda: http.get("/readyz").status_code == 200, "readyz passing again", within=30)
            assert http.post("/v1/sandboxes", json={}).status_code == 201
            events = admin.get("/v1/audit", params={"sandbox": made["id"], "limit": 1000}).json()["events"]
            during = [e for e in events if "during-outage" in str(e["data"])]
            assert [e["type"] for e in during] == ["exec.started"]  # written once, not lost
            assert len({e["event_id"] for e in events}) == len(events)
    finally:
        backend.kill_all()
