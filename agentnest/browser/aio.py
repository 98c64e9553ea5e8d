"""``AsyncBrowser``: :class:`~agentnest.browser.Browser` with every action awaited.

Each action runs in a worker thread (``anyio.to_thread``), as
:class:`~agentnest.AsyncSandbox` runs its operations; validation and errors
are the synchronous browser's.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import functools
from typing import Any

import anyio.to_thread

from .driver import Browser, BrowseResult, ConsoleMessage, Page, Screenshot


class AsyncBrowser:
    """The twin of :class:`~agentnest.browser.Browser`; see there for every action."""

    def __init__(self, browser: Browser) -> None:
        self._browser = browser

    async def _run(self, action: str, /, *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(
            functools.partial(getattr(self._browser, action), *args, **kwargs)
        )

    async def goto(self, url: str, *, timeout: float | None = None, wait_until: str = "load") -> Page:
        """See :meth:`Browser.goto`."""
        page: Page = await self._run("goto", url, timeout=timeout, wait_until=wait_until)
        return page

    async def set_content(self, html: str, *, timeout: float | None = None) -> Page:
        """See :meth:`Browser.set_content`."""
        page: Page = await self._run("set_content", html, timeout=timeout)
        return page

    async def text(self, selector: str = "body", *, timeout: float | None = None) -> str:
        """See :meth:`Browser.text`."""
        return str(await self._run("text", selector, timeout=timeout))

    async def html(self, *, timeout: float | None = None) -> str:
        """See :meth:`Browser.html`."""
        return str(await self._run("html", timeout=timeout))

    async def click(self, selector: str, *, timeout: float | None = None) -> Page:
        """See :meth:`Browser.click`."""
        page: Page = await self._run("click", selector, timeout=timeout)
        return page

    async def fill(self, selector: str, value: str, *, timeout: float | None = None) -> None:
        """See :meth:`Browser.fill`."""
        await self._run("fill", selector, value, timeout=timeout)

    async def press(self, selector: str, key: str, *, timeout: float | None = None) -> None:
        """See :meth:`Browser.press`."""
        await self._run("press", selector, key, timeout=timeout)

    async def wait_for(self, selector: str, *, timeout: float | None = None) -> None:
        """See :meth:`Browser.wait_for`."""
        await self._run("wait_for", selector, timeout=timeout)

    async def evaluate(self, expression: str, *, timeout: float | None = None) -> Any:
        """See :meth:`Browser.evaluate`."""
        return await self._run("evaluate", expression, timeout=timeout)

    async def screenshot(
        self, *, full_page: bool = False, name: str | None = None, timeout: float | None = None
    ) -> Screenshot:
        """See :meth:`Browser.screenshot`."""
        shot: Screenshot = await self._run("screenshot", full_page=full_page, name=name, timeout=timeout)
        return shot

    async def console(self, *, clear: bool = False) -> tuple[ConsoleMessage, ...]:
        """See :meth:`Browser.console`."""
        entries: tuple[ConsoleMessage, ...] = await self._run("console", clear=clear)
        return entries

    async def browse(
        self, url: str, *, timeout: float | None = None, full_page: bool = False
    ) -> BrowseResult:
        """See :meth:`Browser.browse`."""
        result: BrowseResult = await self._run("browse", url, timeout=timeout, full_page=full_page)
        return result

    async def close(self) -> None:
        """See :meth:`Browser.close`."""
        await self._run("close")

    async def __aenter__(self) -> AsyncBrowser:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
