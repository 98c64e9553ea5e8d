"""A test double of a Kubernetes cluster's control plane, with a pluggable node.

No kube-apiserver can run on the machines AgentNest is developed on, so the
Kubernetes backend is tested against this: the REST semantics the backend
relies on, as research/kubernetes.md lists them from the apiserver's sources —

* objects in namespaces (Pods, Secrets, NetworkPolicies, Events, ResourceQuotas)
  and cluster objects (Namespaces, RuntimeClasses), with uids, resourceVersions,
  ``generateName``, label selectors and watches;
* ``fieldValidation=Strict``: a field the API does not know is a 400 (checked
  with ``kubernetes-validate``'s strict schemas when it is installed);
* admission: a missing RuntimeClass is a 403 ``pod rejected: RuntimeClass "x"
  not found``; a namespace labelled ``pod-security.kubernetes.io/enforce:
  restricted`` refuses pods that break the restricted profile (403); a
  ResourceQuota on ``pods``/``limits.memory``/``limits.cpu`` refuses what does
  not fit (403 ``exceeded quota``); a token may be denied verbs (403 RBAC);
* ``activeDeadlineSeconds`` may only shrink (422);
* deleting a Pod collects the objects it owns (``ownerReferences``).

What runs a Pod is a :class:`Node`: :class:`NullNode` marks it Running (for
control-plane tests), :class:`DockerNode` (in :mod:`doubles.kube.node`)
runs it as a container on the local engine, so the real agent runs under the
pod's security context and the exec endpoint reaches it.

This is a double, not a cluster: no scheduler, no kubelet sync loop, no
controllers but the garbage collector.  What was verified only here and what
on a real cluster is listed in docs/kubernetes.md.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RESOURCES", "ClusterState", "Node", "NullNode", "Resource"]


@dataclass(frozen=True)
class Resource:
    """One REST resource: its URL segments and kind."""

    group_version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return self.group_version


RESOURCES: tuple[Resource, ...] = (
    Resource("v1", "pods", "Pod"),
    Resource("v1", "secrets", "Secret"),
    Resource("v1", "events", "Event"),
    Resource("v1", "resourcequotas", "ResourceQuota"),
    Resource("v1", "limitranges", "LimitRange"),
    Resource("v1", "serviceaccounts", "ServiceAccount"),
    Resource("v1", "namespaces", "Namespace", namespaced=False),
    Resource("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy"),
    Resource("node.k8s.io/v1", "runtimeclasses", "RuntimeClass", namespaced=False),
    Resource("rbac.authorization.k8s.io/v1", "roles", "Role"),
    Resource("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding"),
)
_BY_PLURAL = {r.plural: r for r in RESOURCES}


def status_doc(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``metav1.Status`` of failure, as the apiserver sends it."""
    doc: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        doc["details"] = details
    return doc


class ApiRefusal(Exception):
    """An apiserver answer other than success: HTTP status and a ``metav1.Status``."""

    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.status = status_doc(code, reason, message, details)

    @classmethod
    def not_found(cls, plural: str, name: str) -> ApiRefusal:
        return cls(404, "NotFound", f'{plural} "{name}" not found', name=name, kind=plural)


