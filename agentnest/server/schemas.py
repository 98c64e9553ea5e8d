"""Wire models of the HTTP API, shared by ``server/app.py`` and ``runtime/remote.py``.

Pydantic lives here and nowhere else in AgentNest.  Request models forbid
unknown fields (a typo is an error, never silently ignored) and bound every
string and list, so a client cannot make the server allocate without limit
before a handler even runs.

Errors travel as ``{"detail": message, "code": code}`` with a stable code
from :data:`ERROR_CODES` (the closed table lives in :mod:`agentnest.errors`
and is exported here too); the client rebuilds the exception from that
table and never imports a class a peer names.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ERROR_CODES, error_code, rebuild_error

# -- shared field types --------------------------------------------------------------

Size = Annotated[
    int | str,
    Field(description="a size such as '512m', '1g' or a byte count", examples=["256m"]),
]
Seconds = Annotated[float, Field(gt=0, le=7 * 24 * 3600, description="seconds")]
EnvName = Annotated[str, Field(min_length=1, max_length=128)]
EnvValue = Annotated[str, Field(max_length=128 * 1024)]
ShortText = Annotated[str, Field(min_length=1, max_length=512)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorOut(BaseModel):
    """An error: a message for people and a stable code for programs."""

    detail: str
    code: str


class NetworkIn(_Request):
    """The network a sandbox asks for; the token's ceiling decides whether it may."""

    mode: Literal["denied", "allowlist", "open"] = "denied"
    domains: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(default=[], max_length=256)
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(default=[80, 443], max_length=64)
    subdomains: bool = Field(
        default=True,
        description="a listed name also admits the names below it (NetworkPolicy.subdomains); "
        "false admits exactly the names listed",
    )


class PolicyIn(_Request):
    """Narrowing of the token's ceiling for one sandbox (never more than it)."""

    max_output_bytes: int | None = Field(default=None, ge=1024, le=1 << 34)
    max_file_bytes: int | None = Field(default=None, ge=1024, le=1 << 36)
    require_image_digest: bool = False


class CreateSandbox(_Request):
    """A new sandbox.  Every field is optional: the server's defaults apply."""

    image: ShortText | None = None
    backend: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        default=None, description="one of the server's backends the token may use (GET /v1/info)"
    )
    timeout: Seconds | None = Field(default=None, description="lifetime in seconds")
    memory: Size | None = None
    cpus: float | None = Field(default=None, gt=0, le=1024)
    pids: int | None = Field(default=None, ge=1, le=1 << 22)
    workspace_size: Size | None = None
    scratch_size: Size | None = None
    workdir: Annotated[str, Field(min_length=1, max_length=256)] = "/workspace"
    read_only_root: bool = True
    environment: dict[EnvName, EnvValue] = Field(default={}, max_length=256)
    secrets: dict[EnvName, EnvValue] = Field(
        default={}, max_length=64, description="environment values redacted from every output"
    )
    secret_files: dict[EnvName, EnvValue] = Field(
        default={}, max_length=64, description="secrets written to files; NAME_FILE holds the path"
    )
    network: NetworkIn = NetworkIn()
    policy: PolicyIn = PolicyIn()
    max_wait: float | None = Field(
        default=None,
        ge=0,
        le=600,
        description="seconds to wait in the admission queue when the server or the tenant is full "
        "(default: the tenant's default_wait; 0: answer at once; more than the tenant's max_wait is refused)",
    )
    priority: Literal["high", "normal", "low"] | None = Field(
        default=None, description="the request's band: the tenant's own (default) or a lower one"
    )
    lease: Literal["deadline", "idle", "session"] = Field(
        default="deadline",
        description="when the server reaps it before its deadline: never ('deadline'), after "
        "idle_timeout seconds without use or keepalive ('idle'), or once no connection of the client "
        "holds it ('session': an open agent channel, command stream or GET .../lease stream)",
    )
    pool: Annotated[str, Field(min_length=1, max_length=40)] | None = Field(
        default=None,
        description="claim a warm sandbox of this pool (GET /v1/info lists them); the pool fixes "
        "image, backend and resources, so those fields cannot be given with it",
    )
    when_drained: Literal["cold", "wait", "fail"] | None = Field(
        default=None,
        description="when the pool has no warm sandbox: start one cold, wait up to max_wait for the "
        "next warm one, or fail with 429 pool_empty (default: the pool's setting)",
    )
    idle_timeout: float | None = Field(
        default=None,
        gt=0,
        le=24 * 3600,
        description="seconds of no use before an 'idle' lease lapses (default 300)",
    )


class LeaseOut(BaseModel):
    """A sandbox's lease: what reaps it before its deadline."""

    kind: Literal["deadline", "idle", "session"]
    expires_at: float | None = Field(
        description="when the lease lapses if nothing renews it (None: not by itself, e.g. while held)"
    )
    idle_timeout: float | None = None
    holders: int = Field(description="the client's connections holding it now")


class SandboxOut(BaseModel):
    """A sandbox of the calling token."""

    id: str
    image: str
    backend: str
    oci_runtime: str | None
    created: float
    deadline: float
    expires_in: float
    running: bool
    memory: int
    cpus: float
    pids: int
    network: str
    read_only_root: bool
    exit_reason: str | None = None
    lease: LeaseOut | None = None


class SandboxList(BaseModel):
    sandboxes: list[SandboxOut]
    max_sandboxes: int
    available: int


