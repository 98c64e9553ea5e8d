"""Runs inside a browser sandbox's Python session: one Chromium, driven by Playwright.

The host (``agentnest.browser.driver``) sends this source once into a
dedicated Python session (``agentnest.browser``) and then calls
``__agentnest_browser__.call(REQUEST_JSON)`` for every action.  Each call
prints exactly one line, ``RESULT_MARK`` followed by a JSON object, and a
screenshot additionally goes out as a PNG display item.  The host treats all
of it as untrusted input: it bounds and validates every field.

Standard library plus Playwright only (no AgentNest import: the session's
interpreter is the image's ``python3``).

Why it is shaped like this:

* **One browser, one context, one page**, kept between calls: a second
  screenshot costs tens of milliseconds instead of a browser start.
* **Timeouts kill the page, not the sandbox.**  Every Playwright call gets
  the caller's timeout.  After a timeout the page is closed
  (``Target.closeTarget``: Chromium ends the renderer even when its script
  loops forever) and a fresh page replaces it; if even that fails, the
  whole browser is closed and starts again on the next call.  The sandbox,
  the session and every other process in it go on.
* **Chromium's own sandbox is off** (Playwright's default,
  ``chromium_sandbox=False``): it needs user namespaces, which AgentNest's
  seccomp profile refuses inside every sandbox.  The AgentNest sandbox is
  the boundary instead: no capabilities, read-only root, seccomp, no
  network but the egress proxy.
* **The egress proxy is Chromium's proxy**: with an allowlist the sandbox
  has ``HTTPS_PROXY``; every page's connections then go through it, are
  checked against the allowlist and become ``egress.*`` events.  Loopback
  (a page served inside the sandbox) bypasses it, as in every Chromium.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

#: The marker in front of the one result line each call prints.
RESULT_MARK = "\x00AGENTNEST-BROWSER\x00"
#: Chromium as Debian packages it; the headless shell has no crash reporter
#: to spawn (gVisor refuses that spawn) and starts faster.
HEADLESS_SHELL = "/usr/lib/chromium/chromium-headless-shell"
#: Tells Playwright to leave loopback direct when a proxy is set (Chromium's own rule).
LOOPBACK_DIRECT = "PLAYWRIGHT_DISABLE_FORCED_CHROMIUM_PROXIED_LOOPBACK"
#: Console messages kept (the oldest are dropped) and characters per message.
CONSOLE_KEEP = 1000
CONSOLE_TEXT = 4000
#: Characters of page text returned at most (the host bounds it again).
TEXT_LIMIT = 1_000_000
#: The URL schemes a page may be opened with.
SCHEMES = ("http:", "https:", "file:", "about:blank")


class _Png:
    """A display item: the interpreter sends ``_repr_png_`` as image/png."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def _repr_png_(self) -> bytes:
        return self.data


