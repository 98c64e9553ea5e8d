"""The egress allowlist on the Kubernetes backend, through the cluster double, on runc and runsc.

The double's node wires pods as a policy-enforcing network plugin would for
the NetworkPolicies AgentNest writes: the sandbox pod and its proxy pod share
a link network with no route out; the proxy pod also joins the engine's
bridge, where the test server of ``test_egress.py`` stands in for every
allowed domain (``KubernetesSpec(egress_hosts=...)``).  Events travel from
the proxy pod's log through the double's ``pods/log`` endpoint.  Traffic goes
only to loopback and to the containers made here.
"""

# The server and certificate fixtures are test_egress.py's, imported: pytest
# finds them by name, so the parameters that use them "redefine" the imports.
# ruff: noqa: F811

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("aiohttp")

from doubles.kube.node import LABEL

from agentnest import NetworkPolicy, Sandbox, SecurityPolicy
from agentnest.runtime.docker import base_image
from agentnest.runtime.kubernetes import KubernetesSpec, manifests
from agentnest.runtime.kubernetes.backend import KubernetesBackend
from agentnest.testing.wait import wait_until

from .test_egress import BYPASS, FETCH, HostService, certs, host_addresses, server, stats  # noqa: F401
from .test_k8s_backend import Double

NS = "agentnest"
#: test_egress's bypass script on poll(): under runsc with the runtime's
#: default seccomp profile (what a pod gets), select() fails with EPERM.
POLL_BYPASS = BYPASS.replace(
    "import errno,",
    "import errno, select as _s\n"
    "def _select(r, w, x, t):\n"
    "    p = _s.poll()\n"
    "    for s in r: p.register(s, _s.POLLIN)\n"
    "    for s in w: p.register(s, _s.POLLOUT)\n"
    "    ready = {fd for fd, _ in p.poll(int(t * 1000))}\n"
    "    return [s for s in r if s.fileno() in ready], [s for s in w if s.fileno() in ready], []\n"
    "import errno,",
    1,
).replace("select.select(", "_select(")
NAMES = ("files.allowed.test", "www.allowed.test", "refused.test", "allowed.test")
RUNTIMES = [
    pytest.param(None, marks=pytest.mark.docker, id="runc"),
    pytest.param("gvisor", marks=pytest.mark.gvisor, id="runsc"),
]


class Cluster(Double):
    """The integration suite's double, with the test names mapped for the egress proxy."""

    def __init__(self, server: dict[str, Any]) -> None:
        super().__init__()
        self.hosts = {name: server["ip"] for name in NAMES}
        self.hosts["private.allowed.test"] = server["gateway"]

    def backend(self, runtime_class: str | None, **spec: Any) -> KubernetesBackend:
        return KubernetesBackend(
            KubernetesSpec(
                namespace=NS,
                kubeconfig=self.kubeconfig,
                runtime_class_name=runtime_class,
                egress_hosts=self.hosts,
                **spec,
            ),
            start_timeout=60,
        )

    def objects(self, sandbox_id: str) -> list[tuple[str, str]]:
        found = []
        for plural in ("pods", "networkpolicies", "secrets"):
            for obj in self.state.list(plural, NS):
                if obj["metadata"].get("labels", {}).get(manifests.SANDBOX_ID) == sandbox_id:
                    found.append((plural, obj["metadata"]["name"]))
        return found


@pytest.fixture(scope="module")
def cluster(server: dict[str, Any]) -> Iterator[Cluster]:
    c = Cluster(server)
    try:
        yield c
    finally:
        c.close()


def allowlist(server: dict[str, Any]) -> SecurityPolicy:
    return SecurityPolicy(
        network=NetworkPolicy.allowlist(
            domains=["files.allowed.test", "*.allowed.test"], cidrs=[f"{server['ip']}/32"], ports=[8080, 8443]
        )
    )


