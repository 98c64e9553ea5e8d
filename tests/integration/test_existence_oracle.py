"""No existence oracle: without the owner's credential, a live sandbox answers as one that never existed.

For every route family of the native API and of the E2B face (control plane, envd data plane,
code interpreter, ``/health``), a real server on loopback with the real engine (runc) is asked
about a live sandbox of alice by

- (a) bob, another tenant, with his own valid credentials (his API key, his sandbox's envd token),
- (b) a caller with no credential,
- (c) a caller with a wrong credential (an unknown key, a random envd token, a bad signature),

and each answer must equal, status, headers that tell anything and JSON body modulo the id, the
answer the same caller gets for (d) an id that does not exist.  Alice herself still gets the real
answer, and the calls the E2B face does not serve (501) answer 404 to everyone but her.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from agentnest.runtime.docker import base_image
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling, Tenant, TokenStore
from agentnest.server.thread import serve_in_thread

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.version_info < (3, 11), reason="the E2B face needs connectrpc (Python 3.11)"),
]

DOMAIN = "e2b.test"
#: The response headers that could tell one answer from another (the rest are the date, the length...).
TELLING = ("content-type", "www-authenticate", "retry-after", "allow", "x-next-token", "should-retry")
UNARY = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}


@dataclass
class World:
    url: str
    alice: str
    """alice's token secret (the raw secret is a valid E2B API key too)."""
    bob: str
    sandbox: dict[str, Any]
    """alice's live sandbox, as the E2B API created it (``sandboxID``, ``envdAccessToken``)."""
    bobs: dict[str, Any]
    """bob's live sandbox: his envd token is a valid one, of another sandbox."""

    @property
    def sid(self) -> str:
        return str(self.sandbox["sandboxID"])

    @property
    def missing(self) -> str:
        """An id of the same shape that no sandbox has."""
        return "0" * len(self.sid)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("oracle")
    store = TokenStore(root / "tokens.json")
    store.create_tenant(Tenant("team-a"))
    store.create_tenant(Tenant("team-b"))
    _, alice = store.create("alice", Ceiling(max_sandboxes=4, max_timeout=600.0), tenant="team-a")
    _, bob = store.create("bob", Ceiling(max_sandboxes=4, max_timeout=600.0), tenant="team-b")
    settings = ServerSettings(
        tokens=store, backends={"docker": "docker"}, image=base_image(), e2b_domain=DOMAIN
    )
    with serve_in_thread(create_app(settings)) as url:
        made = []
        for key in (alice, bob):
            r = httpx.post(
                url + "/v2/sandboxes",
                headers={"X-API-KEY": key},
                json={"templateID": "base", "timeout": 300},
                timeout=120,
            )
            assert r.status_code == 201, r.text
            made.append(r.json())
        yield World(url, alice, bob, made[0], made[1])


def answer(world: World, method: str, path: str, headers: dict[str, str], body: Any, sid: str) -> Any:
    """What a caller can observe of one answer, with the asked id written as ``{id}``."""
    if isinstance(body, bytes):
        kwargs: dict[str, Any] = {"content": body}
    elif body is not None:
        kwargs = {"json": body}
    else:
        kwargs = {}
    with httpx.Client(base_url=world.url, timeout=60) as c:
        r = c.request(method, path, headers=headers, **kwargs)
    text = r.text.replace(sid, "{id}")
    try:
        content: Any = json.loads(text)
    except ValueError:
        content = text
    telling = {k: r.headers[k].replace(sid, "{id}") for k in TELLING if k in r.headers}
    return r.status_code, telling, content


# -- the native API --------------------------------------------------------------------------

