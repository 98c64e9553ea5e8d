"""Privilege escapes: capabilities, setuid, namespaces, mounts, /proc/sys, sysrq,
kernel modules, keyrings, ptrace, the deadline keeper, cgroups, devices, the engine's socket.

Each attempt asserts the exact refusal.  Most are refused twice over (no
capabilities *and* the seccomp profile); the errno shows which layer answered
first: EPERM from seccomp or a missing capability, EROFS from a read-only
mount, ENOENT where the path is not in the sandbox at all.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Any

import pytest
from integration.helpers import container_of

from agentnest import Sandbox

from .probes import (
    CLONE_NEWUSER,
    NAMESPACES,
    NR,
    SIGCHLD,
    expected,
    hexbuf,
    opens,
    run_json,
    syscalls,
)

pytestmark = pytest.mark.attempt("privileges")

EPERM = [-1, errno.EPERM]
MiB = 1024 * 1024

CALLS: dict[str, list[Any]] = {
    # capset(2): CAP_SYS_ADMIN into the effective and permitted sets (v3 header).
    "capset": [NR["capset"], hexbuf("<Ii", 0x20080522, 0), hexbuf("<6I", 1 << 21, 1 << 21, 0, 0, 0, 0)],
    # prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN)
    "ambient_raise": [NR["prctl"], 47, 2, 21, 0, 0],
    "setuid": [NR["setuid"], 0],
    "setresuid": [NR["setresuid"], 0, 0, 0],
    "setgid": [NR["setgid"], 0],
    "setgroups": [NR["setgroups"], 1, hexbuf("<I", 0)],
    "clone3_user": [NR["clone3"], hexbuf("<8Q", CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0), 64],
    # mounts; MS_REMOUNT=0x20, MS_BIND=0x1000, MS_REC=0x4000, MNT_DETACH=2
    "mount_tmpfs": [NR["mount"], "s:none", "s:/workspace", "s:tmpfs", 0, 0],
    "mount_cgroup": [NR["mount"], "s:cgroup", "s:/tmp", "s:cgroup", 0, "s:memory"],
    "remount_root_rw": [NR["mount"], 0, "s:/", 0, 0x20, 0],
    "bind_mount_root": [NR["mount"], "s:/", "s:/workspace", 0, 0x1000 | 0x4000, 0],
    "umount_workspace": [NR["umount2"], "s:/workspace", 2],
    "pivot_root": [NR["pivot_root"], "s:/workspace", "s:/workspace"],
    "chroot": [NR["chroot"], "s:/workspace"],
    "fsopen": [NR["fsopen"], "s:tmpfs", 0],
    "open_tree": [NR["open_tree"], -100, "s:/", 1],
    "move_mount": [NR["move_mount"], -100, "s:/tmp", -100, "s:/workspace", 0],
    # mount_setattr: clear MOUNT_ATTR_RDONLY on /
    "mount_setattr": [NR["mount_setattr"], -100, "s:/", 0, hexbuf("<4Q", 0, 1, 0, 0), 32],
    # kernel modules
    "init_module": [NR["init_module"], "buf", 64, "s:"],
    "finit_module": [NR["finit_module"], "fd:/usr/bin/python3", "s:", 0],
    "delete_module": [NR["delete_module"], "s:ext4", 0x800],
    # keyrings: KEY_SPEC_PROCESS_KEYRING = -2, KEYCTL_JOIN_SESSION_KEYRING = 1
    "add_key": [NR["add_key"], "s:user", "s:escape", "s:v", 1, -2],
    "request_key": [NR["request_key"], "s:user", "s:escape", 0, 0],
    "keyctl": [NR["keyctl"], 1, "s:escape"],
    # ptrace: PTRACE_ATTACH=16, PTRACE_SEIZE=0x4206, PTRACE_TRACEME=0
    "ptrace_attach_pid1": [NR["ptrace"], 16, 1, 0, 0],
    "ptrace_attach_agent": [NR["ptrace"], 16, "ppid", 0, 0],
    "ptrace_seize_pid1": [NR["ptrace"], 0x4206, 1, 0, 0],
    "ptrace_traceme": [NR["ptrace"], 0, 0, 0, 0],
    "process_vm_readv": [NR["process_vm_readv"], 1, "buf", 1, "buf", 1, 0],
    "process_vm_writev": [NR["process_vm_writev"], 1, "buf", 1, "buf", 1, 0],
    "kcmp": [NR["kcmp"], 1, "ppid", 0, 0, 0],
    "pidfd_getfd": [NR["pidfd_getfd"], 0, 0, 0],
    # device nodes: /dev/mem (char 1:1) and /dev/sda (block 8:0)
    "mknod_mem": [NR["mknod"], "s:/workspace/escape-mem", 0o20666, 0x101],
    "mknod_sda": [NR["mknod"], "s:/tmp/escape-sda", 0o60666, 0x800],
}
for _ns, _flag in NAMESPACES.items():
    CALLS[f"unshare_{_ns}"] = [NR["unshare"], _flag]
    CALLS[f"clone_{_ns}"] = [NR["clone"], _flag | SIGCHLD, 0, 0, 0, 0]
    _file = {"mount": "mnt"}.get(_ns, _ns)
    CALLS[f"setns_{_ns}"] = [NR["setns"], f"fd:/proc/1/ns/{_file}", 0]


@pytest.fixture(scope="module")
def answers(shared_sandbox: Sandbox) -> dict[str, list[int]]:
    """Every call of :data:`CALLS`, made once per runtime."""
    return syscalls(shared_sandbox, CALLS)


def test_capabilities_cannot_be_raised(answers: dict[str, list[int]], backend_name: str) -> None:
    assert answers["capset"] == EPERM
    # gVisor rejects an ambient raise as invalid before looking at capabilities.
    assert answers["ambient_raise"][1] in expected(backend_name, {errno.EPERM}, {errno.EPERM, errno.EINVAL})
    assert answers["ambient_raise"][0] == -1


def test_setuid_to_root_is_refused(answers: dict[str, list[int]]) -> None:
    for call in ("setuid", "setresuid", "setgid", "setgroups"):
        assert answers[call] == EPERM, call


#: Starts every setuid/setgid-root program of the image so that it waits for
#: input (a password prompt), and reads its credentials from /proc meanwhile.
SETUID_PROGRAMS = r"""
import json, os, stat, subprocess, time
seen, found = {}, set()
for d in ("/usr/bin", "/usr/sbin"):
    for name in os.listdir(d):
        path = os.path.join(d, name)
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o6000 and st.st_uid == 0:
            found.add(path)
