#!/usr/bin/env python3
"""Step Z: the E2B face of ``agentnest serve`` through the stock SDK (issue 16's targets).

* Z1: ``sandbox.commands.run("echo hi")`` through ``e2b`` on a warm sandbox (created,
  one call done).  Target: p50 <= 5 ms.  Floor column: the same command through our own
  ``Sandbox`` (the remote backend) against the same server, ``exec_shell("echo hi")``.
* Z2: ``Sandbox.create(template)`` through ``e2b`` where the template is a warm pool of
  the server (``E2BTemplate(pool=...)``, 3 ready, refilled), the sandbox killed after each
  sample (not timed); each sample starts once the pool is full again.  Target: p50 <= 30 ms.
  Floor column: the same claim through the native API, ``POST /v1/sandboxes {"pool"}``.
* Z3: ``run_code("1+1")`` through ``e2b-code-interpreter`` on a warm sandbox.
  Target: p50 <= 10 ms.  Floor column: ``python_session().run("1+1")`` of our own
  ``Sandbox`` through the same server.

One run on loopback: the server runs in a thread of this process (runc, or the backend
asked for); the SDK runs in its own venv (tests/e2b/sdks.py, the newest pinned
set, built once) as a child process that times each call with ``time.perf_counter`` and
sends its samples back as JSON.  ``python benchmarks/e2b.py [--quick]`` runs it alone;
``python benchmarks/bench.py --only Z`` runs it as a step of the suite.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# Run from a checkout without installing: `python benchmarks/e2b.py`.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import Plan, Result, Series, Target, report, summary  # noqa: E402

POOL = "e2b-bench"
WARM_TEMPLATE = "bench-warm"
POOL_READY = 3
#: Seconds one request to the driver may take before the run is abandoned.
DRIVER_DEADLINE = 300.0

#: Runs in the SDK's venv (the standard library and the SDK only).  Reads one JSON request
#: per line on stdin, answers one JSON line on stdout; samples are seconds.
DRIVER = r"""
import json, sys, time
import e2b, e2b_code_interpreter

def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()

def exec_samples(n):
    sbx = e2b.Sandbox.create(timeout=600)
    try:
        for _ in range(10):
            if sbx.commands.run("echo hi").stdout != "hi\n":
                raise RuntimeError("echo hi did not print hi")
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            got = sbx.commands.run("echo hi")
            samples.append(time.perf_counter() - t0)
            if got.stdout != "hi\n":
                raise RuntimeError("echo hi printed %r" % got.stdout)
        return samples
    finally:
        sbx.kill()

def code_samples(n):
    sbx = e2b_code_interpreter.Sandbox.create(timeout=600)
    try:
        for _ in range(10):
            sbx.run_code("1+1")
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            got = sbx.run_code("1+1")
            samples.append(time.perf_counter() - t0)
            if got.text != "2":
                raise RuntimeError("run_code('1+1') gave %r (error %r)" % (got.text, got.error))
        return samples
    finally:
        sbx.kill()

def one_create(template):
    t0 = time.perf_counter()
    sbx = e2b.Sandbox.create(template, timeout=120)
    took = time.perf_counter() - t0
    sbx.kill()
    return took

for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "exec":
            answer({"samples": exec_samples(req["n"])})
        elif req["op"] == "code":
            answer({"samples": code_samples(req["n"])})
        elif req["op"] == "create":
            answer({"sample": one_create(req["template"])})
        elif req["op"] == "versions":
            import importlib.metadata as m
            answer({"versions": {d: m.version(d) for d in ("e2b", "e2b-code-interpreter")}})
        else:
            break
    except Exception as exc:
        answer({"error": "%s: %s" % (type(exc).__name__, exc)})
"""


class DriverError(RuntimeError):
    """The SDK's side failed or went silent."""


