"""The one exception tree of AgentNest.

Every error AgentNest raises on purpose derives from :class:`AgentNestError`::

    AgentNestError
     ├── ConfigurationError          (also ValueError) a bad argument or setting
     │    └── ProfileError           a profile file is invalid (``file:line:`` first)
     ├── PolicyDeniedError           the security policy or an approval said no
     ├── UnsupportedCapabilityError  the backend cannot do (or enforce) this
     │    └── GPUUnavailableError    no GPUs here, or fewer than asked (``.requested``, ``.available``)
     ├── MissingDependencyError      (also ImportError) an optional extra is not installed
     ├── SandboxDestroyedError       the sandbox is gone
     ├── SandboxPausedError          the sandbox is paused: ``resume()`` it first
     ├── BackendError                the engine failed or refused
     │    ├── RuntimeNotAvailableError   no engine, or no such OCI runtime
     │    │    └── TemplateBuildError     a template image could not be built (as 0.3.0 raised)
     │    │         └── TemplateBaseNotFoundError  (also ImageNotFoundError) its base is missing
     │    └── ImageNotFoundError         the image is missing and cannot be pulled
     ├── ChannelError                the in-sandbox agent is gone or misbehaved
     ├── ExecutionError              a command failed; ``.result`` holds its output
     │    └── ExecutionTimeoutError  (also TimeoutError) it ran past its timeout
     ├── FileAccessError             a file operation was refused or failed
     │    └── FileTooLargeError      (also ValueError, as 0.3.0 raised) over a size limit
     ├── SnapshotError               a snapshot or fork stream was refused (``.member``, ``.rule``)
     ├── PoolExhaustedError          no pooled sandbox became free in time
     ├── PoolFactoryError            a pool's factory failed; ``__cause__`` is why
     ├── SessionLostError            a Python session's interpreter is gone (state lost)
     ├── VerificationError           verify=True found the policy not holding inside
 ├── BrowserError                a browser sandbox's page failed (``.kind``); the sandbox lives on
 │    ├── BrowserTimeoutError    (also TimeoutError) the page ran past its timeout and was closed
 │    ├── SelectorNotFoundError  (also LookupError) no element matches the selector
 │    └── NavigationError        the page could not be opened (refused by the egress policy, DNS, TLS...)
     └── AuditError                  an audit sink could not record an event (fail loud)

Messages name what was wrong and how to fix it.  Over the wire (agent
protocol, HTTP) errors travel as stable codes and are rebuilt from a closed
table here; a class path sent by a peer is never imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # The one import that points up, for types only (httpx's _exceptions -> _models):
    # an error's ``.result`` is a result type, and results.py raises these errors.
    from .results import ExecutionResult, SessionResult


class AgentNestError(Exception):
    """Root of every error AgentNest raises."""


class ConfigurationError(AgentNestError, ValueError):
    """An argument or setting is invalid; the message says which and why.

    .. versionadded:: 0.4.0
    """


class ProfileError(ConfigurationError):
    """A profile file (``agentnest.yaml``) is missing, malformed or breaks the schema.

    The message starts with ``file:line:`` and names the key at fault.

    .. versionadded:: 0.4.0
    """


class PolicyDeniedError(AgentNestError):
    """The security policy or an approval hook refused an operation."""

    def __init__(self, message: str, request: Any = None) -> None:
        super().__init__(message)
        self.request = request


class AdmissionRefusedError(PolicyDeniedError):
    """A server did not admit a new sandbox in time: its tenant's caps, the server's capacity,
    the tenant's create rate or a full queue (``reason``); ``retry_after`` is when to try again.

    .. versionadded:: 0.4.0
    """

    def __init__(self, message: str, reason: str = "capacity", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


class UnsupportedCapabilityError(AgentNestError):
    """The backend cannot perform, or cannot enforce, what was asked."""


class GPUUnavailableError(UnsupportedCapabilityError):
    """GPUs were asked for and this engine cannot give them, or not that many.

    Raised before anything is created: the message says what is missing (no
    GPU visible, no NVIDIA Container Toolkit, gVisor without nvproxy) and how
    to fix it.  ``requested`` is the count asked for, ``available`` how many
    the host shows (0 when none, or when that cannot be seen).

    .. versionadded:: 0.4.0
    """

    def __init__(self, message: str, requested: int = 0, available: int = 0) -> None:
        super().__init__(message)
        self.requested = requested
        self.available = available


class MissingDependencyError(AgentNestError, ImportError):
    """An optional dependency is not installed; the message names the extra."""


class SandboxDestroyedError(AgentNestError):
    """The sandbox was destroyed (by the caller, its deadline, or its engine)."""


class SandboxPausedError(AgentNestError):
    """The sandbox is paused (:meth:`Sandbox.pause`): call ``resume()`` before using it.

    .. versionadded:: 0.4.0
    """


class BackendError(AgentNestError):
    """The container engine or backend failed."""

    reason: str | None = None
    """A stable code for why, where the backend knows it (Kubernetes: ``quota``,
    ``rbac``, ``runtime_class``, ``capacity``, ``image``, ...), for callers that
    branch without parsing the message.  .. versionadded:: 0.4.0"""


class RuntimeNotAvailableError(BackendError):
    """The engine is not reachable, or the requested OCI runtime is not installed."""


class ImageNotFoundError(BackendError):
    """The image does not exist locally and could not be pulled.

    .. versionadded:: 0.4.0
    """


class TemplateBuildError(RuntimeNotAvailableError):
    """A template image could not be built: a step failed, or it cannot be built offline.

    A :class:`RuntimeNotAvailableError` because 0.3.0's ``Template.build``
    raised that for every failure, so 0.3.0 handlers still catch it.  The
    message names the failing step and ends with its output.

    .. versionadded:: 0.4.0
    """


class TemplateBaseNotFoundError(TemplateBuildError, ImageNotFoundError):
    """A template's base image is not on the engine and could not be pulled.

    .. versionadded:: 0.4.0
    """


class ChannelError(AgentNestError):
    """The in-sandbox agent died, hung, or sent something invalid.

    .. versionadded:: 0.4.0
    """


class ExecutionError(AgentNestError):
    """A command did not succeed; ``result`` carries its (partial) output.

    For code run in a Python session, ``result`` is a ``SessionResult``.
    """

    def __init__(self, message: str, result: ExecutionResult | SessionResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class ExecutionTimeoutError(ExecutionError, TimeoutError):
    """A command ran past its own timeout and was killed with its process tree.

    The sandbox, its files and its other processes survive; ``result`` has the
    partial output and ``timed_out=True``.
    """


class FileAccessError(AgentNestError):
    """A file operation was refused (path safety, size) or failed in the sandbox."""

    def __init__(self, message: str, path: str | None = None, code: str = "io") -> None:
        super().__init__(message)
        self.path = path
        self.code = code


class FileTooLargeError(FileAccessError, ValueError):
    """A file is over ``max_file_bytes`` / ``max_file_read_bytes`` (code ``too_large``).

    Also a ``ValueError``: 0.3.0 raised one for a read over its limit.

    .. versionadded:: 0.4.0
    """

    def __init__(self, message: str, path: str | None = None, code: str = "too_large") -> None:
        super().__init__(message, path=path, code=code)


class SnapshotError(AgentNestError):
    """A snapshot, restore, fork or download stream was refused or is broken.

    ``member`` names the archive member at fault (``None`` when the whole
    stream is: truncated, corrupt, wrong checksum); ``rule`` is a stable
    code for the rule it broke (``absolute``, ``dotdot``, ``symlink``,
    ``hardlink``, ``device``, ``fifo``, ``size``, ``entries``, ``truncated``,
    ``corrupt``, ``checksum``...; docs/state.md lists them).  The target
    sandbox is left as it was.

    .. versionadded:: 0.4.0
    """

    def __init__(self, message: str, member: str | None = None, rule: str = "corrupt") -> None:
        super().__init__(message)
        self.member = member
        self.rule = rule


class PoolExhaustedError(AgentNestError):
    """No sandbox in the pool became free before the wait timed out (or the pool is closed)."""


class PoolFactoryError(AgentNestError):
    """A pool's factory failed to create a sandbox; ``__cause__`` is its exception.

    The pool keeps working and calls the factory again on a later acquire.

    .. versionadded:: 0.4.0
    """


class SessionLostError(AgentNestError):
    """A Python session's interpreter is gone, and with it the session's state.

    It died (``os._exit``, a crash, out of memory), was killed because its
    code ignored the interrupt at a timeout, could not start, was closed, or
    went down with the in-sandbox agent.  The run that finds out raises it,
    and so does every later run until :meth:`PythonSession.reset` starts a
    fresh interpreter.  The sandbox itself is intact.  ``result`` holds the
    partial output of the run that was cut short, if there was one.

    .. versionadded:: 0.4.0
    """

    def __init__(self, message: str, result: SessionResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class VerificationError(AgentNestError):
    """``Sandbox(..., verify=True)`` found, from inside, that the policy does not hold.

    The sandbox was destroyed, never handed out.  ``findings`` lists every
    check (:class:`agentnest.verify.Finding`); the message names the failed ones.

    .. versionadded:: 0.4.0
    """

    def __init__(self, message: str, findings: Any = ()) -> None:
        super().__init__(message)
        self.findings = tuple(findings)


class AuditError(AgentNestError):
    """An audit sink could not record an event (disk full, permission...).

    Fail loud: the operation whose event could not be recorded raises this
    rather than going unrecorded; ``__cause__`` is the underlying error.

    .. versionadded:: 0.4.0
    """


class BrowserError(AgentNestError):
    """A browser sandbox's page action failed; the sandbox and its browser go on.

    ``kind`` says how: ``"timeout"``, ``"selector"``, ``"navigation"``,
    ``"denied"`` (the egress policy refused the site), ``"too_large"`` (a
    screenshot or value over the output limit), ``"crashed"`` (the page died
    and was replaced), ``"error"`` (anything else Playwright reported).

    .. versionadded:: 0.4.0
    """

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


class BrowserTimeoutError(BrowserError, TimeoutError):
    """The page ran past its timeout; it was closed and the next call gets a fresh one.

    .. versionadded:: 0.4.0
    """


class SelectorNotFoundError(BrowserError, LookupError):
    """No element matched the selector within the timeout.

    .. versionadded:: 0.4.0
    """


class NavigationError(BrowserError):
    """The page could not be opened: refused by the egress policy, or a network error.

    .. versionadded:: 0.4.0
    """


# -- the closed error-code table (HTTP API, remote backend) -----------------------------

#: Error code -> (HTTP status, exception class rebuilt by the client).  Closed:
#: anything else a server sends becomes a plain AgentNestError.  The order
#: matters for :func:`error_code`: subclasses come before their bases.
ERROR_CODES: dict[str, tuple[int, type[AgentNestError]]] = {
    "invalid": (400, ConfigurationError),
    "not_found": (404, AgentNestError),
    "file_not_found": (404, FileAccessError),
    "file_refused": (400, FileAccessError),
    "snapshot_refused": (400, SnapshotError),
    "policy_denied": (403, PolicyDeniedError),
    "quota": (429, PolicyDeniedError),
    # Admission (agentnest.server.admission): why a create was not admitted in time.
    "tenant_cap": (429, AdmissionRefusedError),
    "capacity": (429, AdmissionRefusedError),
    "rate": (429, AdmissionRefusedError),
    "queue_full": (429, AdmissionRefusedError),
    "pool_empty": (429, AdmissionRefusedError),
    "unsupported": (409, UnsupportedCapabilityError),
    "gone": (410, SandboxDestroyedError),
    "session_lost": (409, SessionLostError),
    "timeout": (408, ExecutionTimeoutError),
    "execution": (400, ExecutionError),
    "image_not_found": (400, ImageNotFoundError),
    "verification": (409, VerificationError),
    "runtime_unavailable": (503, RuntimeNotAvailableError),
    # The manager's database is down: nothing is admitted that cannot be recorded.
    "database_unavailable": (503, RuntimeNotAvailableError),
    # The replica that runs the sandbox did not answer this one (agentnest.server.forward).
    "replica_unavailable": (503, RuntimeNotAvailableError),
    "backend": (502, BackendError),
    "channel": (502, ChannelError),
    "missing_dependency": (501, MissingDependencyError),
    "audit": (500, AuditError),
    "too_large": (413, ConfigurationError),
    "unauthorized": (401, AgentNestError),
    "error": (500, AgentNestError),
}


def error_code(exc: AgentNestError) -> str:
    """The stable wire code of an AgentNest error."""
    if isinstance(exc, FileAccessError):
        return "file_not_found" if exc.code == "not_found" else "file_refused"
    if (
        isinstance(exc, AdmissionRefusedError)
        and ERROR_CODES.get(exc.reason, (0, None))[1] is AdmissionRefusedError
    ):
        return exc.reason
    table: tuple[tuple[type[AgentNestError], str], ...] = (
        (ImageNotFoundError, "image_not_found"),
        (RuntimeNotAvailableError, "runtime_unavailable"),
        (BackendError, "backend"),
        (ConfigurationError, "invalid"),
        (PolicyDeniedError, "policy_denied"),
        (UnsupportedCapabilityError, "unsupported"),
        (SandboxDestroyedError, "gone"),
        (SessionLostError, "session_lost"),
        (ExecutionTimeoutError, "timeout"),
        (ExecutionError, "execution"),
        (SnapshotError, "snapshot_refused"),
        (VerificationError, "verification"),
        (ChannelError, "channel"),
        (MissingDependencyError, "missing_dependency"),
        (AuditError, "audit"),
    )
    for cls, code in table:
        if isinstance(exc, cls):
            return code
    return "error"


def rebuild_error(code: object, message: str, retry_after: float | None = None) -> AgentNestError:
    """The exception for a wire error (client side); unknown codes become AgentNestError."""
    entry = ERROR_CODES.get(code) if isinstance(code, str) else None
    cls = entry[1] if entry is not None else AgentNestError
    if cls is AdmissionRefusedError:
        return AdmissionRefusedError(message, reason=str(code), retry_after=retry_after)
    if cls is FileAccessError:
        return FileAccessError(message, code="not_found" if code == "file_not_found" else "io")
    if cls is SnapshotError:
        return SnapshotError(message)
    return cls(message)


__all__ = [
    "AdmissionRefusedError",
    "AgentNestError",
    "AuditError",
    "BackendError",
    "BrowserError",
    "BrowserTimeoutError",
    "ChannelError",
    "ConfigurationError",
    "ExecutionError",
    "ExecutionTimeoutError",
    "FileAccessError",
    "FileTooLargeError",
    "GPUUnavailableError",
    "ImageNotFoundError",
    "MissingDependencyError",
    "NavigationError",
    "PolicyDeniedError",
    "PoolExhaustedError",
    "PoolFactoryError",
    "ProfileError",
    "RuntimeNotAvailableError",
    "SandboxDestroyedError",
    "SandboxPausedError",
    "SelectorNotFoundError",
    "SessionLostError",
    "SnapshotError",
    "TemplateBaseNotFoundError",
    "TemplateBuildError",
    "UnsupportedCapabilityError",
    "VerificationError",
]
