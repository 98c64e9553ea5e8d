"""What the cluster said, as errors of the one tree that say why and how to fix it.

Pure functions over the JSON the apiserver sends (a ``metav1.Status`` for a
refused request; a Pod's ``status`` and its Events while it starts), so the
same mapping serves the control plane, the exec channel and the tests.  All
of it is untrusted input: bodies are cut before parsing, messages are cut
before they reach an error, and a shape we do not know is never a ``KeyError``.

Every :class:`~agentnest.errors.BackendError` raised from here carries a
``reason`` code (``runtime_class``, ``quota``, ``pod_security``, ``rbac``,
``namespace``, ``capacity``, ``image``, ``auth``, ``throttled``, ``apiserver``,
``conflict``) so callers such as the manager can branch without parsing text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import (
    AgentNestError,
    BackendError,
    ConfigurationError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
)

__all__ = ["PodVerdict", "api_error", "parse_status", "pod_verdict"]

#: A Status is a few hundred bytes; a body past this is cut before parsing.
MAX_BODY = 64 << 10
#: The longest message of the cluster's that reaches an error.
MAX_MESSAGE = 600

_SETUP = "agentnest kubernetes setup NAMESPACE"


def _cut(text: object, limit: int = MAX_MESSAGE) -> str:
    s = text if isinstance(text, str) else "" if text is None else str(text)
    s = "".join(c if c.isprintable() else " " for c in s)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def parse_status(body: bytes | str | None) -> dict[str, Any]:
    """A ``metav1.Status`` from a response body, or ``{}`` when it is not one (never raises)."""
    if body is None:
        return {}
    raw = body.encode("utf-8", "replace") if isinstance(body, str) else body
    if len(raw) > MAX_BODY:
        return {"message": _cut(raw[: MAX_MESSAGE + 1].decode("utf-8", "replace"))}
    try:
        doc = json.loads(raw)
    except ValueError:
        text = raw.decode("utf-8", "replace").strip()
        return {"message": _cut(text)} if text else {}
    return doc if isinstance(doc, dict) else {}


def _with_reason(error: BackendError, reason: str) -> BackendError:
    error.reason = reason
    return error


def api_error(
    status: int, body: bytes | str | None, *, action: str, namespace: str | None = None
) -> AgentNestError:
    """The error for an apiserver's refusal of ``action`` (e.g. ``"create pod agentnest-ab12"``).

    ``status`` is the HTTP status; ``body`` the response (a ``metav1.Status``
    as JSON, or anything else: it is cut and shown).
    """
    doc = parse_status(body)
    message = _cut(doc.get("message")) or f"HTTP {status}"
    kind_reason = str(doc.get("reason") or "")
    details = doc.get("details") if isinstance(doc.get("details"), Mapping) else {}
    assert isinstance(details, Mapping)
    kind = str(details.get("kind") or "")
    where = f" in namespace {namespace!r}" if namespace else ""
    said = f"the cluster refused to {action}{where}: {message}"
    low = message.lower()
    if status == 401:
        return _with_reason(
            RuntimeNotAvailableError(
                f"{said}; the kubeconfig's credentials were not accepted (expired token or certificate?): "
                "check them with `kubectl auth whoami`"
            ),
            "auth",
        )
    if status == 403:
        if "runtimeclass" in low and "not found" in low:
            return _with_reason(
                RuntimeNotAvailableError(
                    f"{said}; the cluster has no such RuntimeClass: install gVisor's "
                    "(see docs/kubernetes.md) or choose another with KubernetesSpec(runtime_class_name=...), "
                    "None for the cluster's default (a weaker boundary)"
                ),
                "runtime_class",
            )
        if "exceeded quota" in low:
            return _with_reason(
                BackendError(
                    f"{said}; the namespace's ResourceQuota is full: wait for sandboxes to end, "
                    "ask for less, or raise the quota"
                ),
                "quota",
            )
        if "podsecurity" in low or "pod security" in low:
            return _with_reason(
                BackendError(
                    f"{said}; the namespace's Pod Security level refuses this pod: AgentNest's defaults meet "
                    "'restricted', so a profile or spec loosened something (runtime, user, seccomp)"
                ),
                "pod_security",
            )
        return _with_reason(
            RuntimeNotAvailableError(
                f"{said}; the credentials lack a permission AgentNest needs there: "
                f"run `{_SETUP}` (it creates the Role and binding; docs/kubernetes.md lists them)"
            ),
            "rbac",
        )
    if status == 404:
        if kind == "namespaces" or (namespace and f'namespaces "{namespace}" not found' in message):
            return _with_reason(
                RuntimeNotAvailableError(f"{said}; create it with `{_SETUP}`"),
                "namespace",
            )
        if kind == "pods" or "pods" in low:
            return SandboxDestroyedError(
                f"{said}; the sandbox's pod is gone (deleted, evicted or past its deadline)"
            )
        return _with_reason(BackendError(f"{said}; the object is gone"), "not_found")
    if status == 409:
        return _with_reason(BackendError(f"{said}; an object of that name exists already"), "conflict")
    if status in (400, 422) or kind_reason in ("Invalid", "BadRequest"):
        causes = details.get("causes") if isinstance(details.get("causes"), list) else []
        assert isinstance(causes, list)
        fields = [
            f"{_cut(c.get('field'), 120)}: {_cut(c.get('message'), 200)}"
            for c in causes[:10]
            if isinstance(c, Mapping)
        ]
        extra = f" ({'; '.join(fields)})" if fields else ""
        return ConfigurationError(
            f"{said}{extra}; the API server of this cluster does not accept a setting AgentNest sent: "
            "check the spec's values against the cluster's version "
            "(`agentnest kubernetes manifest` prints them)"
        )
    if status == 429:
        return _with_reason(
            BackendError(
                f"{said}; the API server is throttling requests: retry later or lower the rate of creates"
            ),
            "throttled",
        )
    return _with_reason(
        RuntimeNotAvailableError(
            f"{said}; the API server failed (HTTP {status}): retry, or check its health"
        ),
        "apiserver",
    )


@dataclass(frozen=True, slots=True)
class PodVerdict:
    """How a starting or running pod stands, read from its status and Events."""

    error: AgentNestError | None
    """What to raise, or ``None`` when nothing is wrong (yet)."""
    final: bool
    """The error will not clear by waiting: raise it now.  When ``False``, the
    error (if any) is the reason to give if the wait for the pod runs out."""


_IMAGE_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_RUNTIME_MISSING = re.compile(r"no runtime for|runtimehandler|RuntimeHandler|handler .* not", re.IGNORECASE)


def pod_verdict(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()) -> PodVerdict:
    """Judge a pod (its JSON, as the API sends it) and its Events, newest last."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name = _cut(meta.get("name"), 100) or "?"
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    phase = status.get("phase")
    reason = _cut(status.get("reason"), 100)
    message = _cut(status.get("message"))
    if phase in ("Failed", "Succeeded") or meta.get("deletionTimestamp"):
        if reason == "DeadlineExceeded":
            why = "it reached its deadline (activeDeadlineSeconds)"
        elif reason == "Evicted":
            why = f"the node evicted it: {message}"
        elif meta.get("deletionTimestamp"):
            why = "it is being deleted"
        else:
            why = _terminated(status) or f"its pod ended ({phase}{': ' + message if message else ''})"
        return PodVerdict(SandboxDestroyedError(f"sandbox pod {name}: {why}"), True)
    for cs in _container_statuses(status):
        state = cs.get("state") if isinstance(cs.get("state"), Mapping) else {}
        assert isinstance(state, Mapping)
        waiting = state.get("waiting") if isinstance(state.get("waiting"), Mapping) else None
        if not waiting:
            continue
        w_reason = str(waiting.get("reason") or "")
        w_message = _cut(waiting.get("message"))
        image = _cut(cs.get("image"), 200)
        if w_reason in _IMAGE_WAITING:
            return PodVerdict(
                _with_reason(
                    ImageNotFoundError(
                        f"sandbox pod {name}: the node cannot pull image {image!r} "
                        f"({w_reason}: {w_message}); push it to a registry the nodes can reach, "
                        "add KubernetesSpec(image_pull_secrets=...) if it is private, "
                        "or pre-load it and use image_pull_policy='Never'"
                    ),
                    "image",
                ),
                w_reason != "ErrImagePull",  # a first ErrImagePull may be a registry's hiccup
            )
        if w_reason == "CreateContainerConfigError":
            return PodVerdict(
                _with_reason(
                    BackendError(
                        f"sandbox pod {name}: the kubelet cannot configure the container: {w_message}"
                    ),
                    "container_config",
                ),
                True,
            )
        if w_reason in ("CreateContainerError", "RunContainerError"):
            return PodVerdict(
                _with_reason(
                    RuntimeNotAvailableError(
                        f"sandbox pod {name}: the node's runtime cannot start the container ({w_reason}: "
                        f"{w_message}); for a Localhost seccomp profile, install it on every node"
                    ),
                    "runtime",
                ),
                True,
            )
    for event in reversed(list(events)[-50:]):
        if not isinstance(event, Mapping) or event.get("type") != "Warning":
            continue
        e_reason = str(event.get("reason") or "")
        e_message = _cut(event.get("message"))
        if e_reason == "FailedCreatePodSandBox":
            final = bool(_RUNTIME_MISSING.search(e_message))
            fix = (
                "the node has no handler for the pod's RuntimeClass: install gVisor on the nodes "
                "(or a nodeSelector/scheduling on the RuntimeClass that picks nodes that have it)"
                if final
                else "the node could not set up the pod's sandbox"
            )
            return PodVerdict(
                _with_reason(
                    RuntimeNotAvailableError(f"sandbox pod {name}: {fix}: {e_message}"), "runtime_class"
                ),
                final,
            )
        if e_reason == "FailedScheduling":
            return PodVerdict(
                _with_reason(
                    BackendError(
                        f"sandbox pod {name} cannot be scheduled: {e_message}; free capacity, ask for less "
                        "memory/CPU, or check the spec's node_selector and tolerations"
                    ),
                    "capacity",
                ),
                False,  # the autoscaler may add a node: the caller's bounded wait decides
            )
        if e_reason == "FailedMount":
            return PodVerdict(
                _with_reason(
                    BackendError(f"sandbox pod {name}: a volume cannot be mounted: {e_message}"), "volume"
                ),
                False,
            )
    return PodVerdict(None, False)


def _container_statuses(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for key in ("initContainerStatuses", "containerStatuses"):
        items = status.get(key)
        if isinstance(items, list):
            out.extend(i for i in items[:20] if isinstance(i, Mapping))
    return out


def _terminated(status: Mapping[str, Any]) -> str:
    for cs in _container_statuses(status):
        state = cs.get("state") if isinstance(cs.get("state"), Mapping) else {}
        assert isinstance(state, Mapping)
        term = state.get("terminated")
        if isinstance(term, Mapping):
            why = _cut(term.get("reason"), 100)
            code = term.get("exitCode")
            if why == "OOMKilled":
                return "its main process was killed for memory (OOMKilled): give it more memory"
            return f"its main process exited ({why or 'terminated'}, exit code {code})"
    return ""
