"""The egress proxy (egress/proxy.py), in-process on loopback against local servers, and as shipped.

Its pure parts have their own tests: test_egress_rules.py, test_egress_hello.py,
test_egress_head.py.

Local HTTP and HTTPS servers on 127.0.0.1 stand in for allowed and refused
domains; the proxy's ``hosts`` mapping points the test names at them.
Loopback is a "private" range, so most tests admit it with
``cidrs=["127.0.0.0/8"]``; others check that without it the same names are
refused.  No traffic leaves loopback: every name is mapped, and the DNS
tests patch ``socket.getaddrinfo``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import glob
import http.server
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agentnest.egress import proxy as px
from agentnest.egress import serve
from agentnest.egress.proxy import Limits, Proxy, Rules
from agentnest.runtime.egresslog import PROXY_MODULES, proxy_command

NAMES = ("allowed.test", "api.allowed.test", "refused.test", "other.test", "private.test")
LOOPBACK = ["127.0.0.0/8"]


# -- local servers -------------------------------------------------------------------


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.requests.append((self.command, self.path, self.headers.get("Host")))
        if self.path == "/redirect":
            self._reply(302, b"", {"Location": f"http://refused.test:{self.server.redirect_port}/"})
        else:
            self._reply(200, f"hello {self.headers.get('Host')} {self.path}".encode())

    def do_POST(self) -> None:
        self.server.requests.append((self.command, self.path, self.headers.get("Host")))
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._reply(200, b"echo:" + body)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512

    def __init__(self, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, 0), Handler)
        self.tls = tls
        self.requests: list[tuple[str, str, str | None]] = []
        self.accepted = 0
        self.redirect_port = 0

    def finish_request(self, request: Any, client_address: Any) -> None:
        self.accepted += 1
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            self.RequestHandlerClass(conn, client_address, self)  # type: ignore[arg-type]
        finally:
            conn.close()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for every test name (the client trusts it as its CA)."""
    d = tmp_path_factory.mktemp("tls")
    san = ",".join(f"DNS:{n}" for n in NAMES)
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2"),
            *("-subj", "/CN=test", "-addext", f"subjectAltName={san}"),
        ],
        check=True,
        capture_output=True,
    )
    return d


@pytest.fixture(scope="module")
def servers(cert: Path) -> Iterator[tuple[Server, Server]]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert / "cert.pem", cert / "key.pem")
    plain, tls = Server(), Server(ctx)
    plain.redirect_port = plain.port
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (plain, tls)]
    for t in threads:
        t.start()
    yield plain, tls
    for s in (plain, tls):
        s.shutdown()
        s.server_close()


@pytest.fixture
def client_ctx(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert / "cert.pem"))


# -- the proxy in a thread -----------------------------------------------------------


