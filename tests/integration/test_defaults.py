"""Secure defaults, checked from inside real sandboxes and on the engine's view of them.

Every claim of the "secure defaults" row: non-root user, no capabilities,
no-new-privileges, seccomp, read-only root, no network, resource limits,
bounded scratch space, labels and a bounded log.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from agentnest import Sandbox, Secret
from agentnest.runtime.base import Capability
from agentnest.runtime.docker import hardening

from .helpers import OCI_RUNTIME, SANDBOX_UID, container_of, need_storage_pool, owner_label, xfail_on

MiB = 1024 * 1024

GVISOR_SHARED_OOM = "gVisor: exhausting the sandbox's memory ends the whole sandbox"

#: Runs in a fresh python3 in the sandbox; prints what the kernel says about itself.
IDENTITY = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
status = {}
with open("/proc/self/status") as f:
    for line in f:
        key, _, value = line.partition(":")
        status[key] = value.strip()
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(),
    "groups": os.getgroups(), "cwd": os.getcwd(), "status": status,
    "no_new_privs": libc.prctl(39, 0, 0, 0, 0),   # PR_GET_NO_NEW_PRIVS
    "seccomp_mode": libc.prctl(21, 0, 0, 0, 0),   # PR_GET_SECCOMP
}))
"""

#: Calls a libc function or raw syscall; prints {"ret": ..., "errno": ...}.
LIBC_CALL = r"""
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
what = sys.argv[1]
if what == "unshare_user":
    ret = libc.unshare(0x10000000)                     # CLONE_NEWUSER
elif what == "unshare_mount":
    ret = libc.unshare(0x00020000)                     # CLONE_NEWNS
elif what == "io_uring_setup":
    params = ctypes.create_string_buffer(120)          # struct io_uring_params
    ret = libc.syscall(425, 8, params)                 # __NR_io_uring_setup (x86_64, arm64)
elif what == "mount":
    ret = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
else:
    raise SystemExit("unknown call " + what)
print(json.dumps({"ret": ret, "errno": ctypes.get_errno()}))
"""


def libc_call(sb: Sandbox, what: str) -> dict[str, int]:
    result = sb.exec(["python3", "-c", LIBC_CALL, what], timeout=30).check()
    out: dict[str, int] = json.loads(result.stdout)
    return out


@pytest.fixture(scope="module")
def identity(shared_sandbox: Sandbox) -> dict[str, Any]:
    found: dict[str, Any] = shared_sandbox.exec_json(IDENTITY, timeout=30)
    return found


# -- identity and privileges ---------------------------------------------------------


def test_runs_as_uid_and_gid_65532(identity: dict[str, Any]) -> None:
    assert identity["uid"] == identity["euid"] == SANDBOX_UID
    assert identity["gid"] == identity["egid"] == SANDBOX_UID
    assert set(identity["groups"]) <= {SANDBOX_UID}


def test_every_capability_set_is_empty(identity: dict[str, Any]) -> None:
    status = identity["status"]
    for field in ("CapEff", "CapPrm", "CapBnd", "CapInh"):
        assert int(status[field], 16) == 0, f"{field} is {status[field]}"
    if "CapAmb" in status:  # gVisor does not report the ambient set
        assert int(status["CapAmb"], 16) == 0


def test_no_new_privileges_is_set(identity: dict[str, Any], backend_name: str) -> None:
    assert identity["no_new_privs"] == 1
    if backend_name == "docker":  # gVisor's /proc/self/status has no such line
        assert identity["status"]["NoNewPrivs"] == "1"


def test_seccomp_filter_is_active(identity: dict[str, Any], backend_name: str) -> None:
    # 2 is SECCOMP_MODE_FILTER.  gVisor reports 0 when it ignores the profile
    # (runsc without --oci-seccomp).
    assert identity["seccomp_mode"] == 2
    if backend_name == "docker":
        assert identity["status"]["Seccomp"] == "2"


def test_setuid_root_binaries_do_not_elevate(shared_sandbox: Sandbox) -> None:
    code = r"""
import json, os, subprocess, time
out = {}
try:
    os.setuid(0)
    out["setuid"] = "allowed"
except OSError as exc:
    out["setuid"] = exc.errno
out["su_mode"] = os.stat("/usr/bin/su").st_mode
# su is setuid root: while it waits for a password, look at its credentials.
p = subprocess.Popen(["/usr/bin/su", "root", "-c", "id"], stdin=subprocess.PIPE,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(200):
        with open("/proc/%d/status" % p.pid) as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        if status.get("Name") == "su":
            out["su_uid"] = [int(x) for x in status["Uid"].split()]
            break
        time.sleep(0.02)
finally:
    p.kill()
    p.wait()
print(json.dumps(out))
"""
    found = shared_sandbox.exec_json(code, timeout=30)
    assert found["setuid"] == errno.EPERM
    assert found["su_mode"] & 0o4000, "the probe needs su to be setuid in the image"
    # real, effective, saved, filesystem: none became 0.
    assert found["su_uid"] == [SANDBOX_UID] * 4


