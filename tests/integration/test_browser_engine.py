"""The browser preset against the real engine, on runc and on gVisor.

One browser sandbox per runtime, with an egress allowlist: the egress tests'
server container stands in for the allowed site (``www.allowed.test``) and
for a refused one (``refused.test``, mapped too, so that a refusal is the
proxy's decision).  Pages served inside the sandbox come from a loopback
server started in a Python session.  Screenshots are decoded with Pillow.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentnest import (
    BrowserError,
    BrowserTimeoutError,
    ConfigurationError,
    NavigationError,
    Sandbox,
    SecurityPolicy,
    SelectorNotFoundError,
)
from agentnest.browser.driver import png_size

from .test_egress import allowlist, certs, make_backend, server  # noqa: F401  # fixtures reused

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

INDEX = """<!doctype html>
<html><head><title>Local page</title></head>
<body style="margin:0;background:#ffffff">
<div id="band" style="position:absolute;left:0;top:0;width:1280px;height:100px;background:#ff0000"></div>
<h1 style="margin-top:120px">Hello from inside the sandbox</h1>
<form action="/result.html" method="get">
  <input id="q" name="q"><button id="go" type="submit">Go</button>
</form>
<script>console.log("console from the page")</script>
</body></html>
"""
RESULT = """<!doctype html><html><head><title>Result</title></head><body><p id="out"></p>
<script>document.getElementById("out").textContent =
  "you sent " + new URLSearchParams(location.search).get("q");</script></body></html>
"""
# A loopback server in the sandbox; /slow never answers (a page that never loads).
SERVE = """
import functools, http.server, threading, time
class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.path.startswith("/slow"):
            time.sleep(3600)
        return super().do_GET()
