"""Probes for the escape suite: programs that run inside a sandbox and report what happened.

Every probe is a short Python program (the base image has python3 and little
else that works under gVisor) that makes the attempt and prints JSON: the
return value and errno of a system call, or what opening a path did.  The
tests then assert the exact refusal, so a test fails if the protection it
names were missing.
"""

from __future__ import annotations

import json
import platform
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from agentnest import Sandbox

#: x86_64 system call numbers (the suite's syscall probes are x86_64 only).
NR = {
    "ptrace": 101,
    "syslog": 103,
    "setuid": 105,
    "setgid": 106,
    "setgroups": 116,
    "setresuid": 117,
    "capset": 126,
    "mknod": 133,
    "uselib": 134,
    "ustat": 136,
    "sysfs": 139,
    "vhangup": 153,
    "pivot_root": 155,
    "prctl": 157,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "mbind": 237,
    "set_mempolicy": 238,
    "get_mempolicy": 239,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "move_pages": 279,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "pidfd_open": 434,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "clone": 56,
}

CLONE_NEWUSER = 0x10000000
SIGCHLD = 17
#: clone(2)/unshare(2) flags per namespace type.
NAMESPACES = {
    "user": CLONE_NEWUSER,
    "mount": 0x00020000,
    "pid": 0x20000000,
    "net": 0x40000000,
    "uts": 0x04000000,
    "ipc": 0x08000000,
    "cgroup": 0x02000000,
}

#: Runs system calls given as JSON: {name: [syscall, arg, ...]}.  An argument
#: is an int, "s:TEXT" (a C string), "hex:BYTES" (a buffer with those bytes),
#: "buf" (a zeroed 4 KiB buffer), "ppid" (the agent), "now" (a timespec of
#: the current time, so that setting the clock would not move it) or
#: "fd:PATH" (a descriptor of PATH, or the errno of opening it as the result).  A call
#: named clone* that returns 0 is a child that must not go on.
SYSCALLS = r"""
import ctypes, json, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    if a == "buf":
        return ctypes.create_string_buffer(4096)
    if a == "ppid":
        return ctypes.c_long(os.getppid())
    if a == "now":
        ns = time.time_ns()
        return ctypes.create_string_buffer(struct.pack("<qq", ns // 10**9, ns % 10**9), 16)
    kind, _, text = a.partition(":")
    if kind == "s":
        return ctypes.c_char_p(text.encode())
    if kind == "hex":
        return ctypes.create_string_buffer(bytes.fromhex(text), 4096)
    if kind == "fd":
        return ctypes.c_long(os.open(text, os.O_RDONLY))
    raise SystemExit("bad argument " + a)
out = {}
for name, call in json.loads(sys.argv[1]).items():
    try:
        args = [arg(a) for a in call[1:]]
    except OSError as exc:
        out[name] = ["open", exc.errno]
        continue
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(call[0]), *args)
    if ret == 0 and name.startswith("clone"):
        os._exit(0)
    out[name] = [ret, ctypes.get_errno()]
    if ret > 0 and name.startswith("clone"):
        os.waitpid(ret, 0)
print(json.dumps(out))
"""

#: Opens paths given as JSON [[path, mode, data-or-null], ...] and, with data,
#: writes it.  Reports "opened", "written", or the errno; for a read, the
#: number of bytes read (up to 64 KiB).
OPENS = r"""
import json, os, sys
flags = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}
out = {}
for path, mode, data in json.loads(sys.argv[1]):
    try:
        fd = os.open(path, flags[mode] | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        out[path] = exc.errno
        continue
    try:
        if data is not None:
            os.write(fd, data.encode())
            out[path] = "written"
        elif mode == "r":
            out[path] = len(os.read(fd, 65536))
        else:
            out[path] = "opened"
    except OSError as exc:
        out[path] = ["io", exc.errno]
    finally:
        os.close(fd)
print(json.dumps(out))
"""


def x86_64_only() -> None:
    if platform.machine() != "x86_64":
        pytest.skip("the syscall probes use x86_64 system call numbers")


def run_json(sb: Sandbox, code: str, *args: str, timeout: float = 60) -> Any:
    """Run a probe (``python3 -c code args...``) and parse the JSON it prints."""
    result = sb.exec(["python3", "-c", code, *args], timeout=timeout)
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def syscalls(sb: Sandbox, calls: Mapping[str, Sequence[Any]]) -> dict[str, list[int]]:
    """Make each call in one probe; ``{name: [ret, errno]}``."""
    x86_64_only()
    found: dict[str, list[int]] = run_json(sb, SYSCALLS, json.dumps(calls))
    return found


def opens(sb: Sandbox, attempts: Sequence[tuple[str, str, str | None]]) -> dict[str, Any]:
    """Open (and write) each path in one probe; ``{path: outcome}``."""
    found: dict[str, Any] = run_json(sb, OPENS, json.dumps(attempts))
    return found


def expected(backend_name: str, runc: set[Any], runsc: set[Any] | None = None) -> set[Any]:
    """The outcomes accepted on this runtime (``runsc`` defaults to runc's)."""
    return runc if backend_name == "docker" or runsc is None else runsc


def hexbuf(fmt: str, *values: int) -> str:
    """A ``hex:`` argument for :data:`SYSCALLS` holding ``struct.pack(fmt, *values)``."""
    return "hex:" + struct.pack(fmt, *values).hex()
