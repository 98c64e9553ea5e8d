"""0.3.0 parameter names that ours still accepts (pure helpers, no I/O).

``either`` joins two names for one parameter that are both first-class
(0.3.0's ``environment=``/``workdir=`` beside ours' ``env=``/``cwd=``);
``renamed`` takes a 0.3.0 name that ours replaced and warns.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

from .errors import ConfigurationError

T = TypeVar("T")


def either(ours: T | None, theirs: T | None, ours_name: str, theirs_name: str) -> T | None:
    """The one of two spellings of a parameter that was given; refuse both."""
    if theirs is None:
        return ours
    if ours is not None:
        raise ConfigurationError(f"pass {ours_name}= or {theirs_name}=, not both (they are the same setting)")
    return theirs


def renamed(ours: T, theirs: T | None, ours_name: str, theirs_name: str, *, default: T, where: str) -> T:
    """``theirs`` (the 0.3.0 name) when given, with a DeprecationWarning; else ``ours``."""
    if theirs is None:
        return ours
    if ours != default:
        raise ConfigurationError(f"{where}: pass {ours_name}= or {theirs_name}=, not both")
    warnings.warn(
        f"{where}: {theirs_name}= is the 0.3.0 name of {ours_name}=; it still works but use {ours_name}=",
        DeprecationWarning,
        stacklevel=3,
    )
    return theirs