class BrowserFailure(Exception):
    """An expected failure, reported to the host as ``{"error": {"kind", "message"}}``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Driver:
    """The browser of this sandbox, with one page."""

    def __init__(self, viewport: tuple[int, int], artifacts: str, shot_limit: int) -> None:
        self.viewport = {"width": int(viewport[0]), "height": int(viewport[1])}
        self.artifacts = artifacts
        self.shot_limit = int(shot_limit)
        self.console: list[dict[str, object]] = []
        self.shots = 0
        # Playwright's objects (Any: Playwright is only in the sandbox's image).
        self._pw: Any = None
        self._browser: Any = None
        self._context: Any = None
        self._page: Any = None

    # -- lifecycle ---------------------------------------------------------------

    def _start(self) -> None:
        from playwright.sync_api import sync_playwright  # type: ignore[import-not-found]  # in the image only

        if self._pw is None:
            # Playwright sends even loopback through a configured proxy; a
            # page served inside the sandbox is the sandbox's own and never
            # needs the egress proxy (the image sets this too).
            os.environ[LOOPBACK_DIRECT] = "1"
            self._pw = sync_playwright().start()
        options: dict[str, object] = {"headless": True}
        if os.path.exists(HEADLESS_SHELL):
            options["executable_path"] = HEADLESS_SHELL
        proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("HTTP_PROXY")
        if proxy:
            # The allowlist's proxy; loopback stays direct (Chromium's own rule).
            options["proxy"] = {"server": proxy}
        self._browser = self._pw.chromium.launch(**options)

    def _page_now(self) -> Any:
        if self._browser is None or not self._browser.is_connected():
            self._browser = None
            self._context = None
            self._page = None
            self._start()
        if self._context is None:
            self._context = self._browser.new_context(viewport=self.viewport)
        if self._page is None or self._page.is_closed():
            self._page = self._context.new_page()
            self._page.on("console", self._on_console)
            self._page.on("pageerror", self._on_page_error)
        return self._page

    def _on_console(self, message: Any) -> None:
        try:
            location = message.location or {}
        except Exception:
            location = {}
        self._keep(
            {
                "type": str(message.type),
                "text": str(message.text)[:CONSOLE_TEXT],
                "url": str(location.get("url", ""))[:CONSOLE_TEXT],
                "line": int(location.get("lineNumber", 0) or 0),
            }
        )

    def _on_page_error(self, error: Any) -> None:
        self._keep({"type": "pageerror", "text": str(error)[:CONSOLE_TEXT], "url": "", "line": 0})

    def _keep(self, entry: dict[str, object]) -> None:
        self.console.append(entry)
        del self.console[:-CONSOLE_KEEP]

    def _discard_page(self) -> None:
        """Kill the page (and, failing that, the browser) after a timeout."""
        page, self._page = self._page, None
        try:
            if page is not None:
                page.close(run_before_unload=False)
        except Exception:  # the page would not close: end the whole browser instead
            self.close()

    def close(self) -> None:
        browser, pw = self._browser, self._pw
        self._pw = self._browser = self._context = self._page = None
        # Best effort, in order: a browser that already died cannot be closed,
        # and stopping Playwright then ends its driver (and any Chromium left).
        with contextlib.suppress(Exception):
            if browser is not None:
                browser.close()
        with contextlib.suppress(Exception):
            if pw is not None:
                pw.stop()

    # -- the calls ---------------------------------------------------------------

    def call(self, request: str) -> None:
        started = time.monotonic()
        try:
            args = json.loads(request)
            op = args.pop("op")
            method = getattr(self, "op_" + op, None)
            if method is None:
                raise BrowserFailure("input", f"unknown browser operation {op!r}")
            out = {"ok": method(**args)}
        except BrowserFailure as exc:
            out = {"error": {"kind": exc.kind, "message": str(exc)}}
        except Exception as exc:  # Playwright's errors, described for the host
            out = {"error": self._describe(exc, args if isinstance(args, dict) else {})}
        out["ms"] = round((time.monotonic() - started) * 1000, 1)
        print(RESULT_MARK + json.dumps(out))

    def _describe(self, exc: Exception, args: dict[str, object]) -> dict[str, str]:
        name = type(exc).__name__
        text = str(exc).split("\nCall log:")[0].strip()[:2000]
        if name == "TimeoutError":
            self._discard_page()
            return {"kind": "timeout", "message": text}
        if "net::ERR_" in text or "NS_ERROR" in text:
            # The page now shows Chromium's error page, whose late commit would
            # interrupt the next navigation: start that one on a fresh page.
            self._discard_page()
            return {"kind": "navigation", "message": text}
        if "Target page, context or browser has been closed" in text or "crashed" in text.lower():
            self._discard_page()
            return {"kind": "crashed", "message": text}
        return {"kind": "error", "message": f"{name}: {text}"}

    def op_goto(self, url: str, timeout: float, wait_until: str = "load") -> dict[str, object]:
        if not url.startswith(SCHEMES):
            raise BrowserFailure("input", f"url {url[:200]!r} is not http, https or file")
        page = self._page_now()
        response = page.goto(url, timeout=timeout * 1000, wait_until=wait_until)
        status = None
        if response is not None:
            status = response.status
            denied = response.headers.get("x-agentnest-egress", "")
            if denied.startswith("denied"):
                raise BrowserFailure("denied", f"the egress policy refused {url[:200]!r} ({denied[:300]})")
        return {"url": page.url, "title": page.title(), "status": status}

    def op_content(self, html: str, timeout: float) -> dict[str, object]:
        page = self._page_now()
        page.set_content(html, timeout=timeout * 1000)
        return {"url": page.url, "title": page.title(), "status": None}

    def op_text(self, selector: str, timeout: float) -> dict[str, object]:
        page = self._page_now()
        self._wait_for(page, selector, timeout)
        text = page.inner_text(selector, timeout=timeout * 1000)
        return {"text": text[:TEXT_LIMIT], "truncated": len(text) > TEXT_LIMIT, "url": page.url}

    def op_html(self, timeout: float = 0) -> dict[str, object]:
        page = self._page_now()
        html = page.content()
        return {"text": html[:TEXT_LIMIT], "truncated": len(html) > TEXT_LIMIT, "url": page.url}

    def op_click(self, selector: str, timeout: float) -> dict[str, object]:
        page = self._page_now()
        self._wait_for(page, selector, timeout)
        page.click(selector, timeout=timeout * 1000)
        return {"url": page.url}

    def op_fill(self, selector: str, value: str, timeout: float) -> dict[str, object]:
        page = self._page_now()
        self._wait_for(page, selector, timeout)
        page.fill(selector, value, timeout=timeout * 1000)
        return {"url": page.url}

    def op_press(self, selector: str, key: str, timeout: float) -> dict[str, object]:
        page = self._page_now()
        self._wait_for(page, selector, timeout)
        page.press(selector, key, timeout=timeout * 1000)
        return {"url": page.url}

    def op_wait(self, selector: str, timeout: float) -> dict[str, object]:
        page = self._page_now()
        self._wait_for(page, selector, timeout)
        return {"url": page.url}

    def op_evaluate(self, expression: str, timeout: float) -> dict[str, object]:
        page = self._page_now()
        value = page.evaluate(expression)
        text = json.dumps(value, default=str)
        if len(text) > TEXT_LIMIT:
            raise BrowserFailure(
                "too_large", f"the value is {len(text)} characters; the limit is {TEXT_LIMIT}"
            )
        return {"value": text}

    def op_screenshot(self, full_page: bool, timeout: float, name: str) -> dict[str, object]:
        page = self._page_now()
        png = page.screenshot(full_page=full_page, timeout=timeout * 1000, type="png")
        if len(png) > self.shot_limit:
            raise BrowserFailure(
                "too_large",
                f"the screenshot is {len(png)} bytes; the output limit is {self.shot_limit} bytes",
            )
        self.shots += 1
        os.makedirs(self.artifacts, exist_ok=True)
        path = os.path.join(self.artifacts, name or "screenshot-%04d.png" % self.shots)
        with open(path, "wb") as file:
            file.write(png)
        display(_Png(png))  # type: ignore[name-defined]  # noqa: F821  # the session's display()
        return {"path": path, "bytes": len(png), "url": page.url}

    def op_console(self, clear: bool, timeout: float = 0) -> dict[str, object]:
        entries = list(self.console)
        if clear:
            self.console.clear()
        return {"entries": entries}

    def op_url(self, timeout: float = 0) -> dict[str, object]:
        page = self._page_now()
        return {"url": page.url, "title": page.title(), "status": None}

    def op_close(self, timeout: float = 0) -> dict[str, object]:
        self.close()
        return {}

    @staticmethod
    def _wait_for(page: Any, selector: str, timeout: float) -> None:
        # A selector that matches nothing is its own error, not a generic timeout.
        try:
            page.wait_for_selector(selector, state="attached", timeout=timeout * 1000)
        except Exception as exc:
            if type(exc).__name__ == "TimeoutError":
                raise BrowserFailure(
                    "selector", f"no element matches selector {selector[:200]!r} after {timeout:g} s"
                ) from None
            raise
