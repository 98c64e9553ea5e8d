"""``agentnest kubernetes setup NAMESPACE`` against the cluster double: create, rerun, update, refusals."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from doubles.kube.apiserver import FakeKubeAPI
from doubles.kube.cluster import ClusterState, NullNode

from agentnest.cli import main
from agentnest.runtime.kubernetes.manifests import MANAGED_BY

NS = "tenant-a"
KINDS = [
    ("namespaces", None),
    ("resourcequotas", NS),
    ("limitranges", NS),
    ("roles", NS),
    ("rolebindings", NS),
]


@pytest.fixture
def cluster() -> ClusterState:
    state = ClusterState(node=NullNode())
    state.add_runtime_class("gvisor", "runsc")
    return state


@pytest.fixture
def kubeconfig(cluster: ClusterState) -> Iterator[str]:
    with FakeKubeAPI(cluster=cluster) as fake:
        yield str(fake.write_kubeconfig())


def setup(capsys: pytest.CaptureFixture[str], kubeconfig: str, *extra: str) -> tuple[int, str, str]:
    code = main(["kubernetes", "setup", NS, "--kubeconfig", kubeconfig, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_setup_creates_the_namespace_and_its_objects(
    capsys: pytest.CaptureFixture[str], kubeconfig: str, cluster: ClusterState
) -> None:
    code, out, err = setup(capsys, kubeconfig, "--pods", "7")
    assert code == 0, err
    assert out.splitlines() == [
        f"created   Namespace {NS}",
        "created   ResourceQuota agentnest",
        "created   LimitRange agentnest",
        "created   Role agentnest",
        "created   RoleBinding agentnest",
        "RuntimeClass gvisor exists",
    ]
    ns = cluster.get("namespaces", None, NS)
    assert ns is not None
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns["metadata"]["labels"][MANAGED_BY] == "agentnest"
    quota = cluster.get("resourcequotas", NS, "agentnest")
    assert quota is not None and quota["spec"]["hard"]["pods"] == "7"
    binding = cluster.get("rolebindings", NS, "agentnest")
    assert binding is not None and binding["subjects"][0]["name"] == "agentnest"


def test_a_rerun_changes_nothing_and_other_flags_update_in_place(
    capsys: pytest.CaptureFixture[str], kubeconfig: str, cluster: ClusterState
) -> None:
    assert setup(capsys, kubeconfig)[0] == 0
    versions = {k: cluster.get(k, ns, NS if k == "namespaces" else "agentnest") for k, ns in KINDS}
    code, out, err = setup(capsys, kubeconfig)
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[:5]] == ["unchanged"] * 5
    for plural, ns in KINDS:
        now = cluster.get(plural, ns, NS if plural == "namespaces" else "agentnest")
        before = versions[plural]
        assert now is not None and before is not None
        assert now["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # Other flags: the quota and the binding's subject change, the rest stays.
    code, out, err = setup(capsys, kubeconfig, "--pods", "3", "--user", "alice")
    assert code == 0, err
    lines = out.splitlines()
    assert "updated   ResourceQuota agentnest" in lines and "updated   RoleBinding agentnest" in lines
    assert "unchanged Role agentnest" in lines
    quota = cluster.get("resourcequotas", NS, "agentnest")
    assert quota is not None and quota["spec"]["hard"]["pods"] == "3"
    binding = cluster.get("rolebindings", NS, "agentnest")
    assert binding is not None
    assert [s["name"] for s in binding["subjects"]] == ["alice"]


def test_a_missing_runtime_class_is_reported_and_fails(
    capsys: pytest.CaptureFixture[str], kubeconfig: str, cluster: ClusterState
) -> None:
    code, out, err = setup(capsys, kubeconfig, "--runtime-class", "kata")
    assert code == 1
    assert "RuntimeClass 'kata' does not exist" in err and "runtime_class_name=None" in err
    # The namespace was set up all the same: only sandboxes asking for kata would not start.
    assert cluster.get("namespaces", None, NS) is not None
    code, out, err = setup(capsys, kubeconfig, "--runtime-class", "none")
    assert code == 0, err
    assert "RuntimeClass" not in out


def test_a_changed_role_ref_is_refused_naming_the_fix(
    capsys: pytest.CaptureFixture[str], kubeconfig: str, cluster: ClusterState
) -> None:
    assert setup(capsys, kubeconfig)[0] == 0
    binding = cluster.get("rolebindings", NS, "agentnest")
    assert binding is not None
    binding["roleRef"] = {**binding["roleRef"], "name": "someone-else"}
    cluster.put("rolebindings", binding)
    code, _, err = setup(capsys, kubeconfig)
    assert code == 1
    assert "roleRef" in err and f"kubectl -n {NS} delete rolebinding agentnest" in err


def test_without_the_right_to_create_namespaces_the_error_says_so(
    capsys: pytest.CaptureFixture[str], kubeconfig: str, cluster: ClusterState
) -> None:
    cluster.denied.add(("create", "namespaces"))
    code, out, err = setup(capsys, kubeconfig)
    assert code == 1
    assert out == ""
    assert "forbidden" in err.lower() and "namespaces" in err
    assert cluster.list("resourcequotas", NS) == []
