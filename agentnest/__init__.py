"""AgentNest: disposable, policy-controlled sandboxes for AI agents."""

from ._version import __version__
from .aio import AsyncExecutionStream, AsyncPythonSession, AsyncSandbox, AsyncSessionStream
from .approvals import ApprovalRequest
from .config import (
    Artifact,
    ExecutionChunk,
    ExecutionResult,
    FileInfo,
    ResourceLimits,
    SandboxConfig,
    SnapshotMetadata,
)
from .errors import (
    AgentNestError,
    AuditError,
    BackendError,
    ChannelError,
    ConfigurationError,
    ExecutionError,
    ExecutionTimeoutError,
    FileAccessError,
    ImageNotFoundError,
    MissingDependencyError,
    PolicyDeniedError,
    PoolExhaustedError,
    PoolFactoryError,
    ProfileError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
    SessionLostError,
    SnapshotError,
    TemplateBaseNotFoundError,
    TemplateBuildError,
    UnsupportedCapabilityError,
    VerificationError,
)
from .events import EventType, JsonLogObserver, MemoryObserver, OpenTelemetryObserver, SandboxEvent
from .policy import NetworkMode, NetworkPolicy, SecurityPolicy
from .pool import AsyncSandboxPool, PoolStats, SandboxPool
from .profiles import Profile
from .sandbox import ExecutionStream, Sandbox
from .secrets import Secret
from .session import DisplayItem, PythonSession, SessionResult, SessionStream
from .templates import Template

__all__ = [
    "AgentNestError",
    "ApprovalRequest",
    "Artifact",
    "AsyncExecutionStream",
    "AsyncPythonSession",
    "AsyncSandbox",
    "AsyncSandboxPool",
    "AsyncSessionStream",
    "AuditError",
    "BackendError",
    "ChannelError",
    "ConfigurationError",
    "DisplayItem",
    "EventType",
    "ExecutionChunk",
    "ExecutionError",
    "ExecutionResult",
    "ExecutionStream",
    "ExecutionTimeoutError",
    "FileAccessError",
    "FileInfo",
    "ImageNotFoundError",
    "JsonLogObserver",
    "MemoryObserver",
    "MissingDependencyError",
    "NetworkMode",
    "NetworkPolicy",
    "OpenTelemetryObserver",
    "PolicyDeniedError",
    "PoolExhaustedError",
    "PoolFactoryError",
    "PoolStats",
    "Profile",
    "ProfileError",
    "PythonSession",
    "ResourceLimits",
    "RuntimeNotAvailableError",
    "Sandbox",
    "SandboxConfig",
    "SandboxDestroyedError",
    "SandboxEvent",
    "SandboxPool",
    "Secret",
    "SecurityPolicy",
    "SessionLostError",
    "SessionResult",
    "SessionStream",
    "SnapshotError",
    "SnapshotMetadata",
    "Template",
    "TemplateBaseNotFoundError",
    "TemplateBuildError",
    "UnsupportedCapabilityError",
    "VerificationError",
    "__version__",
]
