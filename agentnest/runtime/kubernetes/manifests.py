"""Pure builders: ``SandboxConfig`` + ``KubernetesSpec`` -> the objects a sandbox gets.

Every builder returns plain, JSON-ready dicts (never YAML built by string
formatting), so the same objects go to the API, to ``agentnest kubernetes
manifest`` and to the golden files under ``tests/unit/golden/k8s/``.  No I/O
and no ``kubernetes`` import; the backend adds only what the cluster assigns
(``owned_by`` once the Pod has a uid, the proxy's address once it runs).

This module composes: names, labels, volumes, environment, placement (the
RuntimeClass ``KubernetesSpec`` chose), the order of :func:`render`, and the
namespace's setup objects.  Every field that confines a sandbox (security
contexts, limits, the hard stop, no token, the NetworkPolicies' rules) comes
from :mod:`.hardening`, which a reviewer reads on its own.  :mod:`.lint`
checks the result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from ...config import BROWSER_SHM, GiB, MiB, SandboxConfig
from ...errors import ConfigurationError
from ...policy import NetworkMode
from ...secrets import Secret
from ..bootstrap import PODINFO_DEADLINE
from .hardening import (
    DEADLINE_GRACE,
    PROXY_PORT,
    PROXY_USER,
    check_confinement,
    common_pod_spec,
    container_security,
    cpu_quantity,
    hard_stop_seconds,
    memory_quantity,
    pod_security,
    proxy_policy_spec,
    proxy_resources,
    resources,
    sandbox_policy_spec,
)
from .hardening import ROLE as ROLE  # the selectors' labels, re-exported (prune reads them here)
from .hardening import SANDBOX_ID as SANDBOX_ID
from .lint import check_label, sanitize_label_value
from .spec import KubernetesSpec, check_dns_label

__all__ = [
    "AGENT_SOCKET",
    "DEADLINE_GRACE",
    "OWNER_PROCESS",
    "PODINFO_DIR",
    "PROXY_HOST",
    "PROXY_PORT",
    "REDACTED",
    "cpu_quantity",
    "hard_stop_seconds",
    "labels_for",
    "limit_range",
    "memory_quantity",
    "namespace",
    "network_policy",
    "owned_by",
    "pod",
    "pod_name",
    "point_at_proxy",
    "proxy_network_policy",
    "proxy_pod",
    "proxy_pod_name",
    "render",
    "resource_quota",
    "role",
    "role_binding",
    "secret",
    "setup_objects",
]

Obj = dict[str, Any]

#: The agent's unix socket inside the pod (``agentnest.runtime.launch.listen_command``).
AGENT_SOCKET = "/run/agentnest/agent.sock"
#: Where the pod's downwardAPI volume (its deadline, as the kubelet sees it) is mounted.
PODINFO_DIR = str(PurePosixPath(PODINFO_DEADLINE).parent)
#: The name the sandbox reaches its proxy by (``hostAliases``, no DNS needed).
PROXY_HOST = "agentnest-proxy"
#: What a Secret's values are replaced with when rendered for people.
REDACTED = "<redacted>"
#: The agent's socket directory: one socket, a few bytes.
RUN_SIZE = 1 * MiB
#: /dev/shm as Docker sizes it (64m), never more than the scratch space.
SHM_SIZE = 64 * MiB
MANAGED_BY = "app.kubernetes.io/managed-by"
APP_NAME = "app.kubernetes.io/name"
OWNER = "agentnest.io/owner"
#: The host process that created the sandbox (``host:pid``), for ``prune --orphans``.
OWNER_PROCESS = "agentnest.io/owner-process"
TENANT = "agentnest.io/tenant"
DEADLINE = "agentnest.io/deadline"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
#: Label prefixes only AgentNest and Kubernetes write; user labels may not fake them.
_RESERVED_PREFIXES = ("agentnest.io/", "app.kubernetes.io/", "kubernetes.io/", "k8s.io/")


# -- names and labels ---------------------------------------------------------------


def pod_name(sandbox_id: str) -> str:
    """The sandbox pod's name; the other per-sandbox objects derive from it.

    The id is also a label value and part of DNS names, so it must be a DNS
    label of at most 40 characters (the suffixes added here still fit in 63).
    """
    if not isinstance(sandbox_id, str) or len(sandbox_id) > 40:
        raise ConfigurationError(f"sandbox id {sandbox_id!r:.60} must be 1-40 characters")
    check_dns_label(sandbox_id, "sandbox id", "use lowercase letters, digits and '-' (it names the pod)")
    return f"agentnest-{sandbox_id}"


def _user_labels(labels: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in labels.items():
        if key.startswith(_RESERVED_PREFIXES) or ".kubernetes.io/" in key or ".k8s.io/" in key:
            raise ConfigurationError(
                f"labels: {key!r} is reserved for AgentNest and Kubernetes; use your own prefix "
                "(e.g. 'example.com/team')"
            )
        check_label(key, value, "labels")
        out[key] = value
    return out


def labels_for(
    config: SandboxConfig, sandbox_id: str, role: str, owner: str = "", tenant: str = ""
) -> dict[str, str]:
    """The labels of every object of one sandbox (the reaper lists by them)."""
    out = _user_labels(config.labels)
    out.update(
        {
            MANAGED_BY: "agentnest",
            APP_NAME: "agentnest-sandbox" if role == "sandbox" else "agentnest-egress-proxy",
            SANDBOX_ID: sandbox_id,
            ROLE: role,
        }
    )
    for key, text in ((OWNER, owner), (TENANT, tenant)):
        value = sanitize_label_value(text)
        if value:
            out[key] = value
    return out


def _metadata(name: str, spec: KubernetesSpec, labels: Mapping[str, str], **extra: Any) -> Obj:
    return {"name": name, "namespace": spec.namespace, "labels": dict(labels), **extra}


def owned_by(obj: Mapping[str, Any], pod_name: str, pod_uid: str) -> Obj:
    """A copy of ``obj`` owned by the Pod, so deleting the Pod collects it.

    No ``blockOwnerDeletion``: setting it needs ``update`` on ``pods/finalizers``
    (OwnerReferencesPermissionEnforcement), more than the backend's Role grants,
    and nothing should wait on a sandbox's Secret or NetworkPolicy.
    """
    out = dict(obj)
    metadata = dict(out.get("metadata") or {})
    metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}]
    out["metadata"] = metadata
    return out


# -- the sandbox pod ----------------------------------------------------------------


def _user(config: SandboxConfig) -> tuple[int, int]:
    uid, _, gid = config.user.partition(":")
    return int(uid), int(gid or uid)


def _deadline(config: SandboxConfig, now: float) -> dict[str, str]:
    return {
        # Mutable: extend() patches it and the reaper reads it (activeDeadlineSeconds cannot grow).
        DEADLINE: str(math.ceil(now + config.lifetime)),
        # A claimed sandbox holds someone's work: the autoscaler must not drain it away.
        SAFE_TO_EVICT: "false",
    }


def _secret_name(sandbox_id: str) -> str:
    return f"{pod_name(sandbox_id)}-env"


def _env(config: SandboxConfig, sandbox_id: str, proxy: bool) -> list[Obj]:
    env: list[Obj] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "LANG", "value": "C.UTF-8"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    for key, value in config.environment.items():
        if isinstance(value, Secret) and value.as_file:
            # The value is written into the sandbox over the agent channel (Sandbox
            # does this for every backend); the pod only learns where it lives.
            env.append({"name": f"{key}_FILE", "value": config.container_environment()[f"{key}_FILE"]})
        elif isinstance(value, Secret):
            # Only a reference: the value lives in the per-sandbox Secret and never
            # in the pod spec, which every reader of pods and the audit log see.
            ref = {"name": _secret_name(sandbox_id), "key": key}
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
        else:
            env.append({"name": key, "value": value})
    env.append({"name": "AGENTNEST_WORKSPACE", "value": config.workdir})
    if proxy:
        url = f"http://{PROXY_HOST}:{PROXY_PORT}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env.append({"name": name, "value": url})
        for name in ("NO_PROXY", "no_proxy"):
            env.append({"name": name, "value": "localhost,127.0.0.1,::1"})
    return env


def _memory_dir(name: str, size: int) -> Obj:
    # Memory-backed (tmpfs), bounded: its pages count against the pod's memory.
    return {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": memory_quantity(size)}}


def _workspace_volume(config: SandboxConfig, spec: KubernetesSpec, labels: Mapping[str, str]) -> Obj:
    limits = config.limits
    if limits.workspace_medium == "memory":
        return _memory_dir("workspace", limits.workspace)
    if spec.workspace_storage_class is None:
        # Node disk, bounded only by kubelet eviction (periodic): the pod's
        # ephemeral-storage limit covers it, see _resources.
        return {"name": "workspace", "emptyDir": {"sizeLimit": memory_quantity(limits.workspace)}}
    # A generic ephemeral volume: a PVC of that class, created and deleted with
    # the pod, bounded by the volume's own size (a hard limit, ENOSPC).
    claim = {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": spec.workspace_storage_class,
            "resources": {"requests": {"storage": memory_quantity(limits.workspace)}},
        },
    }
    return {"name": "workspace", "ephemeral": {"volumeClaimTemplate": claim}}


def _podinfo_volume() -> Obj:
    # The deadline annotation as a file the kubelet keeps current: extend()
    # patches the annotation and the keeper reads it here.  Read-only and
    # root-owned, so sandbox code cannot move its own deadline.
    return {
        "name": "podinfo",
        "downwardAPI": {
            "defaultMode": 0o444,
            "items": [{"path": "deadline", "fieldRef": {"fieldPath": f"metadata.annotations['{DEADLINE}']"}}],
        },
    }


def _placement(spec: KubernetesSpec, runtime_class: str | None) -> Obj:
    out: Obj = {}
    if runtime_class is not None:
        out["runtimeClassName"] = runtime_class
    if spec.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    if spec.node_selector:
        out["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.priority_class_name is not None:
        out["priorityClassName"] = spec.priority_class_name
    return out


def pod(
    config: SandboxConfig,
    spec: KubernetesSpec,
    sandbox_id: str,
    command: Sequence[str],
    *,
    now: float,
    owner: str = "",
    tenant: str = "",
    proxy_ip: str | None = None,
) -> Obj:
    """The sandbox Pod: one container running ``command`` (the keeper and listening agent).

    ``proxy_ip`` (allowlist only) is the egress proxy pod's address, known once
    it runs; ``None`` leaves the ``hostAliases`` entry out (a preview).
    """
    check_confinement(config)
    uid, gid = _user(config)
    labels = labels_for(config, sandbox_id, "sandbox", owner, tenant)
    allowlist = config.network.mode is NetworkMode.ALLOWLIST
    limits = config.limits
    volumes = [
        _workspace_volume(config, spec, labels),
        _memory_dir("tmp", limits.scratch),
        _memory_dir("run", RUN_SIZE),
        # A browser's renderers share their frames through /dev/shm (config.PRESETS).
        _memory_dir("shm", BROWSER_SHM if config.preset == "browser" else min(SHM_SIZE, limits.scratch)),
        _podinfo_volume(),
    ]
    mounts = [
        {"name": "workspace", "mountPath": config.workdir},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "run", "mountPath": "/run/agentnest"},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True},
    ]
    container: Obj = {
        "name": "sandbox",
        "image": config.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(command),
        "workingDir": config.workdir,
        "env": _env(config, sandbox_id, allowlist),
        "resources": resources(config, spec),
        "securityContext": container_security(config.read_only_root),
        "volumeMounts": mounts,
        # Nothing is attached: the agent stream goes through exec, never the
        # container log (containerd would write every byte of it to the node).
        "stdin": False,
        "tty": False,
    }
    pod_spec: Obj = common_pod_spec(spec, config)
    pod_spec.update(
        {
            "securityContext": pod_security(uid, gid, spec.seccomp_profile()),
            "containers": [container],
            "volumes": volumes,
        }
    )
    # GPU pods may run in their own class (one whose handler has the GPU
    # plumbing, e.g. gVisor with nvproxy); the backend checks it is the same
    # OCI runtime the policy was checked against.
    pod_spec.update(_placement(spec, spec.pod_runtime_class(limits.gpus)))
    out = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(pod_name(sandbox_id), spec, labels, annotations=_deadline(config, now)),
        "spec": pod_spec,
    }
    if allowlist and proxy_ip is not None:
        point_at_proxy(out, proxy_ip)
    return out


def secret(
    config: SandboxConfig,
    spec: KubernetesSpec,
    sandbox_id: str,
    *,
    owner: str = "",
    tenant: str = "",
    values: bool = True,
) -> Obj | None:
    """The per-sandbox Secret holding the environment's ``Secret`` values (``None``: there are none).

    ``values=False`` renders every value as ``<redacted>``, for people to read.
    """
    keys = {
        k: v.get_secret_value() if values else REDACTED
        for k, v in config.environment.items()
        if isinstance(v, Secret) and not v.as_file
    }
    if not keys:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(
            _secret_name(sandbox_id), spec, labels_for(config, sandbox_id, "sandbox", owner, tenant)
        ),
        "type": "Opaque",
        # Values never change: immutable Secrets are also cheaper for the kubelet to watch.
        "immutable": True,
        "stringData": keys,
    }


# -- network ------------------------------------------------------------------------


def network_policy(
    config: SandboxConfig, spec: KubernetesSpec, sandbox_id: str, *, owner: str = "", tenant: str = ""
) -> Obj | None:
    """The sandbox pod's NetworkPolicy (``None`` for an open network).

    Its rules are :func:`.hardening.sandbox_policy_spec`'s: denied lets nothing
    in or out, allowlist lets out only to its own proxy pod.
    """
    policy_spec = sandbox_policy_spec(config, sandbox_id)
    if policy_spec is None:
        return None
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(
            pod_name(sandbox_id), spec, labels_for(config, sandbox_id, "sandbox", owner, tenant)
        ),
        "spec": policy_spec,
    }


def proxy_pod_name(sandbox_id: str) -> str:
    """The egress proxy pod's name (and its NetworkPolicy's)."""
    return f"{pod_name(sandbox_id)}-egress"


def point_at_proxy(sandbox_pod: Obj, proxy_ip: str) -> None:
    """Give a rendered sandbox Pod its proxy's address, once the proxy pod has one."""
    # /etc/hosts, not DNS: the sandbox has no DNS at all (an exfiltration channel).
    sandbox_pod["spec"]["hostAliases"] = [{"ip": proxy_ip, "hostnames": [PROXY_HOST]}]


