"""The exec websocket client through the fake apiserver over TLS, and the fake checked by kubectl.

No cluster and no container engine: the fake's "pod" runs commands as local
processes (:class:`doubles.kube.apiserver.LocalPod`).  The real ``kubectl``
(client-go's v5 websocket executor) talking to the same fake is what keeps
the fake honest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from doubles.kube.apiserver import FakeKubeAPI

from agentnest.errors import BackendError, SandboxDestroyedError
from agentnest.runtime.kubernetes import connection, execproto, wsexec
from agentnest.runtime.kubernetes.connection import ExecTarget
from agentnest.runtime.kubernetes.execproto import ExecFailedError, ExecStreamLostError
from agentnest.runtime.kubernetes.wsexec import AsyncExecStream, ExecStream
from agentnest.testing.wait import wait_until

NS = "sandboxes"
POD = "sb-1"
KUBECTL = Path(sys.executable).parent / "kubectl"


def connection_from_kubeconfig(path: Path) -> connection.KubeConnection:
    """The way the backend will do it: kubernetes.config into a Configuration, then ours."""
    kubernetes = pytest.importorskip("kubernetes")
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(path), client_configuration=cfg)
    return connection.from_kube_config(cfg)


@pytest.fixture(scope="module")
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as fake:
        fake.add_pod(POD, namespace=NS)
        fake.add_pod("done", namespace=NS, phase="Succeeded")
        yield fake


@pytest.fixture(autouse=True)
def no_faults(api: FakeKubeAPI) -> Iterator[None]:
    yield
    api.forbid_exec = False
    api.drop_after = None


@pytest.fixture(scope="module")
def target(api: FakeKubeAPI) -> ExecTarget:
    conn = connection_from_kubeconfig(api.write_kubeconfig(namespace=NS))
    return ExecTarget(conn, NS, POD)


def read_all(stream: ExecStream) -> bytes:
    out = bytearray()
    while data := stream.read(1 << 20):
        out += data
    return bytes(out)


def test_cat_echoes_and_ends_on_stdin_close_v5(api: FakeKubeAPI, target: ExecTarget) -> None:
    stream = ExecStream.open(target, ["cat"])
    try:
        assert stream.subprotocol == execproto.V5
        stream.write(b"hello ")
        stream.write(b"world")
        assert stream.close_stdin() is True
        assert read_all(stream) == b"hello world"
        assert stream.exit_code(timeout=10) == 0
    finally:
        stream.close()
    record = api.execs[-1]
    assert record.argv == ["cat"] and record.stdin_closed and record.container == "main"


def test_exit_codes_and_stderr(target: ExecTarget) -> None:
    assert wsexec.run(target, ["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, b"out\n", b"err\n")
    assert wsexec.run(target, ["true"]) == (0, b"", b"")
    # Killed by a signal: the runtime reports 128 + N, as a container runtime does.
    assert wsexec.run(target, ["sh", "-c", "kill -9 $$"])[0] == 137


def test_output_is_bounded(target: ExecTarget) -> None:
    code, out, err = wsexec.run(
        target, ["sh", "-c", "head -c 300000 /dev/zero; head -c 300000 /dev/zero >&2"], max_output=1000
    )
    assert code == 0 and out == b"\0" * 1000 and err == b"\0" * 1000


def test_five_mib_round_trip(target: ExecTarget) -> None:
    data = os.urandom(5 << 20)
    code, out, _ = wsexec.run(target, ["cat"], stdin=data, max_output=6 << 20, timeout=30)
    assert code == 0 and out == data


def test_concurrent_write_and_read_from_two_threads(target: ExecTarget) -> None:
    data = os.urandom(3 << 20)
    stream = ExecStream.open(target, ["cat"])
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            view = memoryview(data)
            for i in range(0, len(data), 100_000):
                stream.write(view[i : i + 100_000].tobytes())
            stream.close_stdin()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert read_all(stream) == data
    finally:
        thread.join(10)
        stream.close()
    assert not errors
    assert stream.exit_code() == 0


def test_a_command_past_its_timeout(target: ExecTarget) -> None:
    from agentnest.errors import ExecutionTimeoutError

    started = time.monotonic()
    with pytest.raises(ExecutionTimeoutError):
        wsexec.run(target, ["sleep", "30"], timeout=0.5)
    assert time.monotonic() - started < 5


def test_a_command_that_cannot_start_is_an_infrastructure_error(target: ExecTarget) -> None:
    with pytest.raises(ExecFailedError, match="no-such-command") as info:
        wsexec.run(target, ["no-such-command-agentnest"])
    assert info.value.reason == "InternalError"


def test_a_lost_stream_is_an_error_not_exit_0(api: FakeKubeAPI, target: ExecTarget) -> None:
    api.drop_after = 5
    with pytest.raises(ExecStreamLostError):
        wsexec.run(target, ["sh", "-c", "echo 0123456789"])
    stream = ExecStream.open(target, ["sh", "-c", "echo 0123456789"])
    try:
        assert read_all(stream) == b"01234"
        assert "without a status" in stream.diagnostics()
        with pytest.raises(ExecStreamLostError):
            stream.exit_code()
    finally:
        stream.close()


def test_refusals_map_to_the_error_tree(api: FakeKubeAPI, target: ExecTarget) -> None:
    conn = target.connection
    with pytest.raises(SandboxDestroyedError, match='pods "gone" not found'):
        wsexec.run(ExecTarget(conn, NS, "gone"), ["true"])
    with pytest.raises(SandboxDestroyedError, match="completed pod"):
        wsexec.run(ExecTarget(conn, NS, "done"), ["true"])
    with pytest.raises(BackendError, match="is not valid for pod"):
        wsexec.run(ExecTarget(conn, NS, POD, "sidecar"), ["true"])
    bad_token = connection.KubeConnection(conn.host, conn.ssl, token=lambda: "Bearer wrong")
    with pytest.raises(BackendError, match="HTTP 401"):
        wsexec.run(ExecTarget(bad_token, NS, POD), ["true"])
    api.forbid_exec = True
    with pytest.raises(BackendError, match='cannot create resource "pods/exec"') as info:
        wsexec.run(target, ["true"])
    assert not isinstance(info.value, SandboxDestroyedError)


def spying_context(api: FakeKubeAPI, calls: list[str]) -> tuple[ssl.SSLContext, list[str]]:
    """A client TLS context whose sockets note every OpenSSL read or write that overlaps another.

    Each read holds the SSL object a little longer (as a receive thread
    preempted under load does), so an unserialised write meets it.
    """
    overlaps: list[str] = []
    inside: list[str] = []
    guard = threading.Lock()

    class Spy(ssl.SSLSocket):
        def _enter(self, name: str) -> None:
            with guard:
                calls.append(name)
                if inside:
                    overlaps.append(f"{name} while in {inside}")
                inside.append(name)

        def _leave(self, name: str) -> None:
            with guard:
                inside.remove(name)

        def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
            self._enter("read")
            try:
                time.sleep(0.002)
                return super().recv(buflen, flags)
            finally:
                self._leave("read")

        def send(self, data: Any, flags: int = 0) -> int:
            self._enter("write")
            try:
                return super().send(data, flags)
            finally:
                self._leave("write")

    context = api.ssl_context()
    context.set_alpn_protocols(["http/1.1"])
    context.sslsocket_class = Spy
    return context, overlaps


def test_tls_reads_and_writes_never_overlap(api: FakeKubeAPI, target: ExecTarget) -> None:
    # websockets' sync connection reads in its own thread while the caller
    # writes; over TLS that is two threads in one OpenSSL SSL object, which
    # OpenSSL forbids, and it lost the upgrade request now and then: the
    # receive thread was processing the server's TLS 1.3 session tickets
    # when the request was written, SSL_write said "all sent" and nothing
    # went out ("did not answer the exec in time", ~1 in 500 execs under
    # load).  The client serialises its OpenSSL calls (wsexec._SerialTLSSocket).
    calls: list[str] = []
    context, overlaps = spying_context(api, calls)
    conn = target.connection
    spied = ExecTarget(connection.KubeConnection(conn.host, context, token=conn.token), NS, POD)
    data = os.urandom(2 << 20)
    assert wsexec.run(spied, ["cat"], stdin=data, max_output=3 << 20, timeout=60) == (0, data, b"")
    assert wsexec.run(spied, ["sh", "-c", "echo hi"]) == (0, b"hi\n", b"")
    assert calls.count("read") > 10 and calls.count("write") > 3, calls
    assert not overlaps, overlaps[:5]


def test_a_tls_wait_ends_at_the_sockets_timeout(api: FakeKubeAPI, target: ExecTarget) -> None:
    """websockets sets a timeout on the socket for its closing handshake: each wait is bounded by it."""
    import socket as socketlib

    host, port = "127.0.0.1", int(target.connection.host.rsplit(":", 1)[1])
    assert target.connection.ssl is not None
    raw = socketlib.create_connection((host, port), timeout=10)
    tls = wsexec._SerialTLSSocket(target.connection.ssl.wrap_socket(raw, server_hostname=host))
    try:
        assert tls.gettimeout() == 10
        tls.settimeout(0.3)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            tls.recv(100)  # the server waits for a request; nothing comes
        assert 0.25 < time.monotonic() - started < 5
        tls.settimeout(None)
        tls.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := tls.recv(1 << 16):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 401"), answer[:100]
    finally:
        tls.close()


def test_tls_is_verified(api: FakeKubeAPI, target: ExecTarget) -> None:
    from agentnest.errors import RuntimeNotAvailableError

    untrusting = connection.KubeConnection(target.connection.host, ssl.create_default_context(), token=None)
    with pytest.raises(RuntimeNotAvailableError, match="TLS verification"):
        wsexec.run(ExecTarget(untrusting, NS, POD), ["true"])


def test_the_fake_makes_its_certificates_with_openssl_too(tmp_path: Path) -> None:
    from doubles.kube import apiserver as kubeapi

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    ca, cert, key = kubeapi._make_tls_openssl(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    ssl.create_default_context(cafile=str(ca))


def test_v4_fallback_on_a_pre_130_server() -> None:
    with FakeKubeAPI(pre_130=True) as old:
        old.add_pod(POD, namespace=NS)
        target = ExecTarget(connection_from_kubeconfig(old.write_kubeconfig()), NS, POD)
        assert wsexec.run(target, ["sh", "-c", "echo hi; exit 4"]) == (4, b"hi\n", b"")
        assert old.execs[-1].subprotocol == execproto.V4 and not old.execs[-1].stdin
        stream = ExecStream.open(target, ["sh", "-c", "read line; echo got $line"])
        try:
            assert stream.subprotocol == execproto.V4
            stream.write(b"x\n")
            assert stream.close_stdin() is False  # v4 has no CLOSE
            assert read_all(stream) == b"got x\n"
            assert stream.exit_code() == 0
        finally:
            stream.close()


def test_the_fake_speaks_the_wire_as_the_apiserver(api: FakeKubeAPI, target: ExecTarget) -> None:
    """Raw websocket: first message, chunk sizes, unknown channels, CLOSE, status, close frame; limits."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    url = connection.exec_url(target, ["sh", "-c", "cat >/dev/null; head -c 200000 /dev/zero"])
    kw: dict[str, Any] = {
        "ssl": target.connection.ssl,
        "additional_headers": target.connection.request_headers(),
        "proxy": None,
        "max_size": None,
    }
    with connect(url, subprotocols=[Subprotocol(execproto.V5)], **kw) as ws:
        assert ws.subprotocol == execproto.V5
        assert ws.recv() == b"\x01"  # "connected": empty, on stdout
        ws.send(b"\x07ignored")  # unknown channel
        ws.send(b"\x04" + json.dumps({"Width": 80, "Height": 24}).encode())  # resize, tty=false
        ws.send(b"\x00data")
        ws.send(b"\xff\x00")
        messages = []
        while True:
            try:
                messages.append(ws.recv(10))
            except ConnectionClosed as exc:
                assert exc.rcvd is not None and exc.rcvd.code == 1000  # a close frame after the status
                break
    assert messages[-1] == b'\x03{"metadata": {}, "status": "Success"}'
    out = messages[:-1]
    assert all(m[0] == 1 and len(m) - 1 <= 32 * 1024 for m in out)
    assert sum(len(m) - 1 for m in out) == 200000
    # A client frame over 32 MiB ends the connection (a 1009 close, then the TCP connection cut,
    # which the client may see while still sending), as x/net/websocket refuses it.
    with connect(url, subprotocols=[Subprotocol(execproto.V5)], **kw) as ws:
        ws.recv()
        with pytest.raises(ConnectionClosed):
            ws.send(b"\x00" + bytes(33 << 20))
            while True:
                ws.recv(10)
    # An offer with neither v5 nor v4: refused before the upgrade.
    with pytest.raises(InvalidStatus) as refused:
        connect(url, subprotocols=[Subprotocol("channel.k8s.io")], **kw)
    assert refused.value.response.status_code == 400
    assert b"unable to negotiate protocol" in refused.value.response.body


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_async_face(target: ExecTarget, anyio_backend: str) -> None:
    stream = await AsyncExecStream.open(target, ["sh", "-c", "cat; echo bye >&2; exit 2"])
    try:
        assert stream.subprotocol == execproto.V5
        await stream.write(b"a" * 300_000)
        assert await stream.close_stdin()
        out = bytearray()
        while data := await stream.read(1 << 16):
            out += data
        assert bytes(out) == b"a" * 300_000
        assert await stream.exit_code() == 2
        assert "bye" in stream.diagnostics()
    finally:
        await stream.close()
    assert await wsexec.arun(target, ["cat"], stdin=b"xyz") == (0, b"xyz", b"")


