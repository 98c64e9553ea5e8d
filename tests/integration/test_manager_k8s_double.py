"""The manager (``agentnest serve``'s app) on the Kubernetes backend through the cluster double,
recording into SQLite and into a private PostgreSQL server.

The double's node runs each admitted Pod as a container of the local engine (runc), so the
sandboxes are real; the apiserver is the double (docs/kubernetes.md says what only a real
cluster shows).  What this checks: the capacity comes from the namespace's ResourceQuota, a
tenant's cap holds, every command is in the central history tagged with its tenant, usage is
counted, a destroyed sandbox's Pod is deleted, and a server that stops answering has its Pods
reclaimed through the backend the leader hands its owner to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("kubernetes")
pytest.importorskip("aiohttp")

from doubles.kube.apiserver import FakeKubeAPI
from doubles.kube.cluster import ClusterState
from doubles.kube.node import DockerNode

from agentnest.runtime.docker import base_image
from agentnest.runtime.kubernetes import KubernetesSpec, manifests
from agentnest.runtime.kubernetes.backend import KubernetesBackend
from agentnest.server.app import create_app
from agentnest.server.auth import Ceiling, TokenStore
from agentnest.server.settings import ServerSettings
from agentnest.server.tenants import Tenant
from agentnest.server.thread import serve_in_thread

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

NS = "agentnest"
GIB = 1 << 30


class Double:
    def __init__(self) -> None:
        self.node = DockerNode()
        self.state = ClusterState(node=self.node)
        self.state.add_namespace(NS, {"pod-security.kubernetes.io/enforce": "restricted"})
        # What the namespace may hold, as a ResourceQuota reports it (the double keeps no usage).
        hard = {"limits.memory": "1Gi", "limits.cpu": "4"}
        self.state.put(
            "resourcequotas",
            {
                "metadata": {"name": "sandboxes", "namespace": NS},
                "spec": {"hard": hard},
                "status": {"hard": hard, "used": {"limits.memory": "0", "limits.cpu": "0"}},
            },
        )
        self.api = FakeKubeAPI(cluster=self.state).start()
        self.kubeconfig = str(self.api.write_kubeconfig())

    def pods(self) -> list[dict[str, Any]]:
        return list(self.state.list("pods", NS))

    def close(self) -> None:
        try:
            self.api.stop()
        finally:
            self.node.close()


@pytest.fixture(scope="module")
def double() -> Iterator[Double]:
    d = Double()
    try:
        yield d
    finally:
        d.close()


def test_the_manager_on_kubernetes_admits_records_and_cleans_up(
    double: Double, database_url: str, tmp_path: Path
) -> None:
    spec = KubernetesSpec(namespace=NS, kubeconfig=double.kubeconfig, runtime_class_name=None)
    backend = KubernetesBackend(spec, start_timeout=60)
    store = TokenStore(tmp_path / "tokens.json")
    store.create_tenant(Tenant("team", max_sandboxes=2, rate=100.0, burst=100))
    _, secret = store.create("t", Ceiling(max_sandboxes=8, max_memory=GIB), tenant="team")
    _, admin = store.create("ops", Ceiling(), admin=True)
    settings = ServerSettings(
        tokens=store,
        backends={"kubernetes": backend},
        image=base_image(),
        database=database_url,
        work_dir=tmp_path / "work",
    )
    app = create_app(settings)
    service = app.state.service
    with (
        serve_in_thread(app) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=120) as http,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=60) as ops,
    ):
        made = http.post("/v1/sandboxes", json={"memory": "256m", "cpus": 1})
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        # The capacity is what the namespace's ResourceQuota leaves, read at the first create.
        assert service.admission.capacity.memory == GIB and service.admission.capacity.cpus == 4.0
        too_big = http.post("/v1/sandboxes", json={"memory": "1g", "cpus": 1, "max_wait": 0})
        assert too_big.status_code == 429 and too_big.json()["code"] == "capacity", too_big.text
        ran = http.post(f"/v1/sandboxes/{sid}/exec", json={"shell": "echo on-kubernetes"})
        assert ran.status_code == 200 and ran.json()["stdout"] == "on-kubernetes\n", ran.text
        second = http.post("/v1/sandboxes", json={"memory": "256m", "cpus": 1})
        assert second.status_code == 201, second.text
        refused = http.post("/v1/sandboxes", json={"memory": "128m", "cpus": 1, "max_wait": 0})
        assert refused.status_code == 429 and refused.json()["code"] == "tenant_cap", refused.text
        assert len(double.pods()) == 2

        events = ops.get("/v1/audit", params={"sandbox": sid, "limit": 1000}).json()["events"]
        finished = [e for e in events if e["type"] == "exec.finished"]
        assert finished and {e["tenant"] for e in events} == {"team"}, events
        for created in (sid, second.json()["id"]):
            assert http.delete(f"/v1/sandboxes/{created}").status_code == 200
        assert double.pods() == []
        usage = ops.get("/v1/usage").json()["usage"]
        team = next(u for u in usage if u["tenant"] == "team")
        assert team["creates"] == 2 and team["rejections"] >= 2 and team["sandbox_seconds"] > 0, usage

        # A server that stopped answering: its Pods go when the leader hands its owner to the
        # backend (the annotation is what a dead replica on another host would have left).
        orphan = http.post("/v1/sandboxes", json={"memory": "128m", "cpus": 1})
        assert orphan.status_code == 201, orphan.text
        (pod,) = double.pods()
        pod["metadata"]["annotations"][manifests.OWNER_PROCESS] = "manager-0:1"
        double.state.put("pods", pod)
        assert backend.reclaim(["manager-0:1"]) == 1
        assert double.pods() == []
