"""The browser preset: :func:`browser_sandbox` (0.3.0's signature).

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from typing import Any

from ..errors import ImageNotFoundError
from ..policy import SecurityPolicy
from ..sandbox import Sandbox

__all__ = ["BROWSER_IMAGE", "browser_sandbox"]

#: 0.3.0's browser image.  Pin it by digest in production.
BROWSER_IMAGE = "mcr.microsoft.com/playwright/python:v1.52.0-noble"


def browser_sandbox(
    *,
    timeout: float = 300,
    image: str = BROWSER_IMAGE,
    security_policy: SecurityPolicy | None = None,
    **kwargs: Any,
) -> Sandbox:
    """Create a sandbox for a headless browser (Playwright).

    Args:
        timeout: the sandbox's lifetime in seconds.
        image: an image with a browser; by default Playwright's Python image.
        security_policy: the policy; by default :class:`SecurityPolicy`'s
            (no network: give the sites the browser may reach with
            ``NetworkPolicy.allowlist(domains=...)``).
        kwargs: any other :class:`~agentnest.Sandbox` argument; ``memory``
            defaults to ``"2g"`` and ``pids`` to 512 (a browser starts many
            processes).

    Returns:
        The running :class:`~agentnest.Sandbox`.

    Raises:
        ImageNotFoundError: the image is not on the engine and cannot be
            pulled (the message says how to get it).
    """
    kwargs.setdefault("memory", "2g")
    kwargs.setdefault("pids", 512)
    try:
        return Sandbox(image, timeout, security_policy=security_policy, **kwargs)
    except ImageNotFoundError as exc:
        raise ImageNotFoundError(
            f"browser_sandbox: {exc}. The browser image cannot be pulled here: "
            f"pull {image!r} where the engine can reach its registry (`docker pull {image}`), "
            "or pass image= a local image with a browser; a built-in browser image that builds "
            "offline is planned"
        ) from None
