"""The control plane against the cluster double over HTTPS: REST client, API calls, create/destroy.

No node runs anything here (``NullNode`` marks admitted pods Running): these
tests are about what the apiserver accepts, refuses and reports.  The pods'
containers run in tests/integration/test_k8s_backend.py.
"""

from __future__ import annotations

import copy
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("aiohttp")

from doubles.kube.apiserver import FakeKubeAPI
from doubles.kube.cluster import ClusterState, Node, NullNode

from agentnest.config import SandboxConfig
from agentnest.errors import (
    BackendError,
    ConfigurationError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
    UnsupportedCapabilityError,
)
from agentnest.policy import NetworkPolicy, SecurityPolicy
from agentnest.runtime.kubernetes import KubernetesSpec, manifests
from agentnest.runtime.kubernetes.api import KubeApi, hardening_drift
from agentnest.runtime.kubernetes.backend import KubernetesBackend
from agentnest.runtime.kubernetes.connection import KubeConnection, from_kube_config
from agentnest.runtime.kubernetes.kubeconfig import load
from agentnest.runtime.kubernetes.rest import KubeRest
from agentnest.secrets import Secret
from agentnest.testing.wait import wait_until

NS = "agentnest"


@pytest.fixture(autouse=True)
def _no_in_pod_network_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # NullNode runs no container to exec the check in; the check itself runs
    # against real pods in tests/integration/test_k8s_backend.py.
    monkeypatch.setattr(KubernetesBackend, "_check_network", lambda self, pod: ([], None))


@pytest.fixture
def cluster() -> ClusterState:
    state = ClusterState(node=NullNode(missing_images={"missing:1"}))
    state.add_namespace(NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    state.add_runtime_class("gvisor", "runsc")
    return state


@pytest.fixture
def server(cluster: ClusterState) -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(cluster=cluster) as fake:
        yield fake


@pytest.fixture
def api(server: FakeKubeAPI) -> Iterator[KubeApi]:
    rest = KubeRest(from_kube_config(load(server.write_kubeconfig()).configuration))
    yield KubeApi(rest, NS)
    rest.close()


def sandbox_pod(sandbox_id: str = "a1b2c3", **config: Any) -> dict[str, Any]:
    return manifests.pod(
        SandboxConfig(image="agentnest/base:1", **config),
        KubernetesSpec(),
        sandbox_id,
        ["sleep", "1"],
        now=time.time(),
    )


def test_a_hardened_pod_is_admitted_under_restricted_and_reads_back_as_sent(api: KubeApi) -> None:
    sent = sandbox_pod()
    stored = api.create(sent)
    assert stored["metadata"]["uid"] and stored["status"]["phase"] == "Pending"
    assert hardening_drift(sent, stored) == []
    assert api.wait_running(sent["metadata"]["name"], 10)["status"]["phase"] == "Running"


def test_an_unknown_field_is_refused_under_strict_validation(api: KubeApi) -> None:
    sent = sandbox_pod()
    sent["spec"]["securityContex"] = {}
    with pytest.raises(ConfigurationError, match="securityContex"):
        api.create(sent)


def test_a_missing_runtime_class_is_refused_with_the_fix(api: KubeApi) -> None:
    sent = sandbox_pod()
    sent["spec"]["runtimeClassName"] = "kata"
    with pytest.raises(RuntimeNotAvailableError, match='RuntimeClass "kata" not found') as info:
        api.create(sent)
    assert info.value.reason == "runtime_class"


def test_pod_security_restricted_refuses_a_loosened_pod(api: KubeApi) -> None:
    sent = sandbox_pod()
    sent["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(BackendError, match="violates PodSecurity") as info:
        api.create(sent)
    assert info.value.reason == "pod_security"


def test_a_full_quota_is_a_quota_error(api: KubeApi, cluster: ClusterState) -> None:
    cluster.put(
        "resourcequotas", {"metadata": {"name": "compute", "namespace": NS}, "spec": {"hard": {"pods": "1"}}}
    )
    api.create(sandbox_pod("a1"))
    with pytest.raises(BackendError, match="exceeded quota: compute") as info:
        api.create(sandbox_pod("a2"))
    assert info.value.reason == "quota"


def test_a_missing_permission_names_the_setup_command(api: KubeApi, cluster: ClusterState) -> None:
    cluster.denied.add(("create", "pods"))
    with pytest.raises(RuntimeNotAvailableError, match="agentnest kubernetes setup") as info:
        api.create(sandbox_pod())
    assert info.value.reason == "rbac"


def test_a_missing_namespace_names_the_setup_command(server: FakeKubeAPI) -> None:
    rest = KubeRest(from_kube_config(load(server.write_kubeconfig()).configuration))
    with pytest.raises(RuntimeNotAvailableError, match="agentnest kubernetes setup") as info:
        KubeApi(rest, "nowhere").create(sandbox_pod())
    assert info.value.reason == "namespace"


def test_the_deadline_may_only_shrink(api: KubeApi) -> None:
    sent = sandbox_pod()
    name = sent["metadata"]["name"]
    api.create(sent)
    old = sent["spec"]["activeDeadlineSeconds"]
    assert (
        api.patch("Pod", name, {"spec": {"activeDeadlineSeconds": old - 10}})["spec"]["activeDeadlineSeconds"]
        == old - 10
    )
    with pytest.raises(ConfigurationError, match="must be less than or equal to previous value"):
        api.patch("Pod", name, {"spec": {"activeDeadlineSeconds": old + 100}})
    annotated = api.patch("Pod", name, {"metadata": {"annotations": {manifests.DEADLINE: "123"}}})
    assert annotated["metadata"]["annotations"][manifests.DEADLINE] == "123"


def test_deleting_the_pod_collects_what_it_owns(api: KubeApi, cluster: ClusterState) -> None:
    stored = api.create(sandbox_pod())
    name, uid = stored["metadata"]["name"], stored["metadata"]["uid"]
    api.create(
        manifests.owned_by(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}, "stringData": {"a": "b"}},
            name,
            uid,
        )
    )
    api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unowned"}})
    assert api.delete("Pod", name) is True
    assert api.get("Secret", "s1") is None and api.get("Secret", "unowned") is not None
    assert api.delete("Pod", name) is False  # idempotent: gone already


