"""How a sandbox's container is confined on Docker, as data: ``SandboxConfig`` + facts -> create kwargs.

This module decides every setting of the sandbox container that confines it
(user, read-only root, capabilities, ``no-new-privileges``, seccomp, rlimits,
PID/memory/CPU ceilings, ``/tmp`` and ``/workspace`` mounts, network mode,
DNS, log driver, labels) and which confinement settings an engine cannot
honour.  It is pure: no I/O, and no engine library (no docker, socket,
subprocess or threading import).  What it must know beyond the config is
handed in as plain values: the OCI runtime, whether the backend is gVisor,
the seccomp profile's JSON, the engine's ``SecurityOptions``, where a disk
workspace lives on the host, the egress network's addresses, a GPU request.

:mod:`.backend` gathers those facts, makes the workspace and the network, and
applies the plan with docker-py (``create_host_config(**plan.host_config)``,
``create_container(**plan.create, host_config=...)``).  Every value here is
already in the engine's own shape (``Ulimit``, ``Mount``, ``LogConfig``,
``DeviceRequest`` and ``NetworkingConfig`` as the Engine API spells them), so
the golden files in ``tests/unit/golden/docker/`` show a reviewer exactly
what reaches the engine (tests/unit/test_docker_hardening.py); the real-engine
tests (tests/integration/test_defaults.py, tests/escapes/) prove it holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ...config import BROWSER_SHM, SandboxConfig
from ...errors import UnsupportedCapabilityError
from ...policy import NetworkMode
from ..bootstrap import NOFILE

if TYPE_CHECKING:
    from .gpus import GPURequest

__all__ = [
    "CONTAINER_PATH",
    "GVISOR_OVERHEAD",
    "REATTACH_SOCKET",
    "ContainerPlan",
    "EgressNetwork",
    "WorkspaceBind",
    "check_confinement",
    "container",
    "network_mode",
    "pids_ceiling",
    "security_opt",
    "ulimits",
]

#: Memory gVisor's own kernel (the Sentry) needs beside the workload.
GVISOR_OVERHEAD = 48 * 2**20
#: The agent's second door (see Agent's linger mode): an abstract unix socket,
#: which exists only in the sandbox's own network namespace and leaves no file
#: in the sandbox (its /tmp stays the user's).
REATTACH_SOCKET = "@agentnest-agent"
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True)
class WorkspaceBind:
    """A disk workspace: the host directory bind-mounted at the sandbox's workdir.

    Attributes:
        source: the host path (the sandbox's own subvolume, or a warm container's slot).
        slot: a warm container's empty slot, which a fork's workspace is mounted on later.
    """

    source: str
    slot: bool = False


@dataclass(frozen=True, slots=True)
class EgressNetwork:
    """An allowlisted sandbox's own internal network (see :mod:`.egress`).

    Attributes:
        name: the internal network, the container's only one.
        sandbox_ip: the sandbox's fixed address on it.
        proxy_ip: the filtering proxy's address, the only way out.
        environment: the variables that send HTTP(S) clients to the proxy.
    """

    name: str
    sandbox_ip: str
    proxy_ip: str
    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """Everything the sandbox container is created with.

    Attributes:
        create: keyword arguments of docker-py's ``APIClient.create_container``
            (``host_config`` aside).
        host_config: keyword arguments of ``APIClient.create_host_config``.
    """

    create: dict[str, Any]
    host_config: dict[str, Any]

    @property
    def user(self) -> str:
        """``uid:gid`` the sandbox's processes run as."""
        return str(self.create["user"])

    @property
    def environment(self) -> dict[str, str]:
        """The container's environment (also what later agents are started with)."""
        return dict(self.create["environment"])

    def as_json(self) -> dict[str, Any]:
        """Both halves as one JSON-ready document (what the golden files hold)."""
        return {"create_container": self.create, "host_config": self.host_config}


def check_confinement(config: SandboxConfig, security_options: Sequence[str]) -> None:
    """Refuse, before anything exists, confinement settings this engine cannot honour.

    ``security_options`` is the engine's ``info()["SecurityOptions"]``.  Fail
    closed: 0.3.0 passed these to the engine and hoped; a setting that cannot
    take effect refuses the sandbox here.  (A policy's own seccomp profile is
    read and checked by the backend: that reads a file.)
    """
    options = [str(o) for o in security_options]
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


