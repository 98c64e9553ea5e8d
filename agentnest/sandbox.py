"""``Sandbox``: the synchronous face of AgentNest (thin; the logic is in the guard)."""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

from . import state as _state
from ._aliases import either, renamed
from .approvals import ApprovalHook, command_line
from .channel.client import STALL_AFTER, Channel, ExecHandle
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
    AuditError,
    BackendError,
    ChannelError,
    ConfigurationError,
    ExecutionError,
    ExecutionTimeoutError,
    FileAccessError,
    FileTooLargeError,
    SandboxDestroyedError,
    SandboxPausedError,
    SnapshotError,
    UnsupportedCapabilityError,
    VerificationError,
)
from .events import EventType, Observer
from .guard import Guard, scrub_errors, workspace_medium
from .policy import NetworkPolicy, SecurityPolicy
from .profiles import Profile, profile_kwargs
from .runtime import bootstrap
from .runtime.base import Capability, RuntimeBackend, SandboxHandle
from .runtime.registry import get_backend
from .secrets import SECRET_DIR, Secret
from .session import PythonSession, PythonSessionInfo, list_python_sessions, open_python_session

if TYPE_CHECKING:
    from .browser.driver import Browser

#: Extra time the host waits past a command's own timeout for the agent to
#: report the kill, before it declares the agent hung.
_BACKSTOP_GRACE = 10.0
#: Base time allowed for a file operation, plus time per MiB.
_FILE_BASE_WAIT = 30.0
_FILE_WAIT_PER_MIB = 0.5
#: Longest recursive remove; the agent's heartbeats show it is still at work.
_REMOVE_WAIT = 3600.0
#: Python code longer than this goes to the interpreter on stdin, not argv.
_MAX_INLINE_CODE = 100 * 1024


_F = TypeVar("_F", bound=Callable[..., Any])

#: Writes ``Secret(..., as_file=True)`` values (JSON on stdin) into SECRET_DIR.
#: Private directory and 0400 files, no link followed, written then renamed.
_WRITE_SECRET_FILES = f"""
import json, os, stat, sys
d = {SECRET_DIR!r}
os.umask(0o077)
try:
    os.mkdir(d, 0o700)
except FileExistsError:
    pass
st = os.lstat(d)
if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
    sys.exit("refusing " + d + ": not our own directory")
for name, value in json.load(sys.stdin).items():
    path = os.path.join(d, name)
    fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o400)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(path + ".new", path)
"""


#: What an egress audit event carries.
_EGRESS_FIELDS = (
    "host",
    "port",
    "address",
    "reason",
    "detail",
    "method",
    "bytes_up",
    "bytes_down",
    "duration",
)


@overload
def with_profile(fn: _F) -> _F: ...
@overload
def with_profile(*, image: bool = True) -> Callable[[_F], _F]: ...
def with_profile(fn: _F | None = None, *, image: bool = True) -> _F | Callable[[_F], _F]:
    """Let ``profile=`` and ``preset=`` fill in every argument the caller did not pass explicitly.

    ``image=False`` leaves a preset's image for later (``AsyncSandbox.create``
    resolves it, which may build it, in its worker thread, not on the event loop).
    """
    if fn is None:
        return functools.partial(with_profile, image=image)
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        profile = kwargs.pop("profile", None)
        if profile is None and kwargs.get("preset") is None:
            return fn(*args, **kwargs)
        given = dict(signature.bind_partial(*args, **kwargs).arguments)
        first = given.pop(next(iter(signature.parameters)))  # self or cls
        if profile is not None:
            given = profile_kwargs(profile, given)
        if given.get("preset") is not None:
            from .browser.image import preset_kwargs

            given = preset_kwargs(given, image=image)
        return fn(first, **given)

    return call


def default_image() -> str:
    """The image ``Sandbox()`` uses when none is given (built by ``agentnest image base``)."""
    from .runtime.docker.images import base_image

    return os.environ.get("AGENTNEST_IMAGE") or base_image()