#: (method, path, body, status alice gets; None: not asked of alice: it ends or holds the sandbox)
NATIVE: list[tuple[str, str, Any, int | None]] = [
    ("GET", "/v1/sandboxes/{id}", None, 200),
    ("DELETE", "/v1/sandboxes/{id}", None, None),
    ("POST", "/v1/sandboxes/{id}/extend", {"seconds": 1}, 200),
    ("GET", "/v1/sandboxes/{id}/logs", None, 200),
    ("GET", "/v1/sandboxes/{id}/network-log", None, 200),
    ("POST", "/v1/sandboxes/{id}/keepalive", None, 200),
    ("GET", "/v1/sandboxes/{id}/lease", None, None),
    ("POST", "/v1/sandboxes/{id}/fork", {}, None),
    ("POST", "/v1/sandboxes/{id}/exec", {"shell": "true"}, 200),
    ("POST", "/v1/sandboxes/{id}/exec/stream", {"shell": "true"}, 200),
    ("GET", "/v1/sandboxes/{id}/files", None, 200),
    ("GET", "/v1/sandboxes/{id}/files/nothing-here.txt", None, 404),
    ("PUT", "/v1/sandboxes/{id}/files/new.txt", b"x", 204),
    ("DELETE", "/v1/sandboxes/{id}/files/new.txt", None, 204),
    ("GET", "/v1/sandboxes/{id}/snapshot", None, None),
    ("POST", "/v1/sandboxes/{id}/restore", b"not a tar", None),
    ("POST", "/v1/sandboxes/{id}/sessions", None, None),
    ("POST", "/v1/sandboxes/{id}/sessions/s1/run", {"code": "1"}, 404),
    ("DELETE", "/v1/sandboxes/{id}/sessions/s1", None, 404),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "owner"), NATIVE, ids=[f"{m} {p}" for m, p, _, _ in NATIVE]
)
def test_native_api_tells_nothing(world: World, method: str, path: str, body: Any, owner: int | None) -> None:
    callers = {
        "another tenant": {"Authorization": f"Bearer {world.bob}"},
        "no credential": {},
        "a wrong credential": {"Authorization": "Bearer ant_000000000000_" + "x" * 43},
    }
    for who, headers in callers.items():
        live = answer(world, method, path.format(id=world.sid), headers, body, world.sid)
        never = answer(world, method, path.format(id=world.missing), headers, body, world.missing)
        assert live == never, who
        assert live[0] in (401, 404), (who, live)
    if owner is not None:
        mine = answer(
            world,
            method,
            path.format(id=world.sid),
            {"Authorization": f"Bearer {world.alice}"},
            body,
            world.sid,
        )
        assert mine[0] == owner, mine


def test_native_channel_tells_nothing(world: World) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    def refusal(sandbox_id: str, headers: dict[str, str]) -> int:
        url = "ws" + world.url.removeprefix("http") + f"/v1/sandboxes/{sandbox_id}/channel"
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers=headers, open_timeout=30).close()
        return int(refused.value.response.status_code)

    for headers in ({"Authorization": f"Bearer {world.bob}"}, {}, {"Authorization": "Bearer nope"}):
        assert refusal(world.sid, headers) == refusal(world.missing, headers)


# -- the E2B control plane -------------------------------------------------------------------

#: (method, path, body, status alice gets; None: not asked of alice)
CONTROL: list[tuple[str, str, Any, int | None]] = [
    ("GET", "/sandboxes/{id}", None, 200),
    ("DELETE", "/sandboxes/{id}", None, None),
    ("POST", "/sandboxes/{id}/timeout", {"timeout": 300}, 204),
    ("POST", "/sandboxes/{id}/connect", {"timeout": 10}, 200),
    ("POST", "/v2/sandboxes/{id}/connect", {"timeout": 10}, 200),
    ("POST", "/sandboxes/{id}/pause", None, None),
    ("POST", "/sandboxes/{id}/resume", {}, None),
    # Not served: 501 for alice, and for everyone else the 404 of an id that is not theirs.
    ("GET", "/sandboxes/{id}/metrics", None, 501),
    ("POST", "/sandboxes/{id}/snapshots", {}, 501),
    ("POST", "/sandboxes/{id}/fork", {}, 501),
    ("PUT", "/sandboxes/{id}/network", {}, 501),
    ("POST", "/sandboxes/{id}/refreshes", {}, 501),
    ("GET", "/v2/sandboxes/{id}/logs", None, 501),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "owner"), CONTROL, ids=[f"{m} {p}" for m, p, _, _ in CONTROL]
)
def test_e2b_control_plane_tells_nothing(
    world: World, method: str, path: str, body: Any, owner: int | None
) -> None:
    callers = {
        "another tenant": {"X-API-KEY": world.bob},
        "no credential": {},
        "a wrong credential": {"X-API-KEY": "e2b_" + "00" * 20},
    }
    for who, headers in callers.items():
        live = answer(world, method, path.format(id=world.sid), headers, body, world.sid)
        never = answer(world, method, path.format(id=world.missing), headers, body, world.missing)
        assert live == never, who
        assert live[0] == (404 if who == "another tenant" else 401), (who, live)
    if owner is not None:
        mine = answer(world, method, path.format(id=world.sid), {"X-API-KEY": world.alice}, body, world.sid)
        assert mine[0] == owner, mine


