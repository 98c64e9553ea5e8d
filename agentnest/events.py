"""Audit events: what happened in a sandbox, as structured records."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# The file and OpenTelemetry sinks live in audit.py (re-exported here: every sink in one place).
from .audit import JsonLogObserver, OpenTelemetryObserver


class EventType(str, enum.Enum):
    """Event types, named ``noun.past_verb``."""

    SANDBOX_CREATED = "sandbox.created"
    SANDBOX_DESTROYED = "sandbox.destroyed"
    SANDBOX_VERIFIED = "sandbox.verified"
    SANDBOX_EXTENDED = "sandbox.extended"
    EXEC_STARTED = "exec.started"
    EXEC_FINISHED = "exec.finished"
    EXEC_TIMED_OUT = "exec.timed_out"
    FILE_READ = "file.read"
    FILE_WRITTEN = "file.written"
    FILE_REMOVED = "file.removed"
    AGENT_RESTARTED = "agent.restarted"
    SESSION_OPENED = "session.opened"
    SESSION_RAN = "session.ran"
    SESSION_TIMED_OUT = "session.timed_out"
    SESSION_LOST = "session.lost"
    SESSION_RESET = "session.reset"
    SESSION_CLOSED = "session.closed"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_GRANTED = "approval.granted"
    APPROVAL_DENIED = "approval.denied"
    POLICY_DENIED = "policy.denied"
    EGRESS_ALLOWED = "egress.allowed"
    EGRESS_DENIED = "egress.denied"
    SNAPSHOT_CREATED = "snapshot.created"
    SNAPSHOT_RESTORED = "snapshot.restored"
    SANDBOX_FORKED = "sandbox.forked"


@dataclass(frozen=True, slots=True)
class SandboxEvent:
    """One audit record.  ``data`` never contains a secret (it is redacted)."""

    type: EventType
    sandbox_id: str
    data: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    time: float = field(default_factory=time.time)
    actor: str = "host"

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type.value,
            "sandbox_id": self.sandbox_id,
            "time": self.time,
            "actor": self.actor,
            "data": dict(self.data),
        }


Observer = Callable[[SandboxEvent], Any]


class MemoryObserver:
    """Keeps every event in memory (tests, short scripts)."""

    def __init__(self) -> None:
        self._events: list[SandboxEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: SandboxEvent) -> None:
        with self._lock:
            self._events.append(event)

    @property
    def events(self) -> list[SandboxEvent]:
        with self._lock:
            return list(self._events)

    def types(self) -> list[str]:
        return [e.type.value for e in self.events]


__all__ = [
    "EventType",
    "JsonLogObserver",
    "MemoryObserver",
    "Observer",
    "OpenTelemetryObserver",
    "SandboxEvent",
]