# --------------------------------------------------------------------------- kubectl cross-check


@pytest.fixture(scope="module")
def kubectl(api: FakeKubeAPI, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = str(KUBECTL) if KUBECTL.exists() else shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed")
    cache = tmp_path_factory.mktemp("kube-cache")
    return [path, "--kubeconfig", str(api.write_kubeconfig(namespace=NS)), "--cache-dir", str(cache)]


def run_kubectl(kubectl: list[str], args: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    env = {
        **os.environ,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "true",
    }
    return subprocess.run([*kubectl, *args], input=stdin, capture_output=True, timeout=30, env=env)


@pytest.mark.parametrize(
    ("script", "stdin", "out", "code"),
    [
        ("cat; echo done", b"line1\nline2\n", b"line1\nline2\ndone\n", 0),  # stdin EOF reaches cat
        ("wc -c", os.urandom(1 << 20), b"1048576\n", 0),
        ("echo out; echo err >&2; exit 5", b"", b"out\n", 5),
        ("exit 0", b"", b"", 0),
    ],
)
def test_kubectl_exec_against_the_fake(
    api: FakeKubeAPI, kubectl: list[str], script: str, stdin: bytes, out: bytes, code: int
) -> None:
    result = run_kubectl(kubectl, ["exec", "-i", "-n", NS, POD, "--", "sh", "-c", script], stdin)
    assert result.returncode == code, result.stderr
    assert result.stdout.replace(b" ", b"") == out.replace(b" ", b"")  # wc pads on some systems
    if code:
        assert f"command terminated with exit code {code}".encode() in result.stderr
    assert api.execs[-1].subprotocol == execproto.V5
    if stdin:
        # The command reads its stdin to the end: kubectl's v5 CLOSE reached it.
        # (A command that exits first may end the session before CLOSE is sent.)
        assert api.execs[-1].stdin_closed


def test_kubectl_sees_the_fakes_refusals(api: FakeKubeAPI, kubectl: list[str]) -> None:
    result = run_kubectl(kubectl, ["exec", "-i", "-n", NS, "gone", "--", "true"], b"")
    assert result.returncode != 0 and b'pods "gone" not found' in result.stderr
    api.forbid_exec = True
    result = run_kubectl(kubectl, ["exec", "-i", "-n", NS, POD, "--", "true"], b"")
    assert result.returncode != 0 and b"forbidden" in result.stderr, result.stderr


# --------------------------------------------------------------------------- the real agent


def test_a_channel_to_the_real_agent_over_the_exec_websocket(target: ExecTarget, tmp_path: Path) -> None:
    """The pod's keeper listens on a unix socket; each connection is an exec of the bridge."""
    from agentnest.channel.client import Channel
    from agentnest.runtime import launch

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    sock = str(tmp_path / "agent.sock")
    keeper = subprocess.Popen(
        launch.listen_command(sys.executable, 60, sock),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=workspace,
        env={**os.environ, "AGENTNEST_WORKSPACE": str(workspace)},
        start_new_session=True,
    )
    try:
        wait_until(lambda: os.path.exists(sock), "the agent's socket", within=20)
        stream = ExecStream.open(target, launch.bridge_command(sys.executable, sock))
        channel = Channel.connect(stream, None, timeout=20, after=1)
        try:
            handle = channel.start_exec(
                ["/bin/sh", "-c", "echo hi; pwd"], env={}, cwd=None, timeout=10, max_output=1 << 20
            )
            out = b"".join(
                data
                for event in handle.events(time.monotonic() + 20)
                if isinstance(event, tuple)
                for _, data in [event]
            )
            assert handle.result is not None and handle.result.code == 0, handle.result
            assert out == f"hi\n{workspace}\n".encode()
        finally:
            channel.close()
    finally:
        os.killpg(keeper.pid, signal.SIGKILL)
        keeper.wait()