class Driver:
    """The SDK driver: a child process in the SDK's venv, one request at a time."""

    def __init__(self, python: Path, url: str, key: str) -> None:
        import os

        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_") and k != "PYTHONPATH"}
        env.update(
            E2B_API_URL=url,
            E2B_SANDBOX_URL=url,
            E2B_API_KEY=key,
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        # Closed in close(); a file, not a pipe, so a chatty driver never blocks on it.
        self._stderr: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [str(python), "-c", DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        # A driver that hangs is killed, so the readline below returns.
        watchdog = threading.Timer(DRIVER_DEADLINE, proc.kill)
        watchdog.start()
        try:
            line = proc.stdout.readline()
        finally:
            watchdog.cancel()
        if not line:
            self._stderr.seek(0)
            raise DriverError(f"the SDK driver ended (exit {proc.poll()}): {self._stderr.read()[-2000:]}")
        got: dict[str, Any] = json.loads(line)
        if "error" in got:
            raise DriverError(f"the SDK driver failed: {got['error']}")
        return got

    def close(self) -> None:
        proc = self._proc
        if proc.poll() is None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        self._stderr.close()


@dataclass
class Served:
    url: str
    secret: str
    key: str
    app: Any


@contextmanager
def served(backend: str) -> Iterator[Served]:
    """``agentnest serve`` in a thread: one token, a warm pool, an E2B template claiming from it."""
    from agentnest.runtime.docker import base_image
    from agentnest.server.app import create_app
    from agentnest.server.auth import Ceiling, TokenStore
    from agentnest.server.e2b import DEFAULT_TEMPLATES, E2BTemplate, e2b_key
    from agentnest.server.pools import PoolSpec
    from agentnest.server.settings import ServerSettings
    from agentnest.server.thread import serve_in_thread

    with tempfile.TemporaryDirectory(prefix="agentnest-bench-e2b-") as tmp:
        store = TokenStore(Path(tmp) / "tokens.json")
        _, secret = store.create("bench", Ceiling(max_sandboxes=12, max_timeout=900.0, backends=(backend,)))
        pool = PoolSpec(POOL, backend=backend, min=POOL_READY, max=POOL_READY + 1, refill_rate=20.0)
        settings = ServerSettings(
            tokens=store,
            backends={backend: backend},
            image=base_image(),
            max_sandboxes=16,
            pools=(pool,),
            e2b_templates={**DEFAULT_TEMPLATES, WARM_TEMPLATE: E2BTemplate(pool=POOL)},
        )
        app = create_app(settings)
        with serve_in_thread(app) as url:
            yield Served(url, secret, e2b_key(secret), app)


def _wait_full(ready: Any) -> None:
    deadline = time.monotonic() + 120
    while len(ready) < POOL_READY:  # the pool refilled (the condition is the signal)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not refill to {POOL_READY} within 120 s")
        time.sleep(0.005)


def _sdks() -> Any:
    """tests/e2b/sdks.py (the SDK venvs), loaded from its path: as ``e2b.sdks`` its package's
    name would be this module's own (``from e2b import bench_e2b`` in bench.py)."""
    import importlib.util

    name = "agentnest_bench_e2b_sdks"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "e2b" / "sdks.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def bench_e2b(backend: str, plan: Plan) -> list[Result]:
    """Z1, Z2, Z3."""
    import httpx

    from agentnest import Sandbox
    from agentnest.runtime.remote import RemoteBackend

    sdks = _sdks()
    reason = sdks.unsupported_reason()
    if reason:
        raise RuntimeError(reason)
    python = sdks.sdk_venv(sdks.NEWEST, sdks.MATRIX[sdks.NEWEST])
    installed = sdks.stamp(python.parent.parent).get("installed")
    versions = installed if isinstance(installed, dict) else {}
    sdk_label = ", ".join(f"{k} {v}" for k, v in versions.items() if str(k).startswith("e2b"))
    n = plan.warm
    creates = 12 if plan.quick else 30
    exec_sdk = Series('SDK commands.run("echo hi")', "ms")
    exec_ours = Series('our Sandbox.exec_shell("echo hi")', "ms")
    code_sdk = Series('SDK run_code("1+1")', "ms")
    code_ours = Series('our python_session().run("1+1")', "ms")
    create_sdk = Series(f"SDK Sandbox.create({WARM_TEMPLATE!r})", "ms")
    create_ours = Series('POST /v1/sandboxes {"pool"}', "ms")
    with served(backend) as server:
        driver = Driver(python, server.url, server.key)
        try:
            exec_sdk.samples = driver.ask(op="exec", n=n)["samples"]
            code_sdk.samples = driver.ask(op="code", n=n)["samples"]
            ready = server.app.state.service.pools[POOL].ready
            for _ in range(creates + 2):
                _wait_full(ready)
                create_sdk.samples.append(driver.ask(op="create", template=WARM_TEMPLATE)["sample"])
            create_sdk.samples = create_sdk.samples[2:]  # the first two warm the connection
        finally:
            driver.close()
        remote = RemoteBackend(server.url, server.secret, backend=backend)
        with Sandbox(timeout=600, backend=remote) as sb:
            for _ in range(10):
                sb.exec_shell("echo hi").check()
            for _ in range(n):
                t0 = time.perf_counter()
                got = sb.exec_shell("echo hi")
                exec_ours.samples.append(time.perf_counter() - t0)
                if got.stdout != "hi\n":
                    raise RuntimeError(f"exec_shell('echo hi') printed {got.stdout!r}")
            session = sb.python_session()
            for _ in range(10):
                session.run("1+1")
            for _ in range(n):
                t0 = time.perf_counter()
                ran = session.run("1+1")
                code_ours.samples.append(time.perf_counter() - t0)
                if ran.result != "2":
                    raise RuntimeError(f"python_session().run('1+1') gave {ran.result!r}")
        headers = {"Authorization": f"Bearer {server.secret}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
            for i in range(creates + 2):
                _wait_full(ready)
                t0 = time.perf_counter()
                made = http.post("/v1/sandboxes", json={"pool": POOL})
                took = time.perf_counter() - t0
                if made.status_code != 201:
                    raise RuntimeError(f"POST /v1/sandboxes {{pool}}: {made.status_code} {made.text[:300]}")
                if i >= 2:
                    create_ours.samples.append(took)
                http.delete(f"/v1/sandboxes/{made.json()['id']}")
    where = f"{sdk_label} in its own venv; server in this process, loopback"
    return [
        Result(
            backend,
            "Z1",
            "E2B commands.run, warm sandbox",
            exec_sdk,
            exec_ours,
            Target("p50_le", 5.0),
            notes=[
                where,
                "floor column: the same command through our own Sandbox (remote backend), same server",
            ],
        ),
        Result(
            backend,
            "Z2",
            "E2B Sandbox.create from a warm pool",
            create_sdk,
            create_ours,
            Target("p50_le", 30.0),
            notes=[
                f"pool of {POOL_READY} ready, refilled between samples; the kill after each is not timed",
                "floor column: the same claim through the native API (httpx)",
            ],
        ),
        Result(
            backend,
            "Z3",
            "E2B run_code('1+1'), warm sandbox",
            code_sdk,
            code_ours,
            Target("p50_le", 10.0),
            notes=["floor column: our own python_session().run('1+1'), same server"],
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument(
        "--backend", default="docker", help="the server's backend (docker = runc, gvisor = runsc)"
    )
    parser.add_argument("--json", metavar="PATH", help="write every result and sample here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results = bench_e2b(args.backend, Plan.make(args.quick))
    for result in results:
        report(result)
    print(f"\nSummary ({time.perf_counter() - started:.1f} s)\n")
    print(summary(results))
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n")
    verdicts = [r.verdict for r in results]
    print(f"\n{verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS (misses are reported, not raised)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
