"""A faithful fake of the kube-apiserver's pod exec endpoint, for tests and benchmarks.

No cluster can run on the build machines, so the Kubernetes backend's data
plane is tested against this: a real HTTPS server (aiohttp, in a background
thread, on 127.0.0.1, with a throwaway CA) that speaks the exec websocket the
way the apiserver's StreamTranslator does (research/kubernetes.md §1, §4.3),
and a kubeconfig pointing at it (bearer token, checked).  The real ``kubectl``
must be able to use it: that is the cross-check that keeps it honest.

What it reproduces:

- ``GET /api/v1/namespaces/{ns}/pods/{name}``: a minimal Pod (``phase``).
- ``GET .../pods/{name}/exec?command=..&container=..&stdin=..``: refusals
  before the upgrade as the apiserver's ``Status`` JSON (401 bad token, 403
  RBAC, 404 pod, 400 bad container / completed pod / no command or no
  common subprotocol); ``v5.channel.k8s.io`` preferred, ``v4`` accepted (the
  kubelet path, no stdin CLOSE), only ``v4`` when ``pre_130=True``.
- an empty stdout message first ("connected"); stdout and stderr relayed in
  messages of at most 32 KiB; ``[255, 0]`` closes the process's stdin (v5);
  client messages over 32 MiB close the connection (1009); unknown channels
  and empty messages ignored; at the end one channel-3 ``Status`` (Success,
  or NonZeroExitCode with an ExitCode cause, or InternalError when the
  command cannot start), then a close frame.
- faults: ``forbid_exec`` (403), ``drop_after=N`` (abort the TCP connection
  after N stdout bytes, no status: a lost stream).

Who runs the command is a :class:`PodRunner`: :class:`LocalPod` (a local
process) or :class:`DockerPod` (``docker exec -i CONTAINER argv...``).  Like
a real exec'd process, a command keeps running when its client goes away; it
gets EOF on stdin.  All are killed when the server stops.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import signal
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import ClusterState

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
#: The server relays output in messages this large at most (the apiserver's io.Copy buffer).
OUTPUT_CHUNK = 32 * 1024
#: x/net/websocket's DefaultMaxPayloadBytes: a bigger client frame ends the connection.
MAX_CLIENT_FRAME = 32 << 20
#: Go's net/http MaxHeaderBytes: the argv travels in the request line.
MAX_REQUEST_HEAD = 1 << 20


class PodRunner:
    """Runs an exec'd command "in the pod": builds the host argv that does it.

    ``command`` returns ``None`` when the container is not running (the
    kubelet's "container not found").
    """

    cwd: str | None = None
    env: Mapping[str, str] | None = None

    def command(self, argv: Sequence[str], container: str) -> list[str] | None:
        raise NotImplementedError


@dataclass
class _NodeRunner(PodRunner):
    """A pod of a :class:`ClusterState`: its node says how to run commands in it."""

    build: Callable[[Sequence[str], str], list[str] | None]

    def command(self, argv: Sequence[str], container: str) -> list[str] | None:
        return self.build(argv, container)


@dataclass
class LocalPod(PodRunner):
    """The command runs as a process on this host (``cwd``/``env`` optional)."""

    cwd: str | None = None
    env: Mapping[str, str] | None = None

    def command(self, argv: Sequence[str], container: str) -> list[str]:
        return list(argv)


@dataclass
class DockerPod(PodRunner):
    """The command runs in a local container: ``docker exec -i CONTAINER argv...``."""

    container: str
    docker: str = "docker"

    def command(self, argv: Sequence[str], container: str) -> list[str]:
        return [self.docker, "exec", "-i", self.container, *argv]


@dataclass
class FakePod:
    """A pod the fake knows: its containers, phase and runner."""

    name: str
    runner: PodRunner
    namespace: str = "default"
    containers: tuple[str, ...] = ("main",)
    phase: str = "Running"


@dataclass
class ExecRecord:
    """What one exec asked for (for assertions)."""

    namespace: str
    pod: str
    container: str
    argv: list[str]
    subprotocol: str
    stdin: bool
    messages_in: int = 0
    stdin_closed: bool = False
    status: dict[str, Any] | None = None


_DISCOVERY: dict[str, dict[str, Any]] = {
    "/api": {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    },
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "pods",
                "singularName": "pod",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get", "list"],
                "shortNames": ["po"],
            },
            {
                "name": "pods/exec",
                "singularName": "",
                "namespaced": True,
                "kind": "PodExecOptions",
                "verbs": ["create", "get"],
            },
        ],
    },
    "/version": {
        "major": "1",
        "minor": "37",
        "gitVersion": "v1.37.0-agentnest-fake",
        "platform": "linux/amd64",
    },
}


def _status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    from .cluster import status_doc

    return status_doc(code, reason, message, details)


def _make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost: (ca, cert, key) PEM files.

    With the ``cryptography`` package when it is installed, else the ``openssl`` command.
    """
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _make_tls_openssl(directory)
    return _make_tls_cryptography(directory)


def _make_tls_openssl(directory: Path) -> tuple[Path, Path, Path]:
    import subprocess

    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "server.crt", directory / "server.key", directory / "server.csr"
    ext = directory / "server.ext"
    ext.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    steps = [
        [
            "openssl",
            "req",
            "-x509",
            *ec,
            "-keyout",
            ca_key,
            "-out",
            ca,
            "-days",
            "1",
            "-subj",
            "/CN=agentnest fake kube CA",
        ],
        ["openssl", "req", "-new", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=kube-apiserver"],
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "1",
            "-extfile",
            ext,
        ],
    ]
    for step in steps:
        subprocess.run([str(a) for a in step], check=True, capture_output=True)
    key.chmod(0o600)
    ca_key.chmod(0o600)
    return ca, cert, key


def _make_tls_cryptography(directory: Path) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentnest fake kube CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return ca_path, cert_path, key_path


class FakeKubeAPI:
    """The fake apiserver (see the module docstring).  Use as a context manager.

    Args:
        token: the bearer token the server accepts (random by default).
        pre_130: serve only ``v4.channel.k8s.io`` (a cluster before 1.30, or
            with ``TranslateStreamCloseWebsocketRequests`` off).
        directory: where the CA, certificate and kubeconfig go (a temporary
            directory by default, removed on :meth:`stop`).
        cluster: a :class:`~doubles.kube.cluster.ClusterState` whose
            REST API this server also serves; then its pods are the ones exec
            reaches (through ``cluster.node.exec_argv``), its ``denied`` set
            applies to ``("create", "pods/exec")``, and :meth:`add_pod` is
            not used.

    Attributes:
        forbid_exec: answer every exec with 403 (RBAC).
        drop_after: abort the TCP connection, without a status, once this
            many stdout bytes were sent.
        execs: a record of each exec that was upgraded.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        pre_130: bool = False,
        directory: Path | None = None,
        cluster: ClusterState | None = None,
    ) -> None:
        self.token = token or os.urandom(16).hex()
        self.cluster = cluster
        self.protocols: tuple[str, ...] = (V4,) if pre_130 else (V5, V4)
        self.forbid_exec = False
        self.drop_after: int | None = None
        self.execs: list[ExecRecord] = []
        self.paths: list[str] = []  # every request path, for debugging (capped)
        self._pods: dict[tuple[str, str], FakePod] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="agentnest-kubeapi-")
            directory = Path(self._tmp.name)
        self.directory = directory
        self.ca_path, self._cert, self._key = _make_tls(directory)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._live: dict[int, Any] = {}  # id -> request of each exec stream in progress

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def add_pod(
        self,
        name: str,
        runner: PodRunner | None = None,
        *,
        namespace: str = "default",
        containers: tuple[str, ...] = ("main",),
        phase: str = "Running",
    ) -> FakePod:
        pod = FakePod(name, runner or LocalPod(), namespace, containers, phase)
        self._pods[(namespace, name)] = pod
        return pod

    def start(self) -> FakeKubeAPI:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="agentnest-fake-kubeapi", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), loop).result(30)
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._stop(), loop).result(30)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                if self._thread is not None:
                    self._thread.join(30)
                loop.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path | None = None, *, namespace: str = "default") -> Path:
        """A kubeconfig (JSON, which is YAML) with one context ``fake`` pointing here."""
        path = path or self.directory / "kubeconfig"
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "fake", "cluster": {"server": self.url, "certificate-authority": str(self.ca_path)}}
            ],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(doc, indent=2))
        path.chmod(0o600)
        return path

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts this server's CA."""
        return ssl.create_default_context(cafile=str(self.ca_path))

    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}/exec", self._exec)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self._log)
        # Legacy discovery, which kubectl reads before anything else.
        app.router.add_get("/api", self._discovery)
        app.router.add_get("/apis", self._discovery)
        app.router.add_get("/version", self._discovery)
        if self.cluster is not None:
            from .cluster import add_routes

            self.cluster.loop = asyncio.get_running_loop()
            add_routes(app, self.cluster, token=self.token)
        else:
            app.router.add_get("/api/v1", self._discovery)
            app.router.add_get("/api/v1/namespaces/{ns}", self._get_namespace)
            app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self._cert, self._key)
        context.set_alpn_protocols(["http/1.1"])
        self._runner = web.AppRunner(
            app,
            access_log=None,
            max_line_size=MAX_REQUEST_HEAD,
            max_field_size=64 * 1024,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        if self.cluster is not None and self.cluster.apiserver is None:
            # What the kubelet puts in KUBERNETES_SERVICE_HOST/_PORT: a pod on
            # the node's network reaches this server there.
            self.cluster.apiserver = ("127.0.0.1", self.port)

    async def _stop(self) -> None:
        for proc in list(self._procs):
            _kill(proc)
        for proc in list(self._procs):
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                pass
        if self._runner is not None:
            server = self._runner.server
            transports = [h.transport for h in (server.connections if server is not None else [])]
            await self._runner.cleanup()
            # A TLS connection a client keeps alive is closed by cleanup() only
            # half-way (its close_notify needs more loop turns): cut them, and
            # let the loop run the connection_lost callbacks that close the sockets.
            for transport in transports:
                if transport is not None:
                    transport.abort()  # also when already closing: that is the half-way case
            for _ in range(3):
                await asyncio.sleep(0)

    # ------------------------------------------------------------------ HTTP

    def _json(self, doc: dict[str, Any], status: int = 200) -> Any:
        from aiohttp import web

        return web.Response(status=status, text=json.dumps(doc), content_type="application/json")

    def _refuse(self, code: int, reason: str, message: str, **details: Any) -> Any:
        response = self._json(_status(code, reason, message, details or None), code)
        # A refused upgrade ends its connection, as the apiserver's does: a
        # websocket client left waiting on a kept-alive one hung now and then.
        response.force_close()
        return response

    def _check_auth(self, request: Any) -> Any:
        if len(self.paths) < 1000:
            self.paths.append(f"{request.method} {request.path}")
        # Constant-time compare: the fake is a test double, but habits are habits.
        import hmac

        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            return self._refuse(401, "Unauthorized", "Unauthorized")
        return None

    async def _discovery(self, request: Any) -> Any:
        refused = self._check_auth(request)
        if refused is not None:
            return refused
        return self._json(_DISCOVERY[request.path])

    async def _not_found(self, request: Any) -> Any:
        refused = self._check_auth(request)
        if refused is not None:
            return refused
        return self._refuse(404, "NotFound", "the server could not find the requested resource")

    def _exec_pod(self, ns: str, name: str) -> FakePod | None:
        if self.cluster is None:
            return self._pods.get((ns, name))
        obj = self.cluster.get("pods", ns, name)
        if obj is None:
            return None
        containers = tuple(str(c.get("name")) for c in obj.get("spec", {}).get("containers", []))
        phase = str(obj.get("status", {}).get("phase") or "Pending")
        node = self.cluster.node
        runner = _NodeRunner(lambda argv, c: node.exec_argv(obj, c, list(argv)))
        return FakePod(name, runner, ns, containers, phase)

    def _pod_json(self, pod: FakePod) -> dict[str, Any]:
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": f"uid-{pod.name}"},
            "spec": {"containers": [{"name": c, "image": "fake"} for c in pod.containers]},
            "status": {
                "phase": pod.phase,
                "containerStatuses": [
                    {"name": c, "ready": pod.phase == "Running", "restartCount": 0, "image": "fake"}
                    for c in pod.containers
                ],
            },
        }

    async def _get_namespace(self, request: Any) -> Any:
        # kubectl asks after a 404 on a pod, to say which of the two is missing.
        refused = self._check_auth(request)
        if refused is not None:
            return refused
        ns = request.match_info["ns"]
        if not any(key[0] == ns for key in self._pods):
            return self._refuse(404, "NotFound", f'namespaces "{ns}" not found', name=ns, kind="namespaces")
        return self._json(
            {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": ns}, "status": {"phase": "Active"}}
        )

    async def _get_pod(self, request: Any) -> Any:
        refused = self._check_auth(request)
        if refused is not None:
            return refused
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self._pods.get((ns, name))
        if pod is None:
            return self._refuse(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        return self._json(self._pod_json(pod))

    async def _exec(self, request: Any) -> Any:
        from aiohttp import web

        refused = self._check_auth(request)
        if refused is not None:
            return refused
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self._exec_pod(ns, name)
        if pod is None:
            return self._refuse(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        if self.cluster is not None:
            self.cluster.authorized.append(("create", "pods/exec", ns))
        denied = self.cluster is not None and ("create", "pods/exec") in self.cluster.denied
        if self.forbid_exec or denied:
            return self._refuse(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: User "fake" cannot create resource "pods/exec" '
                f'in API group "" in the namespace "{ns}"',
                name=name,
                kind="pods",
            )
        if pod.phase in ("Succeeded", "Failed"):
            return self._refuse(
                400,
                "BadRequest",
                f"cannot exec into a container in a completed pod; current phase is {pod.phase}",
            )
        if pod.phase != "Running":
            return self._refuse(400, "BadRequest", f"pod {name} does not have a host assigned")
        argv = request.query.getall("command", [])
        if not argv:
            return self._refuse(400, "BadRequest", "you must specify at least 1 command")
        container = request.query.get("container")
        if not container:
            if len(pod.containers) != 1:
                return self._refuse(
                    400,
                    "BadRequest",
                    f"a container name must be specified for pod {name}, "
                    f"choose one of: [{' '.join(pod.containers)}]",
                )
            container = pod.containers[0]
        if container not in pod.containers:
            return self._refuse(400, "BadRequest", f"container {container} is not valid for pod {name}")
        if pod.runner.command(argv, container) is None:
            # The kubelet's answer when the container is not (or no longer) running.
            return self._refuse(
                500,
                "InternalError",
                f'Internal error occurred: unable to upgrade connection: container not found ("{container}")',
            )
        flags = {
            k: request.query.get(k, "false").lower() in ("true", "1") for k in ("stdin", "stdout", "stderr")
        }
        if not (flags["stdin"] or flags["stdout"] or flags["stderr"]):
            return self._refuse(400, "BadRequest", "you must specify at least 1 of stdin, stdout, stderr")
        if request.headers.get("Upgrade", "").lower() != "websocket":
            # A real apiserver would speak SPDY here; this fake is websocket only.
            return self._refuse(
                400, "BadRequest", "Upgrade request required (this fake speaks websockets only)"
            )
        offered = [
            p.strip()
            for header in request.headers.getall("Sec-WebSocket-Protocol", [])
            for p in header.split(",")
            if p.strip()
        ]
        chosen = next((p for p in self.protocols if p in offered), None)
        if chosen is None:
            return self._refuse(
                400,
                "BadRequest",
                f"unable to upgrade connection: unable to negotiate protocol: client supports "
                f"{offered}, server supports {list(self.protocols)}",
            )
        ws = web.WebSocketResponse(
            protocols=(chosen,), max_msg_size=MAX_CLIENT_FRAME, autoping=True, compress=False
        )
        await ws.prepare(request)
        record = ExecRecord(ns, name, container, list(argv), chosen, flags["stdin"])
        self.execs.append(record)
        self._live[id(request)] = request
        try:
            await _Session(self, request, ws, pod, record, flags).run()
        finally:
            self._live.pop(id(request), None)
        return ws

    async def _log(self, request: Any) -> Any:
        """``GET .../pods/NAME/log``: the container's output, followed if asked, with timestamps if asked."""
        from aiohttp import web

        refused = self._check_auth(request)
        if refused is not None:
            return refused
        ns, name = request.match_info["ns"], request.match_info["name"]
        obj = self.cluster.get("pods", ns, name) if self.cluster is not None else None
        if obj is None or self.cluster is None:
            return self._refuse(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        self.cluster.authorized.append(("get", "pods/log", ns))
        if ("get", "pods/log") in self.cluster.denied:
            return self._refuse(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: User "fake" cannot get resource "pods/log" '
                f'in API group "" in the namespace "{ns}"',
                name=name,
                kind="pods",
            )
        containers = [str(c.get("name")) for c in obj.get("spec", {}).get("containers", [])]
        container = request.query.get("container") or (containers[0] if len(containers) == 1 else "")
        if container not in containers:
            return self._refuse(400, "BadRequest", f"container {container} is not valid for pod {name}")
        flag = {k: request.query.get(k, "false").lower() in ("true", "1") for k in ("follow", "timestamps")}
        argv = self.cluster.node.log_argv(
            obj,
            container,
            follow=flag["follow"],
            timestamps=flag["timestamps"],
            since=request.query.get("sinceTime"),
        )
        if argv is None:
            return self._refuse(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        try:
            await response.prepare(request)
            assert proc.stdout is not None
            while True:
                chunk = await proc.stdout.read(64 << 10)
                if not chunk:
                    break
                await response.write(chunk)
        finally:
            _kill(proc)
            await proc.wait()
        return response

    def cut_streams(self) -> int:
        """Abort every exec stream in progress, with no status (an apiserver restart, a proxy's cut).

        Their processes live on, as exec'd processes do when their client goes
        away.  Returns how many were cut.
        """
        loop = self._loop
        if loop is None:
            return 0

        async def cut() -> int:
            live = list(self._live.values())
            for request in live:
                if request.transport is not None:
                    request.transport.abort()
            return len(live)

        return asyncio.run_coroutine_threadsafe(cut(), loop).result(30)


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


@dataclass
class _Session:
    api: FakeKubeAPI
    request: Any
    ws: Any
    pod: FakePod
    record: ExecRecord
    flags: dict[str, bool]
    sent: int = 0
    gone: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def send(self, channel: int, payload: bytes) -> None:
        if self.gone:
            return
        async with self.lock:
            try:
                await self.ws.send_bytes(bytes((channel,)) + payload)
            except (ConnectionError, RuntimeError):
                self.gone = True

    async def run(self) -> None:
        record, flags = self.record, self.flags
        runner = self.pod.runner
        # The lowest writable channel gets an empty message: "connected".
        first = 1 if flags["stdout"] else 2 if flags["stderr"] else 3
        command = runner.command(record.argv, record.container)
        try:
            if command is None:
                raise FileNotFoundError(2, "container not found")
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE if flags["stdin"] else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=runner.cwd,
                env=dict(runner.env) if runner.env is not None else None,
                start_new_session=True,
            )
        except OSError as exc:
            await self.send(first, b"")
            await self.finish(
                _status(
                    500,
                    "InternalError",
                    f"Internal error occurred: error executing command in container: "
                    f'failed to exec in container: exec: "{record.argv[0]}": {exc.strerror}',
                )
            )
            return
        self.api._procs.add(proc)
        try:
            await self.send(first, b"")
            reader = asyncio.ensure_future(self.read_client(proc))
            assert proc.stdout is not None and proc.stderr is not None
            await asyncio.gather(
                self.pump(proc.stdout, 1, flags["stdout"]), self.pump(proc.stderr, 2, flags["stderr"])
            )
            code = await proc.wait()
            if code < 0:
                code = 128 - code  # killed by a signal: what the runtime reports
            if code == 0:
                status: dict[str, Any] = {"metadata": {}, "status": "Success"}
            else:
                status = _status(
                    500,
                    "NonZeroExitCode",
                    f"command terminated with non-zero exit code: error executing command "
                    f"{record.argv}, exit code {code}",
                    {"causes": [{"reason": "ExitCode", "message": str(code)}]},
                )
                del status["code"], status["kind"], status["apiVersion"]
            await self.finish(status)
            reader.cancel()
            try:
                await reader
            except asyncio.CancelledError:
                pass
        finally:
            self.api._procs.discard(proc)

    async def finish(self, status: dict[str, Any]) -> None:
        if self.gone:
            return
        self.record.status = status
        await self.send(3, json.dumps(status).encode())
        try:
            await self.ws.close()
        except (ConnectionError, RuntimeError):
            pass

    async def pump(self, pipe: asyncio.StreamReader, channel: int, enabled: bool) -> None:
        drop = self.api.drop_after
        while chunk := await pipe.read(OUTPUT_CHUNK):
            if not enabled or self.gone:
                continue  # keep draining, so the process never blocks on a full pipe
            if channel == 1 and drop is not None and self.sent + len(chunk) >= drop:
                await self.send(1, chunk[: drop - self.sent])
                # A lost stream: no status, no close frame, the TCP connection cut.
                self.gone = True
                transport = self.request.transport
                if transport is not None:
                    transport.abort()
                continue
            if channel == 1:
                self.sent += len(chunk)
            await self.send(channel, chunk)

    async def read_client(self, proc: asyncio.subprocess.Process) -> None:
        from aiohttp import WSMsgType

        v5 = self.record.subprotocol == V5
        stdin = proc.stdin
        try:
            async for msg in self.ws:
                if msg.type != WSMsgType.BINARY:
                    continue  # text frames carry nothing in the binary channel protocols
                data: bytes = msg.data
                self.record.messages_in += 1
                if not data:
                    continue
                channel = data[0]
                if channel == 0 and stdin is not None and not stdin.is_closing():
                    try:
                        stdin.write(data[1:])
                        await stdin.drain()
                    except (ConnectionError, BrokenPipeError):
                        pass
                elif channel == 255 and v5:
                    if len(data) != 2:
                        # wsstream: any other length is a protocol error that ends the connection.
                        await self.ws.close(code=1002, message=b"invalid close message")
                        break
                    if data[1] == 0 and stdin is not None:
                        self.record.stdin_closed = True
                        stdin.close()
                # resize (4) with tty=false, unknown channels, 255 on v4: dropped.
        finally:
            # The client is gone or closed: the process sees EOF, and runs on
            # (an exec'd process survives its client, as in a real cluster).
            if stdin is not None and not stdin.is_closing():
                stdin.close()
