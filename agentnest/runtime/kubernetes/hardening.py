"""How a sandbox's pods are confined on Kubernetes, as data: the fields that keep the promises.

The container's and the pod's security contexts (non-root user, read-only root, no capabilities,
no privilege escalation, seccomp, a user namespace), the resource limits, the hard stop, no
service-account token, and the NetworkPolicies of the sandbox and of its egress proxy (no network
unless a policy says so; the proxy is the only route out).  Each field maps a Docker default
(research/kubernetes.md §3); the comments say why.  Pure (no I/O, no kubernetes import) and apart
from :mod:`.manifests`, which names, labels, mounts and composes these pieces into the objects
(tests/unit/test_k8s_manifests.py and its golden files check the result).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ...config import GiB, KiB, MiB, SandboxConfig
from ...errors import ConfigurationError
from ...policy import NetworkMode
from .spec import KubernetesSpec

__all__ = [
    "DEADLINE_GRACE", "PROXY_PORT", "PROXY_USER", "ROLE", "SANDBOX_ID", "check_confinement",
    "common_pod_spec", "container_security", "cpu_quantity", "hard_stop_seconds", "memory_quantity",
    "pod_security", "proxy_policy_spec", "proxy_resources", "resources", "sandbox_policy_spec", "selector",
]  # fmt: skip

Obj = dict[str, Any]

#: Seconds past the lifetime before ``activeDeadlineSeconds`` kills the pod.  It
#: is the hard outer cap behind the in-pod keeper (and it can only shrink,
#: so ``extend()`` must stay within it or recreate): the keeper ends first.
DEADLINE_GRACE = 30
#: SIGTERM to SIGKILL: a sandbox has nothing to flush.
TERMINATION_GRACE = 2
#: The egress proxy's port, as on Docker (``runtime/docker/egress.py``).
PROXY_PORT = 3128
#: Writable layer and container logs of a pod (counted in ephemeral-storage).
EPHEMERAL_BASE = 128 * MiB
#: The proxy pod's limits, as the Docker proxy container's.
PROXY_MEMORY = 128 * MiB
PROXY_CPU = "1"
PROXY_USER = 65532
#: Ranges the proxy pod itself may never reach: RFC 1918, CGNAT, link-local
#: (cloud metadata at 169.254.169.254), loopback; the proxy's own rules refuse
#: them too, this is the second lock.
PRIVATE_V4 = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
)
PRIVATE_V6 = ("fc00::/7", "fe80::/10", "::1/128")
#: The labels a NetworkPolicy selects a sandbox's pods by (``manifests.labels_for`` sets them).
SANDBOX_ID = "agentnest.io/sandbox-id"
ROLE = "agentnest.io/role"


def memory_quantity(n: int) -> str:
    """Bytes as a binary quantity: ``512Mi``, ``2Gi``, or a plain byte count."""
    for suffix, size in (("Gi", GiB), ("Mi", MiB), ("Ki", KiB)):
        if n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def cpu_quantity(cores: float) -> str:
    """Cores as a CPU quantity: ``1``, ``2`` or millicores (``500m``); at least ``1m``."""
    milli = max(1, round(cores * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


# -- the pods -----------------------------------------------------------------------


def check_confinement(config: SandboxConfig) -> None:
    """Refuse what a pod cannot honour: a custom seccomp JSON (never dropped silently)."""
    if config.seccomp_profile is not None:
        raise ConfigurationError(
            "seccomp_profile cannot be shipped to Kubernetes nodes; install the profile on the nodes and "
            "use KubernetesSpec(seccomp='Localhost:<path>')"
        )


def hard_stop_seconds(config: SandboxConfig, spec: KubernetesSpec) -> int:
    """The pod's ``activeDeadlineSeconds``: the longest it may live, extensions included.

    It can only shrink once the pod exists, so it is set to the larger of the
    lifetime and ``spec.max_lifetime`` (how far ``extend()`` may go), plus
    :data:`DEADLINE_GRACE` for the keeper to end first.
    """
    return math.ceil(max(config.lifetime, spec.max_lifetime or 0.0)) + DEADLINE_GRACE


def resources(config: SandboxConfig, spec: KubernetesSpec) -> Obj:
    """The sandbox container's requests and limits: memory, CPU, node disk, GPUs."""
    limits = config.limits
    ephemeral = EPHEMERAL_BASE
    if limits.workspace_medium == "disk" and spec.workspace_storage_class is None:
        ephemeral += limits.workspace
    values = {
        "memory": memory_quantity(limits.memory),
        "cpu": cpu_quantity(limits.cpus),
        # The writable layer (read_only_root=False) and logs are node disk too: bounded.
        "ephemeral-storage": memory_quantity(ephemeral),
    }
    if limits.gpus:
        values["nvidia.com/gpu"] = str(limits.gpus)
    # requests == limits: Guaranteed QoS, so a sandbox gets what it was promised.
    return {"requests": dict(values), "limits": dict(values)}


