"""Waiting on a condition in tests: the condition is the signal, the poll only paces it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], what: str, within: float = 60.0, interval: float = 0.02) -> None:
    """Return as soon as ``predicate()`` is true; fail after ``within`` seconds.

    Raises:
        AssertionError: naming ``what`` did not happen in time.
    """
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        time.sleep(interval)


__all__ = ["wait_until"]
