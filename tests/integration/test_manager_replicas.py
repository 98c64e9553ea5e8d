"""Two manager processes sharing one PostgreSQL database on the real engine (runc).

- One killed with SIGKILL in the middle of a burst of creates: every request to it ends with an
  answer or a connection error (none hangs), the survivor ends the dead one's sandboxes in the
  shared history and removes its containers from the engine (none leaks), and keeps serving.
- One admission: a tenant capped at 3 sandboxes gets 3 across both replicas, never more, however
  the burst is split; a request queued on one replica is admitted when the other releases; the
  leader's lease passes to the survivor when the leader is killed, and it frees the dead one's
  holds, so the tenant's quota is whole again.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from agentnest.runtime.docker import labels
from agentnest.server.auth import Ceiling, TokenStore
from agentnest.server.tenants import Tenant
from agentnest.testing.wait import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

TIMEOUT = 3.0  # --server-timeout: silent this long, a server counts as gone


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    def __init__(self, database: str, tokens: Path, log: Path, *extra: str) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        bindir = Path(sys.executable).parent
        argv = [str(bindir / "agentnest"), "serve", "--port", str(self.port), "--database", database]
        argv += ["--server-timeout", str(TIMEOUT), "--no-audit-log", "--max-sandboxes", "16", *extra]
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


Pair = tuple[Replica, Replica, str, str, str]


@contextlib.contextmanager
def _pair(tmp_path: Path, postgres_server: Any, name: str) -> Iterator[Pair]:
    """Two replicas on one new database; two tokens (``t`` and ``other``) and the database's URL."""
    database = postgres_server.create_database(
        f"{name}_{os.getpid()}_{tmp_path.name[-12:]}".replace("-", "_")
    )
    store = TokenStore(tmp_path / "tokens.json")
    _, secret = store.create("t", Ceiling(max_sandboxes=16, max_memory=64 << 20))
    _, other = store.create("other", Ceiling(max_sandboxes=4, max_memory=64 << 20))
    first = Replica(database, tmp_path / "tokens.json", tmp_path / "a.log")
    second = Replica(database, tmp_path / "tokens.json", tmp_path / "b.log")
    try:
        yield first, second, secret, other, database
    finally:
        first.stop()
        second.stop()


@pytest.fixture
def replicas(tmp_path: Path, postgres_server: Any) -> Iterator[tuple[Replica, Replica, str, str]]:
    with _pair(tmp_path, postgres_server, "replicas") as (first, second, secret, _, database):
        yield first, second, secret, database


def _containers(docker_client: Any, owner: str) -> list[Any]:
    # ignore_removed: docker-py inspects each container it listed, and one the manager removes in
    # between (exactly what these tests wait for) would otherwise raise NotFound.
    found = docker_client.containers.list(
        all=True, filters={"label": [f"{labels.OWNER}={owner}"]}, ignore_removed=True
    )
    return list(found)


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


LEASE = 2.0  # --leader-lease of the shared-admission replicas


@pytest.fixture
def capped(tmp_path: Path, postgres_server: Any) -> Iterator[tuple[Replica, Replica, str, str]]:
    """Two replicas, a tenant ``team`` capped at 3 sandboxes, its token's and an admin's secret."""
    database = postgres_server.create_database(
        f"capped_{os.getpid()}_{tmp_path.name[-12:]}".replace("-", "_")
    )
    store = TokenStore(tmp_path / "tokens.json")
    store.create_tenant(Tenant("team", max_sandboxes=3, rate=100.0, burst=100))
    _, secret = store.create("t", Ceiling(max_sandboxes=16, max_memory=64 << 20), tenant="team")
    _, admin = store.create("admin", Ceiling(), admin=True)
    first = Replica(database, tmp_path / "tokens.json", tmp_path / "a.log", "--leader-lease", str(LEASE))
    second = Replica(database, tmp_path / "tokens.json", tmp_path / "b.log", "--leader-lease", str(LEASE))
    try:
        yield first, second, secret, admin
    finally:
        first.stop()
        second.stop()


def _leader(replica: Replica, admin: str) -> float:
    text = httpx.get(f"{replica.url}/metrics", headers={"Authorization": f"Bearer {admin}"}, timeout=10).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith("agentnest_leader ")))


def _queued(replica: Replica, admin: str) -> float:
    text = httpx.get(f"{replica.url}/metrics", headers={"Authorization": f"Bearer {admin}"}, timeout=10).text
    return sum(
        float(line.split()[1]) for line in text.splitlines() if line.startswith("agentnest_queue_depth{")
    )


