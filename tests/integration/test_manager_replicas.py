"""Two manager processes sharing one PostgreSQL database on the real engine (runc), one killed with
SIGKILL in the middle of a burst of creates: every request to it ends with an answer or a
connection error (none hangs), the survivor ends the dead one's sandboxes in the shared history
and removes its containers from the engine (none leaks), and keeps serving.

What this does not show: the two do not share one admission queue (each admits within its own
capacity), and there is no leader; see docs/manager.md "Not yet".
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from agentnest.runtime.docker import labels
from agentnest.server.auth import Ceiling, TokenStore
from agentnest.testing.wait import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

TIMEOUT = 3.0  # --server-timeout: silent this long, a server counts as gone


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    def __init__(self, database: str, tokens: Path, log: Path) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        bindir = Path(sys.executable).parent
        argv = [str(bindir / "agentnest"), "serve", "--port", str(self.port), "--database", database]
        argv += ["--server-timeout", str(TIMEOUT), "--no-audit-log", "--max-sandboxes", "16"]
        self.log = log.open("w")
        env = {**os.environ, "AGENTNEST_TOKEN_FILE": str(tokens)}
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.owner = f"{socket.gethostname()}:{self.proc.pid}"

        def ready() -> bool:
            assert self.proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, f"the replica on port {self.port} being ready", within=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture
def replicas(tmp_path: Path, postgres_server: Any) -> Iterator[tuple[Replica, Replica, str, str]]:
    database = postgres_server.create_database(
        f"replicas_{os.getpid()}_{tmp_path.name[-12:]}".replace("-", "_")
    )
    store = TokenStore(tmp_path / "tokens.json")
    _, secret = store.create("t", Ceiling(max_sandboxes=16, max_memory=64 << 20))
    first = Replica(database, tmp_path / "tokens.json", tmp_path / "a.log")
    second = Replica(database, tmp_path / "tokens.json", tmp_path / "b.log")
    try:
        yield first, second, secret, database
    finally:
        first.stop()
        second.stop()


def _containers(docker_client: Any, owner: str) -> list[Any]:
    return list(docker_client.containers.list(all=True, filters={"label": [f"{labels.OWNER}={owner}"]}))


def test_a_replica_killed_mid_burst_leaves_no_sandbox_and_no_open_history(
    replicas: tuple[Replica, Replica, str, str], docker_client: Any
) -> None:
    doomed, survivor, secret, database = replicas
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=doomed.url, headers=headers, timeout=60) as http:
        kept = http.post("/v1/sandboxes", json={"memory": "64m"})
        assert kept.status_code == 201, kept.text
        ran = http.post(f"/v1/sandboxes/{kept.json()['id']}/exec", json={"shell": "echo before"})
        assert ran.json()["stdout"] == "before\n"

    def create(_: int) -> tuple[str, str | None]:
        with httpx.Client(base_url=doomed.url, headers=headers, timeout=60) as client:
            try:
                answer = client.post("/v1/sandboxes", json={"memory": "64m"})
            except httpx.TransportError as exc:
                return type(exc).__name__, None
            return str(answer.status_code), answer.json().get("id")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        burst = [pool.submit(create, i) for i in range(6)]
        # Kill it while the burst is in flight: once the engine holds a second container of it.
        wait_until(lambda: len(_containers(docker_client, doomed.owner)) >= 2, "a create of the burst", 60)
        doomed.proc.send_signal(signal.SIGKILL)
        answers = [f.result(timeout=90) for f in burst]  # every request ends: none hangs
    assert doomed.proc.wait(10) == -signal.SIGKILL
    outcomes = {status for status, _ in answers}
    assert outcomes <= {"201", "RemoteProtocolError", "ReadError", "ConnectError"}, answers
    # Every sandbox a client was told about (201) is in the shared history.
    told = {kept.json()["id"]} | {sid for status, sid in answers if status == "201"}

    # The survivor notices the silence, ends the dead one's history and removes its containers.
    wait_until(
        lambda: not _containers(docker_client, doomed.owner),
        "the dead replica's containers being removed by the survivor",
        within=TIMEOUT * 6 + 30,
    )
    engine = sa.create_engine(database.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:

            def still_open() -> int:
                return int(
                    conn.execute(sa.text("SELECT count(*) FROM sandboxes WHERE ended IS NULL")).scalar() or 0
                )

            wait_until(lambda: still_open() == 0, "the dead replica's sandbox rows being ended", within=30)
            rows: dict[str, str] = dict(
                conn.execute(sa.text("SELECT sandbox_id, end_reason FROM sandboxes")).all()
            )
            assert told <= set(rows), (told, rows)
            assert set(rows.values()) == {"lost"}
            servers = conn.execute(sa.text("SELECT host, pid FROM servers")).all()
            assert [f"{h}:{p}" for h, p in servers] == [survivor.owner]
    finally:
        engine.dispose()

    # The survivor serves on, and a clean stop ends its own rows as such.
    with httpx.Client(base_url=survivor.url, headers=headers, timeout=60) as http:
        made = http.post("/v1/sandboxes", json={"memory": "64m"})
        assert made.status_code == 201, made.text
        assert (
            http.post(f"/v1/sandboxes/{made.json()['id']}/exec", json={"argv": ["true"]}).json()["exit_code"]
            == 0
        )
    survivor.stop()
    assert not _containers(docker_client, survivor.owner)
