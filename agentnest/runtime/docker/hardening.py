"""How a sandbox's container is confined on Docker, as data: ``SandboxConfig`` + facts -> create kwargs.

This module decides every setting of the sandbox container that confines it
(user, read-only root, capabilities, ``no-new-privileges``, seccomp, rlimits,
PID/memory/CPU ceilings, ``/tmp`` and ``/workspace`` mounts, network mode,
DNS, log driver, labels) and which confinement settings an engine cannot
honour; the seccomp profile itself (:func:`profile`); and, for an allowlist,
the sandbox's own internal network (:func:`egress_network`) and the filtering
proxy's container and settings (:func:`proxy_container`, :func:`proxy_config`),
which :mod:`.egress` creates.  It is pure: no I/O, and no engine library (no
docker, socket, subprocess or threading import).  What it must know beyond the
config is handed in as plain values: the OCI runtime, whether the backend is
gVisor, the seccomp profile's JSON, the engine's ``SecurityOptions``, where a
disk workspace lives on the host, the egress network's addresses, a GPU request.

:mod:`.backend` gathers those facts, makes the workspace and the network, and
applies the plan with docker-py (``create_host_config(**plan.host_config)``,
``create_container(**plan.create, host_config=...)``).  Every value here is
already in the engine's own shape (``Ulimit``, ``Mount``, ``LogConfig``,
``DeviceRequest``, ``IPAMConfig`` and ``NetworkingConfig`` as the Engine API
spells them), so the golden files in ``tests/unit/golden/docker/`` show a
reviewer exactly what reaches the engine (tests/unit/test_docker_hardening.py);
the real-engine tests (tests/integration/test_defaults.py, tests/escapes/,
tests/integration/test_egress.py) prove it holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ...config import BROWSER_SHM, SandboxConfig
from ...errors import ConfigurationError, UnsupportedCapabilityError
from ...policy import NetworkMode, NetworkPolicy
from ..bootstrap import DEADLINE_FILE, NOFILE

if TYPE_CHECKING:
    from .gpus import GPURequest

__all__ = [
    "CONTAINER_PATH", "DENIED", "GVISOR_OVERHEAD", "PROXY_PORT", "REATTACH_SOCKET", "ContainerPlan",
    "EgressNetwork", "WorkspaceBind", "check_confinement", "container", "custom_profile", "egress_network",
    "network_mode", "pids_ceiling", "profile", "profile_json", "proxy_config", "proxy_container",
    "security_opt", "ulimits",
]  # fmt: skip

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
        # AgentNest's profile (see profile below) or the policy's own: never the engine's default.
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


# -- the seccomp profile ------------------------------------------------------------------------

EPERM = 1
ENOSYS = 38
#: The address family of virtio/VMCI sockets between a VM and its host.
AF_VSOCK = 40

DENIED = (
    # io_uring and userfaultfd
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
    # namespaces
    "unshare", "setns",
    # kernel objects and cross-process access
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "ptrace", "process_vm_readv",
    "process_vm_writev", "kcmp", "pidfd_getfd", "lookup_dcookie", "fanotify_init", "name_to_handle_at",
    "open_by_handle_at",
    # filesystems and mounts
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "quotactl", "quotactl_fd", "nfsservctl", "swapon", "swapoff",
    # kernel modules, kexec, reboot
    "init_module", "finit_module", "delete_module", "create_module", "kexec_load", "kexec_file_load",
    "reboot",
    # time and system state
    "settimeofday", "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64", "adjtimex",
    "stime", "syslog", "acct", "vhangup", "sethostname", "setdomainname",
    # obsolete or dangerous
    "uselib", "ustat", "sysfs", "_sysctl", "get_kernel_syms", "query_module", "vm86", "vm86old", "iopl",
    "ioperm", "get_mempolicy", "set_mempolicy", "mbind", "move_pages",
)  # fmt: skip

# clone(2) flags that create namespaces.
_NS_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)

_ARCHES = {
    "x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
}


def profile(arch: str = "x86_64", gvisor: bool = False) -> dict[str, Any]:
    """AgentNest's seccomp profile for one architecture; ``gvisor`` for sandboxes under runsc.

    Capabilities are all dropped and ``no-new-privileges`` is set, so most
    privileged system calls already fail.  This profile refuses, with EPERM, the
    calls that need no capability and are a kernel attack surface or an escape
    aid, including several that older engines' default profiles still allow:

    * ``io_uring_*``: a large, frequently exploited kernel interface that also
      bypasses seccomp filtering of the operations it performs;
    * ``userfaultfd``: the classic tool to widen kernel race windows;
    * ``unshare``/``setns`` and namespace flags on ``clone``: user namespaces
      give back capabilities inside the new namespace, a recurring escape route;
      ``clone3`` gets ENOSYS so that libc falls back to ``clone``, whose flags
      seccomp can inspect;
    * ``bpf``, ``perf_event_open``, ``keyctl``/``add_key``/``request_key``,
      ``ptrace``, ``process_vm_*``, ``kcmp``, ``pidfd_getfd``: cross-process and
      kernel-object access;
    * ``socket(AF_VSOCK, ...)``: vsock is not network-namespaced, so on a
      host that is itself a VM (Firecracker, QEMU, Hyper-V) it would reach the
      hypervisor's side straight past ``network=none`` (Docker's default profile
      refuses it too);
    * everything Docker's default profile blocks (mount, module loading, kexec,
      reboot, clock setting, swap, quotas, ``open_by_handle_at``, ...).

    The profile allows by default and denies this list: the engine's runtime
    (runc or gVisor) still applies its own restrictions underneath.

    Under gVisor the ``clone3`` rule is left out: gVisor (``--oci-seccomp``)
    answers a filtered call with EPERM whatever ``errnoRet`` says, and libc
    falls back to ``clone`` only on ENOSYS, so every thread start would fail.
    gVisor 20221219 does not implement ``clone3`` at all (ENOSYS from its own
    kernel, tested), and namespaces made through it would be gVisor's own.
    """
    names = list(DENIED)
    rules: list[dict[str, Any]] = [{"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}]
    if not gvisor:
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    rules += [
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_EQ"}],
        },
    ]
    for flag in _NS_FLAGS:
        rules.append(
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                # (flags & flag) == flag.  On s390 the flags are argument 1,
                # but s390 is not a supported architecture here.
                "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
            }
        )
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": _ARCHES.get(arch, _ARCHES["x86_64"]),
        "syscalls": rules,
    }


@lru_cache(maxsize=4)
def profile_json(arch: str = "x86_64", gvisor: bool = False) -> str:
    return json.dumps(profile(arch, gvisor), separators=(",", ":"))


def custom_profile(config: SandboxConfig, read_file: Callable[[str], str]) -> str | None:
    """The policy's own seccomp profile as compact JSON, or None for AgentNest's.

    ``read_file`` reads a path on this host (the backend's, which raises
    :class:`ConfigurationError` for a file it cannot read): this module does no I/O.
    """
    given = config.seccomp_profile
    if given is None:
        return None
    text = given
    if not given.lstrip().startswith("{"):
        # A path on this host, as `docker run --security-opt seccomp=FILE` reads it.
        text = read_file(given)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"seccomp_profile is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "defaultAction" not in doc:
        raise ConfigurationError(
            "seccomp_profile must be a Docker seccomp profile (a JSON object with 'defaultAction')"
        )
    return json.dumps(doc, separators=(",", ":"))


# -- the egress allowlist: the sandbox's internal network and its proxy -----------------------

#: The port the proxy listens on, on its internal-network address only (nothing is published).
PROXY_PORT = 3128


def egress_network(subnet: str, gateway: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """``create_network`` kwargs (the name aside) of a sandbox's own network: no route out, no host.

    Only the sandbox and its proxy join it; the proxy alone also joins the egress network.
    """
    return {
        "driver": "bridge",
        # No route out: the engine drops forwarding to and from it.
        "internal": True,
        "options": {
            # No IPv4 address on the host's side of the bridge, so
            # the host (its services on 0.0.0.0 included) is
            # unreachable: an internal network alone leaves the
            # gateway address, and through it the host, open.
            "com.docker.network.bridge.inhibit_ipv4": "true",
            # Only the proxy and this sandbox are on it anyway.
            "com.docker.network.bridge.enable_icc": "true",
        },
        "ipam": {
            "Driver": "default",
            "Config": [{"Subnet": subnet, "IPRange": None, "Gateway": gateway, "AuxiliaryAddresses": None}],
        },
        "enable_ipv6": False,
        "labels": dict(labels),
        "check_duplicate": True,
    }


def proxy_config(
    policy: NetworkPolicy, *, proxy_ip: str, subnet: str, hosts: Mapping[str, str], deadline: float
) -> dict[str, Any]:
    """What the sandbox's proxy enforces (its command line carries it): the policy, for the sandbox only."""
    return {
        "listen": [proxy_ip, PROXY_PORT],
        # Only the sandbox may use it (the egress side must not).
        "clients": [subnet],
        "domains": list(policy.domains),
        "cidrs": list(policy.cidrs),
        "ports": list(policy.ports),
        # Always sent: the proxy's own default must never decide the matching.
        "subdomains": policy.subdomains,
        "hosts": dict(hosts),
        "deadline": deadline,
        # Sandbox.extend() moves it: the same root-owned file as in the sandbox.
        "deadline_file": DEADLINE_FILE,
    }


