"""Egress filtering: the allowlist proxy and its host matching.

:mod:`agentnest.egress.proxy` is a stdlib-only program that the Docker
backend runs in a container next to each allowlisted sandbox (see
docs/egress.md); its matching functions are re-exported here for the host.
"""

from __future__ import annotations

from .proxy import EVENT_ALLOWED, EVENT_DENIED, REASONS, Rules, check_pattern, match_host, normalize_host

__all__ = [
    "EVENT_ALLOWED",
    "EVENT_DENIED",
    "REASONS",
    "Rules",
    "check_pattern",
    "match_host",
    "normalize_host",
]
