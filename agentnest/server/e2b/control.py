"""E2B's control plane (REST): create, connect, get, list, kill, set-timeout, pause and resume.

Each call is authenticated with ``X-API-KEY`` against the server's tokens
(:func:`~.state.secret_of`: ``e2b_<hex>`` or the raw secret) and then goes
through the same :class:`~agentnest.server.service.Service` as a native
call: the token's ceiling, its tenant's quotas, the admission queue, warm
pools, the audit log.  Every error is E2B's JSON ``{"code", "message"}``
with the status the SDK maps to its exception types (401
``AuthenticationException``, 404 ``SandboxNotFoundException``, 429
``RateLimitException`` with ``Retry-After``, 503 ``ServiceBusyException``).
A sandbox of another token is 404, exactly as one that never existed.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from math import ceil
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import AdmissionRefusedError, AgentNestError, ConfigurationError
from .. import schemas as s
from ..auth import AuthError, Token
from ..entries import Entry
from ..inputs import check_env, check_metadata, is_json, media_type
from ..refused import Refused
from .state import ENVD_VERSION, Box, Boxes, E2BTemplate, secret_of

if TYPE_CHECKING:
    from ..service import Service
    from ..settings import ServerSettings

#: The oldest Python SDK served: 2.35 moved envd calls to the official ``connectrpc``
#: client; the vendored client before it fails on response fields it does not know.
MIN_SDK = (2, 35, 0)
_SDK_AGENT = re.compile(r"e2b-python-sdk/(\d+)\.(\d+)\.(\d+)")
#: Sandboxes one list page holds at most (E2B's own maximum).
MAX_PAGE = 100
#: How long a create's ``Idempotency-Key`` is remembered.
IDEMPOTENCY_TTL = 600.0
_ALL_TRAFFIC = ("0.0.0.0/0", "::/0")


class E2BError(Exception):
    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def e2b_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=dict(headers or {}))


def from_agentnest(exc: AgentNestError) -> E2BError:
    status = s.ERROR_CODES[s.error_code(exc)][0]
    headers = {}
    if isinstance(exc, AdmissionRefusedError) and exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    if status == 403:
        status = 400  # a policy refusal: E2B answers a request it will not serve with 400
    return E2BError(status, str(exc), headers)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class NetworkIn(_Body):
    allow_out: list[str] | None = Field(default=None, alias="allowOut", max_length=256)
    deny_out: list[str] | None = Field(default=None, alias="denyOut", max_length=256)
    allow_public_traffic: bool | None = Field(default=None, alias="allowPublicTraffic")
    rules: Any = None


class NewSandbox(_Body):
    template_id: str = Field(alias="templateID", min_length=1, max_length=256)
    timeout: int | None = Field(default=None, ge=1, le=30 * 86400)
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    metadata: dict[str, str] | None = Field(default=None, max_length=64)
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars", max_length=1024)
    allow_internet_access: bool | None = None
    network: NetworkIn | None = None
    mcp: Any = None
    volume_mounts: list[Any] | None = Field(default=None, alias="volumeMounts")
    secure: bool | None = None


class TimeoutIn(_Body):
    timeout: int = Field(ge=0, le=30 * 86400)


class ConnectIn(_Body):
    timeout: int | None = Field(default=None, ge=0, le=30 * 86400)


async def _json(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    kind = request.headers.get("content-type")
    if raw and not is_json(kind):
        raise E2BError(415, f"unsupported Content-Type {media_type(kind)[:80]!r}: send application/json")
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise E2BError(400, f"malformed request: {where}: {first.get('msg', 'invalid')}") from None


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


class ControlPlane:
    def __init__(self, service: Service, settings: ServerSettings, boxes: Boxes) -> None:
        self.service = service
        self.settings = settings
        self.boxes = boxes
        self._idempotent: dict[tuple[str, str], tuple[float, str]] = {}

    # -- auth ----------------------------------------------------------------------------

    def token(self, request: Request) -> Token:
        agent = _SDK_AGENT.search(request.headers.get("user-agent", ""))
        if agent is not None and tuple(int(x) for x in agent.groups()) < MIN_SDK:
            found = ".".join(agent.groups())
            raise E2BError(
                400,
                f"e2b SDK {found} is not supported by this server: use e2b 2.35.0 or later "
                "(pip install -U e2b); docs/e2b.md lists the versions tested",
            )
        key = request.headers.get("x-api-key")
        if not key:
            scheme, _, value = request.headers.get("authorization", "").partition(" ")
            key = value.strip() if scheme.lower() == "bearer" else ""
        if not key:
            raise E2BError(
                401, "missing API key: send X-API-KEY (a token from `agentnest serve token create`)"
            )
        try:
            token = self.settings.tokens.authenticate(secret_of(key.strip()))
        except AuthError as exc:
            raise E2BError(401, f"invalid API key: {exc}") from None
        self.service.tracing.annotate(tenant=token.tenant, token=token.id)
        return token

    async def owned(self, token: Token, sandbox_id: str) -> Entry:
        service = self.service
        try:
            entry = service.get(token, sandbox_id)
        except Refused:
            raise E2BError(404, f"sandbox {sandbox_id[:64]!r} not found") from None
        if entry.deadline <= time.time():
            await service.destroy(entry)
            raise E2BError(404, f"sandbox {sandbox_id[:64]!r} not found")
        entry.lease.touch()
        return entry

    # -- descriptions --------------------------------------------------------------------

    def _sandbox(self, owner: Box) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "templateID": owner.template,
            "sandboxID": owner.id,
            "clientID": "agentnest",
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": owner.access_token,
            # The code interpreter's context calls carry only this one (E2B-Traffic-Access-Token):
            # without it they would have to be open to anyone who knows the sandbox id.
            "trafficAccessToken": owner.access_token,
            "alias": owner.template,
        }
        if self.settings.e2b_domain:
            doc["domain"] = self.settings.e2b_domain
        return doc

    def _detail(self, owner: Box, *, detail: bool) -> dict[str, Any]:
        entry = owner.entry
        config = entry.sandbox.config
        doc: dict[str, Any] = {
            "templateID": owner.template,
            "alias": owner.template,
            "sandboxID": owner.id,
            "clientID": "agentnest",
            "startedAt": _iso(entry.created),
            "endAt": _iso(entry.deadline),
            "cpuCount": max(1, ceil(config.limits.cpus)),
            "memoryMB": config.limits.memory // 2**20,
            "diskSizeMB": (config.limits.workspace or 0) // 2**20,
            "state": "paused" if entry.sandbox.paused else "running",
            "envdVersion": ENVD_VERSION,
            "metadata": owner.metadata,
            "allowInternetAccess": config.network.mode.value == "open",
        }
        if detail:
            doc["envdAccessToken"] = owner.access_token
            if self.settings.e2b_domain:
                doc["domain"] = self.settings.e2b_domain
        return doc

    # -- create --------------------------------------------------------------------------

    def _network(self, body: NewSandbox, token: Token) -> s.NetworkIn | None:
        """E2B's internet options as our NetworkPolicy ask (the token's ceiling then decides).

        ``allow_internet_access=True`` is the SDK's default (sent by every create of
        SDK 2.50 and earlier), so it asks for as much as the ceiling allows: ``open``
        where the token may have it, else ``denied``; the sandbox's detail then says
        ``allowInternetAccess: false``.  A list of names (``allow_out``) is an explicit
        ask: beyond the ceiling it is refused.
        """
        net = body.network
        if net is not None and (net.rules or net.allow_public_traffic is False):
            raise E2BError(400, "network rules and allowPublicTraffic are not supported by AgentNest")
        deny = [d.strip() for d in (net.deny_out or [])] if net is not None else []
        allow = [a.strip() for a in (net.allow_out or [])] if net is not None else []
        if deny and not set(deny) <= set(_ALL_TRAFFIC):
            raise E2BError(
                400,
                "denyOut of single addresses is not supported: AgentNest's egress is an allowlist; "
                "send denyOut ['0.0.0.0/0'] with the names to allow in allowOut",
            )
        if body.allow_internet_access is False or deny:
            if allow:
                return s.NetworkIn(mode="allowlist", domains=allow)
            return s.NetworkIn(mode="denied")
        if body.allow_internet_access is True:
            return s.NetworkIn(mode="open" if "open" in token.ceiling.network else "denied")
        return None  # not asked: the template's (a pool's) or the server's default (denied)

    def _template(self, name: str) -> E2BTemplate:
        templates = self.settings.e2b_templates
        template = templates.get(name)
        if template is None:
            known = ", ".join(sorted(templates)) or "none"
            raise E2BError(400, f"unknown template {name[:128]!r}: this server offers {known}")
        return template

    async def create(self, request: Request) -> Response:
        token = self.token(request)
        body: NewSandbox = await _json(request, NewSandbox)
        for field, what in (("auto_pause", "autoPause"), ("mcp", "mcp"), ("volume_mounts", "volumeMounts")):
            if getattr(body, field):
                raise E2BError(400, f"{what} is not supported by AgentNest")
        try:
            # The native API's rule for names: a NUL or '=' in one would break every command later.
            check_env(body.env_vars or {}, "envVars")
            check_metadata(body.metadata or {})
        except ConfigurationError as exc:
            raise E2BError(400, str(exc)) from None
        key = request.headers.get("idempotency-key")
        if key:
            now = time.time()
            self._idempotent = {k: v for k, v in self._idempotent.items() if v[0] > now}
            seen = self._idempotent.get((token.id, key))
            owner = self.boxes.get(seen[1]) if seen else None
            if owner is not None and self.boxes.alive(owner):
                return JSONResponse(self._sandbox(owner), status_code=201)
        template = self._template(body.template_id)
        ask = template.create_fields()
        if body.timeout is not None:
            ask["timeout"] = float(body.timeout)
        network = self._network(body, token)
        if network is not None:
            ask["network"] = network
        try:
            create = s.CreateSandbox(**ask)
        except ValidationError as exc:
            raise E2BError(400, f"malformed request: {exc.errors()[0].get('msg', 'invalid')}") from None

        async def client_gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        try:
            entry = await self.service.create(token, create, client_gone=client_gone)
        except AgentNestError as exc:
            raise from_agentnest(exc) from None
        except Refused as exc:
            raise E2BError(exc.status_code, str(exc.detail), exc.headers) from None
        owner = Box(entry, body.template_id, dict(body.metadata or {}), dict(body.env_vars or {}))
        self.boxes.add(owner)
        if key:
            self._idempotent[(token.id, key)] = (time.time() + IDEMPOTENCY_TTL, owner.id)
        return JSONResponse(self._sandbox(owner), status_code=201)

    # -- one sandbox ---------------------------------------------------------------------

    async def get(self, request: Request, sandbox_id: str) -> Response:
        owner = self.boxes.of(await self.owned(self.token(request), sandbox_id))
        return JSONResponse(self._detail(owner, detail=True))

    async def kill(self, request: Request, sandbox_id: str) -> Response:
        token = self.token(request)
        entry = await self.owned(token, sandbox_id)
        await self.boxes.forget(sandbox_id)
        await self.service.destroy(entry)
        return Response(status_code=204)

    async def set_timeout(self, request: Request, sandbox_id: str) -> Response:
        token = self.token(request)
        body: TimeoutIn = await _json(request, TimeoutIn)
        entry = await self.owned(token, sandbox_id)
        await self._deadline(token, entry, time.time() + body.timeout, shorten=True)
        return Response(status_code=204)

    async def _deadline(self, token: Token, entry: Entry, target: float, *, shorten: bool) -> None:
        """Set the sandbox to end at ``target`` (E2B's timeout counts from now and may shorten it)."""
        if not shorten and target <= entry.deadline:
            return
        lifetime = target - entry.claimed_at
        if lifetime > token.ceiling.max_timeout:
            raise E2BError(
                400,
                f"a lifetime of {lifetime:.0f}s is beyond this token's max_timeout "
                f"{token.ceiling.max_timeout:g}s",
            )
        sandbox = entry.sandbox
        try:
            if target > sandbox.deadline:
                await sandbox.extend(target - sandbox.deadline)
        except AgentNestError as exc:
            raise from_agentnest(exc) from None
        entry.until = target

    async def connect(self, request: Request, sandbox_id: str) -> Response:
        token = self.token(request)
        body: ConnectIn = await _json(request, ConnectIn)
        entry = await self.owned(token, sandbox_id)
        resumed = False
        if entry.sandbox.paused:
            try:
                await entry.sandbox.resume()
            except AgentNestError as exc:
                raise from_agentnest(exc) from None
            resumed = True
        if body.timeout:
            await self._deadline(token, entry, time.time() + body.timeout, shorten=False)
        owner = self.boxes.of(entry)
        return JSONResponse(self._sandbox(owner), status_code=201 if resumed else 200)

    async def resume(self, request: Request, sandbox_id: str) -> Response:
        response = await self.connect(request, sandbox_id)
        response.status_code = 201
        return response

    async def pause(self, request: Request, sandbox_id: str) -> Response:
        entry = await self.owned(self.token(request), sandbox_id)
        if entry.sandbox.paused:
            raise E2BError(409, f"sandbox {sandbox_id[:64]!r} is already paused")
        try:
            await entry.sandbox.pause()
        except AgentNestError as exc:
            raise from_agentnest(exc) from None
        return Response(status_code=204)

    # -- lists ---------------------------------------------------------------------------

    async def list(self, request: Request, *, v2: bool) -> Response:
        token = self.token(request)
        service = self.service
        await service.reap()
        query = request.query_params
        wanted_meta = dict(parse_qsl(query.get("metadata", ""), keep_blank_values=True))
        states = {x for x in query.get("state", "running,paused" if v2 else "running").split(",") if x}
        if not states <= {"running", "paused"}:
            raise E2BError(400, f"state must be running and/or paused, not {query.get('state', '')[:40]!r}")
        try:
            limit = int(query.get("limit", MAX_PAGE))
        except ValueError:
            raise E2BError(400, "limit must be a number") from None
        if not 1 <= limit <= MAX_PAGE:
            raise E2BError(400, f"limit must be 1 to {MAX_PAGE}")
        mine = sorted(
            (e for e in service.entries.values() if e.token_id == token.id),
            key=lambda e: (e.created, e.sandbox.id),
        )
        if query.get("order") == "desc":
            mine.reverse()
        start = 0
        if query.get("nextToken"):
            start = _page_start(query["nextToken"], [e.sandbox.id for e in mine])
        docs: list[dict[str, Any]] = []
        next_token = None
        for index in range(start, len(mine)):
            entry = mine[index]
            owner = self.boxes.of(entry)
            doc = self._detail(owner, detail=False)
            if doc["state"] not in states or any(owner.metadata.get(k) != v for k, v in wanted_meta.items()):
                continue
            if query.get("template") and owner.template != query["template"]:
                continue
            if len(docs) == limit:
                next_token = base64.urlsafe_b64encode(entry.sandbox.id.encode()).decode()
                break
            docs.append(doc)
        headers = {"X-Next-Token": next_token} if (next_token and v2) else {}
        return JSONResponse(docs, headers=headers)


def _page_start(token: str, ids: list[str]) -> int:
    try:
        sandbox_id = base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise E2BError(400, "nextToken is not one this server gave") from None
    if sandbox_id not in ids:
        # The sandbox the page started at is gone: nothing is skipped, the list starts over.
        raise E2BError(400, "nextToken is no longer valid (its sandbox ended); list again from the start")
    return ids.index(sandbox_id)


def unsupported(what: str) -> E2BError:
    return E2BError(501, f"{what} is not supported by AgentNest's E2B API")


__all__ = ["ControlPlane", "E2BError", "e2b_error", "unsupported"]
