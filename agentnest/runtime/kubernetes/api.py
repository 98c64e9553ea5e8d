"""The control plane: the objects of a sandbox created, read back, watched and removed.

Everything here is a REST call through :class:`.rest.KubeRest`; what the
cluster refuses or reports comes back as errors of the one tree
(:mod:`.reasons`).  The rules the research found in the apiserver's sources
shape the calls:

* writes use ``fieldValidation=Strict`` (the default ``Warn`` drops a field it
  does not know and answers 201), and a created Pod is read back and its
  hardening compared field by field, because a field behind a disabled
  feature gate (``hostUsers``) is dropped without a word even under Strict;
* readiness comes from a watch of the one pod, and the reasons behind a pod
  that does not start from its Events, within a bounded wait;
* deletes are background-propagated, so the objects a pod owns go with it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ...errors import BackendError, SandboxDestroyedError
from .reasons import pod_verdict
from .rest import FIELD_MANAGER, KubeRest, path

__all__ = ["KIND_PATHS", "KubeApi", "covers", "hardening_drift", "pod_running"]

#: kind -> (group/version, plural), for the objects AgentNest writes.
KIND_PATHS: dict[str, tuple[str, str, bool]] = {
    "Pod": ("v1", "pods", True),
    "Secret": ("v1", "secrets", True),
    "Event": ("v1", "events", True),
    "ResourceQuota": ("v1", "resourcequotas", True),
    "LimitRange": ("v1", "limitranges", True),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "Namespace": ("v1", "namespaces", False),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies", True),
    "RuntimeClass": ("node.k8s.io/v1", "runtimeclasses", False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
}

#: The Pod fields that carry the sandbox's hardening; each must read back as sent.
_HARDENING = (
    ("spec", "securityContext"),
    ("spec", "automountServiceAccountToken"),
    ("spec", "enableServiceLinks"),
    ("spec", "hostUsers"),
    ("spec", "runtimeClassName"),
    ("spec", "activeDeadlineSeconds"),
    ("spec", "volumes"),
)
_CONTAINER_HARDENING = ("securityContext", "resources", "command", "volumeMounts")


def _dig(obj: Mapping[str, Any], keys: Iterable[str]) -> Any:
    value: Any = obj
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def covers(sent: Any, stored: Any) -> bool:
    """Whether everything ``sent`` holds is in ``stored`` (the server may add defaults)."""
    if isinstance(sent, Mapping):
        return isinstance(stored, Mapping) and all(covers(v, stored.get(k)) for k, v in sent.items())
    if isinstance(sent, list):
        return (
            isinstance(stored, list)
            and len(sent) == len(stored)
            and all(covers(a, b) for a, b in zip(sent, stored, strict=True))
        )
    return bool(sent == stored)


def hardening_drift(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The hardening fields of ``sent`` that the stored pod does not hold as sent."""
    out = [".".join(keys) for keys in _HARDENING if not covers(_dig(sent, keys), _dig(stored, keys))]
    sent_containers = _dig(sent, ("spec", "containers")) or []
    stored_containers = {
        c.get("name"): c for c in _dig(stored, ("spec", "containers")) or [] if isinstance(c, Mapping)
    }
    for container in sent_containers:
        other = stored_containers.get(container.get("name"), {})
        for key in _CONTAINER_HARDENING:
            if not covers(container.get(key), other.get(key)):
                out.append(f"spec.containers[{container.get('name')}].{key}")
    return out


