"""The browse tool without an engine: formatting, refusals, errors as answers, the MCP wiring.

Sandboxes are directories with the real agent as a local child process
(``doubles.local_agent.LocalBackend``); the browser itself is a fake
(``sandbox.browser`` patched) except where the test is that a sandbox
without Playwright answers with a clear error.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from doubles.local_agent import LocalBackend

from agentnest import (
    ConfigurationError,
    PolicyDeniedError,
    Sandbox,
    SecurityPolicy,
    UnsupportedCapabilityError,
)
from agentnest.browser.driver import BrowseResult, ConsoleMessage, Page, Screenshot
from agentnest.errors import BrowserError, BrowserTimeoutError, NavigationError
from agentnest.integrations import RunOutput, SandboxRunner
from agentnest.integrations._browse import CONSOLE_SHOWN, format_browse, is_browser_sandbox
from agentnest.mcp import SandboxService, ServerSettings, build_server
from agentnest.mcp.browse import check_presets, preset_sandbox_kwargs, tool_result
from agentnest.session import DisplayItem

pytestmark = pytest.mark.timeout(120)

IMAGE = "local-image"


def text_of(result: Any) -> str:
    """The text blocks of a tool result, joined."""
    return "".join(getattr(block, "text", "") for block in result.content)


def tiny_png(width: int = 1280, height: int = 720) -> bytes:
    """A valid PNG header (IHDR) with the given size; enough for png_size and for the display item."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


def result(
    text: str = "Hello paragraph",
    console: tuple[ConsoleMessage, ...] = (),
    title: str = "A page",
    status: int | None = None,
) -> BrowseResult:
    png = tiny_png()
    item = DisplayItem("image/png", base64.b64encode(png).decode())
    shot = Screenshot(png, 1280, 720, "/workspace/screenshots/screenshot-0001.png", item)
    return BrowseResult(Page("file:///workspace/page.html", title, status), text, shot, console)


# -- formatting ------------------------------------------------------------------------------


def test_format_has_title_url_text_console_and_screenshot() -> None:
    log = ConsoleMessage("log", "hello\nconsole", "file:///workspace/page.html", 3)
    text, cut = format_browse(result(console=(log,), status=200), 5000)
    assert not cut
    lines = text.splitlines()
    assert lines[:3] == ["Title: A page", "URL: file:///workspace/page.html", "Status: 200"]
    assert "Page text:\nHello paragraph" in text
    assert "Console (1 message):\n[log] hello console (file:///workspace/page.html:3)" in text
    assert lines[-1].startswith("Screenshot: 1280x720 PNG, saved in the sandbox at /workspace/screenshots/")
    assert "image/png" in lines[-1]


def test_format_without_status_console_or_text() -> None:
    text, _ = format_browse(result(text="  ", title=""), 5000)
    assert "Status" not in text and "Title: (none)" in text
    assert "(no text)" in text and "Console: (empty)" in text


def test_a_long_page_is_cut_but_the_header_and_footer_stay() -> None:
    page = "HEAD" + "x" * 100_000 + "TAIL"
    text, cut = format_browse(result(text=page, console=(ConsoleMessage("log", "c", "", 0),)), 2000)
    assert cut and len(text) <= 2000
    assert text.startswith("Title: A page") and "HEAD" in text and "TAIL" in text
    assert "[log] c" in text and text.splitlines()[-1].startswith("Screenshot: ")


def test_many_console_messages_keep_the_newest() -> None:
    console = tuple(ConsoleMessage("error", f"message {i} " + "y" * 300, "", 0) for i in range(200))
    text, cut = format_browse(result(console=console), 20_000)
    assert cut and len(text) <= 20_000
    assert "Console (200 messages):" in text and f"message {200 - 1} " in text
    assert "message 0 " not in text and "are left out" in text
    few = tuple(ConsoleMessage("log", f"short {i}", "", 0) for i in range(200))
    text, _ = format_browse(result(console=few), 20_000)
    assert f"[the first {200 - CONSOLE_SHOWN} are left out]" in text
    assert text.count("[log] short") == CONSOLE_SHOWN and "short 199" in text
    small, _ = format_browse(result(console=console), 2000)
    assert len(small) <= 2000 and "message 199 " in small and "are left out" in small


# -- SandboxRunner.browse ------------------------------------------------------------------------


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    (tmp_path / "boxes").mkdir()
    return LocalBackend(tmp_path / "boxes")


@pytest.fixture
def browser_box(backend: LocalBackend) -> Iterator[Sandbox]:
    # A browser sandbox as far as AgentNest knows; its image has no Chromium.
    with Sandbox(IMAGE, 300, backend=backend, preset="browser") as sb:
        yield sb


class FakeBrowser:
    def __init__(self, outcome: BrowseResult | Exception) -> None:
        self.outcome = outcome
        self.calls: list[tuple[str, float | None, bool]] = []
        self.closed = False

    def browse(self, url: str, *, timeout: float | None = None, full_page: bool = False) -> BrowseResult:
        self.calls.append((url, timeout, full_page))
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    def close(self) -> None:
        self.closed = True


