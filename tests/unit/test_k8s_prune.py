"""``agentnest prune --kubernetes`` against the cluster double: what expired, ended or lost its pod goes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("aiohttp")

from doubles.kube.apiserver import FakeKubeAPI
from doubles.kube.cluster import ClusterState, NullNode

from agentnest.cli import main
from agentnest.config import SandboxConfig
from agentnest.runtime.kubernetes import KubernetesBackend, KubernetesSpec, manifests
from agentnest.secrets import Secret

NS = "agentnest"


@pytest.fixture(autouse=True)
def _no_in_pod_network_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # NullNode runs no container to exec the check in; the check itself runs
    # against real pods in tests/integration/test_k8s_backend.py.
    monkeypatch.setattr(KubernetesBackend, "_check_network", lambda self, pod: ([], None))


@pytest.fixture
def cluster() -> Iterator[tuple[ClusterState, str]]:
    state = ClusterState(node=NullNode())
    state.add_namespace(NS)
    state.add_namespace("other")
    state.add_runtime_class("gvisor", "runsc")
    with FakeKubeAPI(cluster=state) as api:
        yield state, str(api.write_kubeconfig())


def names(state: ClusterState, plural: str) -> set[str]:
    return {o["metadata"]["name"] for o in state.list(plural, NS)}


def test_prune_removes_what_expired_ended_or_lost_its_pod(
    cluster: tuple[ClusterState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, kubeconfig = cluster
    backend = KubernetesBackend(KubernetesSpec(namespace=NS, kubeconfig=kubeconfig), start_timeout=10)
    config = SandboxConfig(image="agentnest/base:1", environment={"K": Secret("v")})
    live, expired, ended = (backend.create(config) for _ in range(3))
    # Expired: its deadline annotation has passed (the process that held it died).
    pod = state.get("pods", NS, expired.info["pod"])
    assert pod is not None
    pod["metadata"]["annotations"][manifests.DEADLINE] = str(int(time.time()) - 10)
    state.put("pods", pod)
    # Ended: the kubelet stopped it at activeDeadlineSeconds.
    state.set_pod_status(NS, ended.info["pod"], phase="Failed", reason="DeadlineExceeded")
    # A create that died between its Secret and its Pod: nothing owns the Secret.
    state.put(
        "secrets",
        {
            "metadata": {
                "name": "stray",
                "namespace": NS,
                "labels": {manifests.MANAGED_BY: "agentnest", manifests.SANDBOX_ID: "dead0"},
            }
        },
    )
    # Not ours: never touched.
    state.put("secrets", {"metadata": {"name": "theirs", "namespace": NS}})

    before = {p: names(state, p) for p in ("pods", "secrets", "networkpolicies")}
    assert main(["prune", "--kubernetes", "--kubeconfig", kubeconfig, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing was removed" in out and "DeadlineExceeded" in out and "expired" in out
    assert {p: names(state, p) for p in before} == before

    assert main(["prune", "--kubernetes", "--kubeconfig", kubeconfig]) == 0
    assert names(state, "pods") == {live.info["pod"]}
    assert names(state, "secrets") == {f"{live.info['pod']}-env", "theirs"}
    assert names(state, "networkpolicies") == {live.info["pod"]}

    assert main(["prune", "--kubernetes", "--kubeconfig", kubeconfig, "--all"]) == 0
    assert names(state, "pods") == set() and names(state, "secrets") == {"theirs"}
    backend.close()


def test_prune_refuses_kubernetes_options_without_kubernetes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prune", "--namespace", "x"]) != 0
    assert "go with --kubernetes" in capsys.readouterr().err


def test_a_bad_namespace_is_refused(
    cluster: tuple[ClusterState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, kubeconfig = cluster
    assert main(["prune", "--kubernetes", "--kubeconfig", kubeconfig, "--namespace", "Bad_NS"]) != 0
    assert "'Bad_NS' is not a DNS label" in capsys.readouterr().err
    assert state.calls == []  # refused before any call


def dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    return int(proc.stdout)


def test_orphans_are_pods_whose_creating_process_on_this_host_exited(
    cluster: tuple[ClusterState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, kubeconfig = cluster
    backend = KubernetesBackend(KubernetesSpec(namespace=NS, kubeconfig=kubeconfig), start_timeout=10)
    config = SandboxConfig(image="agentnest/base:1", lifetime=3600)
    mine, crashed, elsewhere = (backend.create(config) for _ in range(3))
    pod = state.get("pods", NS, mine.info["pod"])
    assert pod is not None
    # The backend records its own process on the pod.
    assert pod["metadata"]["annotations"][manifests.OWNER_PROCESS] == f"{socket.gethostname()}:{os.getpid()}"
    for handle, owner in ((crashed, f"{socket.gethostname()}:{dead_pid()}"), (elsewhere, "other-host:1")):
        pod = state.get("pods", NS, handle.info["pod"])
        assert pod is not None
        pod["metadata"]["annotations"][manifests.OWNER_PROCESS] = owner
        state.put("pods", pod)
    # Without --orphans nothing goes: every deadline is an hour away.
    assert main(["prune", "--kubernetes", "--kubeconfig", kubeconfig]) == 0
    assert len(names(state, "pods")) == 3
    assert main(["prune", "--kubernetes", "--kubeconfig", kubeconfig, "--orphans"]) == 0
    assert "owner gone" in capsys.readouterr().out
    # Only the pod whose owner is known dead; another host's is not ours to judge.
    assert names(state, "pods") == {mine.info["pod"], elsewhere.info["pod"]}
    backend.close()


def test_reclaim_deletes_the_pods_of_manager_servers_that_stopped_answering(
    cluster: tuple[ClusterState, str],
) -> None:
    """The manager's leader hands the backend the owners (``host:pid``) of servers silent past
    --server-timeout: their Pods go with their Secrets, even on another host; a live one's stay."""
    state, kubeconfig = cluster
    backend = KubernetesBackend(KubernetesSpec(namespace=NS, kubeconfig=kubeconfig), start_timeout=10)
    config = SandboxConfig(image="agentnest/base:1", lifetime=3600, environment={"K": Secret("v")})
    mine, silent, kept = (backend.create(config) for _ in range(3))
    me = f"{socket.gethostname()}:{os.getpid()}"
    for handle, owner in ((silent, "manager-0:7"), (kept, "manager-1:7")):
        pod = state.get("pods", NS, handle.info["pod"])
        assert pod is not None
        pod["metadata"]["annotations"][manifests.OWNER_PROCESS] = owner
        state.put("pods", pod)
    secrets = len(names(state, "secrets"))
    assert backend.reclaim([]) == 0
    # This process is alive: named or not, its Pods stay.
    assert backend.reclaim(["manager-0:7", me]) == 1
    assert names(state, "pods") == {mine.info["pod"], kept.info["pod"]}
    assert len(names(state, "secrets")) == secrets - 1  # its Secret went with it
    assert backend.reclaim(["manager-0:7"]) == 0  # idempotent
    backend.close()


