"""Opt-in: the Kubernetes backend against a real cluster (``AGENTNEST_K8S_TESTS=1``).

No cluster can run where AgentNest is built, so this never runs in its CI:
it is for a developer or platform team with a cluster (kind, k3s, GKE
Sandbox...).  Set up the namespace first (docs/kubernetes.md), then::

    AGENTNEST_K8S_TESTS=1 KUBECONFIG=~/.kube/config \\
    AGENTNEST_K8S_IMAGE=registry.example/agentnest-base:1 \\
    .venv/bin/pytest -q tests/integration/test_k8s_real_cluster.py

Environment: ``AGENTNEST_K8S_IMAGE`` (an image with python3 the nodes can
pull; required), ``AGENTNEST_K8S_NAMESPACE`` (default ``agentnest``),
``AGENTNEST_K8S_RUNTIME_CLASS`` (default ``gvisor``; ``none`` for the
cluster's default), ``AGENTNEST_K8S_CONTEXT``, and
``AGENTNEST_K8S_PROBE_ADDRESSES`` (``host:port`` list, comma separated, that
a sandbox must not reach besides the apiserver: e.g. your cloud's metadata
address and an internet address; probing them is your decision, so none is
probed unless you name it), ``AGENTNEST_K8S_ALLOWED_URL`` (an ``https://`` URL
the egress proxy pod may fetch for the allowlist test, e.g. your package
index; that test is skipped without it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from agentnest import Sandbox
from agentnest.runtime.base import RuntimeBackend
from agentnest.runtime.kubernetes import KubernetesBackend, KubernetesSpec
from agentnest.testing.contract import BackendContract

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.skipif(
        os.environ.get("AGENTNEST_K8S_TESTS") != "1",
        reason="needs a Kubernetes cluster: not verified on the build machines (set AGENTNEST_K8S_TESTS=1)",
    ),
]


def _backend() -> KubernetesBackend:
    runtime_class = os.environ.get("AGENTNEST_K8S_RUNTIME_CLASS", "gvisor")
    return KubernetesBackend(
        KubernetesSpec(
            namespace=os.environ.get("AGENTNEST_K8S_NAMESPACE", "agentnest"),
            context=os.environ.get("AGENTNEST_K8S_CONTEXT") or None,
            runtime_class_name=None if runtime_class == "none" else runtime_class,
        )
    )


def _image() -> str:
    image = os.environ.get("AGENTNEST_K8S_IMAGE")
    if not image:
        pytest.fail("AGENTNEST_K8S_IMAGE must name an image with python3 that the nodes can pull")
    return image


class TestRealCluster(BackendContract):
    @pytest.fixture
    def backend(self) -> Iterator[RuntimeBackend]:
        b = _backend()
        yield b
        b.close()

    @pytest.fixture
    def image(self) -> str:
        return _image()


# Run inside the pod: every probe prints one "name verdict" line.
PROBE = r"""
import os, socket, sys
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return line.split()[1]
print('uid', os.getuid(), os.getgid())
print('capeff', status('CapEff'))
print('nonewprivs', status('NoNewPrivs'))
try:
    open('/probe', 'w'); print('root writable')
except OSError:
    print('root read-only')
print('token', os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token'))
print('uid_map', open('/proc/self/uid_map').read().split())
api = (os.environ.get('KUBERNETES_SERVICE_HOST', ''), int(os.environ.get('KUBERNETES_SERVICE_PORT', '443')))
targets = [api]
targets += [(h, int(p)) for h, p in (a.rsplit(':', 1) for a in sys.argv[1:])]
for host, port in targets:
    if not host:
        continue
    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, port)); print('reach', host, port, 'open')
    except OSError:
        print('reach', host, port, 'blocked')
    finally:
        s.close()
"""


def test_the_pod_holds_the_defaults_inside() -> None:
    probes = [a for a in os.environ.get("AGENTNEST_K8S_PROBE_ADDRESSES", "").split(",") if a]
    backend = _backend()
    try:
        with Sandbox(_image(), backend=backend, timeout=300) as sb:
            sb.write_file("/workspace/probe.py", PROBE)
            out = sb.exec(["python3", "/workspace/probe.py", *probes], timeout=120)
            lines = out.stdout.splitlines()
            assert "uid 65532 65532" in lines, out.stdout
            assert "capeff 0000000000000000" in lines
            assert "root read-only" in lines
            assert "token False" in lines
            assert not any(line.startswith("reach") and line.endswith("open") for line in lines), out.stdout
            if os.environ.get("AGENTNEST_K8S_RUNTIME_CLASS", "gvisor") != "gvisor":
                assert "nonewprivs 1" in lines  # gVisor's /proc/self/status has no such line
    finally:
        backend.close()


def test_the_backend_proved_the_pod_s_network_denied_before_handing_it_out() -> None:
    # The backend's own in-pod check (netcheck) ran on the defaults plus the
    # addresses given here; a cluster whose CNI ignores NetworkPolicies fails
    # this at create with VerificationError, never a handed-out sandbox.
    probes = [a for a in os.environ.get("AGENTNEST_K8S_PROBE_ADDRESSES", "").split(",") if a]
    base = _backend()
    extra = {f"extra{i}": address for i, address in enumerate(probes)}
    backend = KubernetesBackend(dataclasses.replace(base.spec, network_probes=extra))
    try:
        with Sandbox(_image(), backend=backend, timeout=300) as sb:
            seen = sb.handle.info["network_check"]
            assert {line.split()[0] for line in seen} >= {"apiserver", "metadata", "dns", "internet", *extra}
    finally:
        backend.close()


def test_the_egress_allowlist_lets_one_name_through_its_proxy_pod_and_nothing_else() -> None:
    """A proxy pod per sandbox on the real network plugin: the allowed name works, every
    other name is refused by the proxy, and both are ``egress.*`` events read from its log."""
    from urllib.parse import urlsplit

    from agentnest import NetworkPolicy, SecurityPolicy

    url = os.environ.get("AGENTNEST_K8S_ALLOWED_URL", "")
    if not url.startswith("https://"):
        pytest.skip("set AGENTNEST_K8S_ALLOWED_URL to an https:// URL the proxy may fetch")
    host = urlsplit(url).hostname or ""
    policy = SecurityPolicy(network=NetworkPolicy.allowlist([host], ports=[443]))
    backend = _backend()
    fetch = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        "    print(urllib.request.urlopen(sys.argv[1], timeout=20).status)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"
    )
    try:
        with Sandbox(_image(), backend=backend, security_policy=policy, timeout=300) as sb:
            sb.write_file("fetch.py", fetch)
            assert sb.exec(["python3", "fetch.py", url], timeout=60).check().stdout.strip() == "200"
            refused = sb.exec(["python3", "fetch.py", "https://refused.invalid/"], timeout=60)
            assert refused.check().stdout.strip() == "403"
            direct = sb.exec_python(
                "import socket\n"
                "try:\n"
                f"    socket.create_connection(({host!r}, 443), timeout=5); print('connected')\n"
                "except OSError as e:\n"
                "    print('blocked', type(e).__name__)\n",
                timeout=60,
            )
            assert direct.check().stdout.startswith("blocked")  # no DNS, no route but the proxy
            from agentnest.testing.wait import wait_until

            wait_until(lambda: len(sb.network_log()) >= 2, "two egress events from the proxy's log", 30)
            kinds = {(e["type"], e["host"]) for e in sb.network_log()}
            assert ("egress.allowed", host) in kinds and ("egress.denied", "refused.invalid") in kinds
    finally:
        backend.close()