@pytest.fixture(scope="module", params=RUNTIMES)
def sandbox(
    request: pytest.FixtureRequest, cluster: Cluster, server: dict[str, Any], certs: Path
) -> Iterator[Sandbox]:
    backend = cluster.backend(request.param)
    try:
        with Sandbox(base_image(), backend=backend, security_policy=allowlist(server), timeout=600) as sb:
            sb.write_file("ca.pem", (certs / "cert.pem").read_bytes())
            sb.write_file("fetch.py", FETCH)
            sb.write_file("bypass.py", POLL_BYPASS)
            yield sb
    finally:
        backend.close()


def wait_events(sb: Sandbox, count: int) -> list[dict[str, Any]]:
    """Events arrive from the proxy pod's log, followed by a thread: wait until ``count`` are there."""
    wait_until(lambda: len(sb.network_log()) >= count, f"{count} egress events", 15)
    return sb.network_log()


def fetch(sb: Sandbox, urls: list[str], *, direct: bool = False) -> list[list[Any]]:
    result = sb.exec(["python3", "fetch.py", json.dumps(urls), "direct" if direct else "proxy"], timeout=120)
    assert result.ok, result.stderr
    return list(json.loads(result.stdout))


def test_the_pod_proved_every_direct_way_out_closed_before_hand_out(sandbox: Sandbox) -> None:
    checked = sandbox.handle.info["network_check"]
    assert {c.split()[0] for c in checked} == {"apiserver", "metadata", "dns", "internet"}
    assert all(("(refused)" in c or "(timeout)" in c or "(unreachable)" in c) for c in checked), checked
    # ClusterFirst DNS names the cluster's resolver; the policy keeps it out of reach.
    assert any(c.startswith("dns 10.96.0.10:53") for c in checked), checked


def test_allowed_names_work_through_the_proxy_pod_and_are_events(
    sandbox: Sandbox, server: dict[str, Any]
) -> None:
    before = len(sandbox.network_log())
    out = fetch(sandbox, ["http://files.allowed.test:8080/a", "https://www.allowed.test:8443/"])
    assert out == [[200, "hello files.allowed.test:8080"], [200, "hello www.allowed.test:8443"]]
    new = wait_events(sandbox, before + 2)[before:]
    assert [(e["type"], e["host"], e["port"], e["address"]) for e in new] == [
        ("egress.allowed", "files.allowed.test", 8080, server["ip"]),
        ("egress.allowed", "www.allowed.test", 8443, server["ip"]),
    ]
    assert all(e["bytes_up"] > 0 and e["bytes_down"] > 0 and e["sandbox"] == sandbox.id for e in new)


def test_refused_names_and_private_addresses_are_denied_events(
    sandbox: Sandbox, server: dict[str, Any]
) -> None:
    before = len(sandbox.network_log())
    out = fetch(sandbox, ["http://refused.test:8080/", "http://private.allowed.test:8080/"])
    assert [o[0] for o in out] == [403, 403]
    new = wait_events(sandbox, before + 2)[before:]
    assert [(e["type"], e["host"], e["reason"]) for e in new] == [
        ("egress.denied", "refused.test", "domain_not_allowed"),
        ("egress.denied", "private.allowed.test", "address_refused"),
    ]
    assert stats(server)["requests"].count(["refused.test:8080", "/"]) == 0


