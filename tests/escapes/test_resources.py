"""Resource abuse: fork and thread bombs, memory bombs, filling every writable
place, output floods, CPU hogs, many tiny files, descriptors, zombies.

Each attempt runs in a fresh sandbox with small limits (they are destroyed
by the abuse, or could be), asserts that the limit held where the limit is
set, that the abuse was reported as what it was, and that the sandbox is
usable afterwards where the runtime allows it.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.helpers import Background, container_of, need_storage_pool

from agentnest import ExecutionTimeoutError, Sandbox, SandboxDestroyedError, SecurityPolicy, SessionLostError
from agentnest.errors import ChannelError
from agentnest.testing.wait import wait_until

from .probes import run_json

pytestmark = pytest.mark.attempt("resources")

MiB = 1024 * 1024


@pytest.fixture
def small(backend_name: str) -> Iterator[Sandbox]:
    """A fresh sandbox with small limits, its workspace in memory (a tmpfs, as /tmp)."""
    with Sandbox(
        backend=backend_name,
        workspace="memory",
        timeout=180,
        memory="384m",
        cpus=0.5,
        pids=64,
        workspace_size="128m",
        scratch_size="64m",
        security_policy=SecurityPolicy(max_output_bytes=1_000_000),
    ) as sb:
        yield sb


def alive(sb: Sandbox) -> bool:
    return sb.exec_shell("echo alive", timeout=30).stdout == "alive\n"


class PidsWatcher:
    """Samples the container's process count (the engine's view) until stopped."""

    def __init__(self, container: Any, also: Callable[[], None] = lambda: None) -> None:
        self.peak = 0
        self._container = container
        self._also = also
        self._stop = threading.Event()
        self._thread = Background(self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._also()
            self.peak = max(self.peak, engine_pids(self._container))
            self._stop.wait(0.1)

    def stop(self) -> int:
        self._stop.set()
        assert self._thread.join(30)
        assert self._thread.error is None, self._thread.error
        return self.peak


#: Every process forks forever and reports its first refusal, once: at most one
#: line per process, which the PID limit bounds.  (Any process may be the first
#: to be refused: under load the original one can be the last to run.)
FORK_BOMB = r"""
import os
reported = False
while True:
    try:
        os.fork()
    except OSError as exc:
        if not reported:
            os.write(1, b"fork refused: %d\n" % exc.errno)  # one write: lines do not interleave
            reported = True
"""
REFUSED = {f"fork refused: {errno.EAGAIN}"}


GVISOR_FORK_BOMB = (
    "HOLE (gVisor): a real fork bomb ends the whole sandbox (exit code 2). RLIMIT_NPROC holds the "
    "workload to `pids` processes, but gVisor's own host threads fill the cgroup's PID ceiling "
    "(pids * 6 + 512) and the Sentry dies; the host is unaffected. Fix in the Docker backend: a "
    "larger ceiling or a lower in-sandbox RLIMIT_NPROC, and an exit reason that names the PID limit"
)


def fork_bomb(sb: Sandbox) -> set[str]:
    """Run the bomb for 5 s (the timeout kills its whole tree); return the lines it reported."""
    with pytest.raises(ExecutionTimeoutError) as info:
        sb.exec(["python3", "-c", FORK_BOMB], timeout=5)
    assert info.value.result is not None
    return set(info.value.result.stdout.splitlines())


class HostProcesses:
    """Samples the number of processes in the host's /proc (threads not counted)."""

    def __init__(self) -> None:
        self.peak = self.count()

    @staticmethod
    def count() -> int:
        return sum(1 for p in os.listdir("/proc") if p.isdigit())

    def sample(self) -> None:
        self.peak = max(self.peak, self.count())


def test_fork_bomb_is_held_to_the_pids_limit(small: Sandbox, backend_name: str, docker_client: Any) -> None:
    container = container_of(docker_client, small)
    ceiling = container.attrs["HostConfig"]["PidsLimit"]  # 64 on runc; headroom for gVisor's Sentry
    host = HostProcesses()
    host_before = host.peak
    watcher = PidsWatcher(container, also=host.sample)
    try:
        report: set[str] | None = fork_bomb(small)
    except SandboxDestroyedError:
        report = None  # gVisor: see test_sandbox_survives_a_fork_bomb
    peak = watcher.stop()
    if backend_name == "docker" or report is not None:
        assert report == REFUSED
    # The engine's limit held, and the host's process table did not take the
    # bomb while it ran (at most the sandbox's own limit, plus other work on the machine).
    assert 0 < peak <= ceiling
    if backend_name == "docker":
        assert peak >= 32, "the bomb should have reached the limit"
    # Without the limit the bomb makes thousands; 200 allows for other work on the machine.
    assert host.peak < host_before + 64 + 200


