"""The exec websocket codec (sans-I/O): framing, status parsing, chunking, URLs, refusals."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentnest.errors import (
    BackendError,
    ChannelError,
    ConfigurationError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
)
from agentnest.runtime.kubernetes import connection, execproto, wsexec
from agentnest.runtime.kubernetes.connection import ExecTarget, KubeConnection
from agentnest.runtime.kubernetes.execproto import (
    ExecFailedError,
    ExecProtocolError,
    ExecSession,
    ExecStreamLostError,
    parse_status,
)

EXIT_3: dict[str, Any] = {
    "metadata": {},
    "status": "Failure",
    "message": "command terminated with non-zero exit code: exit code 3",
    "reason": "NonZeroExitCode",
    "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
}


def status(doc: Any) -> bytes:
    return bytes([3]) + json.dumps(doc).encode()


def test_frames_are_a_channel_byte_and_a_payload() -> None:
    assert execproto.encode(0, b"hi") == b"\x00hi"
    assert execproto.encode(255, b"\x00") == b"\xff\x00"
    assert execproto.decode(b"\x01out") == (1, b"out")
    assert execproto.decode(b"\x01") == (1, b"")
    assert execproto.decode(b"") is None
    with pytest.raises(ValueError):
        execproto.encode(256)


def test_stdin_is_cut_into_bounded_frames() -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    frames = list(execproto.stdin_frames(data))
    assert all(f[0] == 0 and len(f) - 1 <= execproto.MAX_STDIN_CHUNK for f in frames)
    assert len(frames) == 4
    assert b"".join(f[1:] for f in frames) == data
    assert list(execproto.stdin_frames(b"")) == []
    assert [len(f) for f in execproto.stdin_frames(b"abcde", chunk=2)] == [3, 3, 2]


def test_success_nonzero_and_infrastructure_failures() -> None:
    assert parse_status(json.dumps({"metadata": {}, "status": "Success"}).encode()).exit_code == 0
    assert parse_status(json.dumps(EXIT_3).encode()).exit_code == 3
    # The exit code cause need not be the first one.
    doc = {
        **EXIT_3,
        "details": {"causes": [{"reason": "Other", "message": "x"}, *EXIT_3["details"]["causes"]]},
    }
    assert parse_status(json.dumps(doc).encode()).exit_code == 3
    infra = parse_status(
        json.dumps({"status": "Failure", "reason": "InternalError", "message": "boom", "code": 500}).encode()
    )
    assert infra.exit_code is None
    err = infra.error()
    assert isinstance(err, BackendError) and err.reason == "InternalError" and "boom" in str(err)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"status": "Maybe"}',
        b"{}",
        json.dumps({**EXIT_3, "details": {}}).encode(),  # NonZeroExitCode without a cause
        json.dumps({**EXIT_3, "details": {"causes": [{"reason": "ExitCode", "message": "x"}]}}).encode(),
        json.dumps({**EXIT_3, "details": {"causes": [{"reason": "ExitCode", "message": " 3"}]}}).encode(),
        json.dumps({**EXIT_3, "details": {"causes": [{"reason": "ExitCode", "message": "0"}]}}).encode(),
        json.dumps({**EXIT_3, "details": {"causes": [{"reason": "ExitCode", "message": 3}]}}).encode(),
        json.dumps({"status": "Failure", "reason": 7}).encode(),
        b"\xff\xfe",
    ],
)
def test_a_malformed_status_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(ExecProtocolError):
        parse_status(raw)


def test_an_oversized_status_is_refused_unparsed() -> None:
    big = json.dumps({"metadata": {}, "status": "Success", "message": "x" * 100_000}).encode()
    with pytest.raises(ExecProtocolError, match="over"):
        parse_status(big)
    session = ExecSession(execproto.V5, max_status=1024)
    session.receive(bytes([3]) + b'{"status": "Success", "message": "' + b"x" * 2000)
    with pytest.raises(ExecProtocolError, match="over"):
        session.exit_code()


def test_a_session_yields_stdout_keeps_a_stderr_tail_and_ends_on_status() -> None:
    session = ExecSession(execproto.V5, keep_stderr=8)
    assert session.receive(b"\x01") == b""  # "connected"
    assert session.receive(b"\x01hello") == b"hello"
    assert session.receive(b"\x02" + b"e" * 5) == b""
    assert session.receive(b"\x02" + b"f" * 5) == b""
    assert session.receive(b"\x09junk") == b""  # unknown channel: ignored
    assert session.receive(b"") == b""
    assert session.stderr() == b"eeefffff"
    assert session.status is None
    session.receive(status(EXIT_3))
    assert session.finished
    assert session.exit_code() == 3
    assert session.receive(b"\x01late") == b""
    assert "exit code 3" in session.describe()


def test_a_status_split_over_messages_is_reassembled() -> None:
    raw = json.dumps({"metadata": {}, "status": "Success"}).encode()
    session = ExecSession(execproto.V5)
    session.receive(b"\x03" + raw[:10])
    assert not session.finished
    session.receive(b"\x03" + raw[10:])
    assert session.exit_code() == 0


def test_a_stream_without_status_is_lost_never_exit_0() -> None:
    session = ExecSession(execproto.V5)
    session.receive(b"\x01output")
    session.connection_closed()
    with pytest.raises(ExecStreamLostError):
        session.exit_code()
    assert isinstance(session.error, ChannelError)
    cut = ExecSession(execproto.V5)
    cut.receive(b'\x03{"status": "Succ')
    cut.connection_closed()
    with pytest.raises(ExecProtocolError):
        cut.exit_code()


def test_an_infrastructure_failure_is_not_an_exit_code() -> None:
    session = ExecSession(execproto.V4)
    session.receive(status({"status": "Failure", "reason": "InternalError", "message": "no runtime"}))
    with pytest.raises(ExecFailedError, match="no runtime"):
        session.exit_code()


def test_stdin_close_exists_only_on_v5() -> None:
    v5 = ExecSession(execproto.V5)
    assert v5.can_close_stdin
    assert v5.stdin(b"ab") == [b"\x00ab"]
    assert v5.close_stdin() == b"\xff\x00"
    assert v5.close_stdin() is None  # once
    with pytest.raises(OSError):
        v5.stdin(b"more")
    v4 = ExecSession(execproto.V4)
    assert not v4.can_close_stdin and v4.close_stdin() is None


@pytest.mark.parametrize("protocol", [None, "", "channel.k8s.io", "v6.channel.k8s.io"])
def test_an_unoffered_subprotocol_is_refused(protocol: str | None) -> None:
    with pytest.raises(ExecProtocolError):
        ExecSession(protocol)


def target(host: str = "https://k8s.example:6443") -> ExecTarget:
    return ExecTarget(KubeConnection(host), "team a", "pod/1", "main")


def test_the_exec_url_quotes_every_argument() -> None:
    url = connection.exec_url(target("https://k8s.example:6443/prefix/"), ["sh", "-c", "echo a&b=c #d é"])
    assert url.startswith("wss://k8s.example:6443/prefix/api/v1/namespaces/team%20a/pods/pod%2F1/exec?")
    query = url.split("?", 1)[1]
    assert query == (
        "command=sh&command=-c&command=echo%20a%26b%3Dc%20%23d%20%C3%A9"
        "&container=main&stdin=true&stdout=true&stderr=true&tty=false"
    )
    assert connection.exec_url(target("http://127.0.0.1:8001"), ["true"], stdin=False).startswith("ws://")
    assert "stdin=false" in connection.exec_url(target(), ["true"], stdin=False)


def test_long_argv_fits_and_too_long_is_refused() -> None:
    from agentnest.runtime import launch

    argv = launch.bridge_command(sys.executable, "/run/agentnest/agent.sock")
    assert len(connection.exec_url(target(), argv)) < connection.MAX_URL_BYTES
    with pytest.raises(ConfigurationError, match="1 MiB"):
        connection.exec_url(target(), ["x" * connection.MAX_URL_BYTES])
    with pytest.raises(ConfigurationError):
        connection.exec_url(target(), [])


@pytest.mark.parametrize(
    ("code", "message", "kind"),
    [
        (404, 'pods "p" not found', SandboxDestroyedError),
        (403, 'pods "p" is forbidden: User "u" cannot create resource "pods/exec"', RuntimeNotAvailableError),
        (401, "Unauthorized", RuntimeNotAvailableError),
        (
            400,
            "cannot exec into a container in a completed pod; current phase is Succeeded",
            SandboxDestroyedError,
        ),
        (500, 'container not found ("main")', SandboxDestroyedError),
        (400, "container x is not valid for pod p", BackendError),
    ],
)
def test_handshake_refusals_map_to_the_error_tree(code: int, message: str, kind: type[Exception]) -> None:
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": code}).encode()
    err = wsexec.handshake_error(code, body, target())
    assert type(err) is kind
    assert message in str(err) and f"HTTP {code}" in str(err)
    plain = wsexec.handshake_error(code, message.encode() + b"\n" + b"x" * 100_000, target())
    assert len(str(plain)) < 4 * execproto.MAX_ERROR_TEXT


class FakeConfiguration:
    """The attributes of ``kubernetes.client.Configuration`` that matter here."""

    def __init__(self, host: str, **kw: Any) -> None:
        self.host = host
        self.ssl_ca_cert = kw.get("ssl_ca_cert")
        self.cert_file = None
        self.key_file = None
        self.verify_ssl = kw.get("verify_ssl", True)
        self.tls_server_name = kw.get("tls_server_name")
        self.proxy = kw.get("proxy")
        self.calls = 0

    def get_api_key_with_prefix(self, name: str) -> str | None:
        assert name == "authorization"
        self.calls += 1
        return f"Bearer t{self.calls}"


def test_from_kube_config_reads_tls_auth_and_proxy_and_refreshes_the_token() -> None:
    cfg = FakeConfiguration("https://10.0.0.1:6443/", tls_server_name="kube", proxy="http://proxy:3128")
    conn = connection.from_kube_config(cfg)
    assert conn.host == "https://10.0.0.1:6443" and conn.server_hostname == "kube"
    assert conn.proxy == "http://proxy:3128"
    assert isinstance(conn.ssl, ssl.SSLContext) and conn.ssl.verify_mode == ssl.CERT_REQUIRED
    assert conn.request_headers() == {"Authorization": "Bearer t1"}
    assert conn.request_headers() == {"Authorization": "Bearer t2"}  # asked at every connect
    insecure = connection.from_kube_config(FakeConfiguration("https://h", verify_ssl=False))
    assert insecure.ssl is not None and insecure.ssl.verify_mode == ssl.CERT_NONE
    assert connection.from_kube_config(FakeConfiguration("http://127.0.0.1:8001")).ssl is None
    with pytest.raises(ConfigurationError):
        connection.from_kube_config(FakeConfiguration(""))


def test_importing_the_client_loads_neither_kubernetes_nor_websockets() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"  # tests/: doubles
        "import agentnest, agentnest.runtime.kubernetes.wsexec, doubles.kube.apiserver\n"
        "bad = [m for m in ('kubernetes', 'websockets', 'aiohttp') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_server_that_never_answers_the_upgrade_times_out_never_hangs(tmp_path: Path) -> None:
    # Over TLS 1.3 the server's session tickets wake websockets' receive
    # thread with no application data; its read then blocked, and a timed-out
    # handshake waited for that thread forever (websockets 17.4).
    pytest.importorskip("websockets")
    from doubles.kube.apiserver import _make_tls

    ca, cert, key = _make_tls(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held: list[ssl.SSLSocket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                tls = server_ctx.wrap_socket(conn, server_side=True)
                tls.recv(65536)  # the upgrade request: read, never answered, kept open
                held.append(tls)

    threading.Thread(target=serve, daemon=True).start()
    client_ctx = ssl.create_default_context(cafile=str(ca))
    conn = KubeConnection(f"https://127.0.0.1:{listener.getsockname()[1]}", ssl=client_ctx)
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            wsexec.ExecStream.open(ExecTarget(conn, "ns", "pod", "main"), ["true"], open_timeout=1)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(20)
    try:
        assert not worker.is_alive(), "ExecStream.open hung past its open_timeout"
        assert len(outcome) == 1 and isinstance(outcome[0], RuntimeNotAvailableError), outcome
        assert "did not answer the exec in time" in str(outcome[0])
    finally:
        listener.close()
        for tls in held:
            tls.close()