for path in sorted(found):
    args = {"unix_chkpwd": ["root", "nullok"], "gpasswd": ["root"], "newgrp": ["root"]}
    argv = [path] + args.get(os.path.basename(path), [])
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                with open("/proc/%d/status" % p.pid) as f:
                    status = dict(l.rstrip("\n").split(":\t", 1) for l in f if ":\t" in l)
            except OSError:
                break
            if status.get("Name") and status["Name"] != "python3":
                seen[path] = [status["Uid"].split(), status["Gid"].split()]
            if p.poll() is not None:
                break
            time.sleep(0.01)
    finally:
        p.kill()
        p.wait()
print(json.dumps({"found": sorted(found), "seen": seen}))
"""


def test_setuid_and_setgid_binaries_do_not_elevate(shared_sandbox: Sandbox) -> None:
    report = run_json(shared_sandbox, SETUID_PROGRAMS, timeout=120)
    assert {"/usr/bin/su", "/usr/bin/passwd", "/usr/bin/mount"} <= set(report["found"])
    # su and passwd wait for a password: their credentials were seen while they ran.
    assert {"/usr/bin/su", "/usr/bin/passwd"} <= set(report["seen"])
    for path, (uids, gids) in report["seen"].items():
        assert uids == ["65532"] * 4, (path, uids)
        assert gids == ["65532"] * 4, (path, gids)


@pytest.mark.parametrize("namespace", sorted(NAMESPACES))
def test_namespace_creation_is_refused(answers: dict[str, list[int]], namespace: str) -> None:
    # A new user namespace gives back every capability inside it; the others
    # need CAP_SYS_ADMIN.  Both unshare(2) and clone(2) with the flag.
    assert answers[f"unshare_{namespace}"] == EPERM
    assert answers[f"clone_{namespace}"] == EPERM


def test_clone3_namespace_flags_are_refused(answers: dict[str, list[int]], backend_name: str) -> None:
    # seccomp cannot read clone3's flags (they are in memory), so clone3 gets
    # ENOSYS and libc falls back to clone, whose flags it can check.
    assert answers["clone3_user"][0] == -1
    assert answers["clone3_user"][1] in expected(backend_name, {errno.ENOSYS}, {errno.ENOSYS, errno.EPERM})


def test_setns_into_pid1_namespaces_is_refused(answers: dict[str, list[int]], backend_name: str) -> None:
    outcomes = {ns: answers[f"setns_{ns}"] for ns in NAMESPACES}
    refused = [ns for ns, outcome in outcomes.items() if outcome == EPERM]
    # PID 1 is not dumpable, so its /proc/1/ns files cannot even be opened
    # (runc: EACCES); gVisor has only some of them (ENOENT for the others).
    closed = [
        ns for ns, outcome in outcomes.items() if outcome in (["open", errno.EACCES], ["open", errno.EPERM])
    ]
    absent = [ns for ns, outcome in outcomes.items() if outcome == ["open", errno.ENOENT]]
    assert sorted(refused + closed + absent) == sorted(NAMESPACES), outcomes
    if backend_name == "docker":
        assert absent == []


@pytest.mark.parametrize(
    "call",
    [
        "mount_tmpfs",
        "mount_cgroup",
        "remount_root_rw",
        "bind_mount_root",
        "umount_workspace",
        "pivot_root",
        "chroot",
        "new_mount_api",
    ],
)
def test_mounts_are_refused(
    answers: dict[str, list[int]], backend_name: str, shared_sandbox: Sandbox, call: str
) -> None:
    if call == "new_mount_api":
        for name in ("fsopen", "open_tree", "move_mount"):
            assert answers[name] == EPERM, name
        # gVisor 20221219 does not implement mount_setattr.
        assert tuple(answers["mount_setattr"]) in expected(
            backend_name, {(-1, errno.EPERM)}, {(-1, errno.EPERM), (-1, errno.ENOSYS)}
        )
    else:
        assert answers[call] == EPERM
    # Nothing changed: the root is still read-only, /workspace still the pool's
    # subvolume (or the tmpfs, without a storage pool), /tmp still the tmpfs.
    mounts = run_json(
        shared_sandbox,
        "import json; print(json.dumps([l.split()[1:4] for l in open('/proc/self/mounts')]))",
    )
    by_target = {target: (fstype, opts.split(",")) for target, fstype, opts in mounts}
    assert "ro" in by_target["/"][1]
    on_disk = shared_sandbox.config.limits.workspace_medium == "disk"
    if not on_disk:
        assert by_target["/workspace"][0] == "tmpfs"
    elif backend_name == "docker":
        assert by_target["/workspace"][0] == "btrfs"  # gVisor names its own file system type here
    assert by_target["/tmp"][0] == "tmpfs"


PROC_SYS = {
    # The classic escape: a core_pattern pipe runs as root on the host.
    "/proc/sys/kernel/core_pattern": "|/workspace/pwn",
    # Host-wide ASLR off, setuid core dumps on.
    "/proc/sys/kernel/randomize_va_space": "0",
    "/proc/sys/fs/suid_dumpable": "2",
    "/proc/sys/kernel/hostname": "owned",
    "/proc/sys/vm/drop_caches": "3",
}


@pytest.mark.parametrize("path", sorted(PROC_SYS))
def test_proc_sys_is_not_writable(shared_sandbox: Sandbox, backend_name: str, path: str) -> None:
    host_file = Path(path)
    before = host_file.read_text() if path != "/proc/sys/vm/drop_caches" else None  # write-only
    found = opens(shared_sandbox, [(path, "w", PROC_SYS[path])])
    # Root owns these files and runc mounts /proc/sys read-only: whichever check
    # comes first answers (EACCES or EROFS); gVisor's own /proc/sys has few
    # files (ENOENT) and refuses the UID (EACCES).
    assert found[path] in expected(backend_name, {errno.EROFS, errno.EACCES}, {errno.EACCES, errno.ENOENT})
    if before is not None:
        assert host_file.read_text() == before
        if path.endswith("hostname"):
            assert socket.gethostname() == before.strip()


def test_sysrq_trigger_is_not_writable(shared_sandbox: Sandbox, backend_name: str) -> None:
    # "h" only prints help to the kernel log: harmless if it ever got through.
    found = opens(shared_sandbox, [("/proc/sysrq-trigger", "w", "h"), ("/proc/sys/kernel/sysrq", "w", "1")])
    # This host's kernel has no /proc/sysrq-trigger (ENOENT); elsewhere runc masks it read-only.
    assert found["/proc/sysrq-trigger"] in expected(
        backend_name, {errno.ENOENT, errno.EROFS, errno.EACCES}, {errno.ENOENT, errno.EACCES}
    )
    # This host's kernel has no sysrq at all (ENOENT).
    assert found["/proc/sys/kernel/sysrq"] in {errno.EROFS, errno.EACCES, errno.ENOENT}


def test_kernel_modules_cannot_be_loaded_or_removed(answers: dict[str, list[int]]) -> None:
    for call in ("init_module", "finit_module", "delete_module"):
        assert answers[call] == EPERM, call


def test_keyrings_are_refused(
    answers: dict[str, list[int]], shared_sandbox: Sandbox, backend_name: str
) -> None:
    for call in ("add_key", "request_key", "keyctl"):
        assert answers[call] == EPERM, call
    # /proc/keys would list the host's keys: masked (empty) on runc, absent on gVisor.
    found = opens(shared_sandbox, [("/proc/keys", "r", None)])
    assert found["/proc/keys"] in expected(backend_name, {0}, {errno.ENOENT})


@pytest.mark.parametrize(
    "call", ["ptrace_attach_pid1", "ptrace_attach_agent", "ptrace_seize_pid1", "ptrace_traceme"]
)
def test_ptrace_is_refused(answers: dict[str, list[int]], call: str) -> None:
    assert answers[call] == EPERM


def test_cross_process_memory_and_descriptors_are_refused(
    answers: dict[str, list[int]], backend_name: str
) -> None:
    for call in ("process_vm_readv", "process_vm_writev", "kcmp"):
        assert answers[call] == EPERM, call
    # gVisor 20221219 has no pidfd_getfd at all.
    assert tuple(answers["pidfd_getfd"]) in expected(
        backend_name, {(-1, errno.EPERM)}, {(-1, errno.EPERM), (-1, errno.ENOSYS)}
    )


def test_agent_memory_is_not_accessible(shared_sandbox: Sandbox) -> None:
    # The agent holds the host channel: it makes itself non-dumpable.
    code = "import json, os; pid = os.getppid()\n" + (
        "out = {}\nfor mode in (os.O_RDONLY, os.O_RDWR):\n"
        "    try:\n        os.close(os.open('/proc/%d/mem' % pid, mode)); out[mode] = 'opened'\n"
        "    except OSError as e:\n        out[mode] = e.errno\nprint(json.dumps(list(out.values())))"
    )
    assert run_json(shared_sandbox, code) == [errno.EACCES, errno.EACCES]


def test_deadline_keeper_memory_is_not_writable(
    request: pytest.FixtureRequest, shared_sandbox: Sandbox, backend_name: str
) -> None:
    # PID 1 makes itself non-dumpable (runtime/bootstrap.py), as the agent does.
    found = opens(shared_sandbox, [("/proc/1/mem", "rw", None)])
    assert found["/proc/1/mem"] in (errno.EACCES, errno.EPERM)


#: Sends a signal to PID 1, then waits until it was consumed and PID 1 sleeps
#: again (back in its wait loop).  If PID 1 dies, the whole sandbox ends and
#: this never prints.
SIGNAL_PID1 = r"""
import os, signal, sys, time
sig = getattr(signal, sys.argv[1])
os.kill(1, sig)
bit = 1 << (sig - 1)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    with open("/proc/1/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    if "SigPnd" not in status:
        # gVisor shows no pending signals: an ignored signal is dropped when
        # sent, a fatal one ends the sandbox within moments; give it those.
        time.sleep(1)
        print("survived")
        break
    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    if not pending & bit and status["State"].split()[0] == "S":
        print("survived")
        break
"""

GVISOR_SIGNALS_PID1 = (
    "LIMIT (gVisor 20221219): signals from inside the PID namespace reach PID 1 even without a "
    "handler; the keeper ignores every catchable one, but SIGKILL cannot be ignored, so sandbox "
    "code can end its own sandbox early there (it cannot outlive its deadline, nor touch the host)"
)


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"])
def test_deadline_keeper_ignores_signals(
    request: pytest.FixtureRequest, backend_name: str, docker_client: Any, sig: str
) -> None:
    if backend_name == "gvisor" and sig == "SIGKILL":
        request.applymarker(pytest.mark.xfail(strict=True, reason=GVISOR_SIGNALS_PID1))
    with Sandbox(backend=backend_name, timeout=60) as sb:
        # A killed keeper ends the sandbox: this raises SandboxDestroyedError.
        assert sb.exec(["python3", "-c", SIGNAL_PID1, sig], timeout=30).stdout == "survived\n"
        assert container_of(docker_client, sb).status == "running"
        assert sb.exec_shell("echo alive").stdout == "alive\n"


def test_cgroup_limits_cannot_be_rewritten(
    shared_sandbox: Sandbox, backend_name: str, docker_client: Any
) -> None:
    attempts = [
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "w", "-1"),
        ("/sys/fs/cgroup/pids/pids.max", "w", "max"),
        # The release_agent escape: a program the host kernel runs as root.
        ("/sys/fs/cgroup/memory/release_agent", "w", "/workspace/pwn"),
        ("/sys/fs/cgroup/memory/notify_on_release", "w", "1"),
        ("/sys/fs/cgroup/memory/cgroup.procs", "w", "1"),
    ]
    found = opens(shared_sandbox, attempts)
    # runc mounts the cgroup tree read-only (and root owns the files: EACCES
    # may come first; release_agent exists only in the host's root cgroup,
    # which the container's cgroup namespace does not show); gVisor shows none.
    for path, *_ in attempts:
        outcomes = (
            {errno.EROFS, errno.EACCES, errno.ENOENT} if "release" in path else {errno.EROFS, errno.EACCES}
        )
        assert found[path] in expected(backend_name, outcomes, {errno.ENOENT}), path
    container = container_of(docker_client, shared_sandbox)
    host = container.attrs["HostConfig"]
    assert host["Memory"] == 512 * MiB
    limit = Path(f"/sys/fs/cgroup/memory/docker/{container.id}/memory.limit_in_bytes")
    if limit.exists():  # cgroup v1 with the cgroupfs driver (this CI)
        assert int(limit.read_text()) == 512 * MiB


def test_device_nodes_cannot_be_made_or_used(
    answers: dict[str, list[int]], shared_sandbox: Sandbox, backend_name: str
) -> None:
    if backend_name == "docker":
        # No CAP_MKNOD (and nodev on the tmpfs mounts besides).
        assert answers["mknod_mem"] == EPERM
        assert answers["mknod_sda"] == EPERM
        return
    if shared_sandbox.config.limits.workspace_medium == "disk":
        # A disk workspace is a host directory served by gVisor's gofer, which
        # refuses device nodes outright.
        assert answers["mknod_mem"] == EPERM
        found = opens(shared_sandbox, [("/tmp/escape-sda", "r", None)])
        assert found == {"/tmp/escape-sda": errno.ENXIO}
        shared_sandbox.exec(["rm", "-f", "/tmp/escape-sda"]).check()
        return
    # gVisor lets the node be made, but its devices are its own emulations:
    # there is no host memory or disk behind 1:1 or 8:0.
    assert answers["mknod_mem"] == [0, 0]
    found = opens(shared_sandbox, [("/workspace/escape-mem", "r", None), ("/tmp/escape-sda", "r", None)])
    assert found == {"/workspace/escape-mem": errno.ENXIO, "/tmp/escape-sda": errno.ENXIO}
    shared_sandbox.exec(["rm", "-f", "/workspace/escape-mem", "/tmp/escape-sda"]).check()


def test_host_devices_are_absent(shared_sandbox: Sandbox) -> None:
    paths = [
        "/dev/mem",
        "/dev/kmem",
        "/dev/port",
        "/dev/kmsg",
        "/dev/sda",
        "/dev/vda",
        "/dev/vsock",
        "/dev/kvm",
    ]
    found = opens(shared_sandbox, [(p, "r", None) for p in paths])
    assert found == dict.fromkeys(paths, errno.ENOENT)


TUN_AND_FUSE = r"""
import ctypes, fcntl, json, os, struct
libc = ctypes.CDLL(None, use_errno=True)
out = {}
try:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH22x", b"escape0", 0x0001 | 0x1000))  # TUNSETIFF
        out["tun"] = "created"
    except OSError as exc:
        out["tun"] = exc.errno
except OSError as exc:
    out["tun"] = ["open", exc.errno]
try:
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = b"fd=%d,rootmode=40000,user_id=65532,group_id=65532" % fd
    out["fuse"] = [libc.mount(b"fuse", b"/tmp", b"fuse", 0, opts), ctypes.get_errno()]
except OSError as exc:
    out["fuse"] = ["open", exc.errno]
print(json.dumps(out))
"""


def test_tun_and_fuse_give_nothing(shared_sandbox: Sandbox, backend_name: str) -> None:
    found = run_json(shared_sandbox, TUN_AND_FUSE)
    if backend_name == "docker":
        assert found == {"tun": ["open", errno.ENOENT], "fuse": ["open", errno.ENOENT]}
    else:
        # gVisor has both devices, but making an interface needs CAP_NET_ADMIN
        # and mounting FUSE needs mount(2).
        assert found == {"tun": errno.EPERM, "fuse": EPERM}


ENGINE_SOCKETS = r"""
import json, socket
out = {}
for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
             "/run/containerd/containerd.sock.ttrpc", "/var/run/docker/metrics.sock"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path); out[path] = "connected"
    except OSError as exc:
        out[path] = exc.errno
    finally:
        s.close()
for port in (2375, 2376):                       # the engine's TCP ports, on loopback
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close(); out[port] = "connected"
    except OSError as exc:
        out[port] = exc.errno
print(json.dumps(out))
"""


def test_engine_socket_is_unreachable(shared_sandbox: Sandbox) -> None:
    found = run_json(shared_sandbox, ENGINE_SOCKETS)
    for target, outcome in found.items():
        expected_errno = errno.ECONNREFUSED if target.isdigit() else errno.ENOENT
        assert outcome == expected_errno, target
