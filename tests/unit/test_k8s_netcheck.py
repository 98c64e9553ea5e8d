"""The in-pod network check: its judge (pure) and its probe, run here against loopback only.

The probe runs in real pods in tests/integration/test_k8s_backend.py; here it
runs on this machine with every target a loopback socket this test opens, so
that each outcome (connected, refused, a DNS answer, a timeout) is produced
for real and nothing is sent beyond the machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from agentnest.errors import ConfigurationError, VerificationError
from agentnest.runtime.kubernetes import KubernetesSpec
from agentnest.runtime.kubernetes.netcheck import DEFAULT_PROBES, judge, parse_addresses, probe_argv, targets


def rows(*items: tuple[str, str, int, str, str]) -> bytes:
    return json.dumps([list(i) for i in items]).encode()


WANTED = [["apiserver", "tcp", "@service", 443], ["metadata", "tcp", "169.254.169.254", 80]]


# -- addresses and targets ------------------------------------------------------------


def test_addresses_parse_ipv4_ipv6_and_the_in_pod_names() -> None:
    assert parse_addresses("x", "10.0.0.1:443, [fd00::1]:53,@resolv:53") == [
        ("10.0.0.1", 443),
        ("fd00::1", 53),
        ("@resolv", 53),
    ]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("metadata.internal:80", "not an IP address"),
        ("10.0.0.1", "no valid port"),
        ("10.0.0.1:0", "no valid port"),
        ("10.0.0.1:70000", "no valid port"),
        ("", "must be IP:PORT"),
        (",".join(["10.0.0.1:1"] * 9), "at most 8"),
    ],
)
def test_a_bad_address_is_refused_naming_it(value: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        parse_addresses("metadata", value)


def test_the_spec_validates_its_probes() -> None:
    with pytest.raises(ConfigurationError, match="not an IP address"):
        KubernetesSpec(network_probes={"metadata": "metadata.google.internal:80"})
    with pytest.raises(ConfigurationError, match="short lowercase name"):
        KubernetesSpec(network_probes={"Bad Name": "10.0.0.1:1"})
    with pytest.raises(ConfigurationError, match=r"0\.05 to 30"):
        KubernetesSpec(network_probe_timeout=0)
    spec = KubernetesSpec(network_probes={"registry": "10.0.0.5:5000"})
    assert dict(spec.network_probes) == {"registry": "10.0.0.5:5000"}


def test_targets_are_the_defaults_then_the_spec_plus_a_remote_apiserver_address() -> None:
    got = targets({"registry": "10.0.0.5:5000"}, "https://10.1.2.3:6443")
    names = [t[0] for t in got]
    assert names[: len(DEFAULT_PROBES)] == list(DEFAULT_PROBES)
    assert ["registry", "tcp", "10.0.0.5", 5000] in got
    assert ["dns", "dns", "@resolv", 53] in got
    assert ["apiserver", "tcp", "10.1.2.3", 6443] in got
    # A loopback apiserver is this machine's, not the pod's: the pod's own @service covers it.
    assert ["apiserver", "tcp", "127.0.0.1", 6443] not in targets({}, "https://127.0.0.1:6443")
    # An explicit apiserver replaces both.
    explicit = targets({"apiserver": "10.9.9.9:443"}, "https://10.1.2.3:6443")
    assert [t for t in explicit if t[0] == "apiserver"] == [["apiserver", "tcp", "10.9.9.9", 443]]


# -- the judge ---------------------------------------------------------------------------


def test_blocked_outcomes_pass() -> None:
    seen = judge(
        rows(
            ("apiserver", "10.96.0.1", 443, "tcp", "timeout"),
            ("metadata", "169.254.169.254", 80, "tcp", "ENETUNREACH"),
            ("metadata", "127.0.0.1", 80, "tcp", "refused"),
        ),
        WANTED,
    )
    assert [o.reached for o in seen] == [False, False, False]


@pytest.mark.parametrize(
    ("outcome", "host"),
    [
        ("connected", "10.96.0.1"),
        ("answered", "10.96.0.10"),
        # A reset from a remote host: the packet got out.
        ("refused", "10.96.0.1"),
        # An outcome nobody taught the judge: fail closed.
        ("ECONNRESET", "10.96.0.1"),
        ("something-new", "10.96.0.1"),
    ],
)
def test_anything_reached_or_unknown_fails_closed(outcome: str, host: str) -> None:
    with pytest.raises(VerificationError, match=f"apiserver {host}:443/tcp \\({outcome}\\)") as info:
        judge(
            rows(
                ("apiserver", host, 443, "tcp", outcome),
                ("metadata", "169.254.169.254", 80, "tcp", "timeout"),
            ),
            WANTED,
        )
    assert "does not enforce NetworkPolicies" in str(info.value)
    assert len(info.value.findings) == 2


def test_no_apiserver_address_to_check_fails_closed() -> None:
    with pytest.raises(VerificationError, match="no address to check"):
        judge(
            rows(
                ("apiserver", "@service", 443, "tcp", "absent"),
                ("metadata", "169.254.169.254", 80, "tcp", "timeout"),
            ),
            WANTED,
        )


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (b"", "printed no JSON"),
        (b"\xff\xfe", "printed no JSON"),
        (b'{"apiserver": "timeout"}', "other than its list"),
        (b'[["apiserver", "10.0.0.1", "443", "tcp", "timeout"]]', "malformed"),
        (b'[["apiserver", "10.0.0.1", true, "tcp", "timeout"]]', "malformed"),
        (b'[["apiserver", "10.0.0.1", 443, "tcp"]]', "malformed"),
        (rows(("apiserver", "10.0.0.1", 443, "tcp", "timeout")), "did not report metadata"),
        (
            json.dumps([["apiserver", "10.0.0.1", 443, "tcp", "timeout"]] * 100).encode(),
            "other than its list",
        ),
    ],
)
def test_untrusted_output_that_is_not_the_probe_s_fails_closed(output: bytes, why: str) -> None:
    with pytest.raises(VerificationError, match=why):
        judge(output, WANTED)


# -- the probe, for real, on loopback -------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.fixture
def dns_server() -> Iterator[int]:
    """A UDP server on loopback that answers every datagram."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(512)
            except OSError:
                continue
            sock.sendto(data[:2] + b"\x81\x80" + data[4:], peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        sock.close()


@pytest.fixture
def silent_udp() -> Iterator[int]:
    """A bound UDP port that never answers (and no TCP listener on it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_probe(wanted: list[list[object]], env: dict[str, str]) -> list[list[object]]:
    argv = probe_argv(sys.executable, wanted, 0.5)
    done = subprocess.run(argv, capture_output=True, timeout=30, env=env, check=True)
    result: list[list[object]] = json.loads(done.stdout)
    return result


def test_the_probe_reports_each_outcome_for_real(listener: int, dns_server: int, silent_udp: int) -> None:
    closed = closed_port()
    env = {"PATH": os.environ.get("PATH", ""), "KUBERNETES_SERVICE_HOST": "127.0.0.1"}
    env["KUBERNETES_SERVICE_PORT"] = str(listener)
    wanted: list[list[object]] = [
        ["apiserver", "tcp", "@service", 443],
        ["closed", "tcp", "127.0.0.1", closed],
        ["dns", "dns", "127.0.0.1", dns_server],
        ["silent", "dns", "127.0.0.1", silent_udp],
        ["dnstcp", "dns", "127.0.0.1", listener],
    ]
    got = {row[0]: row for row in run_probe(wanted, env)}
    assert got["apiserver"] == ["apiserver", "127.0.0.1", listener, "tcp", "connected"]
    assert got["closed"][4] == "refused"
    assert got["dns"][4] == "answered"
    # No UDP answer and no TCP listener: the UDP phase's verdict stands.
    assert got["silent"][4] == "timeout"
    # A server that takes DNS over TCP only is reached all the same.
    assert got["dnstcp"][4] == "connected"
    # What the judge makes of it: the reachable ones, named.
    with pytest.raises(VerificationError) as info:
        judge(json.dumps(list(got.values())).encode(), wanted)
    message = str(info.value)
    assert "apiserver 127.0.0.1" in message and "dns 127.0.0.1" in message and "dnstcp" in message
    assert "closed 127.0.0.1" not in message and "silent" not in message


def test_without_the_service_variables_the_apiserver_is_absent() -> None:
    env = {"PATH": os.environ.get("PATH", "")}
    got = run_probe([["apiserver", "tcp", "@service", 443]], env)
    assert got == [["apiserver", "@service", 443, "tcp", "absent"]]


def test_the_probe_then_becomes_the_next_program_on_the_same_stdio(listener: int) -> None:
    then = [sys.executable, "-c", "import sys; print('bridge', sys.stdin.read())"]
    argv = probe_argv(sys.executable, [["closed", "tcp", "127.0.0.1", closed_port()]], 0.5, then=then)
    done = subprocess.run(argv, input=b"from the host", capture_output=True, timeout=30, check=True)
    first, rest = done.stdout.split(b"\n", 1)
    assert json.loads(first)[0][4] == "refused"
    assert rest == b"bridge from the host\n"
