"""agentnest mcp end to end: the real server process, the SDK's real client, real sandboxes.

The server runs as ``python -m agentnest.cli mcp`` in its own process, so its
sandboxes carry that process's owner label (``host:pid``); each server is
started with a unique environment tag so that the test can find its pid and
check that nothing labelled with it is left behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

WAIT = 60.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def tagged_pid(tag: str, within: float = WAIT) -> int:
    """The pid of the live process whose environment carries ``AN_MCP_TAG=tag``."""
    needle = f"AN_MCP_TAG={tag}".encode()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if needle in env and b"agentnest.cli" in cmdline:
                return int(pid)
        time.sleep(0.05)
    raise AssertionError(f"no server process tagged {tag} within {within}s")


def owned_by(docker_client: Any, pid: int, *, spares: bool = False) -> list[Any]:
    """The server's containers; without ``spares``, not the warm spares it keeps for the next fork
    (they go with the server: wait_none_owned counts them)."""
    owner = f"{socket.gethostname()}:{pid}"
    found = docker_client.containers.list(
        all=True, ignore_removed=True, filters={"label": f"agentnest.owner={owner}"}
    )
    return [c for c in found if spares or c.labels.get("agentnest.warm") != "true"]


def wait_none_owned(docker_client: Any, pid: int, within: float = WAIT) -> None:
    deadline = time.monotonic() + within
    while owned_by(docker_client, pid, spares=True):
        if time.monotonic() >= deadline:
            left = [c.name for c in owned_by(docker_client, pid, spares=True)]
            for container in owned_by(docker_client, pid, spares=True):
                container.remove(force=True, v=True)
            raise AssertionError(f"the server left containers behind: {left}")
        time.sleep(0.1)


def server_argv(*extra: str) -> list[str]:
    return ["-m", "agentnest.cli", "mcp", "--max-sandboxes", "3", *extra]


def server_env(tag: str, tmp_path: Path) -> dict[str, str]:
    return {
        "AN_MCP_TAG": tag,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "AGENTNEST_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        **{
            k: v
            for k, v in os.environ.items()
            if k.startswith(("AGENTNEST_", "DOCKER_")) and k != "AGENTNEST_AUDIT_LOG"
        },
    }


@asynccontextmanager
async def stdio_session(tmp_path: Path, backend_name: str, tag: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=server_argv("--backend", backend_name),
        env=server_env(tag, tmp_path),
        cwd=str(tmp_path),
    )
    with (tmp_path / "server.err").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def ok(result: Any) -> dict[str, Any]:
    text = "".join(getattr(block, "text", "") for block in result.content)
    assert not result.is_error, text
    assert json.loads(text) == result.structured_content  # the same JSON as text and as structure
    structured: dict[str, Any] = result.structured_content
    return structured


def error_text(result: Any) -> str:
    assert result.is_error
    return "".join(getattr(block, "text", "") for block in result.content)


def resource_json(result: Any) -> Any:
    (content,) = result.contents
    return json.loads(content.text)


@pytest.mark.anyio
async def test_every_tool_over_stdio(tmp_path: Path, backend_name: str, docker_client: Any) -> None:
    tag = uuid.uuid4().hex
    async with stdio_session(tmp_path, backend_name, tag) as session:
        pid = tagged_pid(tag)
        tools = {t.name for t in (await session.list_tools()).tools}
        assert {"create_sandbox", "exec_shell", "session_run", "fork", "snapshot", "destroy"} <= tools

        box = ok(await session.call_tool("create_sandbox", {"timeout": 300}))
        sid = box["sandbox_id"]
        assert box["backend"] == backend_name and box["network"] == "denied"
        (container,) = owned_by(docker_client, pid)
        assert container.labels["agentnest.sandbox"] == sid

        shell = ok(await session.call_tool("exec_shell", {"sandbox_id": sid, "command": "id -u; pwd"}))
        assert shell["stdout"] == "65532\n/workspace\n" and shell["exit_code"] == 0
        py = ok(await session.call_tool("exec_python", {"sandbox_id": sid, "code": "print(6 * 7)"}))
        assert py["stdout"] == "42\n"
        slow = ok(
            await session.call_tool("exec_shell", {"sandbox_id": sid, "command": "sleep 30", "timeout": 1})
        )
        assert slow["timed_out"] is True

        ok(await session.call_tool("session_run", {"sandbox_id": sid, "code": "import math; x = 41"}))
        kept = ok(await session.call_tool("session_run", {"sandbox_id": sid, "code": "x + 1"}))
        assert kept["result"] == "42" and kept["ok"] is True

        ok(await session.call_tool("write_file", {"sandbox_id": sid, "path": "src/a.txt", "content": "one"}))
        read = ok(await session.call_tool("read_file", {"sandbox_id": sid, "path": "src/a.txt"}))
        assert read["content"] == "one"
        listing = ok(await session.call_tool("list_files", {"sandbox_id": sid, "recursive": True}))
        assert [e["path"] for e in listing["entries"]] == ["src", "src/a.txt"]

        snap = ok(await session.call_tool("snapshot", {"sandbox_id": sid, "name": "first"}))
        assert snap["files"] >= 1
        child = ok(await session.call_tool("fork", {"sandbox_id": sid}))["sandbox_id"]
        assert child != sid
        ok(
            await session.call_tool(
                "write_file", {"sandbox_id": child, "path": "src/a.txt", "content": "two"}
            )
        )
        parent_view = ok(await session.call_tool("read_file", {"sandbox_id": sid, "path": "src/a.txt"}))
        assert parent_view["content"] == "one"  # the fork is independent
        ok(
            await session.call_tool(
                "write_file", {"sandbox_id": sid, "path": "src/a.txt", "content": "three"}
            )
        )
        ok(await session.call_tool("restore", {"sandbox_id": sid, "name": "first"}))
        restored = ok(await session.call_tool("read_file", {"sandbox_id": sid, "path": "src/a.txt"}))
        assert restored["content"] == "one"
        snapshots = list((tmp_path / "state" / "agentnest" / "mcp-snapshots").glob("*/first.tar"))
        assert len(snapshots) == 1

        listed = ok(await session.call_tool("list_sandboxes", {}))
        assert {s["sandbox_id"] for s in listed["sandboxes"]} == {sid, child}
        assert len(owned_by(docker_client, pid)) == 2

        for name, arguments, match in [
            ("exec_shell", {"sandbox_id": "0badc0ffee00", "command": "true"}, "no sandbox"),
            ("create_sandbox", {"memory": "64g"}, "max_memory"),
            ("create_sandbox", {"image": "alpine:latest"}, "allowed_images"),
            ("snapshot", {"sandbox_id": sid, "name": "../../escape"}, "snapshot name"),
            ("read_file", {"sandbox_id": sid, "path": "/etc/passwd"}, "FileAccessError"),
            ("exec_shell", {"sandbox_id": sid, "command": ["not", "a", "string"]}, "command"),
        ]:
            assert match in error_text(await session.call_tool(name, arguments)), name
        assert len(owned_by(docker_client, pid)) == 2  # the refused creations made nothing

        audit = resource_json(await session.read_resource("agentnest://audit"))
        kinds = {(e["sandbox_id"], e["type"]) for e in audit["events"]}
        assert {(sid, "sandbox.created"), (sid, "sandbox.forked"), (sid, "snapshot.created")} <= kinds
        assert (child, "file.written") in kinds
        assert any(e["type"] == "policy.denied" for e in audit["events"])
        own = resource_json(await session.read_resource(f"agentnest://sandboxes/{child}/audit"))
        assert own["events"] and {e["sandbox_id"] for e in own["events"]} == {child}

        assert ok(await session.call_tool("destroy", {"sandbox_id": child}))["destroyed"] is True
        assert [c.labels["agentnest.sandbox"] for c in owned_by(docker_client, pid)] == [sid]
    # The client closed the server's stdin: it destroys what is left (sid) and exits.
    wait_none_owned(docker_client, pid)
    assert not list((tmp_path / "state" / "agentnest" / "mcp-snapshots").glob("*/first.tar"))
    logged = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert {e["sandbox_id"] for e in logged if e["type"] == "sandbox.destroyed"} == {sid, child}


class RawServer:
    """The stdio server driven by hand: any bytes in, JSON-RPC lines out."""

    def __init__(self, tmp_path: Path, tag: str) -> None:
        self.errlog = (tmp_path / "server.err").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, *server_argv("--backend", "docker")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errlog,
            env=server_env(tag, tmp_path),
            cwd=tmp_path,
        )
        self.buffer = b""
        self.next_id = 100

    def send(self, raw: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw)
        self.proc.stdin.flush()

    def reply(self, request_id: int, within: float = WAIT) -> dict[str, Any]:
        """The response to ``request_id`` (notifications and other ids are skipped)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + within
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("id") == request_id:
                    return dict(message)
            left = deadline - time.monotonic()
            assert left > 0, f"no reply to {request_id} within {within}s"
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, "the server closed its stdout (it crashed?)"
                self.buffer += chunk

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        self.send(
            json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}).encode()
            + b"\n"
        )
        return self.reply(self.next_id)

    def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        reply = self.call("tools/call", {"name": name, "arguments": arguments})
        assert "result" in reply, reply
        result: dict[str, Any] = reply["result"]
        return result


