"""What comes back from a sandbox: the result types of commands, files, snapshots and sessions.

Frozen values with no behaviour beyond reading themselves (``ok``, ``output``)
and raising for a failure (``check()``).  They sit at the bottom, beside
:mod:`agentnest.errors`, so that everything else -- the guard, the channel,
the backends, both faces -- can hand them around without importing up; an
error's ``.result`` is one of these (``errors`` names them for types only).

.. versionadded:: 0.4.0
   The types lived in ``agentnest.config`` and ``agentnest.session``, which
   still export them.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .agent.limits import BINARY_MIMES
from .errors import ExecutionError, ExecutionTimeoutError

__all__ = [
    "Artifact",
    "DisplayItem",
    "ExecutionChunk",
    "ExecutionResult",
    "FileInfo",
    "SessionResult",
    "SnapshotMetadata",
]


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """The outcome of one command.

    ``stdout`` and ``stderr`` are decoded as UTF-8 (invalid bytes become
    U+FFFD) and have every secret redacted.
    """

    command: str
    """The command as run (``display_command`` when one was given); secrets redacted.

    .. versionchanged:: 0.4.0
       The fields keep 0.3.0's order: ``command, exit_code, stdout, stderr, duration``."""
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    truncated: bool = False
    signal: int | None = None
    """The signal that ended the command, if one did."""

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout followed by stderr."""
        return self.stdout + self.stderr

    def check(self) -> ExecutionResult:
        """Return self if ``ok``; raise :class:`ExecutionError` otherwise."""
        if self.timed_out:
            raise ExecutionTimeoutError(f"command timed out after {self.duration:.1f}s", self)
        if self.exit_code != 0:
            tail = self.stderr.strip().splitlines()[-1:] or [""]
            raise ExecutionError(f"command exited with {self.exit_code}: {tail[0][:500]}", self)
        return self


@dataclass(frozen=True, slots=True)
class ExecutionChunk:
    """A piece of output from a streaming command.

    The last chunk of a stream that ended is a ``"status"`` chunk carrying the
    ``exit_code`` (as in 0.3.0); ``data`` is empty there.
    """

    stream: Literal["stdout", "stderr", "status"]
    data: str = ""
    timestamp: float = field(default_factory=time.time, compare=False)
    """When the chunk arrived at the host (epoch seconds; not part of equality)."""
    exit_code: int | None = None
    """The command's exit code, on the ``"status"`` chunk only."""


@dataclass(frozen=True, slots=True)
class FileInfo:
    """An entry of the workspace as ``list_files`` reports it.

    .. versionadded:: 0.4.0
    """

    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"


@dataclass(frozen=True, slots=True)
class Artifact:
    """A regular file of the workspace, as :meth:`Sandbox.artifacts` reports it.

    .. versionadded:: 0.4.0
    """

    path: str
    """Workspace-relative path (``output/report.csv``)."""
    size: int
    """Size in bytes."""
    sha256: str
    """SHA-256 of the content, lowercase hex, computed inside the sandbox."""


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    """A workspace snapshot file, as :meth:`Sandbox.snapshot` wrote it (or ``restore`` read it).

    The first four fields keep their 0.3.0 meaning and order.

    .. versionchanged:: 0.4.0
       Added ``image``, ``files`` and the fields after them, and ``created``
       as a short name of ``created_at``.
    """

    path: Path
    """The snapshot file on the host."""
    size: int
    """Size of the snapshot file in bytes."""
    sha256: str
    """SHA-256 of the snapshot file as stored (``sha256sum`` agrees)."""
    created_at: float
    """When the snapshot was taken (epoch seconds)."""
    image: str = ""
    """Image of the sandbox it was taken from (empty for a tar without AgentNest metadata)."""
    files: int = 0
    """Number of regular files."""
    entries: int = 0
    """Number of archive members: files, directories and symlinks."""
    workspace_size: int = 0
    """Total size of the regular files in bytes (holes of sparse files included)."""
    payload_sha256: str = ""
    """SHA-256 of the payload (every tar byte before the metadata member), as recorded in it."""
    sandbox_id: str = ""
    """Id of the sandbox it was taken from."""
    compressed: bool = False
    """Whether the file is gzip-compressed."""
    skipped: tuple[str, ...] = ()
    """Workspace entries that cannot be archived (sockets, FIFOs, devices) and were left out."""

    @property
    def created(self) -> float:
        """Same as :attr:`created_at`."""
        return self.created_at


@dataclass(frozen=True, slots=True)
class DisplayItem:
    """One rich output of a session run, as a notebook shows it.

    ``data`` is text for textual types (``text/html``, ``text/markdown``,
    ``image/svg+xml``, ``application/json``, ``text/latex``, ``text/plain``;
    secrets redacted) and base64 for binary ones (``image/png``,
    ``image/jpeg``), as in a Jupyter notebook file.  :meth:`raw` gives bytes.

    .. versionadded:: 0.4.0
    """

    mime: str
    data: str
    result: bool = False
    """The rich form of the code's trailing expression (whose ``repr()`` is
    :attr:`SessionResult.result`), not a ``display()`` call or a figure.

    .. versionadded:: 0.4.0"""

    @property
    def binary(self) -> bool:
        """True for images (``data`` is base64)."""
        return self.mime in BINARY_MIMES

    def raw(self) -> bytes:
        """The item's bytes: base64-decoded for images, UTF-8 for text."""
        return base64.b64decode(self.data) if self.binary else self.data.encode("utf-8")


@dataclass(frozen=True, slots=True)
class SessionResult:
    """The outcome of one :meth:`PythonSession.run`.

    Text fields are decoded as UTF-8 and have every secret redacted.

    .. versionadded:: 0.4.0
    """

    stdout: str
    """What the code (and processes it started) wrote to stdout."""
    stderr: str
    """What it wrote to stderr."""
    result: str | None = None
    """``repr()`` of the trailing expression's value, e.g. ``"42"``; None when
    the code does not end in an expression or its value is None.  At most
    64 Ki characters (longer reprs are cut and ``truncated`` is set)."""
    error: str | None = None
    """The formatted traceback if the code raised (a ``SyntaxError`` too)."""
    display: tuple[DisplayItem, ...] = ()
    """Rich outputs: ``display(obj)`` calls, a trailing value with a
    ``_repr_*_`` method, matplotlib figures left open."""
    duration: float = 0.0
    """Seconds the run took inside the sandbox."""
    timed_out: bool = False
    """The run passed its timeout and was interrupted (KeyboardInterrupt)."""
    truncated: bool = False
    """Output, result, traceback or display items were cut at their limits."""

    @property
    def ok(self) -> bool:
        """True when the code raised nothing and finished within its timeout."""
        return self.error is None and not self.timed_out

    @property
    def output(self) -> str:
        """stdout followed by stderr."""
        return self.stdout + self.stderr

    def check(self) -> SessionResult:
        """Return self if ``ok``; raise :class:`ExecutionError` otherwise.

        Raises:
            ExecutionTimeoutError: the run timed out.
            ExecutionError: the code raised; the message is the exception line.
        """
        if self.timed_out:
            raise ExecutionTimeoutError(f"session code timed out after {self.duration:.1f}s", self)
        if self.error is not None:
            lines = self.error.strip().splitlines() or [""]
            raise ExecutionError(f"session code raised {lines[-1][:500]}", self)
        return self
