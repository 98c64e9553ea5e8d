"""``agentnest mcp``: sandboxes as tools of the Model Context Protocol.

Two layers.  :class:`SandboxService` is plain AgentNest: it owns the
sandboxes one server created, enforces the server's limits and policy
ceiling, and turns results into bounded JSON-ready dicts; it imports no MCP
code and is tested without it.  :func:`build_server` puts an MCP face on it
with the official SDK (``mcp.server.mcpserver.MCPServer``, the ``mcp``
extra, imported only here and only when called): one tool per operation, the
audit log as resources, every :class:`~agentnest.errors.AgentNestError` a
tool error (``isError``) with its message, which the guard has redacted.

Security model (docs/mcp.md):

- The server's :class:`~agentnest.SecurityPolicy` is the ceiling.  A client
  can ask for less memory, fewer CPUs or a shorter lifetime, never more, and
  cannot choose the backend, the network, the environment or a writable root.
  The ceiling is built into the policy each sandbox gets, so the guard itself
  refuses a request over it (with a ``policy.denied`` event).
- Only images the operator allowed: ``allowed_images`` of the policy, else the
  server's own image.  A client cannot make the host pull arbitrary images.
- Browser sandboxes (``preset="browser"``, with the ``browse`` tool) only
  when the operator allows the preset (``ServerSettings.presets``), within
  the same ceiling (see :mod:`agentnest.mcp_browse`).
- Snapshots go to a directory the server owns; clients name them with a short
  validated name, never a host path.
- At most ``max_sandboxes`` live sandboxes, each with a lifetime (it stops
  itself at its deadline even if the server is killed); all of them are
  destroyed when the server stops.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations`` here: the MCP SDK reads the tool
# functions' annotations (built inside build_server from lazily imported
# pydantic) as objects to make the input schemas.

import collections
import dataclasses
import math
import os
import re
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from .config import parse_size
from .errors import (
    AgentNestError,
    ConfigurationError,
    ExecutionTimeoutError,
    FileAccessError,
    MissingDependencyError,
    PolicyDeniedError,
    SandboxDestroyedError,
    SessionLostError,
)
from .events import Observer, SandboxEvent
from .policy import SecurityPolicy
from .runtime.base import RuntimeBackend

#: Lifetime of a sandbox when the client does not ask for one (seconds).
DEFAULT_LIFETIME = 600.0
#: The longest lifetime a client may ask for, unless the policy's max_timeout is lower.
MAX_LIFETIME = 3600.0
#: Live sandboxes per server, unless --max-sandboxes says otherwise.
DEFAULT_MAX_SANDBOXES = 8
#: Per-command timeout when the client gives none, and the most it may ask for.
DEFAULT_EXEC_TIMEOUT = 60.0
MAX_EXEC_TIMEOUT = 600.0
#: One file read or written through MCP (the policy's max_file_bytes, if lower, wins).
MAX_FILE_BYTES = 1024 * 1024
#: Characters of stdout (and of stderr, result, traceback) sent back per call: the
#: first and the last half are kept, the middle is replaced by a note.
MAX_TEXT_CHARS = 64 * 1024
#: Entries list_files returns at most.
MAX_LIST_ENTRIES = 1000
#: Audit events kept in memory, and how many a resource read returns.
AUDIT_KEEP = 2000
AUDIT_RETURN = 200
#: Snapshot files a server keeps (a snapshot may be up to the workspace size on the host disk).
MAX_SNAPSHOTS = 32

# Ids and snapshot names are checked before they are used anywhere: no
# separators, no dot-files, nothing that could become a host path component
# other than the file name the server chose to build from it.
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """How an MCP server makes sandboxes.  Everything here is the operator's choice.

    Args:
        backend: backend name (``docker``, ``gvisor``...) or instance; clients cannot change it.
        policy: the ceiling for every sandbox (see the module docstring).
        sandbox_kwargs: further :class:`~agentnest.Sandbox` arguments for every
            sandbox (image, memory, cpus, pids, sizes, environment,
            read_only_root), e.g. from a profile.
        lifetime: default lifetime of a sandbox in seconds.
        max_lifetime: the longest lifetime a client may ask for.
        max_sandboxes: live sandboxes at once.
        snapshot_dir: where snapshots go; None makes a private directory for
            this server under ``$XDG_STATE_HOME/agentnest/mcp-snapshots`` that
            is removed when the server stops.
        observers: more event sinks (a JSONL log, tests).
        presets: presets a client may ask create_sandbox for (``("browser",)``:
            sandboxes with Chromium, and the ``browse`` tool); none by default.

    .. versionchanged:: 0.4.0
       ``presets``.
    """

    backend: str | RuntimeBackend = "docker"
    policy: SecurityPolicy = dataclasses.field(default_factory=SecurityPolicy)
    sandbox_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    lifetime: float = DEFAULT_LIFETIME
    max_lifetime: float = MAX_LIFETIME
    max_sandboxes: int = DEFAULT_MAX_SANDBOXES
    snapshot_dir: Path | None = None
    observers: Sequence[Observer] = ()
    presets: Sequence[str] = ()

    def __post_init__(self) -> None:
        from .mcp_browse import check_presets

        object.__setattr__(self, "presets", check_presets(self.presets))
        count = self.max_sandboxes
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise ConfigurationError(f"max_sandboxes={count!r} must be an integer from 1 to 1000")
        for name in ("lifetime", "max_lifetime"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"{name}={value!r} must be a positive number of seconds")
        if self.lifetime > self.max_lifetime:
            raise ConfigurationError(
                f"the default lifetime {self.lifetime:g}s is longer than max_lifetime {self.max_lifetime:g}s"
            )
        unknown = set(self.sandbox_kwargs) - _SANDBOX_KWARGS
        if unknown:
            raise ConfigurationError(f"sandbox_kwargs cannot set {sorted(unknown)} for an MCP server")


#: What the operator may preset for every sandbox (clients set none of these directly).
_SANDBOX_KWARGS = frozenset(
    {"image", "memory", "cpus", "pids", "workspace_size", "scratch_size", "environment", "read_only_root"}
)


class _Entry:
    """One sandbox of this server, and its lazily opened Python session."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.created = time.time()
        self.session: Any = None
        self.browser: Any = None  # a browser sandbox's Browser, made on the first browse
        self.lock = threading.Lock()  # opening the session or the browser


