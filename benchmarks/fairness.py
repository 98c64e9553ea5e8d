"""Fairness under a greedy tenant (issue 33): shares of sandbox-seconds against the weights.

Three tenants with weights 1:1:2 share a server with room for 5, 6, 7, 8 and 10
sandboxes.  Each tenant runs a closed loop of clients: a create with ``max_wait``,
the sandbox held 2-4 s (uniform), given back, 0.1 s until the next create.  The
two polite tenants run twice the clients their weighted share needs (so they stay
backlogged and their fair share is well defined), with ``max_wait`` 60 s; the
greedy tenant (weight 1) runs ten times its share, with ``max_wait`` 30 s, and
after a 429 waits its ``Retry-After``.  Tenants have the built-in settings but
for their weight (rate 5/s, burst 10, max_queued 64, 16 sandboxes each).

**What runs.** The real admission object (``agentnest.server.admission.Admission``:
``acquire``, its dispatcher, its timers, ``Rejected`` at the deadline,
``release``) on an asyncio event loop whose clock is simulated: when nothing is
ready, time jumps to the next timer.  Nothing else is simulated, so each
capacity runs 900 simulated seconds (the first 60 not counted) in a few wall
seconds, with the same decisions the server makes; no engine, no network (the
HTTP layer adds nothing to the order: it calls ``acquire`` and ``release``).

Printed per capacity: each tenant's share of the sandbox-seconds held in the
window against its weighted share, Jain's index over the weight-normalised
shares (share / weighted share), p50 / p99 of the queue wait of its granted
creates, its 429s by reason, and polite creates refused past their ``max_wait``.
Targets: every tenant within 5 % of its weighted share at every capacity, Jain
>= 0.99, no polite create refused.

Run: ``python benchmarks/fairness.py`` (``--seconds``, ``--capacities``,
``--seed``).  It imports ``agentnest`` from ``PYTHONPATH``: pointed at an older
checkout, it measures that one's rule.  ``--live`` (``fairness_live.py``) runs the same
load against a real ``agentnest serve`` on loopback with real sandboxes (runc): wall seconds,
not simulated ones, and the shares from the server's ``GET /v1/usage``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import random
import selectors
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness import percentile, table

from agentnest.server.admission import Admission, Rejected, Resources
from agentnest.server.tenants import Tenant

if TYPE_CHECKING:
    from fairness_live import LiveTally

GIB = 1 << 30
ONE = Resources(1, GIB // 2, 1.0)
WEIGHTS = {"polite-a": 1.0, "greedy": 1.0, "polite-c": 2.0}
GREEDY = "greedy"
HOLD = (2.0, 4.0)
THINK = 0.1
MAX_WAIT = {"polite-a": 60.0, "greedy": 30.0, "polite-c": 60.0}
WARM = 60.0
LIVE_SECONDS = 180.0  # --live: wall seconds per capacity, the first LIVE_WARM not counted
LIVE_WARM = 30.0
LIVE_REQUESTS = 20000  # --live: creates per capacity at most (the window ends at the last)


class _Jump(selectors.DefaultSelector):
    """A selector that, asked to wait, moves the loop's simulated clock instead."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            self.clock[0] += timeout
        return super().select(0)


class SimulatedLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is simulated: idle time passes at once."""

    def __init__(self) -> None:
        self.clock = [0.0]
        super().__init__(_Jump(self.clock))

    def time(self) -> float:
        return self.clock[0]


@dataclass
class Tally:
    held: float = 0.0
    waits: list[float] = field(default_factory=list)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    late: int = 0


async def _client(adm: Admission, tenant: Tenant, tally: Tally, end: float, rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(rng.uniform(0, 1))
    max_wait = MAX_WAIT[tenant.name]
    while loop.time() < end:
        try:
            grant = await adm.acquire(tenant, ONE, max_wait=max_wait)
        except Rejected as exc:
            tally.refused[exc.reason] += 1
            await asyncio.sleep(exc.retry_after or 1)
            continue
        if grant.waited > max_wait + 1e-6:
            tally.late += 1
        start = loop.time()
        if start >= WARM:
            tally.waits.append(grant.waited)
        await asyncio.sleep(rng.uniform(*HOLD))
        stop = loop.time()
        adm.release(grant)
        tally.held += max(0.0, min(stop, end) - max(start, WARM))
        await asyncio.sleep(THINK)


async def _run(capacity: int, seconds: float, seed: int) -> dict[str, Tally]:
    loop = asyncio.get_running_loop()
    adm = Admission(Resources(capacity, capacity * GIB // 2, float(capacity)), clock=loop.time)
    rng = random.Random(seed)
    total = sum(WEIGHTS.values())
    tallies = {name: Tally() for name in WEIGHTS}
    tasks = []
    for name, weight in WEIGHTS.items():
        tenant = Tenant(name, weight=weight)
        fair = capacity * weight / total
        clients = math.ceil((10 if name == GREEDY else 2) * fair)
        tasks += [
            asyncio.ensure_future(_client(adm, tenant, tallies[name], seconds, random.Random(rng.random())))
            for _ in range(clients)
        ]
    await asyncio.gather(*tasks)
    return tallies


def measure(capacity: int, seconds: float, seed: int) -> tuple[list[list[str]], dict[str, Any]]:
    loop = SimulatedLoop()
    try:
        wall = time.perf_counter()
        tallies = loop.run_until_complete(_run(capacity, seconds, seed))
        wall = time.perf_counter() - wall
    finally:
        loop.close()
    return summarise(capacity, tallies, seconds - WARM, wall)


def summarise(
    capacity: int, tallies: Mapping[str, Tally | LiveTally], counted: float, wall: float
) -> tuple[list[list[str]], dict[str, Any]]:
    """The table's rows for one capacity, and its summary (Jain, worst, polite refused)."""
    total_w = sum(WEIGHTS.values())
    held = sum(t.held for t in tallies.values()) or 1.0
    norm = {name: (t.held / held) / (WEIGHTS[name] / total_w) for name, t in tallies.items()}
    jain = sum(norm.values()) ** 2 / (len(norm) * sum(x * x for x in norm.values()))
    rows = []
    for name, t in tallies.items():
        share, fair = t.held / held, WEIGHTS[name] / total_w
        refused = ", ".join(f"{k} {v}" for k, v in sorted(t.refused.items())) or "-"
        rows.append(
            [
                str(capacity),
                name,
                f"{WEIGHTS[name]:g}",
                f"{share:.3f}",
                f"{fair:.3f}",
                f"{(share / fair - 1) * 100:+.1f} %",
                f"{percentile(t.waits, 50):.2f}",
                f"{percentile(t.waits, 99):.2f}",
                refused,
                str(sum(t.refused.values()) + t.late if name != GREEDY else "-"),
            ]
        )
    summary = {
        "capacity": capacity,
        "jain": jain,
        "worst": max(abs(x - 1) for x in norm.values()),
        "polite_refused": sum(sum(t.refused.values()) + t.late for n, t in tallies.items() if n != GREEDY),
        "used": held / (capacity * counted) if counted > 0 else 0.0,
        "wall": wall,
    }
    return rows, summary


