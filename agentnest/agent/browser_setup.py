"""Runs once inside the browser image's build (as root): wire Playwright to Debian's Chromium.

Playwright looks for its own browser builds under ``PLAYWRIGHT_BROWSERS_PATH``
and would download them; downloads are impossible in an offline build (and in
many locked-down networks).  This links the paths Playwright expects to
Debian's ``chromium`` and ``chromium-headless-shell``, so that plain
``sync_playwright().start().chromium.launch()`` in a sandbox just works, then
proves it: a page is rendered and screenshotted, or the build fails.

The expected paths are asked of Playwright itself (its error for a missing
browser names the path), so a new Playwright release needs no change here.
Standard library plus Playwright; no AgentNest import.
"""

from __future__ import annotations

import os
import re
import sys

FULL = "/usr/lib/chromium/chromium"
HEADLESS_SHELL = "/usr/lib/chromium/chromium-headless-shell"
_MISSING = re.compile(r"Executable doesn't exist at (\S+)")


def _link(path: str, target: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(target, path)
    # Playwright treats a browser directory as installed once this marker exists.
    open(os.path.join(os.path.dirname(os.path.dirname(path)), "INSTALLATION_COMPLETE"), "w").close()
    print(f"agentnest: {path} -> {target}")


def main() -> int:
    from playwright.sync_api import Error, sync_playwright  # type: ignore[import-not-found]  # in the image only

    with sync_playwright() as pw:
        _link(pw.chromium.executable_path, FULL)
        for _ in range(3):
            try:
                browser = pw.chromium.launch()
            except Error as exc:
                found = _MISSING.search(str(exc))
                if found is None:
                    raise
                _link(found.group(1), HEADLESS_SHELL)
                continue
            page = browser.new_page()
            page.set_content("<h1 style='font-family:sans-serif'>AgentNest</h1>")
            text = page.inner_text("h1")
            png = page.screenshot()
            version = browser.version
            browser.close()
            if text != "AgentNest" or not png.startswith(b"\x89PNG"):
                print("agentnest: the browser did not render a test page", file=sys.stderr)
                return 1
            print(f"agentnest: Chromium {version} renders pages ({len(png)} byte screenshot)")
            return 0
    print("agentnest: Playwright kept asking for browsers that are not installed", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