#: The process ids in the sandbox other than init, the agent and this probe:
#: what is left of earlier commands.
LEFTOVERS = r"""
import json, os
mine = {1, os.getpid(), os.getppid()}
print(json.dumps(sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine)))
"""


def engine_pids(container: Any) -> int:
    """The container's process (task) count as the engine sees it."""
    return int(container.stats(stream=False, one_shot=True)["pids_stats"].get("current", 0))


def test_sandbox_survives_a_fork_bomb(small: Sandbox, backend_name: str, docker_client: Any) -> None:
    container = container_of(docker_client, small)
    left: list[int] = []

    def bomb_is_gone() -> bool:
        left[:] = run_json(small, LEFTOVERS)
        return not left

    try:
        report = fork_bomb(small)
        # The timeout killed the whole bomb: the sandbox's process table is back
        # to init and the agent (killed processes linger until reaped), and it works.
        try:
            wait_until(bomb_is_gone, "the bomb's processes to be reaped", within=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still in the sandbox: {left}") from None
        assert alive(small)
    except (SandboxDestroyedError, ChannelError):
        if backend_name == "gvisor":
            # Not always: under load the bomb can stop short of the ceiling and
            # the sandbox lives, which the assertions here then hold it to.  The
            # same hole sometimes takes only the agent (ChannelError: agent lost),
            # seen once in a full run.
            pytest.xfail(GVISOR_FORK_BOMB)
        raise
    assert report == REFUSED
    if backend_name == "docker":
        # The engine's view agrees.  (Under gVisor its count is the Sentry's host
        # threads, which it keeps after the workload is gone.)
        wait_until(lambda: engine_pids(container) < 32, "the engine to count the bomb's processes gone", 30)


THREAD_BOMB = r"""
import json, threading
stop, threads, error = threading.Event(), [], None
try:
    while len(threads) < 10000:
        t = threading.Thread(target=stop.wait)
        t.start()
        threads.append(t)
except (RuntimeError, MemoryError) as exc:
    error = type(exc).__name__
stop.set()
for t in threads:
    t.join()
print(json.dumps({"threads": len(threads), "error": error}))
"""


def test_thread_bomb_is_bounded(small: Sandbox) -> None:
    found = run_json(small, THREAD_BOMB)
    # Threads count against the PID limit (64): the bomb stops well short of 10,000.
    assert found["error"] in ("RuntimeError", "MemoryError")
    assert found["threads"] < 64
    assert alive(small)


def oom_kills(container: Any) -> int | None:
    """How many processes the kernel OOM-killed in the container's cgroup (cgroup v1), if known."""
    path = Path(f"/sys/fs/cgroup/memory/docker/{container.id}/memory.oom_control")
    if not path.exists():
        return None
    fields = dict(line.split() for line in path.read_text().splitlines())
    return int(fields.get("oom_kill", 0))


MMAP_BOMB = r"""
import mmap
m = mmap.mmap(-1, 2 << 30)            # 2 GiB, every page touched
for i in range(0, len(m), 4096):
    m[i] = 1
print("allocated")
"""


def test_memory_bomb_is_killed_inside(small: Sandbox, backend_name: str, docker_client: Any) -> None:
    container = container_of(docker_client, small)
    before = oom_kills(container)
    result = small.exec(["python3", "-c", MMAP_BOMB], timeout=60)
    assert "allocated" not in result.stdout
    if backend_name == "docker":
        # The kernel's OOM killer took the process, not the sandbox.
        assert (result.exit_code, result.signal) == (137, 9)
        after = oom_kills(container)
        if before is not None and after is not None:
            assert after > before
    else:
        # gVisor: RLIMIT_AS refuses the mapping before memory runs out.
        assert result.exit_code == 1
        assert "OSError: [Errno 12] Cannot allocate memory" in result.stderr
    container.reload()
    assert container.status == "running"
    assert not container.attrs["State"]["OOMKilled"]
    assert alive(small)


def test_memory_bomb_in_a_session_is_contained(small: Sandbox, backend_name: str) -> None:
    session = small.python_session()
    bomb = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))"
    if backend_name == "docker":
        with pytest.raises(SessionLostError) as info:
            session.run(bomb, timeout=60)
        assert "signal 9" in str(info.value)
        assert "out of memory" in str(info.value)
        session.reset()
    else:
        result = session.run(bomb, timeout=60)
        assert not result.ok
        assert result.error is not None and "MemoryError" in result.error
        session.run("del blocks").check()
    assert session.run("21 * 2").check().result == "42"
    session.close()
    assert alive(small)