@pytest.fixture
def raw_server(tmp_path: Path) -> Iterator[RawServer]:
    server = RawServer(tmp_path, uuid.uuid4().hex)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.proc.wait(30)
        for pipe in (server.proc.stdin, server.proc.stdout, server.errlog):
            if pipe is not None:
                pipe.close()


GARBAGE = [
    b"this is not json\n",
    b"{\n",
    b"[]\n",
    b"null\n",
    b'{"jsonrpc": "2.0"}\n',
    b'{"jsonrpc": "1.0", "id": 1, "method": "tools/list"}\n',
    b"\xff\xfe\x00\x01 binary\n",
    b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": "nope"}\n',
    b'{"jsonrpc": "2.0", "id": 3, "method": "no/such/method", "params": {}}\n',
    b'{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "destroy", "arguments": 7}}\n',
    b'{"jsonrpc": "2.0", "method": "notifications/garbage"}\n',
    b'{"a": "' + b"x" * 200_000 + b'"}\n',
    b"\n",
]


def test_garbage_on_stdin_does_not_crash_the_server(
    raw_server: RawServer, docker_client: Any, tmp_path: Path
) -> None:
    init = raw_server.call(
        "initialize",
        {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    )
    assert init["result"]["serverInfo"]["name"] == "agentnest"
    raw_server.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    for line in GARBAGE:
        raw_server.send(line)
    # Well-formed requests that make no sense get an error answer; lines that
    # are no JSON-RPC message at all (id 2's params are not an object) none.
    assert raw_server.reply(3)["error"]["code"] == -32601  # method not found
    assert raw_server.reply(4)["error"]["code"] == -32602  # invalid params
    created = raw_server.tool("create_sandbox", {})
    assert not created.get("isError"), created
    sid = created["structuredContent"]["sandbox_id"]
    ran = raw_server.tool("exec_shell", {"sandbox_id": sid, "command": "echo still here"})
    assert ran["structuredContent"]["stdout"] == "still here\n"
    wrong = raw_server.tool("exec_shell", {"sandbox_id": sid, "command": 12, "timeout": "x"})
    assert wrong["isError"] is True
    pid = raw_server.proc.pid
    assert len(owned_by(docker_client, pid)) == 1
    assert raw_server.proc.stdin is not None
    raw_server.proc.stdin.close()  # end of input: the server cleans up and exits
    assert raw_server.proc.wait(WAIT) == 0
    wait_none_owned(docker_client, pid)


def test_sigterm_destroys_the_sandboxes(raw_server: RawServer, docker_client: Any) -> None:
    raw_server.call(
        "initialize",
        {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    )
    raw_server.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    raw_server.tool("create_sandbox", {})
    raw_server.tool("create_sandbox", {})
    pid = raw_server.proc.pid
    assert len(owned_by(docker_client, pid)) == 2
    raw_server.proc.send_signal(signal.SIGTERM)
    assert raw_server.proc.wait(WAIT) == 128 + signal.SIGTERM
    assert owned_by(docker_client, pid, spares=True) == []  # destroyed before the process exited


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], within: float = WAIT) -> None:
    deadline = time.monotonic() + within
    while True:
        assert proc.poll() is None, "the HTTP server exited"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port} after {within}s"
            time.sleep(0.05)


