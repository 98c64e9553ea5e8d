"""The browse tool's shared parts: is a sandbox a browser sandbox, and a page as text for a model.

Used by :meth:`SandboxRunner.browse <agentnest.integrations.SandboxRunner.browse>`
and by the MCP server's ``browse`` tool (:mod:`agentnest.mcp.browse`), so
that a model reads a page the same way through either.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedCapabilityError
from ._text import bound_text

if TYPE_CHECKING:
    from ..browser.driver import BrowseResult, ConsoleMessage

__all__ = ["CONSOLE_SHOWN", "format_browse", "is_browser_sandbox", "require_browser_sandbox"]

#: Console messages shown to the model (the last ones), and characters of each.
CONSOLE_SHOWN = 50
CONSOLE_TEXT = 500
#: Characters of the title and of the URL shown.
TITLE_CHARS = 500
URL_CHARS = 2000
#: The page text keeps at least this many characters, however long the rest is.
MIN_PAGE_CHARS = 200


def is_browser_sandbox(sandbox: Any) -> bool:
    """Whether ``sandbox`` was made with ``preset="browser"`` (it has Chromium and Playwright)."""
    config = getattr(sandbox, "config", None)
    return getattr(config, "preset", None) == "browser"


def require_browser_sandbox(sandbox: Any, fix: str = 'Sandbox(preset="browser")') -> None:
    """Raise :class:`UnsupportedCapabilityError` unless ``sandbox`` is a browser sandbox."""
    if not is_browser_sandbox(sandbox):
        raise UnsupportedCapabilityError(
            f"sandbox {getattr(sandbox, 'id', '?')} is not a browser sandbox, so it cannot browse; use {fix}"
        )


def _line(text: str, limit: int) -> str:
    """One line: newlines folded, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _console_lines(console: tuple[ConsoleMessage, ...], limit: int) -> list[str]:
    """The newest messages (at most CONSOLE_SHOWN, within about ``limit`` characters), oldest first."""
    lines: list[str] = []
    used = 0
    for message in reversed(console[-CONSOLE_SHOWN:]):
        line_no = f":{message.line}" if message.line > 0 else ""
        where = f" ({_line(message.url, 300)}{line_no})" if message.url else ""
        line = f"[{_line(message.type, 32)}] {_line(message.text, CONSOLE_TEXT)}{where}"
        if lines and used + len(line) + 1 > limit:
            break
        lines.append(line)
        used += len(line) + 1
    count = len(console)
    head = [f"Console ({count} message{'s' if count != 1 else ''}):"]
    if count > len(lines):
        head.append(f"[the first {count - len(lines)} are left out]")
    return head + lines[::-1]


def format_browse(result: BrowseResult, limit: int) -> tuple[str, bool]:
    """The page as one text for a model, within ``limit`` characters; and whether anything was cut.

    Title, URL and status first, the screenshot's size and path in the
    sandbox last, so that a long page text is what gets cut (head and tail
    kept), never them.  The console is shown with its newest messages.
    """
    page, shot = result.page, result.screenshot
    head = [f"Title: {_line(page.title, TITLE_CHARS) or '(none)'}", f"URL: {_line(page.url, URL_CHARS)}"]
    if page.status is not None:
        head.append(f"Status: {page.status}")
    console = _console_lines(result.console, max(limit // 4, 200)) if result.console else ["Console: (empty)"]
    foot = (
        f"Screenshot: {shot.width}x{shot.height} PNG, saved in the sandbox at {shot.path} "
        "(attached as image/png)"
    )
    # Room for the parts around the page text, and for bound_text's note on a cut.
    fixed = len("\n".join(head)) + len("\n".join(console)) + len(foot) + len("\n\nPage text:\n\n\n\n") + 64
    body, cut = bound_text(result.text.strip() or "(no text)", max(limit - fixed, MIN_PAGE_CHARS))
    text = "\n".join(head) + "\n\nPage text:\n" + body + "\n\n" + "\n".join(console) + "\n\n" + foot
    whole, cut_again = bound_text(text, limit)
    return whole, cut or cut_again or len(result.console) > CONSOLE_SHOWN
