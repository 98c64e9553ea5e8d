"""Bearer tokens for ``agentnest serve``: a file of hashed tokens, each with a policy ceiling.

A token's secret is ``ant_<id>_<random>``: 32 random bytes from
:mod:`secrets`, shown once when it is created and never stored.  The token
file keeps only its SHA-256.  A fast hash is enough here because the secret
is high-entropy random data (no password to brute-force); the id in the
secret only finds the record, and the hash is compared with
:func:`hmac.compare_digest` (constant time), so neither the lookup nor the
comparison tells an attacker how much of a guess was right.

The file is JSON, written atomically with mode 0600, and re-read whenever it
changes on disk, so ``agentnest serve token revoke`` takes effect on a
running server without a restart.

The ceiling itself is :class:`agentnest.policy.Ceiling`, the one ceiling of
both servers (``serve`` and ``mcp``); it is importable from here as before.
The tenants in the same file and the operator's helpers are in :mod:`.token_admin`.

This module imports no web framework: the command line manages tokens
without the ``server`` extra.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..policy import Ceiling
from .tenants import DEFAULT_TENANT, Tenant, check_tenant_name
from .token_admin import TenantRecords, ceiling_to_dict, default_token_file

#: The prefix of every secret, so that leaked tokens are easy to find (secret scanners).
PREFIX = "ant_"
_ID = re.compile(r"^[a-z0-9]{12}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_SECRET = re.compile(r"^ant_([a-z0-9]{12})_([A-Za-z0-9_-]{43})$")
_FILE_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    """One token as stored (no secret)."""

    id: str
    name: str
    sha256: str
    created: float
    expires: float | None
    ceiling: Ceiling
    tenant: str = DEFAULT_TENANT
    """The tenant it belongs to: its sandboxes count against that tenant's caps."""
    admin: bool = False
    """Whether it may manage tenants over the HTTP API (``/v1/tenants``)."""

    def expired(self, now: float | None = None) -> bool:
        return self.expires is not None and (now if now is not None else time.time()) >= self.expires

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "sha256": self.sha256,
            "created": self.created,
            "expires": self.expires,
            "ceiling": ceiling_to_dict(self.ceiling),
            "tenant": self.tenant,
            "admin": self.admin,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Token:
        try:
            token = cls(
                id=str(data["id"]),
                name=str(data["name"]),
                sha256=str(data["sha256"]),
                created=float(data["created"]),
                expires=None if data.get("expires") is None else float(data["expires"]),
                ceiling=Ceiling.from_dict(data.get("ceiling", {})),
                tenant=check_tenant_name(data.get("tenant", DEFAULT_TENANT)),
                admin=data.get("admin", False) is True,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"invalid token record: {exc}") from None
        if not _ID.fullmatch(token.id) or not re.fullmatch(r"[0-9a-f]{64}", token.sha256):
            raise ConfigurationError(f"invalid token record {token.id!r:.40}")
        return token