def with_fake(monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox, outcome: Any) -> FakeBrowser:
    fake = FakeBrowser(outcome)
    monkeypatch.setattr(sandbox, "browser", lambda **_: fake)
    return fake


def test_a_plain_sandbox_is_refused_with_the_fix(backend: LocalBackend) -> None:
    with Sandbox(IMAGE, 60, backend=backend) as sb, SandboxRunner(sb) as runner:
        assert not is_browser_sandbox(sb)
        with pytest.raises(UnsupportedCapabilityError, match=r'use Sandbox\(preset="browser"\)'):
            runner.browse("/workspace/page.html")


def test_browse_answers_with_text_and_the_screenshot(
    browser_box: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = with_fake(monkeypatch, browser_box, result())
    with SandboxRunner(browser_box, timeout=10, max_output_chars=3000) as runner:
        out = runner.browse("/workspace/page.html", full_page=True)
        assert isinstance(out, RunOutput) and out.ok and out.stdout == "Hello paragraph"
        assert "Hello paragraph" in out.text and out.display[0].mime == "image/png"
        assert fake.calls == [("/workspace/page.html", 10.0, True)]  # the runner's timeout, if under 30
        runner.browse("/workspace/page.html", timeout=120)
        assert fake.calls[-1][1] == 120.0
        assert "browser" in runner.describe("browse").lower()
    assert fake.closed  # close() ends the browser the runner used


@pytest.mark.parametrize(
    ("error", "expect", "timed_out"),
    [
        (NavigationError("goto: net::ERR_INTERNET_DISCONNECTED", "navigation"), "NavigationError", False),
        (BrowserTimeoutError("the page took too long", "timeout"), "timed out", True),
        (BrowserError("screenshot too large", "too_large"), "BrowserError", False),
        (ConfigurationError("url='ftp://x' has the scheme 'ftp'"), "scheme 'ftp'", False),
        (PolicyDeniedError("no browsing today"), "denied: no browsing today", False),
    ],
)
def test_failures_are_answers_for_the_model(
    browser_box: Sandbox, monkeypatch: pytest.MonkeyPatch, error: Exception, expect: str, timed_out: bool
) -> None:
    with_fake(monkeypatch, browser_box, error)
    with SandboxRunner(browser_box) as runner:
        out = runner.browse("http://example.com/")
        assert not out.ok and expect in out.text and out.timed_out is timed_out and out.display == ()


def test_program_errors_raise(browser_box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake(monkeypatch, browser_box, result())
    with SandboxRunner(browser_box) as runner:
        with pytest.raises(ConfigurationError, match="url must be str"):
            runner.browse(b"/workspace/x.html")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="full_page"):
            runner.browse("/workspace/x.html", full_page="yes")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="timeout"):
            runner.browse("/workspace/x.html", timeout=-1)


def test_without_playwright_the_answer_says_what_is_wrong(browser_box: Sandbox) -> None:
    # The real driver against an interpreter that has no Playwright.
    with SandboxRunner(browser_box, timeout=30) as runner:
        out = runner.browse("/workspace/page.html")
        assert not out.ok and "BrowserError" in out.text and "playwright" in out.text