def proxy_config(config: SandboxConfig, spec: KubernetesSpec, *, now: float) -> Obj:
    """The JSON config the egress proxy (``agentnest/egress/proxy.py``) runs with in its pod."""
    policy = config.network
    return {
        # The pod's own address; the NetworkPolicy admits only this sandbox.
        "listen": ["0.0.0.0", PROXY_PORT],  # noqa: S104 - inside its own pod, fenced by NetworkPolicy
        "clients": [],
        "domains": list(policy.domains),
        "cidrs": list(policy.cidrs),
        "ports": list(policy.ports),
        # Always sent: the proxy's own default must never decide the matching.
        "subdomains": policy.subdomains,
        "hosts": dict(spec.egress_hosts),
        "deadline": math.ceil(now + config.lifetime),
        # extend() moves the pod's annotation; the kubelet's copy (a link in
        # a read-only downwardAPI volume) is read again at the old deadline.
        "deadline_file": PODINFO_DEADLINE,
        "deadline_follow": True,
    }


def proxy_pod(
    config: SandboxConfig,
    spec: KubernetesSpec,
    sandbox_id: str,
    command: Sequence[str],
    *,
    now: float,
    owner: str = "",
    tenant: str = "",
) -> Obj:
    """The egress proxy's Pod for one allowlisted sandbox, hardened as the sandbox is."""
    labels = labels_for(config, sandbox_id, "egress-proxy", owner, tenant)
    container: Obj = {
        "name": "proxy",
        "image": config.proxy_image or spec.proxy_image or config.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(command),
        "env": [
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "LANG", "value": "C.UTF-8"},
        ],
        "ports": [{"name": "proxy", "containerPort": PROXY_PORT, "protocol": "TCP"}],
        "resources": proxy_resources(),
        # Always read-only: the proxy writes nothing (its source is in its argv).
        "securityContext": container_security(True),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True},
        ],
        "stdin": False,
        "tty": False,
    }
    pod_spec = common_pod_spec(spec, config)
    pod_spec.update(
        {
            "securityContext": pod_security(PROXY_USER, PROXY_USER, spec.seccomp_profile()),
            "containers": [container],
            "volumes": [_memory_dir("tmp", 1 * MiB), _podinfo_volume()],
        }
    )
    pod_spec.update(_placement(spec, spec.proxy_runtime_class_name))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(proxy_pod_name(sandbox_id), spec, labels, annotations=_deadline(config, now)),
        "spec": pod_spec,
    }


