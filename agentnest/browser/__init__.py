"""Browser sandboxes: the offline browser image and the host-side driver.

* :mod:`agentnest.browser.image`: the image (Debian's Chromium, Playwright).
* :mod:`agentnest.browser.driver`: :class:`Browser`, what ``Sandbox.browser()`` returns.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from .driver import Browser, BrowseResult, ConsoleMessage, Page, Screenshot
from .image import BROWSER_IMAGE, browser_image

__all__ = [
    "BROWSER_IMAGE",
    "BrowseResult",
    "Browser",
    "ConsoleMessage",
    "Page",
    "Screenshot",
    "browser_image",
]
