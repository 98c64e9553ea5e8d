"""Malformed input on every surface of ``agentnest serve``, one table, on the real engine (runc).

Each row sends one bad request to a real server over loopback: the native API, the admin API, the
E2B control plane, envd's Connect RPCs, ``/files``, ``/execute`` and ``/contexts``.  Each asserts
the status, the JSON reason in the surface's own shape (what was wrong and how to fix it), then
that nothing changed (both sandboxes still run a command and see their files and environment as
before, no sandbox or code context was added) and that the server is healthy (that command is the
following good request, and no ERROR record, no traceback, reached the log).
"""

from __future__ import annotations

import base64
import json
import logging
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from agentnest.runtime.docker import base_image
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.auth import Ceiling, TokenStore
from agentnest.server.thread import serve_in_thread

pytestmark = [
    pytest.mark.docker,
    pytest.mark.timeout(600),
    pytest.mark.skipif(sys.version_info < (3, 11), reason="the E2B face needs connectrpc (Python 3.11)"),
]

NAN, INF = float("nan"), float("inf")
#: The content type of Connect's server-stream RPCs (E2B's Start).
_STREAM = "application/connect+json"


def envelope(doc: Any) -> bytes:
    body = json.dumps(doc).encode()
    return struct.pack(">BI", 0, len(body)) + body


