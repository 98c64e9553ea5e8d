"""The Kubernetes backend end to end, through the cluster double, on the real engine.

The double (tests/doubles/kube) is the apiserver's REST and exec endpoints
over TLS, with a node that runs each admitted Pod as a container of the local
Docker engine: runc for a pod without a RuntimeClass, runsc for
``runtimeClassName: gvisor``.  So the backend's manifests, its API calls, the
exec websocket client and the bridge to the pod's listening agent all run for
real here; what only a cluster can show (CNI enforcement, user namespaces,
scheduling) is in the opt-in suite (docs/kubernetes.md).
"""

from __future__ import annotations

import errno
import json
import math
import socket
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("aiohttp")

from doubles.kube.apiserver import FakeKubeAPI
from doubles.kube.cluster import ClusterState
from doubles.kube.node import DockerNode

from agentnest import Sandbox, SecurityPolicy
from agentnest._core import core_of
from agentnest.errors import ConfigurationError, SandboxDestroyedError, VerificationError
from agentnest.events import EventType, MemoryObserver
from agentnest.runtime.base import RuntimeBackend
from agentnest.runtime.bootstrap import NOFILE, PODINFO_DEADLINE
from agentnest.runtime.docker import base_image
from agentnest.runtime.kubernetes import KubernetesSpec, manifests
from agentnest.runtime.kubernetes.backend import KubernetesBackend
from agentnest.secrets import Secret
from agentnest.testing.contract import BackendContract
from agentnest.testing.wait import wait_until

NS = "agentnest"


def free_loopback_port() -> int:
    """A loopback TCP port nothing listens on (UDP to it is refused too)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Double:
    def __init__(self, *, enforce_network_policies: bool = True) -> None:
        self.node = DockerNode(enforce_network_policies=enforce_network_policies)
        self.state = ClusterState(node=self.node)
        self.state.add_namespace(NS, {"pod-security.kubernetes.io/enforce": "restricted"})
        self.state.add_runtime_class("gvisor", "runsc")
        self.api = FakeKubeAPI(cluster=self.state).start()
        self.kubeconfig = str(self.api.write_kubeconfig())

    def backend(self, runtime_class: str | None) -> KubernetesBackend:
        spec = KubernetesSpec(namespace=NS, kubeconfig=self.kubeconfig, runtime_class_name=runtime_class)
        return KubernetesBackend(spec, start_timeout=60)

    def close(self) -> None:
        try:
            self.api.stop()
        finally:
            self.state.node.close()


@pytest.fixture(scope="module")
def double() -> Iterator[Double]:
    d = Double()
    try:
        yield d
    finally:
        d.close()


@pytest.mark.docker
class TestKubernetesRunc(BackendContract):
    @pytest.fixture
    def backend(self, double: Double) -> Iterator[RuntimeBackend]:
        b = double.backend(None)
        yield b
        b.close()

    @pytest.fixture
    def image(self) -> str:
        return base_image()


@pytest.mark.gvisor
class TestKubernetesGvisor(BackendContract):
    @pytest.fixture
    def backend(self, double: Double) -> Iterator[RuntimeBackend]:
        b = double.backend("gvisor")
        yield b
        b.close()

    @pytest.fixture
    def image(self) -> str:
        return base_image()


RUNTIMES = [
    pytest.param(None, marks=pytest.mark.docker, id="runc"),
    pytest.param("gvisor", marks=pytest.mark.gvisor, id="runsc"),
]


@pytest.fixture(params=RUNTIMES)
def backend(request: pytest.FixtureRequest, double: Double) -> Iterator[KubernetesBackend]:
    b = double.backend(request.param)
    yield b
    b.close()


def test_the_pod_runs_under_its_security_context(backend: KubernetesBackend, double: Double) -> None:
    with Sandbox(base_image(), backend=backend, timeout=120) as sb:
        probe = sb.exec_shell(
            "id -u; id -g; grep CapEff /proc/self/status; "
            "touch /probe 2>/dev/null && echo root-writable || echo root-read-only; "
            "ls /var/run/secrets/kubernetes.io 2>/dev/null && echo token || echo no-token; "
            "awk -F: 'NR>2{print $1}' /proc/net/dev; echo ws > /workspace/f && cat /workspace/f"
        )
        lines = probe.stdout.split()
        assert lines[:2] == ["65532", "65532"], probe.stdout
        assert "CapEff:" in lines and lines[lines.index("CapEff:") + 1] == "0000000000000000"
        assert "root-read-only" in lines and "no-token" in lines
        # The policy isolates the pod both ways: the node gives it no network but loopback.
        interfaces = lines[lines.index("no-token") + 1 : -1]
        assert interfaces == ["lo"], probe.stdout
        assert lines[-1] == "ws"
        (pod,) = double.state.list("pods", NS)
        assert pod["metadata"]["labels"]["agentnest.io/sandbox-id"] == sb.id


def test_open_files_are_bounded_as_on_docker_and_cannot_be_raised(backend: KubernetesBackend) -> None:
    """A pod has no ulimit field: the keeper lowers RLIMIT_NOFILE for everything in the sandbox."""
    code = r"""
