"""Compatibility alias of :mod:`agentnest.errors` (the 0.3.0 module name)."""

from .errors import *  # noqa: F403
from .errors import __all__  # noqa: F401