class KubeApi:
    """The REST calls of one namespace."""

    def __init__(self, rest: KubeRest, namespace: str) -> None:
        self.rest = rest
        self.namespace = namespace

    def _path(self, kind: str, name: str | None = None, namespace: str | None = None) -> str:
        group_version, plural, namespaced = KIND_PATHS[kind]
        return path(group_version, plural, (namespace or self.namespace) if namespaced else None, name)

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``obj`` in this namespace (Strict field validation); the stored object."""
        kind = str(obj.get("kind"))
        namespaced = KIND_PATHS[kind][2]
        body = dict(obj)
        if namespaced:
            body["metadata"] = {**dict(obj.get("metadata") or {}), "namespace": self.namespace}
        name = _dig(obj, ("metadata", "name")) or _dig(obj, ("metadata", "generateName")) or "?"
        doc = self.rest.request(
            "POST",
            self._path(kind),
            action=f"create {kind} {name}",
            namespace=self.namespace if namespaced else None,
            query={"fieldValidation": "Strict", "fieldManager": FIELD_MANAGER},
            body=body,
        )
        assert doc is not None
        return doc

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.rest.request(
            "GET",
            self._path(kind, name),
            action=f"read {kind} {name}",
            namespace=self.namespace,
            allow_missing=True,
        )

    def find(
        self, kind: str, *, labels: str | None = None, fields: str | None = None
    ) -> list[dict[str, Any]]:
        doc = self.rest.request(
            "GET",
            self._path(kind),
            action=f"list {kind}s",
            namespace=self.namespace,
            query={"labelSelector": labels, "fieldSelector": fields, "limit": 500},
        )
        items = (doc or {}).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def patch(self, kind: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of ``name``; the updated object."""
        doc = self.rest.request(
            "PATCH",
            self._path(kind, name),
            action=f"update {kind} {name}",
            namespace=self.namespace,
            query={"fieldManager": FIELD_MANAGER},
            body=patch,
            content_type="application/merge-patch+json",
        )
        if doc is None:  # pragma: no cover - allow_missing is off
            raise SandboxDestroyedError(f"{kind} {name} is gone")
        return doc

    def delete(self, kind: str, name: str) -> bool:
        """Delete ``name`` now (grace 0), collecting what it owns; ``False`` if it was gone already."""
        doc = self.rest.request(
            "DELETE",
            self._path(kind, name),
            action=f"delete {kind} {name}",
            namespace=self.namespace,
            body={
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "propagationPolicy": "Background",
                "gracePeriodSeconds": 0,
            },
            allow_missing=True,
        )
        return doc is not None

    def log_lines(
        self,
        pod: str,
        container: str,
        *,
        since_time: str | None,
        timeout: float,
        read_timeout: float,
        max_line: int,
    ) -> Iterator[bytes]:
        """Follow a container's log: its lines, each prefixed with the kubelet's RFC 3339 timestamp."""
        return self.rest.lines(
            self._path("Pod", pod) + "/log",
            action=f"read the log of pod {pod}",
            namespace=self.namespace,
            query={"container": container, "follow": "true", "timestamps": "true", "sinceTime": since_time},
            timeout=timeout,
            read_timeout=read_timeout,
            max_line=max_line,
            accept="*/*",
        )

    def events(self, pod: str) -> list[dict[str, Any]]:
        """The pod's Events, oldest first."""
        items = self.find("Event", fields=f"involvedObject.name={pod}")
        return sorted(items, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))

    def wait_running(self, name: str, timeout: float) -> dict[str, Any]:
        """Wait until pod ``name`` runs its container; the pod.

        Raises at once what cannot clear by waiting (an image that cannot be
        pulled, a node without the runtime, the pod ended); at ``timeout``
        the last reason seen (unschedulable, ...) or a plain timeout.
        """
        deadline = time.monotonic() + timeout
        pod = self.get("Pod", name)
        last_reason: BackendError | None = None
        while True:
            if pod is None:
                raise SandboxDestroyedError(f"sandbox pod {name} was deleted while it started")
            if pod_running(pod):
                return pod
            verdict = pod_verdict(pod, self.events(name))
            if verdict.error is not None:
                if verdict.final:
                    raise verdict.error
                if isinstance(verdict.error, BackendError):
                    last_reason = verdict.error
            left = deadline - time.monotonic()
            if left <= 0:
                if last_reason is not None:
                    raise last_reason
                raise BackendError(
                    f"sandbox pod {name} did not start within {timeout:.0f} s (phase "
                    f"{_dig(pod, ('status', 'phase')) or 'unknown'}); see `kubectl describe pod {name} "
                    f"-n {self.namespace}`"
                )
            # Wake on the pod's changes; Events are not on this watch, so look
            # again at least every 2 s for the reason behind a wait.
            version = _dig(pod, ("metadata", "resourceVersion"))
            for event in self.rest.watch(
                self._path("Pod"),
                action=f"watch pod {name}",
                namespace=self.namespace,
                query={"fieldSelector": f"metadata.name={name}", "resourceVersion": version},
                timeout=min(2.0, left),
            ):
                if event.get("type") == "DELETED":
                    pod = None
                    break
                if event.get("type") in ("ADDED", "MODIFIED"):
                    pod = event["object"]
                    if pod_running(pod) or pod_verdict(pod).final:
                        break
            else:
                pod = self.get("Pod", name)


def pod_running(pod: Mapping[str, Any]) -> bool:
    if _dig(pod, ("status", "phase")) != "Running" or _dig(pod, ("metadata", "deletionTimestamp")):
        return False
    statuses = _dig(pod, ("status", "containerStatuses")) or []
    return bool(statuses) and all(isinstance(s, Mapping) and _dig(s, ("state", "running")) for s in statuses)