_handler = functools.partial(Handler, directory="/workspace/site")
_srv = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), _handler)
_srv.daemon_threads = True
threading.Thread(target=_srv.serve_forever, daemon=True).start()
"""


@pytest.fixture(scope="module")
def sandbox(backend_name: str, server: dict[str, Any], certs: Path) -> Iterator[Sandbox]:  # noqa: F811
    backend = make_backend(backend_name, server)
    try:
        with Sandbox(preset="browser", backend=backend, security_policy=allowlist(server), timeout=900) as sb:
            sb.write_file("site/index.html", INDEX)
            sb.write_file("site/result.html", RESULT)
            sb.python_session(name="site").run(SERVE).check()
            yield sb
    finally:
        backend.close()


def pixels(png: bytes) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(png))
    image.load()
    return image.convert("RGB")


def test_a_local_page_text_screenshot_and_console(sandbox: Sandbox) -> None:
    browser = sandbox.browser()
    page = browser.goto("http://127.0.0.1:8000/index.html")
    assert (page.title, page.status) == ("Local page", 200)
    assert "Hello from inside the sandbox" in browser.text()
    shot = browser.screenshot(name="index.png")
    assert (shot.width, shot.height) == (1280, 720) == png_size(shot.png)
    image = pixels(shot.png)
    assert image.size == (1280, 720)
    # Not blank: the red band is at the top, the page is white below it.
    assert image.getpixel((640, 50)) == (255, 0, 0)
    assert image.getpixel((640, 700)) == (255, 255, 255)
    assert len(image.getcolors(1 << 20) or []) > 2  # the heading's text too
    # The same PNG is a display item and a workspace file (an artifact).
    assert shot.display.mime == "image/png" and shot.display.raw() == shot.png
    assert shot.path == "/workspace/screenshots/index.png"
    assert sandbox.read_file(shot.path, encoding=None) == shot.png
    assert "screenshots/index.png" in {a.path for a in sandbox.artifacts()}
    assert any(m.text == "console from the page" and m.type == "log" for m in browser.console())


def test_a_form_is_filled_and_submitted(sandbox: Sandbox) -> None:
    browser = sandbox.browser()
    browser.goto("http://127.0.0.1:8000/index.html")
    browser.fill("#q", "agentnest")
    browser.click("#go")
    browser.wait_for("#out:has-text('you sent')")
    assert browser.text("#out") == "you sent agentnest"
    assert browser.evaluate("location.pathname") == "/result.html"


def test_an_allowed_site_is_browsed_through_the_proxy_and_logged(sandbox: Sandbox) -> None:
    browser = sandbox.browser()
    before = len(sandbox.network_log())
    page = browser.goto("http://www.allowed.test:8080/page")
    assert page.status == 200
    assert browser.text() == "hello www.allowed.test:8080"
    events = wait_for_event(sandbox, before, "www.allowed.test", "egress.allowed")
    assert events, "the page's connection is not in the network log"


def test_a_refused_site_fails_the_navigation_and_is_logged(sandbox: Sandbox) -> None:
    browser = sandbox.browser()
    before = len(sandbox.network_log())
    with pytest.raises(NavigationError) as info:
        browser.goto("http://refused.test:8080/")
    assert info.value.kind == "denied" and "refused.test" in str(info.value)
    assert wait_for_event(sandbox, before, "refused.test", "egress.denied")
    # The browser and the sandbox go on.
    assert browser.goto("http://127.0.0.1:8000/index.html").title == "Local page"


def test_a_page_that_loops_forever_is_stopped_and_the_sandbox_lives_on(sandbox: Sandbox) -> None:
    browser = sandbox.browser()
    started = time.monotonic()
    with pytest.raises(BrowserTimeoutError) as info:
        browser.set_content("<h1>busy</h1><script>while (true) {}</script>", timeout=3)
    assert isinstance(info.value, TimeoutError) and info.value.kind == "timeout"
    assert time.monotonic() - started < 3 + 15  # the page's timeout plus the grace, never the sandbox's
    assert browser.goto("http://127.0.0.1:8000/index.html").title == "Local page"
    assert sandbox.exec_shell("echo alive").stdout == "alive\n"


def test_a_page_that_never_loads_times_out(sandbox: Sandbox) -> None:
    browser = sandbox.browser()
    with pytest.raises(BrowserTimeoutError):
        browser.goto("http://127.0.0.1:8000/slow", timeout=2)
    browser.goto("http://127.0.0.1:8000/index.html")
    assert "Hello" in browser.text()


def test_bad_input_gets_clear_errors_and_the_browser_survives(sandbox: Sandbox) -> None:
    browser = sandbox.browser()
    for url in ("ftp://127.0.0.1/", "javascript:alert(1)", "data:text/html,x", "", "relative/path.html"):
        with pytest.raises(ConfigurationError, match="url="):
            browser.goto(url)
    browser.goto("http://127.0.0.1:8000/index.html")
    started = time.monotonic()
    with pytest.raises(SelectorNotFoundError) as info:
        browser.click("#does-not-exist", timeout=1)
    assert "#does-not-exist" in str(info.value) and isinstance(info.value, LookupError)
    assert time.monotonic() - started < 15
    with pytest.raises(ConfigurationError, match="timeout="):
        browser.text(timeout=0)
    assert "Hello" in browser.text()


def test_playwright_just_works_in_a_python_session(sandbox: Sandbox) -> None:
    session = sandbox.python_session(name="direct")
    result = session.run(
        "from playwright.sync_api import sync_playwright\n"
        "with sync_playwright() as p:\n"
        "    b = p.chromium.launch()\n"
        "    pg = b.new_page()\n"
        "    pg.set_content('<p>driven directly</p>')\n"
        "    print(pg.inner_text('p'), b.version.split('.')[0].isdigit())\n"
        "    b.close()\n",
        timeout=120,
    ).check()
    assert result.stdout == "driven directly True\n"
    session.close()


def test_a_screenshot_over_the_output_limit_is_refused(backend_name: str) -> None:
    policy = SecurityPolicy(max_output_bytes=64 * 1024)
    with Sandbox(preset="browser", backend=backend_name, security_policy=policy, timeout=300) as sb:
        browser = sb.browser(viewport=(1600, 1200))
        # Noise compresses badly: the PNG is far over 64 KiB.
        browser.set_content(
            "<canvas id=c width=1600 height=1200></canvas><script>"
            "const c = document.getElementById('c').getContext('2d');"
            "const d = c.createImageData(1600, 1200);"
            "for (let i = 0; i < d.data.length; i++) d.data[i] = Math.random() * 255;"
            "c.putImageData(d, 0, 0);</script>"
        )
        with pytest.raises(BrowserError) as info:
            browser.screenshot()
        assert info.value.kind == "too_large" and "output limit" in str(info.value)
        assert browser.text("body") == ""  # the page and the sandbox are intact
        assert sb.exec_shell("echo alive").stdout == "alive\n"


def wait_for_event(sb: Sandbox, before: int, host: str, kind: str, within: float = 10.0) -> list[Any]:
    """The proxy's events arrive from its reader thread: wait for the one expected."""
    end = time.monotonic() + within
    while True:
        found = [e for e in sb.network_log()[before:] if e.get("host") == host and e.get("type") == kind]
        if found or time.monotonic() > end:
            return found
        time.sleep(0.05)


def test_async_browser_sandbox_with_the_preset_defaults(backend_name: str) -> None:
    import anyio

    from agentnest import AsyncSandbox
    from agentnest.config import MiB

    async def main() -> tuple[str, str, int, int]:
        async with AsyncSandbox.create(preset="browser", backend=backend_name, timeout=300) as sb:
            browser = await sb.browser()
            await browser.set_content("<title>async</title><p>awaited page</p>")
            text = await browser.text("p")
            shot = await browser.screenshot()
            config = sb.config
            assert config.preset == "browser" and config.limits.pids == 512
            return text, config.image, config.limits.memory, shot.width

    text, image, memory, width = anyio.run(main)
    assert text == "awaited page" and width == 1280
    assert memory == 2048 * MiB  # the preset's default, not AsyncSandbox.create's 512m
    assert image.startswith("agentnest/template:")