def proxy_resources() -> Obj:
    """The proxy container's requests and limits (Guaranteed QoS, as the sandbox's)."""
    values = {"memory": memory_quantity(PROXY_MEMORY), "cpu": PROXY_CPU, "ephemeral-storage": "64Mi"}
    return {"requests": dict(values), "limits": dict(values)}


def container_security(read_only_root: bool) -> Obj:
    """A container's ``securityContext``."""
    return {
        "allowPrivilegeEscalation": False,  # no_new_privs: setuid binaries gain nothing
        "capabilities": {"drop": ["ALL"]},  # as Docker's cap_drop=ALL
        "privileged": False,
        "readOnlyRootFilesystem": read_only_root,  # the image cannot be altered
    }


def pod_security(uid: int, gid: int, seccomp: Mapping[str, str]) -> Obj:
    """A pod's ``securityContext``."""
    return {
        "runAsNonRoot": True,  # the kubelet refuses to start a root process
        "runAsUser": uid,
        "runAsGroup": gid,
        "fsGroup": gid,  # volumes writable by the sandbox user
        "seccompProfile": dict(seccomp),  # never Unconfined (PSA restricted agrees)
    }


def common_pod_spec(spec: KubernetesSpec, config: SandboxConfig) -> Obj:
    """The pod-level fields the sandbox's and the proxy's pods share."""
    out: Obj = {
        "restartPolicy": "Never",  # a dead sandbox stays dead; the host sees it
        # The hard outer cap: the pod fails with DeadlineExceeded however the host fares.
        "activeDeadlineSeconds": hard_stop_seconds(config, spec),
        "terminationGracePeriodSeconds": TERMINATION_GRACE,
        # No API credentials inside: a sandbox must not talk to the apiserver as anyone.
        "automountServiceAccountToken": False,
        # No *_SERVICE_HOST variables: the sandbox learns nothing about its neighbours.
        "enableServiceLinks": False,
    }
    if spec.service_account_name is not None:
        out["serviceAccountName"] = spec.service_account_name
    if not spec.host_users:
        # A user namespace: UID 65532 in the pod is an unprivileged UID on the node.
        out["hostUsers"] = False
    return out


# -- network ------------------------------------------------------------------------


def selector(sandbox_id: str, role: str) -> dict[str, Any]:
    """The pods of one sandbox in one role (``sandbox`` or ``egress-proxy``)."""
    return {"matchLabels": {SANDBOX_ID: sandbox_id, ROLE: role}}


def sandbox_policy_spec(config: SandboxConfig, sandbox_id: str) -> Obj | None:
    """The sandbox pod's NetworkPolicy ``spec`` (``None`` for an open network).

    Denied: both directions listed with no rule, so nothing in or out (loopback
    is never filtered).  Allowlist: out only to its own proxy pod on
    ``PROXY_PORT``; no DNS (names are resolved by the proxy).
    """
    mode = config.network.mode
    if mode is NetworkMode.OPEN:
        return None
    policy_spec: Obj = {"podSelector": selector(sandbox_id, "sandbox"), "policyTypes": ["Ingress", "Egress"]}
    if mode is NetworkMode.ALLOWLIST:
        policy_spec["egress"] = [
            {
                "to": [{"podSelector": selector(sandbox_id, "egress-proxy")}],
                "ports": [{"protocol": "TCP", "port": PROXY_PORT}],
            }
        ]
    return policy_spec


def proxy_policy_spec(config: SandboxConfig, sandbox_id: str) -> Obj:
    """The proxy pod's NetworkPolicy ``spec``: in only from its sandbox; out to the internet
    minus private, CGNAT, link-local and loopback ranges (plus the policy's own
    ``cidrs``), on the policy's ports, and to the cluster DNS to resolve names."""
    policy = config.network
    ports = [{"protocol": "TCP", "port": p} for p in policy.ports]
    egress: list[Obj] = [
        {
            "to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_V4)}},
                {"ipBlock": {"cidr": "::/0", "except": list(PRIVATE_V6)}},
                *({"ipBlock": {"cidr": c}} for c in policy.cidrs),
            ],
            "ports": ports,
        },
        {
            # The proxy resolves the allowed names; the usual kube-dns labels.
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
    ]
    return {
        "podSelector": selector(sandbox_id, "egress-proxy"),
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [{"podSelector": selector(sandbox_id, "sandbox")}],
                "ports": [{"protocol": "TCP", "port": PROXY_PORT}],
            }
        ],
        "egress": egress,
    }