class ProxyThread:
    """A :class:`Proxy` on its own event loop in a thread; events collected."""

    def __init__(self, rules: Rules, limits: Limits | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.loop = asyncio.new_event_loop()
        self.proxy = Proxy(rules, limits, emit=self._emit)
        self.addr: tuple[str, int] = ("", 0)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.addr = self.loop.run_until_complete(self.proxy.start("127.0.0.1", 0))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def _emit(self, event: dict[str, Any]) -> None:
        json.dumps(event)  # every event must be JSON-serialisable
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    @property
    def url(self) -> str:
        return f"http://{self.addr[0]}:{self.addr[1]}"

    def wait_events(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.events) >= count, timeout), self.events
            return list(self.events)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no connection is open in the proxy (polls the real counter)."""
        end = time.monotonic() + timeout
        while self.proxy.active or self.proxy._tasks:
            assert time.monotonic() < end, f"{self.proxy.active} connections still open"
            time.sleep(0.01)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def make_proxy(servers: Servers) -> Iterator[Callable[..., ProxyThread]]:
    made: list[ProxyThread] = []
    plain, tls = servers

    def make(
        domains: tuple[str, ...] = ("allowed.test", "*.allowed.test", "private.test"),
        cidrs: list[str] | None = None,
        ports: tuple[int, ...] | None = None,
        hosts: dict[str, Any] | None = None,
        subdomains: bool = True,
        **limits: Any,
    ) -> ProxyThread:
        mapping: dict[str, Any] = dict.fromkeys(NAMES[:4], "127.0.0.1")
        mapping["private.test"] = "10.255.0.1"
        mapping.update(hosts or {})
        rules = Rules(
            domains,
            LOOPBACK if cidrs is None else cidrs,
            ports or (plain.port, tls.port),
            mapping,
            subdomains=subdomains,
        )
        p = ProxyThread(rules, Limits(**limits))
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


def unordered(items: Iterable[Any]) -> list[Any]:
    """``items`` sorted: the proxy records a connection when it ends, so an
    allowed connection's record may land after the next (refused) one's."""
    return sorted(items, key=repr)


def opener(p: ProxyThread, ctx: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": p.url, "https": p.url}),
        urllib.request.HTTPSHandler(context=ctx),
    )


def fetch(p: ProxyThread, url: str, ctx: ssl.SSLContext | None = None, data: bytes | None = None) -> bytes:
    with opener(p, ctx).open(url, data=data, timeout=10) as r:
        return bytes(r.read())


def raw(p: ProxyThread, payload: bytes, *, read: bool = True) -> bytes:
    """Send bytes to the proxy, return everything it answers until it closes."""
    with socket.create_connection(p.addr, timeout=10) as s:
        s.sendall(payload)
        if not read:
            return b""
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def tunnel(p: ProxyThread, target: str) -> socket.socket:
    """A socket on which CONNECT ``target`` was answered with 200."""
    s = socket.create_connection(p.addr, timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        data = s.recv(4096)
        if not data:
            break
        reply += data
    if not reply.startswith(b"HTTP/1.1 200"):
        s.close()
        raise AssertionError(reply)
    return s


def assert_serves(p: ProxyThread, servers: Servers, ctx: ssl.SSLContext) -> None:
    """The proxy still serves a good client (after a bad one)."""
    tls = servers[1]
    assert fetch(p, f"https://allowed.test:{tls.port}/still-up", ctx).startswith(b"hello allowed.test")


def last(p: ProxyThread, count: int) -> dict[str, Any]:
    return p.wait_events(count)[count - 1]


Make = Callable[..., ProxyThread]
Servers = tuple[Server, Server]


# -- allowed traffic -----------------------------------------------------------------


def test_plain_http_allowed(make_proxy: Make, servers: Servers) -> None:
    plain, _ = servers
    p = make_proxy()
    body = fetch(p, f"http://allowed.test:{plain.port}/x?y=1")
    assert body == f"hello allowed.test:{plain.port} /x?y=1".encode()
    # Forwarded in origin form, with the Host the client sent.
    assert plain.requests[-1] == ("GET", "/x?y=1", f"allowed.test:{plain.port}")
    event = last(p, 1)
    assert event["type"] == "egress.allowed"
    assert event["reason"] == "allowed"
    assert (event["host"], event["port"], event["address"]) == ("allowed.test", plain.port, "127.0.0.1")
    assert event["bytes_up"] > 0 and event["bytes_down"] > len(body)
    assert event["method"] == "GET"
    assert 0 <= event["duration"] < 10 and abs(event["time"] - time.time()) < 60


def test_https_allowed(make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext) -> None:
    _, tls = servers
    p = make_proxy()
    assert fetch(p, f"https://api.allowed.test:{tls.port}/", client_ctx) == (
        f"hello api.allowed.test:{tls.port} /".encode()
    )
    event = last(p, 1)
    assert (event["type"], event["method"]) == ("egress.allowed", "CONNECT")
    assert event["host"] == "api.allowed.test"
    assert event["bytes_up"] > 100 and event["bytes_down"] > 100  # TLS both ways


def test_post_bodies_are_relayed(make_proxy: Make, servers: Servers) -> None:
    plain, _ = servers
    p = make_proxy()
    big = b"a" * 100_000
    assert fetch(p, f"http://allowed.test:{plain.port}/echo", data=big) == b"echo:" + big
    chunked = (
        f"POST http://allowed.test:{plain.port}/echo HTTP/1.1\r\nHost: allowed.test:{plain.port}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    ).encode()
    reply = raw(p, chunked)
    assert reply.startswith(b"HTTP/1.0 200") or reply.startswith(b"HTTP/1.1 200")
    assert reply.endswith(b"echo:hello world")


def test_connect_to_allowed_ip_literal_needs_no_sni(make_proxy: Make, servers: Servers) -> None:
    _, tls = servers
    p = make_proxy()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with tunnel(p, f"127.0.0.1:{tls.port}") as s, ctx.wrap_socket(s) as t:
        t.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert t.recv(100).startswith(b"HTTP/1.")
    assert last(p, 1)["type"] == "egress.allowed"


# -- refusals ------------------------------------------------------------------------


def test_refused_domain(make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext) -> None:
    plain, tls = servers
    p = make_proxy()
    before = len(plain.requests), tls.accepted
    with pytest.raises(urllib.error.HTTPError) as info:
        fetch(p, f"http://refused.test:{plain.port}/")
    assert info.value.code == 403
    assert info.value.headers["X-AgentNest-Egress"] == "denied; reason=domain_not_allowed"
    info.value.close()
    with pytest.raises(urllib.error.URLError, match="403"):
        fetch(p, f"https://refused.test:{tls.port}/", client_ctx)
    events = p.wait_events(2)
    assert [e["reason"] for e in events] == ["domain_not_allowed"] * 2
    assert all(e["type"] == "egress.denied" and e["host"] == "refused.test" for e in events)
    assert (len(plain.requests), tls.accepted) == before  # nothing reached a server


def test_wildcard_does_not_admit_the_bare_suffix(make_proxy: Make, servers: Servers) -> None:
    plain, _ = servers
    p = make_proxy(domains=("*.allowed.test",))
    assert fetch(p, f"http://api.allowed.test:{plain.port}/").startswith(b"hello")
    with pytest.raises(urllib.error.HTTPError, match="403"):
        fetch(p, f"http://allowed.test:{plain.port}/")


def test_a_listed_name_admits_its_subdomains(
    make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext
) -> None:
    """0.3.0's rule, our default: ``allowed.test`` admits ``api.allowed.test``."""
    plain, tls = servers
    p = make_proxy(domains=("allowed.test",))
    assert (
        fetch(p, f"http://api.allowed.test:{plain.port}/sub")
        == f"hello api.allowed.test:{plain.port} /sub".encode()
    )
    assert fetch(p, f"https://api.allowed.test:{tls.port}/", client_ctx).startswith(b"hello api.allowed.test")
    assert fetch(p, f"http://allowed.test:{plain.port}/").startswith(b"hello allowed.test")
    # A name that merely ends in the same letters is another domain.
    assert raw(p, f"CONNECT xallowed.test:{tls.port} HTTP/1.1\r\n\r\n".encode()).startswith(b"HTTP/1.1 403")
    events = p.wait_events(4)
    assert unordered((e["host"], e["reason"]) for e in events) == unordered(
        [
            ("api.allowed.test", "allowed"),
            ("api.allowed.test", "allowed"),
            ("allowed.test", "allowed"),
            ("xallowed.test", "domain_not_allowed"),
        ]
    )


