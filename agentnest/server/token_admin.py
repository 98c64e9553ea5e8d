"""The operator's side of the token file: where it lives, ceilings as text, tenant records.

:mod:`.auth` decides who a bearer credential is (digests, expiry,
revocation) and owns the file (its lock, reading and atomic writing).  What
is here only manages records around that: the default path of the file, a
:class:`~agentnest.policy.Ceiling` built from command-line style options (the
ceiling checks itself), written out as data or one line (read back by
``Ceiling.from_dict``, which checks it), and the tenants stored beside the
tokens (:class:`TenantRecords`, part of :class:`~agentnest.server.auth.TokenStore`).
A token whose tenant is gone is refused by the service, so no tenant
operation here decides access.  Imports no web framework, as :mod:`.auth`.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigurationError
from ..limits import format_size
from ..policy import Ceiling
from .tenants import DEFAULT_TENANT, Tenant

__all__ = [
    "TenantRecords",
    "ceiling_to_dict",
    "default_token_file",
    "describe_ceiling",
    "parse_ceiling_options",
]


def default_token_file() -> Path:
    """``$AGENTNEST_TOKEN_FILE``, else ``$XDG_CONFIG_HOME/agentnest/tokens.json``."""
    explicit = os.environ.get("AGENTNEST_TOKEN_FILE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join("~", ".config")
    return Path(base).expanduser() / "agentnest" / "tokens.json"


def parse_ceiling_options(
    *,
    backends: Iterable[str] = (),
    images: Iterable[str] = (),
    max_sandboxes: int | None = None,
    max_memory: str | int | None = None,
    max_cpus: float | None = None,
    max_pids: int | None = None,
    max_timeout: float | None = None,
    network: Iterable[str] = (),
    domains: Iterable[str] = (),
    writable_root: bool = False,
) -> Ceiling:
    """A :class:`Ceiling` from command-line style options (None keeps the default)."""
    fields: dict[str, Any] = {"backends": tuple(backends), "images": tuple(images)}
    for name, value in (
        ("max_sandboxes", max_sandboxes),
        ("max_memory", max_memory),
        ("max_cpus", max_cpus),
        ("max_pids", max_pids),
        ("max_timeout", max_timeout),
    ):
        if value is not None:
            fields[name] = value
    if network:
        fields["network"] = tuple(network)
    fields["domains"] = tuple(domains)
    fields["writable_root"] = writable_root
    return Ceiling(**fields)


def ceiling_to_dict(ceiling: Ceiling) -> dict[str, Any]:
    """``ceiling`` as plain data: in the token file (``Ceiling.from_dict`` reads it back) and the API."""
    data = dataclasses.asdict(ceiling)
    for name in ("backends", "images", "network", "domains"):
        data[name] = list(data[name])
    return data


def describe_ceiling(ceiling: Ceiling) -> str:
    """One line for ``token list``."""
    return (
        f"sandboxes<={ceiling.max_sandboxes} memory<={format_size(ceiling.max_memory)} "
        f"cpus<={ceiling.max_cpus:g} pids<={ceiling.max_pids} lifetime<={ceiling.max_timeout:g}s "
        f"network={','.join(ceiling.network)} backends={','.join(ceiling.backends) or '(default)'} "
        f"images={','.join(ceiling.images) or '(default)'}"
    )


class _Member(Protocol):
    """What a tenant operation reads of a token: its name and its tenant."""

    @property
    def name(self) -> str: ...
    @property
    def tenant(self) -> str: ...


class TenantRecords:
    """The tenants in the token file: list, get, create, update, delete.

    A mixin of :class:`~agentnest.server.auth.TokenStore`, which owns the
    lock, the records and the file (``_load`` re-reads it if it changed,
    ``_save`` writes it atomically).
    """

    _lock: threading.Lock
    _tokens: Mapping[str, _Member]
    _tenants: dict[str, Tenant]

    def _load(self) -> None:
        raise NotImplementedError

    def _save(self) -> None:
        raise NotImplementedError

    def tenants(self) -> list[Tenant]:
        """Every stored tenant, and ``default`` (built-in caps unless stored)."""
        with self._lock:
            self._load()
            found = dict(self._tenants)
        found.setdefault(DEFAULT_TENANT, Tenant(DEFAULT_TENANT))
        return sorted(found.values(), key=lambda t: t.name)

    def tenant(self, name: str) -> Tenant | None:
        """The tenant called ``name`` (``default`` always exists), or None."""
        with self._lock:
            self._load()
            found = self._tenants.get(name)
        if found is None and name == DEFAULT_TENANT:
            return Tenant(DEFAULT_TENANT)
        return found

    def create_tenant(self, tenant: Tenant) -> Tenant:
        """Store a new tenant (``default`` may be stored once to change its caps)."""
        if not isinstance(tenant, Tenant):
            raise ConfigurationError("create_tenant needs a Tenant")
        with self._lock:
            self._load()
            if tenant.name in self._tenants:
                raise ConfigurationError(
                    f"tenant {tenant.name!r} exists; change it with `agentnest serve tenant update`"
                )
            self._tenants[tenant.name] = tenant
            self._save()
        return tenant

    def update_tenant(self, name: str, changes: Mapping[str, Any]) -> Tenant:
        """Change some of a tenant's settings (a running server applies them at once)."""
        with self._lock:
            self._load()
            current = self._tenants.get(name)
            if current is None and name == DEFAULT_TENANT:
                current = Tenant(DEFAULT_TENANT)
            if current is None:
                raise ConfigurationError(f"no tenant {name!r:.80}; `agentnest serve tenant list` shows them")
            updated = current.updated(changes)
            self._tenants[name] = updated
            self._save()
        return updated

    def delete_tenant(self, name: str) -> Tenant:
        """Remove a tenant that no token belongs to (``default`` returns to its built-in caps)."""
        with self._lock:
            self._load()
            found = self._tenants.get(name)
            if found is None:
                raise ConfigurationError(f"no stored tenant {name!r:.80}")
            users = sorted(t.name for t in self._tokens.values() if t.tenant == name)
            if users and name != DEFAULT_TENANT:
                raise ConfigurationError(f"tenant {name!r} still has tokens {users[:10]}; revoke them first")
            del self._tenants[name]
            self._save()
        return found
