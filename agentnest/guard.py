"""The guard: the one place every public operation passes (no I/O here).

It validates arguments against the configuration and the security policy,
asks the approval hook, bounds and redacts what comes back, and emits audit
events.  ``Sandbox`` does the I/O around it; backends never see output
before the guard has redacted it.
"""

from __future__ import annotations

import codecs
import inspect
import math
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .channel.protocol import RawExit
from .config import ExecutionChunk, ExecutionResult, SandboxConfig
from .errors import ConfigurationError, FileAccessError, PolicyDeniedError, UnsupportedCapabilityError
from .events import EventType, Observer, SandboxEvent
from .policy import NetworkMode, SecurityPolicy
from .runtime.base import Capability
from .secrets import Secret, StreamRedactor, redact

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Longest single argument Linux accepts (MAX_ARG_STRLEN).
MAX_ARG = 128 * 1024


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What an approval hook is asked to allow.

    .. versionadded:: 0.4.0
    """

    kind: str
    """``exec``, ``file.read``, ``file.write``, ``file.remove``, ``network``..."""
    sandbox_id: str
    details: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


ApprovalHook = Callable[[ApprovalRequest], Any]


class Guard:
    """Policy, approvals, redaction and events for one sandbox."""

    def __init__(
        self,
        config: SandboxConfig,
        policy: SecurityPolicy,
        observers: Sequence[Observer] = (),
        approval_hook: ApprovalHook | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.observers = tuple(observers)
        self.approval_hook = approval_hook
        self.sandbox_id = "pending"
        self.secrets: tuple[str, ...] = config.secrets

    # -- creation --------------------------------------------------------------

    def check_create(self, capabilities: frozenset[Capability]) -> None:
        reason = self.policy.check_image(self.config.image)
        if reason:
            self.deny("sandbox.create", reason)
        if self.policy.read_only_root and not self.config.read_only_root:
            self.deny("sandbox.create", "the security policy requires a read-only root filesystem")
        mode = self.config.network.mode
        needed = {
            NetworkMode.DENIED: Capability.NETWORK_DENIED,
            NetworkMode.ALLOWLIST: Capability.EGRESS_DOMAINS,
            NetworkMode.OPEN: Capability.NETWORK_OPEN,
        }[mode]
        if needed not in capabilities:
            raise UnsupportedCapabilityError(
                f"this backend cannot enforce network mode {mode.value!r}; no sandbox was created"
            )
        if self.config.limits.gpus and Capability.GPU not in capabilities:
            raise UnsupportedCapabilityError("this backend cannot pass GPUs through")
        if mode is not NetworkMode.DENIED:
            self.approve("network", {"mode": mode.value, "domains": list(self.config.network.domains)})

    # -- approvals and events --------------------------------------------------

    def deny(self, kind: str, reason: str, details: Mapping[str, Any] | None = None) -> None:
        self.emit(EventType.POLICY_DENIED, {"kind": kind, "reason": reason, **(details or {})})
        raise PolicyDeniedError(
            f"{kind} denied: {reason}", request=ApprovalRequest(kind, self.sandbox_id, details or {})
        )

    def approve(self, kind: str, details: Mapping[str, Any]) -> None:
        if self.approval_hook is None:
            return
        request = ApprovalRequest(kind, self.sandbox_id, MappingProxyType(dict(details)))
        try:
            answer = self.approval_hook(request)
        except Exception as exc:
            # A hook that fails does not approve anything.
            self.deny(kind, f"the approval hook raised {type(exc).__name__}: {exc}", details)
        if inspect.isawaitable(answer):
            # A coroutine object is truthy: never mistake it for a yes.
            close = getattr(answer, "close", None)
            if close is not None:
                close()
            self.deny(
                kind, "the approval hook is async; use it with AsyncSandbox or pass a sync hook", details
            )
        if not answer:
            self.deny(kind, "the approval hook refused", details)
        self.emit(EventType.APPROVAL_GRANTED, {"kind": kind})

    def emit(self, kind: EventType, data: Mapping[str, Any]) -> None:
        if not self.observers:
            return
        event = SandboxEvent(kind, self.sandbox_id, MappingProxyType(self._redact_data(dict(data))))
        for observer in self.observers:
            observer(event)

    def _redact_data(self, data: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in data.items():
            if isinstance(v, str):
                v = self.redact(v)
            elif isinstance(v, list):
                v = [self.redact(x) if isinstance(x, str) else x for x in v]
            out[k] = v
        return out

    # -- commands --------------------------------------------------------------

    def exec_request(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None,
        env: Mapping[str, str | Secret] | None,
        cwd: str | None,
    ) -> tuple[list[str], dict[str, str], str | None, float | None]:
        if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
            raise ConfigurationError("argv must be a non-empty list of strings, e.g. ['ls', '-l']")
        args = list(argv)
        for a in args:
            if not isinstance(a, str):
                raise ConfigurationError(f"argv items must be str, got {type(a).__name__}")
            if "\x00" in a:
                raise ConfigurationError("argv items cannot contain NUL bytes")
            if len(a.encode("utf-8", "surrogateescape")) >= MAX_ARG:
                raise ConfigurationError(
                    f"an argument is {len(a)} characters; the kernel limit is 128 KiB per argument "
                    "(write large code to a file with write_file and run that)"
                )
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds or None")
        call_env: dict[str, str] = {}
        for k, v in (env or {}).items():
            if not isinstance(k, str) or not _ENV_NAME.fullmatch(k):
                raise ConfigurationError(
                    f"environment name {k!r} is invalid; use letters, digits and '_', "
                    "not starting with a digit"
                )
            if k.startswith("AGENTNEST_"):
                raise ConfigurationError(f"environment name {k!r} is reserved (AGENTNEST_ prefix)")
            if isinstance(v, Secret):
                self.add_secret(v.get_secret_value())
                v = v.get_secret_value()
            if not isinstance(v, str) or "\x00" in v:
                raise ConfigurationError(f"environment[{k!r}] must be a str without NUL bytes")
            call_env[k] = v
        workdir = self.workdir_path(cwd) if cwd is not None else None
        self.approve("exec", {"argv": [self.redact(a) for a in args], "cwd": workdir})
        self.emit(EventType.EXEC_STARTED, {"argv": args[:64], "timeout": timeout})
        return args, call_env, workdir, float(timeout) if timeout is not None else None

    def add_secret(self, value: str) -> None:
        """Redact ``value`` for the rest of the sandbox's life."""
        if value and value not in self.secrets:
            self.secrets = (*self.secrets, value)

    def redact(self, text: str) -> str:
        return redact(text, self.secrets) if self.secrets else text

    def finish_exec(self, raw: RawExit, stdout: bytes, stderr: bytes, truncated: bool) -> ExecutionResult:
        result = ExecutionResult(
            stdout=self.redact(stdout.decode("utf-8", "replace")),
            stderr=self.redact(stderr.decode("utf-8", "replace")),
            exit_code=raw.code,
            duration=raw.duration,
            timed_out=raw.timed_out,
            truncated=truncated or raw.truncated,
            signal=raw.signal,
        )
        self.emit(
            EventType.EXEC_TIMED_OUT if raw.timed_out else EventType.EXEC_FINISHED,
            {"exit_code": raw.code, "duration": raw.duration, "truncated": result.truncated},
        )
        return result

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self.secrets)

    # -- files -----------------------------------------------------------------

    def workdir_path(self, path: str) -> str:
        """An absolute path inside the workspace (for cwd)."""
        rel = self.workspace_path(path)
        return posixpath.join(self.config.workdir, rel) if rel else self.config.workdir

    def workspace_path(self, path: str) -> str:
        """Normalise a user path to a workspace-relative one, or refuse it.

        Relative paths are relative to the workspace; absolute paths must lie
        inside it.  ``..`` may not climb out.  Links are the agent's business:
        it refuses to follow any.
        """
        if not isinstance(path, str):
            raise FileAccessError(
                f"path must be str, not {type(path).__name__}", path=None, code="invalid_path"
            )
        if not path or "\x00" in path:
            raise FileAccessError(
                "path must be a non-empty string without NUL bytes", path=path, code="invalid_path"
            )
        root = self.config.workdir.rstrip("/")
        full = posixpath.normpath(path if path.startswith("/") else posixpath.join(root, path))
        if full.startswith("//"):
            full = full[1:]
        if full != root and not full.startswith(root + "/"):
            raise FileAccessError(
                f"{path!r} is outside the workspace {root}; use a path below it",
                path=path,
                code="outside_workspace",
            )
        return full[len(root) + 1 :] if full != root else ""


class StreamDecoder:
    """Incremental UTF-8 decoding and redaction for one streaming command."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._dec = {
            1: codecs.getincrementaldecoder("utf-8")("replace"),
            2: codecs.getincrementaldecoder("utf-8")("replace"),
        }
        self._red = {1: StreamRedactor(secrets), 2: StreamRedactor(secrets)}

    def feed(self, fd: int, data: bytes) -> ExecutionChunk | None:
        text = self._red[fd].feed(self._dec[fd].decode(data))
        if not text:
            return None
        return ExecutionChunk("stdout" if fd == 1 else "stderr", text)

    def flush(self) -> list[ExecutionChunk]:
        out = []
        for fd in (1, 2):
            text = self._red[fd].feed(self._dec[fd].decode(b"", final=True)) + self._red[fd].flush()
            if text:
                out.append(ExecutionChunk("stdout" if fd == 1 else "stderr", text))
        return out