def proxy_container(
    *,
    name: str,
    image: str,
    command: Sequence[str],
    labels: Mapping[str, str],
    network: str,
    proxy_ip: str,
    oci_runtime: str,
    arch: str,
) -> ContainerPlan:
    """The egress proxy's container, hardened like a sandbox, at ``proxy_ip`` on the sandbox's ``network``.

    :mod:`.egress` then connects it to the egress network, its second and last one.
    """
    host_config: dict[str, Any] = {
        "mem_limit": "128m",
        "memswap_limit": "128m",
        "nano_cpus": 1_000_000_000,
        # asyncio's resolver threads and the interpreter: a few dozen.
        "pids_limit": 64,
        "read_only": True,
        # Only for the moved deadline (root writes it, the proxy reads it).
        "tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,mode=1777,size=64k"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true", f"seccomp={profile_json(arch)}"],
        "network_mode": network,
        # The proxy must never route the sandbox's packets itself.
        "sysctls": {"net.ipv4.ip_forward": "0"},
        "init": False,
        "runtime": oci_runtime,
        "ipc_mode": "private",
        # Events travel over the attach stream; no log copies them.
        "log_config": {"Type": "none", "Config": {}},
        "ulimits": [{"Name": "core", "Soft": 0, "Hard": 0}, {"Name": "nofile", "Soft": 4096, "Hard": 4096}],
        "oom_score_adj": 500,
    }
    create: dict[str, Any] = {
        "image": image,
        "command": list(command),
        "user": "65532:65532",
        "environment": {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8"},
        "labels": dict(labels),
        "networking_config": {"EndpointsConfig": {network: {"IPAMConfig": {"IPv4Address": proxy_ip}}}},
        "stdin_open": False,
        "tty": False,
        "use_config_proxy": False,
        "hostname": "agentnest-proxy",
        "name": name,
    }
    return ContainerPlan(create=create, host_config=host_config)