import json, os, resource
before = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1 << 20, 1 << 20)); raised = True
except (OSError, ValueError):
    raised = False
fds, error = [], None
try:
    while len(fds) < 100000:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as exc:
    error = exc.errno
print(json.dumps([list(before), raised, len(fds), error, resource.getrlimit(resource.RLIMIT_CORE)[1]]))
"""
    with Sandbox(base_image(), backend=backend, timeout=120) as sb:
        limits, raised, opened, error, core = json.loads(sb.exec_python(code).check().stdout)
    assert limits == [NOFILE, NOFILE] and not raised
    assert opened < NOFILE and error == errno.EMFILE
    assert core == 0


def test_a_secret_reaches_the_process_by_reference_only(backend: KubernetesBackend, double: Double) -> None:
    with Sandbox(
        base_image(), backend=backend, timeout=120, environment={"TOKEN": Secret("s3cr3t-value")}
    ) as sb:
        assert sb.exec_shell('printf %s "$TOKEN" | wc -c').stdout.strip() == "12"
        (pod,) = double.state.list("pods", NS)
        assert "s3cr3t-value" not in str(pod)


def test_a_cut_stream_reattaches_to_the_same_agent_with_its_sessions(
    backend: KubernetesBackend, double: Double
) -> None:
    sink = MemoryObserver()
    with Sandbox(base_image(), backend=backend, timeout=120, observers=[sink]) as sb:
        sb.python_session(name="main").run("x = 41")
        pid = sb.exec_shell("echo $PPID").stdout
        channel = core_of(sb).channel
        assert channel is not None
        assert double.api.cut_streams() >= 1
        wait_until(lambda: not channel.alive, "the host to see its stream cut", within=30)
        # The next call finds the stream gone and execs a new bridge to the same agent.
        assert sb.python_session(name="main").run("x + 1").result == "42"
        restarted = [e for e in sink.events if e.type is EventType.AGENT_RESTARTED]
        assert restarted and restarted[-1].attributes["reattached"] is True
        assert sb.exec_shell("echo $PPID").stdout == pid  # the same agent runs the commands


def test_a_pod_deleted_under_a_sandbox_is_a_destroyed_sandbox(
    backend: KubernetesBackend, double: Double
) -> None:
    with Sandbox(base_image(), backend=backend, timeout=120) as sb:
        name = sb.handle.info["pod"]
        double.state.remove("pods", NS, name)
        wait_until(lambda: not backend.is_running(sb.handle), "the pod to be gone", within=30)
        # The node kills the container in the background, as a kubelet does.
        docker = double.node.client
        label = {"label": f"agentnest.kubedouble.pod={NS}/{name}"}
        gone = lambda: docker.containers.list(all=True, filters=label, ignore_removed=True) == []  # noqa: E731
        wait_until(gone, "its container to go", 30)
        started = time.monotonic()
        with pytest.raises(SandboxDestroyedError):
            sb.exec_shell("echo hi", timeout=30)
        assert time.monotonic() - started < 30
    assert double.state.list("pods", NS) == []


# -- the in-pod network check ------------------------------------------------------------


def test_the_sandbox_is_handed_out_only_after_its_pod_proved_its_network_denied(
    backend: KubernetesBackend,
) -> None:
    # The node isolates the pod (no network but loopback), so every default
    # target (apiserver, metadata, cluster DNS, internet) fails locally: no
    # packet leaves.
    with Sandbox(base_image(), backend=backend, timeout=120) as sb:
        seen = sb.handle.info["network_check"]
        assert {line.split()[0] for line in seen} == {"apiserver", "metadata", "dns", "internet"}
        # The apiserver the kubelet names to the pod (KUBERNETES_SERVICE_HOST) was tried.
        assert any(line.startswith("apiserver 127.0.0.1:") for line in seen), seen
        assert all("connected" not in line and "answered" not in line for line in seen), seen


@pytest.fixture(scope="module")
def leaky() -> Iterator[Double]:
    """A cluster whose network plugin stores NetworkPolicies and ignores them."""
    d = Double(enforce_network_policies=False)
    try:
        yield d
    finally:
        d.close()


@pytest.mark.parametrize("runtime_class", RUNTIMES)
def test_a_pod_that_reaches_the_apiserver_is_deleted_never_handed_out(
    leaky: Double, runtime_class: str | None
) -> None:
    closed = free_loopback_port()
    spec = KubernetesSpec(
        namespace=NS,
        kubeconfig=leaky.kubeconfig,
        runtime_class_name=runtime_class,
        # The pod shares this machine's network here: every target but the
        # apiserver (the fake one, on loopback) is a closed loopback port, so
        # the check sends nothing beyond this machine.
        network_probes={n: f"127.0.0.1:{closed}" for n in ("metadata", "dns", "internet")},
    )
    backend = KubernetesBackend(spec, start_timeout=60)
    try:
        started = time.monotonic()
        with pytest.raises(VerificationError) as info:
            Sandbox(base_image(), backend=backend, timeout=120)
        assert time.monotonic() - started < 60
        message = str(info.value)
        assert f"apiserver 127.0.0.1:{leaky.api.port}/tcp (connected)" in message
        assert "does not enforce NetworkPolicies" in message
        # The closed ports were tried and counted as blocked, not as reached.
        assert "metadata" not in message
        for plural in ("pods", "secrets", "networkpolicies"):
            assert leaky.state.list(plural, NS) == [], plural
        wait_until(
            lambda: (
                not leaky.node.client.containers.list(
                    all=True, filters={"label": leaky.node.selector}, ignore_removed=True
                )
            ),
            "the pod's container to be removed",
            within=30,
        )
    finally:
        backend.close()


# -- extend() ---------------------------------------------------------------------------------


@pytest.fixture(params=RUNTIMES)
def extendable(request: pytest.FixtureRequest, double: Double) -> Iterator[KubernetesBackend]:
    spec = KubernetesSpec(
        namespace=NS, kubeconfig=double.kubeconfig, runtime_class_name=request.param, max_lifetime=60
    )
    b = KubernetesBackend(spec, start_timeout=60)
    yield b
    b.close()


def test_extend_moves_the_deadline_the_keeper_holds_and_no_further_than_the_hard_stop(
    extendable: KubernetesBackend, double: Double
) -> None:
    sb = Sandbox(base_image(), backend=extendable, timeout=4)
    try:
        first = sb.handle.deadline
        pod_name = sb.handle.info["pod"]
        moved = sb.extend(6)
        assert moved == pytest.approx(first + 6)
        pod = double.state.get("pods", NS, pod_name)
        assert pod is not None
        assert pod["metadata"]["annotations"][manifests.DEADLINE] == str(math.ceil(moved))
        # The workload cannot move it: the kubelet's copy is read-only, and a
        # signal to the keeper only makes it read that copy again.
        forged = sb.exec_shell(
            f"echo 9999999999 > {PODINFO_DEADLINE} 2>&1; kill -USR1 1; cat {PODINFO_DEADLINE}"
        )
        assert forged.stdout.strip().splitlines()[-1] == str(math.ceil(moved))
        # Past the first deadline the sandbox still answers: its keeper was re-armed.
        wait_until(lambda: time.time() > first + 1.5, "the first deadline to pass", within=30)
        assert sb.exec_shell("echo alive").stdout.strip() == "alive"
        # Past the hard stop: refused, and the sandbox lives on.
        with pytest.raises(ConfigurationError, match="max_lifetime"):
            sb.extend(120)
        assert sb.exec_shell("echo still").stdout.strip() == "still"
        # At the moved deadline the keeper ends the pod (not the kubelet's hard stop, 60 s on).
        wait_until(lambda: not extendable.is_running(sb.handle), "the pod to stop", within=30)
        stopped = time.time()
        assert moved - 1 <= stopped < moved + 15
    finally:
        sb.destroy()


def test_without_max_lifetime_extend_is_refused_with_the_fix(backend: KubernetesBackend) -> None:
    with Sandbox(base_image(), backend=backend, timeout=60) as sb:
        with pytest.raises(ConfigurationError, match=r"KubernetesSpec\(max_lifetime=SECONDS\)"):
            sb.extend(60)
        assert sb.exec_shell("echo ok").stdout.strip() == "ok"


def test_a_writable_root_is_given_when_asked_for_and_only_then(backend: KubernetesBackend) -> None:
    probe = "touch /var/tmp/probe 2>/dev/null && echo writable || echo read-only"
    with Sandbox(base_image(), backend=backend, timeout=120) as sb:
        assert sb.exec_shell(probe).stdout.strip() == "read-only"
    policy = SecurityPolicy(read_only_root=False)
    with Sandbox(
        base_image(), backend=backend, timeout=120, read_only_root=False, security_policy=policy
    ) as sb:
        assert sb.exec_shell(probe).stdout.strip() == "writable"
        assert sb.exec_shell("id -u").stdout.strip() == "65532"


# -- the Role `agentnest kubernetes setup` grants --------------------------------------------


@pytest.mark.docker
def test_the_role_grants_every_namespaced_call_the_backend_makes(double: Double) -> None:
    """What the backend asks the apiserver to authorize in its namespace, the Role allows.

    The double records every authorization; a Role missing a verb would be a
    403 on a real cluster that no fake RBAC would show.
    """
    from agentnest.runtime.kubernetes.api import KubeApi
    from agentnest.runtime.kubernetes.prune import prune

    double.state.authorized.clear()
    spec = KubernetesSpec(
        namespace=NS, kubeconfig=double.kubeconfig, runtime_class_name=None, max_lifetime=600
    )
    backend = KubernetesBackend(spec, start_timeout=60)
    try:
        with Sandbox(base_image(), backend=backend, timeout=60, environment={"K": Secret("v")}) as sb:
            sb.exec_shell("echo hi")
            sb.extend(30)
        api, _ = backend._cluster()
        prune([KubeApi(api.rest, NS)], now=time.time() + 10_000, orphans=True)
    finally:
        backend.close()
    granted = {
        (verb, resource)
        for rule in manifests.ROLE_RULES
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    used = {(verb, plural) for verb, plural, ns in double.state.authorized if ns == NS}
    assert {("create", "pods"), ("create", "pods/exec"), ("patch", "secrets")} <= used  # it ran
    assert used - granted == set(), "the Role lacks these"
