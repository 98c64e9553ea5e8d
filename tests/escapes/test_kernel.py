"""Kernel interfaces: system calls that are attack surface or escape aids, and
what the kernel shows of itself.

The seccomp profile answers EPERM before the kernel looks at the arguments;
several of these calls are otherwise open to an unprivileged process (the
NUMA calls, ``name_to_handle_at``, ``adjtimex`` in read mode, ``io_uring``),
so a missing profile fails these tests.  Every argument is harmless should a
call ever get through (read-only modes, invalid descriptors, the current time).
"""

from __future__ import annotations

import errno
import socket
import time
from typing import Any

import pytest

from agentnest import Sandbox

from .probes import NR, expected, hexbuf, opens, run_json, syscalls

pytestmark = pytest.mark.attempt("kernel")

EPERM = [-1, errno.EPERM]

CALLS: dict[str, list[Any]] = {
    "io_uring_setup": [NR["io_uring_setup"], 8, "buf"],
    "io_uring_enter": [NR["io_uring_enter"], -1, 0, 0, 0, 0, 0],  # EBADF if it got through
    "io_uring_register": [NR["io_uring_register"], -1, 0, 0, 0],
    "userfaultfd": [NR["userfaultfd"], 0],
    "bpf_prog_load": [NR["bpf"], 5, "buf", 128],
    "perf_event_open": [NR["perf_event_open"], "buf", 0, -1, -1, 0],
    "kexec_load": [NR["kexec_load"], 0, 0, 0, 0],
    "kexec_file_load": [NR["kexec_file_load"], -1, -1, 0, "s:", 0],
    # LINUX_REBOOT_CMD_CAD_OFF: only turns off Ctrl-Alt-Del handling.
    "reboot": [NR["reboot"], 0xFEE1DEAD, 672274793, 0, 0],
    # settimeofday(NULL, tz) and clock_settime to the current time: no jump.
    "settimeofday": [NR["settimeofday"], 0, "buf"],
    "clock_settime": [NR["clock_settime"], 0, "now"],
    "clock_adjtime": [NR["clock_adjtime"], 0, "buf"],  # modes=0: read-only
    "adjtimex": [NR["adjtimex"], "buf"],  # modes=0: read-only
    "syslog_read_all": [NR["syslog"], 3, "buf", 4096],
    # The "shocker" escape: open a host file by handle.
    "open_by_handle_at": [NR["open_by_handle_at"], -100, hexbuf("<Ii8x", 8, 1), 0],
    "name_to_handle_at": [NR["name_to_handle_at"], -100, "s:/", hexbuf("<Ii128x", 128, 0), "buf", 0],
    "iopl": [NR["iopl"], 3],
    "ioperm": [NR["ioperm"], 0x80, 1, 1],
    "swapon": [NR["swapon"], "s:/workspace/swap", 0],
    "swapoff": [NR["swapoff"], "s:/workspace/swap"],
    "acct": [NR["acct"], "s:/workspace/acct"],
    "sethostname": [NR["sethostname"], "s:owned", 5],
    "setdomainname": [NR["setdomainname"], "s:owned", 5],
    "quotactl": [NR["quotactl"], 0x800001, 0, 0, 0],  # Q_SYNC
    "lookup_dcookie": [NR["lookup_dcookie"], 0, "buf", 16],
    "fanotify_init": [NR["fanotify_init"], 0, 0],
    "vhangup": [NR["vhangup"]],
    "get_mempolicy": [NR["get_mempolicy"], 0, 0, 0, 0, 0],
    "set_mempolicy": [NR["set_mempolicy"], 0, 0, 0],
    "mbind": [NR["mbind"], 0, 0, 0, 0, 0, 0],
    "move_pages": [NR["move_pages"], 0, 0, 0, 0, 0, 0],
    "uselib": [NR["uselib"], "s:/usr/lib/x86_64-linux-gnu/libc.so.6"],
    "ustat": [NR["ustat"], 0, "buf"],
    "sysfs": [NR["sysfs"], 3],
}

#: Attempts named after the calls they make (EPERM from every one of them).
ATTEMPTS = {
    "io_uring": ["io_uring_setup", "io_uring_enter", "io_uring_register"],
    "userfaultfd": ["userfaultfd"],
    "bpf": ["bpf_prog_load"],
    "perf_events": ["perf_event_open"],
    "kexec": ["kexec_load", "kexec_file_load"],
    "reboot": ["reboot"],
    "set_the_clock": ["settimeofday", "clock_settime", "clock_adjtime", "adjtimex"],
    "read_the_kernel_log": ["syslog_read_all"],
    "open_by_handle_shocker": ["open_by_handle_at", "name_to_handle_at"],
    "io_ports": ["iopl", "ioperm"],
    "swap": ["swapon", "swapoff"],
    "process_accounting": ["acct"],
    "host_and_domain_name": ["sethostname", "setdomainname"],
    "quotas": ["quotactl"],
    "dcookies_and_fanotify": ["lookup_dcookie", "fanotify_init"],
    "vhangup": ["vhangup"],
    "numa_policy": ["get_mempolicy", "set_mempolicy", "mbind", "move_pages"],
    "obsolete_calls": ["uselib", "ustat", "sysfs"],
}