# -- the E2B data plane ----------------------------------------------------------------------

#: (method, path, port, body, extra headers, status alice gets; None: not asked of alice)
DATA: list[tuple[str, str, int, Any, dict[str, str], int | None]] = [
    ("GET", "/health", 49983, None, {}, 204),
    ("GET", "/health", 49999, None, {}, 200),
    ("POST", "/process.Process/List", 49983, {}, UNARY, 200),
    ("POST", "/process.Process/NoSuchMethod", 49983, {}, UNARY, 404),
    ("POST", "/filesystem.Filesystem/Stat", 49983, {"path": "/home/user"}, UNARY, 200),
    ("GET", "/files?path=/home/user/nothing-here.txt", 49983, None, {}, 404),
    ("POST", "/files?path=/home/user/up.txt", 49983, b"x", {"Content-Type": "application/octet-stream"}, 200),
    ("PUT", "/files", 49983, None, {}, 405),
    ("GET", "/contexts", 49999, None, {}, 200),
    ("DELETE", "/contexts/no-such-context", 49999, None, {}, 404),
    ("POST", "/execute", 49999, {"code": "1 + 1"}, {}, 200),
    ("GET", "/health", 1234, None, {}, 502),  # the owner is told the port is not open
]


def _data_headers(sandbox_id: str, port: int, token: str | None, extra: dict[str, str]) -> dict[str, str]:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port), **extra}
    if token is not None:
        headers["X-Access-Token"] = token
    return headers


@pytest.mark.parametrize(
    ("method", "path", "port", "body", "extra", "owner"),
    DATA,
    ids=[f"{m} {p} :{port}" for m, p, port, _, _, _ in DATA],
)
def test_e2b_data_plane_tells_nothing(
    world: World, method: str, path: str, port: int, body: Any, extra: dict[str, str], owner: int | None
) -> None:
    tokens = {
        "another sandbox's token": world.bobs["envdAccessToken"],
        "no credential": None,
        "a wrong credential": "x" * 43,
    }
    # One answer for all of them: the data plane's credential is per sandbox, so a wrong one
    # and an id that does not exist are the same thing to the caller.
    never = answer(world, method, path, _data_headers(world.missing, port, None, extra), body, world.missing)
    assert never[0] == 502 and "was not found" in never[2]["message"], never
    for who, token in tokens.items():
        for sandbox_id in (world.sid, world.missing):
            got = answer(world, method, path, _data_headers(sandbox_id, port, token, extra), body, sandbox_id)
            assert got == never, (who, sandbox_id == world.sid)
    if owner is not None:
        headers = _data_headers(world.sid, port, world.sandbox["envdAccessToken"], extra)
        mine = answer(world, method, path, headers, body, world.sid)
        assert mine[0] == owner, mine
        if owner == 502:
            assert "port 1234 is not open" in mine[2]["message"]


def test_e2b_data_plane_by_host_name_and_signature_tells_nothing(world: World) -> None:
    """The same with the sandbox in the host name (``--e2b-domain``) and a ``/files`` signature."""

    def host(sandbox_id: str, token: str | None) -> Any:
        headers = {"Host": f"49983-{sandbox_id}.{DOMAIN}"}
        if token is not None:
            headers["X-Access-Token"] = token
        return answer(world, "GET", "/health", headers, None, sandbox_id)

    never = host(world.missing, None)
    assert never[0] == 502
    for token in (None, "x" * 43, world.bobs["envdAccessToken"]):
        assert host(world.sid, token) == never
    assert host(world.sid, world.sandbox["envdAccessToken"])[0] == 204
    signed = "/files?path=/home/user/a.txt&username=user&signature=v1_forged"
    live = answer(world, "GET", signed, _data_headers(world.sid, 49983, None, {}), None, world.sid)
    gone = answer(world, "GET", signed, _data_headers(world.missing, 49983, None, {}), None, world.missing)
    assert live == gone and live[0] == 502
