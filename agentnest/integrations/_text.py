"""Text for a model, bounded: shared by the runner, its browse tool and the smolagents executor."""

from __future__ import annotations


def bound_text(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and the (longer) tail of ``text`` within ``limit`` characters."""
    if len(text) <= limit:
        return text, False
    head = limit // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n... [{cut} characters cut] ...\n{text[len(text) - tail :]}", True
