"""Audit events and every sink that records them.

A :class:`SandboxEvent` is one structured record of what happened in a
sandbox (:class:`EventType` names it ``noun.past_verb``).  Sinks are
observers (``Sandbox(observers=[...])``): :class:`MemoryObserver` keeps them
in memory, :class:`JsonLogObserver` appends them to a JSONL file,
:class:`OpenTelemetryObserver` records them as span events.

Fail loud: a sink that cannot record an event raises
:class:`~agentnest.errors.AuditError`, so an operation whose event cannot be
recorded raises instead of going unrecorded.

.. versionchanged:: 0.4.0
   The file and OpenTelemetry sinks moved here from ``agentnest.audit``,
   which still exports them.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, Union

from .errors import AuditError, ConfigurationError, MissingDependencyError


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


def observer_callable(observer: Any) -> Callable[[SandboxEvent], Any]:
    """The callable to hand events to: the observer, or its ``emit`` (0.3.0's protocol)."""
    if callable(observer):
        return observer  # type: ignore[no-any-return]
    emit = getattr(observer, "emit", None)
    if callable(emit):
        return emit  # type: ignore[no-any-return]
    raise ConfigurationError(f"observer {observer!r:.60} is neither callable nor has an emit(event) method")


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


# -- sinks beyond memory: an append-only JSONL file and OpenTelemetry ------------------

#: Rotate once the file would grow past this many bytes.
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
#: Rotated files kept beside the live one (``audit.jsonl.1`` is the newest).
DEFAULT_BACKUPS = 5


def default_audit_path() -> Path:
    """``$AGENTNEST_AUDIT_LOG``, else ``$XDG_STATE_HOME/agentnest/audit.jsonl``.

    ``XDG_STATE_HOME`` defaults to ``~/.local/state``.
    """
    explicit = os.environ.get("AGENTNEST_AUDIT_LOG")
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or os.path.join("~", ".local", "state")
    return Path(state).expanduser() / "agentnest" / "audit.jsonl"


def rotated_paths(path: Path, backups: int = DEFAULT_BACKUPS) -> list[Path]:
    """The existing files of a log, oldest first: ``path.N`` ... ``path.1``, ``path``."""
    found = [Path(f"{path}.{i}") for i in range(backups, 0, -1)]
    return [p for p in [*found, path] if p.is_file()]


class JsonLogObserver:
    """Appends each event as one JSON line (``SandboxEvent.to_dict()``) to a file.

    Each line goes out in a single ``os.write`` on an ``O_APPEND`` descriptor,
    so threads (serialised by a lock) and other processes appending to the same
    file never interleave inside a line.  Past ``max_bytes`` the file is
    rotated to ``path.1`` (``path.1`` to ``path.2`` ... up to ``backups``).
    A line that a full disk cuts short is taken back out (the event raises
    :class:`~agentnest.errors.AuditError`): the lines before stay whole, and
    once there is room again the log goes on.

    Example::

        log = JsonLogObserver()  # $AGENTNEST_AUDIT_LOG or ~/.local/state/agentnest/audit.jsonl
        with Sandbox(observers=[log]) as sb:
            sb.exec_shell("echo hi")

    Args:
        logger: a :class:`logging.Logger` to send each event to as one INFO
            record (0.3.0's behaviour) instead of a file; a path here is
            the same as ``path=``.
        path: the file; default :func:`default_audit_path`.
        max_bytes: rotate before a write would take the file past this size.
        backups: rotated files kept; 0 truncates instead of keeping any.

    Raises:
        AuditError: from the call when an event cannot be written (disk
            full, permission, a directory in the way): fail loud.

    .. versionadded:: 0.4.0
    """

    def __init__(
        self,
        logger: logging.Logger | str | os.PathLike[str] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        # 0.3.0's first argument was a logging.Logger; ours is the file.  Both
        # are taken positionally, told apart by type.
        self.logger: logging.Logger | None = None
        if isinstance(logger, logging.Logger):
            self.logger = logger
        elif logger is not None:
            if path is not None:
                raise ConfigurationError(
                    "pass the file once: JsonLogObserver(path) or JsonLogObserver(path=...)"
                )
            path = logger
        if max_bytes <= 0:
            raise ConfigurationError("max_bytes must be greater than 0")
        if backups < 0:
            raise ConfigurationError("backups must be 0 or more")
        self.path = Path(path).expanduser() if path is not None else default_audit_path()
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._fd: int | None = None

    def __call__(self, event: SandboxEvent) -> None:
        if self.logger is not None:
            # As 0.3.0 did: one INFO record per event, the JSON as its message.
            self.logger.info(json.dumps(event.to_dict(), sort_keys=True, default=str))
            return
        line = (json.dumps(event.to_dict(), separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            try:
                self._write(line)
            except OSError as exc:
                self._close()
                raise AuditError(f"cannot record {event.type.value} event in {self.path}: {exc}") from exc

    def emit(self, event: SandboxEvent) -> None:
        """0.3.0's observer method: the same as calling the observer."""
        self(event)

    def _write(self, line: bytes) -> None:
        fd = self._open()
        size = os.fstat(fd).st_size
        if size and size + len(line) > self.max_bytes:
            self._rotate()
            fd = self._open()
        view = memoryview(line)
        done = 0
        try:
            while view:  # a regular file takes it all at once, unless its disk fills mid-line
                written = os.write(fd, view)
                view = view[written:]
                done += written
        except OSError:
            if done:
                _take_back(fd, done)
            raise

    def _open(self) -> int:
        if self._fd is not None:
            # Another process may have rotated the file: follow the name, not the inode.
            try:
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    return self._fd
            except FileNotFoundError:
                pass
            self._close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # 0o600: events name commands and paths; other local users need not read them.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def _rotate(self) -> None:
        self._close()
        if self.backups == 0:
            os.truncate(self.path, 0)
            return
        for i in range(self.backups - 1, 0, -1):
            older = Path(f"{self.path}.{i}")
            if older.exists():
                os.replace(older, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        """Close the file; a later event opens it again."""
        with self._lock:
            self._close()

    def __repr__(self) -> str:
        return f"JsonLogObserver({str(self.path)!r})"


def _take_back(fd: int, count: int) -> None:
    """Remove the ``count`` bytes this descriptor just appended: half a line a full disk cut short.

    Every line before stays whole and the next one starts on its own line.
    Only when nothing was appended after them (another process's line is
    never cut); otherwise the torn line stays, as one line that does not parse.
    """
    with contextlib.suppress(OSError):
        end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND: just past what this write put
        if os.fstat(fd).st_size == end:
            os.ftruncate(fd, end - count)


class OpenTelemetryObserver:
    """Records each event on OpenTelemetry as a span event.

    On the current recording span when there is one, otherwise on a short
    span ``agentnest.<type>`` of its own.  Attributes: ``agentnest.sandbox_id``,
    ``agentnest.actor`` and ``agentnest.data.<key>`` (non-scalar values as JSON).
    Needs the ``observability`` extra (``pip install 'agentnest[observability]'``).

    Args:
        tracer: the tracer that makes the spans (0.3.0's argument); default
            one from ``tracer_provider``.
        tracer_provider: where spans go; default the global provider.

    Raises:
        MissingDependencyError: at construction, without ``opentelemetry-api``.

    .. versionadded:: 0.4.0
    """

    def __init__(self, tracer: Any = None, *, tracer_provider: Any = None) -> None:
        if tracer is not None and tracer_provider is not None:
            raise ConfigurationError("pass either tracer or tracer_provider, not both")
        try:
            # import_module: the package is optional and untyped here (as templates.py does yaml).
            trace = importlib.import_module("opentelemetry.trace")
        except ImportError as exc:
            raise MissingDependencyError(
                "OpenTelemetryObserver needs opentelemetry-api: pip install 'agentnest[observability]'"
            ) from exc
        self._trace = trace
        if (
            tracer is not None
            and not hasattr(tracer, "start_as_current_span")
            and hasattr(tracer, "get_tracer")
        ):
            # A TracerProvider passed positionally (the first argument was
            # tracer_provider before 0.3.0's name came back).
            tracer, tracer_provider = None, tracer
        self._tracer = tracer or trace.get_tracer("agentnest", tracer_provider=tracer_provider)

    def __call__(self, event: SandboxEvent) -> None:
        attributes = _attributes(event)
        name = event.type.value
        current = self._trace.get_current_span()
        if current.is_recording():
            current.add_event(name, attributes, timestamp=int(event.time * 1e9))
            return
        with self._tracer.start_as_current_span(f"agentnest.{name}", attributes=attributes) as span:
            span.add_event(name, attributes, timestamp=int(event.time * 1e9))

    def emit(self, event: SandboxEvent) -> None:
        """0.3.0's observer method: the same as calling the observer."""
        self(event)


def _attributes(event: SandboxEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"agentnest.sandbox_id": event.sandbox_id, "agentnest.actor": event.actor}
    for key, value in event.data.items():
        if isinstance(value, (str, bool, int, float)):
            out[f"agentnest.data.{key}"] = value
        elif value is not None:
            out[f"agentnest.data.{key}"] = json.dumps(value, default=str)
    return out


__all__ = [
    "DEFAULT_BACKUPS",
    "DEFAULT_MAX_BYTES",
    "EventObserver",
    "EventType",
    "JsonLogObserver",
    "MemoryObserver",
    "Observer",
    "OpenTelemetryObserver",
    "SandboxEvent",
    "default_audit_path",
    "observer_callable",
    "rotated_paths",
]