def test_every_way_around_the_proxy_pod_fails(sandbox: Sandbox, server: dict[str, Any]) -> None:
    ip = server["ip"]
    proxy = sandbox.exec_shell("getent hosts agentnest-proxy").check().stdout.split()[0]
    before = stats(server)
    host = HostService()
    try:
        targets = [
            ["direct-tcp", 4, "tcp", ip, 8080, ""],
            ["direct-udp", 4, "udp", ip, 9999, ""],
            ["dns-udp-server", 4, "udp", ip, 53, "files.allowed.test"],
            ["dns-tcp-server", 4, "tcp", ip, 53, ""],
            ["dns-cluster", 4, "udp", "10.96.0.10", 53, "files.allowed.test"],
            ["dns-proxy", 4, "udp", proxy, 53, "files.allowed.test"],
            ["proxy-other-port", 4, "tcp", proxy, 22, ""],
            ["host-docker0", 4, "tcp", server["gateway"], host.port, ""],
            *[[f"host-{a}", 4, "tcp", a, host.port, ""] for a in host_addresses(4)],
            ["metadata", 4, "tcp", "169.254.169.254", 80, ""],
        ]
        result = sandbox.exec(["python3", "bypass.py", json.dumps(targets)], timeout=120)
        assert result.ok, result.stderr
        found = json.loads(result.stdout)
    finally:
        host.close()
    leaks = {k: v for k, v in found.items() if v == "connected" or v.startswith("answer") or v == "resolved"}
    assert leaks == {}, found
    assert set(found) == {t[0] for t in targets} | {"getaddrinfo"}
    after = stats(server)
    assert (after["udp9999"], after["udp53"], after["tcp53"]) == (
        before["udp9999"],
        before["udp53"],
        before["tcp53"],
    )
    assert after["requests"] == before["requests"]
    assert host.accepted == 0


@pytest.mark.parametrize("runtime_class", RUNTIMES)
def test_the_proxy_pod_goes_with_its_sandbox_and_the_log_stays(
    runtime_class: str | None, cluster: Cluster, server: dict[str, Any]
) -> None:
    backend = cluster.backend(runtime_class)
    try:
        sb = Sandbox(base_image(), backend=backend, security_policy=allowlist(server), timeout=120)
        kinds = sorted(cluster.objects(sb.id))
        assert kinds == [
            ("networkpolicies", f"agentnest-{sb.id}"),
            ("networkpolicies", f"agentnest-{sb.id}-egress"),
            ("pods", f"agentnest-{sb.id}"),
            ("pods", f"agentnest-{sb.id}-egress"),
        ]
        proxy = cluster.state.get("pods", NS, f"agentnest-{sb.id}-egress")
        assert proxy is not None
        owners = proxy["metadata"].get("ownerReferences") or []
        assert [o["name"] for o in owners] == [f"agentnest-{sb.id}"]  # collected with the sandbox pod
        assert sb.handle.info["proxy_pod"] == f"agentnest-{sb.id}-egress"
        out = sb.exec_python(
            "import urllib.request\n"
            "print(urllib.request.urlopen('http://files.allowed.test:8080/', timeout=10).status)"
        )
        assert out.check().stdout == "200\n"
        wait_events(sb, 1)
        docker = cluster.node.client
        (container,) = docker.containers.list(filters={"label": f"{LABEL}.pod={NS}/agentnest-{sb.id}"})
        links = list(container.attrs["NetworkSettings"]["Networks"])
        assert len(links) == 1 and links[0].startswith("kubedouble-link-")  # its only way anywhere
        sb.destroy()
        wait_until(lambda: cluster.objects(sb.id) == [], "the sandbox's objects to go", 30)
        # The node removes containers and networks in the background, as a kubelet does.
        wait_until(lambda: docker.networks.list(names=links) == [], "its link network to go", 30)
        assert [e["host"] for e in sb.network_log()] == ["files.allowed.test"]
    finally:
        backend.close()


@pytest.mark.parametrize("runtime_class", RUNTIMES)
def test_extend_keeps_the_proxy_pod_serving_past_its_first_deadline(
    runtime_class: str | None, cluster: Cluster, server: dict[str, Any]
) -> None:
    backend = cluster.backend(runtime_class, max_lifetime=120)
    try:
        with Sandbox(base_image(), backend=backend, security_policy=allowlist(server), timeout=8) as sb:
            first = sb.handle.deadline
            sb.extend(60)
            # Past the first deadline, when an unmoved proxy would have stopped.
            wait_until(lambda: time.time() > first + 2, "the first deadline to pass", 30)
            out = sb.exec_python(
                "import urllib.request\n"
                "print(urllib.request.urlopen('http://files.allowed.test:8080/x', timeout=10).status)"
            )
            assert out.check().stdout == "200\n"
            assert wait_events(sb, 1)[-1]["host"] == "files.allowed.test"
    finally:
        backend.close()