def test_strict_matching_admits_only_the_listed_names(
    make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext
) -> None:
    """``subdomains=False``: ``allowed.test`` is exactly that name."""
    plain, tls = servers
    p = make_proxy(domains=("allowed.test",), subdomains=False)
    assert fetch(p, f"http://allowed.test:{plain.port}/").startswith(b"hello allowed.test")
    before = len(plain.requests), tls.accepted
    with pytest.raises(urllib.error.HTTPError) as info:
        fetch(p, f"http://api.allowed.test:{plain.port}/")
    assert info.value.headers["X-AgentNest-Egress"] == "denied; reason=domain_not_allowed"
    info.value.close()
    with pytest.raises(urllib.error.URLError, match="403"):
        fetch(p, f"https://api.allowed.test:{tls.port}/", client_ctx)
    assert unordered(e["reason"] for e in p.wait_events(3)) == unordered(
        ["allowed", "domain_not_allowed", "domain_not_allowed"]
    )
    assert (len(plain.requests), tls.accepted) == before  # nothing reached a server
    # A '*.suffix' entry still names what is below it.
    q = make_proxy(domains=("*.allowed.test",), subdomains=False)
    assert fetch(q, f"http://api.allowed.test:{plain.port}/").startswith(b"hello api.allowed.test")


