"""``agentnest serve db`` and ``agentnest audit --server``: the manager's database and its history
from the command line (a real uvicorn server on loopback, local agents behind it, no engine)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_fakes import IMAGE, LocalBackend, auth, make_settings

from agentnest.cli import main
from agentnest.server.app import create_app
from agentnest.server.auth import Ceiling
from agentnest.server.db import Database
from agentnest.server.thread import serve_in_thread

pytestmark = pytest.mark.timeout(90)

FOLLOW = ("audit", "--follow", "--json")


def test_db_upgrade_then_current(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert main(["serve", "db", "current", "--database", url]) == 1
    assert "needs `agentnest serve db upgrade`" in capsys.readouterr().out
    assert main(["serve", "db", "upgrade", "--database", url]) == 0
    head = Database(url).head()
    assert f"migrated from nothing to {head}" in capsys.readouterr().err
    assert main(["serve", "db", "upgrade", "--database", url]) == 0
    assert f"already at {head}" in capsys.readouterr().err
    assert main(["serve", "db", "current", "--database", url]) == 0
    assert f"at {head}, this version needs {head} (up to date)" in capsys.readouterr().out


def test_db_commands_name_a_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "db", "upgrade", "--database", "mysql://u@h/db"]) == 2
    assert "not supported" in capsys.readouterr().err


def test_serve_refuses_both_database_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--database", "sqlite:///x.db", "--no-database"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    backend = LocalBackend(tmp_path / "sandboxes")
    backend.root.mkdir()
    settings = make_settings(tmp_path, backend, database=f"sqlite:///{tmp_path / 'm.db'}")
    _, secret = settings.tokens.create("t", Ceiling(images=(IMAGE,), max_sandboxes=4))
    _, admin = settings.tokens.create("ops", Ceiling(images=(IMAGE,)), admin=True)
    try:
        with serve_in_thread(create_app(settings)) as url:
            yield url, secret, admin
    finally:
        backend.kill_all()


def test_audit_server_prints_the_history_and_usage(
    served: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, secret, admin = served
    with httpx.Client(base_url=url, headers=auth(secret), timeout=60) as http:
        made = http.post("/v1/sandboxes", json={}).json()
        http.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": "echo from-cli"})
    assert main(["audit", "--server", url, "--token", secret, "--json", "--sandbox", made["id"]]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["type"] for e in lines][:1] == ["sandbox.created"]
    assert any("from-cli" in str(e["data"]) for e in lines)
    assert main(["audit", "--server", url, "--token", admin, "--usage", "--json"]) == 0
    usage = json.loads(capsys.readouterr().out)["usage"]
    assert [(u["tenant"], u["creates"]) for u in usage] == [("default", 1)]
    assert main(["audit", "--server", url, "--token", admin, "--usage"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["TENANT", "CREATES", "SANDBOX-H", "CPU-H", "MEMORY-GIB-H", "REJECTED"]
    assert table[1].split()[:2] == ["default", "1"]
    assert main(["audit", "--server", url, "--token", "ant_wrong", "--usage"]) == 1
    assert "answered 401" in capsys.readouterr().err
    assert main(["audit", "--server", "ftp://x", "--token", secret]) == 2


def test_audit_server_follow_prints_new_events_as_they_come(
    served: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, secret, _ = served
    with httpx.Client(base_url=url, headers=auth(secret), timeout=60) as http:
        made = http.post("/v1/sandboxes", json={}).json()
        before = len(http.get("/v1/audit", params={"limit": 1000}).json()["events"])
        # The follower stops after the events so far plus the two of one more command.
        done: list[int] = []
        follower = threading.Thread(
            target=lambda: done.append(
                main([*FOLLOW, "--server", url, "--token", secret, "--max-events", str(before + 2)])
            )
        )
        follower.start()
        http.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": "echo followed"})
        follower.join(60)
    assert done == [0]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == before + 2
    assert [e["type"] for e in lines[-2:]] == ["exec.started", "exec.finished"]
    assert "followed" in str(lines[-2]["data"])


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"events": "x", "next": 1}',
        b'{"events": [1], "next": 1}',
        b'{"usage": [{"tenant": 1}]}',
        b"{}",
    ],
)
def test_audit_server_refuses_answers_that_are_not_ours(
    body: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    import http.server

    class Fake(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert main(["audit", "--server", url, "--token", "ant_x"]) == 1
        assert "not an audit page" in capsys.readouterr().err
        assert main(["audit", "--server", url, "--token", "ant_x", "--usage"]) == 1
        assert "not a usage report" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
