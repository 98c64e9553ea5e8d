"""The Docker backend: runc by default, gVisor (runsc) or Kata by runtime name.

Every sandbox is one container created with these defaults (each is a
security choice, explained where it is set):

* a non-root UID (65532) and GID, read-only root filesystem, every
  capability dropped, ``no-new-privileges``, AgentNest's seccomp profile;
* no network (``network_mode=none``: loopback only), or with an egress
  allowlist only a per-sandbox internal network whose one way out is a
  filtering proxy container (see :mod:`.egress` and docs/egress.md);
* memory (no swap), CPU, PID limits; ``/tmp`` is a tmpfs mount with a
  fixed size, and ``/workspace`` either a subvolume of the storage pool with
  a kernel-enforced quota (:mod:`agentnest.runtime.storage`) or a tmpfs, so
  the sandbox cannot fill the host's disk;
* PID 1 is the deadline keeper, which reaps orphans like an init and
  which sandbox code cannot kill;
* no container log (``none`` driver): the agent's stream is the container's
  stdio, and no host file records it or grows with it;
* labels with owner and deadline; the container's main process is the
  deadline keeper, so the container stops itself at its deadline even if
  the host process died (see :mod:`agentnest.runtime.bootstrap`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ...channel.streams import ByteStream, DockerMuxStream
from ...config import SandboxConfig
from ...errors import (
    BackendError,
    ConfigurationError,
    ImageNotFoundError,
    MissingDependencyError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
    SnapshotError,
    UnsupportedCapabilityError,
)
from ...policy import NetworkMode
from .. import bootstrap, mounts, storage
from ..base import Capability, RuntimeBackend, SandboxHandle
from . import checkpoint, egress, images, labels, seccomp

if TYPE_CHECKING:
    import docker

#: How long after its deadline a container is force-removed by ``destroy``
#: callers that find it still running; the keeper normally stops it first.
#: Memory gVisor's own kernel (the Sentry) needs beside the workload.
_GVISOR_OVERHEAD = 48 * 2**20
#: How long a warm container (create_spare) may wait to become a fork's child.
SPARE_MAX_AGE = 300.0
_CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True)
class DockerSpec:
    """Knobs of the Docker backend.

    Attributes:
        oci_runtime: ``runc`` (default), ``runsc`` (gVisor) or ``kata-runtime``;
            must be registered with the engine.
        docker_host: engine address; ``None`` reads ``DOCKER_HOST`` as the
            Docker CLI does.
        pull: try ``docker pull`` when an image is missing.
        python: the interpreter in the image that runs the agent.
        egress_hosts: host name -> IP address, used by the egress proxy
            instead of DNS for those names (``NetworkPolicy.allowlist``
            sandboxes).  The way tests and air-gapped setups point allowed
            names at local servers.  A mapped name must still be on the
            allowlist, and a private mapped address still needs a ``cidrs``
            entry.  (May move to the policy later.)
        egress_network: the network the egress proxy uses for its way out
            (``bridge``: the engine's default bridge).
        egress_subnets: the IPv4 range each allowlisted sandbox's internal
            /29 is drawn from.
        proxy_image: the image the egress proxy runs in (needs python3 >=
            3.8); ``None`` is the default base image.
        proxy_oci_runtime: the OCI runtime of the proxy container.
        network_oci_runtime: the OCI runtime of allowlisted sandboxes, which
            need a network interface; ``None`` means ``oci_runtime``, except
            ``runsc`` (registered with ``--network=none``), which becomes
            ``runsc-host`` (``--network=host`` inside the container's own
            network namespace, as ``make engine`` registers it).
        image_aliases: requested image -> local image the engine runs instead
            (the policy judges the requested one); ``None`` reads
            ``$AGENTNEST_IMAGE_ALIASES`` at each create (see :mod:`.images`).
        storage: the mount point of the storage pool for disk workspaces
            (``None``: ``$AGENTNEST_STORAGE`` or /var/lib/agentnest/storage;
            ``""``: no disk workspaces).  Used only when the engine runs on
            this host (a unix socket).
        warm_forks: after a sandbox's first fork, keep one started container
            of its configuration ready for the next (``Capability.WARM_FORK``:
            runc, a local storage pool, a network-denied sandbox); ``False``
            creates every child from scratch.  See docs/state.md.

    .. versionchanged:: 0.4.0 the ``egress_*``, ``proxy_*``,
       ``network_oci_runtime`` and ``image_aliases`` fields.
    """

    type: str = "docker"
    oci_runtime: str = "runc"
    docker_host: str | None = None
    pull: bool = True
    python: str = "python3"
    # Not part of the hash (a mapping is not hashable); still compared.
    egress_hosts: Mapping[str, str] = field(default_factory=dict, hash=False)
    egress_network: str = "bridge"
    egress_subnets: str = egress.DEFAULT_SUBNETS
    proxy_image: str | None = None
    proxy_oci_runtime: str = "runc"
    network_oci_runtime: str | None = None
    image_aliases: Mapping[str, str] | None = field(default=None, hash=False)
    storage: str | None = None
    warm_forks: bool = True

    def __post_init__(self) -> None:
        from ...egress.proxy import Rules

        hosts: object = self.egress_hosts
        if not isinstance(hosts, Mapping):
            raise ConfigurationError(f"egress_hosts must map host names to addresses, not {hosts!r:.60}")
        try:
            Rules(hosts=dict(hosts))
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"egress_hosts: {exc}; use {{'name.example': '10.0.0.5'}}") from None
        object.__setattr__(self, "egress_hosts", MappingProxyType(dict(hosts)))
        if self.image_aliases is not None:
            object.__setattr__(self, "image_aliases", images.checked_image_aliases(self.image_aliases))

    def allowlist_oci_runtime(self) -> str:
        """The OCI runtime an allowlisted sandbox runs with (see ``network_oci_runtime``)."""
        if self.network_oci_runtime:
            return self.network_oci_runtime
        return "runsc-host" if self.oci_runtime == "runsc" else self.oci_runtime


@contextlib.contextmanager
def map_docker_errors(what: str, image: str | None = None) -> Iterator[None]:
    """Turn docker-py and connection errors into AgentNest's tree."""
    import docker.errors
    import requests.exceptions

    try:
        yield
    except docker.errors.ImageNotFound:
        raise ImageNotFoundError(_missing_image_hint(image or "?")) from None
    except docker.errors.NotFound as exc:
        raise BackendError(f"{what}: not found ({_explain(exc)})") from None
    except docker.errors.APIError as exc:
        raise BackendError(f"{what}: the engine refused: {_explain(exc)}") from None
    except (requests.exceptions.ConnectionError, docker.errors.DockerException) as exc:
        raise RuntimeNotAvailableError(
            f"{what}: the Docker engine is not reachable ({str(exc)[:200]}); "
            "start it (`make engine`, or `sudo systemctl start docker`) or set DOCKER_HOST"
        ) from None


def _explain(exc: Any) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return str(text)[:500]


def _missing_image_hint(image: str) -> str:
    from .images import BASE_REPOSITORY

    if image.startswith(BASE_REPOSITORY + ":"):
        return (
            f"image {image!r} is not built on this engine; build it offline with "
            "`agentnest image base` (or `make image`)"
        )
    return (
        f"image {image!r} is not on this engine and could not be pulled; pull or build it "
        "(`docker pull IMAGE`, `docker build`), or use the default image built by `agentnest image base`"
    )


class DockerBackend(RuntimeBackend):
    """Sandboxes as hardened Docker containers.  Thread-safe."""

    def __init__(self, spec: DockerSpec | None = None, *, name: str = "docker") -> None:
        self.spec = spec or DockerSpec()
        self.name = name
        self._api: docker.APIClient | None = None
        self._info: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._known_images: set[str] = set()
        self._pool: storage.StoragePool | None = None
        # Why warm forks stopped working here (a slot's mount did not reach
        # its container), or None.
        self._warm_broken: str | None = None

    # -- engine --------------------------------------------------------------

    @property
    def api(self) -> docker.APIClient:
        if self._api is None:
            with self._lock:
                if self._api is None:
                    try:
                        import docker
                        from docker.utils import kwargs_from_env
                    except ImportError:  # pragma: no cover - docker is a core dependency
                        raise MissingDependencyError(
                            "the Docker backend needs docker-py: pip install agentnest"
                        ) from None
                    with map_docker_errors("connecting to Docker"):
                        kwargs: dict[str, Any] = dict(kwargs_from_env())
                        if self.spec.docker_host:
                            kwargs["base_url"] = self.spec.docker_host
                        self._api = docker.APIClient(version="auto", timeout=120, **kwargs)
        return self._api

    def engine_info(self) -> dict[str, Any]:
        if self._info is None:
            with map_docker_errors("asking the engine for its runtimes"):
                self._info = dict(self.api.info())
        return self._info

    def check_runtime(self, oci_runtime: str | None = None) -> None:
        runtime = oci_runtime or self.spec.oci_runtime
        runtimes = self.engine_info().get("Runtimes") or {}
        if runtime not in runtimes:
            raise RuntimeNotAvailableError(
                f"OCI runtime {runtime!r} is not registered with this Docker engine "
                f"(it has: {', '.join(sorted(runtimes)) or 'none'}); install it and add it under "
                "'runtimes' in /etc/docker/daemon.json (`make engine` does this for runsc and runsc-host)"
            )
        if runtime.startswith("runsc"):
            spec = runtimes.get(runtime) or {}
            args = spec.get("runtimeArgs") or []
            if "--oci-seccomp" not in args:
                # Without it gVisor silently ignores the seccomp profile: refuse
                # rather than hand out a sandbox weaker than it claims to be.
                raise RuntimeNotAvailableError(
                    f"OCI runtime {runtime!r} is registered without --oci-seccomp, so gVisor "
                    'would ignore AgentNest\'s seccomp profile; add "--oci-seccomp" to its runtimeArgs in '
                    "/etc/docker/daemon.json (`make engine` does) and reload dockerd"
                )

    def storage_pool(self) -> storage.StoragePool | None:
        """The storage pool for disk workspaces, or ``None`` (remote engine, or no pool)."""
        if self._pool is None and self.spec.storage != "" and storage.local_engine(self.spec.docker_host):
            # Not found is looked for again next time: `agentnest setup` may run meanwhile.
            self._pool = storage.find_pool(self.spec.storage)
        return self._pool

    @property
    def oci_runtime(self) -> str:
        # runsc-host is gVisor too (with host networking in the container's namespace).
        return "runsc" if self.spec.oci_runtime.startswith("runsc") else self.spec.oci_runtime

    def capabilities(self) -> frozenset[Capability]:
        caps = {
            Capability.NETWORK_DENIED,
            Capability.RESOURCE_LIMITS,
            Capability.READ_ONLY_ROOT,
            Capability.DEADLINE,
            Capability.GPU,
            # Both move the workspace through the agent channel (a tar stream),
            # so they need nothing from the engine and work with remote engines.
            Capability.FORK,
            Capability.SNAPSHOT,
            Capability.EXTEND,
            # docker pause/unpause: the freezer cgroup on runc, `runsc pause`
            # on gVisor; memory is kept (tests/integration/test_pause.py).
            Capability.PAUSE,
            # A policy's own seccomp/AppArmor profile, and the rootless check
            # (answered from the engine's own report; see _check_confinement).
            Capability.SECURITY_PROFILES,
            Capability.ROOTLESS,
        }
        if self.storage_pool() is not None:
            caps.add(Capability.DISK_WORKSPACE)
            if self.checkpoints():
                # gVisor checkpoints restored into a new container
                # (tests/integration/test_live_fork.py); runc has none here (CRIU fails).
                caps.add(Capability.LIVE_FORK)
            if self.spec.warm_forks and self.spec.oci_runtime == "runc" and self._warm_broken is None:
                # A mount made on the host after the container started reaches
                # it through mount propagation; gVisor's gofer serves the
                # directory it opened at start, so there it would not.
                caps.add(Capability.WARM_FORK)
        if self.spec.oci_runtime == "runc":
            caps.add(Capability.NETWORK_OPEN)
        if self.spec.oci_runtime == "runc" or self._is_gvisor():
            # Tested on both (tests/integration/test_egress.py); other
            # runtimes (Kata) are not, so they refuse rather than guess.
            caps.add(Capability.EGRESS_DOMAINS)
        return frozenset(caps)

    # -- lifecycle -----------------------------------------------------------

    def create(self, config: SandboxConfig) -> SandboxHandle:
        return self._create(config, None)

    def create_fork(self, parent: SandboxHandle, config: SandboxConfig) -> SandboxHandle:
        if self.workspace_path(parent) is None or config.limits.workspace_medium != "disk":
            raise UnsupportedCapabilityError("only a sandbox with a disk workspace forks on the host")
        return self._create(config, parent)

    def create_spare(self, config: SandboxConfig) -> SandboxHandle:
        if Capability.WARM_FORK not in self.capabilities():
            raise UnsupportedCapabilityError(
                f"the {self.name} backend keeps no warm containers for forks "
                f"({self._warm_broken or 'it needs runc, a local storage pool and warm_forks=True'})"
            )
        if config.network.mode is not NetworkMode.DENIED or config.limits.workspace_medium != "disk":
            # An allowlisted sandbox's network and proxy are made for it alone.
            raise UnsupportedCapabilityError("only network-denied sandboxes with a disk workspace fork warm")
        handle = self._create(config, None, spare=True)
        try:
            with map_docker_errors("looking at the warm container"):
                handle.info["pid"] = int(self.api.inspect_container(handle.info["container"])["State"]["Pid"])
        except BaseException:
            self.destroy(handle)
            raise
        return handle

    def claim_spare(self, spare: SandboxHandle, parent: SandboxHandle, config: SandboxConfig) -> None:
        pool, slot = spare.info.get("workspace_pool"), spare.info.get("slot")
        if not isinstance(pool, storage.StoragePool) or not isinstance(slot, str):
            raise UnsupportedCapabilityError("this handle is not a warm container (create_spare)")
        if self.workspace_path(parent) is None:
            raise UnsupportedCapabilityError("only a sandbox with a disk workspace forks on the host")
        # The parent stops for the instant of the snapshot: the child gets
        # exactly its files at that instant.
        with self.frozen(parent):
            path = pool.clone(parent.info["workspace_name"], spare.id, config.limits.workspace)
        spare.info.update(workspace_name=spare.id, workspace_path=path)  # destroy() removes it
        pool.fill_slot(slot, spare.id)
        seen = mounts.top_mount(config.workdir, spare.info["pid"])
        if seen != f"/ws/{spare.id}":
            # Fail closed, and stop trying: an engine in another mount
            # namespace never sees the slot's mounts.
            self._warm_broken = f"a workspace mounted on a slot did not reach its container (it saw {seen!r})"
            raise BackendError(f"warm fork: {self._warm_broken}")
        deadline = time.time() + config.lifetime
        self._move_deadline(spare, deadline)
        spare.deadline = deadline

    def workspace_quota(self, handle: SandboxHandle) -> int | None:
        pool, name = handle.info.get("workspace_pool"), handle.info.get("workspace_name")
        if not isinstance(pool, storage.StoragePool) or not isinstance(name, str):
            return None
        try:
            return pool.limit(name)
        except BackendError:
            return None

    def workspace_usage(self, handle: SandboxHandle) -> int | None:
        pool, name = handle.info.get("workspace_pool"), handle.info.get("workspace_name")
        if not isinstance(pool, storage.StoragePool) or not isinstance(name, str):
            return None
        try:
            return pool.used(name)
        except BackendError:
            return None

    def workspace_path(
        self, handle: SandboxHandle, *, write: bool = False, complete: bool = False
    ) -> Path | None:
        path = handle.info.get("workspace_path")
        if complete and self._is_gvisor():
            # FIFOs and sockets made inside a gVisor sandbox exist only in its
            # kernel (the Sentry): the host's view is not complete.  What the
            # host writes there, files and directory renames (a restore's swap)
            # alike, the sandbox sees at once: bind mounts are
            # file-access=shared, and the Sentry revalidates each lookup
            # (tests/integration/test_disk_workspace.py interleaves both sides).
            return None
        del write  # coherent on runc and gVisor alike
        return path if isinstance(path, Path) else None

    @contextlib.contextmanager
    def frozen(self, handle: SandboxHandle) -> Iterator[None]:
        # The freezer cgroup on runc, `runsc pause` on gVisor: every process
        # stops where it is, memory kept; nothing writes the workspace meanwhile.
        # Nested and concurrent freezes (parallel forks of one parent) share
        # one pause: the first pauses, the last resumes.
        # A user's pause() is one more holder (see pause), so a fork's unfreeze
        # never resumes a sandbox its owner paused.
        self._hold(handle)
        try:
            yield
        finally:
            self._release(handle)

    def pause(self, handle: SandboxHandle) -> str:
        # gVisor on an experimental local engine: a checkpoint to disk (the
        # container stops, its memory is released); otherwise the freezer.
        # Not while a fork holds the freezer, nor for allowlisted sandboxes
        # (their proxy and network are not part of the checkpoint).
        freeze = handle.info.setdefault("freeze", _Freeze())
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
                    checkpoint.delete(self.api, cid, checkpoint.PAUSE_NAME)  # a previous pause's
                    with map_docker_errors("checkpointing the sandbox"):
                        checkpoint.create(self.api, cid, checkpoint.PAUSE_NAME)
                    freeze.checkpointed = True
                    freeze.count += 1
                    self._record(handle, paused=True)
            if not to_disk:
                # Through the engine: `docker ps` and inspect then say "paused".
                self._hold(handle, fast=False)
            freeze.user = True
            return "checkpoint" if to_disk else "freezer"

    def resume(self, handle: SandboxHandle) -> bool:
        freeze = handle.info.setdefault("freeze", _Freeze())
        with freeze.user_lock:
            if not freeze.user:
                return False
            if not freeze.checkpointed:
                self._release(handle)
                freeze.user = False
                return False
            # One resume at a time, whichever process: the check that it is
            # still stopped and the restore happen under a host-wide lock.
            with checkpoint.resume_lock(handle.id):
                with map_docker_errors("resuming the sandbox"):
                    running = self.is_running(handle)
                if running:
                    # Another process resumed it meanwhile (Sandbox.from_checkpoint).
                    # Not even attached: a second attachment's end would close the
                    # stdin (StdinOnce) of the agent that process now talks to.
                    raise BackendError(
                        f"sandbox {handle.id} is running already: another process resumed it from its "
                        "checkpoint (Sandbox.from_checkpoint); only that process can use it now"
                    )
                self._restore(handle, checkpoint.PAUSE_NAME)  # SnapshotError: still paused, nothing lost
            with freeze.lock:
                freeze.count -= 1
                freeze.checkpointed = False
            freeze.user = False
            self._record(handle, paused=False)
            # The checkpoint stays until the next pause or the container's
            # removal (one per container): a restore that fails later, in
            # runsc, can still be looked into.
            return True

    def create_live_fork(self, parent: SandboxHandle, config: SandboxConfig) -> SandboxHandle:
        if Capability.LIVE_FORK not in self.capabilities():
            raise UnsupportedCapabilityError(
                "a live fork needs gVisor (runsc) on a local Docker engine in experimental mode "
                "(`make engine` sets it; runc cannot: CRIU fails on this kernel); use fork(live=False)"
            )
        if self.workspace_path(parent) is None or config.limits.workspace_medium != "disk":
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
            raise UnsupportedCapabilityError(_ONCE + "; use fork(live=False)")
        freeze = parent.info.setdefault("freeze", _Freeze())
        cid = parent.info["container"]
        with freeze.user_lock:
            with freeze.lock:
                if freeze.count or freeze.user:
                    raise UnsupportedCapabilityError(
                        "the sandbox is frozen by another fork or snapshot right now; try again, "
                        "or use fork(live=False)"
                    )
                checkpoint.delete(self.api, cid, checkpoint.FORK_NAME)  # a previous fork's
                with map_docker_errors("checkpointing the sandbox for a live fork"):
                    checkpoint.create(self.api, cid, checkpoint.FORK_NAME)
                # Held while stopped: the workspace clone's freeze is then a no-op.
                freeze.count += 1
                freeze.checkpointed = True
            back: list[_Background] = []

            def restore_parent() -> None:
                # Called once the child's workspace is cloned: from then on the
                # parent may run again, restored while the child is (runsc's
                # two restores, about a second each here, overlap).
                if not back:
                    back.append(_Background(lambda: self._restore(parent, checkpoint.FORK_NAME)))

            try:
                source = checkpoint.directory(self.engine_info(), cid, checkpoint.FORK_NAME)
                child = self._create(config, parent, restore_from=source, after_clone=restore_parent)
            finally:
                try:
                    # The parent comes back whatever became of the child.
                    if back:
                        back[0].result()
                    else:
                        self._restore(parent, checkpoint.FORK_NAME)
                finally:
                    with freeze.lock:
                        freeze.count -= 1
                        freeze.checkpointed = False
        return child

    def checkpoints(self) -> bool:
        """Whether this backend pauses its sandboxes through gVisor checkpoints (see :mod:`.checkpoint`)."""
        return (
            self._is_gvisor()
            and storage.local_engine(self.spec.docker_host)
            and checkpoint.supported(self.engine_info())
        )

    def _record(self, handle: SandboxHandle, *, paused: bool) -> None:
        """Keep (or update) the record another process resumes this sandbox from (see :mod:`.checkpoint`)."""
        config = handle.info.get("config")
        if not isinstance(config, SandboxConfig):
            return
        try:
            checkpoint.write_record(
                handle.id,
                {
                    "sandbox_id": handle.id,
                    "backend": self.name,
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
        if Capability.PAUSE not in self.capabilities() or not self.checkpoints():
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
                running = self.api.containers(
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
                found = self.api.inspect_container(cid)
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
        }
        name = record.get("workspace")
        pool = self.storage_pool()
        if isinstance(name, str) and config.limits.workspace_medium == "disk":
            if pool is None:
                raise RuntimeNotAvailableError(
                    f"sandbox {sandbox_id}'s workspace is in the storage pool, which is not mounted; "
                    "`agentnest setup` mounts it again"
                )
            info.update(workspace_pool=pool, workspace_name=name, workspace_path=pool.path(name))
        freeze = _Freeze()
        freeze.user = freeze.checkpointed = True
        freeze.count = 1
        info["freeze"] = freeze
        handle = SandboxHandle(id=sandbox_id, backend=self.name, deadline=float(deadline), info=info)
        self._record(handle, paused=True)  # this process owns it now (prune --orphans)
        return handle, config

    def _restore(self, handle: SandboxHandle, name: str) -> None:
        """Start the stopped container from checkpoint ``name``; its new stream waits in the handle."""
        cid = handle.info["container"]
        with map_docker_errors("restoring the sandbox"):
            # Attach before the start, as at create: no byte of the restored agent is lost.
            wrapper = self.api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        stream = DockerMuxStream(_raw_socket(wrapper), owner=wrapper, eof_marker=bootstrap.AGENT_EXITED)
        try:
            with map_docker_errors("restoring the sandbox"):
                checkpoint.restore(self.api, self.engine_info(), cid, name)
                pid = handle.info.get("agent_pid")
                if isinstance(pid, int) and pid > 0:
                    checkpoint.wake(self.api, cid, pid, handle.info["user"])
        except BaseException:
            stream.close()
            raise
        handle.info["stream"] = stream
        handle.info["checkpoint_restored"] = True

    def _hold(self, handle: SandboxHandle, *, fast: bool = True) -> None:
        cid = handle.info["container"]
        freeze = handle.info.setdefault("freeze", _Freeze())
        with freeze.lock:
            if freeze.count == 0:
                freeze.how = self._pause(cid, fast=fast)
            freeze.count += 1

    def _release(self, handle: SandboxHandle) -> None:
        cid = handle.info["container"]
        freeze = handle.info.setdefault("freeze", _Freeze())
        with freeze.lock:
            freeze.count -= 1
            if freeze.count == 0:
                self._unpause(cid, freeze.how)

    def _pause(self, cid: str, *, fast: bool = True) -> str:
        """Freeze the container; return how (``"cgroup"`` or ``"docker"``), for :meth:`_unpause`.

        On this host, the container's freezer cgroup directly: the same freezer
        ``docker pause`` uses on runc, without two engine round trips (~2 ms
        instead of 40-150 ms measured here; a fork or snapshot holds it for
        milliseconds).  Else ``docker pause``, tried again a few times: runc's
        cgroup-v1 freezer gives up ("unable to freeze") when a task does not stop
        in time, e.g. one in uninterruptible sleep under heavy writeback
        (measured here right after 100 MiB were written); a moment later it works.
        """
        import docker.errors

        if fast and _cgroup_freeze(cid, True):
            return "cgroup"
        for attempt in range(6):
            try:
                self.api.pause(cid)
                return "docker"
            except docker.errors.APIError as exc:
                if "unable to freeze" not in _explain(exc) or attempt == 5:
                    with map_docker_errors("pausing the sandbox"):
                        raise
                time.sleep(0.02 * 2**attempt)  # backoff between retries: 20 ms to 320 ms
        raise AssertionError("unreachable")  # pragma: no cover

    def _unpause(self, cid: str, how: str) -> None:
        if how == "cgroup" and _cgroup_freeze(cid, False):
            return
        with map_docker_errors("resuming the sandbox"):
            self.api.unpause(cid)

    @contextlib.contextmanager
    def frozen_workspace(self, handle: SandboxHandle) -> Iterator[Path]:
        pool, name = handle.info.get("workspace_pool"), handle.info.get("workspace_name")
        if not isinstance(pool, storage.StoragePool) or not isinstance(name, str):
            raise UnsupportedCapabilityError("this sandbox's workspace is not in the storage pool")
        with self.frozen(handle):
            copy = pool.frozen_copy(name)
            path = copy.__enter__()
        try:
            yield path
        finally:
            copy.__exit__(None, None, None)

    def _create(
        self,
        config: SandboxConfig,
        workspace_from: SandboxHandle | None,
        restore_from: Path | None = None,
        *,
        spare: bool = False,
        after_clone: Callable[[], None] | None = None,
    ) -> SandboxHandle:
        allowlist = config.network.mode is NetworkMode.ALLOWLIST
        if allowlist and Capability.EGRESS_DOMAINS not in self.capabilities():
            raise UnsupportedCapabilityError(
                f"the egress allowlist is not available with OCI runtime {self.spec.oci_runtime!r} "
                "(only runc and runsc are tested); use NetworkPolicy.denied() (no sandbox was created)"
            )
        if config.network.mode is NetworkMode.OPEN and Capability.NETWORK_OPEN not in self.capabilities():
            raise UnsupportedCapabilityError(
                f"open networking is not available with OCI runtime {self.spec.oci_runtime!r}"
            )
        oci_runtime = self.spec.allowlist_oci_runtime() if allowlist else self.spec.oci_runtime
        self.check_runtime(oci_runtime)
        self._check_confinement(config)
        config, image_info = images.resolve_image(config, self.spec.image_aliases)  # the alias, if any
        self._ensure_image(config.image)
        sandbox_id = os.urandom(6).hex()
        created = time.time()
        # A warm container waits up to SPARE_MAX_AGE to become a fork's child,
        # which then moves the deadline to its own (claim_spare).
        lifetime = config.lifetime + (SPARE_MAX_AGE if spare else 0.0)
        deadline = created + lifetime
        topology: egress.EgressTopology | None = None
        proxy_start: _Background | None = None
        if allowlist:
            topology, proxy_start = self._start_egress(config, sandbox_id, created, deadline)
        try:
            handle = self._create_container(
                config,
                sandbox_id,
                created,
                deadline,
                oci_runtime,
                topology,
                workspace_from,
                restore_from,
                slot=spare,
                after_clone=after_clone,
            )
        except BaseException:
            if topology is not None:
                self._teardown_egress(topology, proxy_start)
            raise
        handle.info.update(image_info)
        handle.info["config"] = config  # what the caller asked for: a pause-to-disk record keeps it
        if topology is not None:
            handle.info["egress_topology"] = topology
            handle.info["egress"] = topology.log
            try:
                assert proxy_start is not None
                proxy_start.result()
                topology.wait_ready()
            except BaseException:
                self.destroy(handle)
                raise
        return handle

    def _check_confinement(self, config: SandboxConfig) -> None:
        """Refuse, before anything exists, confinement settings this engine cannot honour.

        Fail closed: 0.3.0 passed these to the engine and hoped; a setting
        that cannot take effect refuses the sandbox here.
        """
        options = [str(o) for o in self.engine_info().get("SecurityOptions") or ()]
        if config.rootless and not any("name=rootless" in o for o in options):
            raise UnsupportedCapabilityError(
                "the security policy requires a rootless Docker engine (rootless=True) and this engine "
                "runs as root; run the engine rootless (dockerd-rootless-setuptool.sh) or drop "
                "rootless=True; no sandbox was created"
            )
        if config.apparmor_profile is not None and not any("name=apparmor" in o for o in options):
            raise UnsupportedCapabilityError(
                f"the security policy asks for AppArmor profile {config.apparmor_profile!r}, but this "
                "engine's host has no AppArmor (the engine does not report it); use a host with AppArmor "
                "or drop apparmor_profile; no sandbox was created"
            )
        _custom_seccomp(config)  # unreadable or malformed: refused now, not by the engine

    def _security_opt(self, config: SandboxConfig) -> list[str]:
        custom = _custom_seccomp(config)
        opts = [
            "no-new-privileges:true",
            f"seccomp={custom or seccomp.profile_json(self._arch(), gvisor=self._is_gvisor())}",
        ]
        if config.apparmor_profile is not None:
            opts.append(f"apparmor={config.apparmor_profile}")
        return opts

    def _start_egress(
        self, config: SandboxConfig, sandbox_id: str, created: float, deadline: float
    ) -> tuple[egress.EgressTopology, _Background]:
        """Create the sandbox's internal network, and start its proxy in the background."""
        from .images import base_image

        self.check_runtime(self.spec.proxy_oci_runtime)
        proxy_image = config.proxy_image or self.spec.proxy_image or base_image()
        self._ensure_image(proxy_image)
        topology = egress.EgressTopology(
            self.api,
            sandbox_id=sandbox_id,
            backend=self.name,
            created=created,
            deadline=deadline,
            policy=config.network,
            hosts=self.spec.egress_hosts,
            image=proxy_image,
            python=self.spec.python,
            oci_runtime=self.spec.proxy_oci_runtime,
            egress_network=self.spec.egress_network,
            subnets=self.spec.egress_subnets,
            arch=self._arch(),
            extra_labels=config.labels,
        )
        topology.create_network()
        # The proxy and the sandbox container start at the same time; the
        # proxy's address is fixed in advance, so neither waits for the other.
        return topology, _Background(topology.start_proxy)

    def _teardown_egress(self, topology: egress.EgressTopology, proxy_start: _Background | None) -> None:
        if proxy_start is not None:
            with contextlib.suppress(Exception):
                proxy_start.result()
        try:
            topology.remove_proxy()
        finally:
            topology.remove_network()

    def _create_container(
        self,
        config: SandboxConfig,
        sandbox_id: str,
        created: float,
        deadline: float,
        oci_runtime: str,
        topology: egress.EgressTopology | None,
        workspace_from: SandboxHandle | None = None,
        restore_from: Path | None = None,
        *,
        slot: bool = False,
        after_clone: Callable[[], None] | None = None,
    ) -> SandboxHandle:
        uid, _, gid = config.user.partition(":")
        gid = gid or uid
        limits = config.limits
        env = {
            "PATH": _CONTAINER_PATH,
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env.update(config.container_environment())
        env["AGENTNEST_WORKSPACE"] = config.workdir
        if topology is not None:
            env.update(topology.sandbox_environment())
        api = self.api
        import docker.types

        tmpfs_opts = f"rw,nosuid,nodev,uid={uid},gid={gid}"
        tmpfs = {"/tmp": f"{tmpfs_opts},mode=1777,size={limits.scratch}"}
        binds: list[docker.types.Mount] = []
        handle_info: dict[str, Any] = {}
        if limits.workspace_medium == "disk":
            pool = self.storage_pool()
            if pool is None:
                raise UnsupportedCapabilityError(
                    "this engine has no storage pool for a disk workspace; make one as root with "
                    "`agentnest setup`, or use workspace='memory'"
                )
            if slot:
                # No workspace yet: claim_spare mounts one on the slot, and mount
                # propagation (rslave: host to container, never back) shows it here.
                path = pool.make_slot(sandbox_id)
                handle_info.update(workspace_pool=pool, slot=sandbox_id)
                binds.append(docker.types.Mount(config.workdir, str(path), type="bind", propagation="rslave"))
            elif workspace_from is None:
                path = pool.create(sandbox_id, limits.workspace, int(uid), int(gid))
            else:
                # A fork: the parent stops for the instant of the snapshot, so
                # the child gets exactly the parent's files at that instant.
                with self.frozen(workspace_from):
                    path = pool.clone(workspace_from.info["workspace_name"], sandbox_id, limits.workspace)
                if after_clone is not None:
                    after_clone()
            if not slot:
                handle_info.update(workspace_pool=pool, workspace_name=sandbox_id, workspace_path=path)
                # A bind mount of the sandbox's own subvolume, nothing above it;
                # the pool is mounted nosuid,nodev on the host (storage.setup).
                binds.append(
                    docker.types.Mount(config.workdir, str(path), type="bind", propagation="rprivate")
                )
        else:
            tmpfs[config.workdir] = f"{tmpfs_opts},mode=0755,size={limits.workspace}"
        device_requests = (
            [docker.types.DeviceRequest(count=limits.gpus, capabilities=[["gpu"]])] if limits.gpus else None
        )
        host_config = api.create_host_config(
            # Resource ceilings; memswap == memory means no swap.
            mem_limit=limits.memory,
            memswap_limit=limits.memory,
            nano_cpus=int(limits.cpus * 1e9),
            pids_limit=self._pids_ceiling(limits.pids),
            # The image is never written; only the tmpfs mounts and the workspace are.
            read_only=config.read_only_root,
            tmpfs=tmpfs,
            mounts=binds or None,
            # No capability at all, and no way to gain one through setuid binaries.
            cap_drop=["ALL"],
            security_opt=self._security_opt(config),
            network_mode=self._network_mode(config, topology),
            # With an allowlist, the embedded resolver's only upstream is the
            # proxy's address, where nothing answers DNS: a query for any
            # name other than the two containers' fails inside the sandbox's
            # own network namespace, instead of reaching the host's resolvers.
            dns=[topology.proxy_ip] if topology is not None else None,
            # No init process: PID 1 is the deadline keeper (see bootstrap),
            # which also reaps orphans.
            init=False,
            runtime=oci_runtime,
            ipc_mode="private",
            # No container log: the agent channel runs over the container's
            # stdio, so a log would keep every command's output (secrets
            # included) in a host file that sandbox code could grow at will.
            log_config=docker.types.LogConfig(type="none", config={}),
            ulimits=self._ulimits(config),
            # Under memory pressure on the host, the sandbox dies first.
            oom_score_adj=500,
            device_requests=device_requests,
        )
        container_labels = labels.for_sandbox(sandbox_id, self.name, created, deadline)
        container_labels.update(config.labels)
        networking = None
        if topology is not None:
            # types-docker says EndpointConfig; docker-py takes {network name: EndpointConfig}.
            endpoint = api.create_endpoint_config(ipv4_address=topology.sandbox_ip)
            networking = docker.types.NetworkingConfig({topology.network_name: endpoint})  # type: ignore[arg-type]
        try:
            with map_docker_errors("creating the sandbox container", config.image):
                cid = api.create_container(
                    config.image,
                    command=bootstrap.command("keeper", self.spec.python, deadline - created),
                    user=f"{uid}:{gid}",
                    environment=env,
                    working_dir=config.workdir,
                    labels=container_labels,
                    host_config=host_config,
                    # detach=False with stdin_open sets StdinOnce: when the host's
                    # attach connection goes away, the agent sees end-of-file.
                    stdin_open=True,
                    tty=False,
                    # Never copy the host's client proxy settings into a sandbox.
                    use_config_proxy=False,
                    hostname="sandbox",
                    name=f"agentnest-{sandbox_id}",
                    networking_config=networking,
                )["Id"]
        except BaseException:
            _remove_workspace(handle_info)
            raise
        handle = SandboxHandle(
            id=sandbox_id,
            backend=self.name,
            deadline=deadline,
            info={
                "container": cid,
                "user": f"{uid}:{gid}",
                "workdir": config.workdir,
                "env": env,
                **handle_info,
            },
        )
        try:
            with (
                _explain_start_failure(config.image, self.spec.python),
                map_docker_errors("starting the sandbox container", config.image),
            ):
                # Attach before start so the agent's first bytes are not lost.
                wrapper = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
                handle.info["stream"] = DockerMuxStream(
                    _raw_socket(wrapper), owner=wrapper, eof_marker=bootstrap.AGENT_EXITED
                )
                if restore_from is None or workspace_from is None:
                    api.start(cid)
                else:
                    # A live fork: the parent's checkpoint, started in this container.
                    name = checkpoint.FORK_NAME
                    checkpoint.copy(restore_from, checkpoint.directory(self.engine_info(), cid, name))
                    checkpoint.restore(api, self.engine_info(), cid, name)
                    pid = workspace_from.info.get("agent_pid")
                    if isinstance(pid, int) and pid > 0:
                        checkpoint.wake(api, cid, pid, handle.info["user"])
                    handle.info["reconnect_ids"] = workspace_from.info.get("reconnect_ids", 1)
                    handle.info["checkpoint_restored"] = True
        except BaseException:
            self.destroy(handle)
            raise
        return handle

    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        stream = handle.info.pop("stream", None)
        if isinstance(stream, ByteStream):
            return stream
        # A later agent: start one next to the running keeper.
        cid = handle.info["container"]
        with map_docker_errors("restarting the in-sandbox agent"):
            exec_id = self.api.exec_create(
                cid,
                bootstrap.command("agent", self.spec.python),
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                user=handle.info["user"],
                environment=handle.info["env"],
                workdir=handle.info["workdir"],
            )["Id"]
            wrapper = self.api.exec_start(exec_id, socket=True)
        return DockerMuxStream(_raw_socket(wrapper), owner=wrapper)

    def destroy(self, handle: SandboxHandle) -> None:
        stream = handle.info.pop("stream", None)
        if isinstance(stream, ByteStream):
            stream.close()
        # ``egress`` (the event log) stays on the handle: it is readable after destroy.
        topology = handle.info.pop("egress_topology", None)
        proxy_removal = _Background(topology.remove_proxy) if topology is not None else None
        try:
            self._remove_sandbox_container(handle)
            checkpoint.remove_record(handle.id)
            # After the container: its bind mount pins the subvolume until then.
            _remove_workspace(handle.info)
        finally:
            if topology is not None and proxy_removal is not None:
                try:
                    proxy_removal.result()
                finally:
                    topology.remove_network()

    def _remove_sandbox_container(self, handle: SandboxHandle) -> None:
        cid = handle.info.get("container")
        if not cid:
            return
        import docker.errors

        with map_docker_errors("removing the sandbox container"):
            try:
                self.api.remove_container(cid, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # removal already in progress
                    raise

    def extend(self, handle: SandboxHandle, deadline: float) -> None:
        # Labels cannot change: the new deadline goes into the container, for
        # its keeper and for prune (see deadline.py for why sandbox code cannot forge it).
        from . import deadline as moved

        topology = handle.info.get("egress_topology")
        if topology is not None and topology.proxy_id:
            # The proxy first, so the sandbox never outlives its way out; it reads
            # the same kind of root-owned deadline file as the sandbox's keeper.
            moved.write(self.api, topology.proxy_id, self.spec.python, deadline)
        self._move_deadline(handle, deadline)
        handle.deadline = deadline

    def _move_deadline(self, handle: SandboxHandle, deadline: float) -> None:
        from . import deadline as moved

        cid, pid = handle.info["container"], handle.info.get("pid")
        # Straight into the container on this host (runc: /proc/PID/root is the
        # container's own view); through the engine otherwise.
        local = not self._is_gvisor() and storage.local_engine(self.spec.docker_host)
        if not (local and isinstance(pid, int) and moved.write_local(pid, cid, deadline)):
            moved.write(self.api, cid, self.spec.python, deadline)

    def is_running(self, handle: SandboxHandle) -> bool:
        import docker.errors

        try:
            state = self.api.inspect_container(handle.info["container"])["State"]
        except docker.errors.NotFound:
            return False
        return bool(state.get("Running"))

    def exit_reason(self, handle: SandboxHandle) -> str | None:
        import docker.errors

        try:
            state = self.api.inspect_container(handle.info["container"])["State"]
        except docker.errors.NotFound:
            return "its container was removed"
        if state.get("OOMKilled"):
            gvisor = " (under gVisor the whole sandbox shares one memory limit)" if self._is_gvisor() else ""
            return f"it ran out of memory and the engine killed it{gvisor}; raise memory= or use less"
        if not state.get("Running"):
            return f"its container exited with code {state.get('ExitCode')}"
        return None

    def logs(self, handle: SandboxHandle, tail: int = 200) -> str:
        import docker.errors

        try:
            raw = self.api.logs(handle.info["container"], tail=tail)
        except docker.errors.APIError:
            return ""  # gone, or the "none" log driver (the default here)
        return bytes(raw[-65536:]).decode("utf-8", "replace")

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

    # -- helpers -------------------------------------------------------------

    @staticmethod
    def _network_mode(config: SandboxConfig, topology: egress.EgressTopology | None) -> str:
        if topology is not None:
            return topology.network_name  # the internal network, and nothing else
        return "bridge" if config.network.mode is NetworkMode.OPEN else "none"

    def _ulimits(self, config: SandboxConfig) -> list[Any]:
        import docker.types

        limits = config.limits
        out = [
            docker.types.Ulimit(name="core", soft=0, hard=0),
            docker.types.Ulimit(name="nofile", soft=4096, hard=4096),
        ]
        if self._is_gvisor():
            # gVisor keeps all of a sandbox's memory and processes in one host
            # process tree: a workload that hits the cgroup's memory or PID
            # limit takes the whole sandbox down with it.  Per-sandbox rlimits,
            # enforced by gVisor's own kernel, stop the offending process
            # first.  (Not on runc: there RLIMIT_NPROC counts every process of
            # UID 65532 on the host, across all sandboxes.)
            # The Sentry itself needs memory too (_GVISOR_OVERHEAD).
            in_memory = limits.scratch + (limits.workspace if limits.workspace_medium == "memory" else 0)
            address_space = max(limits.memory - in_memory - _GVISOR_OVERHEAD, 64 * 2**20)
            out.append(docker.types.Ulimit(name="nproc", soft=limits.pids, hard=limits.pids))
            out.append(docker.types.Ulimit(name="as", soft=address_space, hard=address_space))
        return out

    def _is_gvisor(self) -> bool:
        return self.spec.oci_runtime.startswith("runsc")

    def _pids_ceiling(self, pids: int) -> int:
        """The cgroup PID limit that gives the workload ``pids`` processes.

        Under gVisor the cgroup also holds the Sentry and, on the ptrace
        platform, a host thread per application thread: the same number
        would kill the whole sandbox long before the workload reaches it.
        The headroom keeps the limit meaningful (a fork bomb still stops)
        without starving gVisor itself.
        """
        if self._is_gvisor():
            return pids * 6 + 512
        return pids

    def _arch(self) -> str:
        return str(self.engine_info().get("Architecture", "x86_64"))

    def _ensure_image(self, image: str) -> None:
        import docker.errors

        if image in self._known_images:
            return  # seen before; if it was removed since, create reports it
        try:
            with map_docker_errors("looking up the image", image):
                self.api.inspect_image(image)  # type: ignore[no-untyped-call]
            self._known_images.add(image)
            return
        except ImageNotFoundError:
            if not self.spec.pull or image.startswith(_base_repository() + ":"):
                raise
        try:
            repo, tag = _split_ref(image)
            self.api.pull(repo, tag=tag)
        except (docker.errors.APIError, docker.errors.DockerException, OSError):
            raise ImageNotFoundError(_missing_image_hint(image)) from None


#: Where a container's freezer lives: cgroup v1 (cgroupfs driver), v2 cgroupfs, v2 systemd.
_FREEZERS = (
    ("/sys/fs/cgroup/freezer/docker/{}/freezer.state", "FROZEN", "THAWED"),
    ("/sys/fs/cgroup/docker/{}/cgroup.freeze", "1", "0"),
    ("/sys/fs/cgroup/system.slice/docker-{}.scope/cgroup.freeze", "1", "0"),
)


def _cgroup_freeze(cid: str, on: bool) -> bool:
    """Freeze (or thaw) container ``cid`` through its freezer cgroup; False where there is none.

    Freezing waits until the kernel reports every task frozen (bounded: 2 s);
    one that will not freeze is thawed again and False returned, so the caller
    falls back to ``docker pause``.
    """
    if not all(c in "0123456789abcdef" for c in cid) or len(cid) != 64:
        return False
    for template, frozen, thawed in _FREEZERS:
        path = template.format(cid)
        if not os.path.exists(path):
            continue
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(frozen if on else thawed)
            if not on:
                return True
            until = time.monotonic() + 2.0
            while time.monotonic() < until:
                if _is_frozen(path):
                    return True
                time.sleep(0.001)  # the kernel's freezing is asynchronous: poll its state
            with open(path, "w", encoding="ascii") as f:
                f.write(thawed)
        except OSError:
            return False
        return False
    return False


def _is_frozen(path: str) -> bool:
    if path.endswith("freezer.state"):
        with open(path, encoding="ascii") as f:
            return f.read().strip() == "FROZEN"
    events = path.rsplit("/", 1)[0] + "/cgroup.events"
    with open(events, encoding="ascii") as f:
        return "frozen 1" in f.read()


#: Why a container restored from a checkpoint is not checkpointed again.
_ONCE = (
    "this sandbox was restored from a gVisor checkpoint (a pause to disk or a live fork), and a second "
    "checkpoint of it leaves its old task behind in containerd (Docker 20.10, runsc 20221219: the next "
    "restore fails with 'id already in use'), so it pauses with the freezer and forks its files only"
)


class _Freeze:
    """How many holders want a sandbox frozen right now (see ``DockerBackend.frozen``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        # Whether the owner's pause() is one of the holders; user_lock orders
        # pause against resume (taken before ``lock``, never the other way).
        self.user = False
        self.user_lock = threading.Lock()
        self.how = "docker"  # how the current freeze was made: thawed the same way
        # The owner's pause is a gVisor checkpoint: the container is stopped.
        self.checkpointed = False


class _Background:
    """Run ``fn`` in a thread now; ``result()`` joins it and re-raises its exception."""

    def __init__(self, fn: Any) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Any) -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


@contextlib.contextmanager
def _explain_start_failure(image: str, python: str) -> Iterator[None]:
    """Name the usual cause when the keeper cannot start: no Python in the image."""
    try:
        yield
    except BackendError as exc:
        text = str(exc)
        if "executable file not found" in text or "no such file or directory" in text.lower():
            raise BackendError(
                f"the image {image!r} cannot run {python!r}, which the in-sandbox agent needs; use an image "
                f"with python3 (e.g. the default, `agentnest image base`) or set DockerSpec(python=...). "
                f"Engine said: {text[-300:]}"
            ) from None
        raise


def _base_repository() -> str:
    from .images import BASE_REPOSITORY

    return BASE_REPOSITORY


def _split_ref(image: str) -> tuple[str, str | None]:
    if "@" in image:
        return image, None
    name, sep, tag = image.rpartition(":")
    if sep and "/" not in tag:
        return name, tag
    return image, "latest"


def _raw_socket(obj: Any) -> socket.socket:
    """The plain socket under docker-py's hijacked response wrapper."""
    sock = getattr(obj, "_sock", obj)
    if not isinstance(sock, socket.socket):
        raise BackendError(f"unexpected attach stream type {type(sock).__name__}")
    return sock


def _remove_workspace(info: dict[str, Any]) -> None:
    """Delete a sandbox's disk workspace and its slot (idempotent: each name is dropped once done)."""
    pool = info.get("workspace_pool")
    if not isinstance(pool, storage.StoragePool):
        return
    slot = info.get("slot")
    if isinstance(slot, str):
        pool.remove_slot(slot)  # first: the workspace mounted on it is busy until then
        del info["slot"]
    name = info.get("workspace_name")
    if isinstance(name, str):
        pool.remove(name)
        del info["workspace_name"]
    info.pop("workspace_pool", None)


def _custom_seccomp(config: SandboxConfig) -> str | None:
    """The policy's own seccomp profile as compact JSON, or None for AgentNest's."""
    profile = config.seccomp_profile
    if profile is None:
        return None
    text = profile
    if not profile.lstrip().startswith("{"):
        # A path on this host, as `docker run --security-opt seccomp=FILE` reads it.
        try:
            text = Path(profile).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(
                f"seccomp_profile {profile!r} cannot be read ({exc.strerror}); give a path to a "
                "seccomp JSON file or the JSON itself"
            ) from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"seccomp_profile is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "defaultAction" not in doc:
        raise ConfigurationError(
            "seccomp_profile must be a Docker seccomp profile (a JSON object with 'defaultAction')"
        )
    return json.dumps(doc, separators=(",", ":"))
