"""What the E2B face keeps per sandbox (:class:`Box`), its keys, and how E2B's paths and users map onto ours.

A :class:`Box` is created when a sandbox is created or connected to through
the E2B API.  It holds the per-sandbox data-plane secret (E2B's
``envdAccessToken``), the template name and metadata the client gave, the
environment E2B applies to every command, and the running processes,
code contexts and directory watchers of the data plane.  It lives as long
as the server's :class:`~agentnest.server.entries.Entry` of the sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import posixpath
import re
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError
from ...profiles import Profile

if TYPE_CHECKING:
    from ..entries import Entry

#: E2B's home directory: the sandbox's workspace stands in for it.
HOME = "/home/user"
#: The user names E2B clients send that mean "the sandbox's own user".  E2B's
#: default user is ``user``; every AgentNest sandbox runs as one unprivileged
#: user, so there is no other to switch to, and never root.
USERS = frozenset({"", "user"})
#: The envd version advertised: its feature gates in the SDK (stdin 0.3.0,
#: default user 0.4.0, close_stdin 0.5.2, octet-stream uploads 0.5.7) match
#: what is served.  File metadata (0.6.2) and watch entries (0.6.3) are not
#: served, and the SDK refuses them itself below those versions.
ENVD_VERSION = "0.5.7"
_KEY = re.compile(r"e2b_((?:[0-9a-f]{2})+)")


def e2b_key(secret: str) -> str:
    """The E2B API key for a token secret: ``e2b_`` and the secret's hex.

    Every E2B SDK accepts this shape (2.25 to 2.45 refuse any other); the raw
    secret works too with the SDKs that check nothing (before 2.25, from 2.46).
    """
    return "e2b_" + secret.encode("utf-8").hex()


def secret_of(key: str) -> str:
    """The token secret an ``X-API-KEY`` carries (either shape)."""
    match = _KEY.fullmatch(key)
    if match is None:
        return key
    try:
        return bytes.fromhex(match.group(1)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return key


def basic_user(header: str | None) -> str | None:
    """The user of an ``Authorization: Basic base64("user:")`` header (None: no header)."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return "\x00invalid"
    return decoded.partition(":")[0]


def user_problem(user: str | None) -> str | None:
    """Why ``user`` cannot be served (None: it can)."""
    if user is None or user in USERS:
        return None
    if user == "root":
        return (
            "commands and files run as the sandbox's unprivileged user; "
            "root is not available in AgentNest sandboxes"
        )
    return f"unknown user {user[:64]!r}: AgentNest sandboxes have one user, 'user' (the default)"


_FORMS = "NAME=pool:POOL, NAME=image:IMAGE[@BACKEND], NAME=profile:PROFILE or NAME=default"
#: The policy settings a profile may carry to the server (the rest are the server's own).
_POLICY_CARRIED = frozenset({"network", "max_output_bytes", "max_file_bytes", "read_only_root"})


@dataclass(frozen=True)
class E2BTemplate:
    """What an E2B template name means on this server: a warm pool, an image, or a profile.

    ``ServerSettings(e2b_templates={"base": E2BTemplate(pool="warm")})``;
    on the command line ``agentnest serve --e2b-template base=pool:warm``.  A
    :class:`~agentnest.profiles.Profile` gives its image, backend, lifetime,
    resources, environment, network and output/file limits; the token's
    ceiling still decides.  A profile that sets what a server cannot apply per
    sandbox (approval rules, a seccomp or AppArmor profile, ``verify``...) is
    refused when the server starts, never silently thinned.
    """

    image: str | None = None
    """None: the server's default image (or the profile's)."""
    pool: str | None = None
    """Claim from this warm pool (its image, backend and limits)."""
    backend: str | None = None
    """None: the server's default backend (or the profile's)."""
    profile: Profile | None = None

    def __post_init__(self) -> None:
        if self.pool is not None and (self.image, self.backend, self.profile) != (None, None, None):
            raise ConfigurationError(
                "an E2B template names a pool, or an image, backend or profile; not both"
            )
        for name in ("image", "pool", "backend"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigurationError(f"E2B template {name} must be a non-empty string")
        if self.profile is not None:
            _profile_fields(self.profile)  # refuses what cannot be carried

    def create_fields(self) -> dict[str, Any]:
        """The native create's fields (``CreateSandbox``) this template stands for."""
        if self.pool is not None:
            return {"pool": self.pool}
        out = _profile_fields(self.profile) if self.profile is not None else {}
        out.update({k: v for k, v in (("image", self.image), ("backend", self.backend)) if v is not None})
        return out

    @classmethod
    def parse(cls, text: str, profiles: Callable[[str], Profile] | None = None) -> tuple[str, E2BTemplate]:
        """One of :data:`_FORMS`; ``profiles`` finds a profile by name."""
        name, sep, what = text.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}", name):
            raise ConfigurationError(f"--e2b-template {text!r}: write {_FORMS}")
        kind, _, value = what.partition(":")
        if what == "default":
            return name, cls()
        if kind == "pool" and value:
            return name, cls(pool=value)
        if kind == "image" and value:
            image, _, backend = value.rpartition("@") if "@" in value.split("/")[-1] else (value, "", "")
            return name, cls(image=image or value, backend=backend or None)
        if kind == "profile" and value:
            if profiles is None:
                raise ConfigurationError(f"--e2b-template {text!r}: no profile file to find {value!r} in")
            return name, cls(profile=profiles(value))
        raise ConfigurationError(f"--e2b-template {text!r}: write {_FORMS}")


