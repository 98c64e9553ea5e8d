"""``renameat2(2)`` with ``RENAME_EXCHANGE``: swap two paths atomically (Linux 3.15+)."""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from pathlib import Path

__all__ = ["exchange"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 1 << 1


@lru_cache(maxsize=1)
def _call() -> object | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not glibc 2.28+, or not Linux
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def exchange(a: Path, b: Path) -> bool:
    """Swap what ``a`` and ``b`` name, atomically; ``False`` where the system or filesystem cannot."""
    fn = _call()
    if fn is None:
        return False
    result: int = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)  # type: ignore[operator]
    return result == 0