FILL = r"""
import errno, json, os, sys
path, written, error = sys.argv[1], 0, None
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
block = b"\xa5" * (1 << 20)
try:
    while written < (1 << 30):
        written += os.write(fd, block)
except OSError as exc:
    error = exc.errno
os.close(fd)
print(json.dumps({"written": written, "errno": error}))
"""


def docker_disk_used(docker_client: Any) -> int:
    return shutil.disk_usage(docker_client.info()["DockerRootDir"]).used


def writable_layer_bytes(docker_client: Any, container: Any) -> int:
    """What the container wrote to its image layer on the host's disk (``docker inspect --size``)."""
    api = docker_client.api
    found = api._result(api._get(api._url("/containers/{0}/json", container.id), params={"size": 1}), True)
    return int(found.get("SizeRw") or 0)


@pytest.mark.parametrize(
    ("place", "size"), [("/workspace", 128 * MiB), ("/tmp", 64 * MiB), ("/dev/shm", 64 * MiB)]
)
def test_filling_a_writable_place_stops_at_its_size(
    small: Sandbox, docker_client: Any, place: str, size: int
) -> None:
    disk_before = docker_disk_used(docker_client)
    found = run_json(small, FILL, f"{place}/fill.bin", timeout=120)
    assert found["errno"] == errno.ENOSPC
    assert size - 8 * MiB <= found["written"] <= size
    # The data went to memory-backed tmpfs, not to the host's disk: the
    # container's own layer is empty, and the engine's disk did not grow by
    # what was written (other work on the machine may move it a little).
    assert writable_layer_bytes(docker_client, container_of(docker_client, small)) == 0
    assert docker_disk_used(docker_client) - disk_before < found["written"]
    small.exec(["rm", "-f", f"{place}/fill.bin"]).check()
    assert alive(small)


def test_output_flood_is_cut_at_max_output_bytes(small: Sandbox) -> None:
    start = time.monotonic()
    with pytest.raises(ExecutionTimeoutError) as info:
        small.exec(["yes", "flood"], timeout=2)  # never ends: held to its timeout
    result = info.value.result
    assert result is not None
    assert result.truncated
    assert len(result.stdout.encode()) + len(result.stderr.encode()) <= 1_000_000
    assert len(result.stdout) > 100_000
    assert time.monotonic() - start < 15
    # A flood that ends by itself, on both streams at once.
    flood = small.exec_python(
        "import sys\nfor _ in range(200):\n    sys.stdout.write('o' * 65536); sys.stderr.write('e' * 65536)"
    )
    assert flood.truncated and flood.exit_code == 0
    assert len(flood.stdout) + len(flood.stderr) <= 1_000_000
    streamed = sum(len(chunk.data) for chunk in small.stream_python("print('x' * 50_000_000)"))
    assert streamed <= 1_000_000
    assert alive(small)


def cpu_seconds(container: Any) -> float:
    """CPU time the container's cgroup has used, from the host (cgroup v1 file, else the engine)."""
    path = Path(f"/sys/fs/cgroup/cpuacct/docker/{container.id}/cpuacct.usage")
    if path.exists():
        return int(path.read_text()) / 1e9
    return int(container.stats(stream=False, one_shot=True)["cpu_stats"]["cpu_usage"]["total_usage"]) / 1e9


#: Two busy processes: without a limit they would take both of this machine's cores.
CPU_HOG = r"""
import os
os.fork()
print("hogging", flush=True)
while True:
    pass
"""


def test_cpu_hog_is_held_to_its_share(small: Sandbox, docker_client: Any) -> None:
    container = container_of(docker_client, small)
    with small.stream_exec(["python3", "-c", CPU_HOG], timeout=60) as hog:
        output = iter(hog)  # keep it: a dropped iterator closes the stream
        assert next(output).data.startswith("hogging")
        used, wall = cpu_seconds(container), time.monotonic()
        time.sleep(3)  # the measurement itself: CPU time over a wall-clock interval
        used, wall = cpu_seconds(container) - used, time.monotonic() - wall
    share = used / wall
    # At least a little (the hog ran; the machine may be busy), at most the share plus 30 %.
    assert 0.1 <= share <= 0.5 * 1.3, f"the hog used {share:.2f} CPUs with cpus=0.5"
    assert alive(small)


TINY_FILES = r"""
import errno, json, os, sys
size, cap = int(sys.argv[1]), int(sys.argv[2])
os.mkdir("tiny")
made, error = 0, None
data = b"x" * size
try:
    while made < cap:
        fd = os.open("tiny/%d" % made, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        made += 1
except OSError as exc:
    error = exc.errno
print(json.dumps({"made": made, "errno": error}))
"""


@pytest.fixture
def small_disk(backend_name: str) -> Iterator[Sandbox]:
    """A fresh sandbox with a small disk workspace (the storage pool's quota)."""
    need_storage_pool()
    with Sandbox(backend=backend_name, timeout=180, memory="256m", pids=64, disk="64m") as sb:
        yield sb