def security_opt(config: SandboxConfig, seccomp_profile: str) -> list[str]:
    """``no-new-privileges``, the seccomp profile (its JSON), and the policy's AppArmor profile if any."""
    opts = [
        # No way to gain a privilege through setuid binaries or file capabilities.
        "no-new-privileges:true",
        # AgentNest's profile (see .seccomp) or the policy's own: never the engine's default.
        f"seccomp={seccomp_profile}",
    ]
    if config.apparmor_profile is not None:
        opts.append(f"apparmor={config.apparmor_profile}")
    return opts


def ulimits(config: SandboxConfig, *, gvisor: bool) -> list[dict[str, Any]]:
    """The sandbox's rlimits, as the Engine API spells them (``Name``, ``Soft``, ``Hard``)."""
    limits = config.limits
    # No core dumps (they would write the workload's memory, secrets included,
    # into the workspace), and a fixed open-file ceiling per process.
    out: list[dict[str, Any]] = [
        {"Name": "core", "Soft": 0, "Hard": 0},
        {"Name": "nofile", "Soft": NOFILE, "Hard": NOFILE},
    ]
    if gvisor:
        # gVisor keeps all of a sandbox's memory and processes in one host
        # process tree: a workload that hits the cgroup's memory or PID
        # limit takes the whole sandbox down with it.  Per-sandbox rlimits,
        # enforced by gVisor's own kernel, stop the offending process
        # first.  (Not on runc: there RLIMIT_NPROC counts every process of
        # UID 65532 on the host, across all sandboxes.)
        # The Sentry itself needs memory too (GVISOR_OVERHEAD).
        in_memory = limits.scratch + (limits.workspace if limits.workspace_medium == "memory" else 0)
        address_space = max(limits.memory - in_memory - GVISOR_OVERHEAD, 64 * 2**20)
        out.append({"Name": "nproc", "Soft": limits.pids, "Hard": limits.pids})
        # Not for a browser: Chromium reserves tens of GiB of address space
        # at start (V8's heap cage, PartitionAlloc's pools) and dies on a
        # CHECK without it.  Nor for GPUs (opt-in nvproxy): CUDA maps the
        # device's memory into the address space.  Memory stays capped by
        # the cgroup either way.
        if config.preset != "browser" and not limits.gpus:
            out.append({"Name": "as", "Soft": address_space, "Hard": address_space})
    return out


def pids_ceiling(pids: int, *, gvisor: bool) -> int:
    """The cgroup PID limit that gives the workload ``pids`` processes.

    Under gVisor the cgroup also holds the Sentry and, on the ptrace
    platform, a host thread per application thread: the same number
    would kill the whole sandbox long before the workload reaches it.
    The headroom keeps the limit meaningful (a fork bomb still stops)
    without starving gVisor itself.
    """
    if gvisor:
        return pids * 6 + 512
    return pids


def network_mode(config: SandboxConfig, egress: EgressNetwork | None) -> str:
    """The container's one network: its egress network, ``bridge`` (open), or ``none`` (loopback only)."""
    if egress is not None:
        return egress.name  # the internal network, and nothing else
    return "bridge" if config.network.mode is NetworkMode.OPEN else "none"


