"""AgentNest: disposable, policy-controlled sandboxes for AI agents."""

from ._version import __version__
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
    RuntimeNotAvailableError,
    SandboxDestroyedError,
    SessionLostError,
    SnapshotError,
    UnsupportedCapabilityError,
)
from .events import EventType, MemoryObserver, SandboxEvent
from .guard import ApprovalRequest
from .policy import NetworkMode, NetworkPolicy, SecurityPolicy
from .sandbox import ExecutionStream, Sandbox
from .secrets import Secret
from .session import DisplayItem, PythonSession, SessionResult, SessionStream
from .templates import Template

__all__ = [
    "AgentNestError",
    "ApprovalRequest",
    "Artifact",
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
    "MemoryObserver",
    "MissingDependencyError",
    "NetworkMode",
    "NetworkPolicy",
    "PolicyDeniedError",
    "PoolExhaustedError",
    "PythonSession",
    "ResourceLimits",
    "RuntimeNotAvailableError",
    "Sandbox",
    "SandboxConfig",
    "SandboxDestroyedError",
    "SandboxEvent",
    "Secret",
    "SecurityPolicy",
    "SessionLostError",
    "SessionResult",
    "SessionStream",
    "SnapshotError",
    "SnapshotMetadata",
    "Template",
    "UnsupportedCapabilityError",
    "__version__",
]
