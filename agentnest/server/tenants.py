"""Tenants of ``agentnest serve``: who shares the server, with what caps, weight and priority.

A tenant is a team or an application.  Every token belongs to one (the
``default`` tenant unless the operator says otherwise); what a tenant holds is
the sum over its tokens.  The token's :class:`~agentnest.server.auth.Ceiling`
still bounds each request; the tenant bounds the total and decides the
tenant's turn in the admission queue (:mod:`agentnest.server.admission`).

Tenants live in the token file beside the tokens, so one atomic file holds
both and a running server sees changes at once.  This module imports no web
framework.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from ..config import format_size, parse_size
from ..errors import ConfigurationError

#: Priority bands, best first.  A request may ask for its tenant's band or a lower one.
BANDS = ("high", "normal", "low")
DEFAULT_TENANT = "default"
#: The prefix of a warm pool's own tenant (Tenant.for_pool).
POOL_PREFIX = "pool:"
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
#: The longest any request may wait in a queue, whatever a tenant says (APF waits at most 1 min;
#: a sandbox start is worth longer, but a client must get an answer within minutes).
MAX_WAIT_CEILING = 600.0


def check_tenant_name(name: object) -> str:
    """``name`` if it is a valid tenant name (a DNS label: it may become a namespace)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"tenant name {name!r:.80} must be 1-40 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit"
        )
    return name


@dataclasses.dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's caps, weight and priority band.

    Every cap is over what the tenant holds at once (all its tokens together),
    except ``rate``/``burst`` (a token bucket of creates) and ``max_lifetime``
    (each sandbox).  ``weight`` is its share when tenants compete: with
    weights 1 and 2, the second gets twice the first's dominant share.
    """

    name: str
    weight: float = 1.0
    priority: str = "normal"
    """Its band: ``high``, ``normal`` or ``low``.  Queued requests age one band up every
    ``aging`` seconds (a server setting), so ``low`` is never starved."""
    max_sandboxes: int = 16
    max_memory: int = 16 * 1024**3
    max_cpus: float = 16.0
    max_lifetime: float = 24 * 3600.0
    rate: float = 5.0
    """Creates per second, refilled continuously."""
    burst: int = 10
    """Creates allowed at once after a quiet spell (the bucket's size)."""
    max_queued: int = 64
    """Requests of this tenant waiting at once; beyond it: 429 ``queue_full``."""
    default_wait: float = 30.0
    """How long a create waits in the queue when it does not say (``max_wait``)."""
    max_wait: float = 300.0
    """The longest ``max_wait`` a request may ask for (asking for more is refused)."""

    def __post_init__(self) -> None:
        if not self.name.startswith(POOL_PREFIX):  # set only by for_pool: no real name has a ':'
            check_tenant_name(self.name)
        if self.priority not in BANDS:
            raise ConfigurationError(f"priority {self.priority!r} is unknown; use one of {list(BANDS)}")
        for name in ("max_sandboxes", "burst", "max_queued"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
                raise ConfigurationError(f"tenant {name}={value!r} must be an integer from 0 to 1000000")
        if self.burst < 1:
            raise ConfigurationError(f"tenant burst={self.burst} must be at least 1")
        value = getattr(self, "max_memory")  # noqa: B009 - typed int, but a CLI may hand a "1g"
        if isinstance(value, str):
            object.__setattr__(self, "max_memory", parse_size(value, "max_memory"))
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError(f"tenant max_memory={value!r} must be a size")
        for name in ("weight", "max_cpus", "max_lifetime", "rate", "default_wait", "max_wait"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ConfigurationError(f"tenant {name}={value!r} must be a finite number >= 0")
            object.__setattr__(self, name, float(value))
        for name in ("weight", "rate", "max_lifetime"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"tenant {name} must be above 0")
        if self.max_wait > MAX_WAIT_CEILING:
            raise ConfigurationError(f"tenant max_wait={self.max_wait:g} is above {MAX_WAIT_CEILING:g}s")
        if self.default_wait > self.max_wait:
            raise ConfigurationError(
                f"tenant default_wait={self.default_wait:g} is above its max_wait={self.max_wait:g}"
            )

    @classmethod
    def for_pool(cls, pool: str, *, max_sandboxes: int, rate: float) -> Tenant:
        """The tenant a warm pool holds its unclaimed sandboxes as: the lowest band, its
        refill pace as the create rate, at most ``max_sandboxes``; bounded otherwise only by
        the server's capacity.  Its name (``pool:NAME``) cannot be a real tenant's."""
        return cls(
            POOL_PREFIX + check_tenant_name(pool),
            priority="low",
            max_sandboxes=max_sandboxes,
            max_memory=1 << 62,
            max_cpus=1e9,
            rate=rate,
            burst=1,
            max_queued=max_sandboxes,
            default_wait=0.0,
        )

    @property
    def band(self) -> int:
        """The index of its band in :data:`BANDS` (0 is the best)."""
        return BANDS.index(self.priority)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tenant:
        if not isinstance(data, Mapping):
            raise ConfigurationError("a tenant must be an object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigurationError(f"unknown tenant fields {sorted(unknown)}; known: {sorted(known)}")
        if "name" not in data:
            raise ConfigurationError("a tenant needs a name")
        return cls(**dict(data))

    def updated(self, changes: Mapping[str, Any]) -> Tenant:
        """A copy with ``changes`` applied (validated like a new one; the name cannot change)."""
        if "name" in changes and changes["name"] != self.name:
            raise ConfigurationError("a tenant's name cannot change; create another tenant")
        return Tenant.from_dict({**self.to_dict(), **changes})

    def describe(self) -> str:
        """One line for ``tenant list``."""
        return (
            f"weight={self.weight:g} priority={self.priority} sandboxes<={self.max_sandboxes} "
            f"memory<={format_size(self.max_memory)} cpus<={self.max_cpus:g} "
            f"lifetime<={self.max_lifetime:g}s rate={self.rate:g}/s burst={self.burst} "
            f"queue<={self.max_queued} wait={self.default_wait:g}s (<={self.max_wait:g}s)"
        )


__all__ = ["BANDS", "DEFAULT_TENANT", "MAX_WAIT_CEILING", "Tenant", "check_tenant_name"]