def proxy_network_policy(
    config: SandboxConfig, spec: KubernetesSpec, sandbox_id: str, *, owner: str = "", tenant: str = ""
) -> Obj:
    """The proxy pod's NetworkPolicy: :func:`.hardening.proxy_policy_spec`'s rules
    (in only from its sandbox; out to the public internet on the policy's ports, and to DNS)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(
            proxy_pod_name(sandbox_id), spec, labels_for(config, sandbox_id, "egress-proxy", owner, tenant)
        ),
        "spec": proxy_policy_spec(config, sandbox_id),
    }


def render(
    config: SandboxConfig,
    spec: KubernetesSpec,
    sandbox_id: str,
    *,
    now: float,
    owner: str = "",
    tenant: str = "",
    command: Sequence[str] | None = None,
    proxy_command: Sequence[str] | None = None,
    proxy_ip: str | None = None,
    secret_values: bool = True,
) -> list[Obj]:
    """Exactly the objects a sandbox gets, in creation order.

    NetworkPolicies come before the pods they select (a policy the CNI has
    not yet processed does not protect a pod that already runs); the proxy
    before the sandbox, whose ``hostAliases`` need its address; the Secret
    before the Pod that references it.  ``command`` defaults to the listening
    agent (``launch.listen_command``), ``proxy_command`` to the egress
    proxy from source (``runtime.egresslog.proxy_command``).
    """
    if command is None:
        from ..launch import listen_command

        command = listen_command(spec.python, config.lifetime, AGENT_SOCKET)
    who = {"owner": owner, "tenant": tenant}
    out: list[Obj] = []
    policy = network_policy(config, spec, sandbox_id, **who)
    if config.network.mode is NetworkMode.ALLOWLIST:
        if proxy_command is None:
            from ..egresslog import proxy_command as build_proxy_command

            proxy_command = build_proxy_command(spec.python, proxy_config(config, spec, now=now))
        out.append(proxy_network_policy(config, spec, sandbox_id, **who))
        out.append(proxy_pod(config, spec, sandbox_id, proxy_command, now=now, **who))
    if policy is not None:
        out.append(policy)
    env_secret = secret(config, spec, sandbox_id, values=secret_values, **who)
    if env_secret is not None:
        out.append(env_secret)
    out.append(pod(config, spec, sandbox_id, command, now=now, proxy_ip=proxy_ip, **who))
    return out


# -- namespace setup ----------------------------------------------------------------


def namespace(name: str, *, pod_security_version: str = "latest") -> Obj:
    """The Namespace, with Pod Security Admission ``restricted`` enforced (the cluster's floor)."""
    labels = {MANAGED_BY: "agentnest", "kubernetes.io/metadata.name": name}
    for mode in ("enforce", "warn", "audit"):
        labels[f"pod-security.kubernetes.io/{mode}"] = "restricted"
        labels[f"pod-security.kubernetes.io/{mode}-version"] = pod_security_version
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def resource_quota(
    namespace_name: str, *, pods: int, memory: int, cpus: float, ephemeral_storage: int | None = None
) -> Obj:
    """A ResourceQuota capping the namespace's pods, memory and CPU (and node disk)."""
    hard = {
        "pods": str(pods),
        "requests.memory": memory_quantity(memory),
        "limits.memory": memory_quantity(memory),
        "requests.cpu": cpu_quantity(cpus),
        "limits.cpu": cpu_quantity(cpus),
    }
    if ephemeral_storage is not None:
        hard["requests.ephemeral-storage"] = memory_quantity(ephemeral_storage)
        hard["limits.ephemeral-storage"] = memory_quantity(ephemeral_storage)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "agentnest", "namespace": namespace_name, "labels": {MANAGED_BY: "agentnest"}},
        "spec": {"hard": hard},
    }