class AuthError(Exception):
    """Why a bearer credential was refused (becomes HTTP 401)."""


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class TokenStore(TenantRecords):
    """The token file: create, list, revoke, authenticate, and its tenants.  Thread-safe.

    Example::

        store = TokenStore(Path("tokens.json"))
        token, secret = store.create("ci", Ceiling(max_memory=1 << 30))
        assert store.authenticate(secret).id == token.id
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._tokens: dict[str, Token] = {}
        self._tenants: dict[str, Tenant] = {}
        self._stamp: tuple[int, int, int] | None = None

    # -- file ------------------------------------------------------------------

    def _load(self) -> None:
        """Re-read the file if it changed (revocations apply to a running server)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._tokens, self._tenants, self._stamp = {}, {}, None
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        try:
            doc = json.loads(self.path.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"{self.path}: not a token file ({exc})") from None
        if not isinstance(doc, dict) or doc.get("version") != _FILE_VERSION:
            raise ConfigurationError(f"{self.path}: not a version {_FILE_VERSION} token file")
        records = doc.get("tokens")
        if not isinstance(records, list):
            raise ConfigurationError(f"{self.path}: 'tokens' must be a list")
        tokens = {}
        for record in records:
            token = Token.from_dict(record)
            tokens[token.id] = token
        tenant_records = doc.get("tenants", [])
        if not isinstance(tenant_records, list):
            raise ConfigurationError(f"{self.path}: 'tenants' must be a list")
        tenants = {}
        for record in tenant_records:
            tenant = Tenant.from_dict(record)
            tenants[tenant.name] = tenant
        self._tokens, self._tenants, self._stamp = tokens, tenants, stamp

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        doc = {
            "version": _FILE_VERSION,
            "tokens": [t.to_dict() for t in self._tokens.values()],
            "tenants": [t.to_dict() for t in self._tenants.values()],
        }
        fd, tmp = tempfile.mkstemp(prefix=".tokens-", dir=self.path.parent)
        try:
            # 0600: the hashes are not secrets, but the ceilings are the operator's business.
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._stamp = None  # re-read (and re-stamp) on the next access

    # -- operations ------------------------------------------------------------

    def create(
        self,
        name: str,
        ceiling: Ceiling | None = None,
        *,
        expires_in: float | None = None,
        tenant: str = DEFAULT_TENANT,
        admin: bool = False,
    ) -> tuple[Token, str]:
        """Add a token; return it and its secret (the only time the secret exists)."""
        check_tenant_name(tenant)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigurationError(
                f"token name {name!r:.80} must be 1-64 letters, digits, '.', '_', '@' or '-'"
            )
        if expires_in is not None and (
            isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) or not expires_in > 0
        ):
            raise ConfigurationError(f"expires_in={expires_in!r} must be a positive number of seconds")
        with self._lock:
            self._load()
            if any(t.name == name for t in self._tokens.values()):
                raise ConfigurationError(
                    f"a token named {name!r} exists; revoke it first or pick another name"
                )
            if tenant != DEFAULT_TENANT and tenant not in self._tenants:
                raise ConfigurationError(
                    f"no tenant {tenant!r}; create it first: agentnest serve tenant create {tenant}"
                )
            token_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
            secret = f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
            now = time.time()
            token = Token(
                id=token_id,
                name=name,
                sha256=_digest(secret),
                created=now,
                expires=None if expires_in is None else now + float(expires_in),
                ceiling=ceiling or Ceiling(),
                tenant=tenant,
                admin=bool(admin),
            )
            self._tokens[token_id] = token
            self._save()
        return token, secret

    def list(self) -> list[Token]:
        with self._lock:
            self._load()
            return sorted(self._tokens.values(), key=lambda t: t.created)

    def revoke(self, key: str) -> Token:
        """Remove the token with this id or name."""
        with self._lock:
            self._load()
            found = self._tokens.get(key) or next((t for t in self._tokens.values() if t.name == key), None)
            if found is None:
                raise ConfigurationError(f"no token with id or name {key!r:.80} in {self.path}")
            del self._tokens[found.id]
            self._save()
        return found

    def get(self, token_id: str) -> Token | None:
        with self._lock:
            self._load()
            return self._tokens.get(token_id)

    def authenticate(self, secret: str, now: float | None = None) -> Token:
        """The token whose secret this is.

        Raises:
            AuthError: unknown, malformed, revoked or expired.
        """
        match = _SECRET.fullmatch(secret) if isinstance(secret, str) else None
        with self._lock:
            self._load()
            token = self._tokens.get(match.group(1)) if match else None
        # Compare against a hash in every case, so an unknown id costs the same as a wrong secret.
        expected = token.sha256 if token is not None else "0" * 64
        good = hmac.compare_digest(_digest(secret if isinstance(secret, str) else ""), expected)
        if token is None or not good:
            raise AuthError("unknown or revoked token")
        if token.expired(now):
            raise AuthError("the token expired; ask the operator for a new one")
        return token


__all__ = ["PREFIX", "AuthError", "Ceiling", "Tenant", "Token", "TokenStore", "default_token_file"]
