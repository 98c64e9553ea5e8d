"""``Sandbox.browser()``: drive the Chromium inside a browser sandbox from the host.

Every action runs in the sandbox, in a dedicated Python session
(``agentnest.browser``) that holds one Playwright browser with one page
(``agent/browser.py``); the host sends one small call per action and reads
back one JSON line (and, for a screenshot, a PNG display item).  The page,
not the sandbox, pays for a timeout: it is closed and the next action gets a
fresh one.  Everything that comes back is untrusted and bounded here.

Example::

    from agentnest import Sandbox

    with Sandbox(preset="browser") as sandbox:
        browser = sandbox.browser()
        browser.goto("file:///workspace/index.html")
        print(browser.text())
        shot = browser.screenshot()          # PNG bytes, a display item and a workspace file
        browser.fill("#q", "agentnest")
        browser.click("button[type=submit]")
        print(browser.console())
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import struct
import threading
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from .._core import core_of
from ..errors import (
    AgentNestError,
    BrowserError,
    BrowserTimeoutError,
    ConfigurationError,
    ExecutionTimeoutError,
    NavigationError,
    SelectorNotFoundError,
    SessionLostError,
)
from ..session import open_python_session

if TYPE_CHECKING:
    from ..session import DisplayItem, PythonSession

#: The session that holds the browser.
SESSION_NAME = "agentnest.browser"
#: Where screenshots are kept, relative to the workspace (they are artifacts).
SCREENSHOT_DIR = "screenshots"
#: Mirrors agent/browser.py.
RESULT_MARK = "\x00AGENTNEST-BROWSER\x00"
#: Largest page text accepted from the sandbox (characters).
TEXT_LIMIT = 1_000_000
#: Largest display item the in-sandbox interpreter sends (agent/repl.py).
DISPLAY_ITEM_LIMIT = 16 * 1024 * 1024
#: Bounds of one action's timeout (seconds) and of a viewport side (pixels).
MAX_TIMEOUT = 600.0
MAX_SIDE = 8192
#: Time beyond an action's own timeout for the page to be closed and the
#: answer to come back, before the host gives up on the session.
GRACE = 15.0
#: The first action also starts Chromium.
START_TIME = 60.0
#: URL schemes a page may be opened with.
SCHEMES = ("http", "https", "file")
#: Console entries kept from one answer.
CONSOLE_MAX = 1000


@dataclass(frozen=True, slots=True)
class Page:
    """Where the page is after an action: its URL, title and HTTP status (None for files)."""

    url: str
    title: str
    status: int | None


@dataclass(frozen=True, slots=True)
class Screenshot:
    """A screenshot: PNG bytes, their size in pixels, the display item and the workspace file."""

    png: bytes
    width: int
    height: int
    path: str
    """Absolute path of the PNG inside the sandbox (under ``/workspace/screenshots``)."""
    display: DisplayItem
    """The same PNG as a notebook display item (``image/png``)."""


@dataclass(frozen=True, slots=True)
class ConsoleMessage:
    """One console message or uncaught page error (``type`` ``"pageerror"``)."""

    type: str
    text: str
    url: str
    line: int


@dataclass(frozen=True, slots=True)
class BrowseResult:
    """What :meth:`Browser.browse` returns: the page, its text and a screenshot."""

    page: Page
    text: str
    screenshot: Screenshot
    console: tuple[ConsoleMessage, ...]


def check_url(url: object) -> str:
    """``url`` if it is an http, https or file URL (a bare absolute path becomes ``file://``)."""
    if not isinstance(url, str) or not url or len(url) > 8192 or any(c.isspace() for c in url):
        raise ConfigurationError(f"url={str(url)[:200]!r} is not a URL; give http://, https:// or file://")
    if url.startswith("/"):
        return "file://" + url
    scheme, sep, _ = url.partition(":")
    if not sep or scheme.lower() not in SCHEMES:
        raise ConfigurationError(
            f"url={url[:200]!r} has the scheme {scheme!r}; a browser sandbox opens "
            "http, https and file URLs only"
        )
    return url


def _timeout(value: object, what: str = "timeout") -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= MAX_TIMEOUT
    ):
        raise ConfigurationError(f"{what}={value!r} is out of range; use 0 < seconds <= {MAX_TIMEOUT:g}")
    return float(value)


