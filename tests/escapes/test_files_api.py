"""The file API as an attack path: absolute paths, ``..``, symlinks and
symlink-swap races, hardlinks, FIFOs, devices, huge files, special names,
malicious snapshots and downloads.

Sandbox code prepares the trap (it owns the workspace); the host API is the
victim that must neither read nor write outside the workspace, nor hang.
"""

from __future__ import annotations

import errno
import io
import os
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentnest import FileAccessError, Sandbox
from agentnest.errors import SnapshotError

from .probes import run_json

pytestmark = pytest.mark.attempt("files")


@pytest.fixture
def d(shared_sandbox: Sandbox) -> Iterator[str]:
    """A fresh directory in the shared sandbox's workspace, and a twin in /tmp (outside it)."""
    name = f"trap-{os.urandom(4).hex()}"
    shared_sandbox.exec_shell(f"mkdir {name} /tmp/{name} && echo OUTSIDE > /tmp/{name}/secret").check()
    yield name
    shared_sandbox.exec_shell(f"rm -rf {name} /tmp/{name}").check()


def outside(sb: Sandbox, d: str) -> dict[str, str]:
    """What /tmp/<d> (outside the workspace) holds: name -> content."""
    code = (
        f"import json, os; p = '/tmp/{d}'\n"
        "print(json.dumps({n: open(p + '/' + n).read() for n in os.listdir(p)}))"
    )
    found: dict[str, str] = run_json(sb, code)
    return found


def every_call(sb: Sandbox, path: str) -> dict[str, Callable[[], object]]:
    return {
        "read": lambda: sb.read_file(path),
        "write": lambda: sb.write_file(path, "escaped"),
        "list": lambda: sb.list_files(path),
        "exists": lambda: sb.exists(path),
        "mkdir": lambda: sb.mkdir(path),
        "remove": lambda: sb.remove_file(path, recursive=True),
        "download": lambda: sb.download(path, "/nonexistent-agentnest-escape"),
    }


ABSOLUTE = ["/etc/shadow", "/proc/1/environ", "/proc/self/root/etc/passwd", "/var/run/docker.sock", "//etc"]
DOTDOT = [
    "../../../../etc/passwd",
    "a/b/../../../x",
    "./../x",
    "x/..//../y",
    "/workspace/./../tmp/x",
    "a/./../../x",
]


@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_paths_out_of_the_workspace_are_refused(shared_sandbox: Sandbox, kind: str) -> None:
    for path in ABSOLUTE if kind == "absolute" else DOTDOT:
        for name, call in every_call(shared_sandbox, path).items():
            with pytest.raises(FileAccessError) as info:
                call()
            assert info.value.code == "outside_workspace", (path, name)
    # Nothing was created on the host or in the sandbox.
    assert not Path("/nonexistent-agentnest-escape").exists()
    assert run_json(shared_sandbox, "import json, os; print(json.dumps(sorted(os.listdir('/tmp'))))") == []


LOOKALIKES = [
    "...",
    "..a",
    "a..",
    "%2e%2e/%2e%2e/etc/passwd",
    "..\\..\\etc\\passwd",
    "~root/.profile",
    "$(touch /tmp/pwned)",
    "; touch /tmp/pwned",
    "-rf",
    "\u202etxt.exe",
    "名前 with spaces",
    "line\nbreak",
]


def test_lookalike_names_stay_in_the_workspace(shared_sandbox: Sandbox, d: str) -> None:
    for name in LOOKALIKES:
        shared_sandbox.write_file(f"{d}/{name}", name)
        assert shared_sandbox.read_file(f"{d}/{name}") == name
    listed = {info.path for info in shared_sandbox.list_files(d, recursive=True) if info.type == "file"}
    assert listed == {f"{d}/{name}" for name in LOOKALIKES}
    assert outside(shared_sandbox, d) == {"secret": "OUTSIDE\n"}
    assert (
        run_json(shared_sandbox, "import json, os; print(json.dumps(os.path.exists('/tmp/pwned')))") is False
    )


def test_invalid_names_are_refused(shared_sandbox: Sandbox, d: str) -> None:
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.write_file(f"{d}/{'x' * 256}", "long")
    assert info.value.code == "invalid_path"
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.write_file(f"{d}/a\0b", "nul")
    assert info.value.code == "invalid_path"
    assert shared_sandbox.list_files(d) == []