def _profile_fields(profile: Profile) -> dict[str, Any]:
    """A profile as native create fields, or ConfigurationError naming what the server cannot apply."""
    from ...policy import SecurityPolicy

    policy, default = profile.security_policy, SecurityPolicy()
    cannot = [f"security_policy.{f.name}" for f in fields(SecurityPolicy) if f.name not in _POLICY_CARRIED
              and getattr(policy, f.name) != getattr(default, f.name)]  # fmt: skip
    cannot += [k for k in ("approvals", "verify", "workspace") if getattr(profile, k) not in ((), None)]
    if policy.network.cidrs:
        cannot.append("network cidrs")
    if cannot:
        raise ConfigurationError(
            f"profile {profile.name!r} sets {', '.join(cannot)}, which agentnest serve cannot apply per "
            "sandbox; use a profile without them for an E2B template (the token's ceiling governs the rest)"
        )
    out: dict[str, Any] = {}
    for key in ("image", "backend", "timeout", "memory", "cpus", "pids", "workspace_size", "scratch_size"):
        value = getattr(profile, key)
        if value is not None:
            out[key] = value
    if profile.read_only_root is not None:
        out["read_only_root"] = profile.read_only_root
    if profile.environment:
        out["environment"] = dict(profile.environment)
    net = policy.network
    out["network"] = {
        "mode": net.mode.value,
        "domains": list(net.domains),
        "ports": list(net.ports),
        "subdomains": net.subdomains,
    }
    limits = {k: getattr(policy, k) for k in ("max_output_bytes", "max_file_bytes")}
    out["policy"] = {k: v for k, v in limits.items() if v != getattr(default, k)}
    return out


#: The templates every server has unless configured otherwise: E2B's defaults
#: (``Sandbox`` and the code interpreter's) on the server's default image.
DEFAULT_TEMPLATES: Mapping[str, E2BTemplate] = {"base": E2BTemplate(), "code-interpreter-v1": E2BTemplate()}


@dataclass
class Box:
    """One sandbox as the E2B face knows it."""

    entry: Entry
    template: str
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    access_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    # The data plane's own objects (process.Proc, interpreter.Context, watch.Watcher), typed
    # there: this module knows none of the features, so nothing here imports them.
    processes: dict[int, Any] = field(default_factory=dict)
    contexts: dict[str, Any] = field(default_factory=dict)
    watchers: dict[str, Any] = field(default_factory=dict)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    next_pid: int = 1000
    default_context: str | None = None
    opening: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the default code context is opened (two first runs open one, not two)."""

    @property
    def id(self) -> str:
        return self.entry.sandbox.id

    @property
    def workdir(self) -> str:
        return self.entry.sandbox.config.workdir.rstrip("/") or "/"

    def token_matches(self, given: str | None) -> bool:
        # Constant time: the access token is the data plane's only credential.
        return given is not None and hmac.compare_digest(given.encode(), self.access_token.encode())

    def sandbox_path(self, path: str | None) -> str:
        """An E2B path as a path in the sandbox: ``/home/user`` is the workspace; relative is below it."""
        if not path:
            path = HOME
        if not path.startswith("/"):
            path = HOME + "/" + path
        norm = posixpath.normpath(path)
        if norm.startswith("//"):
            norm = norm[1:]
        if norm == HOME or norm.startswith(HOME + "/"):
            norm = self.workdir + norm[len(HOME) :]
        return norm

    def e2b_path(self, path: str) -> str:
        """A sandbox path (absolute, or relative to the workspace) as E2B shows it."""
        root = self.workdir
        if not path.startswith("/"):
            path = posixpath.join(root, path) if path not in ("", ".") else root
        if path == root:
            return HOME
        if path.startswith(root + "/"):
            return HOME + path[len(root) :]
        return path

    def new_pid(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def close(self) -> None:
        """The sandbox is gone: stop what the face runs for it."""
        for watcher in list(self.watchers.values()):
            watcher.stop()
        self.watchers.clear()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Boxes:
    """The E2B state of a server's sandboxes, by id; a box lives as long as its sandbox's entry."""

    def __init__(self, entries: Mapping[str, Entry]) -> None:
        self._entries = entries
        self._boxes: dict[str, Box] = {}

    def add(self, owner: Box) -> None:
        self._boxes[owner.id] = owner

    def get(self, sandbox_id: str) -> Box | None:
        return self._boxes.get(sandbox_id)

    def alive(self, owner: Box) -> bool:
        return self._entries.get(owner.id) is owner.entry and owner.entry.deadline > time.time()

    def live(self, sandbox_id: str) -> Box | None:
        """The box of a sandbox that still runs (None: gone, or never known here)."""
        owner = self._boxes.get(sandbox_id)
        return owner if owner is not None and self.alive(owner) else None

    def of(self, entry: Entry) -> Box:
        """The E2B state of a sandbox of the caller (made on first use, e.g. a natively created one)."""
        owner = self._boxes.get(entry.sandbox.id)
        if owner is None or owner.entry is not entry:
            owner = Box(entry, "base")
            self._boxes[owner.id] = owner
        return owner

    async def forget(self, sandbox_id: str) -> None:
        owner = self._boxes.pop(sandbox_id, None)
        if owner is not None:
            await owner.close()

    async def sweep(self) -> None:
        """Drop the state of sandboxes that ended (destroyed, reaped, natively or not)."""
        for sandbox_id, owner in list(self._boxes.items()):
            if self._entries.get(sandbox_id) is not owner.entry:
                await self.forget(sandbox_id)

    async def close(self) -> None:
        for sandbox_id in list(self._boxes):
            await self.forget(sandbox_id)
