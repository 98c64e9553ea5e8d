"""The Docker side of the egress allowlist without an engine: event log, loader, spec, prune."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
import threading
import time
from typing import Any, cast

import pytest

from agentnest.errors import ConfigurationError
from agentnest.policy import NetworkPolicy
from agentnest.runtime.base import Capability
from agentnest.runtime.docker import DockerBackend, DockerSpec, labels
from agentnest.runtime.docker.egress import (
    DEFAULT_SUBNETS,
    EgressLog,
    EgressTopology,
    draw_subnets,
    proxy_command,
    read_events,
)
from agentnest.runtime.docker.prune import EXPIRED, SANDBOX_GONE, SANDBOX_GONE_GRACE, prune

GOOD: dict[str, Any] = {
    "type": "egress.denied",
    "host": "refused.test",
    "port": 443,
    "address": "",
    "reason": "domain_not_allowed",
    "detail": "refused.test is not on the allowlist",
    "method": "CONNECT",
    "client": "198.18.0.3",
    "bytes_up": 0,
    "bytes_down": 0,
    "duration": 0.001,
    "time": 1_700_000_000.5,
}


def line(**changes: Any) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


# -- EgressLog -----------------------------------------------------------------------


def test_log_keeps_validated_events_and_calls_subscribers() -> None:
    log = EgressLog("sb1", size=3)
    seen: list[dict[str, Any]] = []
    log.feed_line(line(host="a.test"))
    unsubscribe = log.subscribe(seen.append)  # replays the backlog
    log.feed_line(line(host="b.test", type="egress.allowed", reason="allowed", address="10.0.0.1"))
    assert [e["host"] for e in seen] == ["a.test", "b.test"]
    assert seen[1]["sandbox"] == "sb1" and seen[1]["address"] == "10.0.0.1"
    assert "client" not in seen[1]  # only known fields pass
    unsubscribe()
    for host in ("c.test", "d.test", "e.test"):
        log.feed_line(line(host=host))
    assert len(seen) == 2
    assert [e["host"] for e in log.log()] == ["c.test", "d.test", "e.test"]  # bounded, newest kept
    log.log()[0]["host"] = "changed"
    assert log.log()[0]["host"] == "c.test"  # copies


@pytest.mark.parametrize(
    "bad",
    [
        b"not json",
        b"[1, 2]",
        b'"string"',
        line(type="egress.other"),
        line(type=None),
        line(reason="made_up"),
        line(port=70000),
        line(port="443"),
        line(port=True),
        line(address="not-an-ip"),
        line(host="h" * 300),
        line(detail=["x"]),
        line(bytes_up=-1),
        line(duration="fast"),
        b'{"type": "egress.denied", "duration": NaN}',
        b"\xff\xfe",
        b"[" * 100_000,
    ],
)
def test_log_drops_invalid_lines(bad: bytes) -> None:
    log = EgressLog("sb1")
    log.feed_line(bad)
    assert log.log() == [] and log.invalid == 1


def test_a_failing_subscriber_does_not_stop_the_log() -> None:
    log = EgressLog("sb1")
    seen: list[dict[str, Any]] = []

    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("observer bug")

    log.subscribe(broken)
    log.subscribe(seen.append)
    log.feed_line(line())
    assert len(seen) == 1 and isinstance(log.callback_errors[0], RuntimeError)


class FakeStream:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def read(self, max_bytes: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def test_reader_splits_lines_across_chunks_and_skips_overlong_ones() -> None:
    log = EgressLog("sb1")
    ready = b'{"type": "proxy.ready", "listen": ["198.18.0.2", 3128]}\n'
    overlong = b"x" * 40_000 + b"\n"
    stream = FakeStream([ready[:10], ready[10:] + line()[:20], line()[20:] + b"\n", overlong[:30_000]])
    stream.chunks += [overlong[30_000:], line(host="after.test") + b"\n"]
    read_events(stream, log)  # type: ignore[arg-type]
    assert log.ready.is_set() and log.closed.is_set()
    assert log.listen == ("198.18.0.2", 3128)
    assert [e["host"] for e in log.log()] == ["refused.test", "after.test"]
    assert log.invalid == 1


# -- shipping the proxy --------------------------------------------------------------


def test_proxy_command_runs_the_shipped_source(tmp_path: Any) -> None:
    """The container's argv, run with this Python: the loader works and the proxy listens."""
    config = {"listen": ["127.0.0.1", 0], "domains": ["a.test"], "deadline": time.time() + 2}
    argv = proxy_command(sys.executable, config)
    assert sum(len(a) for a in argv) < 100_000  # well under the kernel's argv limits
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        log = EgressLog("sb1")
        reader = threading.Thread(target=read_events, args=(_Pipe(proc.stdout), log))
        reader.start()
        assert log.ready.wait(10) and log.listen is not None
        assert proc.wait(timeout=10) == 0  # stopped itself at its deadline
        reader.join(5)
        assert log.closed.is_set()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.parametrize("subdomains", [True, False])