class SandboxService:
    """The sandboxes of one MCP server: create, use, snapshot and destroy them by id.

    Thread-safe: the MCP SDK runs each tool call in a worker thread.  Methods
    return JSON-ready dicts and raise :class:`~agentnest.errors.AgentNestError`
    (``ConfigurationError`` for a bad argument or unknown id).

    Example::

        service = SandboxService(ServerSettings(backend="docker"))
        try:
            sid = service.create_sandbox()["sandbox_id"]
            print(service.exec_shell(sid, "echo hi")["stdout"])
        finally:
            service.close()
    """

    def __init__(self, settings: ServerSettings) -> None:
        from .runtime.registry import get_backend

        self.settings = settings
        backend = settings.backend
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        if not isinstance(self.backend, RuntimeBackend):
            raise ConfigurationError("backend must be a backend name or a RuntimeBackend instance")
        kwargs = dict(settings.sandbox_kwargs)
        if kwargs.get("image") is None:
            from .sandbox import default_image

            kwargs["image"] = default_image()
        self._defaults = kwargs
        self.policy = _ceiling(settings, kwargs)
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=AUDIT_KEEP)
        self._observers: tuple[Observer, ...] = (self._record, *settings.observers)
        self._entries: dict[str, _Entry] = {}
        self._pending = 0  # slots held by creations and forks in progress
        self._lock = threading.Lock()
        self._closed = False
        if settings.snapshot_dir is not None:
            self.snapshot_dir = Path(settings.snapshot_dir).expanduser()
            self._own_snapshot_dir = False
        else:
            state = os.environ.get("XDG_STATE_HOME") or os.path.join("~", ".local", "state")
            instance = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self.snapshot_dir = Path(state).expanduser() / "agentnest" / "mcp-snapshots" / instance
            self._own_snapshot_dir = True

    # -- events -----------------------------------------------------------------

    def _record(self, event: SandboxEvent) -> None:
        self._events.append(event.to_dict())  # deque.append is atomic; maxlen bounds memory

    def audit(self, sandbox_id: str | None = None, limit: int = AUDIT_RETURN) -> list[dict[str, Any]]:
        """The last ``limit`` events of this server's sandboxes (of one sandbox, if given)."""
        events = list(self._events)
        if sandbox_id is not None:
            sandbox_id = _check_id(sandbox_id)
            events = [e for e in events if e.get("sandbox_id") == sandbox_id]
        return events[-limit:]

    def knows(self, sandbox_id: str) -> bool:
        """Whether ``sandbox_id`` is or was a sandbox of this server (live, or in the kept events)."""
        with self._lock:
            if sandbox_id in self._entries:
                return True
        return any(e.get("sandbox_id") == sandbox_id for e in list(self._events))

    # -- lifecycle ------------------------------------------------------------------

    def create_sandbox(
        self,
        image: str | None = None,
        timeout: float | None = None,
        memory: str | int | None = None,
        cpus: float | None = None,
        preset: str | None = None,
    ) -> dict[str, Any]:
        """Create a sandbox within the server's ceiling and return its description.

        ``preset="browser"`` (only if the operator allows it in
        ``ServerSettings.presets``) makes a browser sandbox, for :meth:`browse`.

        Raises:
            PolicyDeniedError: over the ceiling, an image not allowed, a preset
                the operator did not allow, or the server already runs
                ``max_sandboxes`` sandboxes.
        """
        from .sandbox import Sandbox

        client: dict[str, Any] = {}
        if image is not None:
            client["image"] = _text(image, "image", 512)
        lifetime = _seconds(timeout, "timeout", self.settings.lifetime)
        if memory is not None:
            if isinstance(memory, bool) or not isinstance(memory, (str, int)):
                raise ConfigurationError("memory must be a size such as '256m'")
            client["memory"] = parse_size(memory, "memory")
        if cpus is not None:
            client["cpus"] = _number(cpus, "cpus")
        policy = self.policy
        if preset is None:
            kwargs = {**self._defaults, **client}
        else:
            from .mcp_browse import preset_sandbox_kwargs

            kwargs, policy = preset_sandbox_kwargs(self.settings, self.backend, self.policy, client, preset)
        kwargs["timeout"] = lifetime
        with self._slot():
            sandbox = Sandbox(
                backend=self.backend,
                security_policy=policy,
                observers=self._observers,
                **kwargs,
            )
            self._adopt(sandbox)
        return self._describe(sandbox.id)

    def fork(self, sandbox_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Branch a sandbox into a new one (counts against the limit)."""
        entry = self._get(sandbox_id)
        lifetime = None if timeout is None else _seconds(timeout, "timeout", self.settings.lifetime)
        with self._slot():
            child = entry.sandbox.fork(timeout=lifetime)
            self._adopt(child)
        return self._describe(child.id)

    def destroy(self, sandbox_id: str) -> dict[str, Any]:
        """Destroy a sandbox; its id is unknown afterwards."""
        sandbox_id = _check_id(sandbox_id)
        with self._lock:
            entry = self._entries.pop(sandbox_id, None)
        if entry is None:
            raise ConfigurationError(_unknown(sandbox_id))
        _destroy(entry)
        return {"sandbox_id": sandbox_id, "destroyed": True}

    def list_sandboxes(self) -> dict[str, Any]:
        """The live sandboxes of this server and how many more may be created."""
        self._reap()
        with self._lock:
            ids = sorted(self._entries, key=lambda i: self._entries[i].created)
            free = self.settings.max_sandboxes - len(self._entries) - self._pending
        return {
            "sandboxes": [self._describe(i) for i in ids if i in self._entries],
            "max_sandboxes": self.settings.max_sandboxes,
            "available": max(free, 0),
        }

    def close(self) -> None:
        """Destroy every sandbox (in parallel: a stdio client waits only seconds) and own snapshots."""
        with self._lock:
            self._closed = True
            entries = list(self._entries.values())
            self._entries.clear()
        if entries:
            with ThreadPoolExecutor(max_workers=min(len(entries), 8)) as pool:
                list(pool.map(_destroy, entries))
        if self._own_snapshot_dir:
            shutil.rmtree(self.snapshot_dir, ignore_errors=True)

    # -- commands -----------------------------------------------------------------------

    def exec_shell(self, sandbox_id: str, command: str, timeout: float | None = None) -> dict[str, Any]:
        """Run ``command`` with ``/bin/sh -c``."""
        entry = self._get(sandbox_id)
        command = _text(command, "command", MAX_FILE_BYTES)
        return self._run(lambda t: entry.sandbox.exec_shell(command, timeout=t), timeout)

    def exec_python(self, sandbox_id: str, code: str, timeout: float | None = None) -> dict[str, Any]:
        """Run Python ``code`` in a fresh interpreter."""
        entry = self._get(sandbox_id)
        code = _text(code, "code", MAX_FILE_BYTES)
        return self._run(lambda t: entry.sandbox.exec_python(code, timeout=t), timeout)

    def _run(self, call: Callable[[float], Any], timeout: float | None) -> dict[str, Any]:
        limit = _seconds(timeout, "timeout", DEFAULT_EXEC_TIMEOUT, MAX_EXEC_TIMEOUT)
        try:
            result = call(limit)
        except ExecutionTimeoutError as exc:
            # A command past its timeout is an outcome, not a failure of the
            # tool: the model gets the partial output and timed_out=true.
            result = exc.result
            if result is None:
                raise
        stdout, cut_out = _bound(result.stdout)
        stderr, cut_err = _bound(result.stderr)
        return {
            "exit_code": result.exit_code,
            "stdout": stdout,
            "stderr": stderr,
            "timed_out": result.timed_out,
            "truncated": bool(result.truncated or cut_out or cut_err),
            "duration": round(result.duration, 3),
            "signal": getattr(result, "signal", None),
        }

    def session_run(self, sandbox_id: str, code: str, timeout: float | None = None) -> dict[str, Any]:
        """Run ``code`` in the sandbox's persistent Python session (opened on first use)."""
        entry = self._get(sandbox_id)
        code = _text(code, "code", MAX_FILE_BYTES)
        limit = _seconds(timeout, "timeout", DEFAULT_EXEC_TIMEOUT, MAX_EXEC_TIMEOUT)
        with entry.lock:
            if entry.session is None or entry.session.closed:
                entry.session = entry.sandbox.python_session()
            session = entry.session
        try:
            result = session.run(code, timeout=limit)
        except ExecutionTimeoutError as exc:
            result = exc.result
            if result is None:
                raise
        except SessionLostError as exc:
            with entry.lock:
                if entry.session is session:
                    entry.session = None
            raise SessionLostError(f"{exc}; the next session_run starts a fresh interpreter") from None
        out: dict[str, Any] = {}
        cut = False
        for name in ("stdout", "stderr", "result", "error"):
            value = getattr(result, name)
            if value is not None:
                value, was_cut = _bound(value)
                cut = cut or was_cut
            out[name] = value
        display = []
        for item in result.display[:16]:
            if item.binary:
                # Images are not sent back: an agent asks for files it wants instead.
                display.append({"mime": item.mime, "bytes": len(item.raw())})
            else:
                text, was_cut = _bound(item.data)
                cut = cut or was_cut
                display.append({"mime": item.mime, "data": text})
        out.update(
            ok=result.ok,
            display=display,
            timed_out=result.timed_out,
            truncated=bool(result.truncated or cut or len(result.display) > 16),
            duration=round(result.duration, 3),
        )
        return out

    def browse(
        self, sandbox_id: str, url: str, full_page: bool = False, timeout: float | None = None
    ) -> dict[str, Any]:
        """Open ``url`` in a browser sandbox: its text, console and screenshot (PNG, base64).

        See :func:`agentnest.mcp_browse.browse` for the answer's keys.

        Raises:
            UnsupportedCapabilityError: the sandbox is not a browser sandbox.
            BrowserError: the page failed to load or timed out.
        """
        from .mcp_browse import browse

        return browse(self._get(sandbox_id), url, full_page, timeout, text_limit=MAX_TEXT_CHARS)

    # -- files ---------------------------------------------------------------------------

    def read_file(self, sandbox_id: str, path: str) -> dict[str, Any]:
        """Read a UTF-8 text file of the workspace (secrets redacted)."""
        entry = self._get(sandbox_id)
        path = _text(path, "path", 4096)
        try:
            text = entry.sandbox.read_file(path)
        except FileAccessError as exc:
            if exc.code == "decode":
                # Raw bytes would bypass redaction; the shell's output does not.
                raise FileAccessError(
                    f"{path!r} is not UTF-8 text; read binary files with exec_shell, e.g. 'base64 FILE'",
                    path=path,
                    code="decode",
                ) from None
            raise
        return {"path": path, "content": text}

    def write_file(self, sandbox_id: str, path: str, content: str) -> dict[str, Any]:
        """Write text to a workspace file (parents created)."""
        entry = self._get(sandbox_id)
        path = _text(path, "path", 4096)
        if not isinstance(content, str):
            raise ConfigurationError(f"content must be a string, not {type(content).__name__}")
        data = content.encode("utf-8", "surrogatepass")
        if len(data) > self.policy.max_file_bytes:
            raise FileAccessError(
                f"content of {len(data)} bytes is over the limit of {self.policy.max_file_bytes} bytes "
                "for one write through MCP; write the file in parts with exec_shell",
                path=path,
                code="too_large",
            )
        entry.sandbox.write_file(path, data)
        return {"path": path, "size": len(data)}

    def list_files(self, sandbox_id: str, path: str = ".", recursive: bool = False) -> dict[str, Any]:
        """List a workspace directory (at most MAX_LIST_ENTRIES entries)."""
        entry = self._get(sandbox_id)
        path = _text(path, "path", 4096)
        if not isinstance(recursive, bool):
            raise ConfigurationError("recursive must be true or false")
        found = entry.sandbox.list_files(path, recursive=recursive, max_entries=MAX_LIST_ENTRIES + 1)
        return {
            "path": path,
            "entries": [
                {"path": f.path, "type": f.type, "size": f.size, "mode": oct(f.mode)}
                for f in found[:MAX_LIST_ENTRIES]
            ],
            "truncated": len(found) > MAX_LIST_ENTRIES,
        }

    # -- snapshots ----------------------------------------------------------------------

    def snapshot(self, sandbox_id: str, name: str) -> dict[str, Any]:
        """Save the workspace as snapshot ``name`` in the server's snapshot directory."""
        target = self._snapshot_path(name)
        entry = self._get(sandbox_id)
        if not target.exists() and len(list(self.snapshot_dir.glob("*.tar"))) >= MAX_SNAPSHOTS:
            raise PolicyDeniedError(
                f"this server keeps at most {MAX_SNAPSHOTS} snapshots; reuse a name to replace one"
            )
        with self._hide_dir():
            meta = entry.sandbox.snapshot(target)
        return {
            "name": name,
            "size": meta.size,
            "sha256": meta.sha256,
            "files": meta.files,
            "image": meta.image,
            "created": meta.created,
        }

    def restore(self, sandbox_id: str, name: str) -> dict[str, Any]:
        """Replace the workspace with snapshot ``name`` (made by this server)."""
        source = self._snapshot_path(name)
        entry = self._get(sandbox_id)
        if not source.is_file():
            raise ConfigurationError(f"no snapshot named {name!r} on this server")
        with self._hide_dir():
            meta = entry.sandbox.restore(source)
        return {"name": name, "files": meta.files, "sha256": meta.sha256, "restored": True}

    def _snapshot_path(self, name: str) -> Path:
        if not isinstance(name, str) or not _SNAPSHOT_NAME.fullmatch(name):
            raise ConfigurationError(
                f"snapshot name {name!r:.80} is not valid: use 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit (it names a file in the server's snapshot directory)"
            )
        # 0700: snapshots hold the workspace; other local users need not read them.
        self.snapshot_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.snapshot_dir / f"{name}.tar"

    def _hide_dir(self) -> "_Rewrite":
        # Errors name the host file; the client needs only its own snapshot name.
        return _Rewrite(str(self.snapshot_dir), "<snapshots>")

    # -- bookkeeping -------------------------------------------------------------------

    def _slot(self) -> "_Slot":
        self._reap()
        return _Slot(self)

    def _adopt(self, sandbox: Any) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._entries[sandbox.id] = _Entry(sandbox)
        if closed:  # the server stopped while this one was being created
            sandbox.destroy()
            raise SandboxDestroyedError("the server is shutting down")

    def _get(self, sandbox_id: str) -> _Entry:
        sandbox_id = _check_id(sandbox_id)
        with self._lock:
            entry = self._entries.get(sandbox_id)
        if entry is None:
            raise ConfigurationError(_unknown(sandbox_id))
        if entry.sandbox.destroyed or time.time() >= entry.sandbox.deadline:
            with self._lock:
                self._entries.pop(sandbox_id, None)
            _destroy(entry)
            raise SandboxDestroyedError(
                f"sandbox {sandbox_id} reached the end of its lifetime and was removed; create a new one"
            )
        return entry

    def _reap(self) -> None:
        """Forget (and remove) sandboxes past their deadline: they free their slot."""
        now = time.time()
        with self._lock:
            expired = [
                i for i, e in self._entries.items() if e.sandbox.destroyed or now >= e.sandbox.deadline
            ]
            gone = [self._entries.pop(i) for i in expired]
        for entry in gone:
            _destroy(entry)

    def _describe(self, sandbox_id: str) -> dict[str, Any]:
        with self._lock:
            entry = self._entries.get(sandbox_id)
        if entry is None:
            raise ConfigurationError(_unknown(sandbox_id))
        sandbox = entry.sandbox
        limits = sandbox.config.limits
        return {
            "sandbox_id": sandbox.id,
            "image": sandbox.config.image,
            "backend": self.backend.name,
            "memory": limits.memory,
            "cpus": limits.cpus,
            "network": sandbox.config.network.mode.value,
            "preset": sandbox.config.preset,
            "expires_in": max(round(sandbox.deadline - time.time(), 1), 0.0),
            "session_open": entry.session is not None,
        }


class _Slot:
    """Holds one of ``max_sandboxes`` places while a sandbox is being created."""

    def __init__(self, service: SandboxService) -> None:
        self._service = service

    def __enter__(self) -> None:
        service = self._service
        with service._lock:
            if service._closed:
                raise SandboxDestroyedError("the server is shutting down")
            used = len(service._entries) + service._pending
            if used >= service.settings.max_sandboxes:
                raise PolicyDeniedError(
                    f"this server already runs {used} of at most {service.settings.max_sandboxes} "
                    "sandboxes; destroy one first"
                )
            service._pending += 1

    def __exit__(self, *exc: object) -> None:
        with self._service._lock:
            self._service._pending -= 1


class _Rewrite:
    """Replace a string in the message of an AgentNestError leaving the block."""

    def __init__(self, old: str, new: str) -> None:
        self._old, self._new = old, new

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, AgentNestError) and exc.args and isinstance(exc.args[0], str):
            exc.args = (exc.args[0].replace(self._old, self._new), *exc.args[1:])
            for attr in ("path", "member"):
                value = getattr(exc, attr, None)
                if isinstance(value, str):
                    setattr(exc, attr, value.replace(self._old, self._new))


