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

from ..policy import SecurityPolicy as SecurityPolicy  # 0.3.0 had it here
from ..sandbox import Sandbox as Sandbox  # 0.3.0 had it here
from .browser import BROWSER_IMAGE, browser_sandbox
from .gpu import gpu_sandbox

__all__ = ["BROWSER_IMAGE", "Sandbox", "SecurityPolicy", "browser_sandbox", "gpu_sandbox"]
