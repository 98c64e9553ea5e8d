"""``KubernetesSpec``: the knobs of the Kubernetes backend (a frozen, validated dataclass).

Pure: importing this module loads neither ``kubernetes`` nor ``websockets``.
Every bad value raises :class:`~agentnest.errors.ConfigurationError` naming
the field, the value and the fix, before anything reaches a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ...errors import ConfigurationError
from .lint import check_label

__all__ = ["IMAGE_PULL_POLICIES", "KubernetesSpec", "check_dns_label", "check_dns_subdomain"]

#: The values ``imagePullPolicy`` takes.
IMAGE_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
_TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
#: A relative path under the kubelet's seccomp directory (``<root>/seccomp``).
_LOCALHOST_PROFILE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


def _check_name(value: object, what: str, fix: str, *, subdomain: bool) -> str:
    pattern, limit, shape = (
        (_DNS_SUBDOMAIN, 253, "a DNS subdomain (lowercase labels joined by '.', at most 253 characters)")
        if subdomain
        else (
            _DNS_LABEL,
            63,
            "a DNS label (lowercase letters, digits and '-', at most 63, starting and ending alphanumeric)",
        )
    )
    if not isinstance(value, str) or len(value) > limit or not pattern.match(value):
        raise ConfigurationError(f"{what}={value!r:.80} is not {shape}; {fix}")
    return value


def check_dns_label(value: object, what: str, fix: str) -> str:
    """``value`` if it is an RFC 1123 label (namespaces, most object names), else ConfigurationError."""
    return _check_name(value, what, fix, subdomain=False)


def check_dns_subdomain(value: object, what: str, fix: str) -> str:
    """``value`` if it is an RFC 1123 subdomain (class and secret names), else ConfigurationError."""
    return _check_name(value, what, fix, subdomain=True)


def _optional_name(value: object, what: str, fix: str) -> None:
    if value is not None:
        check_dns_subdomain(value, what, fix)


def _tolerations(value: object) -> tuple[Mapping[str, Any], ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (tuple, list)):
        raise ConfigurationError(
            f"tolerations={value!r:.80} must be a list of mappings, e.g. "
            "[{'key': 'sandbox.gke.io/runtime', 'operator': 'Equal', 'value': 'gvisor', "
            "'effect': 'NoSchedule'}]"
        )
    out: list[Mapping[str, Any]] = []
    for i, item in enumerate(value):
        where = f"tolerations[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigurationError(f"{where}={item!r:.80} must be a mapping with key/operator/value/effect")
        unknown = sorted(set(item) - _TOLERATION_KEYS)
        if unknown:
            raise ConfigurationError(
                f"{where} has unknown fields {unknown}; use only {sorted(_TOLERATION_KEYS)}"
            )
        operator = item.get("operator", "Equal")
        if operator not in ("Equal", "Exists"):
            raise ConfigurationError(f"{where}.operator={operator!r} is invalid; use 'Equal' or 'Exists'")
        if operator == "Exists" and item.get("value"):
            raise ConfigurationError(f"{where}: operator 'Exists' takes no value; drop value or use 'Equal'")
        if "key" not in item and operator != "Exists":
            raise ConfigurationError(f"{where}: an empty key needs operator 'Exists'; add a key")
        for name in ("key", "value"):
            if name in item and not isinstance(item[name], str):
                raise ConfigurationError(f"{where}.{name}={item[name]!r:.60} must be a string")
        effect = item.get("effect")
        if effect is not None and effect not in _TOLERATION_EFFECTS:
            raise ConfigurationError(
                f"{where}.effect={effect!r} is invalid; use one of {', '.join(_TOLERATION_EFFECTS)}"
            )
        seconds = item.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            raise ConfigurationError(f"{where}.tolerationSeconds={seconds!r} must be a whole number")
        out.append(MappingProxyType(dict(item)))
    return tuple(out)


_PROBE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


def _network_probes(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"network_probes={value!r:.80} must map names to addresses, "
            "e.g. {'metadata': '169.254.169.254:80'}"
        )
    from .netcheck import parse_addresses  # pure; kept out of import time

    out: dict[str, str] = {}
    for name, addresses in value.items():
        if not isinstance(name, str) or not _PROBE_NAME.match(name):
            raise ConfigurationError(
                f"network_probes key {name!r:.40} must be a short lowercase name such as 'metadata'"
            )
        parse_addresses(name, addresses)  # raises ConfigurationError naming the bad one
        out[name] = str(addresses)
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class KubernetesSpec:
    """Knobs of the Kubernetes backend.

    0.3.0's ``KubernetesRuntime(namespace=, context=, runtime_class_name=)``
    names are fields here with the same meaning; only ``namespace``'s default
    moved from ``default`` to a dedicated ``agentnest`` namespace (see
    ``agentnest kubernetes setup``).

    Attributes:
        namespace: where sandboxes' objects are created.
        context: the kubeconfig context; ``None`` is the current one.
        kubeconfig: a kubeconfig path; ``None`` reads ``$KUBECONFIG``, then
            ``~/.kube/config``, then the in-cluster config.
        runtime_class_name: the RuntimeClass of sandbox pods (``gvisor`` by
            default); ``None`` is the cluster's default runtime (runc: far
            weaker isolation; say so before choosing it).
        gpu_runtime_class_name: the RuntimeClass of pods that ask for GPUs
            (``gpus=N``: ``nvidia.com/gpu`` limits), e.g. a gVisor class whose
            handler runs runsc with ``--nvproxy=true``; ``None`` (default) keeps
            ``runtime_class_name``.  Its handler must be the same OCI runtime as
            ``runtime_class_name``'s (the one a policy's ``required_runtime`` is
            checked against), or such pods are refused before they are created.
        image_pull_policy: ``IfNotPresent`` (default; pin images by digest so
            every node runs the same bits), ``Always`` or ``Never``.
        image_pull_secrets: names of Secrets in ``namespace`` for private registries.
        node_selector: node labels sandbox pods must land on.
        tolerations: taints sandbox pods tolerate (Kubernetes' own field names).
        priority_class_name: the PriorityClass of sandbox pods.
        service_account_name: the pod's ServiceAccount; its token is never
            mounted either way (``automountServiceAccountToken: false``).
        seccomp: ``RuntimeDefault`` or ``Localhost:<path>`` (a profile under
            the kubelet's seccomp directory, e.g. ``Localhost:agentnest.json``).
        host_users: ``False`` (default) runs the pod in a user namespace
            (``hostUsers: false``); ``True`` leaves the field unset, for
            clusters without user namespace support.
        workspace_storage_class: ``None`` keeps a disk workspace in a node-local
            ``emptyDir`` bounded by kubelet eviction; a StorageClass name makes
            it a generic ephemeral volume of that class (a hard bound).
        python: the interpreter in the image that runs the agent.
        proxy_image: the image of the egress proxy pod (needs python3 >= 3.8);
            ``None`` uses the policy's ``egress_proxy_image``, else the sandbox's image.
        proxy_runtime_class_name: the RuntimeClass of the proxy pod
            (``None``: the cluster's default, as the Docker proxy runs on runc).
        egress_hosts: host name -> IP address, used by the egress proxy pod
            instead of the cluster DNS for those names (split-horizon and
            air-gapped setups; tests).  A mapped name must still be on the
            allowlist, and a private mapped address still needs a ``cidrs``
            entry (and the proxy's NetworkPolicy lets it through only then).
        network_probes: where the in-pod network check looks before a sandbox
            is handed out (:mod:`.netcheck`), by name: ``apiserver``
            (default ``@service:443``, the address the kubelet gives pods),
            ``metadata`` (``169.254.169.254:80``), ``dns`` (``@resolv:53``,
            the pod's nameservers) and ``internet`` (``1.1.1.1:443``); each
            value is ``IP:PORT`` (``[IPv6]:PORT``) or several, comma-separated.
            Other names add targets, e.g. ``{"registry": "10.0.0.5:5000"}``.
            Every one must be unreachable, or the pod is deleted.
        network_probe_timeout: how long (seconds) each probe waits for an answer;
            a policy that drops packets costs this once per sandbox start.
        max_lifetime: how long (seconds) a sandbox may live with its
            ``extend()`` calls; ``None`` is its first lifetime (no extension).
            A pod's hard stop (``activeDeadlineSeconds``) is fixed when it is
            created and can only shrink, so it is set to this up front; the
            in-pod keeper still stops the pod at its own (moved) deadline.

    .. versionadded:: 0.4.0
    """

    type: str = "kubernetes"
    namespace: str = "agentnest"
    context: str | None = None
    kubeconfig: str | None = None
    runtime_class_name: str | None = "gvisor"
    gpu_runtime_class_name: str | None = None
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    # Not part of the hash (a mapping is not hashable); still compared.
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    tolerations: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    priority_class_name: str | None = None
    service_account_name: str | None = None
    seccomp: str = "RuntimeDefault"
    host_users: bool = False
    workspace_storage_class: str | None = None
    python: str = "python3"
    proxy_image: str | None = None
    proxy_runtime_class_name: str | None = None
    egress_hosts: Mapping[str, str] = field(default_factory=dict, hash=False)
    network_probes: Mapping[str, str] = field(default_factory=dict, hash=False)
    network_probe_timeout: float = 1.0
    max_lifetime: float | None = None

    def __post_init__(self) -> None:
        if self.type != "kubernetes":
            raise ConfigurationError(f"type={self.type!r} is not this spec's type; use 'kubernetes'")
        check_dns_label(self.namespace, "namespace", "use a namespace name such as 'agentnest'")
        for name in ("context", "kubeconfig"):
            value: object = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(f"{name}={value!r:.80} must be a non-empty string or None")
        _optional_name(
            self.runtime_class_name,
            "runtime_class_name",
            "use the name of a RuntimeClass (`kubectl get runtimeclass`), or None for the cluster default",
        )
        _optional_name(
            self.gpu_runtime_class_name,
            "gpu_runtime_class_name",
            "use the name of a RuntimeClass for GPU pods (`kubectl get runtimeclass`), or None to keep "
            "runtime_class_name",
        )
        _optional_name(
            self.proxy_runtime_class_name,
            "proxy_runtime_class_name",
            "use the name of a RuntimeClass, or None for the cluster default",
        )
        if self.image_pull_policy not in IMAGE_PULL_POLICIES:
            raise ConfigurationError(
                f"image_pull_policy={self.image_pull_policy!r} is invalid; "
                f"use one of {', '.join(IMAGE_PULL_POLICIES)}"
            )
        secrets: object = self.image_pull_secrets
        if isinstance(secrets, (str, bytes)) or not isinstance(secrets, (tuple, list)):
            raise ConfigurationError(
                f"image_pull_secrets={secrets!r:.80} must be a list of Secret names, e.g. ['regcred']"
            )
        for name in secrets:
            check_dns_subdomain(name, "image_pull_secrets entry", "use the name of a Secret in the namespace")
        object.__setattr__(self, "image_pull_secrets", tuple(secrets))
        selector: object = self.node_selector
        if not isinstance(selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
        ):
            raise ConfigurationError(
                f"node_selector={selector!r:.80} must map label keys to values, e.g. {{'sandbox': 'gvisor'}}"
            )
        for k, v in selector.items():
            check_label(k, v, "node_selector")
        object.__setattr__(self, "node_selector", MappingProxyType(dict(selector)))
        object.__setattr__(self, "tolerations", _tolerations(self.tolerations))
        _optional_name(self.priority_class_name, "priority_class_name", "use the name of a PriorityClass")
        _optional_name(
            self.service_account_name, "service_account_name", "use the name of a ServiceAccount, or None"
        )
        self.seccomp_profile()  # validates
        if not isinstance(self.host_users, bool):
            raise ConfigurationError(f"host_users={self.host_users!r} must be True or False")
        _optional_name(
            self.workspace_storage_class,
            "workspace_storage_class",
            "use a StorageClass name (`kubectl get storageclass`), or None",
        )
        if not isinstance(self.python, str) or not self.python or any(c.isspace() for c in self.python):
            raise ConfigurationError(f"python={self.python!r} must be an interpreter name such as 'python3'")
        object.__setattr__(self, "network_probes", _network_probes(self.network_probes))
        timeout: object = self.network_probe_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0.05 <= timeout <= 30:
            raise ConfigurationError(
                f"network_probe_timeout={timeout!r:.40} must be a number of seconds from 0.05 to 30"
            )
        longest: object = self.max_lifetime
        if longest is not None and (
            isinstance(longest, bool)
            or not isinstance(longest, (int, float))
            or not 1 <= longest <= 7 * 24 * 3600
        ):
            raise ConfigurationError(
                f"max_lifetime={longest!r:.40} must be None or 1 to 604800 seconds (how far extend() may go)"
            )
        hosts: object = self.egress_hosts
        if not isinstance(hosts, Mapping):
            raise ConfigurationError(f"egress_hosts must map host names to addresses, not {hosts!r:.60}")
        from ...egress.rules import Rules

        try:
            Rules(hosts=dict(hosts))  # the proxy's own parser: what it would refuse, refused now
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"egress_hosts: {exc}; use {{'name.example': '10.0.0.5'}}") from None
        object.__setattr__(self, "egress_hosts", MappingProxyType(dict(hosts)))
        if self.proxy_image is not None and (
            not isinstance(self.proxy_image, str)
            or not self.proxy_image.strip()
            or any(c.isspace() for c in self.proxy_image)
        ):
            raise ConfigurationError(
                f"proxy_image={self.proxy_image!r:.80} is not an image reference; use e.g. 'python:3.12-slim'"
            )

    def pod_runtime_class(self, gpus: int) -> str | None:
        """The RuntimeClass of a sandbox pod asking for ``gpus`` GPUs.

        .. versionadded:: 0.4.0
        """
        if gpus and self.gpu_runtime_class_name is not None:
            return self.gpu_runtime_class_name
        return self.runtime_class_name

    def seccomp_profile(self) -> dict[str, str]:
        """The ``seccompProfile`` object ``seccomp`` names.

        Raises:
            ConfigurationError: neither ``RuntimeDefault`` nor ``Localhost:<relative path>``.
        """
        value: object = self.seccomp
        if value == "RuntimeDefault":
            return {"type": "RuntimeDefault"}
        if isinstance(value, str) and value.startswith("Localhost:"):
            path = value.split(":", 1)[1]
            # Relative and without '..': the kubelet resolves it under its own
            # seccomp directory, and a path that climbs out is refused there late.
            if _LOCALHOST_PROFILE.match(path) and ".." not in path.split("/"):
                return {"type": "Localhost", "localhostProfile": path}
        # Unconfined is never offered: PSA restricted refuses it, and so do we.
        raise ConfigurationError(
            f"seccomp={value!r:.80} is invalid; use 'RuntimeDefault' or 'Localhost:<path>' with a path "
            "relative to the kubelet's seccomp directory, e.g. 'Localhost:agentnest.json'"
        )
