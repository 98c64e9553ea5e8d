"""GPUs on Kubernetes: ``nvidia.com/gpu`` limits and ``gpu_runtime_class_name``, against the fake apiserver.

The manifests themselves (and their strict schema validation) are in
test_k8s_manifests.py (the ``gpu-runtime-class`` golden scenario); here the
backend: it now offers GPUs, and it refuses a GPU RuntimeClass whose handler
is another OCI runtime than the one a policy's ``required_runtime`` was
checked against, before any object is created.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("aiohttp")

from doubles.kube.apiserver import FakeKubeAPI
from doubles.kube.cluster import ClusterState, NullNode

from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.errors import UnsupportedCapabilityError
from agentnest.runtime.base import Capability
from agentnest.runtime.kubernetes import KubernetesSpec
from agentnest.runtime.kubernetes.backend import KubernetesBackend

NS = "agentnest"


@pytest.fixture(autouse=True)
def _no_in_pod_network_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # NullNode runs no container to exec the check in (as in test_k8s_control.py).
    monkeypatch.setattr(KubernetesBackend, "_check_network", lambda self, pod: ([], None))


@pytest.fixture
def cluster() -> ClusterState:
    state = ClusterState(node=NullNode())
    state.add_namespace(NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    state.add_runtime_class("gvisor", "runsc")
    state.add_runtime_class("gvisor-nvproxy", "runsc-nvproxy")
    state.add_runtime_class("nvidia", "nvidia")
    return state


@pytest.fixture
def server(cluster: ClusterState) -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(cluster=cluster) as fake:
        yield fake


def make(server: FakeKubeAPI, **spec: object) -> KubernetesBackend:
    return KubernetesBackend(
        KubernetesSpec(namespace=NS, kubeconfig=str(server.write_kubeconfig()), **spec),  # type: ignore[arg-type]
        start_timeout=10,
    )


GPU = SandboxConfig(image="agentnest/base:1", limits=ResourceLimits(gpus=1))


def test_the_backend_offers_gpus(server: FakeKubeAPI) -> None:
    backend = make(server)
    try:
        assert Capability.GPU in backend.capabilities()
    finally:
        backend.close()


def test_a_gpu_pod_runs_in_the_gpu_runtime_class_of_the_same_oci_runtime(
    server: FakeKubeAPI, cluster: ClusterState
) -> None:
    backend = make(server, gpu_runtime_class_name="gvisor-nvproxy")
    try:
        handle = backend.create(GPU)
        pod = cluster.get("pods", NS, handle.info["pod"])
        assert pod is not None
        assert pod["spec"]["runtimeClassName"] == "gvisor-nvproxy"
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "1"
        backend.destroy(handle)
        plain = backend.create(SandboxConfig(image="agentnest/base:1"))
        plain_pod = cluster.get("pods", NS, plain.info["pod"])
        assert plain_pod is not None and plain_pod["spec"]["runtimeClassName"] == "gvisor"
        backend.destroy(plain)
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("gpu_class", "said"),
    [
        ("nvidia", "runs 'nvidia'"),  # runc with a hook: out of the gVisor the policy saw
        ("missing", "no OCI runtime it can name"),
    ],
)
def test_a_gpu_runtime_class_of_another_oci_runtime_is_refused_before_any_object(
    server: FakeKubeAPI, cluster: ClusterState, gpu_class: str, said: str
) -> None:
    backend = make(server, gpu_runtime_class_name=gpu_class)
    try:
        with pytest.raises(UnsupportedCapabilityError, match=said) as info:
            backend.create(GPU)
        assert "runtime_class_name='gvisor' ('runsc')" in str(info.value)
        assert "no pod was created" in str(info.value)
        assert [m for m, _ in cluster.calls if m == "POST"] == []
        # A sandbox without GPUs is not concerned.
        backend.destroy(backend.create(SandboxConfig(image="agentnest/base:1")))
    finally:
        backend.close()


def test_on_the_cluster_default_runtime_any_gpu_class_goes(
    server: FakeKubeAPI, cluster: ClusterState
) -> None:
    # No runtime the guard could name (a policy requiring one refuses already).
    backend = make(server, runtime_class_name=None, gpu_runtime_class_name="nvidia")
    try:
        handle = backend.create(GPU)
        pod = cluster.get("pods", NS, handle.info["pod"])
        assert pod is not None and pod["spec"]["runtimeClassName"] == "nvidia"
        backend.destroy(handle)
    finally:
        backend.close()
