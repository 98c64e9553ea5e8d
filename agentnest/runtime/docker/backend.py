"""The Docker backend: runc by default, gVisor (runsc) or Kata by runtime name.

Every sandbox is one container created with these defaults (each is a
security choice, explained where it is decided: :mod:`.hardening`, the pure
builder of the container's create kwargs, which this module applies):

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
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...channel.streams import ByteStream, DockerMuxStream
from ...config import SandboxConfig
from ...errors import (
    BackendError,
    ConfigurationError,
    ImageNotFoundError,
    MissingDependencyError,
    RuntimeNotAvailableError,
    UnsupportedCapabilityError,
)
from ...policy import NetworkMode
from .. import bootstrap, launch, mounts, storage
from ..base import Capability, RuntimeBackend, SandboxHandle
from . import checkpoint, egress, gpus, hardening, images, labels
from .engine import Background, engine_client, map_docker_errors, missing_image_hint, raw_socket
from .freeze import Freezer
from .hardening import REATTACH_SOCKET
from .live import LiveState
from .spec import DockerSpec

if TYPE_CHECKING:
    import docker

#: How long a warm container (create_spare) may wait to become a fork's child.
SPARE_MAX_AGE = 300.0


class DockerBackend(RuntimeBackend):
    """Sandboxes as hardened Docker containers.  Thread-safe."""

    def __init__(self, spec: DockerSpec | None = None, *, name: str = "docker") -> None:
        self.spec = spec or DockerSpec()
        self.name = name
        self._api: docker.APIClient | None = None
        self._info: dict[str, Any] | None = None
        self._gpu_facts: gpus.GPUFacts | None = None
        self._lock = threading.Lock()
        self._known_images: set[str] = set()
        self._pool: storage.StoragePool | None = None
        # Why warm forks stopped working here (a slot's mount did not reach
        # its container), or None.
        self._warm_broken: str | None = None
        self.freezer = Freezer(lambda: self.api)
        self._live = LiveState(
            self, create=self._create, gvisor=self._is_gvisor(), docker_host=self.spec.docker_host
        )

    # -- engine --------------------------------------------------------------

    @property
    def api(self) -> docker.APIClient:
        if self._api is None:
            with self._lock:
                if self._api is None:
                    try:
                        from docker.utils import kwargs_from_env
                    except ImportError:  # pragma: no cover - docker is a core dependency
                        raise MissingDependencyError(
                            "the Docker backend needs docker-py: pip install agentnest"
                        ) from None
                    with map_docker_errors("connecting to Docker"):
                        kwargs: dict[str, Any] = dict(kwargs_from_env())
                        if self.spec.docker_host:
                            kwargs["base_url"] = self.spec.docker_host
                        self._api = engine_client(self.spec.engine_timeout(), version="auto", **kwargs)
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

    def gpu_support(self, oci_runtime: str | None = None) -> gpus.GPUSupport:
        """Whether, and how, this engine gives GPUs to sandboxes of ``oci_runtime`` (see :mod:`.gpus`)."""
        if self._gpu_facts is None:
            # Cached: the engine's runtimes, and the host's devices and toolkit, change with a restart.
            self._gpu_facts = gpus.gather(self.engine_info(), storage.local_engine(self.spec.docker_host))
        return gpus.decide(self._gpu_facts, oci_runtime or self.spec.oci_runtime)

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

    def frozen(self, handle: SandboxHandle) -> contextlib.AbstractContextManager[None]:
        # The freezer cgroup on runc, `runsc pause` on gVisor: every process
        # stops where it is, memory kept; nothing writes the workspace meanwhile.
        # Nested and concurrent freezes (parallel forks of one parent) share
        # one pause; a user's pause() is one more holder (see .freeze).
        return self.freezer.frozen(handle)

    def pause(self, handle: SandboxHandle) -> str:
        return self._live.pause(handle)

    def resume(self, handle: SandboxHandle) -> bool:
        return self._live.resume(handle)

    def create_live_fork(self, parent: SandboxHandle, config: SandboxConfig) -> SandboxHandle:
        return self._live.create_live_fork(parent, config)

    def attach_paused(self, sandbox_id: str) -> tuple[SandboxHandle, SandboxConfig]:
        return self._live.attach_paused(sandbox_id)

    def checkpoints(self) -> bool:
        """Whether this backend pauses its sandboxes through gVisor checkpoints (see :mod:`.checkpoint`)."""
        return self._live.checkpoints()

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
        # GPUs the engine cannot give, or more than the host has: refused here,
        # before any network, workspace or container exists.
        gpu = gpus.request(self.gpu_support(oci_runtime), config.limits.gpus) if config.limits.gpus else None
        config, image_info = images.resolve_image(config, self.spec.image_aliases)  # the alias, if any
        self._ensure_image(config.image)
        sandbox_id = os.urandom(6).hex()
        created = time.time()
        # A warm container waits up to SPARE_MAX_AGE to become a fork's child,
        # which then moves the deadline to its own (claim_spare).
        lifetime = config.lifetime + (SPARE_MAX_AGE if spare else 0.0)
        deadline = created + lifetime
        topology: egress.EgressTopology | None = None
        proxy_start: Background | None = None
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
                gpu=gpu,
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
        """Refuse, before anything exists, what this engine cannot honour (see hardening)."""
        hardening.check_confinement(config, self.engine_info().get("SecurityOptions") or ())
        # Unreadable or malformed: refused now, not by the engine.
        hardening.custom_profile(config, _read_profile)

    def _start_egress(
        self, config: SandboxConfig, sandbox_id: str, created: float, deadline: float
    ) -> tuple[egress.EgressTopology, Background]:
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
        return topology, Background(topology.start_proxy)

    def _teardown_egress(self, topology: egress.EgressTopology, proxy_start: Background | None) -> None:
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
        gpu: gpus.GPURequest | None = None,
    ) -> SandboxHandle:
        uid, _, gid = config.user.partition(":")
        gid = gid or uid
        limits = config.limits
        api = self.api
        workspace: hardening.WorkspaceBind | None = None
        handle_info: dict[str, Any] = {}
        if limits.workspace_medium == "disk":
            pool = self.storage_pool()
            if pool is None:
                raise UnsupportedCapabilityError(
                    "this engine has no storage pool for a disk workspace; make one as root with "
                    "`agentnest setup`, or use workspace='memory'"
                )
            if slot:
                # No workspace yet: claim_spare mounts one on the slot (see hardening).
                path = pool.make_slot(sandbox_id)
                handle_info.update(workspace_pool=pool, slot=sandbox_id)
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
            workspace = hardening.WorkspaceBind(str(path), slot=slot)
        container_labels = labels.for_sandbox(sandbox_id, self.name, created, deadline)
        if slot:
            container_labels[labels.WARM] = "true"  # for operators: `docker ps` shows spares as such
        plan = hardening.container(
            config,
            name=f"agentnest-{sandbox_id}",
            command=bootstrap.command("keeper", self.spec.python, deadline - created),
            labels=container_labels,
            oci_runtime=oci_runtime,
            gvisor=self._is_gvisor(),
            seccomp_profile=(
                hardening.custom_profile(config, _read_profile)
                or hardening.profile_json(self._arch(), gvisor=self._is_gvisor())
            ),
            workspace=workspace,
            egress=(
                hardening.EgressNetwork(
                    topology.network_name,
                    topology.sandbox_ip,
                    topology.proxy_ip,
                    topology.sandbox_environment(),
                )
                if topology is not None
                else None
            ),
            gpu=gpu,
        )
        try:
            with map_docker_errors("creating the sandbox container", config.image):
                host_config = api.create_host_config(**plan.host_config)
                cid = api.create_container(**plan.create, host_config=host_config)["Id"]
        except BaseException:
            _remove_workspace(handle_info)
            raise
        handle = SandboxHandle(
            id=sandbox_id,
            backend=self.name,
            deadline=deadline,
            info={
                "container": cid,
                "user": plan.user,
                "workdir": config.workdir,
                "env": plan.environment,
                # A lost stream reaches the same agent again (Sandbox._channel).
                "reattach": True,
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
                    raw_socket(wrapper), owner=wrapper, eof_marker=bootstrap.AGENT_EXITED
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
        """The agent's stream: the first one (attached before start), the same agent again, or a new one.

        While ``handle.info["reconnect_ids"]`` is set on a sandbox whose agent
        lingers (``reattach``: its first stream was lost, e.g. the engine
        restarted under it), the stream is an exec of ``agent/bridge.py`` to
        the agent's socket; the caller sends a ``reconnect`` frame, and if no
        agent answers there it asks again and gets a new agent.
        """
        stream = handle.info.pop("stream", None)
        if isinstance(stream, ByteStream):
            return stream
        if handle.info.get("reattach") and "reconnect_ids" in handle.info:
            what = "reconnecting to the in-sandbox agent"
            argv = launch.bridge_command(self.spec.python, REATTACH_SOCKET)
        else:
            # A later agent, next to the running keeper.  It lingers only if
            # it can take the socket's name: a second agent while the first
            # holds it (the server relaying a remote client's channel) ends
            # with its stream and kills its commands, as a dropped channel must.
            what = "restarting the in-sandbox agent"
            argv = bootstrap.command("agent", self.spec.python)
        with map_docker_errors(what):
            exec_id = self.api.exec_create(
                handle.info["container"],
                argv,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                user=handle.info["user"],
                environment=handle.info["env"],
                workdir=handle.info["workdir"],
            )["Id"]
            wrapper = self.api.exec_start(exec_id, socket=True)
        return DockerMuxStream(raw_socket(wrapper), owner=wrapper)

    def destroy(self, handle: SandboxHandle) -> None:
        stream = handle.info.pop("stream", None)
        if isinstance(stream, ByteStream):
            stream.close()
        # ``egress`` (the event log) stays on the handle: it is readable after destroy.
        topology = handle.info.pop("egress_topology", None)
        proxy_removal = Background(topology.remove_proxy) if topology is not None else None
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
            code = state.get("ExitCode")
            if code in (137, 143) and not self.engine_info().get("LiveRestoreEnabled"):
                # Killed from outside: the likeliest cause on an engine without
                # live-restore is dockerd restarting, which stops every container.
                return (
                    f"its container was killed (exit code {code}); this engine stops every container "
                    "when dockerd restarts (live-restore is off: `make engine` or "
                    '"live-restore": true in /etc/docker/daemon.json turns it on)'
                )
            return f"its container exited with code {code}"
        return None

    def ping(self) -> None:
        with map_docker_errors("pinging the Docker engine"):
            self.api.ping()

    def capacity(self) -> tuple[int | None, float | None]:
        """The engine host's memory (``docker info``); CPUs are not a capacity here.

        Memory limits that add up past the host's memory end in the kernel's OOM
        killer, so they are a real bound.  A ``--cpus`` limit is a ceiling on a
        time-shared resource: more of them than the host has cores only slows
        sandboxes down, so the operator's ``--capacity-cpus`` is the only CPU bound.
        """
        memory = self.engine_info().get("MemTotal")
        return (memory if isinstance(memory, int) and memory > 0 else None), None

    def reclaim(self, owners: Collection[str]) -> int:
        """Remove the containers, networks and volumes of ``owners`` whose process is gone
        (:func:`~agentnest.runtime.docker.prune.prune` limited to them)."""
        from .prune import prune

        if not owners:
            return 0
        report = prune(self.api, orphans=True, owners=frozenset(owners), pool=self.storage_pool())
        return len(report.containers)

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

    def _is_gvisor(self) -> bool:
        return self.spec.oci_runtime.startswith("runsc")

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
            if not self.spec.pull or image.startswith(images.BASE_REPOSITORY + ":"):
                raise
        try:
            repo, tag = images.split_ref(image)
            self.api.pull(repo, tag=tag)
        except (docker.errors.APIError, docker.errors.DockerException, OSError):
            raise ImageNotFoundError(missing_image_hint(image)) from None


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


def _read_profile(path: str) -> str:
    """A policy's seccomp profile named by a path on this host (``hardening.custom_profile`` checks it)."""
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"seccomp_profile {path!r} cannot be read ({exc.strerror}); give a path to a "
            "seccomp JSON file or the JSON itself"
        ) from None


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