def test_two_replicas_share_one_admission_and_one_leader(
    capped: tuple[Replica, Replica, str, str], docker_client: Any
) -> None:
    first, second, secret, admin = capped
    headers = {"Authorization": f"Bearer {secret}"}
    # The first replica started first: it holds the leader's lease, the second does not.
    wait_until(lambda: _leader(first, admin) == 1.0, "the first replica leading", within=30)
    assert _leader(second, admin) == 0.0

    def create(replica: Replica, max_wait: float = 0.0) -> httpx.Response:
        with httpx.Client(base_url=replica.url, headers=headers, timeout=90) as client:
            return client.post("/v1/sandboxes", json={"memory": "64m", "max_wait": max_wait})

    # A burst of 8 creates split over both replicas, none willing to wait: exactly the cap is granted.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(create, [first, second] * 4))
    granted = [a for a in answers if a.status_code == 201]
    refused = [a for a in answers if a.status_code != 201]
    assert len(granted) == 3, [(a.status_code, a.text) for a in answers]
    for answer in refused:
        assert answer.status_code == 429, answer.text
        assert answer.json()["code"] == "tenant_cap", answer.text
        assert int(answer.headers["Retry-After"]) >= 1
    assert len(_containers(docker_client, first.owner)) + len(_containers(docker_client, second.owner)) == 3

    # Whichever replica holds them, one more waits; a release on either admits it.
    ids = [a.json()["id"] for a in granted]
    on_first = [
        sid for sid in ids if httpx.get(f"{first.url}/v1/sandboxes/{sid}", headers=headers).is_success
    ]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(create, second, 60.0)
        wait_until(lambda: _queued(second, admin) == 1, "the create queued on the second replica", within=30)
        # Release on the other replica than the one the request waits on, when it has one.
        victim, where = (on_first[0], first) if on_first else (ids[0], second)
        gone = httpx.delete(f"{where.url}/v1/sandboxes/{victim}", headers=headers, timeout=60)
        assert gone.status_code in (200, 204), gone.text
        late = waiting.result(timeout=90)
    assert late.status_code == 201, late.text

    # Kill the leader: the second replica takes the lease over within its time, then (after
    # --server-timeout) frees the dead one's holds, so the tenant may hold 3 again.
    first_holds = len(_containers(docker_client, first.owner))
    first.proc.send_signal(signal.SIGKILL)
    assert first.proc.wait(10) == -signal.SIGKILL
    wait_until(
        lambda: _leader(second, admin) == 1.0, "the survivor taking the lease over", within=LEASE * 3 + 5
    )
    wait_until(
        lambda: not _containers(docker_client, first.owner),
        "the dead replica's containers being removed",
        within=TIMEOUT * 6 + 30,
    )
    still = 3 - first_holds
    made = [create(second) for _ in range(first_holds + 1)]
    codes = [m.status_code for m in made]
    assert codes == [201] * first_holds + [429], [(m.status_code, m.text) for m in made]
    assert len(_containers(docker_client, second.owner)) == still + first_holds == 3


def test_a_server_restarted_on_its_sqlite_file_removes_what_its_killed_run_left(
    tmp_path: Path, docker_client: Any
) -> None:
    """Alone on its database, a server knows every earlier server there is gone: at start it ends
    their rows and removes their containers at once, not at each sandbox's deadline."""
    database = f"sqlite:///{tmp_path / 'manager.db'}"
    store = TokenStore(tmp_path / "tokens.json")
    _, secret = store.create("t", Ceiling(max_sandboxes=4, max_memory=64 << 20))
    headers = {"Authorization": f"Bearer {secret}"}
    killed = Replica(database, tmp_path / "tokens.json", tmp_path / "a.log")
    try:
        made = httpx.post(f"{killed.url}/v1/sandboxes", json={"memory": "64m"}, headers=headers, timeout=60)
        assert made.status_code == 201, made.text
        assert len(_containers(docker_client, killed.owner)) == 1
        killed.proc.send_signal(signal.SIGKILL)
        assert killed.proc.wait(10) == -signal.SIGKILL
        assert len(_containers(docker_client, killed.owner)) == 1  # nobody removed it
    finally:
        killed.stop()
    restarted = Replica(database, tmp_path / "tokens.json", tmp_path / "b.log")
    try:
        # Ready means the database was opened: the earlier run's container is gone by then.
        assert not _containers(docker_client, killed.owner)
        engine = sa.create_engine(database)
        try:
            with engine.connect() as conn:
                ended = conn.execute(sa.text("SELECT sandbox_id, end_reason FROM sandboxes")).all()
                servers = [f"{h}:{p}" for h, p in conn.execute(sa.text("SELECT host, pid FROM servers"))]
        finally:
            engine.dispose()
        assert [tuple(row) for row in ended] == [(made.json()["id"], "lost")]
        assert servers == [restarted.owner]
    finally:
        restarted.stop()


