"""Live state on gVisor: pause to disk, resume (also in another process), live fork.

Through Docker's experimental checkpoint API (:mod:`.checkpoint`); the
:class:`DockerBackend <agentnest.runtime.docker.backend.DockerBackend>`
methods ``pause``, ``resume``, ``create_live_fork`` and ``attach_paused``
come here.  On runc, and on an engine that cannot checkpoint, a pause is the
freezer (:mod:`.freeze`).

This module does not know the backend: it takes what it needs of it as the
small :class:`Engine` protocol it defines (the backend is one), and a
callable that creates a live fork's container.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...channel.streams import DockerMuxStream
from ...config import SandboxConfig
from ...errors import (
    BackendError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
    SnapshotError,
    UnsupportedCapabilityError,
)
from ...policy import NetworkMode
from .. import bootstrap, storage
from ..base import Capability, SandboxHandle
from . import checkpoint, labels
from .engine import Background, map_docker_errors, raw_socket
from .freeze import Freeze, Freezer

if TYPE_CHECKING:
    import docker

__all__ = ["ONCE", "CreateRestored", "Engine", "LiveState"]

#: Why a container restored from a checkpoint is not checkpointed again.
ONCE = (
    "this sandbox was restored from a gVisor checkpoint (a pause to disk or a live fork), and a second "
    "checkpoint of it leaves its old task behind in containerd (Docker 20.10, runsc 20221219: the next "
    "restore fails with 'id already in use'), so it pauses with the freezer and forks its files only"
)


class Engine(Protocol):
    """What the checkpoint side needs of its Docker backend."""

    name: str
    freezer: Freezer

    @property
    def api(self) -> docker.APIClient: ...

    def engine_info(self) -> dict[str, Any]: ...

    def capabilities(self) -> frozenset[Capability]: ...

    def workspace_path(
        self, handle: SandboxHandle, *, write: bool = False, complete: bool = False
    ) -> Path | None: ...

    def is_running(self, handle: SandboxHandle) -> bool: ...

    def storage_pool(self) -> storage.StoragePool | None: ...


class CreateRestored(Protocol):
    """Creates a live fork's container from a checkpoint (the backend's ``_create``).

    ``after_clone`` is called once the child's workspace is cloned from ``parent``'s.
    """

    def __call__(
        self,
        config: SandboxConfig,
        parent: SandboxHandle,
        /,
        *,
        restore_from: Path,
        after_clone: Callable[[], None],
    ) -> SandboxHandle: ...


class LiveState:
    """The checkpoint side of one Docker backend.

    Args:
        backend: the backend, as much of it as :class:`Engine` says.
        create: makes a live fork's container (see :class:`CreateRestored`).
        gvisor: the backend's OCI runtime is gVisor (the only one that checkpoints here).
        docker_host: the engine's address (checkpoints are files on the engine's host).
    """

    def __init__(
        self, backend: Engine, *, create: CreateRestored, gvisor: bool, docker_host: str | None
    ) -> None:
        self.backend = backend
        self._create = create
        self._gvisor = gvisor
        self._docker_host = docker_host

    def pause(self, handle: SandboxHandle) -> str:
        # gVisor on an experimental local engine: a checkpoint to disk (the
        # container stops, its memory is released); otherwise the freezer.
        # Not while a fork holds the freezer, nor for allowlisted sandboxes
        # (their proxy and network are not part of the checkpoint).
        freeze = handle.info.setdefault("freeze", Freeze())
        with freeze.user_lock:
            if freeze.user:
                return "checkpoint" if freeze.checkpointed else "freezer"
            with freeze.lock:
                to_disk = (
                    freeze.count == 0
                    and handle.info.get("egress_topology") is None
                    and not handle.info.get("checkpoint_restored")
                    and self.checkpoints()
                )
                if to_disk:
                    cid = handle.info["container"]
                    checkpoint.delete(self.backend.api, cid, checkpoint.PAUSE_NAME)  # a previous pause's
                    with map_docker_errors("checkpointing the sandbox"):
                        checkpoint.create(self.backend.api, cid, checkpoint.PAUSE_NAME)
                    freeze.checkpointed = True
                    freeze.count += 1
                    self.record(handle, paused=True)
            if not to_disk:
                # Through the engine: `docker ps` and inspect then say "paused".
                self.backend.freezer.hold(handle, fast=False)
            freeze.user = True
            return "checkpoint" if to_disk else "freezer"

    def resume(self, handle: SandboxHandle) -> bool:
        freeze = handle.info.setdefault("freeze", Freeze())
        with freeze.user_lock:
            if not freeze.user:
                return False
            if not freeze.checkpointed:
                self.backend.freezer.release(handle)
                freeze.user = False
                return False
            # One resume at a time, whichever process: the check that it is
            # still stopped and the restore happen under a host-wide lock.
            with checkpoint.resume_lock(handle.id):
                with map_docker_errors("resuming the sandbox"):
                    running = self.backend.is_running(handle)
                if running:
                    # Another process resumed it meanwhile (Sandbox.from_checkpoint).
                    # Not even attached: a second attachment's end would close the
                    # stdin (StdinOnce) of the agent that process now talks to.
                    raise BackendError(
                        f"sandbox {handle.id} is running already: another process resumed it from its "
                        "checkpoint (Sandbox.from_checkpoint); only that process can use it now"
                    )
                self.restore(handle, checkpoint.PAUSE_NAME)  # SnapshotError: still paused, nothing lost
            with freeze.lock:
                freeze.count -= 1
                freeze.checkpointed = False
            freeze.user = False
            self.record(handle, paused=False)
            # The checkpoint stays until the next pause or the container's
            # removal (one per container): a restore that fails later, in
            # runsc, can still be looked into.
            return True

    def create_live_fork(self, parent: SandboxHandle, config: SandboxConfig) -> SandboxHandle:
        if Capability.LIVE_FORK not in self.backend.capabilities():
            raise UnsupportedCapabilityError(
                "a live fork needs gVisor (runsc) on a local Docker engine in experimental mode "
                "(`make engine` sets it; runc cannot: CRIU fails on this kernel); use fork(live=False)"
            )
        if self.backend.workspace_path(parent) is None or config.limits.workspace_medium != "disk":
            raise UnsupportedCapabilityError(
                "a live fork needs a disk workspace (the default); use fork(live=False)"
            )
        if parent.info.get("egress_topology") is not None or config.network.mode is not NetworkMode.DENIED:
            # The checkpoint holds the sandbox's sockets; a copy of them in a
            # second network namespace is not something tested here.
            raise UnsupportedCapabilityError(
                "a live fork is only for network-denied sandboxes for now; use fork(live=False)"
            )
        if parent.info.get("checkpoint_restored"):
            raise UnsupportedCapabilityError(ONCE + "; use fork(live=False)")
        freeze = parent.info.setdefault("freeze", Freeze())
        cid = parent.info["container"]
        with freeze.user_lock:
            with freeze.lock:
                if freeze.count or freeze.user:
                    raise UnsupportedCapabilityError(
                        "the sandbox is frozen by another fork or snapshot right now; try again, "
                        "or use fork(live=False)"
                    )
                checkpoint.delete(self.backend.api, cid, checkpoint.FORK_NAME)  # a previous fork's
                with map_docker_errors("checkpointing the sandbox for a live fork"):
                    checkpoint.create(self.backend.api, cid, checkpoint.FORK_NAME)
                # Held while stopped: the workspace clone's freeze is then a no-op.
                freeze.count += 1
                freeze.checkpointed = True
            back: list[Background] = []

            def restore_parent() -> None:
                # Called once the child's workspace is cloned: from then on the
                # parent may run again, restored while the child is (runsc's
                # two restores, about a second each here, overlap).
                if not back:
                    back.append(Background(lambda: self.restore(parent, checkpoint.FORK_NAME)))

            try:
                source = checkpoint.directory(self.backend.engine_info(), cid, checkpoint.FORK_NAME)
                child = self._create(config, parent, restore_from=source, after_clone=restore_parent)
            finally:
                try:
                    # The parent comes back whatever became of the child.
                    if back:
                        back[0].result()
                    else:
                        self.restore(parent, checkpoint.FORK_NAME)
                finally:
                    with freeze.lock:
                        freeze.count -= 1
                        freeze.checkpointed = False
        return child

    def checkpoints(self) -> bool:
        """Whether this backend pauses its sandboxes through gVisor checkpoints (see :mod:`.checkpoint`)."""
        return (
            self._gvisor
            and storage.local_engine(self._docker_host)
            and checkpoint.supported(self.backend.engine_info())
        )

    def record(self, handle: SandboxHandle, *, paused: bool) -> None:
        """Keep (or update) the record another process resumes this sandbox from (see :mod:`.checkpoint`)."""
        config = handle.info.get("config")
        if not isinstance(config, SandboxConfig):
            return
        try:
            checkpoint.write_record(
                handle.id,
                {
                    "sandbox_id": handle.id,
                    "backend": self.backend.name,
                    # The engine whose container it is: a prune through another
                    # engine on this host leaves the record (and its workspace) alone.
                    "engine": str(self.backend.engine_info().get("ID") or "") or None,
                    "container": handle.info["container"],
                    "deadline": handle.deadline,
                    "paused": paused,
                    "owner": labels.owner(),
                    "agent_pid": handle.info.get("agent_pid"),
                    "reconnect_ids": handle.info.get("reconnect_ids"),
                    "workspace": handle.info.get("workspace_name"),
                    "config": checkpoint.config_record(config),
                },
            )
        except OSError as exc:
            raise BackendError(f"could not record the paused sandbox {handle.id}: {exc.strerror}") from None

    def attach_paused(self, sandbox_id: str) -> tuple[SandboxHandle, SandboxConfig]:
        if Capability.PAUSE not in self.backend.capabilities() or not self.checkpoints():
            raise UnsupportedCapabilityError(
                "only gVisor on a local Docker engine in experimental mode pauses sandboxes to disk "
                "(`make engine` sets it); nothing to resume here"
            )
        try:
            record = checkpoint.read_record(sandbox_id)
        except SandboxDestroyedError:
            # No record, but the sandbox may well be there, running (never
            # paused to disk): "destroyed" would send the caller the wrong way.
            with map_docker_errors("looking for the sandbox"):
                running = self.backend.api.containers(
                    filters={"label": [f"{labels.MANAGED}=true", f"{labels.SANDBOX}={sandbox_id}"]}
                )
            if running:
                raise BackendError(
                    f"sandbox {sandbox_id} is running, not paused to disk: only a sandbox that pause() "
                    "checkpointed (gVisor) can be resumed by from_checkpoint"
                ) from None
            raise
        if not record.get("paused"):
            raise BackendError(
                f"sandbox {sandbox_id} is not paused to disk (it was resumed, perhaps by another process); "
                "a running sandbox cannot be taken over"
            )
        config = checkpoint.config_from_record(record.get("config"))
        deadline, cid = record.get("deadline"), record.get("container")
        if not isinstance(deadline, (int, float)) or not isinstance(cid, str):
            raise SnapshotError(f"the record of sandbox {sandbox_id} is corrupt", rule="checkpoint")
        import docker.errors

        with map_docker_errors("looking for the paused sandbox"):
            try:
                found = self.backend.api.inspect_container(cid)
            except docker.errors.NotFound:
                checkpoint.remove_record(sandbox_id)
                raise SandboxDestroyedError(
                    f"sandbox {sandbox_id}'s container is gone (destroyed or pruned)"
                ) from None
        tags = found.get("Config", {}).get("Labels") or {}
        if tags.get(labels.SANDBOX) != sandbox_id or tags.get(labels.MANAGED) != "true":
            raise SnapshotError(
                f"the record of sandbox {sandbox_id} names another container", rule="checkpoint"
            )
        if found.get("State", {}).get("Running"):
            raise BackendError(f"sandbox {sandbox_id} is running, not paused: another process resumed it")
        if deadline <= time.time():
            raise SandboxDestroyedError(
                f"sandbox {sandbox_id} reached its deadline while paused; `agentnest prune` removes it"
            )
        env = dict(e.split("=", 1) for e in found.get("Config", {}).get("Env") or () if "=" in e)
        info: dict[str, Any] = {
            "container": cid,
            "user": config.user,
            "workdir": config.workdir,
            "env": env,
            "config": config,
            "agent_pid": record.get("agent_pid"),
            "reconnect_ids": record.get("reconnect_ids"),
            "image": found.get("Config", {}).get("Image", config.image),
            # Its agent lingers on a socket (made after that was added): see backend.open_channel.
            "reattach": "AGENTNEST_REATTACH" in env,
        }
        name = record.get("workspace")
        pool = self.backend.storage_pool()
        if isinstance(name, str) and config.limits.workspace_medium == "disk":
            if pool is None:
                raise RuntimeNotAvailableError(
                    f"sandbox {sandbox_id}'s workspace is in the storage pool, which is not mounted; "
                    "`agentnest setup` mounts it again"
                )
            info.update(workspace_pool=pool, workspace_name=name, workspace_path=pool.path(name))
        freeze = Freeze()
        freeze.user = freeze.checkpointed = True
        freeze.count = 1
        info["freeze"] = freeze
        handle = SandboxHandle(id=sandbox_id, backend=self.backend.name, deadline=float(deadline), info=info)
        self.record(handle, paused=True)  # this process owns it now (prune --orphans)
        return handle, config

    def restore(self, handle: SandboxHandle, name: str) -> None:
        """Start the stopped container from checkpoint ``name``; its new stream waits in the handle."""
        cid = handle.info["container"]
        with map_docker_errors("restoring the sandbox"):
            # Attach before the start, as at create: no byte of the restored agent is lost.
            wrapper = self.backend.api.attach_socket(
                cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
        stream = DockerMuxStream(raw_socket(wrapper), owner=wrapper, eof_marker=bootstrap.AGENT_EXITED)
        try:
            with map_docker_errors("restoring the sandbox"):
                checkpoint.restore(self.backend.api, self.backend.engine_info(), cid, name)
                pid = handle.info.get("agent_pid")
                if isinstance(pid, int) and pid > 0:
                    checkpoint.wake(self.backend.api, cid, pid, handle.info["user"])
        except BaseException:
            stream.close()
            raise
        handle.info["stream"] = stream
        handle.info["checkpoint_restored"] = True