def test_final_symlinks_to_host_secrets_are_not_followed(shared_sandbox: Sandbox, d: str) -> None:
    links = {"environ": "/proc/1/environ", "root": "/proc/self/root", "out": f"/tmp/{d}/secret"}
    shared_sandbox.exec_shell(
        "; ".join(f"ln -s {target} {d}/{name}" for name, target in links.items())
    ).check()
    for name in links:
        with pytest.raises(FileAccessError) as info:
            shared_sandbox.read_file(f"{d}/{name}")
        assert info.value.code == "symlink", name
    shared_sandbox.write_file(f"{d}/out", "replaced")  # replaces the link itself
    assert outside(shared_sandbox, d) == {"secret": "OUTSIDE\n"}
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.read_file(f"{d}/root/etc/passwd")
    assert info.value.code == "symlink"


#: Swaps NAME between a directory (or file) inside the workspace and a symlink
#: to the matching place in /tmp, as fast as it can, until killed: atomically
#: with renameat2(RENAME_EXCHANGE) where the kernel has it (gVisor 20221219
#: does not: there NAME is briefly absent between two renames).
SWAPPER = r"""
import ctypes, os, sys
d, name, kind = sys.argv[1:]
os.chdir(d)
if kind == "dir":
    os.mkdir(name); open(name + "/secret", "w").write("inside\n")
else:
    open(name, "w").write("inside\n")
os.symlink("/tmp/%s%s" % (d, "" if kind == "dir" else "/secret"), "parked")
libc = ctypes.CDLL(None, use_errno=True)
exchange = libc.syscall(316, -100, name.encode(), -100, b"parked", 2) == 0   # RENAME_EXCHANGE
print("ready", flush=True)
while True:
    try:
        if exchange:
            libc.syscall(316, -100, name.encode(), -100, b"parked", 2)
        else:
            os.rename(name, "real"); os.rename("parked", name)
            os.rename(name, "parked"); os.rename("real", name)
    except OSError:
        pass  # the host replaced something: carry on with what is there
"""


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_symlink_swap_races_cannot_redirect_the_api(shared_sandbox: Sandbox, d: str, kind: str) -> None:
    sb = shared_sandbox
    reads: Counter[str] = Counter()
    writes: Counter[str] = Counter()
    target = f"{d}/sub/secret" if kind == "dir" else f"{d}/sub"
    with sb.stream_exec(["python3", "-c", SWAPPER, d, "sub", kind], timeout=120) as swapper:
        # Keep the iterator: a dropped generator closes the stream, which kills the command.
        output = iter(swapper)
        assert next(output).data.startswith("ready")  # the swapping has begun
        # At least 150 reads, and on until both states were seen: a host-side read
        # (a disk workspace) takes microseconds, less than one swap under gVisor.
        deadline = time.monotonic() + 30
        while sum(reads.values()) < 150 or (
            not (reads["ok"] and reads["symlink"] + reads["not_found"]) and time.monotonic() < deadline
        ):
            try:
                assert sb.read_file(target) in ("inside\n", "planted"), "read through the swapped link"
                reads["ok"] += 1
            except FileAccessError as exc:
                reads[exc.code] += 1
        for i in range(50):
            try:
                sb.write_file(f"{d}/sub/planted-{i}" if kind == "dir" else target, "planted")
                writes["ok"] += 1
            except FileAccessError as exc:
                writes[exc.code] += 1
    # The race was live (reads hit both states) and nothing went outside.
    assert reads["ok"] > 0, reads
    assert reads["symlink"] + reads["not_found"] > 0, reads
    allowed = {"ok", "symlink", "not_found", "not_directory", "exists", "is_directory"}
    assert set(reads) | set(writes) <= allowed, (reads, writes)
    assert outside(sb, d) == {"secret": "OUTSIDE\n"}


def test_hardlinks_cannot_reach_outside(shared_sandbox: Sandbox, d: str) -> None:
    code = f"""
import json, os
out = {{}}
for source in ("/etc/passwd", "/tmp/{d}/secret", "/usr/bin/su"):
    try:
        os.link(source, "{d}/link-" + os.path.basename(source)); out[source] = "linked"
    except OSError as exc:
        out[source] = exc.errno
print(json.dumps(out))
"""
    # The workspace is its own filesystem: no link can name a file elsewhere.
    assert set(run_json(shared_sandbox, code).values()) == {errno.EXDEV}
    assert shared_sandbox.list_files(d) == []