def test_filling_the_disk_workspace_stops_at_its_quota(small_disk: Sandbox, docker_client: Any) -> None:
    pool = need_storage_pool()
    found = run_json(small_disk, FILL, "/workspace/fill.bin", timeout=120)
    # Refused by the kernel inside the sandbox, at the size asked for.
    assert found["errno"] == errno.EDQUOT
    assert 64 * MiB - 8 * MiB <= found["written"] <= 64 * MiB
    assert writable_layer_bytes(docker_client, container_of(docker_client, small_disk)) == 0
    # The host's disk gave at most the workspace's size: the kernel's own count of what this
    # workspace references (its qgroup, data and metadata), not the pool's growth, which other
    # sandboxes of a parallel run share.
    assert pool.limit(small_disk.id) == 64 * MiB
    assert 64 * MiB - 8 * MiB <= pool.used(small_disk.id) <= 64 * MiB
    small_disk.exec(["rm", "-f", "/workspace/fill.bin"]).check()
    assert small_disk.exec_shell("echo room > r.txt && cat r.txt").stdout == "room\n"
    assert alive(small_disk)


def test_a_million_tiny_files_stop_at_the_disk_quota(backend_name: str) -> None:
    # Tiny files live in btrfs's metadata, which the quota counts too: the
    # attempt stops with EDQUOT long before a million, and the sandbox lives.
    # A small quota: gVisor's gofer makes about a thousand files a second.
    need_storage_pool()
    with Sandbox(backend=backend_name, timeout=300, memory="256m", pids=64, disk="8m") as sb:
        found = run_json(sb, TINY_FILES, "1", "1000000", timeout=240)
        assert found["errno"] == errno.EDQUOT
        assert 1000 <= found["made"] < 1_000_000
        assert len(sb.list_files("tiny", max_entries=500)) == 500
        sb.remove_file("tiny", recursive=True)
        assert sb.list_files() == []
        assert alive(sb)


def test_a_million_tiny_files_stop_at_the_workspace_size(small: Sandbox) -> None:
    # Every 1-byte file takes a 4 KiB tmpfs page: a million of them would need
    # 4 GiB, so the 128 MiB workspace stops the attempt at about 32,000 files.
    found = run_json(small, TINY_FILES, "1", "1000000", timeout=120)
    assert found["errno"] == errno.ENOSPC
    assert 16_000 <= found["made"] <= 128 * MiB // 4096
    listed = small.list_files("tiny", max_entries=500)
    assert len(listed) == 500
    small.remove_file("tiny", recursive=True)
    assert small.list_files() == []
    assert alive(small)


def test_many_empty_files_are_survivable(small: Sandbox, backend_name: str) -> None:
    # Empty files take no pages, only inodes (kernel memory, charged to the
    # sandbox).  100,000 of them is a fifth of a second's work on runc and four
    # seconds on gVisor; a million would cost minutes there and prove nothing
    # more than the cap does.
    found = run_json(small, TINY_FILES, "0", "100000", timeout=120)
    assert found == {"made": 100_000, "errno": None} or found["errno"] in (errno.ENOSPC, errno.ENOMEM)
    small.remove_file("tiny", recursive=True)
    assert alive(small)


def test_descriptor_exhaustion_is_bounded(small: Sandbox) -> None:
    code = r"""
import json, os
fds, error = [], None
try:
    while len(fds) < 1_000_000:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as exc:
    error = exc.errno
print(json.dumps({"opened": len(fds), "errno": error}))
"""
    found = run_json(small, code)
    assert found["errno"] == errno.EMFILE
    assert found["opened"] < 4096  # RLIMIT_NOFILE
    assert alive(small)


ZOMBIES = r"""
import os
# Children that fork grandchildren and exit without waiting: the grandchildren
# are orphans that die at once, zombies until someone reaps them.
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        for _ in range(5):
            if os.fork() == 0:
                os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
# And children this process never waits for, before it exits itself.
for _ in range(20):
    if os.fork() == 0:
        os._exit(0)
print("made", flush=True)
"""

#: Waits (up to 10 s) until no process in the sandbox is a zombie.
NO_ZOMBIES = r"""
import json, os, time
deadline = time.monotonic() + 10
while True:
    zombies = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/stat" % pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        zombies.append(int(pid))
            except OSError:
                pass
    if not zombies or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print(json.dumps(zombies))
"""


def test_orphaned_zombies_are_reaped(small: Sandbox) -> None:
    assert small.exec(["python3", "-c", ZOMBIES]).stdout == "made\n"
    assert run_json(small, NO_ZOMBIES) == []
    assert alive(small)