def test_user_namespaces_are_refused(shared_sandbox: Sandbox) -> None:
    for call in ("unshare_user", "unshare_mount"):
        found = libc_call(shared_sandbox, call)
        assert found == {"ret": -1, "errno": errno.EPERM}, call


def test_threads_start_but_namespaced_clones_do_not(shared_sandbox: Sandbox) -> None:
    # Under gVisor a filtered clone3 answered EPERM (not ENOSYS), so libc never
    # fell back to clone and no thread could start: the profile differs there.
    code = (
        "import ctypes, json, threading\n"
        "out = []\n"
        "t = threading.Thread(target=out.append, args=('thread ran',)); t.start(); t.join()\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall(435, 0, 0)\n"  # clone3: ENOSYS (filtered on runc, unimplemented in gVisor)
        "print(json.dumps([out, ctypes.get_errno()]))\n"
    )
    assert shared_sandbox.exec_json(code) == [["thread ran"], errno.ENOSYS]


def test_io_uring_is_refused(shared_sandbox: Sandbox, backend_name: str) -> None:
    if shared_sandbox.exec(["uname", "-m"]).stdout.strip() not in ("x86_64", "aarch64"):
        pytest.skip("syscall number 425 is io_uring_setup on x86_64 and aarch64 only")
    found = libc_call(shared_sandbox, "io_uring_setup")
    assert found["ret"] == -1
    expected = {errno.EPERM} if backend_name == "docker" else {errno.EPERM, errno.ENOSYS}
    assert found["errno"] in expected


def test_mount_is_refused(shared_sandbox: Sandbox) -> None:
    assert libc_call(shared_sandbox, "mount") == {"ret": -1, "errno": errno.EPERM}
    # The setuid mount binary cannot do it either.
    assert shared_sandbox.exec(["mount", "-t", "tmpfs", "none", "/tmp"]).exit_code != 0


# -- filesystem ------------------------------------------------------------------------


def test_root_filesystem_is_read_only(shared_sandbox: Sandbox) -> None:
    code = r"""
import json, os
out = {}
for path in ("/etc/x", "/usr/x", "/x", "/usr/bin/python3"):
    try:
        with open(path, "a"):
            pass
        out[path] = "written"
    except OSError as exc:
        out[path] = exc.errno
try:
    os.mkdir("/opt/agentnest-x")
    out["mkdir"] = "created"
except OSError as exc:
    out["mkdir"] = exc.errno
print(json.dumps(out))
"""
    found = shared_sandbox.exec_json(code, timeout=30)
    # runc reports EROFS; gVisor checks permissions first and reports EACCES.
    for path, outcome in found.items():
        assert outcome in (errno.EROFS, errno.EACCES), f"{path}: {outcome}"


def test_workspace_is_the_writable_cwd_and_tmp_is_writable(
    shared_sandbox: Sandbox, identity: dict[str, Any]
) -> None:
    assert identity["cwd"] == "/workspace"
    code = r"""
import json, os
for path in ("defaults-probe.txt", "/tmp/defaults-probe.txt"):
    with open(path, "w") as f:
        f.write("ok")
print(json.dumps([open(p).read() for p in ("/workspace/defaults-probe.txt", "/tmp/defaults-probe.txt")]))
for p in ("/workspace/defaults-probe.txt", "/tmp/defaults-probe.txt"):
    os.unlink(p)
"""
    assert shared_sandbox.exec_json(code, timeout=30) == ["ok", "ok"]


def test_writable_mounts_are_bounded(shared_sandbox: Sandbox) -> None:
    """The sandbox cannot fill the host's disk: /tmp is a tmpfs, the workspace the pool's or a tmpfs."""
    code = r"""
import json
out = {}
with open("/proc/self/mounts") as f:
    for line in f:
        _dev, target, fstype, opts = line.split()[:4]
        out[target] = [fstype, opts.split(",")]
print(json.dumps(out))
"""
    mounts = shared_sandbox.exec_json(code, timeout=30)
    on_disk = shared_sandbox.config.limits.workspace_medium == "disk"
    # With a storage pool on this host (`make test` makes one) the default is the disk.
    assert on_disk == (Capability.DISK_WORKSPACE in shared_sandbox.backend.capabilities())
    assert mounts["/tmp"][0] == "tmpfs"
    assert "rw" in mounts["/tmp"][1] and "rw" in mounts["/workspace"][1]
    if not on_disk:
        assert mounts["/workspace"][0] == "tmpfs"
    elif shared_sandbox.backend.oci_runtime == "runc":
        # The pool's subvolume itself (gVisor shows its own file system type here).
        assert mounts["/workspace"][0] == "btrfs"
        assert {"nosuid", "nodev"} <= set(mounts["/workspace"][1])
    assert "ro" in mounts["/"][1]