def test_a_listed_ip_literal_admits_exactly_that_address(make_proxy: Make, servers: Servers) -> None:
    """``127.0.0.1`` among the domains: that address is reachable, other private ones are not."""
    plain, tls = servers
    p = make_proxy(domains=("127.0.0.1",), cidrs=[])
    assert fetch(p, f"http://127.0.0.1:{plain.port}/lit") == f"hello 127.0.0.1:{plain.port} /lit".encode()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with tunnel(p, f"127.0.0.1:{tls.port}") as s, ctx.wrap_socket(s) as t:  # TLS to an address: no SNI
        t.sendall(b"GET /tls HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert t.recv(100).startswith(b"HTTP/1.")
    before = len(plain.requests)
    for target in ("127.0.0.2", "10.255.0.1"):
        reply = raw(p, f"CONNECT {target}:{plain.port} HTTP/1.1\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 403"), reply
    reply = raw(
        p, f"GET http://127.0.0.2:{plain.port}/ HTTP/1.1\r\nHost: 127.0.0.2:{plain.port}\r\n\r\n".encode()
    )
    assert reply.startswith(b"HTTP/1.1 403")
    events = p.wait_events(5)
    assert unordered((e["type"], e["reason"]) for e in events) == unordered(
        [("egress.allowed", "allowed")] * 2 + [("egress.denied", "ip_not_allowed")] * 3
    )
    assert [e["address"] for e in events if e["type"] == "egress.allowed"] == ["127.0.0.1"] * 2
    assert len(plain.requests) == before


def test_a_name_resolving_to_a_listed_address_is_still_checked(make_proxy: Make, servers: Servers) -> None:
    """Listing an address admits it as a literal, not as the answer for a name: that needs cidrs."""
    plain, tls = servers
    p = make_proxy(domains=("127.0.0.1", "allowed.test"), cidrs=[])
    with pytest.raises(urllib.error.HTTPError, match="403"):
        fetch(p, f"http://allowed.test:{plain.port}/")
    assert raw(p, f"CONNECT allowed.test:{tls.port} HTTP/1.1\r\n\r\n".encode()).startswith(b"HTTP/1.1 403")
    events = p.wait_events(2)
    assert [(e["reason"], e["address"]) for e in events] == [("address_refused", "127.0.0.1")] * 2


@pytest.fixture
def server6() -> Iterator[Server]:
    try:
        server = Server(host="::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback on this machine: {exc}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("entry", ["::1", "[::1]", "0:0::1"])
def test_a_listed_ipv6_literal(make_proxy: Make, server6: Server, entry: str) -> None:
    p = make_proxy(domains=(entry,), cidrs=[], ports=(server6.port,))
    assert fetch(p, f"http://[::1]:{server6.port}/six") == f"hello [::1]:{server6.port} /six".encode()
    for target in ("[::2]", "[::ffff:127.0.0.1]", "127.0.0.1"):
        reply = raw(p, f"CONNECT {target}:{server6.port} HTTP/1.1\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 403"), (target, reply)
    events = p.wait_events(4)
    assert [e["address"] for e in events if e["type"] == "egress.allowed"] == ["::1"]
    assert unordered(e["reason"] for e in events) == unordered(["allowed"] + ["ip_not_allowed"] * 3)
    assert len(server6.requests) == 1


def test_refused_port(make_proxy: Make, servers: Servers) -> None:
    p = make_proxy()
    reply = raw(p, b"CONNECT allowed.test:22 HTTP/1.1\r\nHost: allowed.test:22\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403")
    event = last(p, 1)
    assert (event["reason"], event["port"], event["address"]) == ("port_not_allowed", 22, "")


def test_loopback_refused_without_cidrs(
    make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext
) -> None:
    plain, tls = servers
    p = make_proxy(cidrs=[])
    with pytest.raises(urllib.error.HTTPError, match="403"):
        fetch(p, f"http://allowed.test:{plain.port}/")
    with pytest.raises(urllib.error.URLError, match="403"):
        fetch(p, f"https://allowed.test:{tls.port}/", client_ctx)
    events = p.wait_events(2)
    assert {e["reason"] for e in events} == {"address_refused"}
    assert "127.0.0.1 is loopback" in events[0]["detail"]
    assert events[0]["address"] == "127.0.0.1"


@pytest.mark.parametrize(
    "address",
    [
        "10.255.0.1",  # private
        "169.254.169.254",  # cloud metadata
        "fd00:ec2::254",  # AWS metadata over IPv6
        "::1",
        "::ffff:10.0.0.1",  # IPv4-mapped private
        "::ffff:169.254.169.254",
        "fe80::1",
        "224.0.0.1",
        "0.0.0.0",
        "240.0.0.1",
        "100.100.100.200",  # shared address space (a metadata service)
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
    ],
)
def test_allowed_name_resolving_to_internal_address_is_refused(
    make_proxy: Make, servers: Servers, address: str
) -> None:
    plain, _ = servers
    p = make_proxy(cidrs=[], hosts={"private.test": address})
    reply = raw(p, f"CONNECT private.test:{plain.port} HTTP/1.1\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 403")
    event = last(p, 1)
    assert (event["reason"], event["address"]) == ("address_refused", str(ipaddress.ip_address(address)))


@pytest.mark.parametrize("target", ["127.0.0.1", "10.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "2130706433"])
def test_ip_literals_need_a_cidr(make_proxy: Make, servers: Servers, target: str) -> None:
    _, tls = servers
    p = make_proxy(cidrs=["192.0.2.0/24"])  # documentation range: nothing real
    reply = raw(p, f"CONNECT {target}:{tls.port} HTTP/1.1\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 403") or reply.startswith(b"HTTP/1.1 400")
    assert last(p, 1)["reason"] in {"ip_not_allowed", "domain_not_allowed"}


def test_sni_must_match_connect_host(make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext) -> None:
    """Domain fronting: CONNECT an allowed name, name another in the TLS hello."""
    _, tls = servers
    p = make_proxy()
    before = tls.accepted
    with tunnel(p, f"allowed.test:{tls.port}") as s, pytest.raises((ssl.SSLError, OSError)):
        client_ctx.wrap_socket(s, server_hostname="refused.test")
    event = last(p, 1)
    assert (event["type"], event["reason"]) == ("egress.denied", "sni_mismatch")
    assert "refused.test" in event["detail"]
    assert tls.accepted == before  # the server never saw a connection
    assert_serves(p, servers, client_ctx)


def test_hello_without_sni_is_refused(make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext) -> None:
    _, tls = servers
    p = make_proxy()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with tunnel(p, f"allowed.test:{tls.port}") as s, pytest.raises((ssl.SSLError, OSError)):
        ctx.wrap_socket(s, server_hostname=None)
    assert last(p, 1)["reason"] == "sni_missing"


def test_tunnel_carries_tls_only(make_proxy: Make, servers: Servers) -> None:
    plain, _ = servers
    p = make_proxy()
    before = len(plain.requests)
    with tunnel(p, f"allowed.test:{plain.port}") as s:
        s.sendall(f"GET / HTTP/1.1\r\nHost: allowed.test:{plain.port}\r\n\r\n".encode())
        assert s.recv(100) == b""
    assert last(p, 1)["reason"] == "bad_client_hello"
    assert len(plain.requests) == before


def test_client_hello_that_never_comes(
    make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext
) -> None:
    _, tls = servers
    p = make_proxy(hello_timeout=0.5)
    with tunnel(p, f"allowed.test:{tls.port}") as s:
        s.sendall(b"\x16\x03\x01\x02")  # half a record header, then silence
        assert s.recv(100) == b""  # closed by the proxy at its deadline
    assert last(p, 1)["reason"] == "no_client_hello"
    assert_serves(p, servers, client_ctx)


def test_host_header_must_match_target(
    make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext
) -> None:
    plain, _ = servers
    p = make_proxy()
    before = len(plain.requests)
    for host_header in ("refused.test", f"refused.test:{plain.port}", "allowed.test:1"):
        reply = raw(
            p, f"GET http://allowed.test:{plain.port}/ HTTP/1.1\r\nHost: {host_header}\r\n\r\n".encode()
        )
        assert reply.startswith(b"HTTP/1.1 400")
    two_hosts = f"GET http://allowed.test:{plain.port}/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".encode()
    assert raw(p, two_hosts).startswith(b"HTTP/1.1 400")
    assert [e["reason"] for e in p.wait_events(4)] == ["host_mismatch"] * 4
    assert len(plain.requests) == before
    assert_serves(p, servers, client_ctx)


def test_redirect_to_refused_domain_is_refused(make_proxy: Make, servers: Servers) -> None:
    plain, _ = servers
    p = make_proxy()
    with pytest.raises(urllib.error.HTTPError) as info:
        fetch(p, f"http://allowed.test:{plain.port}/redirect")  # urllib follows the 302
    assert info.value.code == 403
    info.value.close()
    events = p.wait_events(2)
    assert unordered((e["type"], e["host"]) for e in events) == unordered(
        [("egress.allowed", "allowed.test"), ("egress.denied", "refused.test")]
    )


def test_pipelined_second_request_is_not_forwarded(make_proxy: Make, servers: Servers) -> None:
    """One request per connection: a second one (another Host) never reaches the server."""
    plain, _ = servers
    p = make_proxy()
    before = len(plain.requests)
    first = f"GET http://allowed.test:{plain.port}/one HTTP/1.1\r\nHost: allowed.test:{plain.port}\r\n\r\n"
    second = f"GET /two HTTP/1.1\r\nHost: refused.test:{plain.port}\r\n\r\n"
    reply = raw(p, (first + second).encode())
    assert b"/one" in reply and b"/two" not in reply
    assert [r[1] for r in plain.requests[before:]] == ["/one"]


def test_request_smuggling_framing_is_refused(make_proxy: Make, servers: Servers) -> None:
    plain, _ = servers
    p = make_proxy()
    head = f"POST http://allowed.test:{plain.port}/echo HTTP/1.1\r\nHost: allowed.test:{plain.port}\r\n"
    for extra in (
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: gzip, chunked\r\n",
        "Content-Length: 5\r\nContent-Length: 6\r\n",
        "Content-Length: -1\r\n",
    ):
        assert raw(p, (head + extra + "\r\nhello").encode()).startswith(b"HTTP/1.1 400")
    assert {e["reason"] for e in p.wait_events(4)} == {"bad_request"}


@pytest.mark.parametrize(
    "payload",
    [
        b"CONNECT\r\n\r\n",
        b"CONNECT allowed.test HTTP/1.1\r\n\r\n",  # no port
        b"CONNECT allowed.test:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:0 HTTP/1.1\r\n\r\n",
        b"CONNECT [::1 HTTP/1.1\r\n\r\n",
        b"CONNECT user@allowed.test:443 HTTP/1.1\r\n\r\n",
        b"connect allowed.test:443 HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/2.0\r\n\r\n",
        b"CONNECT allowed.test:443  HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/1.1\r\nBad Header\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/1.1\r\nX: a\x00b\r\n\r\n",
        b"CONNECT bad_name!:443 HTTP/1.1\r\n\r\n",
        b"CONNECT allowed.test:443 HTTP/1.1\n\n",  # bare LF: never completes, closed
        b"\x16\x03\x01\x00\x05hello\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",  # origin form: not a proxy request
        b"GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        b"GET http:///x HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        b"",
    ],
)
def test_malformed_requests_are_refused_and_logged(
    make_proxy: Make,
    servers: Servers,
    client_ctx: ssl.SSLContext,
    payload: bytes,
) -> None:
    p = make_proxy(header_timeout=1.0)
    reply = raw(p, payload)
    assert not reply.startswith(b"HTTP/1.1 200")
    event = last(p, 1)
    assert event["type"] == "egress.denied"
    assert event["reason"] in {
        "bad_request",
        "bad_host",
        "method_not_allowed",
        "header_timeout",
        "port_not_allowed",
        "domain_not_allowed",
    }
    assert_serves(p, servers, client_ctx)


def test_oversized_head(make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext) -> None:
    p = make_proxy()
    big = b"CONNECT allowed.test:443 HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
    assert raw(p, big).startswith(b"HTTP/1.1 431")
    many = b"CONNECT allowed.test:443 HTTP/1.1\r\n" + b"X: 1\r\n" * 200 + b"\r\n"
    assert raw(p, many).startswith(b"HTTP/1.1 431")
    assert [e["reason"] for e in p.wait_events(2)] == ["header_too_large"] * 2
    assert_serves(p, servers, client_ctx)


def test_slowloris(make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext) -> None:
    """A client dripping its head is cut at the header deadline; others are served meanwhile."""
    p = make_proxy(header_timeout=1.0)
    with socket.create_connection(p.addr, timeout=10) as s:
        start = time.monotonic()
        s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\n")
        assert_serves(p, servers, client_ctx)  # while the slow client holds a connection
        reply = b""
        with contextlib.suppress(OSError):
            for _ in range(100):
                s.sendall(b"X: y\r\n")  # each piece in time, the whole head never
                s.settimeout(0.05)
                with contextlib.suppress(TimeoutError):
                    reply += s.recv(4096)
                if reply:
                    break
        assert reply.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - start < 5
    assert any(e["reason"] == "header_timeout" for e in p.wait_events(2))


def test_connection_limit(make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext) -> None:
    p = make_proxy(max_connections=2, header_timeout=5.0)
    held = [socket.create_connection(p.addr, timeout=10) for _ in range(2)]
    try:
        end = time.monotonic() + 5
        while p.proxy.active < 2:
            assert time.monotonic() < end
            time.sleep(0.01)
        assert raw(p, b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 503")
        assert last(p, 1)["reason"] == "too_many_connections"
    finally:
        for s in held:
            s.close()
    p.wait_idle()
    assert_serves(p, servers, client_ctx)


def test_two_hundred_concurrent_connections(
    make_proxy: Make, servers: Servers, client_ctx: ssl.SSLContext
) -> None:
    _, tls = servers
    p = make_proxy()
    fds_before = len(os.listdir("/proc/self/fd"))
    barrier = threading.Barrier(200, timeout=30)

    def one(i: int) -> bytes:
        o = opener(p, client_ctx)
        barrier.wait()  # all 200 in flight together
        with o.open(f"https://allowed.test:{tls.port}/{i}", timeout=30) as r:
            return bytes(r.read())

    with ThreadPoolExecutor(200) as pool:
        bodies = list(pool.map(one, range(200)))
    assert bodies == [f"hello allowed.test:{tls.port} /{i}".encode() for i in range(200)]
    events = p.wait_events(200)
    assert len(events) == 200 and {e["type"] for e in events} == {"egress.allowed"}
    p.wait_idle()
    assert p.proxy.active == 0 and not p.proxy._tasks
    # No descriptor leaked on the proxy's side (nor the clients').
    end = time.monotonic() + 10
    while len(os.listdir("/proc/self/fd")) > fds_before + 5:
        assert time.monotonic() < end, "descriptors leaked"
        time.sleep(0.05)


def test_resolves_once_and_connects_to_the_checked_address(
    make_proxy: Make, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the address that was checked is the one connected to; one lookup."""
    plain, _ = servers
    calls: list[str] = []
    answers = iter(["127.0.0.1", "10.0.0.1"])  # a second answer would be a rebinding

    real = socket.getaddrinfo

    def fake_getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "dns.allowed.test.":  # the proxy asks for the absolute name
            return real(host, port, *args, **kwargs)  # the client's own connection to the proxy
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    p = make_proxy(domains=("dns.allowed.test",), hosts={})
    assert fetch(p, f"http://dns.allowed.test:{plain.port}/").startswith(b"hello")
    assert calls == ["dns.allowed.test."]
    assert last(p, 1)["address"] == "127.0.0.1"


def test_unresolvable_name_is_a_denial(
    make_proxy: Make, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo

    def fail(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "nx.allowed.test.":
            return real(host, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    plain, _ = servers
    p = make_proxy(domains=("nx.allowed.test",), hosts={})
    reply = raw(p, f"CONNECT nx.allowed.test:{plain.port} HTTP/1.1\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 502")
    assert last(p, 1)["reason"] == "resolve_failed"


def test_closing_the_proxy_ends_open_connections_with_events(
    servers: Servers, client_ctx: ssl.SSLContext
) -> None:
    _, tls = servers
    p = ProxyThread(Rules(["allowed.test"], LOOPBACK, [tls.port], {"allowed.test": "127.0.0.1"}))
    s = tunnel(p, f"allowed.test:{tls.port}")
    try:
        p.stop()
        assert s.recv(10) == b""
    finally:
        s.close()
    assert p.events[-1]["type"] == "egress.denied"


# -- the program, as the backends ship it -------------------------------------------

EGRESS_DIR = Path(px.__file__).resolve().parent
#: What a pure module of the proxy must never import: it decides, the proxy does the I/O.
IO_MODULES = {"asyncio", "os", "select", "selectors", "signal", "socket", "ssl", "subprocess", "threading"}


def _imports(name: str) -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse((EGRESS_DIR / f"{name}.py").read_text("utf-8"), feature_version=(3, 8))
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


@pytest.mark.parametrize("name", PROXY_MODULES)
def test_the_shipped_modules_run_on_python_3_8_and_import_only_the_stdlib_and_each_other(name: str) -> None:
    """The proxy runs on the image's Python: no syntax newer than 3.8, nothing outside its package."""
    for node in _imports(name):  # ast.parse above refuses newer syntax
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1, "the proxy imports nothing outside egress/"
            assert node.module in PROXY_MODULES[: PROXY_MODULES.index(name)], (name, node.module)
            continue
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for module in modules:
            assert module.split(".")[0] in set(sys.stdlib_module_names) | {"__future__"}, (name, module)


@pytest.mark.parametrize("name", ["rules", "hello", "head"])
def test_the_pure_modules_do_no_io(name: str) -> None:
    for node in _imports(name):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for module in modules:
            assert module.split(".")[0] not in IO_MODULES, (name, module)


def test_the_package_names_every_shipped_module() -> None:
    shipped = {path.stem for path in EGRESS_DIR.glob("*.py")} - {"__init__"}
    assert shipped == set(PROXY_MODULES)


def _python38() -> str | None:
    """A Python 3.8 interpreter on this machine, if there is one (PATH or pyenv)."""
    candidates = [
        shutil.which("python3.8"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8"))),
    ]
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.parametrize("python", [sys.executable, "python3.8"], ids=["this-python", "python3.8"])
def test_program_prints_ready_and_stops_at_its_deadline(servers: Servers, python: str) -> None:
    """The proxy as the backends run it, on this Python and on the oldest it supports (if installed)."""
    if python == "python3.8":
        found = _python38()
        if found is None:
            pytest.skip("no Python 3.8 on this machine")
        python = found
    plain, _ = servers
    config = {
        "listen": ["127.0.0.1", 0],
        "domains": ["allowed.test"],
        "cidrs": LOOPBACK,
        "ports": [plain.port],
        "hosts": {"allowed.test": "127.0.0.1"},
        "deadline": time.time() + 3,
    }
    # The container's argv: the bundle through the agent's loader, not the files.
    proc = subprocess.Popen(proxy_command(python, config), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["type"] == "proxy.ready"
        host, port = ready["listen"]
        with socket.create_connection((host, port), timeout=5) as s:
            target = f"allowed.test:{plain.port}"
            s.sendall(f"GET http://{target}/p HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            assert s.recv(100).startswith(b"HTTP/1.")
        event = json.loads(proc.stdout.readline())
        assert (event["type"], event["host"]) == ("egress.allowed", "allowed.test")
        assert proc.wait(timeout=10) == 0  # the deadline ended it
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def test_a_moved_deadline_counts_only_from_a_root_owned_regular_file(tmp_path: Path) -> None:
    read_deadline = serve.read_deadline
    good = tmp_path / "deadline"
    good.write_text("1234567890.5")
    os.chown(good, 0, 0)
    assert read_deadline(str(good)) == 1234567890.5
    link = tmp_path / "link"
    link.symlink_to(good)
    assert read_deadline(str(link)) is None  # never through a link
    forged = tmp_path / "forged"
    forged.write_text("9999999999")
    os.chown(forged, 65532, 65532)  # what the proxy's own user could write
    assert read_deadline(str(forged)) is None
    for text in ("nan", "inf", "soon", ""):
        good.write_text(text)
        assert read_deadline(str(good)) is None
    assert read_deadline(str(tmp_path / "missing")) is None
