"""The browser preset's pure logic: URL checks, the untrusted answers, the image's spec.

The engine tests (tests/integration/test_browser_engine.py) drive a real
Chromium; here a scripted session stands in for the sandbox's interpreter, so
that what the host does with a malformed, hostile or failing answer is
checked exactly.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path
from typing import Any, cast

import pytest

from agentnest import (
    BrowserError,
    BrowserTimeoutError,
    ConfigurationError,
    ExecutionTimeoutError,
    NavigationError,
    SelectorNotFoundError,
    TemplateBuildError,
)
from agentnest._core import SandboxCore, bind
from agentnest.browser import driver, image
from agentnest.browser.driver import RESULT_MARK, Browser, check_url, png_size
from agentnest.session import DisplayItem


def tiny_png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://example.test/", "http://example.test/"),
        ("HTTPS://example.test/a?b=c", "HTTPS://example.test/a?b=c"),
        ("file:///workspace/a.html", "file:///workspace/a.html"),
        ("/workspace/a.html", "file:///workspace/a.html"),
    ],
)
def test_urls_a_browser_sandbox_opens(url: str, expected: str) -> None:
    assert check_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "ftp://a/",
        "javascript:alert(1)",
        "data:text/html,x",
        "chrome://settings",
        "a.html",
        "",
        "http://a b/",
        7,
    ],
)
def test_other_urls_are_refused_with_the_reason(url: Any) -> None:
    with pytest.raises(ConfigurationError, match="url="):
        check_url(url)


def test_png_size_reads_the_header_and_refuses_what_is_not_a_png() -> None:
    assert png_size(tiny_png(3, 2)) == (3, 2)
    for bad in (b"", b"GIF89a" + b"\x00" * 30, tiny_png(3, 2)[:20]):
        with pytest.raises(BrowserError, match="not a PNG"):
            png_size(bad)
    zero = bytearray(tiny_png(3, 2))
    zero[16:20] = b"\x00\x00\x00\x00"
    with pytest.raises(BrowserError, match="0x2"):
        png_size(bytes(zero))


class Result:
    def __init__(
        self, stdout: str, display: list[DisplayItem] | None = None, error: str | None = None
    ) -> None:
        self.stdout = stdout
        self.display = display or []
        self.error = error


class Session:
    """Answers each run with the next scripted result (or raises it)."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.runs: list[tuple[str, float | None]] = []
        self.closed = False

    def run(self, code: str, *, timeout: float | None = 30.0) -> Any:
        self.runs.append((code, timeout))
        if code.startswith('"""Runs inside'):  # the driver's source: set-up
            return Result("")
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


class Policy:
    max_output_bytes = 10 * 1024 * 1024


class Guard:
    policy = Policy()


class Config:
    workdir = "/workspace"


class FakeSandbox:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.guard = Guard()
        self.config = Config()
        self.sessions_opened = 0
        bind(self, cast(SandboxCore, self))  # the browser takes it as a sandbox's core

    def python_session(self, *, name: str | None = None) -> Session:
        assert name == driver.SESSION_NAME
        self.sessions_opened += 1
        return self.session


@pytest.fixture(autouse=True)
def sessions_of_the_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    """The browser opens its session through agentnest.session: the fake hands out its scripted one."""

    def open_session(core: FakeSandbox, *, name: str | None, start_timeout: float) -> Session:
        return core.python_session(name=name)

    monkeypatch.setattr(driver, "open_python_session", open_session)


def answer(payload: Any) -> Result:
    return Result("some page output\n" + RESULT_MARK + json.dumps(payload) + "\n")


def browser_with(*answers: Any) -> tuple[Browser, FakeSandbox]:
    sandbox = FakeSandbox(Session(list(answers)))
    return Browser(sandbox, timeout=5), sandbox


