"""The guard: the one place every public operation passes (no I/O here).

It validates arguments against the configuration and the security policy,
asks the approval hook, bounds and redacts what comes back, and emits audit
events.  ``Sandbox`` does the I/O around it; backends never see output
before the guard has redacted it.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import functools
import inspect
import math
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

from .approvals import ApprovalHook, ApprovalRequest, HookTimeout, call_bounded, close_awaitable, command_line

__all__ = ["ApprovalRequest", "Guard", "StreamDecoder", "scrub_errors"]
from .channel.protocol import RawExit
from .config import ExecutionChunk, ExecutionResult, FileInfo, SandboxConfig
from .errors import (
    AgentNestError,
    ConfigurationError,
    FileAccessError,
    PolicyDeniedError,
    UnsupportedCapabilityError,
)
from .events import EventType, Observer, SandboxEvent, observer_callable
from .policy import NetworkMode, SecurityPolicy
from .runtime.base import Capability
from .secrets import Secret, StreamRedactor, expand, redact

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: Longest single argument Linux accepts (MAX_ARG_STRLEN).
MAX_ARG = 128 * 1024


#: Longest string kept in an event's data (commands, code, paths).
MAX_EVENT_TEXT = 4096


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
        self.observers = tuple(observer_callable(o) for o in observers)
        self.approval_hook = approval_hook
        if approval_hook is not None and not callable(approval_hook):
            raise ConfigurationError("approval_hook must be a callable taking an ApprovalRequest")
        # The policy's hook (an organisation's rules) is asked first; both must allow.
        self.hooks: tuple[ApprovalHook, ...] = tuple(
            h for h in (policy.approval_hook, approval_hook) if h is not None
        )
        self.sandbox_id = "pending"
        self.secrets: tuple[str, ...] = ()
        self._forms: tuple[str, ...] = ()
        for value in config.secrets:
            self.add_secret(value)

    # -- creation --------------------------------------------------------------

    def check_create(self, capabilities: frozenset[Capability], runtime: str | None = None) -> None:
        """Refuse, before anything exists, what the policy forbids or the backend cannot enforce."""
        reason = self.policy.check_image(self.config.image) or self.policy.check_limits(
            self.config.limits, self.config.lifetime
        )
        if reason:
            self.deny("sandbox.create", reason)
        if self.policy.read_only_root and not self.config.read_only_root:
            self.deny("sandbox.create", "the security policy requires a read-only root filesystem")
        reason = self.policy.check_runtime(runtime)
        if reason:
            self.deny("sandbox.create", reason)
        self.check_capabilities(capabilities)
        mode = self.config.network.mode
        if mode is not NetworkMode.DENIED:
            self.approve("network", {"mode": mode.value, "domains": list(self.config.network.domains)})

    def check_capabilities(self, capabilities: frozenset[Capability]) -> None:
        """Fail closed: a setting the backend cannot enforce refuses the sandbox."""
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
        if Capability.RESOURCE_LIMITS not in capabilities:
            raise UnsupportedCapabilityError(
                "this backend cannot enforce memory, CPU and PID limits; no sandbox was created"
            )
        if self.config.read_only_root and Capability.READ_ONLY_ROOT not in capabilities:
            raise UnsupportedCapabilityError(
                "this backend cannot keep the root filesystem read-only; pass read_only_root=False "
                "(if the policy allows it) or use another backend; no sandbox was created"
            )
        if self.config.limits.gpus and Capability.GPU not in capabilities:
            raise UnsupportedCapabilityError("this backend cannot pass GPUs through")
        custom = [n for n in ("seccomp_profile", "apparmor_profile") if getattr(self.config, n) is not None]
        if custom and Capability.SECURITY_PROFILES not in capabilities:
            raise UnsupportedCapabilityError(
                f"this backend cannot apply the policy's {' and '.join(custom)}; no sandbox was created"
            )
        if self.config.rootless and Capability.ROOTLESS not in capabilities:
            raise UnsupportedCapabilityError(
                "the policy requires a rootless engine and this backend cannot tell whether it has one; "
                "no sandbox was created"
            )

    # -- approvals and events --------------------------------------------------

    def deny(self, kind: str, reason: str, details: Mapping[str, Any] | None = None) -> None:
        self.emit(EventType.POLICY_DENIED, {"kind": kind, "reason": reason, **(details or {})})
        raise PolicyDeniedError(
            self.redact(f"{kind} denied: {reason}"),
            request=ApprovalRequest(kind, self.sandbox_id, MappingProxyType(dict(details or {}))),
        )

    def approve(self, kind: str, details: Mapping[str, Any]) -> None:
        """Ask every approval hook; raise :class:`PolicyDeniedError` unless all allow.

        A hook that raises, returns something falsy, or does not answer within
        the policy's ``approval_timeout`` denies.  Details are redacted
        before any hook sees them.
        """
        if not self.hooks:
            return
        details = self.redact_data(dict(details))
        request = ApprovalRequest(kind, self.sandbox_id, MappingProxyType(details))
        self.emit(EventType.APPROVAL_REQUESTED, {"kind": kind, **details})
        for hook in self.hooks:
            reason = self._ask(hook, request)
            if reason is not None:
                self.emit(EventType.APPROVAL_DENIED, {"kind": kind, "reason": reason})
                self.deny(kind, reason, details)
        self.emit(EventType.APPROVAL_GRANTED, {"kind": kind})

    def _ask(self, hook: ApprovalHook, request: ApprovalRequest) -> str | None:
        """Why ``hook`` denies ``request``, or None if it allows it."""
        timeout = self.policy.approval_timeout
        try:
            if getattr(hook, "agentnest_inline", False):
                answer = hook(request)  # the built-ins: pure, immediate
            else:
                answer = call_bounded(hook, request, timeout)
        except HookTimeout:
            return f"the approval hook did not answer within {timeout:g}s"
        except Exception as exc:
            return f"the approval hook raised {type(exc).__name__}: {exc}"
        if inspect.isawaitable(answer):  # an inline hook must not return one
            close_awaitable(answer)
            return "the approval hook returned an awaitable where an answer was expected"
        return None if answer else "the approval hook refused"

    def emit(self, kind: EventType, data: Mapping[str, Any], actor: str = "host") -> None:
        if not self.observers:
            return
        event = SandboxEvent(
            kind, self.sandbox_id, attributes=MappingProxyType(self.redact_data(dict(data))), actor=actor
        )
        for observer in self.observers:
            observer(event)

    def redact_data(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``data`` with secrets redacted from every string in it (bounded)."""
        return {k: self._redact_value(v, 0) for k, v in data.items()}

    def _redact_value(self, value: Any, depth: int) -> Any:
        if isinstance(value, str):
            text = self.redact(value)
            return text if len(text) <= MAX_EVENT_TEXT else text[:MAX_EVENT_TEXT] + "..."
        if depth >= 4:
            return value if isinstance(value, (int, float, bool, type(None))) else repr(type(value))
        if isinstance(value, (list, tuple)):
            return [self._redact_value(v, depth + 1) for v in value[:256]]
        if isinstance(value, Mapping):
            return {str(k): self._redact_value(v, depth + 1) for k, v in list(value.items())[:256]}
        return value

    def scrub(self, exc: BaseException) -> None:
        """Redact secrets from an exception's message and text attributes, in place."""
        if not self._forms or not isinstance(exc, AgentNestError):
            return
        exc.args = tuple(self.redact(a) if isinstance(a, str) else a for a in exc.args)
        for name in ("path", "member"):
            value = getattr(exc, name, None)
            if isinstance(value, str):
                setattr(exc, name, self.redact(value))

    # -- commands --------------------------------------------------------------

    def exec_request(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None,
        env: Mapping[str, str | Secret] | None,
        cwd: str | None,
        display_command: str | None = None,
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
        self.approve("exec", {"argv": args, "command": command_line(args), "cwd": workdir})
        started: dict[str, Any] = {"argv": args[:64], "timeout": timeout}
        if display_command is not None:
            started["command"] = display_command
        self.emit(EventType.EXEC_STARTED, started)
        return args, call_env, workdir, float(timeout) if timeout is not None else None

    def add_secret(self, value: str) -> None:
        """Redact ``value`` (and its encoded forms) for the rest of the sandbox's life."""
        if value and value not in self.secrets:
            self.secrets = (*self.secrets, value)
            self._forms = expand(self.secrets)

    def redact(self, text: str) -> str:
        return redact(text, self._forms) if self._forms else text

    def finish_exec(
        self, raw: RawExit, stdout: bytes, stderr: bytes, truncated: bool, command: str = ""
    ) -> ExecutionResult:
        result = ExecutionResult(
            command=self.redact(command),
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

    def redact_info(self, info: FileInfo) -> FileInfo:
        """A listing entry with secrets redacted from its path."""
        path = self.redact(info.path)
        return info if path == info.path else dataclasses.replace(info, path=path)

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self._forms)

    # -- files -----------------------------------------------------------------

    def absolute(self, rel: str) -> str:
        """The absolute path in the sandbox of a workspace-relative one."""
        return posixpath.join(self.config.workdir, rel) if rel else self.config.workdir

    def workdir_path(self, path: str) -> str:
        """An absolute path inside the workspace (for cwd)."""
        return self.absolute(self.workspace_path(path))

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


_C = TypeVar("_C", bound=type)


def scrub_errors(cls: _C) -> _C:
    """Class decorator: errors leaving a public method have secrets redacted.

    The instance's guard is ``self._guard`` (or that of ``self._sandbox`` or
    ``self._session``).
    A message can quote what the sandbox sent (an agent's error, a path, a
    traceback line), so every public method of the public classes passes
    its errors through :meth:`Guard.scrub` on the way out.
    """
    wrapped: dict[int, Callable[..., Any]] = {}  # aliases (close = destroy) stay aliases
    for name, attr in list(vars(cls).items()):
        if (name.startswith("_") and name not in ("__iter__", "_iterate")) or not inspect.isfunction(attr):
            continue
        if id(attr) not in wrapped:
            wrapped[id(attr)] = _scrubbing(attr)
        setattr(cls, name, wrapped[id(attr)])
    return cls


def _guard_of(obj: Any) -> Guard | None:
    for owner in (obj, getattr(obj, "_sandbox", None), getattr(obj, "_session", None)):
        guard = getattr(owner, "_guard", None)
        if isinstance(guard, Guard):
            return guard
    return None


@contextlib.contextmanager
def _scrubbed(owner: Any) -> Iterator[None]:
    try:
        yield
    except AgentNestError as exc:
        guard = _guard_of(owner)
        if guard is not None:
            guard.scrub(exc)
        raise


def _scrubbing(fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            with _scrubbed(self):
                yield from fn(self, *args, **kwargs)

        return generator

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _scrubbed(self):
            return fn(self, *args, **kwargs)

    return call
