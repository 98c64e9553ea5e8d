"""AgentNest's seccomp profile for Docker (runc and runsc).

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
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError

if TYPE_CHECKING:
    from ...config import SandboxConfig

EPERM = 1
ENOSYS = 38
#: The address family of virtio/VMCI sockets between a VM and its host.
AF_VSOCK = 40

DENIED = (
    # io_uring and userfaultfd
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    # namespaces
    "unshare",
    "setns",
    # kernel objects and cross-process access
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "lookup_dcookie",
    "fanotify_init",
    "name_to_handle_at",
    "open_by_handle_at",
    # filesystems and mounts
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "swapon",
    "swapoff",
    # kernel modules, kexec, reboot
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    # time and system state
    "settimeofday",
    "clock_settime",
    "clock_settime64",
    "clock_adjtime",
    "clock_adjtime64",
    "adjtimex",
    "stime",
    "syslog",
    "acct",
    "vhangup",
    "sethostname",
    "setdomainname",
    # obsolete or dangerous
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "get_kernel_syms",
    "query_module",
    "vm86",
    "vm86old",
    "iopl",
    "ioperm",
    "get_mempolicy",
    "set_mempolicy",
    "mbind",
    "move_pages",
)

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
    """The profile for one architecture; ``gvisor`` for sandboxes that run under runsc.

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


def custom_profile(config: SandboxConfig) -> str | None:
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
