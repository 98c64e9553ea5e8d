"""``agentnest kubernetes setup NAMESPACE``: make (or bring up to date) a namespace for sandboxes.

Idempotent: each object of :func:`.manifests.setup_objects` is created, or,
when it exists already, merge-patched to what it should be (its labels, its
``spec``, a Role's ``rules``, a RoleBinding's ``subjects``), so a rerun with
other flags changes the quota instead of failing.  A RoleBinding whose
``roleRef`` differs cannot be changed (the apiserver forbids it): that is a
refusal naming the fix.  Then the RuntimeClass sandboxes will ask for is
looked up: a cluster without it gets pods that never start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import BackendError
from .api import KubeApi, covers

__all__ = ["SetupReport", "apply_setup"]

#: Top-level keys that are not the object's content.
_ENVELOPE = ("apiVersion", "kind", "metadata")


@dataclass(slots=True)
class SetupReport:
    """What :func:`apply_setup` did, one ``(verb, kind, name)`` per object."""

    actions: list[tuple[str, str, str]] = field(default_factory=list)
    runtime_class: str | None = None
    """The RuntimeClass checked (``None``: not asked)."""
    runtime_class_found: bool | None = None
    """``None`` when it could not be read (RBAC)."""
    runtime_class_problem: str = ""


def _desired(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that makes an existing object what ``obj`` says."""
    meta = obj.get("metadata") or {}
    patch: dict[str, Any] = {k: v for k, v in obj.items() if k not in _ENVELOPE}
    wanted_meta = {k: meta[k] for k in ("labels", "annotations") if k in meta}
    if wanted_meta:
        patch["metadata"] = wanted_meta
    return patch


def apply_setup(
    api: KubeApi, objects: Sequence[Mapping[str, Any]], *, runtime_class: str | None
) -> SetupReport:
    """Create or update ``objects`` in order, then check ``runtime_class``.

    Raises:
        BackendError / RuntimeNotAvailableError / ConfigurationError: the
            apiserver refused (RBAC, an invalid value, a changed roleRef),
            with its reason; objects before the refused one stay as written.
    """
    report = SetupReport(runtime_class=runtime_class)
    for obj in objects:
        kind, name = str(obj["kind"]), str(obj["metadata"]["name"])
        try:
            api.create(obj)
            report.actions.append(("created", kind, name))
            continue
        except BackendError as exc:
            if getattr(exc, "reason", None) != "conflict":
                raise
        current = api.get(kind, name) or {}
        ref = obj.get("roleRef")
        if ref is not None and current.get("roleRef") not in (None, ref):
            raise BackendError(
                f"RoleBinding {name} exists with roleRef {current.get('roleRef')!r:.200}, which cannot be "
                f"changed; delete it (`kubectl -n {api.namespace} delete rolebinding {name}`) and rerun"
            )
        patch = _desired(obj)
        if covers(patch, current):
            report.actions.append(("unchanged", kind, name))
            continue
        api.patch(kind, name, patch)
        report.actions.append(("updated", kind, name))
    if runtime_class is not None:
        try:
            found = api.get("RuntimeClass", runtime_class)
        except BackendError as exc:
            report.runtime_class_problem = str(exc)
        else:
            report.runtime_class_found = found is not None
            if found is None:
                report.runtime_class_problem = (
                    f"RuntimeClass {runtime_class!r} does not exist: sandbox pods asking for it will not "
                    "start. Install gVisor on the nodes and create the RuntimeClass (docs/kubernetes.md), "
                    "or run sandboxes with KubernetesSpec(runtime_class_name=None) on the default runtime"
                )
    return report
