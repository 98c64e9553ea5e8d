"""The E2B face on the wire, on the real engine (runc), with a raw HTTP client: what the stock SDKs
never send (bad keys, other tenants' ids, malformed Connect messages, oversized uploads), and what
policy must still do on this path (redaction in streamed output, audit events with the tenant,
a shortened lifetime reaping the sandbox).  tests/e2b drives the same server with the stock SDKs."""

from __future__ import annotations

import gzip
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentnest import JsonLogObserver, MemoryObserver
from agentnest.events import EventType
from agentnest.runtime.docker import base_image
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling, Tenant, TokenStore
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(240),
    pytest.mark.skipif(sys.version_info < (3, 11), reason="the E2B face needs connectrpc (Python 3.11)"),
]


class Live:
    def __init__(self, url: str, alice: str, bob: str, events: MemoryObserver, audit: Path) -> None:
        self.url = url
        self.alice = alice
        self.bob = bob
        self.events = events
        self.audit = audit

    def api(self, key: str | None) -> httpx.Client:
        headers = {} if key is None else {"X-API-KEY": key}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def create(self, key: str, **body: Any) -> dict[str, Any]:
        with self.api(key) as c:
            r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120, **body})
        assert r.status_code == 201, r.text
        return dict(r.json())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    from agentnest.server.e2b import e2b_key

    root = tmp_path_factory.mktemp("e2bwire")
    store = TokenStore(root / "tokens.json")
    store.create_tenant(Tenant("team-a"))
    _, alice = store.create("alice", Ceiling(max_sandboxes=6, max_timeout=600.0), tenant="team-a")
    _, bob = store.create("bob", Ceiling(max_sandboxes=2, max_timeout=600.0))
    events = MemoryObserver()
    audit = root / "audit.jsonl"
    settings = ServerSettings(
        tokens=store,
        backends={"docker": "docker"},
        image=base_image(),
        observers=(events, JsonLogObserver(audit)),
        max_upload_bytes=4 * 1024 * 1024,
        database=f"sqlite:///{root / 'manager.db'}",
    )
    with serve_in_thread(create_app(settings)) as url:
        yield Live(url, e2b_key(alice), bob, events, audit)


def envelope(doc: dict[str, Any], flags: int = 0) -> bytes:
    body = json.dumps(doc).encode()
    return struct.pack(">BI", flags, len(body)) + body


def frames(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    out = []
    while data:
        flags, size = struct.unpack(">BI", data[:5])
        out.append((flags, json.loads(data[5 : 5 + size])))
        data = data[5 + size :]
    return out


def data_client(live: Live, sandbox: dict[str, Any], token: str | None = None) -> httpx.Client:
    headers = {
        "E2b-Sandbox-Id": sandbox["sandboxID"],
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": token if token is not None else sandbox["envdAccessToken"],
    }
    return httpx.Client(base_url=live.url, headers=headers, timeout=60)


def start(c: httpx.Client, cmd: str, **extra: Any) -> list[tuple[int, dict[str, Any]]]:
    r = c.post(
        "/process.Process/Start",
        content=envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], **extra}}),
        headers={"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"},
    )
    assert r.status_code == 200, r.text
    return frames(r.content)


def test_keys_tenants_and_ids_that_are_not_yours(live: Live) -> None:
    with live.api(None) as c:
        r = c.get("/v2/sandboxes")
        assert r.status_code == 401 and r.json()["code"] == 401 and "X-API-KEY" in r.json()["message"]
    wrong = "e2b_" + "00" * 20
    with live.api(wrong) as c:
        r = c.post("/v2/sandboxes", json={"templateID": "base"})
        assert r.status_code == 401 and set(r.json()) == {"code", "message"}
    mine = live.create(live.alice)
    sid = mine["sandboxID"]
    with live.api(live.bob) as bob:  # the raw secret works as a key too
        assert bob.get("/v2/sandboxes").json() == []
        for method, path in (
            ("GET", f"/sandboxes/{sid}"),
            ("DELETE", f"/sandboxes/{sid}"),
            ("POST", f"/sandboxes/{sid}/timeout"),
            ("POST", f"/v2/sandboxes/{sid}/connect"),
            ("POST", f"/sandboxes/{sid}/pause"),
        ):
            r = bob.request(method, path, json={"timeout": 30})
            # Exactly as an id that never existed: nothing tells bob it does.
            assert r.status_code == 404, (method, path, r.text)
            never = bob.request(method, path.replace(sid, "0" * 12), json={"timeout": 30})
            assert never.status_code == 404 and never.json()["message"] == r.json()["message"].replace(
                sid, "0" * 12
            )
    # The data plane: another sandbox's token is answered as an id that is gone: "not found".
    other = live.create(live.alice)
    with data_client(live, mine, token=other["envdAccessToken"]) as c:
        r = c.post("/filesystem.Filesystem/Stat", json={"path": "/home/user"})
        assert r.status_code == 502 and "was not found" in r.json()["message"]
    with data_client(live, {**mine, "sandboxID": "0" * 12}) as c:
        r = c.get("/health")
        assert r.status_code == 502 and "was not found" in r.json()["message"]
    with data_client(live, mine) as c:
        assert c.get("/health").status_code == 204
    with live.api(live.alice) as c:
        assert c.delete(f"/sandboxes/{other['sandboxID']}").status_code == 204
        assert c.delete(f"/sandboxes/{other['sandboxID']}").status_code == 404
    with data_client(live, other) as c:
        assert c.get("/health").status_code == 502
    # Nothing of a key, right or wrong, reaches the audit log.
    text = live.audit.read_text()
    assert wrong[4:20] not in text and live.alice[4:40] not in text and live.bob[4:20] not in text
    with live.api(live.alice) as c:
        c.delete(f"/sandboxes/{sid}")


