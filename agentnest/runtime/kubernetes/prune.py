"""Remove what expired or broken sandboxes left in a cluster's namespaces.

The kubelet stops a pod at ``activeDeadlineSeconds`` even when no AgentNest
process is left, but the stopped Pod stays (``Failed``, reason
``DeadlineExceeded``), and an object whose Pod never got created (a create
that died between the NetworkPolicy and the Pod) has no owner to be collected
with.  Here, in each namespace, only objects labelled
``app.kubernetes.io/managed-by=agentnest`` are considered:

* a Pod whose ``agentnest.io/deadline`` annotation has passed, or that has
  ended (``Succeeded``/``Failed``: nothing runs in it any more);
* with ``orphans``: a Pod whose creating process (``agentnest.io/owner-process``,
  ``host:pid``) ran on this host and has exited;
* a Secret or NetworkPolicy whose sandbox has no Pod left (its owner Pod
  would have collected it);
* with ``owners``: a Pod whose creating process is one of them and not known to
  be alive here (the manager's servers that stopped answering: their sandboxes
  are reclaimed by the leader, :meth:`KubernetesBackend.reclaim`);
* with ``everything``: every one of them, running sandboxes included.

:func:`managed_namespaces` finds the namespaces to look in: those
``agentnest kubernetes setup`` labelled as AgentNest's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ...errors import AgentNestError
from ..owner import owner_alive
from .api import KubeApi
from .manifests import DEADLINE, MANAGED_BY, OWNER_PROCESS, SANDBOX_ID

__all__ = ["PruneResult", "Pruned", "managed_namespaces", "prune"]

_SELECTOR = f"{MANAGED_BY}=agentnest"
_KINDS = ("Pod", "Secret", "NetworkPolicy")


@dataclass(frozen=True)
class Pruned:
    namespace: str
    kind: str
    name: str
    sandbox: str | None
    reason: str
    deadline: float | None


@dataclass
class PruneResult:
    removed: list[Pruned] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors


def _deadline(obj: dict[str, object]) -> float | None:
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    raw = annotations.get(DEADLINE) if isinstance(annotations, dict) else None
    try:
        return float(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def managed_namespaces(api: KubeApi) -> list[str]:
    """The namespaces labelled ``app.kubernetes.io/managed-by=agentnest``, by name.

    Raises:
        BackendError: listing namespaces is not allowed (a cluster-scoped right).
    """
    names = [
        str((ns.get("metadata") or {}).get("name") or "") for ns in api.find("Namespace", labels=_SELECTOR)
    ]
    return sorted(n for n in names if n)


def _owner_process(pod: dict[str, object]) -> str | None:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    value = annotations.get(OWNER_PROCESS) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) else None


def _owner_gone(pod: dict[str, object]) -> bool:
    value = _owner_process(pod)
    return value is not None and owner_alive(value) is False


def _owner_silent(pod: dict[str, object], owners: frozenset[str]) -> bool:
    # Another host's process cannot be checked from here (None): the database's verdict that
    # its server stopped answering stands.  One alive on this host (a restart reusing the pid
    # in the same container) keeps its Pods.
    value = _owner_process(pod)
    return value is not None and value in owners and owner_alive(value) is not True


def prune(
    apis: Iterable[KubeApi],
    *,
    now: float,
    dry_run: bool = False,
    everything: bool = False,
    orphans: bool = False,
    owners: frozenset[str] = frozenset(),
) -> PruneResult:
    """Prune each namespace ``apis`` covers (one :class:`KubeApi` per namespace)."""
    result = PruneResult(dry_run=dry_run)
    for api in apis:
        try:
            found = {kind: api.find(kind, labels=_SELECTOR) for kind in _KINDS}
        except AgentNestError as exc:
            result.errors.append(f"namespace {api.namespace}: {exc}")
            continue
        live_sandboxes: set[str] = set()
        doomed: list[Pruned] = []
        for pod in found["Pod"]:
            meta = pod.get("metadata") or {}
            sandbox = (meta.get("labels") or {}).get(SANDBOX_ID)
            deadline = _deadline(pod)
            phase = (pod.get("status") or {}).get("phase")
            if everything:
                reason = "all"
            elif phase in ("Succeeded", "Failed"):
                reason = f"ended ({(pod.get('status') or {}).get('reason') or phase})"
            elif deadline is not None and deadline <= now:
                reason = "expired"
            elif orphans and _owner_gone(pod):
                reason = "owner gone"
            elif owners and _owner_silent(pod, owners):
                reason = "its server stopped answering"
            else:
                if sandbox:
                    live_sandboxes.add(sandbox)
                continue
            doomed.append(Pruned(api.namespace, "Pod", str(meta.get("name")), sandbox, reason, deadline))
        going = {d.sandbox for d in doomed}
        for kind in ("Secret", "NetworkPolicy"):
            for obj in found[kind]:
                meta = obj.get("metadata") or {}
                sandbox = (meta.get("labels") or {}).get(SANDBOX_ID)
                if not everything and sandbox in live_sandboxes:
                    continue
                reason = "all" if everything else "its pod goes" if sandbox in going else "its pod is gone"
                doomed.append(Pruned(api.namespace, kind, str(meta.get("name")), sandbox, reason, None))
        for item in doomed:
            if not dry_run:
                try:
                    api.delete(item.kind, item.name)
                except AgentNestError as exc:
                    result.errors.append(f"{item.kind} {api.namespace}/{item.name}: {exc}")
                    continue
            result.removed.append(item)
    return result