@scrub_errors
class Sandbox:
    """A disposable, policy-controlled sandbox.

    Example::

        with Sandbox("python:3.12-slim", timeout=60) as sandbox:
            sandbox.write_file("main.py", "print('hello from isolation')")
            print(sandbox.exec_shell("python main.py").stdout)

    Args:
        image: image reference; ``None`` uses the default base image.
        timeout: lifetime in seconds; the sandbox stops itself then, even if
            this process has died.
        environment: variables for every command; ``Secret`` values are
            redacted from all output.
        workdir: the workspace mount point.
        network_enabled: 0.3.0 switch for open networking; prefer
            ``security_policy=SecurityPolicy(network=...)``.
        memory, cpus, pids, gpus: resource limits.
        workspace_size, scratch_size: sizes of ``/workspace`` and ``/tmp``.
            ``/tmp`` is memory-backed (counted against ``memory``): by default
            an eighth of it, at most 64m.  The workspace's default depends on
            where it lives (``workspace``): 8g on disk, and in memory half of
            ``memory``, at most 256m.
        disk: the size of a disk workspace (``"10g"``); implies
            ``workspace="disk"``.  The kernel refuses writes beyond it
            (EDQUOT inside the sandbox); only what is written costs host disk.
        workspace: ``"disk"`` (the storage pool: bounded, copy-on-write, not
            counted against ``memory``; see docs/state.md), ``"memory"`` (a
            tmpfs: small, fast, RAM only) or ``None``: disk when the backend
            has a storage pool, else memory.
        backend: a backend name (``docker``, ``gvisor``, ``kata`` or a
            plug-in) or a :class:`RuntimeBackend` instance.
        read_only_root: keep the image read-only.
        security_policy: what the sandbox may do.
        observers: callables receiving every :class:`SandboxEvent`.
        approval_hook: called with an :class:`ApprovalRequest` before each
            operation; a falsy answer, an exception or no answer within the
            policy's ``approval_timeout`` denies it.  May be async.  The
            policy's own ``approval_hook`` is asked too; both must allow.
        verify: check from inside, before handing the sandbox out, that the
            policy holds (user, capabilities, seccomp, read-only root,
            network, limits); a sandbox that fails is destroyed and
            :class:`VerificationError` raised.  Costs one probe (a Python start inside).
        profile: a profile name (looked up in ``agentnest.yaml``, see
            docs/profiles.md) or a :class:`Profile`; arguments passed
            explicitly override the profile's.
        runtime: 0.3.0's name of ``image`` (deprecated; 0.3.0 took it as the
            first positional argument, which ``image`` is).
        preset: ``"browser"``: a sandbox with Chromium and Playwright (the
            image is built offline on first use; see docs/presets.md), 2g of
            memory, 512 processes and a 256m ``/tmp`` unless given here; drive
            it with :meth:`browser`.

    Raises:
        ConfigurationError: an argument is invalid.
        PolicyDeniedError: the policy or the approval hook refused.
        ImageNotFoundError, RuntimeNotAvailableError, BackendError: the engine
            could not provide the sandbox.
    """

    @with_profile
    def __init__(
        self,
        image: str | None = None,
        timeout: float = 300,
        *,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str = "/workspace",
        network_enabled: bool = False,
        memory: int | str = "512m",
        cpus: float = 1.0,
        pids: int = 256,
        gpus: int = 0,
        workspace_size: int | str | None = None,
        scratch_size: int | str | None = None,
        backend: str | RuntimeBackend = "docker",
        read_only_root: bool = True,
        security_policy: SecurityPolicy | None = None,
        observers: Sequence[Observer] = (),
        approval_hook: ApprovalHook | None = None,
        verify: bool = False,
        profile: str | Profile | None = None,
        runtime: str | None = None,
        disk: int | str | None = None,
        workspace: str | None = None,
        preset: str | None = None,
    ) -> None:
        # stacklevel 4: past this __init__ and with_profile's wrapper, to the caller.
        image = renamed(
            image, runtime, "image", "runtime", ours_given=image is not None, where="Sandbox()", stacklevel=4
        )
        policy = security_policy or SecurityPolicy()
        network = policy.network
        if network_enabled:
            if security_policy is not None and network != NetworkPolicy.denied():
                raise ConfigurationError(
                    "pass either network_enabled=True or a SecurityPolicy network, not both"
                )
            network = NetworkPolicy.open()
        self._backend = get_backend(backend) if isinstance(backend, str) else backend
        if not isinstance(self._backend, RuntimeBackend):
            raise ConfigurationError("backend must be a backend name or a RuntimeBackend instance")
        medium, size = workspace_medium(workspace, disk, workspace_size, self._backend.capabilities())
        config = SandboxConfig(
            image=image if image is not None else default_image(),
            lifetime=timeout,
            environment=environment,  # type: ignore[arg-type]  # frozen in __post_init__
            workdir=workdir,
            network=network,
            limits=ResourceLimits.build(memory, cpus, pids, size, scratch_size, gpus, medium),
            read_only_root=read_only_root,
            seccomp_profile=policy.seccomp_profile,
            apparmor_profile=policy.apparmor_profile,
            rootless=policy.rootless,
            proxy_image=policy.egress_proxy_image,
            preset=preset,
        )
        self._guard = Guard(config, policy, observers, approval_hook)
        self._guard.check_create(self._backend.capabilities(), self._backend.oci_runtime)
        self._lock = threading.Lock()
        self._channel: Channel | None = None
        self._destroyed = False
        self._paused = False
        # Egress reports (allowlist sandboxes): see _watch_egress.
        self._egress_failure: BaseException | None = None
        self._stop_egress: Callable[[], None] | None = None
        provision = _state.PROVISION.get() or self._backend.create  # a host-side fork's child: state.forks
        provided = provision(config)
        # A warm spare's agent is connected already (state.spares).
        provided, ready = provided if isinstance(provided, tuple) else (provided, None)
        self._handle: SandboxHandle = provided
        self._guard.sandbox_id = self._handle.id
        self._mono_deadline = time.monotonic() + (self._handle.deadline - time.time())
        self._lifetime = config.lifetime
        # A sandbox another process paused to disk, resumed here (from_checkpoint).
        attached = bool(self._handle.info.pop("attached", False))
        try:
            if ready is None:
                self._connect(attached=attached)
            else:
                self._channel = ready
            if config.secret_files:
                self._write_secret_files(config.secret_files)
            if verify:
                self._verify()
            # Inside the try: an observer that fails must not leave a
            # container behind that nobody holds a handle to.
            self._guard.emit(
                EventType.SANDBOX_RESUMED if attached else EventType.SANDBOX_CREATED,
                {
                    "image": config.image,
                    # What the engine runs, when an alias mapped the name (AGENTNEST_IMAGE_ALIASES).
                    "resolved_image": self._handle.info.get("image", config.image),
                    "backend": self._handle.backend,
                    "network": config.network.mode.value,
                    **(
                        {
                            "from_checkpoint": True,
                            # As resume() says it: False when a new agent replaced the restored one.
                            "reconnected": not self._handle.info.pop("agent_replaced", False),
                        }
                        if attached
                        else {}
                    ),
                },
            )
            self._watch_egress()
        except BaseException:
            channel: Channel | None = self._channel  # set by _connect() if it got that far
            if channel is not None:
                channel.close("sandbox creation failed")
            self._backend.destroy(self._handle)
            self._destroyed = True
            raise

    # -- properties ------------------------------------------------------------

    @property
    def id(self) -> str:
        """AgentNest's id of this sandbox (also on its engine labels)."""
        return self._handle.id

    @property
    def config(self) -> SandboxConfig:
        return self._guard.config

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def deadline(self) -> float:
        """Epoch seconds at which the sandbox stops itself."""
        return self._handle.deadline

    @property
    def backend(self) -> RuntimeBackend:
        return self._backend

    @property
    def handle(self) -> SandboxHandle:
        """The backend's handle of this sandbox (for backends and servers built on top).

        .. versionadded:: 0.4.0
        """
        return self._handle

    # -- channel ---------------------------------------------------------------

    def _connect(self, *, attached: bool = False, answer_within: float = 60.0) -> Channel:
        """Open the agent channel (``answer_within``: seconds a restored or lingering agent has to answer)."""
        stream = self._backend.open_channel(self._handle)
        # A live fork's child, or a sandbox resumed from its checkpoint: its
        # agent is a restored one, which takes a reconnect frame, not the
        # bundle (see state.forks, from_checkpoint).
        ids = self._handle.info.pop("reconnect_ids", None)
        try:
            if isinstance(ids, int):
                try:
                    self._channel = Channel.connect(stream, None, timeout=answer_within, after=ids)
                    return self._channel
                except ChannelError:
                    if not (attached and self._backend.is_running(self._handle)):
                        raise
                # Restored, but its agent did not answer: a new one (its
                # Python sessions are lost, the files and processes are not;
                # the sandbox.resumed event says so: reconnected False).
                self._handle.info["agent_replaced"] = True
                stream.close()
                stream = self._backend.open_channel(self._handle)
            self._channel = Channel.connect(stream, bootstrap.bundle(), timeout=60.0)
        except ChannelError as exc:
            raise ChannelError(f"{exc}. Does the image {self.config.image!r} have python3?") from None
        return self._channel

    # -- egress ------------------------------------------------------------------

    def _watch_egress(self) -> None:
        """Turn the egress proxy's reports into audit events (allowlist sandboxes)."""
        log = self._handle.info.get("egress")
        if log is not None and hasattr(log, "subscribe"):
            self._stop_egress = log.subscribe(self._on_egress)

    def _on_egress(self, event: dict[str, Any]) -> None:
        kind = EventType.EGRESS_ALLOWED if event.get("type") == "egress.allowed" else EventType.EGRESS_DENIED
        data = {k: event.get(k) for k in _EGRESS_FIELDS}
        try:
            # The sandbox's own doing, reported by its proxy: actor "sandbox".
            self._guard.emit(kind, data, actor="sandbox")
        except Exception as exc:
            # Called from the proxy's reader thread, where nobody would see it:
            # the next call on this sandbox raises it instead (fail loud).
            self._egress_failure = exc

    def add_secret(self, value: str | Secret) -> None:
        """Redact ``value`` (and its encoded forms) from everything this sandbox returns, from now on.

        For values that reach the sandbox another way than ``environment``
        (a token a tool passes on stdin, a credential a helper writes).

        .. versionadded:: 0.4.0
        """
        raw = value.get_secret_value() if isinstance(value, Secret) else value
        if not isinstance(raw, str) or not raw:
            raise ConfigurationError("add_secret needs a non-empty str or a Secret")
        self._guard.add_secret(raw)

    def network_log(self) -> list[dict[str, Any]]:
        """Every connection the sandbox tried through its egress proxy, oldest first.

        One dict per connection, allowed or refused: ``type``
        (``egress.allowed``/``egress.denied``), ``host``, ``port``,
        ``address`` (the resolved address the proxy checked), ``reason``,
        ``detail``, ``method``, ``bytes_up``, ``bytes_down``, ``duration``
        and ``time``; the most recent 1000 are kept.  Empty for a sandbox
        without an allowlist.  Host names and details are redacted (code
        can put a secret in a name it asks for).  docs/egress.md.

        .. versionadded:: 0.4.0
        """
        log = self._handle.info.get("egress")
        if log is None or not hasattr(log, "log"):
            return []
        return [self._guard.redact_data(entry) for entry in log.log()]

    def _internal_python(self, code: str, stdin: bytes | None = None, timeout: float = 30.0) -> bytes:
        """Run our own Python program in the sandbox; return its stdout.

        Through the channel, not exec(): no approval and no event (it is not
        the caller's operation), and data goes on stdin, never in an argv
        that /proc shows.  Raises BackendError if it fails.
        """
        handle = self._ch().start_exec(
            ["python3", "-I", "-S", "-c", code],
            env={},
            cwd=None,
            timeout=timeout,
            max_output=1 << 20,
            stdin=stdin,
        )
        out: list[bytes] = []
        err: list[bytes] = []
        for event in handle.events(time.monotonic() + timeout + _BACKSTOP_GRACE):
            if isinstance(event, tuple):
                (out if event[0] == 1 else err).append(event[1])
        if handle.result is None or handle.result.code != 0 or handle.truncated:
            detail = self._guard.redact(b"".join(err).decode("utf-8", "replace").strip()[-300:])
            raise BackendError(
                f"AgentNest's own program failed in sandbox {self.id}: {detail or 'no output'}"
            )
        return b"".join(out)

    def _write_secret_files(self, files: dict[str, str]) -> None:
        try:
            self._internal_python(_WRITE_SECRET_FILES, json.dumps(files).encode("utf-8"))
        except BackendError as exc:
            raise BackendError(f"could not write the secret files into {SECRET_DIR}: {exc}") from None

    def _verify(self) -> None:
        from . import verify as _verify

        config = self.config
        try:
            seen = json.loads(self._internal_python(_verify.PROBE))
        except ValueError:
            raise VerificationError(f"sandbox {self.id}: the verification probe sent no JSON") from None
        if not isinstance(seen, dict):
            raise VerificationError(f"sandbox {self.id}: the verification probe sent {type(seen).__name__}")
        findings = _verify.judge(
            seen,
            config.limits,
            gvisor=self._backend.oci_runtime == "runsc",
            network=config.network.mode.value,
            uid=int(config.user.split(":")[0]),
            read_only=config.read_only_root,
            workspace_quota=self._backend.workspace_quota(self._handle),
        )
        failed = [f for f in findings if f.status == _verify.FAIL]
        self._guard.emit(
            EventType.SANDBOX_VERIFIED,
            {"ok": not failed, "checks": {f.name: f.status for f in findings}},
        )
        if failed:
            summary = "; ".join(f"{f.name}: {f.detail} (fix: {f.hint})" for f in failed)
            raise VerificationError(
                f"sandbox {self.id} does not hold its policy, so it was destroyed: {summary}", findings
            )

    def _ch(self) -> Channel:
        if self._destroyed:
            raise SandboxDestroyedError(f"sandbox {self.id} was destroyed")
        if self._paused:
            # Refused, not queued: a call that waited on a paused sandbox would
            # look like a hang to its caller.
            raise SandboxPausedError(f"sandbox {self.id} is paused; call resume() first")
        failure = self._egress_failure
        if failure is not None:
            self._egress_failure = None
            raise AuditError(
                f"an egress event of sandbox {self.id} could not be recorded: {failure}"
            ) from failure
        ch = self._channel
        if ch is not None and ch.alive:
            return ch
        with self._lock:
            ch = self._channel
            if ch is not None and ch.alive:
                return ch
            self._check_alive()
            old_reason = ch.broken_reason if ch is not None else None
            if ch is not None and self._handle.info.get("reattach"):
                # The backend's agent outlives its stream (a pod's listening
                # agent): reach the same one again, its commands and sessions
                # with it; a new agent only if it does not answer.
                self._handle.info["reconnect_ids"] = ch.next_id()
                # A live agent answers at once; one that is stopped or wedged
                # (the reason the stream was dropped, perhaps) gets a stall's
                # worth of time, then a new agent takes over.
                ch = self._connect(attached=True, answer_within=STALL_AFTER)
                reattached = not self._handle.info.pop("agent_replaced", False)
                self._guard.emit(
                    EventType.AGENT_RESTARTED,
                    {"reason": old_reason or "stream lost", "reattached": reattached},
                )
                return ch
            ch = self._connect()
            self._guard.emit(EventType.AGENT_RESTARTED, {"reason": old_reason or "not started"})
            return ch

    def _check_alive(self) -> None:
        if self._destroyed:
            raise SandboxDestroyedError(f"sandbox {self.id} was destroyed")
        if time.time() >= self._handle.deadline:
            raise SandboxDestroyedError(f"sandbox {self.id} reached its deadline and stopped")
        if not self._backend.is_running(self._handle):
            reason = self._backend.exit_reason(self._handle) or "it was stopped or killed"
            raise SandboxDestroyedError(f"sandbox {self.id} is no longer running: {reason}")

    def _lost(self, exc: ChannelError) -> Exception:
        """Explain a broken channel: the sandbox ended, or only its agent did."""
        channel = self._channel
        if channel is not None and channel.alive:
            return exc  # the agent refused this request and lives on: nothing was lost
        try:
            self._check_alive()
        except SandboxDestroyedError as gone:
            return gone
        if self._handle.info.get("reattach"):
            return ChannelError(
                f"{exc}; the stream to the in-sandbox agent was lost during this call (or the agent "
                "died): the next call reconnects to it, its commands and sessions with it if it lives"
            )
        return ChannelError(
            f"{exc}; the in-sandbox agent was lost (killed or crashed) during this call, "
            "the sandbox and its files are intact and the next call starts a new agent"
        )

    # -- commands --------------------------------------------------------------

    def exec(
        self,
        command: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
        display_command: str | None = None,
    ) -> ExecutionResult:
        """Run ``command``, an argument vector (no shell), and wait for it.

        Args:
            command: program and arguments.
            timeout: seconds before the command and its whole process tree
                are killed; ``None`` bounds it only by the sandbox's lifetime.
            env: extra environment for this command (``environment`` is the
                same, 0.3.0's name).
            cwd: working directory inside the workspace, relative or absolute
                (``workdir`` is the same, 0.3.0's name).
            input: data for the command's stdin.
            display_command: how ``ExecutionResult.command`` and the audit
                event name the command (default: the quoted argv).

        Returns:
            The :class:`ExecutionResult`; a non-zero exit is not an error.

        Raises:
            ExecutionTimeoutError: the command ran past ``timeout``; ``.result``
                has the partial output.  The sandbox lives on.
        """
        handle = self._start(
            command,
            timeout,
            either(env, environment, "env", "environment"),
            either(cwd, workdir, "cwd", "workdir"),
            input,
            display_command=display_command,
        )
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            for event in handle.events(self._wait_deadline(timeout)):
                if isinstance(event, tuple):
                    (out if event[0] == 1 else err).append(event[1])
        except ChannelError as exc:
            raise self._lost(exc) from None
        except BaseException:
            handle.cancel()
            handle.abandon()
            raise
        return self._result(handle, b"".join(out), b"".join(err), timeout)

    def exec_shell(
        self,
        script: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> ExecutionResult:
        """Run ``script`` with ``/bin/sh -c``.  See :meth:`exec`."""
        return self.exec(
            ["/bin/sh", "-c", _text(script, "script")],
            timeout=timeout,
            env=either(env, environment, "env", "environment"),
            cwd=either(cwd, workdir, "cwd", "workdir"),
            input=input,
            display_command=script,
        )

    def exec_python(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> ExecutionResult:
        """Run Python ``code`` in a fresh ``python3`` process.  See :meth:`exec`.

        Code too long for one command-line argument is fed on stdin instead
        (then ``input`` must be None).
        """
        code = _text(code, "code")
        env = either(env, environment, "env", "environment")
        cwd = either(cwd, workdir, "cwd", "workdir")
        if len(code.encode("utf-8", "surrogateescape")) > _MAX_INLINE_CODE:
            if input is not None:
                raise ConfigurationError(
                    "code longer than 100 KiB is sent on stdin, so input= cannot be used with it; "
                    "write the code to a file with write_file and run it instead"
                )
            return self.exec(
                ["python3", "-"],
                timeout=timeout,
                env=env,
                cwd=cwd,
                input=code,
                display_command="python -c <code>",
            )
        return self.exec(
            self._python_argv(code),
            timeout=timeout,
            env=env,
            cwd=cwd,
            input=input,
            display_command="python -c <code>",
        )

    def run_code(
        self, code: str, language: str = "python", *, timeout: float | None = None
    ) -> ExecutionResult:
        """Run a snippet (``python`` or ``shell``); read ``.output`` for its output."""
        if language in ("python", "py", "python3"):
            return self.exec_python(code, timeout=timeout)
        if language in ("shell", "sh", "bash"):
            return self.exec_shell(code, timeout=timeout)
        raise ConfigurationError(f"language {language!r} is not supported; use 'python' or 'shell'")

    def exec_json(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> Any:
        """Run Python ``code`` that prints one JSON document; return it parsed.  See :meth:`exec`."""
        result = self.exec_python(
            code,
            timeout=timeout,
            env=either(env, environment, "env", "environment"),
            cwd=either(cwd, workdir, "cwd", "workdir"),
        ).check()
        try:
            return json.loads(result.stdout)
        except ValueError as exc:
            raise ExecutionError(f"the code's stdout is not JSON: {exc}", result) from None

    def browser(self, *, timeout: float = 30.0, viewport: tuple[int, int] = (1280, 720)) -> Browser:
        """The Chromium of a browser sandbox (``Sandbox(preset="browser")``), driven from here.

        Each call returns a new handle on the same browser and page (they live in
        the sandbox's ``agentnest.browser`` Python session).  See
        :class:`agentnest.browser.Browser` and docs/presets.md.

        Args:
            timeout: default seconds per action; a page past it is closed
                (:class:`BrowserTimeoutError`), the sandbox goes on.
            viewport: the page's size in CSS pixels.

        .. versionadded:: 0.4.0
        """
        from .browser.driver import Browser

        self._check_alive()
        return Browser(self, timeout=timeout, viewport=viewport)

    def python_session(self, *, name: str | None = None, start_timeout: float = 30.0) -> PythonSession:
        """Start a persistent Python interpreter in the sandbox, or return the live one of ``name``.

        Variables, imports and open handles live across its ``run()`` calls;
        the value of a trailing expression comes back as ``result``.  See
        :class:`PythonSession` and docs/sessions.md.

        Example::

            with sandbox.python_session() as session:
                session.run("import json; x = 41")
                print(session.run("x + 1").check().result)   # "42"

            sandbox.python_session(name="main").run("x = 41")
            sandbox.python_session(name="main").run("x + 1").result   # "42": the same interpreter

        Args:
            name: without one, a new anonymous session.  With one, the live
                session of that name (the same object on this channel; the
                in-sandbox agent keeps the names, so a new channel to the
                agent finds it too), started under that name if there is none
                or it ended.  1 to 64 letters, digits, ``_``, ``.``, ``-``.
            start_timeout: seconds the interpreter may take to start.

        Raises:
            ConfigurationError: the name is invalid.
            SessionLostError: the interpreter could not start.

        .. versionchanged:: 0.4.0
           Served by the in-sandbox agent (0.3.0 polled files in the workspace); ``name``.
        """
        return open_python_session(self, name=name, start_timeout=start_timeout)

    def sessions(self) -> tuple[PythonSessionInfo, ...]:
        """The sandbox's live Python sessions, named and anonymous, oldest first.

        The in-sandbox agent reports them (closed sessions and ones whose
        interpreter ended are not listed), so any host connected to it sees
        the same list.  ``id`` matches :attr:`PythonSession.id`.

        .. versionadded:: 0.4.0
        """
        return list_python_sessions(self)

    def stream_exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
        display_command: str | None = None,
        interactive: bool = False,
        pty: tuple[int, int] | None = None,
    ) -> ExecutionStream:
        """Run ``argv`` and iterate over its output as it arrives.  Arguments as for :meth:`exec`.

        Returns an :class:`ExecutionStream`: iterate it for
        :class:`ExecutionChunk` items, the last of which is a ``"status"``
        chunk with the ``exit_code``; ``.result`` holds the
        :class:`ExecutionResult` afterwards.  Leaving the iteration early
        (or ``close()``) kills the command's process tree.

        ``interactive=True`` keeps the command's stdin open after ``input``:
        feed it with :meth:`ExecutionStream.send_input` and end it with
        :meth:`~ExecutionStream.close_input`.  ``pty=(rows, cols)`` runs it on
        a terminal of that size (its output arrives as ``stdout``).

        .. versionadded:: 0.4.0 ``interactive`` and ``pty``.
        """
        if not isinstance(interactive, bool):
            raise ConfigurationError("interactive must be True or False")
        handle = self._start(
            argv,
            timeout,
            either(env, environment, "env", "environment"),
            either(cwd, workdir, "cwd", "workdir"),
            input,
            display_command=display_command,
            keep_stdin_open=interactive or pty is not None,
            pty=pty,
        )
        return ExecutionStream(self, handle, timeout)

    def stream_shell(
        self,
        script: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> ExecutionStream:
        """Stream ``/bin/sh -c script``.  See :meth:`stream_exec`."""
        return self.stream_exec(
            ["/bin/sh", "-c", _text(script, "script")],
            timeout=timeout,
            env=either(env, environment, "env", "environment"),
            cwd=either(cwd, workdir, "cwd", "workdir"),
            display_command=script,
        )

    def stream_python(
        self,
        code: str,
        *,
        timeout: float | None = None,
        env: Mapping[str, str | Secret] | None = None,
        cwd: str | None = None,
        environment: Mapping[str, str | Secret] | None = None,
        workdir: str | None = None,
    ) -> ExecutionStream:
        """Stream ``python3 -c code``.  See :meth:`stream_exec`."""
        return self.stream_exec(
            self._python_argv(code),
            timeout=timeout,
            env=either(env, environment, "env", "environment"),
            cwd=either(cwd, workdir, "cwd", "workdir"),
            display_command="python -c <code>",
        )

    def _python_argv(self, code: str) -> list[str]:
        return ["python3", "-c", _text(code, "code")]

    def _start(
        self,
        argv: Sequence[str],
        timeout: float | None,
        env: Mapping[str, str | Secret] | None,
        cwd: str | None,
        input: str | bytes | None,
        *,
        keep_stdin_open: bool = False,
        pty: tuple[int, int] | None = None,
        max_output: int | None = None,
        display_command: str | None = None,
    ) -> ExecHandle:
        """Start a command through the guard (approval, audit event).

        ``keep_stdin_open``, ``pty`` and ``max_output`` (default: the
        policy's) are for ``agentnest shell``.
        """
        # Every argument is checked before the guard records the start.
        if input is not None and not isinstance(input, (str, bytes)):
            raise ConfigurationError("input must be str, bytes or None")
        data = input.encode("utf-8") if isinstance(input, str) else input
        if display_command is not None and not isinstance(display_command, str):
            raise ConfigurationError("display_command must be a str or None")
        args, call_env, workdir, timeout = self._guard.exec_request(
            argv, timeout=timeout, env=env, cwd=cwd, display_command=display_command
        )
        try:
            handle = self._ch().start_exec(
                args,
                env=call_env,
                cwd=workdir,
                timeout=timeout,
                max_output=self._guard.policy.max_output_bytes if max_output is None else max_output,
                stdin=data,
                keep_stdin_open=keep_stdin_open,
                pty=pty,
            )
        except ChannelError as exc:
            raise self._lost(exc) from None
        handle.label = display_command if display_command is not None else command_line(args)
        return handle

    def _wait_deadline(self, timeout: float | None) -> float:
        sandbox_end = self._mono_deadline + _BACKSTOP_GRACE
        if timeout is None:
            return sandbox_end
        return min(time.monotonic() + timeout + _BACKSTOP_GRACE, sandbox_end)

    def _result(
        self, handle: ExecHandle, stdout: bytes, stderr: bytes, timeout: float | None
    ) -> ExecutionResult:
        assert handle.result is not None
        result = self._guard.finish_exec(handle.result, stdout, stderr, handle.truncated, handle.label)
        if result.timed_out:
            raise ExecutionTimeoutError(
                f"command timed out after {timeout}s; it was killed with its process tree "
                "(the sandbox and its files are intact)",
                result,
            )
        return result

    # -- files -----------------------------------------------------------------

    def _file_deadline(self, size: int = 0) -> float:
        return time.monotonic() + _FILE_BASE_WAIT + _FILE_WAIT_PER_MIB * size / 2**20

    def write_file(
        self, path: str, content: str | bytes, *, encoding: str = "utf-8", mode: int = 0o644
    ) -> None:
        """Write ``content`` to ``path`` in the workspace (atomically; parents created).

        ``str`` content is encoded with ``encoding``; ``mode`` sets the permission bits.

        Raises:
            FileAccessError: the path is outside the workspace, crosses a
                symlink, or the write failed (e.g. the workspace is full).
        """
        rel = self._guard.workspace_path(path)
        if isinstance(content, str):
            try:
                payload = content.encode(encoding)
            except LookupError:
                raise ConfigurationError(f"unknown encoding {encoding!r}") from None
            except UnicodeEncodeError as exc:
                raise ConfigurationError(f"content cannot be encoded as {encoding}: {exc.reason}") from None
        elif isinstance(content, (bytes, bytearray, memoryview)):
            payload = bytes(content)
        else:
            raise ConfigurationError(f"content must be str or bytes, not {type(content).__name__}")
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
            raise ConfigurationError(f"mode={mode!r} must be permission bits such as 0o644")
        limit = self._guard.policy.max_file_bytes
        if len(payload) > limit:
            raise FileTooLargeError(
                f"{path!r}: {len(payload)} bytes exceeds max_file_bytes={limit}; "
                "raise it in the SecurityPolicy",
                path=path,
            )
        self._guard.approve("file.write", {"path": self._guard.absolute(rel), "size": len(payload)})
        try:
            channel = self._ch()
            # Fast path: a local disk workspace is written from the host (state.hostfiles).
            if not _state.hostfiles.write(self, rel, payload, mode):
                channel.write_file(rel, payload, mode, self._file_deadline(len(payload)))
        except ChannelError as exc:
            raise self._lost(exc) from None
        self._guard.emit(EventType.FILE_WRITTEN, {"path": rel, "size": len(payload)})

    @overload
    def read_file(self, path: str) -> str: ...
    @overload
    def read_file(self, path: str, encoding: str) -> str: ...
    @overload
    def read_file(self, path: str, encoding: None) -> bytes: ...
    @overload
    def read_file(self, path: str, *, encoding: str | None) -> str | bytes: ...
    def read_file(self, path: str, encoding: str | None = "utf-8") -> str | bytes:
        """Read a workspace file: ``str`` (decoded), or ``bytes`` with ``encoding=None``.

        Secrets in the content are redacted in the ``str`` form.

        Raises:
            FileAccessError: missing, not a regular file, outside the
                workspace, over ``max_file_bytes``, or not valid in ``encoding``.
        """
        rel = self._guard.workspace_path(path)
        self._guard.approve("file.read", {"path": self._guard.absolute(rel)})
        limit = self._guard.policy.read_limit
        try:
            channel = self._ch()
            # Fast path: a local disk workspace is read from the host (state.hostfiles).
            data = _state.hostfiles.read(self, rel, limit)
            if data is None:
                data = channel.read_file(rel, limit, self._file_deadline(limit))
        except ChannelError as exc:
            raise self._lost(exc) from None
        self._guard.emit(EventType.FILE_READ, {"path": rel, "size": len(data)})
        if encoding is None:
            return data
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise FileAccessError(
                f"{path!r} is not valid {encoding} (byte {exc.start}); pass encoding=None to get bytes",
                path=path,
                code="decode",
            ) from None
        except LookupError:
            raise ConfigurationError(f"unknown encoding {encoding!r}") from None
        return self._guard.redact(text)

    def list_files(
        self, path: str = ".", *, recursive: bool = False, max_entries: int = 10000
    ) -> list[FileInfo]:
        """List a workspace directory (links are listed, never followed)."""
        rel = self._guard.workspace_path(path)
        self._guard.approve("file.list", {"path": self._guard.absolute(rel)})
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or not 0 <= max_entries <= 10**6:
            raise ConfigurationError(f"max_entries={max_entries!r} must be 0 to 1000000")
        try:
            entries, _ = self._ch().list_entries(
                rel, bool(recursive), max_entries, self._file_deadline(max_entries * 256)
            )
        except ChannelError as exc:
            raise self._lost(exc) from None
        # File names come from the sandbox: sandbox code can name a file after a secret.
        return [self._guard.redact_info(_file_info(e)) for e in entries]

    def stat(self, path: str) -> FileInfo:
        """Describe one workspace entry, without following a final link.

        A symlink is reported as ``type="symlink"`` (its own size and mode), not
        as what it points to; a link on the way to ``path`` is refused.  The
        returned ``path`` is workspace-relative (``"."`` for the workspace
        itself) with secrets redacted, as in :meth:`list_files`.

        Example::

            info = sandbox.stat("out/report.csv")
            if info.type == "file" and info.size > 0: ...

        Raises:
            FileAccessError: ``code="not_found"`` if nothing is there;
                ``outside_workspace``, ``symlink`` or ``not_directory`` for
                a path that leaves the workspace or crosses a link or a file.
            PolicyDeniedError: an approval hook refused (kind ``file.list``).

        .. versionadded:: 0.4.0
        """
        rel = self._guard.workspace_path(path)
        self._guard.approve("file.list", {"path": self._guard.absolute(rel)})
        entry = _file_info(self._request({"t": "stat", "path": rel}).get("entry"))
        # The name is the one asked for (the agent's echo is not needed), redacted:
        # sandbox code can name a file after a secret.
        info = FileInfo(rel or ".", entry.type, entry.size, entry.mode, entry.mtime)
        return self._guard.redact_info(info)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists in the workspace (without following a final link)."""
        try:
            self.stat(path)
        except FileAccessError as exc:
            if exc.code == "not_found":
                return False
            raise
        return True

    def rename(self, source: str, destination: str) -> None:
        """Move the file, link or directory ``source`` to ``destination`` in the workspace.

        Parent directories of ``destination`` are created (as by
        :meth:`write_file`); otherwise this is POSIX ``rename``: an existing
        destination file is replaced atomically, an empty destination
        directory is replaced by a directory, a non-empty one is refused.  A
        link is moved (or replaced) as the link itself; a link on the way to
        either path is refused, as everywhere in the file API.

        Two approvals are asked, since rules match on one path: ``file.remove``
        for ``source`` (details ``path``, ``to``) and ``file.write`` for
        ``destination`` (details ``path``, ``from``).  Emits ``file.moved``
        (``path``, ``to``: workspace-relative).

        Example::

            sandbox.write_file("draft.txt", "v2")
            sandbox.rename("draft.txt", "final/report.txt")

        Raises:
            FileAccessError: with ``code``: ``not_found`` (no ``source``),
                ``not_empty`` (``destination`` is a non-empty directory),
                ``is_directory`` / ``not_directory`` (a file onto a directory
                or the reverse), ``invalid_path`` (the workspace root as
                either path, or a directory moved into itself),
                ``outside_workspace``, ``symlink`` (a link on the way).
            PolicyDeniedError: an approval hook refused.
            UnsupportedCapabilityError: the sandbox's agent predates rename
                (e.g. restored from an older checkpoint); recreate the sandbox.

        .. versionadded:: 0.4.0
        """
        src = self._guard.workspace_path(source)
        dst = self._guard.workspace_path(destination)
        for rel, given in ((src, source), (dst, destination)):
            if not rel:
                raise FileAccessError(
                    f"{given!r} is the workspace root, which cannot be moved or replaced",
                    path=given,
                    code="invalid_path",
                )
        abs_src, abs_dst = self._guard.absolute(src), self._guard.absolute(dst)
        # Both ends asked about: a rule on the destination alone (no writes below
        # .git/, say) must not be sidestepped by writing elsewhere and moving.
        self._guard.approve("file.remove", {"path": abs_src, "to": abs_dst})
        self._guard.approve("file.write", {"path": abs_dst, "from": abs_src})
        try:
            channel = self._ch()
            # Fail closed on what the agent announced: an older agent (a restored
            # checkpoint) would answer "unknown", which reads like a broken channel.
            if channel.hello is not None and "move" not in channel.hello.capabilities:
                raise UnsupportedCapabilityError(
                    f"this sandbox's agent ({channel.hello.agent}) is too old for rename; "
                    "recreate the sandbox"
                )
            channel.request({"t": "move", "path": src, "to": dst}, self._file_deadline())
        except ChannelError as exc:
            raise self._lost(exc) from None
        self._guard.emit(EventType.FILE_MOVED, {"path": src, "to": dst})

    def mkdir(self, path: str, *, parents: bool = True) -> None:
        """Create a directory in the workspace."""
        rel = self._guard.workspace_path(path)
        self._guard.approve("file.write", {"path": self._guard.absolute(rel), "directory": True})
        self._request({"t": "mkdir", "path": rel, "parents": parents})

    def remove_file(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file (or a directory tree with ``recursive=True``)."""
        rel = self._guard.workspace_path(path)
        self._guard.approve("file.remove", {"path": self._guard.absolute(rel), "recursive": recursive})
        try:
            # A large tree takes a while: the agent removes it between turns of its
            # loop and sends heartbeats meanwhile, so the wait is bounded by silence.
            self._ch().request(
                {"t": "remove", "path": rel, "recursive": bool(recursive)},
                time.monotonic() + _REMOVE_WAIT,
                stall=STALL_AFTER,
            )
        except ChannelError as exc:
            raise self._lost(exc) from None
        self._guard.emit(EventType.FILE_REMOVED, {"path": rel})

    def upload_file(self, source: str | os.PathLike[str], destination: str | None = None) -> None:
        """Copy the host file ``source`` into the workspace, to ``destination`` (default: its name)."""
        local = Path(source)
        try:
            data = local.read_bytes()
        except OSError as exc:
            raise FileAccessError(
                f"cannot read {str(local)!r} on the host: {exc.strerror}", path=str(local)
            ) from None
        self.write_file(destination if destination is not None else local.name, data)

    def download_file(self, source: str, destination: str | os.PathLike[str]) -> None:
        """Copy the workspace file ``source`` to ``destination`` on the host.

        Parent directories are created; the file is written atomically.
        """
        data = self.read_file(source, encoding=None)
        target = Path(destination)
        target.parent.mkdir(parents=True, exist_ok=True)  # as 0.3.0 did
        tmp = target.with_name(f".{target.name}.agentnest-{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)

    def _request(self, header: dict[str, Any]) -> dict[str, Any]:
        try:
            return dict(self._ch().request(header, self._file_deadline()))
        except ChannelError as exc:
            raise self._lost(exc) from None

    # -- state: fork, snapshot, restore, artifacts (logic in state.py) ----------

    def fork(self, *, timeout: float | None = None, live: bool | None = None) -> Sandbox:
        """Branch this sandbox into an independent copy of its workspace.

        The child has the same image, limits, environment, policy, observers,
        approval hook and backend, but its own id, labels and deadline
        (``timeout`` seconds from now; the parent's lifetime by default).
        The workspace is streamed from the parent's tar writer straight into
        the child's extractor through the host (no temporary file); sparse
        files stay sparse.  Afterwards neither sees the other's writes.

        With ``live`` (the default where the backend has
        ``Capability.LIVE_FORK``: gVisor on an experimental local engine, for
        a network-denied sandbox with a disk workspace), the child also gets
        the parent's running processes, memory and ``/tmp``: its Python
        sessions hold the parent's variables (``python_session(name=...)``
        finds them) and its commands keep running, in both.  The parent is
        stopped (checkpointed) for the copy and restored.  ``live=False``
        copies the files only: running processes and Python sessions are not
        copied, a session in the child starts empty, and only the workspace
        is copied, not ``/tmp`` or changes to a writable root filesystem.
        docs/state.md explains why.

        Raises:
            SandboxDestroyedError: this sandbox was destroyed.
            UnsupportedCapabilityError: the backend cannot fork, or ``live=True``
                where it cannot (runc; a network that is not denied): the message names ``live=False``.
            SandboxPausedError: the sandbox is paused.
            PolicyDeniedError: the approval hook refused ``fork``.
            SnapshotError: the workspace holds what cannot be copied safely
                (e.g. a symlink pointing outside it); ``.member`` names it.

        .. versionadded:: 0.4.0
        """
        return _state.fork(self, timeout=timeout, live=live)

    def snapshot(self, destination: str | os.PathLike[str], *, compress: bool = False) -> SnapshotMetadata:
        """Save the workspace to ``destination`` on the host as a tar with metadata.

        The file is a POSIX tar (gzip with ``compress=True``) of the
        workspace below ``workspace/``, ending with an
        ``agentnest-snapshot.json`` member (image, time, counts and the
        payload's SHA-256); sparse files stay sparse.  It is written to a
        temporary file next to ``destination`` and renamed into place.  The returned
        :class:`SnapshotMetadata` has the file's ``size`` and ``sha256`` (as
        in 0.3.0) and what the metadata member records.  docs/state.md has
        the format.

        Raises:
            SnapshotError: the workspace holds what a snapshot refuses.
            UnsupportedCapabilityError: the backend cannot snapshot.
            PolicyDeniedError: the approval hook refused ``snapshot``.

        .. versionadded:: 0.4.0
        """
        return _state.snapshot(self, destination, compress=compress)

    def restore(self, source: str | os.PathLike[str]) -> SnapshotMetadata:
        """Replace the workspace's contents with those of the snapshot file ``source``.

        Every member is checked on the host and again in the sandbox (no
        absolute paths, no ``..``, no links out, no devices, bounded size
        and entry count), and so are the checksum and the end of the file.
        The new files are staged inside the workspace and swapped in only
        when all of it checked out: after an error the old files are intact.
        The workspace must have room for both while it stages.

        Raises:
            SnapshotError: the file breaks a rule, is corrupt or truncated;
                ``.member`` and ``.rule`` say where and which.

        .. versionadded:: 0.4.0
        """
        return _state.restore(self, source)

    @classmethod
    def from_snapshot(
        cls, path: str | os.PathLike[str], *, image: str | None = None, **sandbox_kwargs: Any
    ) -> Sandbox:
        """Create a sandbox from a snapshot file and restore it.

        The image is the one recorded in the snapshot unless ``image`` is
        given; ``sandbox_kwargs`` go to :class:`Sandbox` (the security
        policy still decides whether that image is allowed).  The file is
        validated completely before anything is created.

        .. versionadded:: 0.4.0
        """
        return _state.from_snapshot(cls, path, image, sandbox_kwargs)

    @classmethod
    def from_checkpoint(
        cls,
        sandbox_id: str,
        *,
        backend: str | RuntimeBackend = "gvisor",
        security_policy: SecurityPolicy | None = None,
        observers: Sequence[Observer] = (),
        approval_hook: ApprovalHook | None = None,
    ) -> Sandbox:
        """Resume a sandbox that a process, this one or another, paused to disk.

        On gVisor with a local engine in experimental mode, :meth:`pause`
        checkpoints the sandbox to disk and releases its memory; the sandbox
        then outlives the process that paused it.  Given its :attr:`id`, this
        restores it here with its processes, Python sessions
        (``python_session(name=...)`` finds them), ``/tmp`` and workspace,
        its configuration (image, limits, environment, secrets) and its
        deadline, which kept counting.  The policy, observers and approval
        hook are this caller's; the policy must allow what the sandbox
        already is.  This process owns it from now on.

        Raises:
            SandboxDestroyedError: no sandbox with that id is paused to disk here,
                or its deadline passed while it was paused.
            SnapshotError: its checkpoint or record is missing, corrupt, or from
                another gVisor or AgentNest version (it stays paused).
            UnsupportedCapabilityError: the backend does not pause to disk.
            BackendError: the sandbox runs: it was never paused to disk, or
                another process resumed it.
            ConfigurationError: ``sandbox_id`` is not a sandbox id, or the
                policy would change the sandbox (its network, profiles, rootless).
            PolicyDeniedError: the policy refuses the sandbox as it is.

        .. versionadded:: 0.4.0
        """
        return _state.from_checkpoint(cls, sandbox_id, backend, security_policy, observers, approval_hook)

    def artifacts(self, pattern: str = "**/*") -> tuple[Artifact, ...]:
        """An :class:`Artifact` (path, size, sha256) per matching regular file, sorted by path.

        ``pattern`` is a glob relative to the workspace (or absolute below
        it): ``*`` and ``?`` stay within a path component, ``**`` spans any
        number of them; dotfiles match too.  Symlinks are never followed or
        listed.  Files are hashed inside the sandbox.  A tuple, as in 0.3.0.

        Raises:
            ConfigurationError: the pattern is empty or leaves the workspace.

        .. versionchanged:: 0.4.0
           Hashed by a streaming program in the sandbox; ``**`` also matches files.
        """
        return _state.artifacts(self, pattern)

    def download(self, path: str, dest: str | os.PathLike[str]) -> Path:
        """Copy a workspace file, or a directory tree, into the host directory ``dest``.

        The copy keeps the last component of ``path`` (``output`` lands in
        ``dest/output``; the workspace root's contents land in ``dest``).
        Nothing is written outside ``dest`` or through a link in it; links
        in the sandbox are refused, not copied.  Returns the copy's path.

        Raises:
            FileAccessError: the path is missing, holds a link, or the
                destination has a link or a file in the way.

        .. versionadded:: 0.4.0
        """
        return _state.download(self, path, dest)

    # -- lifecycle ---------------------------------------------------------------

    def extend(self, seconds: float) -> float:
        """Move the sandbox's deadline ``seconds`` later; return the new deadline (epoch seconds).

        The new deadline holds like the first one: the sandbox stops itself
        then even if this process has died, and ``agentnest prune`` honours
        it.  The policy's ``max_timeout`` bounds the whole lifetime,
        extensions included.

        Raises:
            ConfigurationError: ``seconds`` is not a positive number.
            PolicyDeniedError: the new lifetime would pass ``max_timeout``.
            UnsupportedCapabilityError: the backend cannot move deadlines.
            SandboxDestroyedError: the sandbox is gone.

        .. versionadded:: 0.4.0
        """
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or not 0 < seconds <= 7 * 24 * 3600
        ):
            raise ConfigurationError(
                f"seconds={seconds!r} must be a positive number of seconds (at most 7 days)"
            )
        with self._lock:
            self._check_alive()
            lifetime = self._lifetime + seconds
            ceiling = self._guard.policy.max_timeout
            if ceiling is not None and lifetime > ceiling:
                self._guard.deny(
                    "sandbox.extend",
                    f"a lifetime of {lifetime:g}s would pass the policy's max_timeout {ceiling:g}s",
                )
            deadline = self._handle.deadline + seconds
            self._backend.extend(self._handle, deadline)
            self._handle.deadline = deadline
            self._mono_deadline += seconds
            self._lifetime = lifetime
        self._guard.emit(EventType.SANDBOX_EXTENDED, {"seconds": seconds, "deadline": deadline})
        return deadline

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` stopped the sandbox (until :meth:`resume`).

        .. versionadded:: 0.4.0
        """
        return self._paused

    def pause(self) -> None:
        """Stop every process in the sandbox where it is, until :meth:`resume`.

        On runc and gVisor this is the engine's freezer (``docker pause``):
        processes, Python sessions and memory are kept, nothing runs, and the
        deadline keeps counting.  While paused, every new call (``exec``,
        files, sessions, fork, snapshot) raises :class:`SandboxPausedError`;
        calls already in flight wait for the resume (their own timeouts still
        count, in the sandbox too: a command's timeout may expire during a
        long pause).  ``destroy()`` works while paused.  Idempotent.

        Raises:
            SandboxDestroyedError: the sandbox was destroyed or has stopped.
            UnsupportedCapabilityError: the backend cannot pause (``Capability.PAUSE``).

        .. versionadded:: 0.4.0
        """
        with self._lock:
            self._check_alive()
            if self._paused:
                return
            if Capability.PAUSE not in self._backend.capabilities():
                raise UnsupportedCapabilityError(
                    f"the {self._backend.name} backend cannot pause a sandbox; use the docker or gvisor "
                    "backend, or snapshot() the workspace and destroy the sandbox"
                )
            started = time.monotonic()
            channel = self._channel
            if channel is not None:
                channel.hold(True)
                if channel.hello is not None:
                    # For a checkpoint's resume: the restored agent is woken by its
                    # pid, and its new host side (maybe in another process:
                    # from_checkpoint) numbers its requests after these.
                    self._handle.info["agent_pid"] = channel.hello.pid
                    self._handle.info["reconnect_ids"] = channel.next_id()
            try:
                how = self._backend.pause(self._handle)
            except BaseException:
                if channel is not None:
                    channel.hold(False)
                raise
            self._paused = True
        seconds = round(time.monotonic() - started, 4)
        self._guard.emit(EventType.SANDBOX_PAUSED, {"seconds": seconds, "how": how})

    def resume(self) -> None:
        """Continue a sandbox stopped by :meth:`pause`.  Idempotent (a running sandbox stays so).

        Raises:
            SandboxDestroyedError: the sandbox was destroyed or has stopped.

        .. versionadded:: 0.4.0
        """
        with self._lock:
            if self._destroyed:
                raise SandboxDestroyedError(f"sandbox {self.id} was destroyed")
            if not self._paused:
                return
            started = time.monotonic()
            reconnect = self._backend.resume(self._handle)
            self._paused = False
            channel = self._channel
            if channel is not None:
                channel.hold(False)
            if reconnect:
                # Restored from a checkpoint: the same agent (and its sessions)
                # on a new stream.  If it does not answer, the next call starts
                # a new agent (sessions lost), as after any lost agent.
                old = channel
                self._channel = None
                if old is not None:
                    old.close("the sandbox was checkpointed")
                stream = self._backend.open_channel(self._handle)
                try:
                    self._channel = Channel.connect(stream, None, timeout=30.0, after=old)
                except ChannelError as exc:
                    stream.close()
                    if not self._backend.is_running(self._handle):
                        # runsc accepted the start, then failed to restore.
                        reason = self._backend.exit_reason(self._handle) or "it stopped"
                        raise SnapshotError(
                            f"sandbox {self.id} could not be restored from its checkpoint ({reason}: "
                            "corrupt, truncated, or written by another gVisor version?); its processes "
                            "are lost, its workspace stays until destroy()",
                            rule="checkpoint",
                        ) from exc
        self._guard.emit(
            EventType.SANDBOX_RESUMED,
            {"seconds": round(time.monotonic() - started, 4), "reconnected": reconnect},
        )

    def logs(self, tail: int = 200) -> str:
        """The container's own log (the keeper and agent diagnostics), redacted."""
        text = self._backend.logs(self._handle, tail)
        if self._channel is not None:
            text += self._channel.diagnostics()
        return self._guard.redact(text)

    def destroy(self) -> None:
        """Remove the sandbox and everything in it.  Idempotent."""
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
            if self._channel is not None:
                self._channel.close("sandbox destroyed")
            try:
                self._backend.destroy(self._handle)
            except BaseException:
                # Not removed (the engine is down or did not answer): the
                # sandbox still exists, so a later destroy()/close() tries
                # again instead of returning as if it were gone.
                self._destroyed = False
                raise
            stop = self._stop_egress
            if stop is not None:
                stop()  # the proxy's last reports came in while it was removed
        _state.SPARES.forget(self)  # its forks' warm container, unless another sandbox wants it
        self._guard.emit(EventType.SANDBOX_DESTROYED, {})

    close = destroy

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else "paused" if self._paused else "running"
        return f"<Sandbox {self.id} image={self.config.image!r} {state}>"


@scrub_errors
class ExecutionStream:
    """Output of a running command, chunk by chunk.  Iterate it once."""

    def __init__(self, sandbox: Sandbox, handle: ExecHandle, timeout: float | None) -> None:
        self._sandbox = sandbox
        self._handle = handle
        self._timeout = timeout
        self._decoder = sandbox._guard.stream_decoder()
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self.result: ExecutionResult | None = None

    def __iter__(self) -> Iterator[ExecutionChunk]:
        sandbox = self._sandbox
        deadline = sandbox._wait_deadline(self._timeout)
        try:
            while self._handle.result is None:
                try:
                    event = self._handle.next_event(deadline)
                except ChannelError as exc:
                    raise sandbox._lost(exc) from None
                if isinstance(event, tuple):
                    fd, data = event
                    (self._out if fd == 1 else self._err).append(data)
                    chunk = self._decoder.feed(fd, data)
                    if chunk is not None:
                        yield chunk
        except GeneratorExit:
            self.close()
            raise
        except BaseException:
            self.close()
            raise
        yield from self._decoder.flush()
        self.result = sandbox._result(self._handle, b"".join(self._out), b"".join(self._err), self._timeout)
        yield ExecutionChunk("status", exit_code=self.result.exit_code)

    def close(self) -> None:
        """Kill the command's process tree if it still runs."""
        if self._handle.result is None:
            self._handle.cancel()
            self._handle.abandon()

    def send_input(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin (started with ``interactive=True`` or a ``pty``).

        Input to a command that has ended is dropped, as a pipe would.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise ConfigurationError("input must be bytes")
        if self._handle.result is None:
            try:
                self._handle.write_stdin(bytes(data))
            except ChannelError as exc:
                raise self._sandbox._lost(exc) from None

    def close_input(self) -> None:
        """Close the command's stdin: it reads end of file."""
        if self._handle.result is None:
            try:
                self._handle.write_stdin(b"", True)
            except ChannelError as exc:
                raise self._sandbox._lost(exc) from None

    def kill(self) -> None:
        """Kill the command's process tree; the iteration still ends, with its status."""
        self._handle.cancel()

    def resize(self, rows: int, cols: int) -> None:
        """Set the size of the command's terminal (started with ``pty=``)."""
        try:
            self._handle.resize(rows, cols)
        except ChannelError as exc:
            raise self._sandbox._lost(exc) from None

    def __enter__(self) -> ExecutionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be str, not {type(value).__name__}")
    return value


def _file_info(entry: Any) -> FileInfo:
    try:
        path, kind, size, mode, mtime = entry
        if not (
            isinstance(path, str)
            and kind in ("file", "dir", "symlink", "other")
            and isinstance(size, int)
            and isinstance(mode, int)
            and isinstance(mtime, (int, float))
        ):
            raise ValueError
    except (TypeError, ValueError):
        raise ChannelError("the agent sent an invalid file entry") from None
    return FileInfo(path[:4096], kind, size, mode, float(mtime))