def _ceiling(settings: ServerSettings, defaults: Mapping[str, Any]) -> SecurityPolicy:
    """The server's policy with its ceilings made explicit, so clients can only narrow."""
    policy = settings.policy
    memory = parse_size(defaults.get("memory", "512m"), "memory")
    max_memory = int(policy.max_memory) if policy.max_memory is not None else memory
    max_cpus = policy.max_cpus if policy.max_cpus is not None else _number(defaults.get("cpus", 1.0), "cpus")
    max_timeout = min(policy.max_timeout or math.inf, settings.max_lifetime)
    if settings.lifetime > max_timeout:
        raise ConfigurationError(
            f"the default lifetime {settings.lifetime:g}s is over the policy's max_timeout {max_timeout:g}s"
        )
    # Without an explicit allowlist only the server's own image: otherwise a
    # client could make the host pull (and run) any image from any registry.
    images = policy.allowed_images or (str(defaults["image"]),)
    return dataclasses.replace(
        policy,
        max_memory=max_memory,
        max_cpus=max_cpus,
        max_timeout=max_timeout,
        allowed_images=images,
        max_file_bytes=min(policy.max_file_bytes, MAX_FILE_BYTES),
    )


def _destroy(entry: _Entry) -> None:
    try:
        if entry.session is not None:
            entry.session.close()
    except AgentNestError:
        pass  # the sandbox goes next; its session with it
    try:
        entry.sandbox.destroy()
    except AgentNestError:
        pass  # already gone, or the engine failed: the deadline label stops it anyway


