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


def renamed(
    ours: T,
    theirs: T | None,
    ours_name: str,
    theirs_name: str,
    *,
    ours_given: bool,
    where: str,
    stacklevel: int = 3,
) -> T:
    """``theirs`` (the 0.3.0 name) when given, with a DeprecationWarning; else ``ours``.

    ``stacklevel`` counts from this function: 3 is the caller of the function that calls it.
    """
    if theirs is None:
        return ours
    if ours_given:
        raise ConfigurationError(f"{where}: pass {ours_name}= or {theirs_name}=, not both")
    deprecated(f"{where}: {theirs_name}=", f"{ours_name}=", stacklevel=stacklevel + 1)
    return theirs


def deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is the 0.3.0 name of ``new`` (which still works)."""
    warnings.warn(
        f"{old} is the agentnest 0.3.0 name of {new}; it still works, but use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