def _selector(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 4096:
        raise ConfigurationError(
            f"selector={str(value)[:200]!r} must be a non-empty CSS or Playwright selector"
        )
    return value


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, read from its IHDR chunk (validated)."""
    if len(data) < 24 or not data.startswith(b"\x89PNG\r\n\x1a\n") or data[12:16] != b"IHDR":
        raise BrowserError("the sandbox sent a screenshot that is not a PNG", "error")
    width, height = struct.unpack(">II", data[16:24])
    if not (0 < width <= 1 << 16 and 0 < height <= 1 << 16):
        raise BrowserError(f"the sandbox sent a PNG of {width}x{height} pixels", "error")
    return width, height


_ERRORS: dict[str, type[BrowserError]] = {
    "timeout": BrowserTimeoutError,
    "selector": SelectorNotFoundError,
    "navigation": NavigationError,
    "denied": NavigationError,
}


class Browser:
    """The browser of one browser sandbox (see :meth:`agentnest.Sandbox.browser`).

    Args:
        sandbox: a sandbox of an image with Playwright (``preset="browser"``).
        timeout: default seconds per action (navigation, click...).
        viewport: the page's size in CSS pixels.

    Thread-safe: actions are serialised.

    .. versionadded:: 0.4.0
    """

    def __init__(
        self, sandbox: object, *, timeout: float = 30.0, viewport: tuple[int, int] = (1280, 720)
    ) -> None:
        self._sandbox = core_of(sandbox)
        self.timeout = _timeout(timeout)
        if (
            not isinstance(viewport, tuple)
            or len(viewport) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_SIDE for v in viewport)
        ):
            raise ConfigurationError(
                f"viewport={viewport!r} must be (width, height), each 1 to {MAX_SIDE} pixels"
            )
        self.viewport = viewport
        self._lock = threading.Lock()
        self._session: PythonSession | None = None
        self._started = False

    # -- plumbing ----------------------------------------------------------------

    def _limit(self) -> int:
        policy_limit = self._sandbox.guard.policy.max_output_bytes
        # Room for the result line next to the PNG in the same output budget.
        return max(1024, min(policy_limit, DISPLAY_ITEM_LIMIT) - 64 * 1024)

    def _open(self) -> PythonSession:
        if self._session is not None and not self._session.closed:
            return self._session
        session = open_python_session(self._sandbox, name=SESSION_NAME, start_timeout=30.0)
        source = _driver_source()
        artifacts = self._sandbox.config.workdir.rstrip("/") + "/" + SCREENSHOT_DIR
        setup = (
            source
            + "\n__agentnest_browser__ = globals().get('__agentnest_browser__') or Driver("
            + f"{self.viewport!r}, {artifacts!r}, {self._limit()})\n"
        )
        result = session.run(setup, timeout=30)
        if result.error:
            raise BrowserError(
                "the sandbox cannot drive a browser (is it a browser sandbox? `Sandbox(preset='browser')`): "
                + result.error.strip().splitlines()[-1][:500],
                "error",
            )
        self._session = session
        return session

    def _call(self, op: str, timeout: float, **args: Any) -> tuple[dict[str, Any], list[DisplayItem]]:
        with self._lock:
            session = self._open()
            request = json.dumps({"op": op, "timeout": timeout, **args})
            budget = timeout + GRACE + (START_TIME if not self._started else 0.0)
            try:
                result = session.run(f"__agentnest_browser__.call({request!r})", timeout=budget)
            except ExecutionTimeoutError:
                # The page (or Chromium) did not answer even after its own
                # timeout: end the session, which ends the browser with it.
                self._restart()
                raise BrowserTimeoutError(
                    f"the browser did not answer {op} within {budget:g} s; it was stopped and starts "
                    "again on the next action (the sandbox is unharmed)",
                    "timeout",
                ) from None
            except SessionLostError as exc:
                self._session = None
                self._started = False
                raise BrowserError(
                    f"the browser's session ended ({exc}); the next action starts a new one", "crashed"
                ) from None
            self._started = True
            answer = _parse(result.stdout, result.error)
            if "error" in answer:
                error = answer["error"]
                kind = str(error.get("kind", "error"))[:32] if isinstance(error, dict) else "error"
                message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
                if kind == "input":
                    raise ConfigurationError(message[:2000])
                raise _ERRORS.get(kind, BrowserError)(f"{op}: {message[:2000]}", kind)
            ok = answer.get("ok")
            if not isinstance(ok, dict):
                raise BrowserError(f"{op}: the sandbox sent a malformed answer", "error")
            return ok, list(result.display)

    def _restart(self) -> None:
        session, self._session = self._session, None
        self._started = False
        if session is not None:
            # Closing kills its interpreter and the Chromium under it; a
            # session that is already gone is what we are replacing anyway.
            with contextlib.suppress(AgentNestError):
                session.close()

    @staticmethod
    def _page(ok: dict[str, Any]) -> Page:
        status = ok.get("status")
        return Page(
            url=_text(ok.get("url"), 8192),
            title=_text(ok.get("title"), 4096),
            status=status
            if isinstance(status, int) and not isinstance(status, bool) and 0 <= status < 1000
            else None,
        )

    # -- actions -----------------------------------------------------------------

    def goto(self, url: str, *, timeout: float | None = None, wait_until: str = "load") -> Page:
        """Open ``url`` (http, https, or file: a page served or saved inside the sandbox).

        Raises:
            ConfigurationError: another scheme, or a bad ``wait_until``.
            NavigationError: the egress policy refused the site, or a network error.
            BrowserTimeoutError: the page did not load in time; it was closed.
        """
        url = check_url(url)
        if wait_until not in ("load", "domcontentloaded", "networkidle", "commit"):
            raise ConfigurationError(
                f"wait_until={wait_until!r}; use 'load', 'domcontentloaded', 'networkidle' or 'commit'"
            )
        ok, _ = self._call("goto", self._t(timeout), url=url, wait_until=wait_until)
        return self._page(ok)

    def set_content(self, html: str, *, timeout: float | None = None) -> Page:
        """Show ``html`` as the page (no network needed)."""
        if not isinstance(html, str) or len(html) > 4 * 1024 * 1024:
            raise ConfigurationError("html must be a str of at most 4 MiB")
        ok, _ = self._call("content", self._t(timeout), html=html)
        return self._page(ok)

    def text(self, selector: str = "body", *, timeout: float | None = None) -> str:
        """The visible text of the first element matching ``selector`` (the whole page by default)."""
        ok, _ = self._call("text", self._t(timeout), selector=_selector(selector))
        return _text(ok.get("text"), TEXT_LIMIT)

    def html(self, *, timeout: float | None = None) -> str:
        """The page's HTML as it is now."""
        ok, _ = self._call("html", self._t(timeout))
        return _text(ok.get("text"), TEXT_LIMIT)

    def click(self, selector: str, *, timeout: float | None = None) -> Page:
        """Click the element matching ``selector``.

        Raises:
            SelectorNotFoundError: nothing matches it within the timeout.
        """
        ok, _ = self._call("click", self._t(timeout), selector=_selector(selector))
        return Page(_text(ok.get("url"), 8192), "", None)

    def fill(self, selector: str, value: str, *, timeout: float | None = None) -> None:
        """Type ``value`` into the form field matching ``selector`` (replacing its content)."""
        if not isinstance(value, str) or len(value) > 1024 * 1024:
            raise ConfigurationError("value must be a str of at most 1 MiB")
        self._call("fill", self._t(timeout), selector=_selector(selector), value=value)

    def press(self, selector: str, key: str, *, timeout: float | None = None) -> None:
        """Press ``key`` (``"Enter"``, ``"Control+A"``) in the element matching ``selector``."""
        if not isinstance(key, str) or not key or len(key) > 64:
            raise ConfigurationError(f"key={key!r} must be a key name such as 'Enter'")
        self._call("press", self._t(timeout), selector=_selector(selector), key=key)

    def wait_for(self, selector: str, *, timeout: float | None = None) -> None:
        """Wait until an element matches ``selector``."""
        self._call("wait", self._t(timeout), selector=_selector(selector))

    def evaluate(self, expression: str, *, timeout: float | None = None) -> Any:
        """Evaluate a JavaScript expression in the page; its JSON value comes back."""
        if not isinstance(expression, str) or not expression.strip() or len(expression) > 1024 * 1024:
            raise ConfigurationError("expression must be a non-empty str of at most 1 MiB")
        ok, _ = self._call("evaluate", self._t(timeout), expression=expression)
        try:
            return json.loads(_text(ok.get("value"), TEXT_LIMIT))
        except ValueError:
            raise BrowserError("evaluate: the sandbox sent a value that is not JSON", "error") from None

    def screenshot(
        self, *, full_page: bool = False, name: str | None = None, timeout: float | None = None
    ) -> Screenshot:
        """A PNG of the page, kept in ``/workspace/screenshots`` (an artifact) and returned.

        Raises:
            BrowserError: (kind ``"too_large"``) the PNG is over the output
                limit (``SecurityPolicy.max_output_bytes``); try without
                ``full_page`` or a smaller viewport.
        """
        if name is not None and (
            not isinstance(name, str)
            or not name.endswith(".png")
            or "/" in name
            or name.startswith(".")
            or len(name) > 128
        ):
            raise ConfigurationError(f"name={name!r} must be a file name ending in .png (no directories)")
        ok, displays = self._call("screenshot", self._t(timeout), full_page=bool(full_page), name=name or "")
        items = [d for d in displays if d.mime == "image/png"]
        if len(items) != 1:
            raise BrowserError("screenshot: the sandbox sent no PNG", "error")
        png = items[0].raw()
        width, height = png_size(png)
        return Screenshot(png, width, height, _text(ok.get("path"), 4096), items[0])

    def console(self, *, clear: bool = False) -> tuple[ConsoleMessage, ...]:
        """The page's console messages and uncaught errors so far (the last 1000)."""
        ok, _ = self._call("console", self.timeout, clear=bool(clear))
        entries = ok.get("entries")
        out: list[ConsoleMessage] = []
        for entry in entries[:CONSOLE_MAX] if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                line = entry.get("line")
                out.append(
                    ConsoleMessage(
                        type=_text(entry.get("type"), 32),
                        text=_text(entry.get("text"), 4000),
                        url=_text(entry.get("url"), 4000),
                        line=line if isinstance(line, int) and not isinstance(line, bool) else 0,
                    )
                )
        return tuple(out)

    def browse(self, url: str, *, timeout: float | None = None, full_page: bool = False) -> BrowseResult:
        """Open ``url`` and return its text, a screenshot and the console: one call for a tool."""
        page = self.goto(url, timeout=timeout)
        return BrowseResult(
            page, self.text(timeout=timeout), self.screenshot(full_page=full_page), self.console()
        )

    def close(self) -> None:
        """Close the browser and its session (the next action starts them again)."""
        with self._lock:
            session, self._session = self._session, None
            self._started = False
            if session is not None and not session.closed:
                # Best effort: a session that is already gone has no browser left to close.
                with contextlib.suppress(AgentNestError):
                    session.run('__agentnest_browser__.call(\'{"op": "close"}\')', timeout=30)
                with contextlib.suppress(AgentNestError):
                    session.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else _timeout(timeout)


@functools.cache
def _driver_source() -> str:
    """``agent/browser.py``, sent into the session once per :class:`Browser`."""
    return resources.files("agentnest.agent").joinpath("browser.py").read_text(encoding="utf-8")


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _parse(stdout: str, error: str | None) -> dict[str, Any]:
    """The one result line of a call, validated."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            try:
                answer = json.loads(line[len(RESULT_MARK) :])
            except ValueError:
                break
            if isinstance(answer, dict):
                return answer
            break
    detail = (error or "").strip().splitlines()[-1:] or ["no answer"]
    raise BrowserError(f"the browser sent no answer ({detail[0][:500]})", "error")