class Node:
    """Runs the pods the control plane admits.  Calls come from the server's loop thread."""

    def start(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        """Begin running ``pod``; report progress with :meth:`ClusterState.set_pod_status`."""

    def stop(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        """Stop and forget ``pod`` (it was deleted); must be idempotent."""

    def exec_argv(self, pod: dict[str, Any], container: str, argv: list[str]) -> list[str] | None:
        """The host argv that runs ``argv`` in the pod's container, or ``None`` if it is not running."""
        return None

    def log_argv(
        self, pod: dict[str, Any], container: str, *, follow: bool, timestamps: bool, since: str | None
    ) -> list[str] | None:
        """The host argv that prints the container's log, or ``None`` if it never started."""
        return None

    def updated(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        """``pod``'s metadata changed (a patch): refresh what the node derives from it."""

    def close(self) -> None:
        """Stop everything."""


class NullNode(Node):
    """Marks every admitted pod Running (images in ``missing_images`` fail to pull)."""

    def __init__(self, missing_images: Iterable[str] = ()) -> None:
        self.missing_images = set(missing_images)
        self._count = 0

    def start(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        cluster.add_event(ns, name, "Normal", "Scheduled", f"Successfully assigned {ns}/{name} to node-1")
        if container.get("image") in self.missing_images:
            cluster.add_event(ns, name, "Warning", "Failed", f'Failed to pull image "{container["image"]}"')
            cluster.set_pod_status(
                ns,
                name,
                phase="Pending",
                waiting=("ImagePullBackOff", f'Back-off pulling image "{container["image"]}"'),
            )
            return
        self._count += 1
        address = f"10.244.{self._count // 250 % 250}.{self._count % 250 + 2}"
        cluster.set_pod_status(ns, name, phase="Running", running=True, pod_ip=address)


@dataclass
class _Watch:
    resource: Resource
    namespace: str | None
    selector: Callable[[dict[str, Any]], bool]
    queue: asyncio.Queue[dict[str, Any] | None]


@dataclass
class ClusterState:
    """The objects of the double and its admission rules.

    Attributes:
        node: what runs admitted pods.
        version: the Kubernetes minor whose schemas validate ``Strict`` writes.
        denied: ``(verb, plural)`` pairs the token may not do (an RBAC double),
            e.g. ``{("create", "pods")}``; ``("create", "pods/exec")`` refuses exec.
    """

    node: Node = field(default_factory=NullNode)
    version: str = "1.33"
    denied: set[tuple[str, str]] = field(default_factory=set)
    objects: dict[tuple[str, str | None, str], dict[str, Any]] = field(default_factory=dict)
    _rv: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _watches: list[_Watch] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    loop: asyncio.AbstractEventLoop | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)
    """Every request as ``(method, path)``, for tests that count API calls."""
    authorized: list[tuple[str, str, str | None]] = field(default_factory=list)
    """Every ``(verb, resource, namespace)`` the API was asked to authorize (exec included),
    for checking a Role against what a client really does."""
    apiserver: tuple[str, int] | None = None
    """The apiserver's address as pods see it (the ``kubernetes`` Service); set by ``FakeKubeAPI``."""

    # ------------------------------------------------------------------ objects

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self.objects.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (p, ns, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][2])
                if p == plural and (namespace is None or ns == namespace)
            ]

    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as is (tests use this to seed namespaces, classes, quotas)."""
        resource = _BY_PLURAL[plural]
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace") if resource.namespaced else None
        with self._lock:
            key = (plural, ns, meta["name"])
            kind = "MODIFIED" if key in self.objects else "ADDED"
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            meta["resourceVersion"] = str(next(self._rv))
            obj.setdefault("apiVersion", resource.api_version)
            obj.setdefault("kind", resource.kind)
            self.objects[key] = obj
            self._notify(resource, kind, obj)
            return copy.deepcopy(obj)

    def remove(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        resource = _BY_PLURAL[plural]
        with self._lock:
            obj = self.objects.pop((plural, namespace, name), None)
            if obj is None:
                return None
            obj["metadata"]["resourceVersion"] = str(next(self._rv))
            self._notify(resource, "DELETED", obj)
            if plural == "pods":
                self.node.stop(self, obj)
                self._collect(obj["metadata"]["uid"])
            return obj

    def _collect(self, owner_uid: str) -> None:
        """The garbage collector: objects owned by a deleted object go with it."""
        for (plural, ns, name), obj in list(self.objects.items()):
            refs = obj.get("metadata", {}).get("ownerReferences") or []
            if any(r.get("uid") == owner_uid for r in refs):
                self.remove(plural, ns, name)

    def add_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        self.put(
            "namespaces",
            {"metadata": {"name": name, "labels": dict(labels or {})}, "status": {"phase": "Active"}},
        )

    def add_runtime_class(self, name: str, handler: str) -> None:
        self.put("runtimeclasses", {"metadata": {"name": name}, "handler": handler})

    def add_event(self, namespace: str, pod: str, type_: str, reason: str, message: str) -> None:
        self.put(
            "events",
            {
                "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
                "type": type_,
                "reason": reason,
                "message": message,
                "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )

    def set_pod_status(
        self,
        namespace: str,
        name: str,
        *,
        phase: str,
        reason: str | None = None,
        message: str | None = None,
        running: bool = False,
        waiting: tuple[str, str] | None = None,
        terminated: tuple[str, int] | None = None,
        pod_ip: str | None = None,
    ) -> None:
        """The node reports a pod's state (thread-safe; ignored for a deleted pod).

        ``pod_ip`` once the pod has an address; it is kept by later reports.
        """
        with self._lock:
            pod = self.objects.get(("pods", namespace, name))
            if pod is None:
                return
            container = pod["spec"]["containers"][0]
            state: dict[str, Any] = {}
            if running:
                state = {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
            elif waiting:
                state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
            elif terminated:
                state = {"terminated": {"reason": terminated[0], "exitCode": terminated[1]}}
            status: dict[str, Any] = {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container.get("image"),
                        "ready": running,
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            }
            if reason:
                status["reason"] = reason
            if message:
                status["message"] = message
            address = pod_ip or (pod.get("status") or {}).get("podIP")
            if address:
                status["podIP"] = address
                status["podIPs"] = [{"ip": address}]
            pod["status"] = status
            self.put("pods", pod)

    # ------------------------------------------------------------------ watches

    def _notify(self, resource: Resource, kind: str, obj: dict[str, Any]) -> None:
        if self.loop is None:
            return
        ns = obj.get("metadata", {}).get("namespace")
        for w in list(self._watches):
            if w.resource is resource and (w.namespace is None or w.namespace == ns) and w.selector(obj):
                event = {"type": kind, "object": copy.deepcopy(obj)}
                self.loop.call_soon_threadsafe(w.queue.put_nowait, event)

    def watch(
        self, resource: Resource, namespace: str | None, selector: Callable[[dict[str, Any]], bool]
    ) -> _Watch:
        w = _Watch(resource, namespace, selector, asyncio.Queue())
        with self._lock:
            self._watches.append(w)
        return w

    def unwatch(self, w: _Watch) -> None:
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    # ------------------------------------------------------------------ admission

    def create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any], strict: bool
    ) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiRefusal(400, "BadRequest", "the object has no metadata")
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        if resource.namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise ApiRefusal(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent",
                )
            meta["namespace"] = namespace
            if self.get("namespaces", None, namespace or "") is None:
                raise ApiRefusal(
                    404, "NotFound", f'namespaces "{namespace}" not found', name=namespace, kind="namespaces"
                )
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise ApiRefusal(422, "Invalid", f"{resource.kind} is invalid: metadata.name: Required value")
            meta["name"] = prefix + uuid.uuid4().hex[:5]
        name = meta["name"]
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", name):
            raise ApiRefusal(
                422, "Invalid", f'{resource.kind} "{name}" is invalid: metadata.name: Invalid value'
            )
        if self.get(resource.plural, namespace if resource.namespaced else None, name) is not None:
            raise ApiRefusal(
                409,
                "AlreadyExists",
                f'{resource.plural} "{name}" already exists',
                name=name,
                kind=resource.plural,
            )
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        if strict:
            self._validate(obj)
        if resource.plural == "pods":
            self._admit_pod(namespace or "", obj)
            obj["status"] = {"phase": "Pending"}
        stored = self.put(resource.plural, obj)
        if resource.plural == "pods":
            self.node.start(self, copy.deepcopy(stored))
        return stored

    def _validate(self, obj: dict[str, Any]) -> None:
        try:
            kubernetes_validate: Any = importlib.import_module("kubernetes_validate")
        except ImportError:  # pragma: no cover - a test dependency
            return
        try:
            kubernetes_validate.validate(obj, self.version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise ApiRefusal(400, "BadRequest", f"strict decoding error: {str(exc)[:400]}") from None

    def _admit_pod(self, namespace: str, pod: dict[str, Any]) -> None:
        spec = pod.get("spec") or {}
        name = pod["metadata"]["name"]
        rc = spec.get("runtimeClassName")
        if rc and self.get("runtimeclasses", None, rc) is None:
            raise ApiRefusal(403, "Forbidden", f'pod rejected: RuntimeClass "{rc}" not found')
        ns_obj = self.get("namespaces", None, namespace) or {}
        labels = ns_obj.get("metadata", {}).get("labels") or {}
        if labels.get("pod-security.kubernetes.io/enforce") == "restricted":
            problems = restricted_violations(pod)
            if problems:
                raise ApiRefusal(
                    403,
                    "Forbidden",
                    f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": '
                    + "; ".join(problems),
                    name=name,
                    kind="pods",
                )
        for quota in self.list("resourcequotas", namespace):
            hard = quota.get("spec", {}).get("hard") or {}
            self._check_quota(namespace, name, quota["metadata"]["name"], hard, pod)

    def _check_quota(
        self, namespace: str, name: str, quota: str, hard: Mapping[str, str], pod: dict[str, Any]
    ) -> None:
        pods = [
            p
            for p in self.list("pods", namespace)
            if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        ]

        def total(key: str, objs: list[dict[str, Any]]) -> float:
            out = 0.0
            for p in objs:
                for c in p.get("spec", {}).get("containers", []):
                    value = (c.get("resources") or {}).get("limits", {}).get(key)
                    out += parse_quantity(value) if value is not None else 0.0
            return out

        for key, limit in hard.items():
            if key in ("pods", "count/pods"):
                used, asked = float(len(pods)), 1.0
            elif key in ("limits.memory", "limits.cpu"):
                resource = key.split(".", 1)[1]
                used, asked = total(resource, pods), total(resource, [pod])
                if asked == 0:
                    raise ApiRefusal(
                        403,
                        "Forbidden",
                        f'pods "{name}" is forbidden: failed quota: {quota}: must specify {key}',
                        name=name,
                        kind="pods",
                    )
            else:
                continue
            if used + asked > parse_quantity(limit):
                raise ApiRefusal(
                    403,
                    "Forbidden",
                    f'pods "{name}" is forbidden: exceeded quota: {quota}, requested: {key}={asked:g}, '
                    f"used: {key}={used:g}, limited: {key}={limit}",
                    name=name,
                    kind="pods",
                )

    def patch(
        self, resource: Resource, namespace: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386), with the Pod update rules the backend meets."""
        current = self.get(resource.plural, namespace, name)
        if current is None:
            raise ApiRefusal.not_found(resource.plural, name)
        updated = merge_patch(current, patch)
        if resource.plural == "pods":
            old = current.get("spec", {}).get("activeDeadlineSeconds")
            new = updated.get("spec", {}).get("activeDeadlineSeconds")
            if old is not None and (new is None or new > old):
                raise ApiRefusal(
                    422,
                    "Invalid",
                    f'Pod "{name}" is invalid: spec.activeDeadlineSeconds: Invalid value: {new}: '
                    "must be less than or equal to previous value",
                    name=name,
                    kind="Pod",
                    causes=[{"reason": "FieldValueInvalid", "field": "spec.activeDeadlineSeconds"}],
                )
            for key in ("containers", "securityContext", "runtimeClassName", "volumes"):
                if updated.get("spec", {}).get(key) != current.get("spec", {}).get(key):
                    raise ApiRefusal(
                        422,
                        "Invalid",
                        f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change {key}',
                    )
        stored = self.put(resource.plural, updated)
        if resource.plural == "pods":
            self.node.updated(self, stored)
        return stored


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    None: 1.0,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}


