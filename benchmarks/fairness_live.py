"""``fairness.py --live``: the same load against a real ``agentnest serve`` on loopback.

The server runs as a child process on a free loopback port with ``--max-sandboxes`` the
capacity, a private token file holding the three tenants (their weights, otherwise the
built-in settings, as in the simulated mode) and a private SQLite database, and starts real
sandboxes on the Docker engine (runc, 64 MiB each).  Each tenant runs the same closed loop of
clients as the simulated mode, over HTTP: ``POST /v1/sandboxes`` with ``max_wait``, the
sandbox held 2-4 s, ``DELETE``, 0.1 s, again; after a 429 the client waits its
``Retry-After``.

Measured over the window after the warm-up: each tenant's sandbox-seconds as the server
records them (``GET /v1/usage`` with an admin token, the window's part of each sandbox's life
from start to end), and, as a cross-check, as the clients saw them (from the 201 to the
``DELETE``'s answer); the queue wait is the time to the 201 (it includes the container's
start, a few hundred ms).  At the end (also on Ctrl-C or an error) the clients are cancelled,
every sandbox still listed is deleted, the server is stopped with SIGINT (it destroys what it
holds), and the engine is asked for any container the server left: they are removed and
counted.

Imported by fairness.py from the same directory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agentnest.server.auth import Ceiling, TokenStore
from agentnest.server.tenants import Tenant

MEMORY = "64m"
LIFETIME = 600.0  # each sandbox's deadline: a client that vanished leaves nothing past this


@dataclass
class Load:
    """What each tenant's clients do (the simulated mode's constants)."""

    weights: dict[str, float]
    greedy: str
    max_wait: dict[str, float]
    hold: tuple[float, float]
    think: float


@dataclass
class LiveTally:
    held: float = 0.0
    """Sandbox-seconds in the window, as the server's usage reports them."""
    client_held: float = 0.0
    """The same as the clients saw them: from the 201 to the DELETE's answer."""
    waits: list[float] = field(default_factory=list)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    late: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    creates: int = 0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(
    capacity: int, weights: dict[str, float], root: Path
) -> Iterator[tuple[str, dict[str, str], str]]:
    """Yield the server's URL, each tenant's token and an admin token; stop it at the end."""
    store = TokenStore(root / "tokens.json")
    ceiling = Ceiling(max_sandboxes=64, max_memory=64 << 20, max_timeout=LIFETIME, backends=("docker",))
    secrets = {}
    for name, weight in weights.items():
        store.create_tenant(Tenant(name, weight=weight))
        secrets[name] = store.create(name, ceiling, tenant=name)[1]
    admin = store.create("bench-admin", ceiling, admin=True)[1]
    port = _port()
    url = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).parent / "agentnest"
    argv = [str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--backend", "docker"]
    argv += ["--max-sandboxes", str(capacity), "--database", f"sqlite:///{root / 'manager.db'}"]
    argv += ["--no-audit-log", "--no-e2b", "--no-tracing", "--log-level", "warning"]
    log_path = root / "server.log"
    env = {**os.environ, "AGENTNEST_TOKEN_FILE": str(root / "tokens.json")}
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    owner = f"{socket.gethostname()}:{proc.pid}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"agentnest serve exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"agentnest serve not ready within 60 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)  # polling the readiness endpoint, with the deadline above
        yield url, secrets, admin
    finally:
        try:
            _sweep(url, secrets)
        finally:
            _stop(proc)
            _remove_leftovers(owner)


def _sweep(url: str, secrets: dict[str, str]) -> None:
    """Delete every sandbox the tenants' tokens still hold (a create cancelled mid-start)."""
    for secret in secrets.values():
        with (
            contextlib.suppress(httpx.HTTPError, ValueError),
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as http,
        ):
            for sandbox in http.get("/v1/sandboxes").json().get("sandboxes", []):
                http.delete(f"/v1/sandboxes/{sandbox['id']}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the server destroys its sandboxes on the way out
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _remove_leftovers(owner: str) -> None:
    """Remove (and say so) any container the server started and did not destroy."""
    try:
        import docker

        client = docker.from_env()
        left = client.containers.list(
            all=True, filters={"label": f"agentnest.owner={owner}"}, ignore_removed=True
        )
        for container in left:
            container.remove(force=True)
        if left:
            print(f"warning: the server left {len(left)} container(s); removed", file=sys.stderr)
    except Exception as exc:  # the report must still print; the check is best effort
        print(f"warning: could not check the engine for leftovers: {exc}", file=sys.stderr)


@dataclass
class _Run:
    start: float  # time.monotonic() at the start of the clients
    warm_end: float
    end: float
    max_requests: int
    requests: int = 0

    def going(self) -> bool:
        return time.monotonic() < self.end and self.requests < self.max_requests


async def _client(
    http: httpx.AsyncClient, load: Load, name: str, tally: LiveTally, run: _Run, rng: random.Random
) -> None:
    await asyncio.sleep(rng.uniform(0, 1))
    max_wait = load.max_wait[name]
    body = {"memory": MEMORY, "timeout": LIFETIME, "max_wait": max_wait}
    while run.going():
        run.requests += 1
        if run.requests >= run.max_requests:
            run.end = min(run.end, time.monotonic())  # the cap ends the window here
        sent = time.monotonic()
        try:
            made = await http.post("/v1/sandboxes", json=body)
        except httpx.TransportError as exc:
            tally.errors[type(exc).__name__] += 1
            await asyncio.sleep(1)
            continue
        answered = time.monotonic()
        if made.status_code != 201:
            code = (
                made.json().get("code", "?")
                if made.headers.get("content-type", "").startswith("application/json")
                else "?"
            )
            if made.status_code == 429:
                tally.refused[code] += 1
            else:
                tally.errors[f"{made.status_code} {code}"] += 1
            await asyncio.sleep(float(made.headers.get("retry-after", "1")))
            continue
        tally.creates += 1
        if answered >= run.warm_end:
            tally.waits.append(answered - sent)
        if answered - sent > max_wait + 30:  # queued past max_wait (30 s allowed for the start)
            tally.late += 1
        await asyncio.sleep(rng.uniform(*load.hold))
        gone = await http.delete(f"/v1/sandboxes/{made.json()['id']}")
        if gone.status_code != 200:
            tally.errors[f"delete {gone.status_code}"] += 1
        freed = time.monotonic()
        tally.client_held += max(0.0, min(freed, run.end) - max(answered, run.warm_end))
        await asyncio.sleep(load.think)


async def _drive(
    url: str, secrets: dict[str, str], load: Load, capacity: int, run: _Run, seed: int
) -> dict[str, LiveTally]:
    rng = random.Random(seed)
    total = sum(load.weights.values())
    tallies = {name: LiveTally() for name in load.weights}
    clients: list[httpx.AsyncClient] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for name, weight in load.weights.items():
            n = math.ceil((10 if name == load.greedy else 2) * capacity * weight / total)
            http = httpx.AsyncClient(
                base_url=url,
                headers={"Authorization": f"Bearer {secrets[name]}"},
                timeout=load.max_wait[name] + 120,
                limits=httpx.Limits(max_connections=n + 2, max_keepalive_connections=n + 2),
            )
            clients.append(http)
            for _ in range(n):
                loop = _client(http, load, name, tallies[name], run, random.Random(rng.random()))
                tasks.append(asyncio.ensure_future(loop))
        # Every client stops by itself once the window is over (a queued create may take its
        # max_wait); past end + the longest max_wait + a margin, the rest are cancelled.
        _, pending = await asyncio.wait(
            tasks, timeout=run.end - time.monotonic() + max(load.max_wait.values()) + 60
        )
        if pending:
            print(f"warning: {len(pending)} client(s) still busy at the end; cancelled", file=sys.stderr)
        for task in tasks:
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                raise exc
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for http in clients:
            await http.aclose()
    return tallies


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def measure(
    capacity: int, seconds: float, warm: float, seed: int, max_requests: int, load: Load
) -> tuple[dict[str, LiveTally], float, float]:
    """Run one capacity; return the tallies, the seconds counted and the wall seconds."""
    # SIGTERM (and SIGINT, which a shell ignores in a background job) end the run as Ctrl-C
    # does: the clients are cancelled, the sandboxes deleted, the server stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    wall = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="agentnest-fairness-") as tmp,
        _server(capacity, load.weights, Path(tmp)) as (url, secrets, admin),
    ):
        now = time.monotonic()
        run = _Run(start=now, warm_end=now + warm, end=now + seconds, max_requests=max_requests)
        to_unix = time.time() - time.monotonic()
        tallies = asyncio.run(_drive(url, secrets, load, capacity, run, seed))
        counted = max(0.0, run.end - run.warm_end)
        if counted > 0:
            since, until = run.warm_end + to_unix, run.end + to_unix
            answer = httpx.get(
                f"{url}/v1/usage",
                params={"since": since, "until": until},
                headers={"Authorization": f"Bearer {admin}"},
                timeout=60,
            )
            answer.raise_for_status()
            for row in answer.json()["usage"]:
                if row["tenant"] in tallies:
                    tallies[row["tenant"]].held = float(row["sandbox_seconds"])
    return tallies, counted, time.perf_counter() - wall


def describe(tallies: dict[str, LiveTally]) -> str:
    """The cross-check line: the clients' shares, creates and errors."""
    client = sum(t.client_held for t in tallies.values()) or 1.0
    shares = " / ".join(f"{t.client_held / client:.3f}" for t in tallies.values())
    creates = " / ".join(str(t.creates) for t in tallies.values())
    errors = sum(sum(t.errors.values()) for t in tallies.values())
    detail = "; ".join(f"{n}: {dict(t.errors)}" for n, t in tallies.items() if t.errors)
    return f"client-side shares {shares}, creates {creates}, errors {errors}" + (
        f" ({detail})" if detail else ""
    )