def test_malformed_requests_get_the_errors_clients_expect(live: Live) -> None:
    with live.api(live.alice) as c:
        r = c.post("/v2/sandboxes", json={"templateID": "no-such-template"})
        assert (
            r.status_code == 400
            and "no-such-template" in r.json()["message"]
            and "base" in r.json()["message"]
        )
        r = c.post("/v2/sandboxes", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["code"] == 400
        r = c.post("/v2/sandboxes", json={"templateID": "base", "autoPause": True})
        assert r.status_code == 400 and "autoPause" in r.json()["message"]
        r = c.get("/v2/sandboxes", params={"limit": "0"})
        assert r.status_code == 400
        assert c.get("/sandboxes/x/metrics").status_code == 404  # 501 only for her own sandbox
        old = c.get("/v2/sandboxes", headers={"User-Agent": "e2b-python-sdk/2.20.1"})
        assert (
            old.status_code == 400 and "2.20.1" in old.json()["message"] and "2.35.0" in old.json()["message"]
        )
    with live.api(None) as c:
        assert c.get("/sandboxes/x/metrics").status_code == 401  # nothing told before the key
    sandbox = live.create(live.alice)
    with data_client(live, sandbox) as c:
        unary = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        r = c.post("/filesystem.Filesystem/Stat", content=b"{", headers=unary)
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
        r = c.post("/filesystem.Filesystem/ListDir", json={"path": "/home/user", "depth": -3}, headers=unary)
        assert r.status_code == 400 and "depth" in r.json()["message"]
        r = c.post("/filesystem.Filesystem/NoSuchMethod", json={}, headers=unary)
        assert r.status_code == 404
        r = c.post("/filesystem.Filesystem/Stat", content=b"x", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        # A stream whose envelope lies about its length, and one with a malformed message.
        stream = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        r = c.post("/process.Process/Start", content=struct.pack(">BI", 0, 1000) + b"{}", headers=stream)
        end = frames(r.content)[-1]
        assert end[0] == 2 and end[1]["error"]["code"] in ("invalid_argument", "internal", "unknown")
        r = c.post("/process.Process/Start", content=envelope({"process": {"cmd": 7}}), headers=stream)
        assert frames(r.content)[-1][1]["error"]["code"] == "invalid_argument"
        # Paths outside the workspace, a user that is not the sandbox's.
        r = c.post("/filesystem.Filesystem/Stat", json={"path": "/etc/passwd"}, headers=unary)
        assert r.status_code == 403 and "outside the workspace" in r.json()["message"]
        r = c.get("/files", params={"path": "/etc/passwd"})
        assert r.status_code == 403
        r = c.get("/files", params={"path": "x", "username": "root"})
        assert r.status_code == 401 and "root" in r.json()["message"]
        # Uploads: over the server's upload limit, a gzip bomb, a missing file.
        octets = {"Content-Type": "application/octet-stream"}
        r = c.post("/files", params={"path": "big"}, content=b"x" * (5 * 1024 * 1024), headers=octets)
        assert r.status_code == 413
        bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))
        r = c.post(
            "/files", params={"path": "bomb"}, content=bomb, headers={**octets, "Content-Encoding": "gzip"}
        )
        assert r.status_code == 413
        assert c.get("/files", params={"path": "missing"}).status_code == 404
        # Nothing of it was written; the sandbox works on.
        listed = c.post("/filesystem.Filesystem/ListDir", json={"path": "/home/user"}, headers=unary)
        assert listed.status_code == 200 and listed.json().get("entries", []) == []
        out = start(c, "echo alive")
        assert any(f[1].get("event", {}).get("data") for f in out)
    with live.api(live.alice) as c:
        c.delete(f"/sandboxes/{sandbox['sandboxID']}")