def test_every_replica_serves_every_sandbox(replicas: tuple[Replica, Replica, str, str]) -> None:
    """A sandbox started by one replica is used through the other: its requests are forwarded
    (HTTP bodies both ways, an event stream, the agent channel's websocket); a request for a
    sandbox nobody runs is still 404, and another token's sandbox stays refused."""
    from agentnest.channel.client import Channel
    from agentnest.runtime import launch
    from agentnest.runtime.base import SandboxHandle
    from agentnest.runtime.remote import RemoteBackend

    first, second, secret, _ = replicas
    headers = {"Authorization": f"Bearer {secret}"}
    with (
        httpx.Client(base_url=first.url, headers=headers, timeout=60) as a,
        httpx.Client(base_url=second.url, headers=headers, timeout=60) as b,
    ):
        made = a.post("/v1/sandboxes", json={"memory": "64m"})
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        assert b.get(f"/v1/sandboxes/{sid}").json()["id"] == sid
        ran = b.post(f"/v1/sandboxes/{sid}/exec", json={"shell": "echo via-second; hostname"})
        assert ran.status_code == 200 and ran.json()["stdout"].startswith("via-second\n"), ran.text
        # A body in (an upload) and out (a download), byte for byte.
        blob = os.urandom(300_000)
        put = b.put(f"/v1/sandboxes/{sid}/files/blob.bin", content=blob)
        assert put.status_code == 204, put.text
        assert a.get(f"/v1/sandboxes/{sid}/files/blob.bin").content == blob
        assert b.get(f"/v1/sandboxes/{sid}/files/blob.bin").content == blob
        # An event stream, relayed as it comes.
        with b.stream(
            "POST", f"/v1/sandboxes/{sid}/exec/stream", json={"shell": "echo one; echo two"}
        ) as sse:
            assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")
            text = "".join(sse.iter_text())
        assert "one" in text and "two" in text and "event: exit" in text, text
        # Unknown everywhere: 404 from the replica asked, not a forwarding error.
        missing = b.get("/v1/sandboxes/0123456789ab")
        assert missing.status_code == 404 and missing.json()["code"] == "not_found"
        # The replica that runs it still checks the token: no token, no sandbox.
        assert httpx.get(f"{second.url}/v1/sandboxes/{sid}", timeout=30).status_code == 401

        # The agent channel through the second replica: the bundle goes up, the agent's hello
        # comes back, a command runs.
        remote = RemoteBackend(second.url, secret)
        try:
            stream = remote.open_channel(SandboxHandle(sid, "docker", time.time() + 60))
            channel = Channel.connect(stream, launch.bundle(), timeout=60)
            try:
                assert channel.hello is not None
                assert channel.list_sessions(time.monotonic() + 30) == ()
            finally:
                channel.close()
        finally:
            remote.close()

        # The E2B face too: its control plane (the id in the path) and its data plane (the id
        # in a header) reach the replica that runs the sandbox.
        e2b = {"X-API-KEY": secret}
        connected = httpx.post(f"{second.url}/v2/sandboxes/{sid}/connect", json={}, headers=e2b, timeout=60)
        assert connected.status_code == 200, connected.text
        data = {
            "E2b-Sandbox-Id": sid,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": connected.json()["envdAccessToken"],
        }
        listed = httpx.post(
            f"{second.url}/filesystem.Filesystem/ListDir",
            json={"path": "/home/user"},
            headers=data,
            timeout=60,
        )
        assert listed.status_code == 200, listed.text
        assert "blob.bin" in {e["name"] for e in listed.json()["entries"]}
        assert b.delete(f"/v1/sandboxes/{sid}").status_code == 200
        assert a.get(f"/v1/sandboxes/{sid}").status_code == 404


