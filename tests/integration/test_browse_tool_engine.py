"""The browse tool on the real engine: SandboxRunner.browse, LangChain's browse tool, MCP's browse.

A browser sandbox (``Sandbox(preset="browser")``; its image is built once on
the engine) opens a page written into its workspace; the text, the console
line and a real PNG screenshot must come back.  A plain sandbox is refused
with a message that names the fix.  The MCP server runs in-process here
(``build_server`` with the SDK's own client) because enabling browser
sandboxes is an operator setting (``ServerSettings.presets``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from agentnest import Sandbox, UnsupportedCapabilityError
from agentnest.browser.driver import png_size
from agentnest.integrations import SandboxRunner

from .helpers import containers_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PAGE = """<!doctype html>
<html><head><title>Browse tool page</title></head>
<body><h1>Heading</h1><p>A paragraph the model should read.</p>
<script>console.log("hello from the page")</script></body></html>
"""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def text_of(result: Any) -> str:
    """The text blocks of a tool result, joined."""
    return "".join(getattr(block, "text", "") for block in result.content)


@pytest.fixture(scope="module")
def browser_sandbox(backend_name: str) -> Iterator[Sandbox]:
    """One browser sandbox per runtime (runc and runsc) for the module."""
    with Sandbox(preset="browser", backend=backend_name, timeout=600) as sb:
        sb.write_file("page.html", PAGE)
        yield sb


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_runner_browses_a_workspace_file(browser_sandbox: Sandbox) -> None:
    with SandboxRunner(browser_sandbox, timeout=60) as runner:
        out = runner.browse("/workspace/page.html")
        assert out.ok, out.text
        assert "Title: Browse tool page" in out.text
        assert "URL: file:///workspace/page.html" in out.text
        assert "A paragraph the model should read." in out.text and "Heading" in out.text
        assert "[log] hello from the page" in out.text
        (shot,) = out.display
        assert shot.mime == "image/png"
        png = shot.raw()
        assert png.startswith(PNG_MAGIC) and png_size(png) == (1280, 720)
        assert "Screenshot: 1280x720 PNG, saved in the sandbox at /workspace/screenshots/" in out.text
        assert "A paragraph the model should read." in out.stdout

        whole = runner.browse("file:///workspace/page.html", full_page=True)
        assert whole.ok and png_size(whole.display[0].raw())[0] == 1280

        # The model's mistakes and the network's refusals are answers, not exceptions.
        bad = runner.browse("ftp://example.com/x")
        assert not bad.ok and "http, https and file" in bad.text
        assert runner.browse("/workspace/page.html").ok  # a refused URL never reached the browser
        refused = runner.browse("http://example.com/")
        assert not refused.ok and "NavigationError" in refused.text and refused.display == ()


def test_langchain_tools_include_browse_in_a_browser_sandbox(browser_sandbox: Sandbox) -> None:
    pytest.importorskip("langchain_core", reason="the dev extra installs langchain-core")
    from langchain_core.messages import ToolMessage

    from agentnest.integrations.langchain import build_langchain_tools

    with SandboxRunner(browser_sandbox, timeout=60) as runner:
        tools = {t.name: t for t in build_langchain_tools(runner)}
        assert "browse" in tools
        assert "A paragraph" in tools["browse"].invoke({"url": "/workspace/page.html"})
        message = tools["browse"].invoke(
            {
                "name": "browse",
                "args": {"url": "/workspace/page.html"},
                "id": "call-1",
                "type": "tool_call",
            }
        )
        assert isinstance(message, ToolMessage) and "hello from the page" in str(message.content)
        assert message.artifact.display[0].raw().startswith(PNG_MAGIC)


def test_a_plain_sandbox_is_refused_with_the_fix(shared_sandbox: Sandbox) -> None:
    with (
        SandboxRunner(shared_sandbox) as runner,
        pytest.raises(UnsupportedCapabilityError, match=r'Sandbox\(preset="browser"\)'),
    ):
        runner.browse("/workspace/page.html")


def test_a_runner_creates_a_browser_sandbox_from_its_arguments(docker_client: Any) -> None:
    with SandboxRunner(preset="browser", backend="docker", timeout=120) as runner:
        sid = runner.sandbox.id
        assert runner.sandbox.config.preset == "browser"
        runner.write_file("page.html", PAGE)
        out = runner.browse("/workspace/page.html")
        assert out.ok and "A paragraph the model should read." in out.text
    assert containers_of(docker_client, sid) == []


@pytest.mark.anyio
async def test_mcp_browse_tool(tmp_path: Any, docker_client: Any) -> None:
    pytest.importorskip("mcp")
    from mcp import Client

    from agentnest.mcp import SandboxService, ServerSettings, build_server

    service = SandboxService(
        ServerSettings(backend="docker", presets=("browser",), snapshot_dir=tmp_path / "snapshots")
    )
    try:
        async with Client(build_server(service)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["browse"].input_schema["required"] == ["sandbox_id", "url"]
            created = await client.call_tool("create_sandbox", {"preset": "browser", "timeout": 300})
            assert not created.is_error, created
            box = created.structured_content
            assert box["preset"] == "browser" and box["network"] == "denied"
            sid = box["sandbox_id"]
            wrote = await client.call_tool(
                "write_file", {"sandbox_id": sid, "path": "page.html", "content": PAGE}
            )
            assert not wrote.is_error

            result = await client.call_tool("browse", {"sandbox_id": sid, "url": "/workspace/page.html"})
            assert not result.is_error, result
            text, image = result.content
            assert text.type == "text" and "A paragraph the model should read." in text.text
            assert "[log] hello from the page" in text.text
            assert image.type == "image" and image.mime_type == "image/png"
            png = base64.b64decode(image.data)
            assert png.startswith(PNG_MAGIC) and png_size(png) == (1280, 720)
            meta = result.structured_content
            assert meta["title"] == "Browse tool page"
            assert meta["console"][0]["text"] == "hello from the page"
            assert meta["screenshot"]["path"].startswith("/workspace/screenshots/")
            assert "data" not in meta["screenshot"]

            refused = await client.call_tool("browse", {"sandbox_id": sid, "url": "http://example.com/"})
            assert refused.is_error and "NavigationError" in text_of(refused)

            plain = (await client.call_tool("create_sandbox", {"timeout": 120})).structured_content
            assert plain["preset"] is None
            wrong = await client.call_tool(
                "browse", {"sandbox_id": plain["sandbox_id"], "url": "/workspace/page.html"}
            )
            assert wrong.is_error
            assert "UnsupportedCapabilityError" in text_of(wrong)
            assert "preset 'browser'" in text_of(wrong)
    finally:
        service.close()
    assert containers_of(docker_client, sid) == []


@pytest.mark.anyio
async def test_mcp_without_the_preset_has_no_browse_tool_and_refuses_it(tmp_path: Any) -> None:
    pytest.importorskip("mcp")
    from mcp import Client

    from agentnest.mcp import SandboxService, ServerSettings, build_server

    service = SandboxService(ServerSettings(backend="docker", snapshot_dir=tmp_path / "snapshots"))
    try:
        async with Client(build_server(service)) as client:
            assert "browse" not in {t.name for t in (await client.list_tools()).tools}
            denied = await client.call_tool("create_sandbox", {"preset": "browser"})
            assert denied.is_error and "PolicyDeniedError" in text_of(denied)
            assert "not allowed on this server" in text_of(denied)
        assert service.list_sandboxes()["sandboxes"] == []
    finally:
        service.close()