def test_policy_holds_on_the_e2b_path(live: Live) -> None:
    """A sandbox made natively with a secret, reached through E2B: output redacted, events audited."""
    from agentnest.server.e2b.state import secret_of

    secret = "s3cr3t-value-" + "q" * 12
    native = {"Authorization": f"Bearer {secret_of(live.alice)}"}
    with httpx.Client(base_url=live.url, headers=native, timeout=120) as c:
        r = c.post("/v1/sandboxes", json={"timeout": 120, "secrets": {"TOKEN": secret}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
    with live.api(live.alice) as c:
        r = c.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 60})
        assert r.status_code == 200, r.text
        sandbox = r.json()
    with data_client(live, sandbox) as c:
        out = start(c, 'echo "token=$TOKEN"; echo "$TOKEN" >&2')
    text = b"".join(
        __import__("base64").b64decode(v)
        for _, doc in out
        for k, v in doc.get("event", {}).get("data", {}).items()
        if k in ("stdout", "stderr")
    ).decode()
    assert "token=[REDACTED]" in text and secret not in text
    ends = [doc["event"]["end"] for _, doc in out if "end" in doc.get("event", {})]
    assert ends and ends[0].get("exitCode", 0) == 0
    # The command is in the audit history, under the token's tenant, as the E2B client sent it.
    with httpx.Client(base_url=live.url, headers=native, timeout=60) as c:
        page = c.get(
            "/v1/audit", params={"sandbox": sid, "type": EventType.EXEC_STARTED.value, "wait": 10}
        ).json()
    assert page["events"], page
    event = page["events"][-1]
    assert event["tenant"] == "team-a" and "echo" in json.dumps(event["data"])
    assert secret not in live.audit.read_text()
    with live.api(live.alice) as c:
        c.delete(f"/sandboxes/{sid}")


def test_lists_page_and_a_shortened_lifetime_ends_the_sandbox(live: Live) -> None:
    ids = {live.create(live.alice, metadata={"batch": "p"})["sandboxID"] for _ in range(3)}
    with live.api(live.alice) as c:
        seen: list[str] = []
        params: dict[str, str] = {"limit": "2", "metadata": "batch=p"}
        while True:
            r = c.get("/v2/sandboxes", params=params)
            assert r.status_code == 200
            seen += [s["sandboxID"] for s in r.json()]
            token = r.headers.get("X-Next-Token")
            if not token:
                break
            params["nextToken"] = token
        assert sorted(seen) == sorted(ids) and len(seen) == 3
        assert c.get("/v2/sandboxes", params={"metadata": "batch=other"}).json() == []
        victim = sorted(ids)[0]
        assert c.post(f"/sandboxes/{victim}/timeout", json={"timeout": 1}).status_code == 204
        wait_until(lambda: c.get(f"/sandboxes/{victim}").status_code == 404, "the sandbox to end", within=30)
        left = {s["sandboxID"] for s in c.get("/v2/sandboxes").json()}
        assert victim not in left and ids - {victim} <= left
        for sid in ids - {victim}:
            c.delete(f"/sandboxes/{sid}")
    stopped = [
        e for e in live.events.events if e.sandbox_id == victim and e.type == EventType.SANDBOX_DESTROYED
    ]
    assert stopped, "the reaper destroyed it"


