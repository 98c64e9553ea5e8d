"""Sandbox presets for common agent workloads, with 0.3.0's signatures.

* :func:`browser_sandbox`: a sandbox sized for a headless browser
  (Playwright's image, 2 GB of memory, 512 processes).
* :func:`gpu_sandbox`: a sandbox with GPUs passed through (the engine needs
  the NVIDIA container toolkit).

Both return a plain :class:`~agentnest.Sandbox` under the usual policy: the
network stays denied unless the policy says otherwise.

.. versionadded:: 0.4.0
   (0.3.0 had the same functions; they now raise AgentNest's clear errors
   where 0.3.0 let the engine's through.)
"""

from __future__ import annotations

from typing import Any

from .errors import BackendError, ConfigurationError, ImageNotFoundError
from .policy import SecurityPolicy as SecurityPolicy  # 0.3.0 had it here
from .sandbox import Sandbox as Sandbox  # 0.3.0 had it here

__all__ = ["BROWSER_IMAGE", "Sandbox", "SecurityPolicy", "browser_sandbox", "gpu_sandbox"]

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


def gpu_sandbox(image: str | None, *, gpus: int = 1, timeout: float = 300, **kwargs: Any) -> Sandbox:
    """Create a sandbox with ``gpus`` GPUs passed through.

    Args:
        image: an image with the CUDA user-space libraries the code needs
            (``None``: the default base image).
        gpus: how many GPUs (at least 1).
        timeout: the sandbox's lifetime in seconds.
        kwargs: any other :class:`~agentnest.Sandbox` argument.

    Returns:
        The running :class:`~agentnest.Sandbox`.

    Raises:
        ConfigurationError: ``gpus`` is not a positive int (a ``ValueError``,
            as in 0.3.0).
        UnsupportedCapabilityError: the backend cannot pass GPUs through.
        BackendError: the engine has no GPU support (no NVIDIA container
            toolkit) or no free GPU.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise ConfigurationError(f"gpus={gpus!r} must be a positive int")
    try:
        return Sandbox(image, timeout, gpus=gpus, **kwargs)
    except ImageNotFoundError:
        raise
    except BackendError as exc:
        # Docker's own words ("could not select device driver ...") do not say
        # what is missing; say it, and keep the engine's text.
        if "device driver" not in str(exc):
            raise
        raise BackendError(
            f"gpu_sandbox: this engine cannot pass GPUs through ({exc}); install the NVIDIA "
            "Container Toolkit on the host and restart the engine, or run on a host with a GPU"
        ) from None