def test_answers_become_values_and_errors_of_the_one_tree() -> None:
    browser, _ = browser_with(
        answer({"ok": {"url": "http://a.test/", "title": "A", "status": 200}}),
        answer({"error": {"kind": "timeout", "message": "Timeout 5000ms exceeded"}}),
        answer({"error": {"kind": "selector", "message": "no element matches selector '#x' after 5 s"}}),
        answer({"error": {"kind": "denied", "message": "the egress policy refused 'http://b.test/'"}}),
        answer({"error": {"kind": "input", "message": "unknown browser operation 'x'"}}),
        answer({"error": {"kind": "something new", "message": "odd"}}),
    )
    page = browser.goto("http://a.test/")
    assert (page.url, page.title, page.status) == ("http://a.test/", "A", 200)
    with pytest.raises(BrowserTimeoutError) as timeout:
        browser.text()
    assert isinstance(timeout.value, TimeoutError)
    with pytest.raises(SelectorNotFoundError, match="#x"):
        browser.click("#x")
    with pytest.raises(NavigationError) as denied:
        browser.goto("http://b.test/")
    assert denied.value.kind == "denied"
    with pytest.raises(ConfigurationError):
        browser.text()
    with pytest.raises(BrowserError) as odd:
        browser.text()
    assert odd.value.kind == "something new"


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "no marker at all\n",
        RESULT_MARK + "{not json\n",
        RESULT_MARK + json.dumps([1, 2]) + "\n",
        RESULT_MARK + json.dumps({"ok": "a string, not an object"}) + "\n",
    ],
)
def test_a_malformed_answer_is_a_clear_error(stdout: str) -> None:
    browser, _ = browser_with(Result(stdout))
    with pytest.raises(BrowserError, match="answer"):
        browser.text()


def test_hostile_values_are_bounded_and_typed() -> None:
    browser, _ = browser_with(
        answer({"ok": {"url": "u" * 100_000, "title": ["not", "a", "str"], "status": True}}),
        answer({"ok": {"text": "x" * (driver.TEXT_LIMIT + 10)}}),
        answer(
            {"ok": {"entries": [{"type": "log", "text": "t" * 10_000, "url": 3, "line": "7"}, "junk"] * 600}}
        ),
    )
    page = browser.goto("http://a.test/")
    assert len(page.url) == 8192 and page.title == "" and page.status is None
    assert len(browser.text()) == driver.TEXT_LIMIT
    entries = browser.console()
    assert len(entries) == 500  # the first CONSOLE_MAX (1000) items read, the 500 non-objects skipped
    assert entries[0].text == "t" * 4000 and entries[0].url == "" and entries[0].line == 0


def test_a_screenshot_must_come_back_as_one_png() -> None:
    png = tiny_png(4, 3)
    item = DisplayItem("image/png", __import__("base64").b64encode(png).decode())
    ok = {"ok": {"path": "/workspace/screenshots/screenshot-0001.png", "bytes": len(png)}}
    browser, _ = browser_with(
        Result(answer(ok).stdout, [item]),
        answer(ok),  # no display item
        Result(answer(ok).stdout, [DisplayItem("image/png", "aGVsbG8=")]),  # "hello": not a PNG
    )
    shot = browser.screenshot()
    assert (shot.width, shot.height, shot.png, shot.path) == (4, 3, png, ok["ok"]["path"])
    with pytest.raises(BrowserError, match="no PNG"):
        browser.screenshot()
    with pytest.raises(BrowserError, match="not a PNG"):
        browser.screenshot()