def test_prune_looks_in_every_namespace_setup_labelled(
    cluster: tuple[ClusterState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, kubeconfig = cluster
    state.add_namespace("team-a", {manifests.MANAGED_BY: "agentnest"})
    state.add_namespace("team-b", {manifests.MANAGED_BY: "agentnest"})
    config = SandboxConfig(image="agentnest/base:1")
    handles = {}
    for ns in ("team-a", "team-b", "other"):
        backend = KubernetesBackend(KubernetesSpec(namespace=ns, kubeconfig=kubeconfig), start_timeout=10)
        handles[ns] = backend.create(config)
        backend.close()
        state.set_pod_status(ns, handles[ns].info["pod"], phase="Succeeded")
    assert main(["prune", "--kubernetes", "--kubeconfig", kubeconfig]) == 0
    out = capsys.readouterr().out
    assert "team-a/" in out and "team-b/" in out
    assert state.list("pods", "team-a") == [] and state.list("pods", "team-b") == []
    # A namespace AgentNest did not set up is pruned only when named.
    assert len(state.list("pods", "other")) == 1
    # Without the right to list namespaces: a warning, and the default namespace.
    state.denied.add(("list", "namespaces"))
    assert main(["prune", "--kubernetes", "--kubeconfig", kubeconfig]) == 0
    assert "cannot list namespaces" in capsys.readouterr().err
