"""The audit sinks, under the name 0.4.0 first gave them.

They live in :mod:`agentnest.events` with the events they record (every sink
in one place); this module exports them, so ``agentnest.audit.*`` keeps
working.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from .events import (
    DEFAULT_BACKUPS,
    DEFAULT_MAX_BYTES,
    JsonLogObserver,
    OpenTelemetryObserver,
    default_audit_path,
    rotated_paths,
)

__all__ = [
    "DEFAULT_BACKUPS",
    "DEFAULT_MAX_BYTES",
    "JsonLogObserver",
    "OpenTelemetryObserver",
    "default_audit_path",
    "rotated_paths",
]
