"""The sandboxes of one ``agentnest mcp`` server, as plain AgentNest: :class:`SandboxService`.

It decides what a client's call may do: it owns the sandboxes this server
created (a registry by id, at most ``max_sandboxes``, each with a lifetime),
holds each sandbox to the server's ceiling (built into the policy the sandbox
gets, so the guard itself refuses what is over it, forks included), keeps
snapshots in a directory the server owns (clients name them, never a host
path), checks and coerces every argument a client sends, and turns results
into bounded JSON-ready dicts.  It imports no MCP code and is tested without
it; :mod:`agentnest.mcp.server` puts the MCP face on it.

.. versionadded:: 0.4.0
"""

import collections
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..config import parse_size
from ..errors import (
    AgentNestError,
    ConfigurationError,
    ExecutionTimeoutError,
    FileAccessError,
    PolicyDeniedError,
    SandboxDestroyedError,
    SessionLostError,
)
from ..events import Observer, SandboxEvent
from ..policy import Ceiling
from ..runtime.base import RuntimeBackend
from .settings import MAX_FILE_BYTES, ServerSettings

#: Per-command timeout when the client gives none, and the most it may ask for.
DEFAULT_EXEC_TIMEOUT = 60.0
MAX_EXEC_TIMEOUT = 600.0
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
        from ..runtime.registry import get_backend

        self.settings = settings
        backend = settings.backend
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        if not isinstance(self.backend, RuntimeBackend):
            raise ConfigurationError("backend must be a backend name or a RuntimeBackend instance")
        kwargs = dict(settings.sandbox_kwargs)
        if kwargs.get("image") is None:
            from ..sandbox import default_image

            kwargs["image"] = default_image()
        self._defaults = kwargs
        # The ceiling is built into the policy every sandbox gets, so the
        # guard itself refuses a request over it (a policy.denied event).
        self.policy = _ceiling(settings, kwargs).bound(settings.policy, str(kwargs["image"]))
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
        from ..sandbox import Sandbox

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
            from .browse import preset_sandbox_kwargs

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

        See :func:`agentnest.mcp.browse.browse` for the answer's keys.

        Raises:
            UnsupportedCapabilityError: the sandbox is not a browser sandbox.
            BrowserError: the page failed to load or timed out.
        """
        from .browse import browse

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


def _ceiling(settings: ServerSettings, defaults: Mapping[str, Any]) -> Ceiling:
    """The server's ceiling: its policy's maxima, else what the operator gives every sandbox."""
    policy = settings.policy
    memory = parse_size(defaults.get("memory", "512m"), "memory")
    max_memory = int(policy.max_memory) if policy.max_memory is not None else memory
    max_cpus = policy.max_cpus if policy.max_cpus is not None else _number(defaults.get("cpus", 1.0), "cpus")
    max_timeout = min(policy.max_timeout or math.inf, settings.max_lifetime)
    if settings.lifetime > max_timeout:
        raise ConfigurationError(
            f"the default lifetime {settings.lifetime:g}s is over the policy's max_timeout {max_timeout:g}s"
        )
    # Without an explicit allowlist only the server's own image (Ceiling.bound):
    # otherwise a client could make the host pull (and run) any image from any registry.
    return Ceiling(
        images=policy.allowed_images,
        max_memory=max_memory,
        max_cpus=max_cpus,
        max_timeout=max_timeout,
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