def clock_offset() -> float:
    """The host's wall clock relative to its monotonic clock: setting the clock moves it."""
    return time.time() - time.monotonic()


@pytest.fixture(scope="module")
def answers(shared_sandbox: Sandbox) -> dict[str, Any]:
    """Every call of :data:`CALLS`, made once per runtime, and the host around it."""
    offset, hostname = clock_offset(), socket.gethostname()
    found: dict[str, Any] = syscalls(shared_sandbox, CALLS)
    found["host_clock_moved"] = abs(clock_offset() - offset)
    found["host_name_changed"] = socket.gethostname() != hostname
    return found


@pytest.mark.parametrize("attempt", sorted(ATTEMPTS))
def test_kernel_call_is_refused(answers: dict[str, Any], attempt: str) -> None:
    assert {call: answers[call] for call in ATTEMPTS[attempt]} == dict.fromkeys(ATTEMPTS[attempt], EPERM)
    if attempt == "set_the_clock":
        assert answers["host_clock_moved"] < 0.5
    if attempt == "host_and_domain_name":
        assert not answers["host_name_changed"]


KERNEL_SYMBOLS = r"""
import json
try:
    with open("/proc/kallsyms") as f:
        addresses = {line.split()[0] for line in f}
    print(json.dumps(sorted(addresses)[:3] + [len(addresses)]))
except OSError as exc:
    print(json.dumps(exc.errno))
"""


def test_kernel_addresses_do_not_leak(shared_sandbox: Sandbox, backend_name: str) -> None:
    found = run_json(shared_sandbox, KERNEL_SYMBOLS)
    if backend_name == "docker":
        # Listed, but every address is zero for an unprivileged reader (KASLR intact).
        assert found == ["0000000000000000", 1]
    else:
        assert found == errno.ENOENT  # gVisor has no kallsyms at all


MASKED = ["/proc/kcore", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats", "/proc/keys"]


def test_sensitive_proc_files_are_masked(shared_sandbox: Sandbox, backend_name: str) -> None:
    found = opens(shared_sandbox, [(p, "r", None) for p in MASKED])
    # runc masks them with an empty file or leaves them out; gVisor has none.
    for path in MASKED:
        assert found[path] in expected(backend_name, {0, errno.ENOENT}, {errno.ENOENT}), path


def test_sysfs_is_read_only(shared_sandbox: Sandbox, backend_name: str) -> None:
    attempts = [
        # The program the kernel runs as root on every hotplug event.
        ("/sys/kernel/uevent_helper", "w", "/workspace/pwn"),
        ("/sys/kernel/mm/transparent_hugepage/enabled", "w", "never"),
        ("/sys/class/net/lo/mtu", "w", "1280"),
    ]
    found = opens(shared_sandbox, attempts)
    # runc: /sys is a read-only mount (this host's kernel has no uevent_helper);
    # gVisor's /sys has none of these files.
    for path, *_ in attempts:
        runc = {errno.EROFS, errno.ENOENT} if "uevent" in path else {errno.EROFS}
        assert found[path] in expected(backend_name, runc, {errno.ENOENT, errno.EACCES}), path


SOCKET_FAMILIES = r"""
import json, socket
out = {}
for family in range(1, 46):
    if family in (1, 2, 10, 16):   # unix, inet, inet6, netlink: the ordinary ones
        continue
    outcome = None
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
        try:
            socket.socket(family, kind).close()
            outcome = "created"
            break
        except OSError as exc:
            outcome = exc.errno
    out[family] = outcome
print(json.dumps(out))
"""


def test_rare_socket_families_are_unavailable(shared_sandbox: Sandbox) -> None:
    # Each family is a kernel module that socket(2) may autoload on the host:
    # a classic way to reach buggy, rarely used kernel code (DCCP, RDS, TIPC...).
    found = run_json(shared_sandbox, SOCKET_FAMILIES)
    created = {int(f) for f, outcome in found.items() if outcome == "created"}
    assert created == set(), f"socket families available: {sorted(created)}"
    # AF_PACKET (17) and AF_XDP (44) need CAP_NET_RAW; AF_VSOCK (40) is refused by seccomp.
    assert found["17"] == errno.EPERM
    assert found["40"] == errno.EPERM
    assert set(found.values()) <= {errno.EAFNOSUPPORT, errno.EPERM, errno.EINVAL, errno.EPROTONOSUPPORT}


def test_rare_ip_protocols_are_unavailable(shared_sandbox: Sandbox, backend_name: str) -> None:
    code = r"""
import json, socket
out = {}
for name, proto in (("sctp", 132), ("dccp", 33)):
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto).close(); out[name] = "created"
    except OSError as exc:
        out[name] = exc.errno
print(json.dumps(out))
"""
    found = run_json(shared_sandbox, code)
    # Not built into this host's kernel (and no module loading); gVisor has neither.
    accepted = expected(backend_name, {errno.EPROTONOSUPPORT}, {errno.EINVAL, errno.EPROTONOSUPPORT})
    assert found["sctp"] in accepted
    assert found["dccp"] in accepted