def test_a_pod_whose_image_cannot_be_pulled_fails_fast(api: KubeApi) -> None:
    sent = sandbox_pod()
    sent["spec"]["containers"][0]["image"] = "missing:1"
    api.create(sent)
    started = time.monotonic()
    with pytest.raises(ImageNotFoundError, match="missing:1"):
        api.wait_running(sent["metadata"]["name"], 60)
    assert time.monotonic() - started < 10


class Unschedulable(Node):
    def start(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        cluster.add_event(
            meta["namespace"],
            meta["name"],
            "Warning",
            "FailedScheduling",
            "0/3 nodes are available: 3 Insufficient memory.",
        )


def test_an_unschedulable_pod_reports_the_schedulers_reason_at_the_timeout(
    api: KubeApi, cluster: ClusterState
) -> None:
    cluster.node = Unschedulable()
    sent = sandbox_pod()
    api.create(sent)
    started = time.monotonic()
    with pytest.raises(BackendError, match="Insufficient memory") as info:
        api.wait_running(sent["metadata"]["name"], 1.5)
    assert info.value.reason == "capacity"
    assert 1.4 < time.monotonic() - started < 8


def test_a_pod_deleted_while_starting_is_a_destroyed_sandbox(api: KubeApi, cluster: ClusterState) -> None:
    cluster.node = Node()  # never runs it
    sent = sandbox_pod()
    name = sent["metadata"]["name"]
    api.create(sent)
    cluster.remove("pods", NS, name)
    with pytest.raises(SandboxDestroyedError):
        api.wait_running(name, 5)


def test_an_apiserver_out_of_reach_is_runtime_not_available_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rest = KubeRest(KubeConnection(host=f"http://127.0.0.1:{port}"), timeout=2)
    with pytest.raises(RuntimeNotAvailableError, match=f"127.0.0.1:{port}.*kubectl cluster-info"):
        KubeApi(rest, NS).get("Pod", "x")


def test_a_wrong_token_is_an_auth_error(server: FakeKubeAPI) -> None:
    config = load(server.write_kubeconfig()).configuration
    config.api_key["BearerToken"] = "Bearer wrong"
    config.refresh_api_key_hook = None  # it would read the kubeconfig's token again
    rest = KubeRest(from_kube_config(config))
    with pytest.raises(RuntimeNotAvailableError, match="kubectl auth whoami") as info:
        KubeApi(rest, NS).get("Pod", "x")
    assert info.value.reason == "auth"


# -- the backend's control plane ----------------------------------------------------------


@pytest.fixture
def backend(server: FakeKubeAPI) -> Iterator[KubernetesBackend]:
    b = KubernetesBackend(
        KubernetesSpec(namespace=NS, kubeconfig=str(server.write_kubeconfig())), start_timeout=10
    )
    yield b
    b.close()


def test_create_writes_the_policy_and_secret_before_the_pod_owned_by_it(
    backend: KubernetesBackend, cluster: ClusterState
) -> None:
    config = SandboxConfig(image="agentnest/base:1", environment={"TOKEN": Secret("s3cret"), "PLAIN": "1"})
    handle = backend.create(config)
    writes = [path.rsplit("/", 1)[-1] for method, path in cluster.calls if method == "POST"]
    assert writes == ["networkpolicies", "secrets", "pods"]
    pod = cluster.get("pods", NS, handle.info["pod"])
    assert pod is not None
    uid = pod["metadata"]["uid"]
    for plural in ("networkpolicies", "secrets"):
        (obj,) = cluster.list(plural, NS)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert "value" not in env["TOKEN"] and env["TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
    assert "s3cret" not in str(pod)
    assert backend.is_running(handle)
    backend.destroy(handle)
    backend.destroy(handle)  # idempotent
    assert (
        cluster.list("pods", NS) == []
        and cluster.list("secrets", NS) == []
        and cluster.list("networkpolicies", NS) == []
    )


class DropsHostUsers(ClusterState):
    """A cluster whose UserNamespacesSupport gate is off: the apiserver drops hostUsers without a word."""

    def create(
        self, resource: Any, namespace: str | None, body: dict[str, Any], strict: bool
    ) -> dict[str, Any]:
        body = copy.deepcopy(body)
        body.get("spec", {}).pop("hostUsers", None)
        return super().create(resource, namespace, body, strict)


def test_a_silently_dropped_hardening_field_is_refused_and_nothing_is_left() -> None:
    state = DropsHostUsers()
    state.add_namespace(NS)
    state.add_runtime_class("gvisor", "runsc")
    with FakeKubeAPI(cluster=state) as fake:
        backend = KubernetesBackend(KubernetesSpec(namespace=NS, kubeconfig=str(fake.write_kubeconfig())))
        with pytest.raises(BackendError, match=r"spec\.hostUsers.*host_users=True"):
            backend.create(SandboxConfig(image="agentnest/base:1"))
        assert state.list("pods", NS) == [] and state.list("networkpolicies", NS) == []
        backend.close()


def test_a_failed_start_leaves_nothing_behind(backend: KubernetesBackend, cluster: ClusterState) -> None:
    with pytest.raises(ImageNotFoundError):
        backend.create(SandboxConfig(image="missing:1", environment={"K": Secret("v")}))
    assert (
        cluster.list("pods", NS) == []
        and cluster.list("secrets", NS) == []
        and cluster.list("networkpolicies", NS) == []
    )


def test_an_open_network_is_refused_before_anything_is_created(
    backend: KubernetesBackend, cluster: ClusterState
) -> None:
    with pytest.raises(UnsupportedCapabilityError, match=r"no open network.*allowlist"):
        backend.create(SandboxConfig(image="agentnest/base:1", network=NetworkPolicy.open()))
    assert cluster.list("pods", NS) == [] and cluster.list("networkpolicies", NS) == []


class _NoAddressNode(NullNode):
    """A node whose network plugin never gives pods an address."""

    def start(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        cluster.set_pod_status(ns, name, phase="Running", running=True)


def test_a_proxy_pod_without_an_address_fails_the_create_and_leaves_nothing(
    server: FakeKubeAPI, cluster: ClusterState
) -> None:
    cluster.node = _NoAddressNode()
    backend = KubernetesBackend(
        KubernetesSpec(namespace=NS, kubeconfig=str(server.write_kubeconfig()), runtime_class_name=None)
    )
    try:
        with pytest.raises(BackendError, match=r"egress proxy pod .* no usable address \(status.podIP=''\)"):
            backend.create(
                SandboxConfig(image="agentnest/base:1", network=NetworkPolicy.allowlist(["example.com"]))
            )
    finally:
        backend.close()
    assert cluster.list("pods", NS) == [] and cluster.list("networkpolicies", NS) == []


def test_a_proxy_that_never_listens_fails_the_create_with_its_pod_named(
    backend: KubernetesBackend, cluster: ClusterState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NullNode's pods get addresses but run nothing: the proxy never logs that it listens."""
    from agentnest.runtime.kubernetes import backend as backend_module

    monkeypatch.setattr(backend_module, "PROXY_READY_TIMEOUT", 0.5)
    config = SandboxConfig(image="agentnest/base:1", network=NetworkPolicy.allowlist(["example.com"]))
    with pytest.raises(BackendError, match=r"egress proxy pod agentnest-\w+-egress (did not listen|stopped)"):
        backend.create(config)
    wait_until(lambda: cluster.list("pods", NS) == [], "the pods to go", 10)
    assert cluster.list("networkpolicies", NS) == []


def test_zero_three_zero_keywords_are_accepted(tmp_path: Any) -> None:
    b = KubernetesBackend(namespace="team-a", context="prod", runtime_class_name=None)
    assert b.spec.namespace == "team-a" and b.spec.context == "prod" and b.spec.runtime_class_name is None
    assert b.oci_runtime is None
    assert KubernetesBackend().oci_runtime == "runsc"


# -- the runtime the policy sees ----------------------------------------------------------


@pytest.mark.parametrize(
    ("class_name", "handler", "runtime"),
    [
        ("sandboxed", "runsc", "runsc"),  # any name: the handler decides
        ("gvisor", "runc", "runc"),  # a name is no proof
        ("kata-fc", "kata-fc", "kata-runtime"),
        ("missing", None, None),  # no such class: nothing to name
    ],
)
def test_the_oci_runtime_is_the_runtime_class_s_handler(
    server: FakeKubeAPI, cluster: ClusterState, class_name: str, handler: str | None, runtime: str | None
) -> None:
    if handler is not None:
        cluster.add_runtime_class(class_name, handler)
    b = KubernetesBackend(
        KubernetesSpec(namespace=NS, kubeconfig=str(server.write_kubeconfig()), runtime_class_name=class_name)
    )
    try:
        assert b.oci_runtime == runtime
        policy = SecurityPolicy(required_runtime="runsc")
        assert (policy.check_runtime(b.oci_runtime) is None) is (runtime == "runsc")
    finally:
        b.close()


def test_without_the_right_to_read_runtime_classes_the_name_stands_in(
    server: FakeKubeAPI, cluster: ClusterState
) -> None:
    cluster.add_runtime_class("gvisor", "runc")  # unreadable, so not seen
    cluster.denied.add(("get", "runtimeclasses"))
    b = KubernetesBackend(KubernetesSpec(namespace=NS, kubeconfig=str(server.write_kubeconfig())))
    try:
        assert b.oci_runtime == "runsc"  # "gvisor", by its name
    finally:
        b.close()
