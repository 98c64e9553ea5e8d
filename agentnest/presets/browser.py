"""The browser preset: :func:`browser_sandbox` (0.3.0's signature).

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from typing import Any

from ..browser.image import BROWSER_IMAGE
from ..policy import SecurityPolicy
from ..sandbox import Sandbox

__all__ = ["BROWSER_IMAGE", "browser_sandbox"]


def browser_sandbox(
    *,
    timeout: float = 300,
    image: str = BROWSER_IMAGE,
    security_policy: SecurityPolicy | None = None,
    **kwargs: Any,
) -> Sandbox:
    """Create a sandbox with Chromium and Playwright: ``Sandbox(preset="browser")``.

    The image is AgentNest's own, built offline on first use from Debian's
    Chromium and Playwright's wheel (:mod:`agentnest.browser.image`; about
    half a minute once, then cached).  Drive it with ``sandbox.browser()``,
    or with Playwright in the sandbox (``from playwright.sync_api import
    sync_playwright`` just works there).

    Args:
        timeout: the sandbox's lifetime in seconds.
        image: the browser image; by default AgentNest's
            (``agentnest/preset:browser``, built if missing).  Another image
            needs Playwright and a Chromium it can launch.
        security_policy: the policy; by default :class:`SecurityPolicy`'s
            (no network: give the sites the browser may reach with
            ``NetworkPolicy.allowlist(domains=...)``; the egress proxy is then
            Chromium's proxy, and every connection an ``egress.*`` event).
        kwargs: any other :class:`~agentnest.Sandbox` argument; ``memory``
            defaults to ``"2g"``, ``pids`` to 512 and ``scratch_size`` to
            ``"256m"`` (a browser starts many processes and keeps its profile in
            ``/tmp``).

    Returns:
        The running :class:`~agentnest.Sandbox`.

    Raises:
        TemplateBuildError: the browser image could not be built (the message
            has the step's output).
        ImageNotFoundError: ``image`` is not on the engine and cannot be pulled.
    """
    kwargs.setdefault("preset", "browser")
    return Sandbox(
        None if image == BROWSER_IMAGE else image, timeout, security_policy=security_policy, **kwargs
    )