def test_a_browser_that_does_not_answer_is_restarted_not_the_sandbox() -> None:
    browser, sandbox = browser_with(
        ExecutionTimeoutError("ran past its timeout"),
        answer({"ok": {"url": "about:blank", "title": "", "status": None}}),
    )
    with pytest.raises(BrowserTimeoutError, match="starts again"):
        browser.goto("http://a.test/", timeout=2)
    assert sandbox.session.closed
    # The session's budget was the action's timeout, the grace and the first start.
    assert sandbox.session.runs[-1][1] == 2 + driver.GRACE + driver.START_TIME
    browser.goto("http://a.test/")
    assert sandbox.sessions_opened == 2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda b: b.text(timeout=0), "timeout="),
        (lambda b: b.text(timeout=float("nan")), "timeout="),
        (lambda b: b.text(timeout=10_000), "timeout="),
        (lambda b: b.click(""), "selector="),
        (lambda b: b.fill("#a", 3), "value"),
        (lambda b: b.press("#a", ""), "key="),
        (lambda b: b.goto("http://a/", wait_until="never"), "wait_until="),
        (lambda b: b.screenshot(name="../x.png"), "name="),
        (lambda b: b.screenshot(name="x.jpg"), "name="),
        (lambda b: b.evaluate(" "), "expression"),
    ],
)
def test_bad_arguments_are_refused_before_the_sandbox_is_asked(call: Any, match: str) -> None:
    browser, sandbox = browser_with()
    with pytest.raises(ConfigurationError, match=match):
        call(browser)
    assert sandbox.sessions_opened == 0


def test_viewport_is_checked() -> None:
    for bad in ((0, 10), (10,), [10, 10], (10, 10_000), (True, 10)):
        with pytest.raises(ConfigurationError, match="viewport="):
            Browser(FakeSandbox(Session([])), viewport=bad)  # type: ignore[arg-type]


def test_the_image_spec_is_offline_and_wires_playwright_to_debians_chromium(tmp_path: Path) -> None:
    for name in (
        f"playwright-{image.PLAYWRIGHT_VERSION}-py3-none-manylinux1_x86_64.whl",
        "greenlet-3.5.6-cp311-cp311-manylinux_2_28_x86_64.whl",
    ):
        (tmp_path / name).write_bytes(b"wheel")
    template = image.browser_template(tmp_path, base_image="agentnest/base:test")
    assert {"chromium", "chromium-headless-shell"} <= set(template.apt_packages)
    assert any(p.startswith("fonts-") for p in template.apt_packages)
    assert template.pip_packages == (f"playwright=={image.PLAYWRIGHT_VERSION}",)
    assert template.environment["PLAYWRIGHT_BROWSERS_PATH"] == image.BROWSERS_PATH
    assert template.environment["PLAYWRIGHT_DISABLE_FORCED_CHROMIUM_PROXIED_LOOPBACK"] == "1"
    assert template.files[image.SETUP_SCRIPT] == image.setup_source()
    assert template.commands == (f"python3 {image.SETUP_SCRIPT} && rm {image.SETUP_SCRIPT}",)


def test_wheels_from_a_directory_that_lacks_them_say_how_to_fill_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(image.WHEELS_ENV, str(tmp_path))
    with pytest.raises(TemplateBuildError, match="pip download") as info:
        image.browser_wheels("x86_64")
    assert str(tmp_path) in str(info.value)
    (tmp_path / f"playwright-{image.PLAYWRIGHT_VERSION}-py3-none-manylinux1_x86_64.whl").write_bytes(b"w")
    (tmp_path / "greenlet-3.5.6-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"w")
    assert image.browser_wheels("x86_64") == tmp_path
    monkeypatch.delenv(image.WHEELS_ENV)
    with pytest.raises(TemplateBuildError, match="architecture"):
        image.browser_wheels("s390x")


def test_a_cache_that_cannot_be_written_or_a_pip_that_cannot_start_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(image.WHEELS_ENV, raising=False)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with pytest.raises(TemplateBuildError, match="XDG_CACHE_HOME") as info:
        image.browser_wheels("x86_64")
    assert info.value.__cause__ is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(TemplateBuildError, match=image.WHEELS_ENV):
        image.browser_wheels("x86_64")
    # The half-made download directory is gone; nothing pretends to be a cache.
    assert list((tmp_path / "cache" / "agentnest" / "wheels").iterdir()) == []
