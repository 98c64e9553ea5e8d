"""The ``remote`` backend: sandboxes of an ``agentnest serve`` server, used as if local.

``create``, ``destroy``, ``extend`` and the status calls are JSON requests to
the server's HTTP API; ``open_channel`` is a websocket to
``/v1/sandboxes/{id}/channel`` over which this process speaks the agent
protocol end to end, so every :class:`~agentnest.Sandbox` method (commands,
streams, sessions, files, fork, snapshot) works unchanged::

    backend = RemoteBackend("http://127.0.0.1:8700", token)
    with Sandbox(backend=backend, timeout=60) as sandbox:
        print(sandbox.exec_shell("uname -a").stdout)

``Sandbox(backend="remote")`` reads ``AGENTNEST_REMOTE_URL``,
``AGENTNEST_REMOTE_TOKEN`` and optionally ``AGENTNEST_REMOTE_BACKEND`` (the
server-side backend, e.g. ``gvisor``).

Trust: the server holds the sandbox to the token's ceiling when it creates
it; this side's guard (policy, approvals, redaction, events) runs here, on
top.  Needs the ``server`` extra (httpx and websockets).

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..channel.streams import ByteStream
from ..config import SandboxConfig
from ..errors import (
    AgentNestError,
    BackendError,
    ChannelError,
    ConfigurationError,
    MissingDependencyError,
    RuntimeNotAvailableError,
    rebuild_error,
)
from ..secrets import Secret
from .base import Capability, RuntimeBackend, SandboxHandle

#: Seconds to wait for the server; creating a sandbox may pull an image.
DEFAULT_TIMEOUT = 300.0
#: Largest websocket message accepted from the server (it sends at most 1 MiB).
_MAX_MESSAGE = 4 * 1024 * 1024
_DEFAULT_USER = SandboxConfig(image="x").user


def _import_client() -> tuple[Any, Any]:
    try:
        import httpx
        import websockets.sync.client as ws_client
    except ImportError as exc:
        raise MissingDependencyError(
            "the remote backend needs httpx and websockets: pip install 'agentnest[server]'"
        ) from exc
    return httpx, ws_client


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WebSocketStream(ByteStream):
    """A websocket carrying agent bytes (binary messages), as a blocking :class:`ByteStream`."""

    def __init__(self, connection: Any) -> None:
        self._ws = connection
        self._buf = b""
        self._closed = False
        self._lock = threading.Lock()

    def read(self, max_bytes: int) -> bytes:
        from websockets.exceptions import ConnectionClosed

        if not self._buf:
            try:
                message = self._ws.recv()
            except ConnectionClosed:
                return b""
            except (OSError, RuntimeError):
                if self._closed:
                    return b""
                raise
            if isinstance(message, str):
                raise OSError("the server sent a text message on the agent channel")
            self._buf = bytes(message)
        piece, self._buf = self._buf[:max_bytes], self._buf[max_bytes:]
        return piece

    def write(self, data: bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            with self._lock:
                self._ws.send(bytes(data))
        except ConnectionClosed as exc:
            raise OSError(f"the server closed the agent channel ({exc})") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._ws.close()
        except (OSError, RuntimeError):
            pass


class _RemoteEgressLog:
    """``handle.info["egress"]`` of a remote allowlist sandbox: ``Sandbox.network_log()`` asks the server.

    It has no ``subscribe``: the server's own audit log records the egress
    events as they happen; this side sees them when it asks.
    """

    def __init__(self, backend: RemoteBackend, sandbox_id: str) -> None:
        self._backend = backend
        self._id = sandbox_id

    def log(self) -> list[dict[str, Any]]:
        response = self._backend._call("GET", f"/v1/sandboxes/{self._id}/network-log")
        events = response.json().get("events")
        return [dict(e) for e in events if isinstance(e, dict)] if isinstance(events, list) else []


class RemoteBackend(RuntimeBackend):
    """Sandboxes on an ``agentnest serve`` server (see the module docstring).

    Args:
        url: the server, ``http://127.0.0.1:8700`` (default ``$AGENTNEST_REMOTE_URL``).
        token: the bearer token (default ``$AGENTNEST_REMOTE_TOKEN``).
        backend: the server-side backend to ask for (default
            ``$AGENTNEST_REMOTE_BACKEND``, else the server's default).
        timeout: seconds to wait for each HTTP call.
        allow_insecure: allow plain ``http://`` to a host that is not
            loopback.  Off by default: the token would cross the network in
            clear text.
        max_wait: seconds a create may wait in the server's admission queue
            (default: the tenant's ``default_wait``; 0 answers at once).  A
            create not admitted in time raises
            :class:`~agentnest.errors.AdmissionRefusedError` with its
            ``reason`` and ``retry_after``.
        lease: when the server may reap the sandbox before its deadline:
            ``"deadline"`` (never), ``"idle"`` (after ``idle_timeout`` seconds
            without a call), or ``"session"`` (once this client's agent
            channels are all closed, e.g. the process died).

    Raises:
        ConfigurationError: no URL or token, or plain HTTP to a remote host.
        MissingDependencyError: the ``server`` extra is not installed.
    """

    name = "remote"

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        backend: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        allow_insecure: bool = False,
        max_wait: float | None = None,
        lease: str = "deadline",
        idle_timeout: float | None = None,
    ) -> None:
        url = url or os.environ.get("AGENTNEST_REMOTE_URL")
        if max_wait is not None and (
            isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not 0 <= max_wait <= 600
        ):
            raise ConfigurationError(f"max_wait={max_wait!r} must be 0 to 600 seconds")
        self.max_wait = max_wait
        if lease not in ("deadline", "idle", "session"):
            raise ConfigurationError(f"lease={lease!r} must be 'deadline', 'idle' or 'session'")
        if idle_timeout is not None and lease != "idle":
            raise ConfigurationError("idle_timeout goes with lease='idle' only")
        self.lease = lease
        self.idle_timeout = idle_timeout
        token = token or os.environ.get("AGENTNEST_REMOTE_TOKEN")
        if not url:
            raise ConfigurationError(
                "the remote backend needs a server URL: pass url= or set AGENTNEST_REMOTE_URL"
            )
        if not token:
            raise ConfigurationError(
                "the remote backend needs a token: pass token= or set AGENTNEST_REMOTE_TOKEN "
                "(`agentnest serve token create` makes one)"
            )
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"server URL {url!r} must look like http://HOST:PORT or https://HOST:PORT"
            )
        if parts.scheme == "http" and not _is_loopback(parts.hostname) and not allow_insecure:
            # A bearer token in clear text over a network is as good as published.
            raise ConfigurationError(
                f"refusing to send the token to {parts.hostname} over plain http; use https, "
                "or pass allow_insecure=True for a network you trust"
            )
        self.url = urlunsplit(parts)
        self.server_backend = backend or os.environ.get("AGENTNEST_REMOTE_BACKEND") or None
        self._token = token
        self._timeout = timeout
        httpx, _ = _import_client()
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, connect=30.0),
        )
        self._info: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<RemoteBackend {self.url} backend={self.server_backend or 'default'}>"

    # -- HTTP ----------------------------------------------------------------------

    def _call(self, method: str, path: str, *, missing_ok: bool = False, **kwargs: Any) -> Any:
        """A request; errors become AgentNest errors rebuilt from the server's code.

        With ``missing_ok``, an unknown sandbox (404 ``not_found``) returns None.
        """
        httpx, _ = _import_client()
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise RuntimeNotAvailableError(
                f"cannot reach the AgentNest server at {self.url}: {exc}"
            ) from None
        if response.status_code == 404 and missing_ok:
            try:
                if response.json().get("code") == "not_found":
                    return None
            except (ValueError, AttributeError):
                pass
        if response.status_code >= 400:
            raise self._error(response)
        return response

    def _error(self, response: Any) -> AgentNestError:
        try:
            body = response.json()
        except ValueError:
            body = None
        detail = body.get("detail") if isinstance(body, dict) else None
        if response.status_code == 401:
            return ConfigurationError(f"the AgentNest server at {self.url} refused the token: {detail}")
        if isinstance(detail, list):  # FastAPI's validation errors
            first = detail[0] if detail and isinstance(detail[0], dict) else {}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return ConfigurationError(f"the server refused the request: {where}: {first.get('msg')}")
        if not isinstance(detail, str):
            return BackendError(f"the AgentNest server answered HTTP {response.status_code}")
        retry_after = None
        with contextlib.suppress(ValueError, TypeError):
            retry_after = float(response.headers.get("retry-after"))
        return rebuild_error(body.get("code") if isinstance(body, dict) else None, detail, retry_after)

    def info(self) -> dict[str, Any]:
        """``GET /v1/info`` (cached): the server's backends and this token's ceiling."""
        with self._lock:
            if self._info is None:
                self._info = dict(self._call("GET", "/v1/info").json())
            return self._info

    def _backend_info(self) -> dict[str, Any]:
        backends = self.info().get("backends") or []
        for entry in backends:
            if (self.server_backend is None and entry.get("default")) or entry.get(
                "name"
            ) == self.server_backend:
                return dict(entry)
        if self.server_backend is None and backends:
            return dict(backends[0])
        names = [b.get("name") for b in backends]
        raise ConfigurationError(
            f"the server offers this token no backend {self.server_backend!r}; it may use {names}"
        )

    # -- RuntimeBackend ------------------------------------------------------------------

    def capabilities(self) -> frozenset[Capability]:
        known = {c.value: c for c in Capability}
        caps = {known[v] for v in self._backend_info().get("capabilities", ()) if v in known}
        # GPUs cannot be asked for over the HTTP API.  Nor a disk workspace, a
        # pause or a live fork: where the workspace lives is the server's choice
        # (its own storage pool), and the API has no pause.
        caps -= {Capability.GPU, Capability.DISK_WORKSPACE, Capability.PAUSE, Capability.LIVE_FORK}
        return frozenset(caps)

    @property
    def oci_runtime(self) -> str | None:
        value = self._backend_info().get("oci_runtime")
        return value if isinstance(value, str) else None

    def create(self, config: SandboxConfig) -> SandboxHandle:
        if config.user != _DEFAULT_USER or config.labels:
            raise ConfigurationError(
                "the remote backend does not pass user or labels to the server (it chooses them)"
            )
        if config.network.cidrs:
            raise ConfigurationError("the remote backend cannot ask for allowlist cidrs; name domains")
        if config.preset is not None:
            # The server would make a plain sandbox: without the preset's /dev/shm
            # and (on gVisor) address space, Chromium would not start.
            raise ConfigurationError(
                f"the remote backend cannot ask for preset={config.preset!r}: the HTTP API has no presets; "
                "create browser sandboxes on a local Docker backend"
            )
        environment: dict[str, str] = {}
        secrets: dict[str, str] = {}
        secret_files: dict[str, str] = {}
        for name, value in config.environment.items():
            if isinstance(value, Secret):
                (secret_files if value.as_file else secrets)[name] = value.get_secret_value()
            else:
                environment[name] = value
        limits = config.limits
        body = {
            "image": config.image,
            "backend": self.server_backend or self._backend_info().get("name"),
            "timeout": config.lifetime,
            "memory": limits.memory,
            "cpus": limits.cpus,
            "pids": limits.pids,
            "workspace_size": limits.workspace,
            "scratch_size": limits.scratch,
            "workdir": config.workdir,
            "read_only_root": config.read_only_root,
            "environment": environment,
            "secrets": secrets,
            "secret_files": secret_files,
            "network": {
                "mode": config.network.mode.value,
                "domains": list(config.network.domains),
                "ports": list(config.network.ports),
                "subdomains": config.network.subdomains,
            },
        }
        if self.max_wait is not None:
            body["max_wait"] = self.max_wait
        if self.lease != "deadline":
            body["lease"] = self.lease
        if self.idle_timeout is not None:
            body["idle_timeout"] = self.idle_timeout
        # A queued create may wait up to max_wait on the server before it answers.
        read = self._timeout + (self.max_wait if self.max_wait is not None else 600.0)
        made = self._call("POST", "/v1/sandboxes", json=body, timeout=read).json()
        sandbox_id = str(made["id"])
        info: dict[str, Any] = {}
        if config.network.domains:
            info["egress"] = _RemoteEgressLog(self, sandbox_id)
        return SandboxHandle(id=sandbox_id, backend=self.name, deadline=float(made["deadline"]), info=info)

    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        _, ws_client = _import_client()
        from websockets.exceptions import InvalidHandshake, InvalidStatus

        parts = urlsplit(self.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        target = urlunsplit((scheme, parts.netloc, f"{parts.path}/v1/sandboxes/{handle.id}/channel", "", ""))
        try:
            # Entered, not used as a block: the stream outlives this call and
            # closes the connection itself (websockets >= 17 deprecates the bare call).
            connection = ws_client.connect(
                target,
                additional_headers={"Authorization": f"Bearer {self._token}"},
                open_timeout=min(self._timeout, 60.0),
                max_size=_MAX_MESSAGE,
                compression=None,  # agent frames are small or already compressed; no inflate bombs
            ).__enter__()
        except InvalidStatus as exc:
            status = exc.response.status_code
            raise ChannelError(
                f"the server refused the agent channel of sandbox {handle.id} (HTTP {status}): "
                "unknown sandbox, another token's, or too many channels"
            ) from None
        except (InvalidHandshake, OSError, TimeoutError) as exc:
            raise ChannelError(f"could not open the agent channel of sandbox {handle.id}: {exc}") from None
        return WebSocketStream(connection)

    def destroy(self, handle: SandboxHandle) -> None:
        self._call("DELETE", f"/v1/sandboxes/{handle.id}", missing_ok=True)

    def _status(self, handle: SandboxHandle) -> dict[str, Any] | None:
        response = self._call("GET", f"/v1/sandboxes/{handle.id}", missing_ok=True)
        return None if response is None else dict(response.json())

    def is_running(self, handle: SandboxHandle) -> bool:
        status = self._status(handle)
        return bool(status and status.get("running"))

    def exit_reason(self, handle: SandboxHandle) -> str | None:
        status = self._status(handle)
        if status is None:
            return "the server no longer has it (destroyed, or past its deadline)"
        reason = status.get("exit_reason")
        return reason if isinstance(reason, str) else None

    def extend(self, handle: SandboxHandle, deadline: float) -> None:
        seconds = deadline - handle.deadline
        if seconds <= 0:
            raise ConfigurationError("a new deadline must be later than the current one")
        made = self._call("POST", f"/v1/sandboxes/{handle.id}/extend", json={"seconds": seconds}).json()
        handle.deadline = float(made["deadline"])

    def logs(self, handle: SandboxHandle, tail: int = 200) -> str:
        try:
            return str(
                self._call("GET", f"/v1/sandboxes/{handle.id}/logs", params={"tail": tail}).json()["logs"]
            )
        except AgentNestError:
            return ""

    def close(self) -> None:
        self._client.close()


__all__ = ["RemoteBackend", "WebSocketStream"]