def test_fifos_and_sockets_do_not_hang_the_api(shared_sandbox: Sandbox, d: str) -> None:
    code = f"""
import os, socket
os.mkfifo("{d}/fifo")
s = socket.socket(socket.AF_UNIX); s.bind("{d}/sock")
"""
    shared_sandbox.exec_python(code).check()
    start = time.monotonic()
    for name in ("fifo", "sock"):
        with pytest.raises(FileAccessError) as info:
            shared_sandbox.read_file(f"{d}/{name}")
        assert info.value.code == "not_regular", name
    # Writing onto a FIFO replaces it (a rename) instead of blocking on it.
    shared_sandbox.write_file(f"{d}/fifo", "data")
    assert shared_sandbox.read_file(f"{d}/fifo") == "data"
    assert time.monotonic() - start < 10


def test_device_files_are_refused(shared_sandbox: Sandbox, d: str, backend_name: str) -> None:
    shared_sandbox.exec_shell(f"ln -s /dev/zero {d}/zero-link").check()
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.read_file(f"{d}/zero-link")
    assert info.value.code == "symlink"
    if backend_name == "gvisor":
        # gVisor lets sandbox code make a node of its own /dev/zero (1:5), but
        # not in a disk workspace (its gofer refuses device nodes on host files).
        mknod = f"import os; os.mknod('{d}/zero', 0o20666, os.makedev(1, 5))"
        made = shared_sandbox.exec_python(mknod)
        if shared_sandbox.config.limits.workspace_medium == "disk":
            assert made.exit_code == 1 and "Operation not permitted" in made.stderr
            return
        made.check()
        with pytest.raises(FileAccessError) as info:
            shared_sandbox.read_file(f"{d}/zero")
        assert info.value.code == "not_regular"


def test_huge_sparse_files_are_refused_quickly(shared_sandbox: Sandbox, d: str) -> None:
    # 1 TiB that costs the sandbox nothing (a hole): the agent must look at the
    # size before reading, and the host must not try to hold it.
    make = f"import os; open('{d}/huge', 'w').close(); os.truncate('{d}/huge', 1 << 40)"
    shared_sandbox.exec_python(make).check()
    start = time.monotonic()
    for encoding in (None, "utf-8"):
        with pytest.raises(FileAccessError) as info:
            shared_sandbox.read_file(f"{d}/huge", encoding=encoding)
        assert info.value.code == "too_large"
    assert time.monotonic() - start < 5
    (entry,) = shared_sandbox.list_files(d)
    assert entry.size == 1 << 40


def test_download_refuses_links_out_of_the_workspace(shared_sandbox: Sandbox, d: str, tmp_path: Path) -> None:
    shared_sandbox.exec_shell(f"mkdir {d}/out && echo ok > {d}/out/a && ln -s /etc/passwd {d}/out/pw").check()
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.download(f"{d}/out", tmp_path)
    assert info.value.code == "link"
    written = [p for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink()]
    assert all(not p.is_symlink() and b"root:" not in p.read_bytes() for p in written)


def malicious_tar(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        root = tarfile.TarInfo("workspace")  # the root, as snapshots have it
        root.type = tarfile.DIRTYPE
        tar.addfile(root)
        member = tarfile.TarInfo(
            {"absolute": "/tmp/escaped", "dotdot": "workspace/../escaped"}.get(kind, "workspace/x")
        )
        if kind == "symlink":
            member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif kind == "hardlink":
            member.type, member.linkname = tarfile.LNKTYPE, "/etc/passwd"
        elif kind == "device":
            member.type, member.devmajor, member.devminor = tarfile.CHRTYPE, 1, 1
        data = b"escaped" if member.type == tarfile.REGTYPE else b""
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink", "hardlink", "device"])
def test_malicious_snapshots_are_refused(shared_sandbox: Sandbox, kind: str, tmp_path: Path) -> None:
    shared_sandbox.write_file("restore-canary.txt", "before")
    archive = tmp_path / "evil.tar"
    archive.write_bytes(malicious_tar(kind))
    with pytest.raises(SnapshotError) as info:
        shared_sandbox.restore(archive)
    assert info.value.rule == kind
    # The workspace is as it was, and nothing landed outside it.
    assert shared_sandbox.read_file("restore-canary.txt") == "before"
    found = run_json(shared_sandbox, "import json, os; print(json.dumps(os.path.lexists('/tmp/escaped')))")
    assert found is False
    assert not Path("/tmp/escaped").exists()
    shared_sandbox.remove_file("restore-canary.txt")