def parse_quantity(value: object) -> float:
    """A Kubernetes quantity (``512Mi``, ``500m``, ``1``) as a number."""
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ApiRefusal(422, "Invalid", f"quantities must match the regular expression: {value!r}")
    number, suffix = m.groups()
    if suffix and suffix[0] in "eE":
        return float(number + suffix)
    return float(number) * _SUFFIX[suffix]


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """The Pod Security ``restricted`` checks a real apiserver makes (the subset pods of ours can break)."""
    spec = pod.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    out: list[str] = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            out.append(f"{flag}=true")
    for volume in spec.get("volumes") or []:
        allowed = {
            "emptyDir",
            "ephemeral",
            "secret",
            "configMap",
            "downwardAPI",
            "projected",
            "persistentVolumeClaim",
        }
        kinds = set(volume) - {"name"}
        if not kinds <= allowed:
            out.append(
                f'restricted volume types (volume "{volume.get("name")}" uses '
                f"{', '.join(sorted(kinds - allowed))})"
            )
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        sc = c.get("securityContext") or {}
        cname = c.get("name")
        if sc.get("privileged"):
            out.append(f'privileged (container "{cname}" must not set securityContext.privileged=true)')
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(
                f'allowPrivilegeEscalation != false (container "{cname}" must set '
                "allowPrivilegeEscalation=false)"
            )
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(
                f'unrestricted capabilities (container "{cname}" must set '
                'securityContext.capabilities.drop=["ALL"])'
            )
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f'unrestricted capabilities (container "{cname}" must not include added capabilities)')
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(
                f'runAsNonRoot != true (container "{cname}" must set securityContext.runAsNonRoot=true)'
            )
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f'runAsUser=0 (container "{cname}" must not set runAsUser=0)')
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(
                f'seccompProfile (container "{cname}" must set securityContext.seccompProfile.type to '
                '"RuntimeDefault" or "Localhost")'
            )
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f'hostPort (container "{cname}" uses hostPort {port["hostPort"]})')
    return out


