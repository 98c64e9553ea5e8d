"""Egress filtering: the allowlist proxy and its host matching.

A stdlib-only program that the backends run next to each allowlisted
sandbox (see docs/egress.md), split by concern: :mod:`.rules` (what is
admitted; pure, and the only part the host needs, re-exported here),
:mod:`.hello` (the TLS ClientHello) and :mod:`.head` (HTTP request heads),
both pure parsers, :mod:`.proxy` (the server) and :mod:`.serve` (its
``main``: config, startup, deadline).  The package imports nothing else of
agentnest: it ships into the proxy's container as files (see
:mod:`agentnest.runtime.egresslog`).
"""

from __future__ import annotations

from .rules import EVENT_ALLOWED, EVENT_DENIED, REASONS, Rules, check_pattern, match_host, normalize_host

__all__ = [
    "EVENT_ALLOWED",
    "EVENT_DENIED",
    "REASONS",
    "Rules",
    "check_pattern",
    "match_host",
    "normalize_host",
]