def limit_range(namespace_name: str, *, memory: int, cpus: float, max_memory: int, max_cpus: float) -> Obj:
    """A LimitRange: defaults for containers that name no resources (a compute
    quota rejects them otherwise), and per-container ceilings."""
    default = {"memory": memory_quantity(memory), "cpu": cpu_quantity(cpus)}
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "agentnest", "namespace": namespace_name, "labels": {MANAGED_BY: "agentnest"}},
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "default": dict(default),
                    "defaultRequest": dict(default),
                    "max": {"memory": memory_quantity(max_memory), "cpu": cpu_quantity(max_cpus)},
                }
            ]
        },
    }


#: What the backend does, and nothing more (research/kubernetes.md §5).
ROLE_RULES: tuple[Obj, ...] = (
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "get", "list", "watch", "patch", "delete"],
    },
    # exec is "create" since 1.35's WebSocket authorization change, "get" before it.
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    # The egress proxy's connection events are read from its log.
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # patch: ownerReferences once the Pod exists; list: prune.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "get", "list", "patch", "delete"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["create", "get", "list", "patch", "delete"],
    },
    # Events carry the cluster's reasons (FailedScheduling, ErrImagePull).
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch"]},
    # The namespace's quotas are the manager's capacity (read only) and its readiness probe.
    {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["list"]},
)