def _unknown(sandbox_id: str) -> str:
    return f"no sandbox {sandbox_id!r} on this server; list_sandboxes shows the live ones"


def _check_id(sandbox_id: object) -> str:
    if not isinstance(sandbox_id, str) or not _SANDBOX_ID.fullmatch(sandbox_id):
        raise ConfigurationError(f"sandbox_id {sandbox_id!r:.80} is not a sandbox id")
    return sandbox_id


def _text(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise ConfigurationError(f"{what} is {len(value)} characters long; the limit is {limit}")
    return value


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigurationError(f"{what}={value!r} must be a positive number")
    return float(value)


def _seconds(value: object, what: str, default: float, ceiling: float = math.inf) -> float:
    if value is None:
        return default
    seconds = _number(value, what)
    if seconds > ceiling:
        raise ConfigurationError(f"{what}={seconds:g} is over the limit of {ceiling:g} seconds")
    return seconds


def _bound(text: str, limit: int = MAX_TEXT_CHARS) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters: its head and tail around a note saying how much went."""
    if len(text) <= limit:
        return text, False
    half = limit // 2
    cut = len(text) - 2 * half
    return f"{text[:half]}\n[... {cut} characters cut by agentnest mcp ...]\n{text[-half:]}", True


# -- the MCP face ---------------------------------------------------------------------------

_INSTRUCTIONS = """\
AgentNest sandboxes: disposable, isolated Linux containers with Python.  Call
create_sandbox first and pass the sandbox_id it returns to the other tools.
Files live under /workspace (relative paths are relative to it).  A sandbox
has no network unless the server allows it, stops at the end of its lifetime
(expires_in), and is gone after destroy.  session_run keeps Python variables
between calls; exec_python starts a fresh interpreter each time."""


def _import_sdk() -> None:
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            "agentnest mcp needs the MCP Python SDK 2.x: pip install 'agentnest[mcp]'"
        ) from exc


def build_server(service: SandboxService) -> "MCPServer":
    """An ``MCPServer`` (MCP Python SDK) whose tools and resources drive ``service``.

    Raises:
        MissingDependencyError: the ``mcp`` extra is not installed.
    """
    _import_sdk()
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
    from mcp.types import ToolAnnotations
    from pydantic import Field

    from ._version import __version__
    from .mcp_browse import BROWSE_INSTRUCTIONS

    browsing = "browser" in service.settings.presets
    server: MCPServer = MCPServer(
        "agentnest",
        version=__version__,
        instructions=_INSTRUCTIONS + (BROWSE_INSTRUCTIONS if browsing else ""),
        log_level="WARNING",
    )

    def call(fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except AgentNestError as exc:
            # Messages are written for people and already redacted by the
            # guard; anything else becomes the SDK's generic error (no leak).
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    SandboxId = Annotated[str, Field(description="id returned by create_sandbox", max_length=64)]
    Timeout = Annotated[
        float | None,
        Field(
            description=f"seconds before the command and its processes are killed "
            f"(default {DEFAULT_EXEC_TIMEOUT:g}, at most {MAX_EXEC_TIMEOUT:g})",
            gt=0,
        ),
    ]
    Path_ = Annotated[str, Field(description="path in the workspace, relative to /workspace or absolute")]
    SnapshotName = Annotated[str, Field(description="1-64 letters, digits, '.', '_' or '-'", max_length=64)]
    readonly = ToolAnnotations(read_only_hint=True, destructive_hint=False)
    mutating = ToolAnnotations(read_only_hint=False, destructive_hint=False)
    destructive = ToolAnnotations(read_only_hint=False, destructive_hint=True)

    @server.tool(annotations=mutating)
    def create_sandbox(
        image: Annotated[
            str | None, Field(description="image; only those the server allows (default: its own)")
        ] = None,
        timeout: Annotated[
            float | None,
            Field(
                description="lifetime in seconds; the sandbox stops itself then "
                f"(default {service.settings.lifetime:g}, at most {service.policy.max_timeout:g})",
                gt=0,
            ),
        ] = None,
        memory: Annotated[
            str | None, Field(description="memory limit such as '256m', at most the server's")
        ] = None,
        cpus: Annotated[float | None, Field(description="CPU limit, at most the server's", gt=0)] = None,
        preset: Annotated[
            str | None,
            Field(
                description="'browser' for a sandbox with Chromium, to use with browse; presets this "
                f"server allows: {', '.join(service.settings.presets) or 'none'}",
                max_length=32,
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Create an isolated sandbox and return its sandbox_id, limits and time left."""
        return call(service.create_sandbox, image, timeout, memory, cpus, preset)

    @server.tool(annotations=mutating)
    def exec_shell(
        sandbox_id: SandboxId,
        command: Annotated[str, Field(description="shell script, run with /bin/sh -c in /workspace")],
        timeout: Timeout = None,
    ) -> dict[str, Any]:
        """Run a shell command; returns exit_code, stdout, stderr, timed_out, truncated."""
        return call(service.exec_shell, sandbox_id, command, timeout)

    @server.tool(annotations=mutating)
    def exec_python(
        sandbox_id: SandboxId,
        code: Annotated[str, Field(description="Python source, run by a fresh python3 process")],
        timeout: Timeout = None,
    ) -> dict[str, Any]:
        """Run Python code in a new interpreter; returns exit_code, stdout, stderr."""
        return call(service.exec_python, sandbox_id, code, timeout)

    @server.tool(annotations=mutating)
    def session_run(
        sandbox_id: SandboxId,
        code: Annotated[str, Field(description="Python source; a trailing expression's repr is returned")],
        timeout: Timeout = None,
    ) -> dict[str, Any]:
        """Run code in the sandbox's persistent Python session: variables and imports stay between calls."""
        return call(service.session_run, sandbox_id, code, timeout)

    @server.tool(annotations=readonly)
    def read_file(sandbox_id: SandboxId, path: Path_) -> dict[str, Any]:
        """Read a UTF-8 text file of the workspace (at most 1 MiB)."""
        return call(service.read_file, sandbox_id, path)

    @server.tool(annotations=mutating)
    def write_file(
        sandbox_id: SandboxId,
        path: Path_,
        content: Annotated[str, Field(description="the file's new text (UTF-8, at most 1 MiB)")],
    ) -> dict[str, Any]:
        """Write a text file in the workspace, creating parent directories."""
        return call(service.write_file, sandbox_id, path, content)

    @server.tool(annotations=readonly)
    def list_files(
        sandbox_id: SandboxId,
        path: Annotated[str, Field(description="directory in the workspace")] = ".",
        recursive: Annotated[bool, Field(description="descend into subdirectories")] = False,
    ) -> dict[str, Any]:
        """List a workspace directory (links are listed, never followed; at most 1000 entries)."""
        return call(service.list_files, sandbox_id, path, recursive)

    @server.tool(annotations=mutating)
    def fork(
        sandbox_id: SandboxId,
        timeout: Annotated[
            float | None, Field(description="the new sandbox's lifetime in seconds", gt=0)
        ] = None,
    ) -> dict[str, Any]:
        """Branch a sandbox into a new one with a copy of its workspace; returns the new sandbox."""
        return call(service.fork, sandbox_id, timeout)

    @server.tool(annotations=mutating)
    def snapshot(sandbox_id: SandboxId, name: SnapshotName) -> dict[str, Any]:
        """Save the workspace under a name (kept by the server; a name reused replaces it)."""
        return call(service.snapshot, sandbox_id, name)

    @server.tool(annotations=destructive)
    def restore(sandbox_id: SandboxId, name: SnapshotName) -> dict[str, Any]:
        """Replace the workspace's files with a snapshot made earlier by snapshot."""
        return call(service.restore, sandbox_id, name)

    @server.tool(annotations=destructive)
    def destroy(sandbox_id: SandboxId) -> dict[str, Any]:
        """Destroy a sandbox and everything in it."""
        return call(service.destroy, sandbox_id)

    if browsing:
        from .mcp_browse import register_browse

        register_browse(server, service, call, SandboxId, mutating)

    @server.tool(annotations=readonly)
    def list_sandboxes() -> dict[str, Any]:
        """The live sandboxes of this server and how many more may be created."""
        return call(service.list_sandboxes)

    @server.resource(
        "agentnest://audit",
        name="audit",
        description=f"the last {AUDIT_RETURN} audit events of this server's sandboxes (JSON)",
        mime_type="application/json",
    )
    def audit_log() -> str:
        return _json({"events": service.audit()})

    @server.resource(
        "agentnest://sandboxes/{sandbox_id}/audit",
        name="sandbox-audit",
        description=f"the last {AUDIT_RETURN} audit events of one sandbox (JSON)",
        mime_type="application/json",
    )
    def sandbox_audit(sandbox_id: str) -> str:
        if not _SANDBOX_ID.fullmatch(sandbox_id) or not service.knows(sandbox_id):
            raise ResourceNotFoundError(f"no sandbox {sandbox_id!r:.80} on this server")
        return _json({"sandbox_id": sandbox_id, "events": service.audit(sandbox_id)})

    return server


def _json(value: Any) -> str:
    import json

    return json.dumps(value, default=str, indent=1)


def run(
    settings: ServerSettings,
    transport: Literal["stdio", "http"] = "stdio",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Serve until the client disconnects (stdio) or the process is stopped.

    Every sandbox is destroyed on the way out: when stdin ends (stdio), and
    on SIGTERM or SIGINT, after which the process exits with 128 + the signal
    number.  Further signals are ignored while the sandboxes are destroyed.
    """
    _import_sdk()
    service = SandboxService(settings)
    stop = (signal.SIGTERM, signal.SIGINT)
    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.getsignal(sig) for sig in stop} if in_main else {}

    def hold_signals() -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Clean up here and exit at once: unwinding instead would wait for
        # the SDK's stdin reader, a worker thread blocked in read() that no
        # cancellation reaches, so the process would never exit.  (uvicorn
        # runs its own graceful shutdown first and then re-raises the signal
        # to this handler.)
        hold_signals()
        try:
            service.close()
        finally:
            os._exit(128 + signum)

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        server = build_server(service)
        if transport == "stdio":
            server.run("stdio")
        else:
            server.run("streamable-http", host=host, port=port)
    finally:
        hold_signals()  # let the clean-up finish
        try:
            service.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


__all__ = [
    "DEFAULT_LIFETIME",
    "DEFAULT_MAX_SANDBOXES",
    "MAX_FILE_BYTES",
    "MAX_TEXT_CHARS",
    "SandboxService",
    "ServerSettings",
    "build_server",
    "run",
]