class ExecIn(_Request):
    """A command: exactly one of ``argv``, ``shell`` or ``python``."""

    argv: list[Annotated[str, Field(max_length=128 * 1024)]] | None = Field(
        default=None, min_length=1, max_length=4096
    )
    shell: Annotated[str, Field(max_length=1024 * 1024)] | None = None
    python: Annotated[str, Field(max_length=4 * 1024 * 1024)] | None = None
    timeout: Seconds | None = None
    env: dict[EnvName, EnvValue] = Field(default={}, max_length=256)
    cwd: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    stdin: Annotated[str, Field(max_length=8 * 1024 * 1024)] | None = None


class ExecOut(BaseModel):
    """A finished command (also the ``exit`` event of a stream)."""

    stdout: str
    stderr: str
    exit_code: int
    ok: bool
    duration: float
    timed_out: bool
    truncated: bool
    signal: int | None = None


class SessionOut(BaseModel):
    id: str


class SessionRunIn(_Request):
    code: Annotated[str, Field(max_length=4 * 1024 * 1024)]
    timeout: Seconds | None = None


class SessionRunOut(BaseModel):
    ok: bool
    stdout: str
    stderr: str
    error: str | None
    result: str | None


class FileEntry(BaseModel):
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float


class FileList(BaseModel):
    entries: list[FileEntry]


class ForkIn(_Request):
    timeout: Seconds | None = None


class ExtendIn(_Request):
    seconds: Seconds


class ExtendOut(BaseModel):
    deadline: float


class RestoreOut(BaseModel):
    image: str | None
    files: int | None = None
    size: int
    sha256: str


class Deleted(BaseModel):
    id: str
    destroyed: bool


class BackendOut(BaseModel):
    name: str
    oci_runtime: str | None
    capabilities: list[str]
    default: bool


class PoolOut(BaseModel):
    """A warm pool a create may claim from (``"pool": name``)."""

    name: str
    image: str
    backend: str
    memory: int
    cpus: float
    pids: int
    ready: int
    max: int
    when_drained: str


class InfoOut(BaseModel):
    """What the server offers, and the calling token's ceiling."""

    version: str
    token_id: str
    token_name: str
    default_image: str
    backends: list[BackendOut]
    ceiling: dict[str, Any]
    max_body_bytes: int
    max_upload_bytes: int
    tenant: str = "default"
    pools: list[PoolOut] = []


class TenantIn(_Request):
    """A new tenant (``POST /v1/tenants``); unset fields take the defaults shown in docs/server.md."""

    name: Annotated[str, Field(min_length=1, max_length=40)]
    weight: float | None = Field(default=None, gt=0, le=1_000_000)
    priority: Literal["high", "normal", "low"] | None = None
    max_sandboxes: int | None = Field(default=None, ge=0, le=1_000_000)
    max_memory: Size | None = None
    max_cpus: float | None = Field(default=None, ge=0, le=1_000_000)
    max_lifetime: float | None = Field(default=None, gt=0, le=365 * 24 * 3600)
    rate: float | None = Field(default=None, gt=0, le=1_000_000)
    burst: int | None = Field(default=None, ge=1, le=1_000_000)
    max_queued: int | None = Field(default=None, ge=0, le=1_000_000)
    default_wait: float | None = Field(default=None, ge=0, le=600)
    max_wait: float | None = Field(default=None, ge=0, le=600)

    def changes(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None and k != "name"}


class TenantUpdate(TenantIn):
    """Changes to a tenant (``PATCH /v1/tenants/{name}``): only the fields given change."""

    name: Annotated[str, Field(min_length=1, max_length=40)] | None = None  # type: ignore[assignment]


class TenantOut(BaseModel):
    """A tenant's settings, what it holds now and what waits in its queue."""

    name: str
    settings: dict[str, Any]
    held_sandboxes: int
    held_memory: int
    held_cpus: float
    queued: int


class TenantList(BaseModel):
    tenants: list[TenantOut]


class HealthOut(BaseModel):
    status: Literal["ok"]
    version: str


class ReadyOut(BaseModel):
    """Readiness: each check is ``ok`` or why not."""

    status: Literal["ready", "not ready"]
    checks: dict[str, str]


class LogsOut(BaseModel):
    logs: str


class NetworkLogOut(BaseModel):
    """Connections the sandbox tried through its egress proxy (docs/egress.md), redacted."""

    events: list[dict[str, Any]]


__all__ = [
    "ERROR_CODES",
    "BackendOut",
    "CreateSandbox",
    "Deleted",
    "ErrorOut",
    "ExecIn",
    "ExecOut",
    "ExtendIn",
    "ExtendOut",
    "FileEntry",
    "FileList",
    "ForkIn",
    "HealthOut",
    "InfoOut",
    "LogsOut",
    "NetworkIn",
    "NetworkLogOut",
    "PolicyIn",
    "RestoreOut",
    "SandboxList",
    "SandboxOut",
    "SessionOut",
    "SessionRunIn",
    "SessionRunOut",
    "error_code",
    "rebuild_error",
]


class AuditEventOut(BaseModel):
    """One record of the manager's audit history (``id`` orders them; it is the paging cursor)."""

    id: int
    event_id: str
    time: float
    tenant: str
    token: str | None
    sandbox_id: str
    """Empty for admission decisions (no sandbox yet)."""
    type: str
    actor: str
    data: dict[str, Any]


class AuditPage(BaseModel):
    events: list[AuditEventOut]
    next: int
    """Pass as ``after`` for the next page (or to follow: only newer events)."""


class UsageOut(BaseModel):
    """What one tenant used in the window (held time counted while the sandbox existed)."""

    tenant: str
    creates: int
    sandbox_seconds: float
    cpu_seconds: float
    memory_gib_seconds: float
    rejections: int


class UsageList(BaseModel):
    since: float
    until: float
    usage: list[UsageOut]