def frames(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    out = []
    while data:
        flags, size = struct.unpack(">BI", data[:5])
        out.append((flags, json.loads(data[5 : 5 + size])))
        data = data[5 + size :]
    return out


@dataclass(frozen=True)
class Case:
    """One bad request and what must come back.

    ``to``: ``native`` (bearer token), ``e2b`` (X-API-KEY), ``envd`` or ``interp`` (the E2B
    sandbox's data plane, port 49983 or 49999).  ``body``: a JSON document (NaN and infinities
    written as JS literals, as a sloppy client would), or bytes as they are.  ``shape``: how the
    reason travels: ``native`` ``{"detail": str, "code": str}``, ``fastapi`` (422,
    ``{"detail": [...]}``), ``e2b`` ``{"code": status, "message"}``, ``connect`` ``{"code": rpc,
    "message"}``, ``stream`` (HTTP 200 and a Connect end-of-stream error), ``interp``
    ``{"detail": str}``.  ``says``: words the reason must hold (what was wrong, how to fix it).
    """

    id: str
    to: str
    method: str
    path: str
    status: int
    shape: str
    says: tuple[str, ...]
    body: Any = None
    content_type: str | None = None
    rpc: str | None = None
    extra: tuple[tuple[str, str], ...] = ()


def native(id: str, method: str, path: str, status: int, says: tuple[str, ...], body: Any = None,
           content_type: str | None = None) -> Case:  # fmt: skip
    shape = "fastapi" if status == 422 else "native"
    return Case(id, "native", method, path, status, shape, says, body, content_type)


def e2b(id: str, method: str, path: str, status: int, says: tuple[str, ...], body: Any = None,
        content_type: str | None = None) -> Case:  # fmt: skip
    return Case(id, "e2b", method, path, status, "e2b", says, body, content_type)


def started(id: str, process: dict[str, Any], says: tuple[str, ...]) -> Case:
    """A Start whose refusal is the stream's end (HTTP 200, as envd: an error before the first event)."""
    body = envelope({"process": {"cmd": "/bin/pwd", **process}})
    return Case(
        id, "envd", "POST", "/process.Process/Start", 200, "stream", says, body, _STREAM, "invalid_argument"
    )


def rpc(id: str, path: str, status: int, code: str, says: tuple[str, ...], body: bytes = b"{}",
        content_type: str = "application/json") -> Case:  # fmt: skip
    return Case(id, "envd", "POST", path, status, "connect", says, body, content_type, code)


def files(id: str, method: str, path: str, status: int, says: tuple[str, ...], body: bytes = b"x",
          content_type: str | None = None) -> Case:  # fmt: skip
    return Case(id, "envd", method, path, status, "e2b", says, body, content_type)


def interp(id: str, path: str, status: int, says: tuple[str, ...], body: Any = None,
           content_type: str | None = None) -> Case:  # fmt: skip
    return Case(id, "interp", "POST", path, status, "interp", says, body, content_type)


_NAME_FIX = ("is invalid", "use letters, digits and '_'")
_KEY_FIX = ("metadata key", "printable ascii")
_CWD_FIX = ("outside the workspace", "use a path inside it")
_JSON_FIX = ("unsupported content-type", "application/json")
_CONNECT_FIX = ("unsupported content-type", "application/connect+json")
_EXEC = "/v1/sandboxes/{native}/exec"

CASES: tuple[Case, ...] = (
    # -- native API: environment names (the rule every surface shares), create and exec -----------
    native("create env name NUL", "POST", "/v1/sandboxes", 400, _NAME_FIX, {"environment": {"A\x00B": "x"}}),
    native("create env name '='", "POST", "/v1/sandboxes", 400, _NAME_FIX, {"environment": {"A=B": "x"}}),
    native(
        "create env name non-ASCII", "POST", "/v1/sandboxes", 400, _NAME_FIX, {"environment": {"CAFÉ": "x"}}
    ),
    native("create env name newline", "POST", "/v1/sandboxes", 400, _NAME_FIX, {"environment": {"A\n": "x"}}),
    native(
        "create env name empty",
        "POST",
        "/v1/sandboxes",
        422,
        ("environment", "at least 1"),
        {"environment": {"": "x"}},
    ),
    native(
        "create env name overlong",
        "POST",
        "/v1/sandboxes",
        422,
        ("environment", "at most 128"),
        {"environment": {"A" * 129: "x"}},
    ),
    native(
        "create env name reserved",
        "POST",
        "/v1/sandboxes",
        400,
        ("reserved", "agentnest_"),
        {"environment": {"AGENTNEST_X": "x"}},
    ),
    native("exec env name NUL", "POST", _EXEC, 400, _NAME_FIX, {"argv": ["true"], "env": {"A\x00": "x"}}),
    native("exec env name '='", "POST", _EXEC, 400, _NAME_FIX, {"argv": ["true"], "env": {"A=B": "x"}}),
    native("exec env name non-ASCII", "POST", _EXEC, 400, _NAME_FIX, {"argv": ["true"], "env": {"É": "x"}}),
    # -- native API: cwd confined to the workspace ------------------------------------------------
    native(
        "exec cwd ../../..",
        "POST",
        _EXEC,
        400,
        ("outside the workspace", "use a path below it"),
        {"argv": ["pwd"], "cwd": "../../../../"},
    ),
    native("exec cwd /etc", "POST", _EXEC, 400, ("outside the workspace",), {"argv": ["pwd"], "cwd": "/etc"}),
    native("exec cwd NUL", "POST", _EXEC, 400, ("nul",), {"argv": ["pwd"], "cwd": "a\x00b"}),
    # -- native API: times and sizes finite and bounded --------------------------------------------
    native("exec timeout NaN", "POST", _EXEC, 422, ("timeout",), {"argv": ["true"], "timeout": NAN}),
    native(
        "exec timeout Infinity",
        "POST",
        _EXEC,
        422,
        ("timeout", "less than or equal"),
        {"argv": ["true"], "timeout": INF},
    ),
    native(
        "exec timeout negative",
        "POST",
        _EXEC,
        422,
        ("timeout", "greater than 0"),
        {"argv": ["true"], "timeout": -1},
    ),
    native(
        "exec timeout huge",
        "POST",
        _EXEC,
        422,
        ("timeout", "less than or equal"),
        {"argv": ["true"], "timeout": 1e300},
    ),
    native(
        "create timeout -Infinity",
        "POST",
        "/v1/sandboxes",
        422,
        ("timeout", "greater than 0"),
        {"timeout": -INF},
    ),
    native("create max_wait NaN", "POST", "/v1/sandboxes", 422, ("max_wait",), {"max_wait": NAN}),
    native(
        "create cpus Infinity", "POST", "/v1/sandboxes", 422, ("cpus", "less than or equal"), {"cpus": INF}
    ),
    native(
        "create idle_timeout negative",
        "POST",
        "/v1/sandboxes",
        422,
        ("idle_timeout", "greater than 0"),
        {"lease": "idle", "idle_timeout": -5},
    ),
    native("create memory negative", "POST", "/v1/sandboxes", 400, ("size",), {"memory": "-1g"}),
    native("create memory huge", "POST", "/v1/sandboxes", 403, ("memory",), {"memory": 10**30}),
    native("extend NaN", "POST", "/v1/sandboxes/{native}/extend", 422, ("seconds",), {"seconds": NAN}),
    native(
        "extend Infinity",
        "POST",
        "/v1/sandboxes/{native}/extend",
        422,
        ("seconds", "less than or equal"),
        {"seconds": INF},
    ),
    native(
        "extend negative",
        "POST",
        "/v1/sandboxes/{native}/extend",
        422,
        ("seconds", "greater than 0"),
        {"seconds": -5},
    ),
    native(
        "extend huge",
        "POST",
        "/v1/sandboxes/{native}/extend",
        422,
        ("seconds", "less than or equal"),
        {"seconds": 1e12},
    ),
    native("usage since=nan", "GET", "/v1/usage?since=nan", 422, ("since", "finite")),
    native("usage since=inf", "GET", "/v1/usage?since=inf", 422, ("since", "finite")),
    native("usage until negative", "GET", "/v1/usage?until=-1", 422, ("until", "greater than or equal to 0")),
    native("usage since huge", "GET", "/v1/usage?since=1e300", 422, ("since", "less than or equal")),
    native("audit since=inf", "GET", "/v1/audit?since=inf", 422, ("since", "finite")),
    native("audit until=nan", "GET", "/v1/audit?until=nan", 422, ("until", "finite")),
    native("audit after negative", "GET", "/v1/audit?after=-1", 422, ("after", "greater than or equal to 0")),
    native("audit after huge", "GET", f"/v1/audit?after={10**30}", 422, ("after", "less than or equal")),
    native("audit limit huge", "GET", "/v1/audit?limit=1000000000", 422, ("limit", "less than or equal")),
    native("audit wait nan", "GET", "/v1/audit?wait=nan", 422, ("wait",)),
    native(
        "logs tail negative",
        "GET",
        "/v1/sandboxes/{native}/logs?tail=-1",
        422,
        ("tail", "greater than or equal"),
    ),
    native("logs tail huge", "GET", "/v1/sandboxes/{native}/logs?tail=1e9", 422, ("tail",)),
    native(
        "file read outside",
        "GET",
        "/v1/sandboxes/{native}/files/..%2F..%2Fetc%2Fpasswd",
        400,
        ("outside the workspace",),
    ),
    native(
        "file list path outside",
        "GET",
        "/v1/sandboxes/{native}/files?path=../..",
        400,
        ("outside the workspace",),
    ),
    # -- native API: content types and bodies ------------------------------------------------------
    native("create text/plain", "POST", "/v1/sandboxes", 415, _JSON_FIX, b"{}", "text/plain"),
    native(
        "create form-encoded",
        "POST",
        "/v1/sandboxes",
        415,
        _JSON_FIX,
        b"a=b",
        "application/x-www-form-urlencoded",
    ),
    native("exec text/plain", "POST", _EXEC, 415, _JSON_FIX, b'{"argv": ["true"]}', "text/plain"),
    native(
        "extend multipart",
        "POST",
        "/v1/sandboxes/{native}/extend",
        415,
        _JSON_FIX,
        b"--x--",
        "multipart/form-data",
    ),
    native("create body not JSON", "POST", "/v1/sandboxes", 422, ("json",), b"{", "application/json"),
    native("create body a list", "POST", "/v1/sandboxes", 422, ("dictionary",), b"[1]", "application/json"),
    native("create body a string", "POST", "/v1/sandboxes", 422, ("dictionary",), b'"x"', "application/json"),
    native("exec argv wrong type", "POST", _EXEC, 422, ("argv", "list"), {"argv": "true"}),
    # -- admin API ---------------------------------------------------------------------------------
    native("tenant weight NaN", "POST", "/v1/tenants", 422, ("weight",), {"name": "t-nan", "weight": NAN}),
    native(
        "tenant weight negative",
        "POST",
        "/v1/tenants",
        422,
        ("weight", "greater than 0"),
        {"name": "t-neg", "weight": -1},
    ),
    native("tenant max_wait Infinity", "PATCH", "/v1/tenants/default", 422, ("max_wait",), {"max_wait": INF}),
    native("tenant text/plain", "POST", "/v1/tenants", 415, _JSON_FIX, b'{"name": "t"}', "text/plain"),
    native("tenant body a list", "POST", "/v1/tenants", 422, ("dictionary",), b"[]", "application/json"),
    # -- E2B control plane ------------------------------------------------------------------------
    e2b(
        "envVars name NUL",
        "POST",
        "/sandboxes",
        400,
        ("envvars", *_NAME_FIX),
        {"templateID": "base", "envVars": {"A\x00": "x"}},
    ),
    e2b(
        "envVars name '='",
        "POST",
        "/sandboxes",
        400,
        _NAME_FIX,
        {"templateID": "base", "envVars": {"A=B": "x"}},
    ),
    e2b(
        "envVars name non-ASCII",
        "POST",
        "/v2/sandboxes",
        400,
        _NAME_FIX,
        {"templateID": "base", "envVars": {"É": "x"}},
    ),
    e2b(
        "envVars name empty",
        "POST",
        "/v2/sandboxes",
        400,
        _NAME_FIX,
        {"templateID": "base", "envVars": {"": "x"}},
    ),
    e2b(
        "envVars name overlong",
        "POST",
        "/v2/sandboxes",
        400,
        ("at most 128",),
        {"templateID": "base", "envVars": {"A" * 129: "x"}},
    ),
    e2b(
        "envVars value NUL",
        "POST",
        "/v2/sandboxes",
        400,
        ("without nul",),
        {"templateID": "base", "envVars": {"A": "x\x00"}},
    ),
    e2b(
        "metadata key NUL",
        "POST",
        "/v2/sandboxes",
        400,
        _KEY_FIX,
        {"templateID": "base", "metadata": {"k\x00": "v"}},
    ),
    e2b(
        "metadata key '='",
        "POST",
        "/v2/sandboxes",
        400,
        _KEY_FIX,
        {"templateID": "base", "metadata": {"a=b": "v"}},
    ),
    e2b(
        "metadata key non-ASCII",
        "POST",
        "/v2/sandboxes",
        400,
        _KEY_FIX,
        {"templateID": "base", "metadata": {"clé": "v"}},
    ),
    e2b(
        "metadata key empty",
        "POST",
        "/v2/sandboxes",
        400,
        _KEY_FIX,
        {"templateID": "base", "metadata": {"": "v"}},
    ),
    e2b(
        "metadata key overlong",
        "POST",
        "/v2/sandboxes",
        400,
        _KEY_FIX,
        {"templateID": "base", "metadata": {"k" * 257: "v"}},
    ),
    e2b(
        "create timeout NaN",
        "POST",
        "/v2/sandboxes",
        400,
        ("timeout", "finite"),
        {"templateID": "base", "timeout": NAN},
    ),
    e2b(
        "create timeout negative",
        "POST",
        "/v2/sandboxes",
        400,
        ("timeout", "greater than or equal to 1"),
        {"templateID": "base", "timeout": -1},
    ),
    e2b(
        "create timeout huge",
        "POST",
        "/v2/sandboxes",
        400,
        ("timeout", "less than or equal"),
        {"templateID": "base", "timeout": 10**12},
    ),
    e2b("set_timeout Infinity", "POST", "/sandboxes/{e2b}/timeout", 400, ("timeout",), {"timeout": INF}),
    e2b(
        "set_timeout negative",
        "POST",
        "/sandboxes/{e2b}/timeout",
        400,
        ("timeout", "greater than or equal to 0"),
        {"timeout": -5},
    ),
    e2b("connect timeout NaN", "POST", "/sandboxes/{e2b}/connect", 400, ("timeout",), {"timeout": NAN}),
    e2b("list limit nan", "GET", "/v2/sandboxes?limit=nan", 400, ("limit", "number")),
    e2b("list limit huge", "GET", "/v2/sandboxes?limit=1000000000", 400, ("limit", "1 to 100")),
    e2b(
        "create text/plain", "POST", "/v2/sandboxes", 415, _JSON_FIX, b'{"templateID": "base"}', "text/plain"
    ),
    e2b(
        "create body not JSON", "POST", "/v2/sandboxes", 400, ("malformed", "json"), b"{", "application/json"
    ),
    e2b(
        "create body a list",
        "POST",
        "/v2/sandboxes",
        400,
        ("malformed", "object"),
        b"[1]",
        "application/json",
    ),
    e2b("create templateID wrong type", "POST", "/v2/sandboxes", 400, ("templateid",), {"templateID": 5}),
    # -- envd Connect RPCs ------------------------------------------------------------------------
    started("Start cwd ../../..", {"cwd": "../../../../"}, ("'../../../../'", *_CWD_FIX)),
    started("Start cwd /etc", {"cwd": "/etc"}, _CWD_FIX),
    started("Start cwd /home/user/..", {"cwd": "/home/user/.."}, _CWD_FIX),
    started("Start envs name NUL", {"envs": {"A\x00": "x"}}, ("process.envs", *_NAME_FIX)),
    started("Start envs name '='", {"envs": {"A=B": "x"}}, _NAME_FIX),
    rpc(
        "Start application/grpc",
        "/process.Process/Start",
        415,
        "unknown",
        _CONNECT_FIX,
        b"\x00\x00\x00\x00\x00",
        "application/grpc",
    ),
    rpc(
        "Start application/grpc-web",
        "/process.Process/Start",
        415,
        "unknown",
        _CONNECT_FIX,
        b"\x00\x00\x00\x00\x00",
        "application/grpc-web",
    ),
    rpc(
        "Start application/grpc-web+proto",
        "/process.Process/Start",
        415,
        "unknown",
        _CONNECT_FIX,
        b"",
        "application/grpc-web+proto",
    ),
    rpc("Start text/plain", "/process.Process/Start", 415, "unknown", _CONNECT_FIX, b"{}", "text/plain"),
    rpc(
        "Start unary content type",
        "/process.Process/Start",
        415,
        "unknown",
        _CONNECT_FIX,
        b"{}",
        "application/json",
    ),
    rpc("List application/grpc", "/process.Process/List", 415, "unknown", _JSON_FIX, b"", "application/grpc"),
    rpc(
        "ListDir application/proto",
        "/filesystem.Filesystem/ListDir",
        415,
        "unknown",
        _JSON_FIX,
        b"",
        "application/proto",
    ),
    rpc("unknown process method", "/process.Process/Nope", 404, "unimplemented", ("no rpc", "docs/e2b.md")),
    rpc("unknown filesystem method", "/filesystem.Filesystem/Nope", 404, "unimplemented", ("no rpc",)),
    rpc(
        "ListDir body not JSON",
        "/filesystem.Filesystem/ListDir",
        400,
        "invalid_argument",
        ("malformed",),
        b"{",
    ),
    rpc(
        "ListDir depth negative",
        "/filesystem.Filesystem/ListDir",
        400,
        "invalid_argument",
        ("depth",),
        b'{"path": "/home/user", "depth": -1}',
    ),
    rpc(
        "ListDir depth huge",
        "/filesystem.Filesystem/ListDir",
        400,
        "invalid_argument",
        ("depth",),
        b'{"path": "/home/user", "depth": 1000000000}',
    ),
    rpc(
        "ListDir path outside",
        "/filesystem.Filesystem/ListDir",
        403,
        "permission_denied",
        ("outside the workspace",),
        b'{"path": "/etc"}',
    ),
    rpc(
        "Update pty size huge",
        "/process.Process/Update",
        400,
        "invalid_argument",
        ("cols",),
        b'{"process": {"pid": 1}, "pty": {"size": {"cols": 1000000, "rows": 1}}}',
    ),
    # -- /files -------------------------------------------------------------------------------------
    files(
        "upload text/plain",
        "POST",
        "/files?path=up.txt",
        415,
        ("unsupported content-type", "octet-stream"),
        content_type="text/plain",
    ),
    files(
        "upload application/json",
        "POST",
        "/files?path=up.txt",
        415,
        ("multipart/form-data",),
        b"{}",
        "application/json",
    ),
    files(
        "upload outside",
        "POST",
        "/files?path=../../etc/x",
        403,
        ("outside the workspace",),
        content_type="application/octet-stream",
    ),
    Case(
        "upload bad gzip",
        "envd",
        "POST",
        "/files?path=up.txt",
        400,
        "e2b",
        ("malformed upload",),
        b"not gzip",
        "application/octet-stream",
        extra=(("Content-Encoding", "gzip"),),
    ),
    files("download outside", "GET", "/files?path=../../../etc/passwd", 403, ("outside the workspace",), b""),
    # -- /execute and /contexts (the code interpreter) ---------------------------------------------
    interp("execute text/plain", "/execute", 415, _JSON_FIX, b'{"code": "1"}', "text/plain"),
    interp("execute body not JSON", "/execute", 400, ("malformed", "json"), b"{", "application/json"),
    interp("execute body a list", "/execute", 400, ("malformed", "object"), b"[1]", "application/json"),
    interp("execute code wrong type", "/execute", 400, ("malformed", "code"), {"code": 5}),
    interp(
        "execute env_vars name NUL",
        "/execute",
        400,
        ("env_vars", *_NAME_FIX),
        {"code": "1", "env_vars": {"A\x00": "x"}},
    ),
    interp("execute env_vars name '='", "/execute", 400, _NAME_FIX, {"code": "1", "env_vars": {"A=B": "x"}}),
    interp("context cwd ../../..", "/contexts", 400, ("'../../../../'", *_CWD_FIX), {"cwd": "../../../../"}),
    interp("context cwd /etc", "/contexts", 400, _CWD_FIX, {"cwd": "/etc"}),
    interp("context cwd NUL", "/contexts", 400, ("nul",), {"cwd": "a\x00b"}),
    interp("context text/plain", "/contexts", 415, _JSON_FIX, b'{"cwd": "/home/user"}', "text/plain"),
)


class Collect(logging.Handler):
    """Every record at ERROR or above, from any logger (uvicorn's do not reach the root)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Live:
    def __init__(self, url: str, secret: str, key: str) -> None:
        self.url = url
        self.secret = secret
        self.key = key
        self.client = httpx.Client(base_url=url, timeout=60)
        self.native_id = ""
        self.e2b: dict[str, Any] = {}

    def headers(self, to: str) -> dict[str, str]:
        if to == "native":
            return {"Authorization": f"Bearer {self.secret}"}
        if to == "e2b":
            return {"X-API-KEY": self.key}
        return {
            "E2b-Sandbox-Id": self.e2b["sandboxID"],
            "E2b-Sandbox-Port": "49999" if to == "interp" else "49983",
            "X-Access-Token": self.e2b["envdAccessToken"],
        }

    def send(self, case: Case) -> httpx.Response:
        path = case.path.format(native=self.native_id, e2b=self.e2b.get("sandboxID", ""))
        headers = self.headers(case.to)
        content: bytes | None = None
        if isinstance(case.body, bytes):
            content = case.body
        elif case.body is not None:
            content = json.dumps(case.body).encode()  # NaN and Infinity as JS literals
            headers["Content-Type"] = "application/json"
        if case.content_type is not None:
            headers["Content-Type"] = case.content_type
        headers.update(case.extra)
        return self.client.request(case.method, path, content=content, headers=headers)

    def native_state(self) -> str:
        r = self.client.post(
            f"/v1/sandboxes/{self.native_id}/exec",
            json={"shell": 'cat keep.txt; echo " $MARK $(pwd)"'},
            headers=self.headers("native"),
        )
        assert r.status_code == 200, r.text
        return str(r.json()["stdout"])

    def e2b_state(self) -> str:
        body = envelope(
            {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", 'cat keep.txt; echo " $MARK $(pwd)"']}}
        )
        r = self.client.post(
            "/process.Process/Start",
            content=body,
            headers={**self.headers("envd"), "Content-Type": _STREAM, "Connect-Protocol-Version": "1"},
        )
        assert r.status_code == 200, r.text
        out = b""
        for _, doc in frames(r.content):
            data = doc.get("event", {}).get("data", {})
            if "stdout" in data:
                out += base64.b64decode(data["stdout"])
        return out.decode()

    def counts(self) -> tuple[int, int]:
        listed = self.client.get("/v1/sandboxes", headers=self.headers("native"))
        assert listed.status_code == 200, listed.text
        contexts = self.client.get("/contexts", headers=self.headers("interp"))
        assert contexts.status_code == 200, contexts.text
        return len(listed.json()["sandboxes"]), len(contexts.json())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    from agentnest.server.e2b import e2b_key

    root = tmp_path_factory.mktemp("malformed")
    store = TokenStore(root / "tokens.json")
    _, secret = store.create("admin", Ceiling(max_sandboxes=4, max_timeout=900.0), admin=True)
    settings = ServerSettings(
        tokens=store,
        backends={"docker": "docker"},
        image=base_image(),
        max_upload_bytes=1024 * 1024,
        database=f"sqlite:///{root / 'manager.db'}",
    )
    with serve_in_thread(create_app(settings)) as url:
        it = Live(url, secret, e2b_key(secret))
        c, native_h = it.client, it.headers("native")
        r = c.post(
            "/v1/sandboxes", json={"timeout": 900, "environment": {"MARK": "native"}}, headers=native_h
        )
        assert r.status_code == 201, r.text
        it.native_id = r.json()["id"]
        r = c.put(f"/v1/sandboxes/{it.native_id}/files/keep.txt", content=b"native-keep", headers=native_h)
        assert r.status_code == 204, r.text
        r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 900, "envVars": {"MARK": "e2b"}},
                   headers=it.headers("e2b"))  # fmt: skip
        assert r.status_code == 201, r.text
        it.e2b = r.json()
        r = c.post("/files?path=keep.txt", content=b"e2b-keep",
                   headers={**it.headers("envd"), "Content-Type": "application/octet-stream"})  # fmt: skip
        assert r.status_code == 200, r.text
        try:
            yield it
        finally:
            it.client.close()


@pytest.fixture
def errors() -> Iterator[Collect]:
    handler = Collect()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _reason(case: Case, r: httpx.Response) -> str:
    """The reason in the surface's shape (asserting the shape), lower case."""
    assert r.headers.get("content-type", "").startswith("application/json"), (r.headers, r.content[:300])
    doc = r.json()
    if case.shape == "native":
        assert set(doc) == {"detail", "code"} and isinstance(doc["code"], str), doc
        return str(doc["detail"]).lower()
    if case.shape == "fastapi":
        assert isinstance(doc["detail"], list) and doc["detail"], doc
        return json.dumps(doc["detail"]).lower()
    if case.shape == "e2b":
        assert set(doc) == {"code", "message"} and doc["code"] == case.status, doc
        return str(doc["message"]).lower()
    if case.shape == "connect":
        assert doc["code"] == case.rpc and isinstance(doc["message"], str), doc
        return str(doc["message"]).lower()
    assert case.shape == "interp", case.shape
    assert set(doc) == {"detail"} and isinstance(doc["detail"], str), doc
    return str(doc["detail"]).lower()


def _stream_reason(case: Case, r: httpx.Response) -> str:
    """A server stream's refusal: no event, and the end-of-stream frame's Connect error."""
    got = frames(r.content)
    assert len(got) == 1 and got[0][0] == 2, got
    error = got[0][1]["error"]
    assert error["code"] == case.rpc, error
    return str(error["message"]).lower()


@pytest.fixture(scope="module")
def before(live: Live) -> tuple[str, str, tuple[int, int]]:
    native_state, e2b_state = live.native_state(), live.e2b_state()
    assert native_state == "native-keep native /workspace\n", native_state
    assert e2b_state == "e2b-keep e2b /workspace\n", e2b_state
    return native_state, e2b_state, live.counts()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed(case: Case, live: Live, before: tuple[str, str, tuple[int, int]], errors: Collect) -> None:
    r = live.send(case)
    assert r.status_code == case.status, (r.status_code, r.content[:400])
    reason = _stream_reason(case, r) if case.shape == "stream" else _reason(case, r)
    for words in case.says:
        assert words.lower() in reason, (words, reason)
    # Nothing changed: both sandboxes run (the following good requests), see their files and
    # environment as before, and no sandbox or code context appeared.
    assert (live.native_state(), live.e2b_state(), live.counts()) == before
    assert not errors.records, [f"{x.name}: {x.getMessage()}" for x in errors.records]


def test_the_table_covers_every_surface() -> None:
    """Each surface of the brief has rows (a new surface without any is a gap, not a pass)."""
    paths = {c.path.split("?")[0] for c in CASES}
    for needed in ("/v1/sandboxes", "/v1/usage", "/v1/audit", "/v1/tenants", "/sandboxes", "/v2/sandboxes",
                   "/process.Process/Start", "/files", "/execute", "/contexts"):  # fmt: skip
        assert needed in paths, needed
    assert {c.shape for c in CASES} == {"native", "fastapi", "e2b", "connect", "stream", "interp"}
