"""The E2B face of ``agentnest serve``: one ASGI layer in front of the native API, same process and port.

Requests whose path is E2B's go here; everything else passes through to the
native application.  Routing follows E2B's own proxy:

- the control plane (``/sandboxes``, ``/v2/sandboxes``...): authenticated by
  ``X-API-KEY`` (:mod:`.control`);
- the data plane: the sandbox comes from the ``E2b-Sandbox-Id`` header
  (``E2B_SANDBOX_URL`` pointing here), or from a ``{port}-{id}.{domain}``
  host name when ``e2b_domain`` is set; the port from ``E2b-Sandbox-Port``
  or the host: 49983 is envd (``/process.Process/*``,
  ``/filesystem.Filesystem/*`` over Connect, ``/files``, ``/health``), 49999
  the code interpreter (``/execute``, ``/contexts``, ``/health``).  Each
  call must carry the sandbox's ``envdAccessToken`` in ``X-Access-Token``
  (or, for ``/files``, a signature made with it): that per-sandbox secret,
  given only to the token that created or connected to the sandbox, is the
  data plane's credential, as in E2B.

No second daemon runs in the sandbox and nothing in it listens on the
network: every data-plane call becomes calls of the sandbox's agent channel,
through the guard (policy, approvals, redaction, audit).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from connectrpc.server import ConnectASGIApplication
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from . import filesystem, process
from .control import ControlPlane, E2BError, e2b_error, unsupported
from .files import download, envd_error, upload
from .interpreter import Interpreter
from .rpc import CURRENT, not_found_message, rpc_refusal
from .state import Box, Boxes
from .wire import JSONCodec

if TYPE_CHECKING:
    from ..service import Service
    from ..settings import ServerSettings

log = logging.getLogger("agentnest.server.e2b")

ENVD_PORT = 49983
INTERPRETER_PORT = 49999
#: Largest Connect request message (the biggest is stdin data).
MAX_RPC_BYTES = 8 * 1024 * 1024
_CONTROL = re.compile(r"/(?:v2/)?sandboxes(?:/([^/]{1,64})(?:/([a-z]+))?)?/?")
_UNSUPPORTED_CONTROL = {"metrics", "snapshots", "fork", "network", "refreshes", "logs"}
_DATA_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
_DATA_PATHS = {"/files", "/health", "/execute", "/contexts"}


class _ConnectApp(ConnectASGIApplication[Any]):
    def __init__(self, service: Any, endpoints: Any, path: str) -> None:
        super().__init__(
            service=service,
            endpoints=endpoints,
            codecs=[JSONCodec()],
            # E2B clients never compress (identity both ways); gzip is accepted too.
            read_max_bytes=MAX_RPC_BYTES,
        )
        self._path = path

    @property
    def path(self) -> str:
        return self._path


class E2BFace:
    """The E2B API of one server: its sandboxes' E2B state and the ASGI layer (:meth:`wrap`)."""

    def __init__(self, service: Service, settings: ServerSettings) -> None:
        self.service = service
        self.settings = settings
        self.boxes = Boxes(service.entries)
        self.control = ControlPlane(service, settings, self.boxes)
        self.interpreter = Interpreter()
        self._process = _ConnectApp(process.ProcessService(), process.endpoints, "/process.Process")
        self._filesystem = _ConnectApp(
            filesystem.FilesystemService(), filesystem.endpoints, "/filesystem.Filesystem"
        )
        # Each RPC's kind, to refuse an unknown method or a content type the Connect app cannot
        # serve before it runs (gRPC would need trailers: it answered 200 and raised).
        self._rpc_kinds = {
            path: ep.method.stream_type
            for eps in (
                process.endpoints(process.ProcessService()),
                filesystem.endpoints(filesystem.FilesystemService()),
            )
            for path, ep in eps.items()
        }
        domain = settings.e2b_domain
        self._host = (
            re.compile(rf"(\d{{1,5}})-([a-z0-9]{{1,64}})\.{re.escape(domain)}(?::\d+)?") if domain else None
        )

    async def close(self) -> None:
        """The server stops: end what the face runs (the sandboxes go with the service)."""
        await self.boxes.close()

    # -- the ASGI layer ------------------------------------------------------------------------

    def wrap(self, app: Any) -> Any:
        face = self

        async def layer(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or not face.claims(scope):
                await app(scope, receive, send)
                return
            response = await face.handle(scope, receive, send)
            if response is not None:
                await response(scope, receive, send)

        return layer

    def claims(self, scope: Mapping[str, Any]) -> bool:
        path = str(scope.get("path", ""))
        if path.startswith(_DATA_PREFIXES) or path in _DATA_PATHS or path.startswith("/contexts/"):
            return True
        return _CONTROL.fullmatch(path) is not None

    def _target(self, request: Request) -> tuple[str | None, int | None]:
        sandbox_id = request.headers.get("e2b-sandbox-id")
        port = request.headers.get("e2b-sandbox-port")
        if sandbox_id is None and self._host is not None:
            match = self._host.fullmatch(request.headers.get("host", ""))
            if match is not None:
                port, sandbox_id = match.group(1), match.group(2)
        try:
            return sandbox_id, int(port) if port is not None else None
        except ValueError:
            return sandbox_id, -1

    async def handle(self, scope: Any, receive: Any, send: Any) -> Response | None:
        request = Request(scope, receive)
        path = request.url.path
        sandbox_id, port = self._target(request)
        try:
            if sandbox_id is None:
                match = _CONTROL.fullmatch(path)
                if match is None:
                    return e2b_error(
                        400,
                        "a sandbox request needs the E2b-Sandbox-Id header "
                        "(set E2B_SANDBOX_URL to this server)",
                    )
                return await self._control(request, match.group(1), match.group(2))
            return await self._data(scope, receive, send, request, sandbox_id, port)
        except E2BError as exc:
            return e2b_error(exc.status, exc.message, exc.headers)
        except Exception:  # never a traceback to the client; the log has it
            log.exception("%s %s failed", request.method, path[:200])
            return e2b_error(500, "internal server error (the server log has the details)")

    async def _control(self, request: Request, sandbox_id: str | None, action: str | None) -> Response:
        method, v2 = request.method, request.url.path.startswith("/v2/")
        control = self.control
        await self.boxes.sweep()
        if sandbox_id is None:
            if method == "POST":
                return await control.create(request)
            if method == "GET":
                return await control.list(request, v2=v2)
        elif action is None:
            if method == "GET" and not v2:
                return await control.get(request, sandbox_id)
            if method == "DELETE" and not v2:
                return await control.kill(request, sandbox_id)
        elif method == "POST" and action == "connect":
            return await control.connect(request, sandbox_id)
        elif method == "POST" and action == "timeout" and not v2:
            return await control.set_timeout(request, sandbox_id)
        elif method == "POST" and action == "pause" and not v2:
            return await control.pause(request, sandbox_id)
        elif method == "POST" and action == "resume" and not v2:
            return await control.resume(request, sandbox_id)
        elif action in _UNSUPPORTED_CONTROL:
            # Only the owner learns that the call is not served: anyone else gets the 401 or
            # 404 of an id that is not theirs (a 501 first would tell that the id exists).
            await control.owned(control.token(request), sandbox_id)
            raise unsupported(f"{method} {request.url.path[:120]}")
        raise E2BError(404 if action else 405, f"no route {method} {request.url.path[:120]}")

    async def _data(
        self, scope: Any, receive: Any, send: Any, request: Request, sandbox_id: str, port: int | None
    ) -> Response | None:
        path = request.url.path
        if port is None:
            port = INTERPRETER_PORT if path == "/execute" or path.startswith("/contexts") else ENVD_PORT
        owner = self.boxes.live(sandbox_id)
        if owner is None or not self._authorized(request, owner, path):
            # No existence oracle: a sandbox that is gone, never was, or is asked about without
            # its access token (none, a wrong one, another sandbox's, a bad signature) gets one
            # answer, E2B's proxy answer for a sandbox that does not exist.  Not 401: the server
            # forgets an ended sandbox's token, so it cannot tell a wrong token from the right
            # one of a sandbox that ended, and the SDK's is_running() needs this 502 then.
            # /health too: the SDKs send the token with it (docs/e2b.md, "Credentials").  The
            # message keeps "was not found" (what the SDKs look for) and names the other cause.
            return envd_error(502, f"{not_found_message(sandbox_id)} (or this is not its access token)")
        if port not in (ENVD_PORT, INTERPRETER_PORT):
            return envd_error(502, f"The sandbox {owner.id} is running but port {port} is not open")
        if path == "/health":
            return Response(status_code=204) if port == ENVD_PORT else PlainTextResponse("OK")
        owner.entry.lease.touch()  # every call is use: it renews an idle lease
        if port == INTERPRETER_PORT:
            if path == "/execute" and request.method == "POST":
                return await self.interpreter.execute(request, owner)
            if path == "/contexts" or path.startswith("/contexts/"):
                return await self.interpreter.contexts(request, owner, path[len("/contexts/") :])
            return PlainTextResponse(f"no route {request.method} {path[:100]}", 404)
        if path == "/files":
            if request.method == "GET":
                return await download(request, owner)
            if request.method == "POST":
                with owner.entry.lease.held():  # an upload under way is use, until its client goes
                    return await upload(request, owner, self.settings.max_upload_bytes)
            return envd_error(405, f"{request.method} /files is not allowed")
        app = self._process if path.startswith(_DATA_PREFIXES[0]) else self._filesystem
        if path.startswith(_DATA_PREFIXES) and request.method == "POST":
            refused = rpc_refusal(self._rpc_kinds.get(path), path, request.headers.get("content-type"))
            if refused is not None:
                return refused
            reset = CURRENT.set(owner)
            try:
                await app(scope, receive, send)
            finally:
                CURRENT.reset(reset)
            return None
        return envd_error(404, f"no route {request.method} {path[:100]}")

    def _authorized(self, request: Request, owner: Box, path: str) -> bool:
        given = request.headers.get("x-access-token")
        if given is None:
            given = request.headers.get("e2b-traffic-access-token")
        if given is not None:
            return owner.token_matches(given)
        if path != "/files":
            return False
        return _signature_ok(request, owner)


def _signature_ok(request: Request, owner: Box) -> bool:
    """A ``/files`` URL signed with the sandbox's access token (E2B's ``download_url``/``upload_url``)."""
    query = request.query_params
    signature = query.get("signature")
    if not signature:
        return False
    path = query.get("path", "")
    user = query.get("username", "")
    operation = "read" if request.method == "GET" else "write"
    expiration = query.get("signature_expiration")
    raw = f"{path}:{operation}:{user}:{owner.access_token}"
    if expiration:
        if not expiration.isdigit() or int(expiration) < time.time():
            return False
        raw += f":{expiration}"
    expected = "v1_" + base64.b64encode(hashlib.sha256(raw.encode("utf-8")).digest()).rstrip(b"=").decode(
        "ascii"
    )
    return hmac.compare_digest(expected.encode(), signature.encode())


__all__ = ["E2BFace"]