def role(namespace_name: str) -> Obj:
    """The minimal Role the backend needs in a sandbox namespace."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "agentnest", "namespace": namespace_name, "labels": {MANAGED_BY: "agentnest"}},
        "rules": [{k: list(v) for k, v in rule.items()} for rule in ROLE_RULES],
    }


def role_binding(
    namespace_name: str, subject_kind: str, subject_name: str, subject_namespace: str | None = None
) -> Obj:
    """Bind :func:`role` to a ServiceAccount, User or Group."""
    if subject_kind not in ("ServiceAccount", "User", "Group"):
        raise ConfigurationError(
            f"subject kind {subject_kind!r} is invalid; use ServiceAccount, User or Group"
        )
    if not subject_name:
        raise ConfigurationError("the RoleBinding needs a subject name, e.g. a ServiceAccount 'agentnest'")
    subject: Obj = {"kind": subject_kind, "name": subject_name}
    if subject_kind == "ServiceAccount":
        subject["namespace"] = subject_namespace or namespace_name
    else:
        subject["apiGroup"] = "rbac.authorization.k8s.io"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "agentnest", "namespace": namespace_name, "labels": {MANAGED_BY: "agentnest"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentnest"},
        "subjects": [subject],
    }


def setup_objects(
    namespace_name: str,
    *,
    subject_kind: str = "ServiceAccount",
    subject_name: str = "agentnest",
    subject_namespace: str | None = None,
    pods: int = 50,
    memory: int = 32 * GiB,
    cpus: float = 32.0,
    ephemeral_storage: int | None = 64 * GiB,
    default_memory: int = 512 * MiB,
    default_cpus: float = 1.0,
    max_memory: int = 16 * GiB,
    max_cpus: float = 8.0,
    pod_security_version: str = "latest",
) -> list[Obj]:
    """What ``agentnest kubernetes setup NAMESPACE`` creates, in order."""
    check_dns_label(namespace_name, "namespace", "use a namespace name such as 'agentnest'")
    return [
        namespace(namespace_name, pod_security_version=pod_security_version),
        resource_quota(
            namespace_name, pods=pods, memory=memory, cpus=cpus, ephemeral_storage=ephemeral_storage
        ),
        limit_range(
            namespace_name, memory=default_memory, cpus=default_cpus, max_memory=max_memory, max_cpus=max_cpus
        ),
        role(namespace_name),
        role_binding(namespace_name, subject_kind, subject_name, subject_namespace),
    ]
