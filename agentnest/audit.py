"""Audit sinks beyond memory: an append-only JSONL file and OpenTelemetry.

Both are observers (``Sandbox(observers=[...])``).  Fail loud: a sink that
cannot record an event raises :class:`~agentnest.errors.AuditError`, so an
operation whose event cannot be recorded raises instead of going unrecorded.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import AuditError, ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    from .events import SandboxEvent

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


__all__ = ["JsonLogObserver", "OpenTelemetryObserver", "default_audit_path", "rotated_paths"]
