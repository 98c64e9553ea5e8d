"""Weighted fair share over time: the arithmetic of admission's order between tenants (pure).

Ordering backlogged tenants by what they hold *now* is exact only when the
capacity divides by the weights: with weights 1:1:2 and room for 6, the heavy
tenant's fair 3 sandboxes alternate with 2, and who wins each tie decides
the split (issue 33 measured 0.25 / 0.31 / 0.43 instead of 0.25 / 0.25 / 0.50).
So admission orders by a share that remembers, as Kueue's admission fair
sharing (usage with a half-life) and start-time fair queuing do:

* **usage**: each tenant's dominant-share-seconds (the integral over time of
  its dominant share of the server's sandboxes, memory and CPUs), decayed with
  a half-life (:data:`HALF_LIFE`) so that old history fades and the numbers
  stay bounded;
* **look-ahead**: what it holds now, counted as if held for the expected hold
  time (:class:`HoldTime`, the smoothed length of recent grants): a grant
  raises its tenant's key at once (Kueue's entry penalty), so a tenant behind
  does not take every slot freed in one instant;
* **key** = (usage + dominant share held * look-ahead) / weight, smallest
  first;
* **no credit for idling**: a tenant whose queue was empty joins the backlog
  with usage per weight no lower than the least among the tenants already
  waiting (start-time fair queuing's virtual time), less :data:`CREDIT` grants
  (a lag it may rightly carry from a moment between two requests).  Its usage
  is raised by the difference.  A tenant that asked for nothing was denied
  nothing, and may not make up for it by taking every slot for minutes.

The bound (docs/manager.md, checked by tests/unit/test_fairshare.py against a
simulator): while a set of tenants stays backlogged on a full server, a grant
goes to the smallest key and raises it by one look-ahead, and a tenant left
behind gets the next slot that frees (within one hold), so keys stay within a
grant's look-ahead plus one hold of each other.  Over any window, a tenant's
dominant-share-seconds then differ from its weighted part of what the
backlogged tenants used by at most ``(D_max + look-ahead) * s_max * (1 + w_i / w_min)``
(:func:`lag_bound`): a constant, so as a fraction of its fair share the error
falls as 1/T with the window's length T.

Time is any monotonic clock in seconds (the admission's); across replicas the
usage is written with wall-clock stamps (:func:`decayed`).

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

#: Seconds after which a tenant's remembered usage counts half.  Long against a sandbox's
#: hold (so a split that the integers of the capacity get wrong is corrected), short
#: against a working day (so yesterday's burst does not count today).
HALF_LIFE = 600.0
#: The expected hold time (seconds) before any grant has been released.
DEFAULT_HOLD = 30.0
#: Weight of each new hold time in the smoothed mean.
HOLD_SMOOTHING = 0.05
#: A tenant joining the backlog may be this many grants (each its look-ahead) behind the
#: least usage per weight among those waiting; more credit than that is dropped.
CREDIT = 2.0
#: Usage below this (dominant-share-seconds) is forgotten.
NEGLIGIBLE = 1e-6


def decayed(value: float, elapsed: float, half_life: float = HALF_LIFE) -> float:
    """``value`` after ``elapsed`` seconds of decay."""
    return value * math.pow(0.5, max(0.0, elapsed) / half_life)


def accrued(share: float, elapsed: float, half_life: float = HALF_LIFE) -> float:
    """The decayed usage that holding ``share`` for ``elapsed`` seconds adds (at its end)."""
    if elapsed <= 0 or share <= 0:
        return 0.0
    rate = math.log(2) / half_life
    return share * -math.expm1(-rate * elapsed) / rate


def key(usage: float, share: float, lookahead: float, weight: float) -> float:
    """The order between tenants: (usage + share held * look-ahead) / weight, smallest first."""
    return (usage + share * lookahead) / weight


def lag_bound(hold: float, lookahead: float, share: float, weight: float, min_weight: float) -> float:
    """How far (dominant-share-seconds) a backlogged tenant's usage over any window may stray
    from its weighted part of what all backlogged tenants used in it.

    ``hold``: the longest a sandbox is held; ``share``: the largest dominant share of one
    sandbox; ``weight``: the tenant's; ``min_weight``: the smallest among the backlogged.
    The key gap (a grant's look-ahead plus one hold of the largest sandbox, over the
    smallest weight) on the others' side, plus the tenant's own, scaled by its weight.
    """
    return (hold + lookahead) * share * (1 + weight / min_weight)


class Usage:
    """Each tenant's decayed dominant-share-seconds, all decayed to one moment.

    Example::

        usage = Usage(now=0.0)
        usage.advance({"a": 0.5}, now=10.0)  # "a" held half the server for 10 s
        usage["a"]                           # about 5 (a little less: decay)
    """

    __slots__ = ("_values", "half_life", "stamp")

    def __init__(self, now: float, half_life: float = HALF_LIFE) -> None:
        if not half_life > 0 or not math.isfinite(half_life):
            raise ValueError(f"half_life={half_life!r} must be a positive number of seconds")
        self.half_life = half_life
        self.stamp = now
        self._values: dict[str, float] = {}

    def __getitem__(self, tenant: str) -> float:
        return self._values.get(tenant, 0.0)

    def items(self) -> Iterable[tuple[str, float]]:
        return self._values.items()

    def advance(self, shares: Mapping[str, float], now: float) -> None:
        """Decay everything to ``now`` and add what each tenant's ``shares`` held since the last call."""
        elapsed = now - self.stamp
        if elapsed <= 0:
            return
        self.stamp = now
        factor = math.pow(0.5, elapsed / self.half_life)
        values = self._values
        for tenant in list(values):
            value = values[tenant] * factor
            if value < NEGLIGIBLE and not shares.get(tenant):
                del values[tenant]
            else:
                values[tenant] = value
        for tenant, share in shares.items():
            if share > 0:
                values[tenant] = values.get(tenant, 0.0) + accrued(share, elapsed, self.half_life)

    def add(self, tenant: str, amount: float) -> None:
        """Count ``amount`` more for ``tenant`` (the lift of a tenant joining the backlog)."""
        if amount > 0:
            self._values[tenant] = self._values.get(tenant, 0.0) + amount


class HoldTime:
    """The expected time a grant is held: the smoothed length of the grants released so far."""

    __slots__ = ("seconds", "seen")

    def __init__(self, initial: float = DEFAULT_HOLD) -> None:
        self.seconds = initial
        self.seen = 0

    def observe(self, held: float) -> None:
        held = max(0.0, held)
        self.seen += 1
        # The first few count fully (a fast start from the default), then a slow moving mean.
        weight = max(HOLD_SMOOTHING, 1.0 / self.seen)
        self.seconds += weight * (held - self.seconds)


__all__ = [
    "CREDIT",
    "DEFAULT_HOLD",
    "HALF_LIFE",
    "HOLD_SMOOTHING",
    "HoldTime",
    "Usage",
    "accrued",
    "decayed",
    "key",
    "lag_bound",
]
