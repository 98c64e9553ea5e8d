"""Our manifest checks: every rule fails on a mutated good object, with its own message."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from agentnest.config import SandboxConfig
from agentnest.errors import ConfigurationError
from agentnest.runtime.kubernetes import KubernetesSpec
from agentnest.runtime.kubernetes import manifests as m
from agentnest.runtime.kubernetes.lint import QUANTITY, check, label_problems, lint, sanitize_label_value

Obj = dict[str, Any]
COMMAND = ["python3", "-c", "pass"]


def good_pod() -> Obj:
    pod: Obj = m.pod(SandboxConfig(image="python:3.12-slim"), KubernetesSpec(), "abc", COMMAND, now=0.0)
    return pod


def _c(pod: Obj) -> Obj:
    container: Obj = pod["spec"]["containers"][0]
    return container


def _sc(pod: Obj) -> Obj:
    sc: Obj = _c(pod)["securityContext"]
    return sc


def _volume(pod: Obj, name: str) -> Obj:
    volumes: list[Obj] = [v for v in pod["spec"]["volumes"] if v["name"] == name]
    (volume,) = volumes
    return volume


MUTATIONS: list[tuple[str, Callable[[Obj], None], str]] = [
    # PSA restricted
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), "hostNetwork must not be true"),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "hostPID must not be true"),
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), "hostIPC must not be true"),
    ("privileged", lambda p: _sc(p).update(privileged=True), "privileged must not be true"),
    (
        "escalation",
        lambda p: _sc(p).update(allowPrivilegeEscalation=True),
        "allowPrivilegeEscalation must be false",
    ),
    (
        "escalation unset",
        lambda p: _sc(p).pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation must be false",
    ),
    (
        "no drop ALL",
        lambda p: _sc(p).update(capabilities={"drop": ["NET_RAW"]}),
        "capabilities.drop must include ALL",
    ),
    (
        "cap add",
        lambda p: _sc(p)["capabilities"].update(add=["NET_BIND_SERVICE", "SYS_ADMIN"]),
        "only NET_BIND_SERVICE, not ['SYS_ADMIN']",
    ),
    ("root allowed", lambda p: p["spec"]["securityContext"].pop("runAsNonRoot"), "runAsNonRoot must be true"),
    ("container root", lambda p: _sc(p).update(runAsNonRoot=False), "runAsNonRoot must be true"),
    ("uid 0 pod", lambda p: p["spec"]["securityContext"].update(runAsUser=0), "runAsUser must not be 0"),
    ("uid 0 container", lambda p: _sc(p).update(runAsUser=0), "runAsUser must not be 0"),
    (
        "seccomp unconfined",
        lambda p: p["spec"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "seccompProfile.type='Unconfined' is not allowed",
    ),
    (
        "seccomp bogus",
        lambda p: p["spec"]["securityContext"].update(seccompProfile={"type": "Bogus"}),
        "seccompProfile.type='Bogus' is not allowed",
    ),
    (
        "seccomp localhost without profile",
        lambda p: p["spec"]["securityContext"].update(seccompProfile={"type": "Localhost"}),
        "Localhost needs a localhostProfile",
    ),
    ("no seccomp", lambda p: p["spec"]["securityContext"].pop("seccompProfile"), "no seccompProfile"),
    (
        "container seccomp",
        lambda p: _sc(p).update(seccompProfile={"type": "Unconfined"}),
        "securityContext.seccompProfile.type='Unconfined'",
    ),
    ("procMount", lambda p: _sc(p).update(procMount="Unmasked"), "procMount must be Default"),
    ("apparmor", lambda p: _sc(p).update(appArmorProfile={"type": "Unconfined"}), "appArmorProfile"),
    ("selinux", lambda p: _sc(p).update(seLinuxOptions={"type": "spc_t"}), "seLinuxOptions.type 'spc_t'"),
    (
        "sysctl",
        lambda p: p["spec"]["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        "sysctl 'kernel.msgmax'",
    ),
    ("hostPort", lambda p: _c(p).update(ports=[{"containerPort": 80, "hostPort": 80}]), "hostPort 80"),
    (
        "hostPath",
        lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "volume type 'hostPath' is not allowed",
    ),
    # AgentNest rules
    ("rw root", lambda p: _sc(p).update(readOnlyRootFilesystem=False), "readOnlyRootFilesystem must be true"),
    ("token", lambda p: p["spec"].update(automountServiceAccountToken=True), "automountServiceAccountToken"),
    ("token unset", lambda p: p["spec"].pop("automountServiceAccountToken"), "automountServiceAccountToken"),
    ("service links", lambda p: p["spec"].pop("enableServiceLinks"), "enableServiceLinks must be false"),
    ("restart", lambda p: p["spec"].update(restartPolicy="Always"), "restartPolicy must be Never"),
    ("deadline", lambda p: p["spec"].pop("activeDeadlineSeconds"), "activeDeadlineSeconds must be set"),
    (
        "emptyDir unbounded",
        lambda p: _volume(p, "tmp")["emptyDir"].pop("sizeLimit"),
        "emptyDir needs a sizeLimit",
    ),
    (
        "emptyDir bad size",
        lambda p: _volume(p, "tmp")["emptyDir"].update(sizeLimit="lots"),
        "sizeLimit='lots' is not a Kubernetes quantity",
    ),
    (
        "bad quantity",
        lambda p: _c(p)["resources"]["limits"].update(memory="lots"),
        "limits.memory='lots' is not a Kubernetes quantity",
    ),
    (
        "negative quantity",
        lambda p: _c(p)["resources"]["limits"].update({"ephemeral-storage": "-1Gi"}),
        "is negative",
    ),
    (
        "requests below limits",
        lambda p: _c(p)["resources"]["requests"].update(memory="256Mi"),
        "requests.memory must equal limits.memory",
    ),
    ("no cpu limit", lambda p: _c(p)["resources"]["limits"].pop("cpu"), "limits.cpu is missing"),
    (
        "envFrom",
        lambda p: _c(p).update(envFrom=[{"secretRef": {"name": "all"}}]),
        "envFrom is not allowed",
    ),
    (
        "configMap env",
        lambda p: _c(p)["env"].append(
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
        ),
        "env 'X' may come only from secretKeyRef",
    ),
    ("bad label", lambda p: p["metadata"]["labels"].update(team="a b"), "label team='a b'"),
    (
        "bad annotation key",
        lambda p: p["metadata"]["annotations"].update({"a b": "x"}),
        "annotation key 'a b'",
    ),
    ("no containers", lambda p: p["spec"].update(containers=[]), "no containers"),
    (
        "init container",
        lambda p: p["spec"].update(initContainers=[{"name": "init", "image": "x"}]),
        "initContainers[0] 'init': allowPrivilegeEscalation must be false",
    ),
]


def test_good_pod_is_clean() -> None:
    assert lint(good_pod()) == []
    check(good_pod())


@pytest.mark.parametrize(("name", "mutate", "needle"), MUTATIONS, ids=[name for name, _, _ in MUTATIONS])
def test_each_rule_can_fail(name: str, mutate: Callable[[Obj], None], needle: str) -> None:
    pod = copy.deepcopy(good_pod())
    mutate(pod)
    problems = lint(pod)
    assert any(needle in p for p in problems), problems
    with pytest.raises(ConfigurationError, match="breaks the sandbox rules"):
        check(pod)


def test_a_writable_root_passes_only_when_the_sandbox_asked_for_it() -> None:
    pod = copy.deepcopy(good_pod())
    _sc(pod).update(readOnlyRootFilesystem=False)
    assert lint(pod, writable_root=True) == []
    check(pod, writable_root=True)
    # Every other rule still holds then.
    _sc(pod).update(allowPrivilegeEscalation=True)
    assert lint(pod, writable_root=True) == [
        "containers[0] 'sandbox': allowPrivilegeEscalation must be false"
    ]


def test_secret_value_in_the_pod_spec() -> None:
    pod = good_pod()
    assert lint(pod, secrets=["hunter2-long"]) == []
    _c(pod)["env"].append({"name": "TOKEN", "value": "hunter2-long"})
    assert lint(pod, secrets=["hunter2-long"]) == [
        "pod: a secret value appears in the pod spec; pass it by secretKeyRef"
    ]
    # Short values would match by chance: not looked for.
    assert lint(pod, secrets=["abc"]) == []


def test_ephemeral_volume_needs_a_size() -> None:
    pod = good_pod()
    pod["spec"]["volumes"][0] = {"name": "workspace", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}
    assert any("ephemeral volume needs resources.requests.storage" in p for p in lint(pod))


def test_network_policy_must_list_both_directions() -> None:
    config = SandboxConfig(image="x")
    policy = m.network_policy(config, KubernetesSpec(), "abc")
    assert policy is not None and lint(policy) == []
    policy["spec"]["policyTypes"] = ["Ingress"]
    assert lint(policy) == ["NetworkPolicy: policyTypes must list Ingress and Egress"]


def test_quota_and_limit_range_quantities() -> None:
    quota = m.resource_quota("ns", pods=1, memory=1 << 30, cpus=1)
    ranges = m.limit_range("ns", memory=1 << 29, cpus=1, max_memory=1 << 30, max_cpus=2)
    assert lint(quota) == [] and lint(ranges) == []
    quota["spec"]["hard"]["limits.memory"] = "1 GB"
    ranges["spec"]["limits"][0]["max"]["cpu"] = "two"
    assert lint(quota) == [
        "hard.limits.memory='1 GB' is not a Kubernetes quantity (like '512Mi', '1', '500m')"
    ]
    assert lint(ranges) == [
        "limits[0].max.cpu='two' is not a Kubernetes quantity (like '512Mi', '1', '500m')"
    ]


@pytest.mark.parametrize(
    "text", ["1", "0", "512Mi", "1Gi", "500m", "1.5", ".5", "1.", "+1", "1e3", "1E-2", "2k", "3M", "1Ei"]
)
def test_quantity_grammar_accepts(text: str) -> None:
    assert QUANTITY.match(text)


@pytest.mark.parametrize(
    "text", ["", "lots", "1 Gi", "1GB", "1gi", "1.2.3", "Mi", "1Mi ", "1e", "--1", "1KiB"]
)
def test_quantity_grammar_refuses(text: str) -> None:
    assert not QUANTITY.match(text)


def test_label_grammar() -> None:
    assert label_problems({"a": "", "example.com/b-c": "x.y_z", "k": "A" * 63}) == []
    assert len(label_problems({"a": "-x", "b": "x" * 64, "Example.com/x": "1", "a/b/c": "1", "/x": "1"})) == 5
    assert label_problems(["x"]) == ["labels must be a mapping, not list"]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("alice@laptop:42", "alice-laptop-42"),
        ("--x--", "x"),
        ("a" * 70, "a" * 63),
        ("@@", ""),
        ("ok.v_1", "ok.v_1"),
    ],
)
def test_sanitize_label_value(text: str, value: str) -> None:
    assert sanitize_label_value(text) == value
    assert label_problems({"k": value}) == []


@pytest.mark.parametrize(
    ("text", "value"),
    [("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("500m", 0.5), ("2", 2.0), ("1.5G", 1.5e9), ("1e3", 1000.0)],
)
def test_quantity_values_read_as_the_apiserver_means_them(text: str, value: float) -> None:
    from agentnest.runtime.kubernetes.lint import quantity_value

    assert quantity_value(text) == pytest.approx(value)


def test_a_malformed_quantity_has_no_value() -> None:
    from agentnest.runtime.kubernetes.lint import quantity_value

    assert quantity_value("lots") is None and quantity_value(3) is None


def test_the_manager_s_capacity_is_the_tightest_quota_left_in_the_namespace() -> None:
    from agentnest.runtime.kubernetes import KubernetesBackend

    class Api:
        def find(self, kind: str) -> list[dict[str, object]]:
            assert kind == "ResourceQuota"
            return [
                {
                    "status": {
                        "hard": {"limits.memory": "8Gi", "limits.cpu": "4"},
                        "used": {"limits.memory": "1Gi"},
                    }
                },
                {"status": {"hard": {"requests.cpu": "2500m"}, "used": {"requests.cpu": "500m"}}},
                {"status": {"hard": {"pods": "10"}}},
            ]

    backend = KubernetesBackend.__new__(KubernetesBackend)
    backend._cluster = lambda: (Api(), None)  # type: ignore[method-assign]
    assert backend.capacity() == (7 * 2**30, 2.0)
    backend.ping()  # reads the quotas: no error


def test_without_quotas_the_namespace_bounds_nothing() -> None:
    from agentnest.runtime.kubernetes import KubernetesBackend

    class Api:
        def find(self, kind: str) -> list[dict[str, object]]:
            return []

    backend = KubernetesBackend.__new__(KubernetesBackend)
    backend._cluster = lambda: (Api(), None)  # type: ignore[method-assign]
    assert backend.capacity() == (None, None)