def environment(
    config: SandboxConfig, *, egress: EgressNetwork | None = None, gpu: GPURequest | None = None
) -> dict[str, str]:
    """The container's environment: fixed basics, the caller's, then what AgentNest must set."""
    env = {
        "PATH": CONTAINER_PATH,
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(config.container_environment())
    env["AGENTNEST_WORKSPACE"] = config.workdir
    # Where the agent also listens, so the host can reach the same agent
    # again when its stream is lost (the engine restarted): see open_channel.
    env["AGENTNEST_REATTACH"] = REATTACH_SOCKET
    if egress is not None:
        env.update(egress.environment)
    if gpu is not None:
        env.update(gpu.environment)  # after the caller's: see gpus.request
    return env


def container(
    config: SandboxConfig,
    *,
    name: str,
    command: Sequence[str],
    labels: Mapping[str, str],
    oci_runtime: str,
    gvisor: bool,
    seccomp_profile: str,
    workspace: WorkspaceBind | None = None,
    egress: EgressNetwork | None = None,
    gpu: GPURequest | None = None,
) -> ContainerPlan:
    """The sandbox container's create kwargs.

    Args:
        config: the sandbox's configuration (its image already resolved).
        name: the container's name.
        command: the keeper's argv (PID 1; see :mod:`agentnest.runtime.bootstrap`).
        labels: the engine's own labels for the sandbox (:func:`.labels.for_sandbox`,
            and ``WARM`` on a spare); the config's labels are added to them.
        oci_runtime: the runtime the container runs under.
        gvisor: the backend's runtime is gVisor (rlimits and PID headroom for the Sentry).
        seccomp_profile: the profile's JSON (AgentNest's for this architecture, or the policy's).
        workspace: a disk workspace's bind mount; ``None`` for a memory workspace (a tmpfs).
        egress: an allowlisted sandbox's internal network; ``None`` for denied or open.
        gpu: GPUs to give (see :func:`.gpus.request`).

    Raises:
        ValueError: a disk workspace without its bind mount (the backend makes it first).
    """
    uid, _, gid = config.user.partition(":")
    gid = gid or uid
    limits = config.limits
    # Both writable places are bounded, owned by the sandbox's user, and
    # without setuid files or device nodes.
    tmpfs_opts = f"rw,nosuid,nodev,uid={uid},gid={gid}"
    tmpfs = {"/tmp": f"{tmpfs_opts},mode=1777,size={limits.scratch}"}
    mounts: list[dict[str, Any]] = []
    if limits.workspace_medium == "disk":
        if workspace is None:
            raise ValueError("a disk workspace needs its bind mount (WorkspaceBind)")
        mounts.append(
            {
                "Target": config.workdir,
                "Source": workspace.source,
                "Type": "bind",
                "ReadOnly": False,
                # A slot: no workspace yet; claim_spare mounts one on it, and mount
                # propagation (rslave: host to container, never back) shows it here.
                # Otherwise a bind mount of the sandbox's own subvolume, nothing above
                # it; the pool is mounted nosuid,nodev on the host (storage.setup).
                "BindOptions": {"Propagation": "rslave" if workspace.slot else "rprivate"},
            }
        )
    else:
        tmpfs[config.workdir] = f"{tmpfs_opts},mode=0755,size={limits.workspace}"
    host_config: dict[str, Any] = {
        # Resource ceilings; memswap == memory means no swap.
        "mem_limit": limits.memory,
        "memswap_limit": limits.memory,
        "nano_cpus": int(limits.cpus * 1e9),
        "pids_limit": pids_ceiling(limits.pids, gvisor=gvisor),
        # The image is never written; only the tmpfs mounts and the workspace are.
        "read_only": config.read_only_root,
        "tmpfs": tmpfs,
        "mounts": mounts or None,
        # No capability at all, and no way to gain one through setuid binaries.
        "cap_drop": ["ALL"],
        "security_opt": security_opt(config, seccomp_profile),
        "network_mode": network_mode(config, egress),
        # With an allowlist, the embedded resolver's only upstream is the
        # proxy's address, where nothing answers DNS: a query for any
        # name other than the two containers' fails inside the sandbox's
        # own network namespace, instead of reaching the host's resolvers.
        "dns": [egress.proxy_ip] if egress is not None else None,
        # No init process: PID 1 is the deadline keeper (see bootstrap),
        # which also reaps orphans.
        "init": False,
        # The nvidia runtime (a runc wrapper) only when that is how this host gives GPUs.
        "runtime": gpu.runtime if gpu is not None and gpu.runtime else oci_runtime,
        "ipc_mode": "private",
        # /dev/shm: Docker's 64 MiB, or 256 MiB for a browser, whose
        # renderers share their frames through it (a bounded tmpfs either way).
        "shm_size": BROWSER_SHM if config.preset == "browser" else None,
        # No container log: the agent channel runs over the container's
        # stdio, so a log would keep every command's output (secrets
        # included) in a host file that sandbox code could grow at will.
        "log_config": {"Type": "none", "Config": {}},
        "ulimits": ulimits(config, gvisor=gvisor),
        # Under memory pressure on the host, the sandbox dies first.
        "oom_score_adj": 500,
        "device_requests": gpu.device_requests() if gpu is not None else None,
    }
    container_labels = dict(labels)
    container_labels.update(config.labels)
    create: dict[str, Any] = {
        "image": config.image,
        "command": list(command),
        "user": f"{uid}:{gid}",
        "environment": environment(config, egress=egress, gpu=gpu),
        "working_dir": config.workdir,
        "labels": container_labels,
        # detach=False with stdin_open sets StdinOnce: when the host's
        # attach connection goes away, the agent sees end-of-file.
        "stdin_open": True,
        "tty": False,
        # Never copy the host's client proxy settings into a sandbox.
        "use_config_proxy": False,
        "hostname": "sandbox",
        "name": name,
        # The sandbox's fixed address on its internal network (the proxy's peer).
        "networking_config": (
            {"EndpointsConfig": {egress.name: {"IPAMConfig": {"IPv4Address": egress.sandbox_ip}}}}
            if egress is not None
            else None
        ),
    }
    return ContainerPlan(create=create, host_config=host_config)
