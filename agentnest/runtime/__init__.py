"""Runtime backends: where sandboxes live.  See :mod:`agentnest.runtime.base`."""

from .base import Capability, RuntimeBackend, SandboxHandle
from .registry import available_backends, get_backend

__all__ = ["Capability", "RuntimeBackend", "SandboxHandle", "available_backends", "get_backend"]