@pytest.mark.anyio
async def test_abrowse(browser_box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake(monkeypatch, browser_box, result())
    with SandboxRunner(browser_box) as runner:
        assert (await runner.abrowse("/workspace/page.html")).ok


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_langchain_browse_tool_only_in_a_browser_sandbox(
    backend: LocalBackend, browser_box: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("langchain_core", reason="the dev extra installs langchain-core")
    from agentnest.integrations.langchain import build_langchain_tools

    with Sandbox(IMAGE, 60, backend=backend) as plain:
        assert "browse" not in {t.name for t in build_langchain_tools(plain)}
    with_fake(monkeypatch, browser_box, result())
    tools = {t.name: t for t in build_langchain_tools(browser_box, prefix="b_")}
    assert "b_browse" in tools and "file://" in tools["b_browse"].description
    assert "Hello paragraph" in tools["b_browse"].invoke({"url": "/workspace/page.html"})


# -- MCP ---------------------------------------------------------------------------------------


def test_presets_setting_is_validated() -> None:
    assert ServerSettings(presets=["browser", "browser"]).presets == ("browser",)
    assert check_presets(()) == ()
    with pytest.raises(ConfigurationError, match="presets"):
        ServerSettings(presets="browser")
    with pytest.raises(ConfigurationError, match="presets cannot allow"):
        ServerSettings(presets=("gpu-everything",))


def make_service(tmp_path: Path, backend: LocalBackend, **settings: Any) -> SandboxService:
    return SandboxService(
        ServerSettings(
            backend=backend,
            sandbox_kwargs={"image": IMAGE, "workspace_size": "32m", "scratch_size": "16m"},
            snapshot_dir=tmp_path / "snapshots",
            **settings,
        )
    )


def test_a_preset_the_operator_did_not_allow_is_refused(tmp_path: Path, backend: LocalBackend) -> None:
    service = make_service(tmp_path, backend)
    try:
        with pytest.raises(PolicyDeniedError, match=r"not allowed on this server \(allowed: none\)"):
            service.create_sandbox(preset="browser")
        assert backend.created == []
    finally:
        service.close()


def test_preset_kwargs_stay_under_the_ceiling(tmp_path: Path, backend: LocalBackend) -> None:
    settings = ServerSettings(backend=backend, presets=("browser",), sandbox_kwargs={"image": IMAGE})
    policy = SecurityPolicy(max_memory="1g", max_pids=256, allowed_images=(IMAGE,))
    kwargs, same = preset_sandbox_kwargs(settings, backend, policy, {"image": IMAGE}, "browser")
    assert same is policy  # the client's image: nothing added to the allowlist
    assert kwargs["preset"] == "browser" and kwargs["memory"] == 1024**3 and kwargs["pids"] == 256
    with pytest.raises(PolicyDeniedError):
        preset_sandbox_kwargs(settings, backend, policy, {}, "gpu")
    # Without an image the server's browser image is used, and allowed for this sandbox only.
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as patch:
        patch.setattr("agentnest.browser.image.browser_image", lambda **_: "agentnest/template:abc")
        patch.setattr("agentnest.browser.image._LOCAL_BACKENDS", ("docker", "gvisor", backend))
        kwargs, widened = preset_sandbox_kwargs(settings, backend, policy, {}, "browser")
    assert kwargs["image"] == "agentnest/template:abc"
    assert widened.allowed_images == (IMAGE, "agentnest/template:abc") and policy.allowed_images == (IMAGE,)
    with pytest.raises(ConfigurationError, match="cannot build the browser image"):
        preset_sandbox_kwargs(settings, backend, policy, {}, "browser")


def test_service_browse_refuses_a_plain_sandbox(tmp_path: Path, backend: LocalBackend) -> None:
    service = make_service(tmp_path, backend, presets=("browser",))
    try:
        sid = service.create_sandbox()["sandbox_id"]
        assert service.list_sandboxes()["sandboxes"][0]["preset"] is None
        with pytest.raises(UnsupportedCapabilityError, match="create_sandbox with preset 'browser'"):
            service.browse(sid, "/workspace/page.html")
        with pytest.raises(ConfigurationError, match="no sandbox"):
            service.browse("feedfeedfeed", "/workspace/page.html")
    finally:
        service.close()


def test_service_browse_answers_and_the_tool_result_carries_the_png(
    tmp_path: Path, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = make_service(tmp_path, backend, presets=("browser",))
    try:
        sid = service.create_sandbox(image=IMAGE, preset="browser", memory="256m")["sandbox_id"]
        entry = service._get(sid)
        fake = with_fake(monkeypatch, entry.sandbox, result(console=(ConsoleMessage("log", "hi", "", 0),)))
        for bad, match in [("ftp://x", "scheme"), ("", "not a URL")]:
            with pytest.raises(ConfigurationError, match=match):
                service.browse(sid, bad)
        with pytest.raises(ConfigurationError, match="timeout"):
            service.browse(sid, "/workspace/page.html", timeout=601)
        answer = service.browse(sid, "/workspace/page.html", True, 5)
        assert fake.calls == [("/workspace/page.html", 5.0, True)]
        assert answer["title"] == "A page" and answer["console"][0]["text"] == "hi"
        assert base64.b64decode(answer["screenshot"]["data"]).startswith(b"\x89PNG")
        called = tool_result(answer)
        text, image = called.content
        assert text.type == "text" and "Hello paragraph" in text.text
        assert image.type == "image" and image.mime_type == "image/png"
        assert image.data == answer["screenshot"]["data"]
        assert called.structured_content is not None
        assert "data" not in called.structured_content["screenshot"]
        assert "summary" not in called.structured_content
    finally:
        service.close()


@pytest.mark.anyio
async def test_the_browse_tool_is_listed_only_when_the_operator_allows_browsers(
    tmp_path: Path, backend: LocalBackend
) -> None:
    from mcp import Client

    for presets, listed in (((), False), (("browser",), True)):
        service = make_service(tmp_path, backend, presets=presets)
        try:
            async with Client(build_server(service)) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                assert ("browse" in tools) is listed
                assert "preset" in tools["create_sandbox"].input_schema["properties"]
                if listed:
                    schema = tools["browse"].input_schema
                    assert schema["required"] == ["sandbox_id", "url"]
                    assert "file://" in schema["properties"]["url"]["description"]
                    assert tools["browse"].annotations is not None
                    sid = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
                    refused = await client.call_tool("browse", {"sandbox_id": sid, "url": "/x.html"})
                    assert refused.is_error and "UnsupportedCapabilityError" in text_of(refused)
        finally:
            service.close()