# -- network ---------------------------------------------------------------------------


def test_only_loopback_and_no_route(shared_sandbox: Sandbox) -> None:
    code = r"""
import json
with open("/proc/net/dev") as f:
    ifaces = [line.split(":")[0].strip() for line in f.readlines()[2:] if ":" in line]
with open("/proc/net/route") as f:
    routes = [line for line in f.readlines()[1:] if line.strip()]
print(json.dumps({"ifaces": ifaces, "routes": routes}))
"""
    found = shared_sandbox.exec_json(code, timeout=30)
    assert found == {"ifaces": ["lo"], "routes": []}


def test_connect_outside_fails_at_once(shared_sandbox: Sandbox) -> None:
    # 192.0.2.1 is TEST-NET-1; with no route the kernel refuses before sending.
    code = r"""
import json, socket, time
out = {}
for kind in ("tcp", "udp"):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(5)
    start = time.monotonic()
    try:
        if kind == "tcp":
            s.connect(("192.0.2.1", 80))
        else:
            s.sendto(b"x", ("192.0.2.1", 9))
        out[kind] = ["sent", time.monotonic() - start]
    except OSError as exc:
        out[kind] = [exc.errno, time.monotonic() - start]
    finally:
        s.close()
print(json.dumps(out))
"""
    found = shared_sandbox.exec_json(code, timeout=30)
    for kind, (outcome, seconds) in found.items():
        assert outcome in (errno.ENETUNREACH, errno.EHOSTUNREACH), f"{kind}: {outcome}"
        assert seconds < 1, f"{kind} took {seconds:.2f}s: it was not refused locally"


# -- resource limits ---------------------------------------------------------------------


@pytest.fixture
def small_sandbox(backend_name: str) -> Iterator[Sandbox]:
    with Sandbox(
        backend=backend_name, timeout=120, memory="128m", workspace_size="32m", scratch_size="16m"
    ) as sb:
        yield sb


def test_memory_limit_kills_the_process_not_the_sandbox(
    request: pytest.FixtureRequest, backend_name: str, small_sandbox: Sandbox
) -> None:
    code = r"""
blocks = []
for _ in range(400):                      # 400 MiB, every page touched
    block = bytearray(1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    blocks.append(block)
print("allocated", len(blocks))
"""
    result = small_sandbox.exec_python(code, timeout=60)
    assert "allocated" not in result.stdout
    killed = result.exit_code == 137 and result.signal == 9
    assert killed or "MemoryError" in result.stderr, result
    assert small_sandbox.exec_shell("echo alive", timeout=30).stdout == "alive\n"


FORK_LOOP = r"""
import errno, json, os, sys, time
children, error = [], None
try:
    for _ in range(int(sys.argv[1])):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    error = exc.errno
for pid in children:
    os.kill(pid, 9)
for pid in children:
    os.waitpid(pid, 0)
print(json.dumps({"forked": len(children), "errno": error}))
"""


@pytest.mark.parametrize("pids", [64, 256])
def test_pids_limit_stops_a_fork_loop(request: pytest.FixtureRequest, backend_name: str, pids: int) -> None:
    if pids == 256:
        # 256 forked interpreters need more than the default 512 MiB; gVisor
        # keeps every process's memory in one host process, which the kernel
        # OOM-kills as a whole (docs/security.md, "Known limits").
        xfail_on(request, backend_name, "gvisor", GVISOR_SHARED_OOM)
    with Sandbox(backend=backend_name, timeout=120, pids=pids) as sb:
        result = sb.exec(["python3", "-c", FORK_LOOP, str(pids * 2)], timeout=60).check()
        found = json.loads(result.stdout)
        assert found["errno"] == errno.EAGAIN
        assert found["forked"] < pids
        assert sb.exec_shell("echo alive", timeout=30).stdout == "alive\n"


FILL = r"""
import errno, json, sys
written, error = 0, None
try:
    with open(sys.argv[1], "wb") as f:
        while written < 256 * 1024 * 1024:
            f.write(b"x" * 65536)
            f.flush()
            written += 65536
except OSError as exc:
    error = exc.errno
print(json.dumps({"written": written, "errno": error}))
"""


