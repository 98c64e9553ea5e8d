"""Reap expired AgentNest resources (containers, networks, volumes, workspaces) on a Docker engine.

Every resource AgentNest creates carries ``agentnest.managed=true``, its
owner (``host:pid``) and its deadline (see :mod:`.labels`).  The deadline
keeper stops a container at its deadline, but a stopped container, its
networks and volumes stay on the engine until someone removes them; after a
crash of the host process nobody will, so ``prune`` does.

An allowlisted sandbox also owns an egress proxy container
(``agentnest.role=proxy``) and an internal network
(``agentnest.role=egress-network``) with the same labels, so they are
reaped with it; and a proxy or network whose sandbox container is gone (a
crash between the two removals) is reaped too, deadline or not.  So is a
disk workspace in the storage pool whose sandbox has no container left.

Example::

    report = prune(get_backend("docker").api, dry_run=True)
    for resource in report.containers:
        print(resource.name, resource.reason)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import AgentNestError, BackendError
from .. import storage
from ..storage import StoragePool
from . import checkpoint, labels
from .engine import map_docker_errors

#: Why a resource was chosen, as ``PrunedResource.reason`` says it.
EXPIRED = "expired"
OWNER_GONE = "owner gone"
EVERYTHING = "all"
SANDBOX_GONE = "sandbox gone"
#: A proxy or egress network younger than this is never "sandbox gone": its
#: sandbox container may still be being created next to it.
SANDBOX_GONE_GRACE = 120.0
_PROXY_ROLES = ("proxy", "egress-network")


@dataclass(frozen=True, slots=True)
class PrunedResource:
    """One engine resource that was (or, in a dry run, would be) removed."""

    kind: str
    """``container``, ``network``, ``volume`` or ``workspace`` (a storage pool entry)."""
    id: str
    """The engine's id (the name, for volumes)."""
    name: str
    sandbox: str
    """The AgentNest sandbox id from the labels, or ``""``."""
    owner: str
    """``host:pid`` of the process that created it, or ``""``."""
    deadline: float | None
    """Epoch seconds from the deadline label; ``None`` if missing or invalid."""
    reason: str
    """``expired``, ``owner gone``, ``sandbox gone`` or ``all``."""


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What :func:`prune` removed (or would remove), and what it could not."""

    containers: tuple[PrunedResource, ...] = ()
    networks: tuple[PrunedResource, ...] = ()
    volumes: tuple[PrunedResource, ...] = ()
    errors: tuple[str, ...] = ()
    """One message per resource that could not be removed."""
    dry_run: bool = False
    workspaces: tuple[PrunedResource, ...] = ()
    """Disk workspaces (and host-side reader snapshots) of the storage pool."""

    @property
    def resources(self) -> tuple[PrunedResource, ...]:
        """Containers, then networks, then volumes, then workspaces."""
        return self.containers + self.networks + self.volumes + self.workspaces

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.errors


def prune(
    api: Any,
    *,
    now: float | None = None,
    dry_run: bool = False,
    orphans: bool = False,
    everything: bool = False,
    sandbox: str | None = None,
    pool: StoragePool | None = None,
    owners: Collection[str] | None = None,
) -> PruneReport:
    """Remove AgentNest's containers, networks and volumes that are due.

    A resource is due when its deadline has passed, or (``orphans=True``)
    when the process that created it ran on this host and has exited, or
    always with ``everything=True`` (running sandboxes included).  An egress
    proxy container or network whose sandbox container no longer exists is
    due as well (``sandbox gone``; after a grace period for sandboxes being
    created).  Resources without ``agentnest.managed=true`` are never
    touched.  Containers go
    first (forcefully, with their anonymous volumes), so that the networks
    and volumes they used are free when their turn comes.

    Args:
        api: a docker-py ``APIClient``.
        now: the current epoch time (for tests); defaults to ``time.time()``.
        dry_run: only report what would be removed.
        orphans: also remove resources whose owner process is gone.
        everything: remove every AgentNest resource.
        sandbox: only consider the resources of this sandbox id.
        owners: only consider the resources of these owners (``host:pid``).
        pool: the storage pool whose workspaces to reap: those of sandboxes
            with no container left (``sandbox gone``, after a grace period for
            sandboxes being created), and reader snapshots of exited processes.
            Then the pool's freed blocks go back to the host.

    Returns:
        A :class:`PruneReport`.  A resource another process removed at the
        same time counts as removed; any other failure is collected in
        ``errors`` instead of stopping the sweep.

    Raises:
        RuntimeNotAvailableError: the engine is not reachable.
        BackendError: the engine refused to list resources.
    """
    import docker.errors

    moment = time.time() if now is None else now
    selector = {"label": [f"{labels.MANAGED}=true"]}
    if sandbox is not None:
        selector["label"].append(f"{labels.SANDBOX}={sandbox}")

    def pick(kind: str, rid: str, name: str, tags: Mapping[str, str] | None) -> PrunedResource | None:
        tags = tags or {}
        deadline = _parse_deadline(tags.get(labels.DEADLINE))
        owner = tags.get(labels.OWNER, "")
        if owners is not None and owner not in owners:
            return None
        sid = tags.get(labels.SANDBOX, "")
        record = _record(sid) if sid and kind == "container" else None
        if record is not None:
            # Paused to disk: resumable by any process until its deadline, and
            # owned by whoever resumed it last (Sandbox.from_checkpoint).
            owner = str(record.get("owner") or owner)
        if everything:
            reason = EVERYTHING
        elif deadline is not None and deadline < moment:
            reason = EXPIRED
        elif orphans and owner and labels.owner_alive(owner) is False and not (record or {}).get("paused"):
            reason = OWNER_GONE
        else:
            return None
        return PrunedResource(kind, rid, name, tags.get(labels.SANDBOX, ""), owner, deadline, reason)

    errors: list[str] = []

    def sweep(
        found: list[PrunedResource], remove: Callable[[PrunedResource], None]
    ) -> tuple[PrunedResource, ...]:
        done: list[PrunedResource] = []
        for resource in found:
            if not dry_run:
                try:
                    remove(resource)
                except docker.errors.NotFound:
                    pass  # removed by someone else meanwhile: gone is what we wanted
                except (docker.errors.APIError, docker.errors.DockerException, OSError, BackendError) as exc:
                    errors.append(f"{resource.kind} {resource.name}: {_explain(exc)}")
                    continue
            done.append(resource)
        return tuple(done)

    def remove_container(resource: PrunedResource) -> None:
        try:
            api.remove_container(resource.id, force=True, v=True)
        except docker.errors.APIError as exc:
            # 409: a removal of this container is already in progress.
            if exc.status_code != 409:
                raise

    def sandbox_gone(
        kind: str, rid: str, name: str, tags: Mapping[str, str] | None, alive: set[str]
    ) -> PrunedResource | None:
        """A proxy or egress network left without its sandbox container."""
        tags = tags or {}
        sid = tags.get(labels.SANDBOX, "")
        created = _parse_deadline(tags.get(labels.CREATED))
        if tags.get(labels.ROLE) not in _PROXY_ROLES or not sid or sid in alive:
            return None
        if created is None or moment - created < SANDBOX_GONE_GRACE:
            return None
        owner = tags.get(labels.OWNER, "")
        deadline = _parse_deadline(tags.get(labels.DEADLINE))
        return PrunedResource(kind, rid, name, sid, owner, deadline, SANDBOX_GONE)

    with map_docker_errors("listing AgentNest containers"):
        raw_containers = api.containers(all=True, filters=selector)
    found = [
        r
        for c in raw_containers
        if (r := pick("container", c["Id"], _container_name(c), c.get("Labels"))) is not None
    ]
    # An expired label is not the last word: Sandbox.extend() may have moved the
    # deadline of a running sandbox, recorded inside it (see deadline.py).
    running = {c["Id"] for c in raw_containers if c.get("State") == "running"}
    found = [
        r for r in found if not (r.reason == EXPIRED and r.id in running and _extended(api, r.id, moment))
    ]
    chosen = {r.id for r in found}
    # Sandboxes whose sandbox container stays: their proxies and networks stay too.
    alive = {
        (c.get("Labels") or {}).get(labels.SANDBOX, "")
        for c in raw_containers
        if c["Id"] not in chosen and (c.get("Labels") or {}).get(labels.ROLE) not in _PROXY_ROLES
    }
    found += [
        r
        for c in raw_containers
        if c["Id"] not in chosen
        and (r := sandbox_gone("container", c["Id"], _container_name(c), c.get("Labels"), alive)) is not None
    ]
    containers = sweep(found, remove_container)
    removed = {r.id for r in containers}
    # A network stays while any container of its sandbox stays.
    in_use = {
        (c.get("Labels") or {}).get(labels.SANDBOX, "") for c in raw_containers if c["Id"] not in removed
    }

    with map_docker_errors("listing AgentNest networks"):
        raw_networks = api.networks(filters=selector)
    found = []
    for n in raw_networks:
        name = n.get("Name") or n["Id"][:12]
        r = pick("network", n["Id"], name, n.get("Labels"))
        if r is not None and r.reason == EXPIRED and r.sandbox and r.sandbox in in_use:
            r = None  # its (extended) sandbox still runs on it
        if r is None:
            r = sandbox_gone("network", n["Id"], name, n.get("Labels"), in_use)
        if r is not None:
            found.append(r)
    networks = sweep(found, lambda r: api.remove_network(r.id))

    with map_docker_errors("listing AgentNest volumes"):
        raw_volumes = (api.volumes(filters=selector) or {}).get("Volumes") or []
    found = [
        r for v in raw_volumes if (r := pick("volume", v["Name"], v["Name"], v.get("Labels"))) is not None
    ]
    volumes = sweep(found, lambda r: api.remove_volume(r.id))

    # Records of paused sandboxes whose container is gone.  The record
    # directory is the host's: a record another engine wrote (a second
    # dockerd on this host) is that engine's to remove, and so is the
    # workspace it names.
    kept: set[str] = set()
    with contextlib.suppress(OSError):
        entries = os.listdir(checkpoint.record_dir())
        engine = _engine_id(api) if entries else ""
        for entry in entries:
            sid = entry.rpartition(".")[0]
            if not entry.endswith((".json", ".lock")) or sid in in_use:
                continue
            record = _record(sid)
            if record is not None and record.get("engine") not in (None, engine):
                if isinstance(record.get("workspace"), str):
                    kept.add(record["workspace"])
                continue
            if not dry_run and (sandbox is None or sid == sandbox):
                checkpoint.remove_record(sid)

    workspaces: tuple[PrunedResource, ...] = ()
    if pool is not None:
        # A workspace stays while its sandbox's container does (in_use).
        entries = pool.orphans(in_use | kept, now=moment + (storage.ORPHAN_AGE if everything else 0.0))
        if sandbox is not None:
            entries = [e for e in entries if e in (f"ws/{sandbox}", f"slot/{sandbox}")]
        found = [
            PrunedResource(
                "workspace",
                e,
                e,
                e.partition("/")[2] if not e.startswith("snap/") else "",
                "",
                None,
                SANDBOX_GONE,
            )
            for e in entries
        ]
        workspaces = sweep(found, lambda r: pool.delete_entry(r.id))
        if workspaces and not dry_run:
            try:
                pool.reclaim()
            except BackendError as exc:
                errors.append(f"storage pool: {exc}")
    return PruneReport(containers, networks, volumes, tuple(errors), dry_run, workspaces)


def _record(sandbox_id: str) -> dict[str, Any] | None:
    """The pause-to-disk record of a sandbox, if it has a readable one."""
    try:
        return checkpoint.read_record(sandbox_id)
    except AgentNestError:
        return None


def _engine_id(api: Any) -> str:
    """The engine's own id (``docker info``'s ``ID``), which records name (see LiveState.record)."""
    with map_docker_errors("asking the engine for its id"):
        return str(api.info().get("ID") or "")


def _extended(api: Any, cid: str, now: float) -> bool:
    """Whether a running container's deadline was moved past ``now``."""
    from . import deadline as moved

    found = moved.read(api, cid, "python3")
    return found is not None and found > now


def _parse_deadline(value: str | None) -> float | None:
    if not value:
        return None
    try:
        deadline = float(value)
    except ValueError:
        return None
    # A label anyone could have set: refuse nan/inf rather than compare them.
    return deadline if deadline == deadline and abs(deadline) != float("inf") else None


def _container_name(container: Mapping[str, Any]) -> str:
    names = container.get("Names") or []
    if names:
        return str(names[0]).lstrip("/")
    return str(container["Id"])[:12]


def _explain(exc: BaseException) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return str(text)[:300]


__all__ = ["EVERYTHING", "EXPIRED", "OWNER_GONE", "SANDBOX_GONE", "PruneReport", "PrunedResource", "prune"]