def test_the_shipped_proxy_matches_as_the_policy_says(subdomains: bool) -> None:
    """Policy -> proxy_config() -> the container's argv -> the running proxy's decisions.

    Everything stays on loopback: ``files.pypi.test`` is mapped to 127.0.0.1
    (refused there, as private, after the name check), and nothing is
    connected to, because no ClientHello is sent through the admitted tunnel.
    """
    policy = NetworkPolicy.allowlist(["pypi.test", "127.0.0.1"], subdomains=subdomains)
    topology = EgressTopology(
        cast(Any, None),
        sandbox_id="sb1",
        backend="docker",
        created=time.time(),
        deadline=time.time() + 30,
        policy=policy,
        hosts={"files.pypi.test": "127.0.0.1"},
        image="unused",
        python=sys.executable,
        oci_runtime="runc",
        egress_network="bridge",
        subnets=DEFAULT_SUBNETS,
        arch="x86_64",
        extra_labels={},
    )
    topology.subnet = ipaddress.IPv4Network("198.18.0.8/29")
    config = topology.proxy_config()
    assert config["subdomains"] is subdomains
    assert config["domains"] == ["pypi.test", "127.0.0.1"]
    config.update(listen=["127.0.0.1", 0], clients=[], deadline=time.time() + 20)
    proc = subprocess.Popen(proxy_command(sys.executable, config), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        log = EgressLog("sb1")
        reader = threading.Thread(target=read_events, args=(_Pipe(proc.stdout), log))
        reader.start()
        assert log.ready.wait(10) and log.listen is not None

        def ask(target: str) -> bytes:
            assert log.listen is not None
            with socket.create_connection(log.listen, timeout=10) as s:
                s.sendall(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
                return s.recv(4096)

        name = ask("files.pypi.test:443")
        expected = "address_refused" if subdomains else "domain_not_allowed"
        assert f"reason={expected}".encode() in name, name
        assert ask("127.0.0.1:443").startswith(b"HTTP/1.1 200")  # the listed literal
        assert b"reason=ip_not_allowed" in ask("127.0.0.2:443")
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


class _Pipe:
    def __init__(self, f: Any) -> None:
        self.f = f

    def read(self, n: int) -> bytes:
        return bytes(self.f.read1(n))


def test_subnets_are_drawn_as_aligned_29s_inside_the_pool_a_bounded_number_of_times() -> None:
    pool = ipaddress.IPv4Network(DEFAULT_SUBNETS)
    drawn = list(draw_subnets(pool))
    assert len(drawn) == 16
    assert all(s.prefixlen == 29 and s.subnet_of(pool) for s in drawn)  # aligned by construction
    only = ipaddress.IPv4Network("10.9.8.0/29")
    assert list(draw_subnets(only)) == [only] * 16  # a /29 pool holds one


# -- spec and capabilities -----------------------------------------------------------


def test_spec_validates_the_hosts_mapping() -> None:
    spec = DockerSpec(egress_hosts={"Files.Example.": "10.0.0.5"})
    assert dict(spec.egress_hosts) == {"Files.Example.": "10.0.0.5"}
    with pytest.raises(TypeError):
        spec.egress_hosts["x"] = "1.2.3.4"  # type: ignore[index]
    assert hash(spec) == hash(DockerSpec(egress_hosts={"other.example": "10.0.0.6"}))
    assert spec != DockerSpec(egress_hosts={"other.example": "10.0.0.6"})
    for bad in ({"not a name": "1.2.3.4"}, {"a.example": "nowhere"}, ["a.example"]):
        with pytest.raises(ConfigurationError, match="egress_hosts"):
            DockerSpec(egress_hosts=bad)  # type: ignore[arg-type]


def test_allowlist_runtime_and_capability() -> None:
    assert DockerSpec().allowlist_oci_runtime() == "runc"
    assert DockerSpec(oci_runtime="runsc").allowlist_oci_runtime() == "runsc-host"
    assert (
        DockerSpec(oci_runtime="runsc", network_oci_runtime="runsc-net").allowlist_oci_runtime()
        == "runsc-net"
    )
    assert Capability.EGRESS_DOMAINS in DockerBackend().capabilities()
    assert Capability.EGRESS_DOMAINS in DockerBackend(DockerSpec(oci_runtime="runsc")).capabilities()
    assert (
        Capability.EGRESS_DOMAINS not in DockerBackend(DockerSpec(oci_runtime="kata-runtime")).capabilities()
    )


# -- prune ---------------------------------------------------------------------------


class FakeAPI:
    def __init__(self, containers: list[dict[str, Any]], networks: list[dict[str, Any]]) -> None:
        self.containers_ = containers
        self.networks_ = networks
        self.removed: list[str] = []
        self.filters: list[Any] = []

    def _select(self, items: list[dict[str, Any]], filters: Any) -> list[dict[str, Any]]:
        self.filters.append(filters)
        wanted = dict(f.split("=", 1) for f in filters["label"])
        return [i for i in items if all(i["Labels"].get(k) == v for k, v in wanted.items())]

    def containers(self, *, all: bool = False, filters: Any = None) -> list[dict[str, Any]]:
        return self._select(self.containers_, filters)

    def networks(self, *, filters: Any = None) -> list[dict[str, Any]]:
        return self._select(self.networks_, filters)

    def volumes(self, *, filters: Any = None) -> dict[str, Any]:
        return {"Volumes": []}

    def remove_container(self, rid: str, **kwargs: Any) -> None:
        self.removed.append(rid)

    def remove_network(self, rid: str) -> None:
        self.removed.append(rid)


NOW = time.time()


def tags(sandbox: str, role: str, deadline: float = NOW + 3600, created: float = NOW - 600) -> dict[str, str]:
    out = labels.for_sandbox(sandbox, "docker", created, deadline, role=role)
    return out


def resources() -> FakeAPI:
    return FakeAPI(
        [
            # a live allowlisted sandbox: untouched
            {"Id": "c-live", "Names": ["/l"], "Labels": tags("live", "sandbox")},
            {"Id": "p-live", "Names": ["/lp"], "Labels": tags("live", "proxy")},
            # the sandbox container is gone (a crash between removals): reap the rest
            {"Id": "p-orphan", "Names": ["/op"], "Labels": tags("orphan", "proxy")},
            # just created: its sandbox container may be on its way
            {"Id": "p-young", "Names": ["/yp"], "Labels": tags("young", "proxy", created=NOW - 1)},
            # expired with its sandbox
            {"Id": "c-old", "Names": ["/o"], "Labels": tags("old", "sandbox", deadline=NOW - 5)},
            {"Id": "p-old", "Names": ["/opx"], "Labels": tags("old", "proxy", deadline=NOW - 5)},
        ],
        [
            {"Id": "n-live", "Name": "live-net", "Labels": tags("live", "egress-network")},
            {"Id": "n-orphan", "Name": "orphan-net", "Labels": tags("orphan", "egress-network")},
            {
                "Id": "n-young",
                "Name": "young-net",
                "Labels": tags("young", "egress-network", created=NOW - 1),
            },
            {"Id": "n-old", "Name": "old-net", "Labels": tags("old", "egress-network", deadline=NOW - 5)},
        ],
    )


def test_prune_reaps_proxies_and_networks_with_or_without_their_sandbox() -> None:
    api = resources()
    report = prune(api, now=NOW)
    assert sorted((r.id, r.reason) for r in report.containers) == [
        ("c-old", EXPIRED),
        ("p-old", EXPIRED),
        ("p-orphan", SANDBOX_GONE),
    ]
    assert sorted((r.id, r.reason) for r in report.networks) == [
        ("n-old", EXPIRED),
        ("n-orphan", SANDBOX_GONE),
    ]
    assert "p-live" not in api.removed and "n-live" not in api.removed
    assert "p-young" not in api.removed and "n-young" not in api.removed
    # After the grace period the young proxy counts as abandoned too.
    later = prune(resources(), now=NOW + SANDBOX_GONE_GRACE, dry_run=True)
    assert "p-young" in {r.id for r in later.containers}


def test_prune_one_sandbox() -> None:
    api = resources()
    report = prune(api, now=NOW + 7200, sandbox="live")
    assert {r.id for r in report.resources} == {"c-live", "p-live", "n-live"}
    assert all(f"{labels.SANDBOX}=live" in f["label"] for f in api.filters)
