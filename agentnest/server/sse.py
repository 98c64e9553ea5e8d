"""Server-sent events as ``agentnest serve`` writes them: one named event, its data one JSON line.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def event(name: str, data: Mapping[str, Any]) -> bytes:
    """One event: ``event: name`` and ``data: {json}``, then the blank line that ends it."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


__all__ = ["event"]