def test_a_replica_restarted_on_its_host_reconciles_at_once(
    tmp_path: Path, postgres_server: Any, docker_client: Any
) -> None:
    """A replica killed and started again on the same host (a new pid) ends what its earlier run
    left at start: rows, holds and containers, long before --server-timeout (600 s here)."""
    database = postgres_server.create_database(
        f"restart_{os.getpid()}_{tmp_path.name[-12:]}".replace("-", "_")
    )
    store = TokenStore(tmp_path / "tokens.json")
    _, secret = store.create("t", Ceiling(max_sandboxes=4, max_memory=64 << 20))
    headers = {"Authorization": f"Bearer {secret}"}
    patient = ("--server-timeout", "600")
    killed = Replica(database, tmp_path / "tokens.json", tmp_path / "a.log", *patient)
    other = Replica(database, tmp_path / "tokens.json", tmp_path / "b.log", *patient)
    restarted: Replica | None = None
    try:
        made = httpx.post(f"{killed.url}/v1/sandboxes", json={"memory": "64m"}, headers=headers, timeout=60)
        assert made.status_code == 201, made.text
        killed.proc.send_signal(signal.SIGKILL)
        assert killed.proc.wait(10) == -signal.SIGKILL
        assert len(_containers(docker_client, killed.owner)) == 1
        restarted = Replica(database, tmp_path / "tokens.json", tmp_path / "c.log", *patient)
        # Ready means the database was opened, and with it the reconciliation done.
        assert not _containers(docker_client, killed.owner)
        engine = sa.create_engine(database.replace("postgresql://", "postgresql+psycopg://"))
        try:
            with engine.connect() as conn:
                row = conn.execute(
                    sa.text("SELECT end_reason FROM sandboxes WHERE sandbox_id = :s"),
                    {"s": made.json()["id"]},
                ).one()
                holds = conn.execute(sa.text("SELECT count(*) FROM holds")).scalar()
                servers = {f"{h}:{p}" for h, p in conn.execute(sa.text("SELECT host, pid FROM servers"))}
        finally:
            engine.dispose()
        assert row.end_reason == "lost" and holds == 0
        assert servers == {other.owner, restarted.owner}
    finally:
        killed.stop()
        other.stop()
        if restarted is not None:
            restarted.stop()


@pytest.fixture
def foreign(tmp_path: Path, postgres_server: Any) -> Iterator[tuple[Replica, Replica, str, str]]:
    """Two replicas and two tokens: the sandbox's owner and another one."""
    with _pair(tmp_path, postgres_server, "foreign") as (first, second, owner, other, _):
        yield first, second, owner, other


def test_the_relay_tells_no_one_but_the_owner_that_a_sandbox_exists(
    foreign: tuple[Replica, Replica, str, str], docker_client: Any
) -> None:
    """While the replica that runs a sandbox is down (killed, not yet swept), its owner asking
    another replica gets 503 ``replica_unavailable``; anyone else (another token, none, a wrong
    one) gets exactly the answer of an id that never existed, on the native API and the E2B
    control plane: the relay checks the credential before it relays."""
    doomed, survivor, owner, other = foreign
    made = httpx.post(
        f"{doomed.url}/v1/sandboxes",
        json={"memory": "64m"},
        headers={"Authorization": f"Bearer {owner}"},
        timeout=60,
    )
    assert made.status_code == 201, made.text
    sid, missing = made.json()["id"], "0123456789ab"

    def native(sandbox: str, credential: str | None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {credential}"} if credential else {}
        answer = httpx.get(f"{survivor.url}/v1/sandboxes/{sandbox}", headers=headers, timeout=30)
        return answer.status_code, answer.text.replace(sandbox, "<id>")

    def e2b(sandbox: str, credential: str | None) -> tuple[int, str]:
        headers = {"X-API-KEY": credential} if credential else {}
        answer = httpx.get(f"{survivor.url}/sandboxes/{sandbox}", headers=headers, timeout=30)
        return answer.status_code, answer.text.replace(sandbox, "<id>")

    assert native(sid, owner)[0] == 200 and e2b(sid, owner)[0] == 200  # relayed while it runs
    doomed.proc.send_signal(signal.SIGKILL)
    assert doomed.proc.wait(10) == -signal.SIGKILL
    # Judged only between two owner requests that both found the dead replica unswept.
    bracketed = False
    while not bracketed:
        before = native(sid, owner)[0]
        if before != 503:
            break  # swept already: nothing left to tell (fails below)
        answers = {
            (face.__name__, who): (face(sid, cred), face(missing, cred))
            for face in (native, e2b)
            for who, cred in (("other", other), ("none", None), ("wrong", "not-a-token"))
        }
        bracketed = native(sid, owner)[0] == 503 and e2b(sid, owner)[0] == 503
    assert bracketed, "the survivor swept the dead replica before the relay could be judged"
    for case, (live, never) in answers.items():
        assert live == never, (case, live, never)
        assert live[0] in (401, 404), (case, live)
    # The survivor ends the dead one's sandbox; nothing is left on the engine.
    wait_until(
        lambda: not _containers(docker_client, doomed.owner),
        "the dead replica's containers being removed by the survivor",
        within=TIMEOUT * 6 + 30,
    )