def label_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    """Equality-based label selectors (``a=b,c!=d,e``), as the backend sends them."""
    if not text:
        return lambda obj: True
    terms: list[tuple[str, str, str | None]] = []
    for part in text.split(","):
        part = part.strip()
        if "!=" in part:
            k, v = part.split("!=", 1)
            terms.append(("!=", k.strip(), v.strip()))
        elif "==" in part or "=" in part:
            k, v = re.split("==?", part, maxsplit=1)
            terms.append(("=", k.strip(), v.strip()))
        elif part.startswith("!"):
            terms.append(("!", part[1:].strip(), None))
        else:
            terms.append(("exists", part, None))

    def match(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        for op, k, v in terms:
            if op == "=" and labels.get(k) != v:
                return False
            if op == "!=" and labels.get(k) == v:
                return False
            if op == "!" and k in labels:
                return False
            if op == "exists" and k not in labels:
                return False
        return True

    return match


def field_selector(text: str | None) -> Callable[[dict[str, Any]], bool]:
    """The field selectors the backend sends: ``metadata.name=X``, ``involvedObject.name=X``."""
    if not text:
        return lambda obj: True
    terms = []
    for part in text.split(","):
        k, _, v = part.partition("=")
        terms.append((k.strip().split("."), v.strip()))

    def match(obj: dict[str, Any]) -> bool:
        for keys, want in terms:
            value: Any = obj
            for k in keys:
                value = value.get(k) if isinstance(value, dict) else None
            if str(value) != want:
                return False
        return True

    return match


def status_json(refusal: ApiRefusal) -> bytes:
    return json.dumps(refusal.status).encode()


# ---------------------------------------------------------------------- HTTP


def add_routes(app: Any, state: ClusterState, *, token: str | None = None) -> None:
    """Serve ``state``'s REST API on an ``aiohttp.web.Application``.

    ``token``: the bearer token every request must carry (401 otherwise).
    """
    from aiohttp import web

    def respond(code: int, body: object) -> Any:
        return web.Response(status=code, body=json.dumps(body).encode(), content_type="application/json")

    def refuse(refusal: ApiRefusal) -> Any:
        return web.Response(status=refusal.code, body=status_json(refusal), content_type="application/json")

    def authorize(request: Any, verb: str, plural: str) -> None:
        state.authorized.append((verb, plural, request.match_info.get("ns")))
        if token is not None and request.headers.get("Authorization") != f"Bearer {token}":
            raise ApiRefusal(401, "Unauthorized", "Unauthorized")
        if (verb, plural) in state.denied:
            ns = request.match_info.get("ns")
            where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
            group = plural.split("/")[0]
            raise ApiRefusal(
                403,
                "Forbidden",
                f'{group} is forbidden: User "test" cannot {verb} resource "{plural}" in API group ""{where}',
                kind=group,
            )

    def resource_of(request: Any) -> Resource:
        plural = request.match_info["plural"]
        resource = _BY_PLURAL.get(plural)
        gv = request.match_info.get("gv", "v1")
        if resource is None or resource.group_version != gv:
            raise ApiRefusal(
                404, "NotFound", f"the server could not find the requested resource ({gv} {plural})"
            )
        return resource

    async def collection(request: Any) -> Any:
        state.calls.append((request.method, request.path))
        try:
            resource = resource_of(request)
            ns = request.match_info.get("ns")
            if request.method == "POST":
                authorize(request, "create", resource.plural)
                body = await request.json()
                strict = request.query.get("fieldValidation") == "Strict"
                return respond(201, state.create(resource, ns, body, strict))
            watching = request.query.get("watch") in ("1", "true")
            authorize(request, "watch" if watching else "list", resource.plural)
            selector = label_selector(request.query.get("labelSelector"))
            fields = field_selector(request.query.get("fieldSelector"))

            def chosen(obj: dict[str, Any]) -> bool:
                return selector(obj) and fields(obj)

            if watching:
                return await watch(request, resource, ns, chosen)
            items = [o for o in state.list(resource.plural, ns) if chosen(o)]
            return respond(
                200,
                {
                    "kind": resource.kind + "List",
                    "apiVersion": resource.api_version,
                    "metadata": {"resourceVersion": str(next(state._rv))},
                    "items": items,
                },
            )
        except ApiRefusal as refusal:
            return refuse(refusal)

    async def watch(
        request: Any, resource: Resource, ns: str | None, chosen: Callable[[dict[str, Any]], bool]
    ) -> Any:
        since = int(request.query.get("resourceVersion") or 0)
        timeout = min(float(request.query.get("timeoutSeconds") or 1800), 1800.0)
        w = state.watch(resource, ns, chosen)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            # What changed since the resourceVersion asked for (a list, then a watch).
            for obj in state.list(resource.plural, ns):
                if chosen(obj) and int(obj["metadata"]["resourceVersion"]) > since:
                    await response.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            while True:
                left = end - loop.time()
                if left <= 0:
                    break
                try:
                    event = await asyncio.wait_for(w.queue.get(), left)
                except asyncio.TimeoutError:
                    break
                if event is None:
                    break
                if int(event["object"]["metadata"]["resourceVersion"]) <= since:
                    continue
                await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            state.unwatch(w)
        return response

    async def item(request: Any) -> Any:
        state.calls.append((request.method, request.path))
        try:
            resource = resource_of(request)
            ns = request.match_info.get("ns")
            name = request.match_info["name"]
            if request.method == "GET":
                authorize(request, "get", resource.plural)
                obj = state.get(resource.plural, ns, name)
                if obj is None:
                    raise ApiRefusal.not_found(resource.plural, name)
                return respond(200, obj)
            if request.method == "DELETE":
                authorize(request, "delete", resource.plural)
                obj = state.remove(resource.plural, ns, name)
                if obj is None:
                    raise ApiRefusal.not_found(resource.plural, name)
                return respond(200, obj)
            if request.method == "PATCH":
                authorize(request, "patch", resource.plural)
                if request.content_type != "application/merge-patch+json":
                    raise ApiRefusal(
                        415,
                        "UnsupportedMediaType",
                        f"the double takes merge patches, not {request.content_type}",
                    )
                return respond(200, state.patch(resource, ns, name, await request.json()))
            raise ApiRefusal(405, "MethodNotAllowed", f"{request.method} is not allowed here")
        except ApiRefusal as refusal:
            return refuse(refusal)

    for prefix in ("/api/{gv:v1}", "/apis/{group}/{version}"):
        app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}", _gv(collection))
        app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}/{name}", _gv(item))
        app.router.add_route("*", prefix + "/{plural}", _gv(collection))
        app.router.add_route("*", prefix + "/{plural}/{name}", _gv(item))


def _gv(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
    async def wrapped(request: Any) -> Any:
        info = request.match_info
        if "group" in info:
            info["gv"] = f"{info['group']}/{info['version']}"
        return await handler(request)

    return wrapped