def test_stream_input_feeds_a_running_command(live: Live) -> None:
    """StreamInput (client streaming: a start event naming the process, then data events), then
    CloseStdin: the command reads it all and ends."""
    import base64
    import threading

    sandbox = live.create(live.alice)
    stream_headers = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    seen: list[tuple[int, dict[str, Any]]] = []
    started = threading.Event()

    with data_client(live, sandbox) as c:

        def run() -> None:
            body = envelope({"process": {"cmd": "/bin/cat", "args": []}, "stdin": True})
            with c.stream("POST", "/process.Process/Start", content=body, headers=stream_headers) as r:
                buffer = b""
                for chunk in r.iter_bytes():
                    buffer += chunk
                    while len(buffer) >= 5:
                        size = struct.unpack(">I", buffer[1:5])[0]
                        if len(buffer) < 5 + size:
                            break
                        seen.append((buffer[0], json.loads(buffer[5 : 5 + size])))
                        buffer = buffer[5 + size :]
                        started.set()

        reader = threading.Thread(target=run)
        reader.start()
        assert started.wait(30)
        pid = seen[0][1]["event"]["start"]["pid"]
        messages: list[dict[str, Any]] = [
            {"start": {"process": {"pid": pid}}},
            {"data": {"input": {"stdin": base64.b64encode(b"one\n").decode()}}},
            {"keepalive": {}},
            {"data": {"input": {"stdin": base64.b64encode(b"two\n").decode()}}},
        ]
        r = c.post(
            "/process.Process/StreamInput",
            content=b"".join(envelope(m) for m in messages),
            headers=stream_headers,
        )
        assert r.status_code == 200 and frames(r.content)[-1] == (2, {}), r.content
        unary = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        closed = c.post("/process.Process/CloseStdin", json={"process": {"pid": pid}}, headers=unary)
        assert closed.status_code == 200, closed.text
        reader.join(30)
        assert not reader.is_alive()
    out = b"".join(
        base64.b64decode(doc["event"]["data"]["stdout"])
        for _, doc in seen
        if "data" in doc.get("event", {}) and "stdout" in doc["event"]["data"]
    )
    assert out == b"one\ntwo\n"
    ends = [doc["event"]["end"] for _, doc in seen if "end" in doc.get("event", {})]
    assert len(ends) == 1 and ends[0].get("exitCode", 0) == 0  # 0 may be left out (protobuf-JSON)
    assert ends[0]["exited"] is True and ends[0]["status"] == "exit status 0"
    with live.api(live.alice) as api:
        api.delete(f"/sandboxes/{sandbox['sandboxID']}")


def test_server_approval_rules_hold_on_every_api(tmp_path: Path) -> None:
    """`serve --approvals`: an E2B command, a native exec and an E2B file write the rules refuse
    are refused (and nothing ran); what they allow runs; the raw agent channel is refused."""
    import websockets.sync.client

    from agentnest.approvals import ApprovalRule, RuleApprover
    from agentnest.server.e2b import e2b_key

    store = TokenStore(tmp_path / "tokens.json")
    _, secret = store.create("ops", Ceiling(max_sandboxes=2, max_timeout=300.0))
    rules = RuleApprover(
        (
            ApprovalRule(action="deny", kind="exec", match="*forbidden*"),
            ApprovalRule(action="deny", kind="file.write", match="/workspace/locked/*"),
        ),
        default="allow",
    )
    settings = ServerSettings(
        tokens=store, backends={"docker": "docker"}, image=base_image(), approvals=rules
    )
    with serve_in_thread(create_app(settings)) as url:
        live = Live(url, e2b_key(secret), secret, MemoryObserver(), tmp_path / "none")
        sandbox = live.create(live.alice)
        with data_client(live, sandbox) as c:
            refused = start(c, "echo forbidden > /workspace/marker")
            assert refused[-1][1]["error"]["code"] == "permission_denied", refused
            allowed = start(c, "ls /workspace/marker || echo absent")
            text = "".join(
                __import__("base64").b64decode(d["event"]["data"]["stdout"]).decode()
                for _, d in allowed
                if "stdout" in d.get("event", {}).get("data", {})
            )
            assert "absent" in text  # the refused command never ran
            octets = {"Content-Type": "application/octet-stream"}
            w = c.post("/files", params={"path": "locked/x"}, content=b"x", headers=octets)
            assert w.status_code == 403, w.text
            assert (
                c.post("/files", params={"path": "open/x"}, content=b"x", headers=octets).status_code == 200
            )
        native = {"Authorization": f"Bearer {secret}"}
        with httpx.Client(base_url=url, headers=native, timeout=60) as n:
            r = n.post(f"/v1/sandboxes/{sandbox['sandboxID']}/exec", json={"shell": "echo forbidden"})
            assert r.status_code == 403 and r.json()["code"] == "policy_denied", r.text
        ws_url = url.replace("http://", "ws://") + f"/v1/sandboxes/{sandbox['sandboxID']}/channel"
        from websockets.exceptions import ConnectionClosed

        with (
            pytest.raises(ConnectionClosed) as closed,
            websockets.sync.client.connect(ws_url, additional_headers=native) as ws,
        ):
            ws.recv(timeout=10)
        assert "approval" in str(closed.value)