def test_workspace_and_scratch_sizes_are_bounded(small_sandbox: Sandbox) -> None:
    # The default workspace is on disk (under its quota: EDQUOT), /tmp a tmpfs (ENOSPC).
    assert small_sandbox.config.limits.workspace_medium == "disk"
    for path, size, code in (
        ("/workspace/fill.bin", 32 * MiB, errno.EDQUOT),
        ("/tmp/fill.bin", 16 * MiB, errno.ENOSPC),
    ):
        found = json.loads(small_sandbox.exec(["python3", "-c", FILL, path], timeout=60).check().stdout)
        assert found["errno"] == code, path
        # Full at the configured size: bounded by the kernel at what was asked for.
        assert size - 4 * MiB <= found["written"] <= size, (path, found)
        small_sandbox.exec(["rm", "-f", path]).check()
    assert small_sandbox.exec_shell("echo alive", timeout=30).stdout == "alive\n"


# -- the engine's view -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def inspected(shared_sandbox: Sandbox, docker_client: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = container_of(docker_client, shared_sandbox).attrs
    return attrs


def test_container_labels(inspected: dict[str, Any], shared_sandbox: Sandbox, backend_name: str) -> None:
    labels = inspected["Config"]["Labels"]
    assert labels["agentnest.managed"] == "true"
    assert labels["agentnest.sandbox"] == shared_sandbox.id
    assert labels["agentnest.owner"] == owner_label()
    assert labels["agentnest.backend"] == backend_name
    assert abs(float(labels["agentnest.deadline"]) - shared_sandbox.deadline) < 1
    assert float(labels["agentnest.created"]) < float(labels["agentnest.deadline"]) <= time.time() + 900


def test_container_keeps_no_log(inspected: dict[str, Any]) -> None:
    # The agent's stream is the container's stdio: no host file may record it.
    assert inspected["HostConfig"]["LogConfig"]["Type"] == "none"


def test_container_uses_the_requested_runtime(inspected: dict[str, Any], backend_name: str) -> None:
    assert inspected["HostConfig"]["Runtime"] == OCI_RUNTIME[backend_name]


def test_host_config_is_hardened(inspected: dict[str, Any], backend_name: str) -> None:
    host = inspected["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"]
    assert not host.get("CapAdd")
    assert host["NetworkMode"] == "none"
    assert inspected["Config"]["User"] == f"{SANDBOX_UID}:{SANDBOX_UID}"
    assert host["Memory"] == host["MemorySwap"] == 512 * MiB
    if backend_name == "docker":
        assert host["PidsLimit"] == 256
    else:  # the cgroup also holds gVisor's Sentry: a ceiling with headroom
        assert host["PidsLimit"] >= 256
    assert f"size={64 * MiB}" in host["Tmpfs"]["/tmp"].split(",")
    pool = need_storage_pool()  # `make test` makes one, so the default workspace is on disk
    assert "/workspace" not in host["Tmpfs"]
    (mount,) = [m for m in inspected["Mounts"] if m["Destination"] == "/workspace"]
    # The sandbox's own subvolume of the pool, nothing above it.
    assert mount["Type"] == "bind" and mount["RW"] is True
    assert Path(mount["Source"]).parent == pool.root / "ws"
    options = host["SecurityOpt"]
    assert "no-new-privileges:true" in options or "no-new-privileges" in options
    (profile_opt,) = [o for o in options if o.startswith("seccomp=")]
    profile = json.loads(profile_opt.removeprefix("seccomp="))
    gvisor = backend_name == "gvisor"
    assert profile in (hardening.profile("x86_64", gvisor), hardening.profile("aarch64", gvisor))
    denied = {
        name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ERRNO" for name in rule["names"]
    }
    assert {"io_uring_setup", "unshare", "mount", "ptrace", "bpf"} <= denied


def test_container_log_keeps_no_command_output(backend_name: str, docker_client: Any) -> None:
    token = "agentnest-" + "log-probe-" + str(time.time_ns())
    with Sandbox(backend=backend_name, timeout=60, environment={"API_TOKEN": Secret(token)}) as sb:
        assert sb.exec_shell('echo "$API_TOKEN"').stdout == "[REDACTED]\n"
        container = container_of(docker_client, sb)
        try:
            logs = container.logs()
        except docker.errors.APIError as exc:
            # The "none" driver: the engine keeps nothing it could return.
            assert "does not support reading" in str(exc)
            logs = b""
        assert sb.exec_shell("echo visible-output").stdout == "visible-output\n"
    assert token.encode() not in logs
    assert b"visible-output" not in logs