def _measure_live(
    capacity: int, seconds: float, seed: int, max_requests: int
) -> tuple[list[list[str]], dict[str, Any]]:
    import fairness_live

    load = fairness_live.Load(WEIGHTS, GREEDY, MAX_WAIT, HOLD, THINK)
    tallies, counted, wall = fairness_live.measure(capacity, seconds, LIVE_WARM, seed, max_requests, load)
    rows, summary = summarise(capacity, tallies, counted, wall)
    summary["live"] = fairness_live.describe(tallies) + f", {counted:.0f} s counted"
    summary["errors"] = sum(sum(t.errors.values()) for t in tallies.values())
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        help=f"seconds per capacity: simulated (default 900, the first {WARM:g} not counted), "
        f"or with --live wall seconds (default {LIVE_SECONDS:g}, the first {LIVE_WARM:g} not counted)",
    )
    parser.add_argument("--capacities", default="5,6,7,8,10")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument(
        "--live",
        action="store_true",
        help="against a real `agentnest serve` on loopback, real sandboxes on the Docker engine (runc)",
    )
    parser.add_argument(
        "--max-requests", type=int, default=LIVE_REQUESTS, help="--live: creates per capacity at most"
    )
    args = parser.parse_args(argv)
    warm = LIVE_WARM if args.live else WARM
    if args.seconds is None:
        args.seconds = LIVE_SECONDS if args.live else 900.0
    if not warm < args.seconds <= 3600:
        parser.error(f"--seconds must be above {warm:g} and at most 3600")
    if not 1 <= args.max_requests <= 10**6:
        parser.error("--max-requests must be 1 to 1000000")
    header = [
        "cap",
        "tenant",
        "w",
        "share",
        "weighted",
        "off by",
        "wait p50 s",
        "wait p99 s",
        "429s by reason",
        "polite refused",
    ]
    rows: list[list[str]] = [header]
    summaries = []
    for capacity in (int(c) for c in args.capacities.split(",")):
        if not 1 <= capacity <= 100:
            parser.error("capacities must be 1 to 100")
        if args.live:
            print(
                f"capacity {capacity}: {args.seconds:g} s on a live server ...", file=sys.stderr, flush=True
            )
            try:
                got, summary = _measure_live(capacity, args.seconds, args.seed, args.max_requests)
            except KeyboardInterrupt:
                print("interrupted: the sandboxes are deleted and the server stopped", file=sys.stderr)
                return 130
        else:
            got, summary = measure(capacity, args.seconds, args.seed)
        rows += got
        summaries.append(summary)
    if args.live:
        header[6:8] = ["to 201 p50 s", "to 201 p99 s"]
    print(
        f"Fairness: weights 1:1:2, greedy at 10x its share, holds {HOLD[0]:g}-{HOLD[1]:g} s, "
        + (
            f"{args.seconds:g} wall s per capacity on a live server and runc (first {warm:g} s not "
            "counted; shares from GET /v1/usage)\n"
            if args.live
            else f"{args.seconds:g} simulated s per capacity (first {WARM:g} s not counted)\n"
        )
    )
    print(table(rows))
    print()
    ok = True
    for s in summaries:
        # Live: a create or delete that failed (not a 429) is a miss too: the server broke.
        met = s["worst"] <= 0.05 and s["jain"] >= 0.99 and s["polite_refused"] == 0 and not s.get("errors")
        ok = ok and met
        print(
            f"capacity {s['capacity']:>3}: Jain {s['jain']:.4f}, worst {s['worst'] * 100:.1f} % off, "
            f"polite refused {s['polite_refused']}, server used {s['used'] * 100:.1f} %, "
            f"{s['wall']:.1f} s wall  {'ok' if met else 'MISSED'}"
        )
        if "live" in s:
            print(f"              {s['live']}")
    print("targets (within 5 %, Jain >= 0.99, no polite create refused):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
