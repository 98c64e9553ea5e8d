"""Step E of bench.py: the egress allowlist (E1/E2 the proxy in-process on loopback, E3 start cost).

Imported by bench.py from the same directory.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import Plan, Reaper, Result, Series, Target, percentile, timed

from agentnest import SecurityPolicy


class _EgressServers:
    """A local HTTPS server on 127.0.0.1 (self-signed, made with the openssl CLI) and the
    egress proxy itself, in-process on its own event loop: the same code the proxy
    container runs, measured without the engine's veth hops."""

    def __init__(self, tmp: Path) -> None:
        import asyncio
        import http.server
        import ssl

        from agentnest.egress.proxy import Limits, Proxy, Rules

        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
                *("-nodes", "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "cert.pem"), "-days", "1"),
                *("-subj", "/CN=bench", "-addext", "subjectAltName=DNS:bench.allowed.test"),
            ],
            check=True,
            capture_output=True,
        )

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 512

        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.socket = server_ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.client_ctx = ssl.create_default_context(cafile=str(tmp / "cert.pem"))
        self.events: list[dict[str, Any]] = []
        rules = Rules(
            ["bench.allowed.test"], ["127.0.0.0/8"], [self.port], {"bench.allowed.test": "127.0.0.1"}
        )
        self.proxy = Proxy(rules, Limits(), emit=self.events.append)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.proxy_addr: tuple[str, int] = ("", 0)

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.proxy_addr = self.loop.run_until_complete(self.proxy.start("127.0.0.1", 0))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the egress proxy did not start")

    def request(self, via_proxy: bool, path: str = "/") -> None:
        """One HTTPS GET on a fresh connection (TLS handshake included), as a CLI tool makes it."""
        import http.client
        import socket

        if via_proxy:
            conn = http.client.HTTPSConnection(*self.proxy_addr, timeout=30, context=self.client_ctx)
            conn.set_tunnel("bench.allowed.test", self.port)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=30, context=self.client_ctx)
            # The same name check as through the proxy: the certificate names bench.allowed.test.
            raw = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            conn.sock = self.client_ctx.wrap_socket(raw, server_hostname="bench.allowed.test")
        try:
            conn.request("GET", path, headers={"Host": "bench.allowed.test"})
            response = conn.getresponse()
            body = response.read()
            if response.status != 200 or body != b"ok":
                raise RuntimeError(f"unexpected reply {response.status} {body[:50]!r}")
        finally:
            conn.close()

    def close(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.server.shutdown()
        self.server.server_close()


def bench_egress_proxy(plan: Plan) -> list[Result]:
    """E1, E2: the proxy's added latency per HTTPS request, and 200 concurrent connections."""
    import tempfile

    n = 100 if plan.quick else 300
    proxied = Series("GET via proxy (CONNECT+TLS)", "ms")
    direct = Series("GET direct (TLS)", "ms")
    added = Series("proxied - direct, paired", "ms")
    with tempfile.TemporaryDirectory() as tmp:
        servers = _EgressServers(Path(tmp))
        try:
            for _ in range(20):  # warm-up
                servers.request(True)
                servers.request(False)
            for _ in range(n):  # ABAB, so drift hits both sides alike
                d = timed(lambda: servers.request(False))
                p = timed(lambda: servers.request(True))
                direct.samples.append(d)
                proxied.samples.append(p)
                added.samples.append(max(p - d, 0.0))
            # E2: 200 connections at once through the one proxy.  An allowed event comes
            # when its connection closes, maybe after the client returned: wait for E1's.
            end = time.monotonic() + 10
            while len(servers.events) < 20 + n and time.monotonic() < end:
                time.sleep(0.01)
            before = len(servers.events)
            fds_before = len(os.listdir("/proc/self/fd"))
            barrier = threading.Barrier(200, timeout=60)
            errors: list[str] = []

            def one(i: int) -> float:
                barrier.wait()
                t0 = time.perf_counter()
                try:
                    servers.request(True, f"/{i}")
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                return time.perf_counter() - t0

            t0 = time.perf_counter()
            with ThreadPoolExecutor(200) as pool:
                latencies = list(pool.map(one, range(200)))
            wall = time.perf_counter() - t0
            end = time.monotonic() + 10
            while (servers.proxy.active or len(servers.events) < before + 200) and time.monotonic() < end:
                time.sleep(0.01)
            leaked = servers.proxy.active
            fds_after = len(os.listdir("/proc/self/fd"))
            allowed = sum(1 for e in servers.events[before:] if e["type"] == "egress.allowed")
        finally:
            servers.close()
    concurrent = Series("200 concurrent GETs via proxy", "ms", latencies)
    if errors or leaked or allowed != 200:
        raise RuntimeError(
            f"200 concurrent: {len(errors)} errors {errors[:3]}, {leaked} open, {allowed} events"
        )
    notes = [
        "in-process proxy (the code the proxy container runs) and HTTPS server on loopback; each request "
        "is a fresh connection with its own TLS handshake; added = proxied - direct of each ABAB pair",
    ]
    c_notes = [
        f"200 threads released together: wall {wall * 1e3:.0f} ms, 0 errors, 200 egress.allowed events, "
        f"0 connections open afterwards, descriptors {fds_before} -> {fds_after}",
    ]
    return [
        Result("-", "E1", "HTTPS request via the egress proxy", proxied, direct, notes=notes),
        Result("-", "E1a", "added latency per HTTPS request", added, None, Target("p50_le", 2.0)),
        Result("-", "E2", "200 concurrent via one proxy", concurrent, None, notes=c_notes),
    ]


def bench_egress_start(backend: str, plan: Plan) -> Result:
    """E3: ``Sandbox()`` with an allowlist vs without network, interleaved."""
    from agentnest import NetworkPolicy

    n = 8 if plan.quick else 20
    policy = SecurityPolicy(network=NetworkPolicy.allowlist(domains=["bench.allowed.test"]))
    ours = Series("Sandbox(allowlist)", "ms")
    base = Series("Sandbox() (no network)", "ms")
    destroy: dict[str, list[float]] = {"allowlist": [], "none": []}
    with Reaper() as reaper:

        def one(kind: str) -> float:
            kwargs: dict[str, Any] = {"security_policy": policy} if kind == "allowlist" else {}
            t0 = time.perf_counter()
            sandbox = reaper.sandbox(backend, **kwargs)
            took = time.perf_counter() - t0
            if sandbox.exec_shell("echo hi").stdout != "hi\n":
                raise RuntimeError("the sandbox did not answer")
            destroy[kind].append(timed(sandbox.destroy))
            return took

        one("allowlist")  # warm-up
        one("none")
        for _ in range(n):
            ours.samples.append(one("allowlist"))
            base.samples.append(one("none"))
    notes = [
        "start = Sandbox() returning (proxy listening, agent ready); "
        f"destroy p50: allowlist {percentile(destroy['allowlist'], 50) * 1e3:.0f} ms, "
        f"no network {percentile(destroy['none'], 50) * 1e3:.0f} ms",
    ]
    return Result(backend, "E3", "start with an allowlist", ours, base, Target("ratio_le", 1.5), notes=notes)


def bench_egress(backend: str, plan: Plan) -> list[Result]:
    """E: the egress allowlist.  E1/E2 do not depend on the sandbox's runtime (the proxy
    runs with runc): measured once, with the docker backend."""
    results = [bench_egress_start(backend, plan)]
    if backend == "docker":
        results = [*bench_egress_proxy(plan), *results]
        for r in results:
            r.backend = backend
    return results
