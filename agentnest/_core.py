"""``SandboxCore``: one sandbox's link and operations, under both faces.

This module decides how one sandbox is held: its backend, handle, guard and
agent channel; how a lost agent is reconnected (or replaced); how commands
run through the guard (approval, audit, redaction); and its lifetime
(extend, pause, resume, destroy).  Its file operations are
:mod:`agentnest._files`, which it calls with itself.  ``Sandbox`` and ``AsyncSandbox``
are faces over a core: they shape arguments (:mod:`agentnest.ops`) and call
it.  Code below the faces (``session``, ``state/``, ``browser/``) takes a
core, never a face; :func:`core_of` finds the core of a face.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import _files
from .approvals import ApprovalHook, command_line
from .channel.client import STALL_AFTER, Channel, ExecHandle
from .config import ExecutionResult, FileInfo, SandboxConfig
from .errors import (
    AuditError,
    BackendError,
    ChannelError,
    ConfigurationError,
    ExecutionTimeoutError,
    SandboxDestroyedError,
    SandboxPausedError,
    SnapshotError,
    UnsupportedCapabilityError,
    VerificationError,
)
from .events import EventType, Observer
from .guard import Guard
from .policy import NetworkPolicy, SecurityPolicy
from .runtime import launch
from .runtime.base import Capability, RuntimeBackend, SandboxHandle
from .secrets import SECRET_DIR, Secret

#: Extra time the host waits past a command's own timeout for the agent to
#: report the kill, before it declares the agent hung.
BACKSTOP_GRACE = 10.0

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

#: How a new core gets its handle (and, for a warm spare, its already
#: connected channel) when not from ``backend.create``: a host-side fork's
#: child, or a sandbox resumed from its checkpoint (state.forks, state.paused).
Provision = Callable[[SandboxConfig], "SandboxHandle | tuple[SandboxHandle, Channel]"]

#: The core of each face (Sandbox, AsyncSandbox): see :func:`core_of`.
_FACES: weakref.WeakKeyDictionary[object, SandboxCore] = weakref.WeakKeyDictionary()


def bind(face: object, core: SandboxCore) -> None:
    """Record that ``face`` is a face of ``core`` (the faces call this as they are made)."""
    _FACES[face] = core


def core_of(sandbox: object) -> SandboxCore:
    """The core of a face (``Sandbox``, ``AsyncSandbox``), or ``sandbox`` itself if it is a core.

    What lower layers use to take "a sandbox" from their callers without
    reaching into a face.
    """
    if isinstance(sandbox, SandboxCore):
        return sandbox
    try:
        return _FACES[sandbox]
    except (KeyError, TypeError):
        raise ConfigurationError(f"expected a Sandbox, not {type(sandbox).__name__}") from None


@dataclass(frozen=True)
class Command:
    """One command to start, as a face shaped it (see :mod:`agentnest.ops`).

    ``keep_stdin_open``, ``pty`` and ``max_output`` (default: the policy's)
    are for streams and ``agentnest shell``.
    """

    argv: Sequence[str]
    timeout: float | None = None
    env: Mapping[str, str | Secret] | None = None
    cwd: str | None = None
    input: str | bytes | None = None
    display_command: str | None = None
    keep_stdin_open: bool = False
    pty: tuple[int, int] | None = None
    max_output: int | None = None


def config_like(
    config: SandboxConfig, policy: SecurityPolicy, lifetime: float, network: NetworkPolicy
) -> SandboxConfig:
    """``config`` as ``Sandbox(...)`` builds it again under ``policy`` (a fork's child, a resume).

    The policy's profiles and proxy image, ``network`` and ``lifetime``; no
    preset (a sandbox made again from its configuration never had one).
    """
    return replace(
        config,
        lifetime=lifetime,
        network=network,
        seccomp_profile=policy.seccomp_profile,
        apparmor_profile=policy.apparmor_profile,
        rootless=policy.rootless,
        proxy_image=policy.egress_proxy_image,
        preset=None,
    )


class SandboxCore:
    """One sandbox: backend + handle + guard + agent channel, and what runs through them.

    Made by a face (``Sandbox(...)``), a fork (``state.forks``) or a resume
    (``state.paused``).  ``provision`` replaces ``backend.create`` (see
    :data:`Provision`).  Creation failing at any step destroys what was made.
    """

    def __init__(
        self,
        backend: RuntimeBackend,
        config: SandboxConfig,
        policy: SecurityPolicy,
        observers: Sequence[Observer] = (),
        approval_hook: ApprovalHook | None = None,
        *,
        verify: bool = False,
        provision: Provision | None = None,
    ) -> None:
        self.backend = backend
        self.guard = Guard(config, policy, observers, approval_hook)
        self.guard.check_create(backend.capabilities(), backend.oci_runtime)
        self.lock = threading.Lock()
        #: The agent channel; None before the first connect or while reconnecting.
        self.channel: Channel | None = None
        self.destroyed = False
        self.paused = False
        # Egress reports (allowlist sandboxes): see _watch_egress.
        self._egress_failure: BaseException | None = None
        self._stop_egress: Callable[[], None] | None = None
        #: Called with this core after destroy() removed the sandbox (set by state/).
        self.on_destroy: list[Callable[[SandboxCore], None]] = []
        provided = (provision or backend.create)(config)
        # A warm spare's agent is connected already (state.spares).
        provided, ready = provided if isinstance(provided, tuple) else (provided, None)
        self.handle: SandboxHandle = provided
        self.guard.sandbox_id = self.handle.id
        self._mono_deadline = time.monotonic() + (self.handle.deadline - time.time())
        self._lifetime = config.lifetime
        # A sandbox another process paused to disk, resumed here (from_checkpoint).
        attached = bool(self.handle.info.pop("attached", False))
        try:
            if ready is None:
                self.connect(attached=attached)
            else:
                self.channel = ready
            if config.secret_files:
                self.write_secret_files(config.secret_files)
            if verify:
                self.verify()
            # Inside the try: an observer that fails must not leave a
            # container behind that nobody holds a handle to.
            self.guard.emit(
                EventType.SANDBOX_RESUMED if attached else EventType.SANDBOX_CREATED,
                {
                    "image": config.image,
                    # What the engine runs, when an alias mapped the name (AGENTNEST_IMAGE_ALIASES).
                    "resolved_image": self.handle.info.get("image", config.image),
                    "backend": self.handle.backend,
                    "network": config.network.mode.value,
                    **(
                        {
                            "from_checkpoint": True,
                            # As resume() says it: False when a new agent replaced the restored one.
                            "reconnected": not self.handle.info.pop("agent_replaced", False),
                        }
                        if attached
                        else {}
                    ),
                },
            )
            self._watch_egress()
        except BaseException:
            channel: Channel | None = self.channel  # set by connect() if it got that far
            if channel is not None:
                channel.close("sandbox creation failed")
            backend.destroy(self.handle)
            self.destroyed = True
            raise

    @property
    def id(self) -> str:
        return self.handle.id

    @property
    def config(self) -> SandboxConfig:
        return self.guard.config

    @property
    def deadline(self) -> float:
        return self.handle.deadline

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else "paused" if self.paused else "running"
        return f"<Sandbox {self.id} image={self.config.image!r} {state}>"

    # -- the agent link ---------------------------------------------------------

    def connect(self, *, attached: bool = False, answer_within: float = 60.0) -> Channel:
        """Open the agent channel (``answer_within``: seconds a restored or lingering agent has to answer)."""
        stream = self.backend.open_channel(self.handle)
        # A live fork's child, or a sandbox resumed from its checkpoint: its
        # agent is a restored one, which takes a reconnect frame, not the
        # bundle (see state.forks, from_checkpoint).
        ids = self.handle.info.pop("reconnect_ids", None)
        try:
            if isinstance(ids, int):
                try:
                    self.channel = Channel.connect(stream, None, timeout=answer_within, after=ids)
                    return self.channel
                except ChannelError:
                    if not (attached and self.backend.is_running(self.handle)):
                        raise
                # Restored, but its agent did not answer: a new one (its
                # Python sessions are lost, the files and processes are not;
                # the sandbox.resumed event says so: reconnected False).
                self.handle.info["agent_replaced"] = True
                stream.close()
                stream = self.backend.open_channel(self.handle)
            self.channel = Channel.connect(stream, launch.bundle(), timeout=60.0)
        except ChannelError as exc:
            raise ChannelError(f"{exc}. Does the image {self.config.image!r} have python3?") from None
        return self.channel

    def link(self) -> Channel:
        """The live agent channel, reconnecting (or starting a new agent) if it was lost.

        Raises SandboxDestroyedError or SandboxPausedError first, and an
        egress report that could not be recorded (AuditError).
        """
        if self.destroyed:
            raise SandboxDestroyedError(f"sandbox {self.id} was destroyed")
        if self.paused:
            # Refused, not queued: a call that waited on a paused sandbox would
            # look like a hang to its caller.
            raise SandboxPausedError(f"sandbox {self.id} is paused; call resume() first")
        failure = self._egress_failure
        if failure is not None:
            self._egress_failure = None
            raise AuditError(
                f"an egress event of sandbox {self.id} could not be recorded: {failure}"
            ) from failure
        ch = self.channel
        if ch is not None and ch.alive:
            return ch
        with self.lock:
            ch = self.channel
            if ch is not None and ch.alive:
                return ch
            self.check_alive()
            old_reason = ch.broken_reason if ch is not None else None
            if ch is not None and self.handle.info.get("reattach"):
                # The backend's agent outlives its stream (a pod's listening
                # agent): reach the same one again, its commands and sessions
                # with it; a new agent only if it does not answer.
                self.handle.info["reconnect_ids"] = ch.next_id()
                # A live agent answers at once; one that is stopped or wedged
                # (the reason the stream was dropped, perhaps) gets a stall's
                # worth of time, then a new agent takes over.
                ch = self.connect(attached=True, answer_within=STALL_AFTER)
                reattached = not self.handle.info.pop("agent_replaced", False)
                self.guard.emit(
                    EventType.AGENT_RESTARTED,
                    {"reason": old_reason or "stream lost", "reattached": reattached},
                )
                return ch
            ch = self.connect()
            self.guard.emit(EventType.AGENT_RESTARTED, {"reason": old_reason or "not started"})
            return ch

    def check_alive(self) -> None:
        """Raise SandboxDestroyedError if the sandbox was destroyed, passed its deadline or stopped."""
        if self.destroyed:
            raise SandboxDestroyedError(f"sandbox {self.id} was destroyed")
        if time.time() >= self.handle.deadline:
            raise SandboxDestroyedError(f"sandbox {self.id} reached its deadline and stopped")
        if not self.backend.is_running(self.handle):
            reason = self.backend.exit_reason(self.handle) or "it was stopped or killed"
            raise SandboxDestroyedError(f"sandbox {self.id} is no longer running: {reason}")

    def lost(self, exc: ChannelError) -> Exception:
        """Explain a broken channel: the sandbox ended, or only its agent did."""
        channel = self.channel
        if channel is not None and channel.alive:
            return exc  # the agent refused this request and lives on: nothing was lost
        try:
            self.check_alive()
        except SandboxDestroyedError as gone:
            return gone
        if self.handle.info.get("reattach"):
            return ChannelError(
                f"{exc}; the stream to the in-sandbox agent was lost during this call (or the agent "
                "died): the next call reconnects to it, its commands and sessions with it if it lives"
            )
        return ChannelError(
            f"{exc}; the in-sandbox agent was lost (killed or crashed) during this call, "
            "the sandbox and its files are intact and the next call starts a new agent"
        )

    def wait_deadline(self, timeout: float | None) -> float:
        """The monotonic time after which a wait for a command of ``timeout`` declares the agent hung."""
        sandbox_end = self._mono_deadline + BACKSTOP_GRACE
        if timeout is None:
            return sandbox_end
        return min(time.monotonic() + timeout + BACKSTOP_GRACE, sandbox_end)

    # -- egress ------------------------------------------------------------------

    def _watch_egress(self) -> None:
        """Turn the egress proxy's reports into audit events (allowlist sandboxes)."""
        log = self.handle.info.get("egress")
        if log is not None and hasattr(log, "subscribe"):
            self._stop_egress = log.subscribe(self._on_egress)

    def _on_egress(self, event: dict[str, Any]) -> None:
        kind = EventType.EGRESS_ALLOWED if event.get("type") == "egress.allowed" else EventType.EGRESS_DENIED
        data = {k: event.get(k) for k in _EGRESS_FIELDS}
        try:
            # The sandbox's own doing, reported by its proxy: actor "sandbox".
            self.guard.emit(kind, data, actor="sandbox")
        except Exception as exc:
            # Called from the proxy's reader thread, where nobody would see it:
            # the next call on this sandbox raises it instead (fail loud).
            self._egress_failure = exc

    def add_secret(self, value: str | Secret) -> None:
        raw = value.get_secret_value() if isinstance(value, Secret) else value
        if not isinstance(raw, str) or not raw:
            raise ConfigurationError("add_secret needs a non-empty str or a Secret")
        self.guard.add_secret(raw)

    def network_log(self) -> list[dict[str, Any]]:
        log = self.handle.info.get("egress")
        if log is None or not hasattr(log, "log"):
            return []
        return [self.guard.redact_data(entry) for entry in log.log()]

    # -- our own programs ------------------------------------------------------

    def internal_program(self, argv: list[str], stdin: bytes | None = None, timeout: float = 30.0) -> bytes:
        """Run our own program (``argv``) in the sandbox; return its stdout.

        Through the channel, not exec(): no approval and no event (it is not
        the caller's operation), and data goes on stdin, never in an argv
        that /proc shows.  Raises BackendError if it fails.
        """
        handle = self.link().start_exec(
            argv,
            env={},
            cwd=None,
            timeout=timeout,
            max_output=1 << 20,
            stdin=stdin,
        )
        out: list[bytes] = []
        err: list[bytes] = []
        for event in handle.events(time.monotonic() + timeout + BACKSTOP_GRACE):
            if isinstance(event, tuple):
                (out if event[0] == 1 else err).append(event[1])
        if handle.result is None or handle.result.code != 0 or handle.truncated:
            detail = self.guard.redact(b"".join(err).decode("utf-8", "replace").strip()[-300:])
            raise BackendError(
                f"AgentNest's own program failed in sandbox {self.id}: {detail or 'no output'}"
            )
        return b"".join(out)

    def write_secret_files(self, files: dict[str, str]) -> None:
        """Write ``Secret(..., as_file=True)`` values into SECRET_DIR (agent/secret_files.py)."""
        argv = launch.script_command("python3", "secret_files", SECRET_DIR)
        try:
            self.internal_program(argv, json.dumps(files).encode("utf-8"))
        except BackendError as exc:
            raise BackendError(f"could not write the secret files into {SECRET_DIR}: {exc}") from None

    def verify(self) -> None:
        """Check from inside that the policy holds (``Sandbox(verify=True)``); VerificationError if not."""
        from . import verify as _verify

        config = self.config
        try:
            seen = json.loads(self.internal_program(["python3", "-I", "-S", "-c", _verify.PROBE]))
        except ValueError:
            raise VerificationError(f"sandbox {self.id}: the verification probe sent no JSON") from None
        if not isinstance(seen, dict):
            raise VerificationError(f"sandbox {self.id}: the verification probe sent {type(seen).__name__}")
        findings = _verify.judge(
            seen,
            config.limits,
            gvisor=self.backend.oci_runtime == "runsc",
            network=config.network.mode.value,
            uid=int(config.user.split(":")[0]),
            read_only=config.read_only_root,
            workspace_quota=self.backend.workspace_quota(self.handle),
        )
        failed = [f for f in findings if f.status == _verify.FAIL]
        self.guard.emit(
            EventType.SANDBOX_VERIFIED,
            {"ok": not failed, "checks": {f.name: f.status for f in findings}},
        )
        if failed:
            summary = "; ".join(f"{f.name}: {f.detail} (fix: {f.hint})" for f in failed)
            raise VerificationError(
                f"sandbox {self.id} does not hold its policy, so it was destroyed: {summary}", findings
            )

    # -- commands --------------------------------------------------------------

    def start(self, command: Command) -> ExecHandle:
        """Start a command through the guard (approval, audit event)."""
        # Every argument is checked before the guard records the start.
        stdin = command.input
        if stdin is not None and not isinstance(stdin, (str, bytes)):
            raise ConfigurationError("input must be str, bytes or None")
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        display_command = command.display_command
        if display_command is not None and not isinstance(display_command, str):
            raise ConfigurationError("display_command must be a str or None")
        args, call_env, workdir, timeout = self.guard.exec_request(
            command.argv,
            timeout=command.timeout,
            env=command.env,
            cwd=command.cwd,
            display_command=display_command,
        )
        max_output = command.max_output
        try:
            handle = self.link().start_exec(
                args,
                env=call_env,
                cwd=workdir,
                timeout=timeout,
                max_output=self.guard.policy.max_output_bytes if max_output is None else max_output,
                stdin=data,
                keep_stdin_open=command.keep_stdin_open,
                pty=command.pty,
            )
        except ChannelError as exc:
            raise self.lost(exc) from None
        handle.label = display_command if display_command is not None else command_line(args)
        return handle

    def run(self, command: Command) -> ExecutionResult:
        """Start ``command`` and wait for its result (cancelled if this wait is interrupted)."""
        handle = self.start(command)
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            for event in handle.events(self.wait_deadline(command.timeout)):
                if isinstance(event, tuple):
                    (out if event[0] == 1 else err).append(event[1])
        except ChannelError as exc:
            raise self.lost(exc) from None
        except BaseException:
            handle.cancel()
            handle.abandon()
            raise
        return self.result(handle, b"".join(out), b"".join(err), command.timeout)

    def result(
        self, handle: ExecHandle, stdout: bytes, stderr: bytes, timeout: float | None
    ) -> ExecutionResult:
        """The ended command's result, through the guard (redaction, audit event)."""
        assert handle.result is not None
        result = self.guard.finish_exec(handle.result, stdout, stderr, handle.truncated, handle.label)
        if result.timed_out:
            raise ExecutionTimeoutError(
                f"command timed out after {timeout}s; it was killed with its process tree "
                "(the sandbox and its files are intact)",
                result,
            )
        return result

    # -- files (agentnest._files: approval, limits, redaction, audit) -----------

    def write_file(self, path: str, content: str | bytes, encoding: str = "utf-8", mode: int = 0o644) -> None:
        _files.write_file(self, path, content, encoding, mode)

    def read_file(self, path: str, encoding: str | None = "utf-8") -> str | bytes:
        return _files.read_file(self, path, encoding)

    def list_files(
        self, path: str = ".", recursive: bool = False, max_entries: int = 10000
    ) -> list[FileInfo]:
        return _files.list_files(self, path, recursive, max_entries)

    def stat(self, path: str) -> FileInfo:
        return _files.stat(self, path)

    def exists(self, path: str) -> bool:
        return _files.exists(self, path)

    def rename(self, source: str, destination: str) -> None:
        _files.rename(self, source, destination)

    def mkdir(self, path: str, parents: bool = True) -> None:
        _files.mkdir(self, path, parents)

    def remove_file(self, path: str, recursive: bool = False) -> None:
        _files.remove_file(self, path, recursive)

    def upload_file(self, source: str | os.PathLike[str], destination: str | None = None) -> None:
        _files.upload_file(self, source, destination)

    def download_file(self, source: str, destination: str | os.PathLike[str]) -> None:
        _files.download_file(self, source, destination)

    def request(self, header: dict[str, Any]) -> dict[str, Any]:
        """One request to the agent with the file operations' deadline."""
        return _files.request(self, header)

    # -- lifetime ----------------------------------------------------------------

    def extend(self, seconds: float) -> float:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or not 0 < seconds <= 7 * 24 * 3600
        ):
            raise ConfigurationError(
                f"seconds={seconds!r} must be a positive number of seconds (at most 7 days)"
            )
        with self.lock:
            self.check_alive()
            lifetime = self._lifetime + seconds
            ceiling = self.guard.policy.max_timeout
            if ceiling is not None and lifetime > ceiling:
                self.guard.deny(
                    "sandbox.extend",
                    f"a lifetime of {lifetime:g}s would pass the policy's max_timeout {ceiling:g}s",
                )
            deadline = self.handle.deadline + seconds
            self.backend.extend(self.handle, deadline)
            self.handle.deadline = deadline
            self._mono_deadline += seconds
            self._lifetime = lifetime
        self.guard.emit(EventType.SANDBOX_EXTENDED, {"seconds": seconds, "deadline": deadline})
        return deadline

    def pause(self) -> None:
        with self.lock:
            self.check_alive()
            if self.paused:
                return
            if Capability.PAUSE not in self.backend.capabilities():
                raise UnsupportedCapabilityError(
                    f"the {self.backend.name} backend cannot pause a sandbox; use the docker or gvisor "
                    "backend, or snapshot() the workspace and destroy the sandbox"
                )
            started = time.monotonic()
            channel = self.channel
            if channel is not None:
                channel.hold(True)
                if channel.hello is not None:
                    # For a checkpoint's resume: the restored agent is woken by its
                    # pid, and its new host side (maybe in another process:
                    # from_checkpoint) numbers its requests after these.
                    self.handle.info["agent_pid"] = channel.hello.pid
                    self.handle.info["reconnect_ids"] = channel.next_id()
            try:
                how = self.backend.pause(self.handle)
            except BaseException:
                if channel is not None:
                    channel.hold(False)
                raise
            self.paused = True
        seconds = round(time.monotonic() - started, 4)
        self.guard.emit(EventType.SANDBOX_PAUSED, {"seconds": seconds, "how": how})

    def resume(self) -> None:
        with self.lock:
            if self.destroyed:
                raise SandboxDestroyedError(f"sandbox {self.id} was destroyed")
            if not self.paused:
                return
            started = time.monotonic()
            reconnect = self.backend.resume(self.handle)
            self.paused = False
            channel = self.channel
            if channel is not None:
                channel.hold(False)
            if reconnect:
                # Restored from a checkpoint: the same agent (and its sessions)
                # on a new stream.  If it does not answer, the next call starts
                # a new agent (sessions lost), as after any lost agent.
                old = channel
                self.channel = None
                if old is not None:
                    old.close("the sandbox was checkpointed")
                stream = self.backend.open_channel(self.handle)
                try:
                    self.channel = Channel.connect(stream, None, timeout=30.0, after=old)
                except ChannelError as exc:
                    stream.close()
                    if not self.backend.is_running(self.handle):
                        # runsc accepted the start, then failed to restore.
                        reason = self.backend.exit_reason(self.handle) or "it stopped"
                        raise SnapshotError(
                            f"sandbox {self.id} could not be restored from its checkpoint ({reason}: "
                            "corrupt, truncated, or written by another gVisor version?); its processes "
                            "are lost, its workspace stays until destroy()",
                            rule="checkpoint",
                        ) from exc
        self.guard.emit(
            EventType.SANDBOX_RESUMED,
            {"seconds": round(time.monotonic() - started, 4), "reconnected": reconnect},
        )

    def logs(self, tail: int = 200) -> str:
        text = self.backend.logs(self.handle, tail)
        if self.channel is not None:
            text += self.channel.diagnostics()
        return self.guard.redact(text)

    def destroy(self) -> None:
        with self.lock:
            if self.destroyed:
                return
            self.destroyed = True
            if self.channel is not None:
                self.channel.close("sandbox destroyed")
            try:
                self.backend.destroy(self.handle)
            except BaseException:
                # Not removed (the engine is down or did not answer): the
                # sandbox still exists, so a later destroy()/close() tries
                # again instead of returning as if it were gone.
                self.destroyed = False
                raise
            stop = self._stop_egress
            if stop is not None:
                stop()  # the proxy's last reports came in while it was removed
        for hook in self.on_destroy:
            hook(self)  # e.g. state.spares: its forks' warm container, unless another sandbox wants it
        self.guard.emit(EventType.SANDBOX_DESTROYED, {})
