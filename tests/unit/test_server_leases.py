"""Leases in ``agentnest serve``: idle and session leases reap a sandbox a client stopped using or
holding, renewals and open connections keep it, and its tenant's share is free again.  Over real
HTTP on loopback (uvicorn), local agent processes behind the server (no engine)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_fakes import IMAGE, LocalBackend, auth, make_settings

from agentnest import MemoryObserver, Sandbox
from agentnest._core import core_of
from agentnest.errors import ConfigurationError
from agentnest.events import EventType
from agentnest.runtime.remote import RemoteBackend
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling
from agentnest.server.service import Service
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)

GRACE = 2.0  # a loaded machine may take a second between the create and the lease stream
IDLE = 0.6


@pytest.fixture
def events() -> MemoryObserver:
    return MemoryObserver()


@pytest.fixture
def live(tmp_path: Path, events: MemoryObserver) -> Iterator[tuple[str, Service, str]]:
    backend = LocalBackend(tmp_path / "sandboxes")
    backend.root.mkdir()
    settings: ServerSettings = make_settings(
        tmp_path, backend, reap_interval=0.1, session_grace=GRACE, observers=(events,)
    )
    _, secret = settings.tokens.create("t", Ceiling(images=(IMAGE,), max_sandboxes=4))
    app = create_app(settings)
    try:
        with serve_in_thread(app) as url:
            yield url, app.state.service, secret
        assert backend.live_agents() == 0
    finally:
        backend.kill_all()


def _client(url: str, secret: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers=auth(secret), timeout=30)


def test_an_idle_lease_lapses_without_use_and_its_tenant_gets_the_room_back(
    live: tuple[str, Service, str], events: MemoryObserver
) -> None:
    url, service, secret = live
    with _client(url, secret) as http:
        # Timed from before the request: the idle clock starts while the server answers it, so
        # a slow answer on a loaded machine must not shorten the idle time measured here.
        started = time.monotonic()
        made = http.post("/v1/sandboxes", json={"lease": "idle", "idle_timeout": IDLE}).json()
        assert made["lease"]["kind"] == "idle" and made["lease"]["idle_timeout"] == IDLE
        assert made["lease"]["expires_at"] <= time.time() + IDLE + 0.5
        wait_until(lambda: made["id"] not in service.entries, "the idle sandbox being reaped", within=10)
        assert time.monotonic() - started >= IDLE - 0.1
        assert http.get(f"/v1/sandboxes/{made['id']}").status_code == 404
    assert service.admission.holdings("default").sandboxes == 0
    lapsed = [e for e in events.events if e.type is EventType.LEASE_EXPIRED]
    assert [e.sandbox_id for e in lapsed] == [made["id"]]
    assert lapsed[0].attributes["lease"] == "idle" and "no use for 0.6s" in lapsed[0].attributes["reason"]
    assert service.metrics is not None
    assert (
        'agentnest_lease_expiries_total{lease="idle",tenant="default"} 1.0'
        in service.metrics.render().decode()
    )


def test_keepalives_and_calls_renew_an_idle_lease_and_a_running_command_holds_it(
    live: tuple[str, Service, str],
) -> None:
    url, service, secret = live
    # A longer idle timeout than the other tests': a keepalive late by a loaded machine's
    # scheduling (seen: more than 0.4 s) must not lapse a lease the client is renewing.
    idle = 2.0
    with _client(url, secret) as http:
        sandbox = http.post("/v1/sandboxes", json={"lease": "idle", "idle_timeout": idle}).json()["id"]
        until = time.monotonic() + 2 * idle
        while time.monotonic() < until:  # renewals paced at a quarter of the idle timeout
            renewed = http.post(f"/v1/sandboxes/{sandbox}/keepalive")
            assert renewed.status_code == 200 and renewed.json()["kind"] == "idle"
            time.sleep(idle / 4)
        ran = http.post(f"/v1/sandboxes/{sandbox}/exec", json={"shell": f"sleep {1.5 * idle}; echo done"})
        assert ran.json()["stdout"] == "done\n", "a command longer than the idle timeout runs to its end"
        assert sandbox in service.entries
    wait_until(lambda: sandbox not in service.entries, "the sandbox lapsing once unused", within=10)


def test_a_session_lease_lives_while_a_lease_stream_holds_it_and_ends_after_the_grace(
    live: tuple[str, Service, str],
) -> None:
    url, service, secret = live
    with _client(url, secret) as http:
        sandbox = http.post("/v1/sandboxes", json={"lease": "session"}).json()["id"]
        seen: list[str] = []
        with http.stream("GET", f"/v1/sandboxes/{sandbox}/lease") as held:
            lines = held.iter_lines()
            assert next(lines) == "event: lease"
            lease = json.loads(next(lines).removeprefix("data: "))
            assert lease["kind"] == "session" and lease["holders"] == 1 and lease["expires_at"] is None
            held_since = time.monotonic()
            # Held for several graces: it stays.
            while time.monotonic() < held_since + 3 * GRACE:
                assert http.get(f"/v1/sandboxes/{sandbox}").status_code == 200
                time.sleep(GRACE / 3)
            seen.append("held")
        closed = time.monotonic()
        wait_until(
            lambda: sandbox not in service.entries, "the unheld session sandbox being reaped", within=10
        )
        assert time.monotonic() - closed >= GRACE - 0.2
    assert seen == ["held"] and service.admission.held.sandboxes == 0


def test_a_session_lease_nobody_attaches_to_is_reaped_after_the_grace(live: tuple[str, Service, str]) -> None:
    url, service, secret = live
    with _client(url, secret) as http:
        sandbox = http.post("/v1/sandboxes", json={"lease": "session"}).json()["id"]
    wait_until(
        lambda: sandbox not in service.entries, "the never-held session sandbox being reaped", within=10
    )


def test_the_lease_stream_ends_when_the_sandbox_is_destroyed(live: tuple[str, Service, str]) -> None:
    url, _, secret = live
    with _client(url, secret) as http:
        sandbox = http.post("/v1/sandboxes", json={"lease": "session"}).json()["id"]
        names: list[str] = []
        with http.stream("GET", f"/v1/sandboxes/{sandbox}/lease") as held:
            for line in held.iter_lines():
                if line.startswith("event: "):
                    names.append(line[7:])
                    if line == "event: lease":
                        threading.Thread(target=lambda: _delete(url, secret, sandbox)).start()
        assert names == ["lease", "ended"]


def _delete(url: str, secret: str, sandbox: str) -> None:
    with _client(url, secret) as http:
        http.delete(f"/v1/sandboxes/{sandbox}")


def test_the_remote_backend_s_session_lease_ends_when_its_channel_closes(
    live: tuple[str, Service, str],
) -> None:
    url, service, secret = live
    remote = RemoteBackend(url, secret, lease="session")
    try:
        sandbox = Sandbox(IMAGE, timeout=60, backend=remote)
        assert sandbox.exec_shell("echo hi").stdout == "hi\n"
        time.sleep(3 * GRACE)  # longer than the grace, while the channel is open
        assert sandbox.id in service.entries and sandbox.exec_shell("echo still").stdout == "still\n"
        # The client "dies": its channel closes without a destroy.
        channel = core_of(sandbox).channel
        assert channel is not None
        channel.close()
        wait_until(lambda: sandbox.id not in service.entries, "the orphaned sandbox being reaped", within=10)
    finally:
        remote.close()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"lease": "deadline", "idle_timeout": 5}, "idle_timeout goes with lease 'idle' only"),
        ({"lease": "forever"}, "lease"),
        ({"lease": "idle", "idle_timeout": 0}, "idle_timeout"),
    ],
)
def test_bad_lease_requests_are_refused_with_the_field_named(
    live: tuple[str, Service, str], body: dict[str, object], needle: str
) -> None:
    url, service, secret = live
    with _client(url, secret) as http:
        refused = http.post("/v1/sandboxes", json=body)
    assert refused.status_code in (400, 422) and needle in refused.text
    assert not service.entries


def test_the_remote_backend_checks_its_lease_options() -> None:
    with pytest.raises(ConfigurationError, match="lease='forever'"):
        RemoteBackend("http://127.0.0.1:1", "ant_x", lease="forever")
    with pytest.raises(ConfigurationError, match="idle_timeout goes with"):
        RemoteBackend("http://127.0.0.1:1", "ant_x", idle_timeout=3)
