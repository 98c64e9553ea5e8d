"""The Kubernetes manifests: golden files, schema validation for 1.29-1.37, and the hardening.

Golden files live in ``tests/unit/golden/k8s/``.  After an intended change,
regenerate them and review the diff::

    AGENTNEST_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_k8s_manifests.py

The agent's and the proxy's sources travel in the pods' argv (tens of KiB of
base64); the golden scenarios pass short stand-ins so the files stay
readable, and separate tests check the real commands.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from agentnest.config import MiB, ResourceLimits, SandboxConfig
from agentnest.egress.rules import Rules
from agentnest.egress.serve import limits_from_config
from agentnest.errors import ConfigurationError
from agentnest.policy import NetworkPolicy
from agentnest.runtime.bootstrap import PODINFO_DEADLINE
from agentnest.runtime.kubernetes import KubernetesSpec
from agentnest.runtime.kubernetes import manifests as m
from agentnest.runtime.kubernetes.lint import lint
from agentnest.secrets import Secret

GOLDEN = Path(__file__).parent / "golden" / "k8s"
UPDATE = os.environ.get("AGENTNEST_UPDATE_GOLDEN") == "1"
NOW = 1_800_000_000.0
SANDBOX = "0123456789ab"
COMMAND = ["python3", "-S", "-c", "<bootstrap>", "listen", "300.000", m.AGENT_SOCKET, "<agent sources>"]
PROXY_COMMAND = ["python3", "-S", "-c", "<proxy loader>", "<proxy sources>", "<proxy config>"]
#: Every minor the backend supports (kubernetes-validate takes "1.29"; it ships 1.25-1.37).
VERSIONS = [f"1.{minor}" for minor in range(29, 38)]
TOKEN = "s3cret-token-value"


def _denied() -> tuple[SandboxConfig, KubernetesSpec]:
    return SandboxConfig(image="python:3.12-slim"), KubernetesSpec()


def _allowlist() -> tuple[SandboxConfig, KubernetesSpec]:
    config = SandboxConfig(
        image="python:3.12-slim@sha256:" + "a" * 64,
        environment={"MODE": "ci", "API_TOKEN": Secret(TOKEN), "KEY": Secret("file-secret", as_file=True)},
        network=NetworkPolicy.allowlist(["pypi.org", "*.pythonhosted.org"], cidrs=["10.1.0.0/16"]),
        labels={"example.com/team": "ml"},
    )
    spec = KubernetesSpec(
        namespace="sandboxes",
        image_pull_secrets=("regcred",),
        node_selector={"sandbox.gke.io/runtime": "gvisor"},
        tolerations=(
            {"key": "sandbox.gke.io/runtime", "operator": "Equal", "value": "gvisor", "effect": "NoSchedule"},
        ),
        priority_class_name="agentnest-claimed",
    )
    return config, spec


def _disk() -> tuple[SandboxConfig, KubernetesSpec]:
    config = SandboxConfig(
        image="python:3.12-slim",
        lifetime=3600.5,
        limits=ResourceLimits.build(memory="2g", cpus=1.5, workspace="10g", workspace_medium="disk"),
        user="1000:1000",
    )
    spec = KubernetesSpec(
        workspace_storage_class="fast-ssd", seccomp="Localhost:agentnest.json", runtime_class_name=None
    )
    return config, spec


def _gpu() -> tuple[SandboxConfig, KubernetesSpec]:
    config = SandboxConfig(image="example/cuda:12.4.1-base-ubuntu22.04", limits=ResourceLimits(gpus=2))
    return config, KubernetesSpec(gpu_runtime_class_name="gvisor-nvproxy")


SCENARIOS = {
    "denied": _denied,
    "allowlist-secret": _allowlist,
    "disk-storage-class": _disk,
    "gpu-runtime-class": _gpu,
}


def _render(name: str) -> list[dict[str, Any]]:
    config, spec = SCENARIOS[name]()
    return m.render(
        config,
        spec,
        SANDBOX,
        now=NOW,
        owner="alice@laptop:4242",
        tenant="Team A",
        command=COMMAND,
        proxy_command=PROXY_COMMAND,
        proxy_ip="10.0.0.7",
        secret_values=False,
    )


def _all_rendered() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in SCENARIOS:
        for obj in _render(name):
            yield f"{name}:{obj['kind']}:{obj['metadata']['name']}", obj
    for obj in m.setup_objects("agentnest"):
        yield f"setup:{obj['kind']}", obj


def _check_golden(name: str, objects: list[dict[str, Any]]) -> None:
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False), encoding="utf-8")
    assert path.exists(), f"{path} is missing; run with AGENTNEST_UPDATE_GOLDEN=1"
    assert list(yaml.safe_load_all(path.read_text(encoding="utf-8"))) == objects, (
        f"{path.name} differs; if intended, regenerate with AGENTNEST_UPDATE_GOLDEN=1 and review the diff"
    )


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_sandbox(name: str) -> None:
    _check_golden(name, _render(name))


def test_golden_namespace_setup() -> None:
    _check_golden("namespace-setup", m.setup_objects("agentnest", subject_name="agentnest-manager"))


# -- schema validation ------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast_schemas() -> Iterator[None]:
    # kubernetes_validate re-reads and parses its 1.4 MB definitions file on
    # every call; caching the parsed schemas makes 9 versions x ~20 objects
    # take well under a second.  The schemas are never mutated by validation.
    original = kubernetes_validate.utils.schema_contents
    kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        kubernetes_validate.utils.schema_contents = original


RENDERED = list(_all_rendered())


@pytest.mark.usefixtures("fast_schemas")
@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_strictly(version: str) -> None:
    failures = []
    for where, obj in RENDERED:
        try:
            # It answers with the schema version it used: exactly the one asked for.
            assert kubernetes_validate.validate(obj, version, strict=True) == version
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{where}: {exc.message}")
    assert not failures


@pytest.mark.usefixtures("fast_schemas")
def test_strict_validation_would_catch_a_typo() -> None:
    obj = dict(RENDERED[0][1])
    obj["spec"] = {**obj["spec"], "podSelectr": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, VERSIONS[0], strict=True)


@pytest.mark.parametrize(("where", "obj"), RENDERED, ids=[w for w, _ in RENDERED])
def test_every_object_lints_clean(where: str, obj: dict[str, Any]) -> None:
    assert lint(obj, secrets=[TOKEN, "file-secret"]) == []


# -- the pod ------------------------------------------------------------------------


def _pod(objects: list[dict[str, Any]], role: str = "sandbox") -> dict[str, Any]:
    (pod,) = [o for o in objects if o["kind"] == "Pod" and o["metadata"]["labels"][m.ROLE] == role]
    return pod


def test_pod_hardening() -> None:
    pod = _pod(_render("denied"))
    spec = pod["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (c,) = spec["containers"]
    assert c["name"] == "sandbox" and c["command"] == COMMAND
    assert c["stdin"] is False and c["tty"] is False
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
    }
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["hostUsers"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 300 + m.DEADLINE_GRACE
    assert spec["terminationGracePeriodSeconds"] <= 5
    assert spec["runtimeClassName"] == "gvisor"
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert c["resources"]["limits"]["memory"] == "512Mi"
    assert c["resources"]["limits"]["cpu"] == "1"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["workspace"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Mi"}
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}
    assert volumes["run"]["emptyDir"]["medium"] == "Memory"
    mounts = {v["mountPath"]: v["name"] for v in c["volumeMounts"]}
    assert mounts == {
        "/workspace": "workspace",
        "/tmp": "tmp",
        "/run/agentnest": "run",
        "/dev/shm": "shm",
        "/etc/agentnest/podinfo": "podinfo",
    }
    # The deadline reaches the keeper only through the kubelet: read-only, from the annotation.
    (podinfo,) = [m for m in c["volumeMounts"] if m["name"] == "podinfo"]
    assert podinfo["readOnly"] is True
    assert volumes["podinfo"]["downwardAPI"]["items"] == [
        {"path": "deadline", "fieldRef": {"fieldPath": f"metadata.annotations['{m.DEADLINE}']"}}
    ]
    assert "hostAliases" not in spec  # only allowlisted sandboxes reach a proxy


def test_labels_and_annotations() -> None:
    pod = _pod(_render("allowlist-secret"))
    labels = pod["metadata"]["labels"]
    assert labels[m.MANAGED_BY] == "agentnest"
    assert labels[m.APP_NAME] == "agentnest-sandbox"
    assert labels[m.SANDBOX_ID] == SANDBOX
    assert labels[m.OWNER] == "alice-laptop-4242"  # sanitised to the label-value grammar
    assert labels[m.TENANT] == "Team-A"
    assert labels["example.com/team"] == "ml"
    annotations = pod["metadata"]["annotations"]
    assert annotations[m.DEADLINE] == str(int(NOW) + 300)
    assert annotations[m.SAFE_TO_EVICT] == "false"


def test_options_off() -> None:
    config, _ = _denied()
    spec = KubernetesSpec(runtime_class_name=None, host_users=True, image_pull_policy="Always")
    pod = m.pod(config, spec, SANDBOX, COMMAND, now=NOW)
    assert "runtimeClassName" not in pod["spec"]
    assert "hostUsers" not in pod["spec"]
    assert pod["spec"]["containers"][0]["imagePullPolicy"] == "Always"


def test_lifetime_rounds_up() -> None:
    pod = _pod(_render("disk-storage-class"))
    assert pod["spec"]["activeDeadlineSeconds"] == math.ceil(3600.5) + m.DEADLINE_GRACE
    assert pod["metadata"]["annotations"][m.DEADLINE] == str(math.ceil(NOW + 3600.5))


def test_disk_workspace_with_storage_class() -> None:
    pod = _pod(_render("disk-storage-class"))
    spec = pod["spec"]
    (workspace,) = [v for v in spec["volumes"] if v["name"] == "workspace"]
    claim = workspace["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "fast-ssd"
    assert claim["resources"]["requests"]["storage"] == "10Gi"
    assert spec["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "agentnest.json",
    }
    assert spec["securityContext"]["runAsUser"] == 1000 and spec["securityContext"]["fsGroup"] == 1000
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "2Gi", "cpu": "1500m", "ephemeral-storage": "128Mi"}


def test_disk_workspace_without_storage_class_is_bounded_by_ephemeral_storage() -> None:
    config = SandboxConfig(image="x", limits=ResourceLimits.build(workspace="1g", workspace_medium="disk"))
    pod = m.pod(config, KubernetesSpec(), SANDBOX, COMMAND, now=NOW)
    (workspace,) = [v for v in pod["spec"]["volumes"] if v["name"] == "workspace"]
    assert workspace["emptyDir"] == {"sizeLimit": "1Gi"}
    assert pod["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "1152Mi"


def test_gpus() -> None:
    config = SandboxConfig(image="x", limits=ResourceLimits(gpus=2))
    pod = m.pod(config, KubernetesSpec(), SANDBOX, COMMAND, now=NOW)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "2"
    assert pod["spec"]["runtimeClassName"] == "gvisor"  # no GPU class configured: the usual one


def test_gpu_pods_run_in_the_gpu_runtime_class_others_do_not() -> None:
    spec = KubernetesSpec(gpu_runtime_class_name="gvisor-nvproxy")
    gpu = m.pod(SandboxConfig(image="x", limits=ResourceLimits(gpus=1)), spec, SANDBOX, COMMAND, now=NOW)
    plain = m.pod(SandboxConfig(image="x"), spec, SANDBOX, COMMAND, now=NOW)
    assert gpu["spec"]["runtimeClassName"] == "gvisor-nvproxy"
    assert gpu["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert plain["spec"]["runtimeClassName"] == "gvisor"
    assert "nvidia.com/gpu" not in plain["spec"]["containers"][0]["resources"]["limits"]
    # The proxy pod of an allowlisted GPU sandbox keeps its own class.
    allowlisted = SandboxConfig(
        image="x", limits=ResourceLimits(gpus=1), network=NetworkPolicy.allowlist(["example.com"])
    )
    pods = [o for o in m.render(allowlisted, spec, SANDBOX, now=NOW) if o["kind"] == "Pod"]
    assert sorted(str(p["spec"].get("runtimeClassName")) for p in pods) == ["None", "gvisor-nvproxy"]


@pytest.mark.parametrize("bad", ["GPU", "nvidia_gpu", "", "-x"])
def test_a_bad_gpu_runtime_class_name_is_refused(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="gpu_runtime_class_name"):
        KubernetesSpec(gpu_runtime_class_name=bad)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (512 * MiB, "512Mi"),
        (2 * 1024 * MiB, "2Gi"),
        (3 * 1024, "3Ki"),
        (1000, "1000"),
        (MiB + 1024, "1025Ki"),
    ],
)
def test_memory_quantity(n: int, text: str) -> None:
    assert m.memory_quantity(n) == text


@pytest.mark.parametrize(
    ("cores", "text"), [(1.0, "1"), (2, "2"), (0.5, "500m"), (1.25, "1250m"), (0.01, "10m")]
)
def test_cpu_quantity(cores: float, text: str) -> None:
    assert m.cpu_quantity(cores) == text


def test_default_command_is_the_listening_agent() -> None:
    config, spec = _denied()
    objects = m.render(config, spec, SANDBOX, now=NOW)
    command = _pod(objects)["spec"]["containers"][0]["command"]
    assert command[:2] == ["python3", "-S"]
    assert command[4:7] == ["listen", "300.000", "/run/agentnest/agent.sock"]


# -- secrets --------------------------------------------------------------------------


def test_secrets_only_by_reference() -> None:
    config, spec = _allowlist()
    objects = m.render(config, spec, SANDBOX, now=NOW, command=COMMAND, proxy_command=PROXY_COMMAND)
    pod = _pod(objects)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["API_TOKEN"] == {
        "name": "API_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": f"agentnest-{SANDBOX}-env", "key": "API_TOKEN"}},
    }
    assert env["MODE"] == {"name": "MODE", "value": "ci"}
    # as_file: only the path; the value goes over the agent channel, as on every backend.
    assert env["KEY_FILE"]["value"].endswith("/KEY")
    assert TOKEN not in json.dumps(pod) and "file-secret" not in json.dumps(pod)
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert secret["stringData"] == {"API_TOKEN": TOKEN}
    assert secret["immutable"] is True
    assert objects.index(secret) < objects.index(pod)


def test_secret_without_values() -> None:
    config, spec = _allowlist()
    secret = m.secret(config, spec, SANDBOX, values=False)
    assert secret is not None
    assert secret["stringData"] == {"API_TOKEN": m.REDACTED}
    assert TOKEN not in json.dumps(_render("allowlist-secret"))


def test_no_secret_object_without_secrets() -> None:
    assert [o["kind"] for o in _render("denied")] == ["NetworkPolicy", "Pod"]


def test_owned_by() -> None:
    config, spec = _allowlist()
    secret = m.secret(config, spec, SANDBOX)
    assert secret is not None
    owned = m.owned_by(secret, "agentnest-x", "uid-1")
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "agentnest-x", "uid": "uid-1"}
    ]
    assert "ownerReferences" not in secret["metadata"]  # a copy, the original untouched
    assert owned["metadata"]["name"] == secret["metadata"]["name"]


# -- network --------------------------------------------------------------------------


def test_denied_policy_selects_the_sandbox_and_has_no_rules() -> None:
    policy, pod = _render("denied")
    assert policy["kind"] == "NetworkPolicy"
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert all(pod["metadata"]["labels"][k] == v for k, v in selector.items())


def test_open_has_no_policy() -> None:
    config = SandboxConfig(image="x", network=NetworkPolicy.open())
    objects = m.render(config, KubernetesSpec(), SANDBOX, now=NOW, command=COMMAND)
    assert [o["kind"] for o in objects] == ["Pod"]
    env = {e["name"] for e in objects[0]["spec"]["containers"][0]["env"]}
    assert "HTTP_PROXY" not in env


def test_allowlist_objects_and_order() -> None:
    objects = _render("allowlist-secret")
    kinds = [(o["kind"], o["metadata"]["labels"][m.ROLE]) for o in objects]
    assert kinds == [
        ("NetworkPolicy", "egress-proxy"),
        ("Pod", "egress-proxy"),
        ("NetworkPolicy", "sandbox"),
        ("Secret", "sandbox"),
        ("Pod", "sandbox"),
    ]
    sandbox_policy = objects[2]["spec"]
    (rule,) = sandbox_policy["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 3128}]
    (peer,) = rule["to"]
    proxy = _pod(objects, "egress-proxy")
    assert all(proxy["metadata"]["labels"][k] == v for k, v in peer["podSelector"]["matchLabels"].items())
    assert "ingress" not in sandbox_policy
    pod = _pod(objects)
    assert pod["spec"]["hostAliases"] == [{"ip": "10.0.0.7", "hostnames": [m.PROXY_HOST]}]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["HTTPS_PROXY"] == f"http://{m.PROXY_HOST}:3128"


def test_proxy_policy() -> None:
    policy = _render("allowlist-secret")[0]["spec"]
    (ingress,) = policy["ingress"]
    assert ingress["from"][0]["podSelector"]["matchLabels"][m.ROLE] == "sandbox"
    internet, dns = policy["egress"]
    v4, v6, extra = internet["to"]
    assert v4["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert set(v4["ipBlock"]["except"]) == {
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "127.0.0.0/8",
    }
    assert v6["ipBlock"] == {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "::1/128"]}
    assert extra == {"ipBlock": {"cidr": "10.1.0.0/16"}}  # the policy's own cidrs
    assert internet["ports"] == [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}]
    assert {p["port"] for p in dns["ports"]} == {53}


def test_proxy_pod_is_hardened_and_runs_our_proxy() -> None:
    config, spec = _allowlist()
    objects = m.render(config, spec, SANDBOX, now=NOW, command=COMMAND)
    proxy = _pod(objects, "egress-proxy")
    (c,) = proxy["spec"]["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert proxy["spec"]["securityContext"]["runAsNonRoot"] is True
    assert proxy["spec"]["automountServiceAccountToken"] is False
    # The last argument is the JSON config our proxy's main() takes; it must parse there.
    proxy_config = json.loads(c["command"][-1])
    assert proxy_config["listen"] == ["0.0.0.0", 3128]
    assert proxy_config["domains"] == ["pypi.org", "*.pythonhosted.org"]
    assert proxy_config["deadline"] == math.ceil(NOW + 300)
    # extend(): the proxy reads the kubelet's copy of its annotation (a link) again at its deadline.
    assert (proxy_config["deadline_file"], proxy_config["deadline_follow"]) == (PODINFO_DEADLINE, True)
    mounts = {v["mountPath"]: v["name"] for v in c["volumeMounts"]}
    assert mounts[str(PurePosixPath(PODINFO_DEADLINE).parent)] == "podinfo"
    Rules.from_config(proxy_config)
    limits_from_config(proxy_config)
    assert c["command"][:4] == ["python3", "-S", "-c", c["command"][3]]
    assert lint(proxy) == []


def test_egress_hosts_reach_the_proxy_and_bad_ones_are_refused_early() -> None:
    config, spec = _allowlist()
    spec = dataclasses.replace(spec, egress_hosts={"pypi.org": "10.1.2.3"})
    proxy = _pod(m.render(config, spec, SANDBOX, now=NOW, command=COMMAND), "egress-proxy")
    assert json.loads(proxy["spec"]["containers"][0]["command"][-1])["hosts"] == {"pypi.org": "10.1.2.3"}
    with pytest.raises(ConfigurationError, match="egress_hosts"):
        KubernetesSpec(egress_hosts={"pypi.org": "not-an-address"})


def test_proxy_image_prefers_the_policy() -> None:
    config = SandboxConfig(image="x", network=NetworkPolicy.allowlist(["a.org"]), proxy_image="proxy:1")
    spec = KubernetesSpec(proxy_image="spec-proxy:1")
    assert (
        m.proxy_pod(config, spec, SANDBOX, PROXY_COMMAND, now=NOW)["spec"]["containers"][0]["image"]
        == "proxy:1"
    )
    plain = SandboxConfig(image="x", network=NetworkPolicy.allowlist(["a.org"]))
    assert (
        m.proxy_pod(plain, spec, SANDBOX, PROXY_COMMAND, now=NOW)["spec"]["containers"][0]["image"]
        == "spec-proxy:1"
    )


# -- refusals -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "needle"),
    [
        ({"agentnest.io/sandbox-id": "x"}, "reserved"),
        ({"app.kubernetes.io/name": "x"}, "reserved"),
        ({"node.kubernetes.io/x": "x"}, "reserved"),
        ({"team": "a b"}, "label team='a b'"),
        ({"bad key!": "x"}, "label key 'bad key!'"),
        ({"team": "x" * 64}, "label team="),
    ],
)
def test_bad_user_labels(labels: dict[str, str], needle: str) -> None:
    config = SandboxConfig(image="x", labels=labels)
    with pytest.raises(ConfigurationError, match="labels") as info:
        m.pod(config, KubernetesSpec(), SANDBOX, COMMAND, now=NOW)
    assert needle in str(info.value)


@pytest.mark.parametrize("sandbox_id", ["", "UPPER", "a_b", "a.b", "-a", "x" * 41])
def test_bad_sandbox_ids(sandbox_id: str) -> None:
    with pytest.raises(ConfigurationError, match="sandbox id"):
        m.pod_name(sandbox_id)


def test_custom_seccomp_json_is_refused() -> None:
    config = SandboxConfig(image="x", seccomp_profile='{"defaultAction": "SCMP_ACT_ERRNO"}')
    with pytest.raises(ConfigurationError, match="Localhost:<path>"):
        m.pod(config, KubernetesSpec(), SANDBOX, COMMAND, now=NOW)


# -- namespace setup ------------------------------------------------------------------


def test_setup_objects() -> None:
    ns, quota, limits, role, binding = m.setup_objects(
        "tenant-a", subject_kind="User", subject_name="alice", pods=10, pod_security_version="v1.33"
    )
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce-version"] == "v1.33"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "restricted"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/audit"] == "restricted"
    assert quota["spec"]["hard"]["pods"] == "10"
    assert limits["spec"]["limits"][0]["default"] == limits["spec"]["limits"][0]["defaultRequest"]
    rules = {r["resources"][0]: set(r["verbs"]) for r in role["rules"]}
    assert rules["pods"] == {"create", "get", "list", "watch", "patch", "delete"}
    assert rules["pods/exec"] == {"create", "get"}
    assert rules["secrets"] == {"create", "get", "list", "patch", "delete"}
    assert rules["networkpolicies"] == {"create", "get", "list", "patch", "delete"}
    assert rules["events"] == {"list", "watch"}
    assert binding["subjects"] == [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    sa = m.role_binding("tenant-a", "ServiceAccount", "agentnest")
    assert sa["subjects"] == [{"kind": "ServiceAccount", "name": "agentnest", "namespace": "tenant-a"}]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"subject_kind": "Robot"}, "subject kind"), ({"subject_name": ""}, "subject name")],
)
def test_setup_refusals(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        m.setup_objects("agentnest", **kwargs)
    with pytest.raises(ConfigurationError, match="namespace"):
        m.setup_objects("Bad_NS")


def test_max_lifetime_sets_the_hard_stop_extend_may_reach() -> None:
    config = SandboxConfig(image="agentnest/base:1", lifetime=60)
    assert m.hard_stop_seconds(config, KubernetesSpec()) == 60 + m.DEADLINE_GRACE
    assert m.hard_stop_seconds(config, KubernetesSpec(max_lifetime=3600)) == 3600 + m.DEADLINE_GRACE
    # Never below the lifetime itself.
    assert m.hard_stop_seconds(config, KubernetesSpec(max_lifetime=10)) == 60 + m.DEADLINE_GRACE
    with pytest.raises(ConfigurationError, match="max_lifetime"):
        KubernetesSpec(max_lifetime=0)


def test_a_browser_sandbox_gets_a_larger_dev_shm_and_nothing_else_changes() -> None:
    config, spec = _denied()
    browser = dataclasses.replace(config, preset="browser")
    plain, shown = (
        _pod(m.render(c, spec, SANDBOX, now=NOW, owner="o", tenant="t", command=COMMAND, secret_values=False))
        for c in (config, browser)
    )
    volumes = {v["name"]: v for v in shown["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Mi"}
    plain_volumes = {v["name"]: v for v in plain["spec"]["volumes"]}
    assert plain_volumes["shm"]["emptyDir"]["sizeLimit"] == "64Mi"
    # Only /dev/shm differs; the security context, limits and mounts are the same.
    del volumes["shm"], plain_volumes["shm"]
    assert volumes == plain_volumes
    assert shown["spec"]["containers"] == plain["spec"]["containers"]
