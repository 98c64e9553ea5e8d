"""Audit events: what happened in a sandbox, as structured records."""

from __future__ import annotations

import enum
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, Union

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
    FILE_MOVED = "file.moved"
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
    SANDBOX_PAUSED = "sandbox.paused"
    SANDBOX_RESUMED = "sandbox.resumed"
    LEASE_EXPIRED = "sandbox.lease_expired"

    # 0.3.0 names, aliases of the members above (``EventType.CREATED is
    # EventType.SANDBOX_CREATED``).  0.3.0's execution events were
    # ``execution.started`` / ``execution.finished``; the aliases carry ours'
    # values (docs/compat.md).
    CREATED = "sandbox.created"
    DESTROYED = "sandbox.destroyed"
    FORKED = "sandbox.forked"
    EXECUTION_STARTED = "exec.started"
    EXECUTION_FINISHED = "exec.finished"

    @classmethod
    def _missing_(cls, value: object) -> EventType | None:
        # 0.3.0 spellings of the execution events.
        old = {"execution.started": cls.EXEC_STARTED, "execution.finished": cls.EXEC_FINISHED}
        return old.get(value) if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class SandboxEvent:
    """One audit record.  ``attributes`` never contains a secret (it is redacted).

    .. versionchanged:: 0.4.0
       The fields keep 0.3.0's order and names (``timestamp``, ``attributes``,
       ``event_id``); ``time`` and ``data`` are short names for the first two,
       and ``actor`` is new.
    """

    type: EventType
    sandbox_id: str
    timestamp: float = field(default_factory=time.time)
    """When it happened (epoch seconds)."""
    attributes: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """What happened, redacted."""
    event_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Unique id of this record."""
    actor: str = "host"
    """Who did it: ``host`` (this process), ``sandbox`` (its own code, via the
    egress proxy) or ``remote`` (a client of ``agentnest serve``)."""

    @property
    def time(self) -> float:
        """Same as :attr:`timestamp`."""
        return self.timestamp

    @property
    def data(self) -> Mapping[str, Any]:
        """Same as :attr:`attributes`."""
        return self.attributes

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type.value,
            "sandbox_id": self.sandbox_id,
            "time": self.timestamp,
            "actor": self.actor,
            "event_id": self.event_id,
            "data": dict(self.attributes),
        }


class EventObserver(Protocol):
    """0.3.0's observer protocol: an object with an ``emit(event)`` method."""

    def emit(self, event: SandboxEvent) -> Any: ...


Observer = Union[Callable[[SandboxEvent], Any], EventObserver]  # noqa: UP007 (a runtime alias on 3.10)
"""Anything that takes events: a callable, or (as in 0.3.0) an :class:`EventObserver`."""


class MemoryObserver:
    """Keeps every event in memory (tests, short scripts)."""

    def __init__(self) -> None:
        self._events: list[SandboxEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: SandboxEvent) -> None:
        with self._lock:
            self._events.append(event)

    emit = __call__
    """0.3.0's observer method."""

    @property
    def events(self) -> tuple[SandboxEvent, ...]:
        """Every event so far, oldest first (a tuple, as in 0.3.0)."""
        with self._lock:
            return tuple(self._events)

    def types(self) -> list[str]:
        return [e.type.value for e in self.events]


__all__ = [
    "EventObserver",
    "EventType",
    "JsonLogObserver",
    "MemoryObserver",
    "Observer",
    "OpenTelemetryObserver",
    "SandboxEvent",
]