@pytest.mark.anyio
async def test_streamable_http(tmp_path: Path, docker_client: Any) -> None:
    import urllib.error
    import urllib.request

    port = free_port()
    tag = uuid.uuid4().hex
    errlog = (tmp_path / "server.err").open("wb")
    proc = subprocess.Popen(
        [sys.executable, *server_argv("--transport", "http", "--port", str(port))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=errlog,
        env=server_env(tag, tmp_path),
        cwd=tmp_path,
    )
    try:
        wait_listening(port, proc)
        url = f"http://127.0.0.1:{port}/mcp"
        garbage = urllib.request.Request(
            url,
            data=b"{not json",
            headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(garbage, timeout=30)
        assert 400 <= refused.value.code < 500
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            sid = ok(await session.call_tool("create_sandbox", {}))["sandbox_id"]
            ran = ok(
                await session.call_tool("exec_python", {"sandbox_id": sid, "code": "print('over http')"})
            )
            assert ran["stdout"] == "over http\n"
            other = ok(await session.call_tool("create_sandbox", {}))["sandbox_id"]
            ok(await session.call_tool("destroy", {"sandbox_id": other}))
        assert len(owned_by(docker_client, proc.pid)) == 1  # the server outlives an HTTP client
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 128 + signal.SIGTERM
        assert owned_by(docker_client, proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        errlog.close()
        for container in owned_by(docker_client, proc.pid):
            container.remove(force=True, v=True)
