"""The storage pool: disk-backed, bounded, copy-on-write workspaces.

A sandbox's ``/workspace`` is, by default, a btrfs subvolume of one pool
filesystem on this host, bind-mounted into the container:

* **bounded by the kernel**: each subvolume has a qgroup limit (its
  ``disk`` size); a write beyond it fails inside the sandbox with EDQUOT,
  and the pool itself lives on a sparse loop file whose size was fixed at
  ``agentnest setup``, so all sandboxes together cannot fill the host disk
  beyond it;
* **costs what is written**: a new subvolume takes no data blocks, sparse
  files stay sparse, and deleting a subvolume gives its blocks back to the
  host (the pool is mounted with ``discard``, so the loop file shrinks);
* **never handed out full**: a workspace is made only while the pool, and
  the host disk under its sparse backing file, have more free space than a
  reserve (:meth:`StoragePool.check_room`).  A host disk that fills anyway
  (by other programs) is the one dangerous case: the loop file cannot grow,
  btrfs sees write errors and the kernel forces the whole pool read-only;
  what was committed before stays intact, and :meth:`StoragePool.status`
  says what to do (free host disk, unmount, ``agentnest setup``);
* **copy-on-write**: a fork or a snapshot is a subvolume snapshot
  (milliseconds, independent of the workspace's size) that shares every
  block until one side writes;
* **not memory**: unlike the tmpfs workspace (``workspace="memory"``), none
  of it counts against the sandbox's memory limit.

Layout under the pool's mount point (``/var/lib/agentnest/storage`` unless
``$AGENTNEST_STORAGE`` says otherwise)::

    ws/<sandbox id>          the live workspace of a sandbox
    snap/<pid>-<token>       a read-only snapshot a host process is reading
    slot/<sandbox id>        the mount point a warm spare container binds as its
                             workspace; a fork mounts its child's workspace on it

The pool is made by :func:`setup` (``agentnest setup``, ``make engine``), as
root: a loop mount and qgroups need ``CAP_SYS_ADMIN``.  Everything here runs
``btrfs`` from btrfs-progs; nothing here runs for a remote engine (the pool
must be on the engine's host: see :func:`local_engine`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import DEFAULT_DISK  # room for a repository, its virtualenv and a build
from ..errors import BackendError, ConfigurationError, RuntimeNotAvailableError
from . import btrfs, mounts

__all__ = [
    "DEFAULT_DISK",
    "DEFAULT_IMAGE",
    "DEFAULT_ROOT",
    "PoolStatus",
    "StoragePool",
    "find_pool",
    "local_engine",
    "setup",
]

MiB = 1024 * 1024
GiB = 1024 * MiB
#: Where the pool is mounted, and its backing file.
DEFAULT_ROOT = "/var/lib/agentnest/storage"
DEFAULT_IMAGE = "/var/lib/agentnest/storage.img"
#: Largest pool ``setup`` makes by default, and the share of the host's free
#: disk it may take: the loop file is sparse, but the pool must never be able
#: to grow past what the host can give.
_DEFAULT_POOL_CAP = 256 * GiB
_DEFAULT_POOL_SHARE = 0.5
#: A workspace with no container older than this is an orphan for ``prune``
#: (younger ones may belong to a sandbox being created right now).
ORPHAN_AGE = 120.0
#: Free space kept back: the pool's own (btrfs needs room for metadata to
#: delete anything) and the host's under the backing file (below it, the loop
#: file may fail to grow and btrfs goes read-only).  Each at most this, and
#: at most 1/20 of the filesystem it is measured on (small test pools).
POOL_RESERVE = 64 * MiB
HOST_RESERVE = 1 * GiB
#: ``errno`` values of a full filesystem or quota.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_NAME = re.compile(r"[0-9a-zA-Z][0-9a-zA-Z_.-]{0,63}")
_BTRFS_MAGIC = 0x9123683E
_TIMEOUT = 60.0


def _btrfs() -> str:
    path = shutil.which("btrfs") or next(
        (p for p in ("/usr/sbin/btrfs", "/sbin/btrfs", "/usr/bin/btrfs") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise RuntimeNotAvailableError(
            "disk workspaces need btrfs-progs (the `btrfs` command); install it "
            "(`apt-get install btrfs-progs`) and run `agentnest setup`"
        )
    return path


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"{what}: {exc}") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise BackendError(f"{what}: {' / '.join(detail[-3:])[:500] or f'exit {done.returncode}'}")
    return done.stdout


def _mount_of(path: str) -> tuple[str, str] | None:
    """``(filesystem type, source)`` of what is mounted at ``path`` (per /proc/self/mountinfo), or None."""
    found: tuple[str, str] | None = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-") if "-" in fields else -1
                if sep > 4 and len(fields) > sep + 2 and fields[4] == path:
                    found = (fields[sep + 1], fields[sep + 2])  # the last one is on top
    except OSError:
        return None
    return found


def _is_btrfs(path: str) -> bool:
    """True when ``path`` is the root of a mounted btrfs filesystem (or subvolume)."""
    mount = _mount_of(path)
    return mount is not None and mount[0] == "btrfs"


def local_engine(docker_host: str | None) -> bool:
    """Whether the Docker engine at ``docker_host`` runs on this host.

    Only a unix socket counts: a TCP or SSH engine is elsewhere, and its
    containers cannot bind-mount this host's pool (they keep the channel
    path).  A unix socket forwarded from another machine would be mistaken
    for a local one; docs/state.md says so.
    """
    host = docker_host if docker_host is not None else os.environ.get("DOCKER_HOST", "")
    return host == "" or host.startswith("unix://")


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """What ``doctor`` and ``agentnest setup`` report about the pool.

    ``host_free`` is the free space of the host filesystem under the pool's
    backing file (``None``: not a loop file); ``detail`` is ``"ready"`` or,
    for a ready pool that is short of room, the warning and its fix.
    """

    root: str
    ready: bool
    detail: str
    size: int = 0
    free: int = 0
    workspaces: int = 0
    host_free: int | None = None


def _reserve(fs_size: int, cap: int) -> int:
    return min(cap, max(fs_size // 20, 4 * MiB))


class StoragePool:
    """A mounted btrfs filesystem with quotas, holding one subvolume per workspace.  Thread-safe."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.fspath(root))
        self._lock = threading.Lock()

    # -- names ---------------------------------------------------------------

    def path(self, name: str) -> Path:
        """The host path of workspace ``name``."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigurationError(f"workspace name {name!r:.80} is invalid")
        return self.root / "ws" / name

    def names(self) -> list[str]:
        """The workspaces in the pool (live or orphaned)."""
        try:
            return sorted(n for n in os.listdir(self.root / "ws") if _NAME.fullmatch(n))
        except FileNotFoundError:
            return []

    # -- space ---------------------------------------------------------------

    def capacity(self) -> tuple[int, int]:
        """``(size, free)`` of the pool in bytes."""
        st = os.statvfs(self.root)
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def host_capacity(self, image: Path | None = None) -> tuple[int, int] | None:
        """``(size, free)`` of the host filesystem holding the pool's backing file, or None.

        ``image``: that file, when the caller has already looked it up.
        """
        image = self.backing_file() if image is None else image
        if image is None:
            return None
        try:
            st = os.statvfs(image.parent)
        except OSError:
            return None
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def shortage(self) -> tuple[str, str] | None:
        """``(reason, message)``: why no workspace should be made now, or None.

        ``reason`` is ``no_space`` (the pool, or the host disk under its
        backing file, has less free space than a reserve) or ``read_only``
        (the kernel stopped the pool after a write error).
        """
        if _read_only(self.root):
            return "read_only", self._read_only_message()
        total, free = self.capacity()
        if free < _reserve(total, POOL_RESERVE):
            return "no_space", (
                f"the storage pool at {self.root} is full ({human_size(free)} of {human_size(total)} free); "
                "destroy sandboxes, run `agentnest prune`, or make a bigger pool"
            )
        image = self.backing_file()
        host = self.host_capacity(image) if image is not None else None
        if host is not None and image is not None and host[1] < _reserve(host[0], HOST_RESERVE):
            return "no_space", (
                f"the host disk under the storage pool is nearly full ({human_size(host[1])} free in "
                f"{image.parent}, which holds the pool's sparse file {image.name}; a full one would force "
                "the pool read-only); free disk on the host, destroy sandboxes or run `agentnest prune`"
            )
        return None

    def check_room(self) -> None:
        """Refuse a new workspace while the pool, or the host disk under it, is (nearly) full.

        Raises:
            BackendError: ``reason`` ``"no_space"`` or ``"read_only"``; the
                message says which is full and the fix.
        """
        why = self.shortage()
        if why is not None:
            raise _refused(*why)

    def _read_only_message(self) -> str:
        host = self.host_capacity()
        cause = ""
        if host is not None and host[1] < _reserve(host[0], HOST_RESERVE):
            cause = f" (the host disk under it has {human_size(host[1])} free: it filled up)"
        return (
            f"the storage pool at {self.root} is read-only: the kernel stopped it after a write "
            f"error{cause}; what was written before is kept. Free disk on the host, then mount it again "
            f"(`umount {self.root} && agentnest setup`, as root)"
        )

    def check_size(self, size: int) -> None:
        """Refuse a workspace that the pool could never hold."""
        total, _ = self.capacity()
        if size > total:
            raise ConfigurationError(
                f"disk={human_size(size)} is more than the whole storage pool holds ({human_size(total)} at "
                f"{self.root}); ask for less, or make a bigger pool (`agentnest setup --size SIZE`)"
            )

    # -- workspaces ----------------------------------------------------------

    def create(self, name: str, size: int, uid: int, gid: int) -> Path:
        """A new empty workspace of at most ``size`` bytes, owned by ``uid:gid``."""
        self.check_size(size)
        self.check_room()
        path = self.path(name)
        try:
            path.parent.mkdir(mode=0o711, exist_ok=True)
            btrfs.create(path)
        except OSError as exc:
            raise self._explain(exc) from None
        try:
            self._limit(path, size)
            os.chown(path, uid, gid)
            # As the tmpfs workspace: the sandbox's user owns it; others may read.
            os.chmod(path, 0o755)  # noqa: S103
        except BaseException:
            self.remove(name)
            raise
        return path

    def clone(self, source: str, name: str, size: int) -> Path:
        """A writable copy-on-write copy of workspace ``source`` (freeze its writers first)."""
        self.check_size(size)
        self.check_room()
        path = self.path(name)
        try:
            btrfs.snapshot(self.path(source), path)
        except OSError as exc:
            raise self._explain(exc) from None
        try:
            self._limit(path, size)
        except BaseException:
            self.remove(name)
            raise
        return path

    @contextlib.contextmanager
    def frozen_copy(self, source: str) -> Iterator[Path]:
        """A read-only snapshot of ``source``, deleted on exit (freeze its writers first).

        Read-only: the host reads a tree that no one, root included, can
        change under it while it reads.
        """
        snaps = self.root / "snap"
        snaps.mkdir(mode=0o711, exist_ok=True)
        path = snaps / f"{os.getpid()}-{os.urandom(6).hex()}"
        try:
            btrfs.snapshot(self.path(source), path, read_only=True)
        except OSError as exc:
            raise self._explain(exc) from None
        try:
            yield path
        finally:
            _delete(path)

    def remove(self, name: str) -> None:
        """Delete workspace ``name`` if it exists; its blocks go back to the host."""
        _delete(self.path(name))

    # -- slots: workspaces that appear in a running container ------------------

    def slot(self, name: str) -> Path:
        """The host path of slot ``name``."""
        return self.root / "slot" / self.path(name).name  # path() checks the name

    def make_slot(self, name: str) -> Path:
        """An empty mount point for a container that gets its workspace later (a fork's warm spare).

        The slot is a root-owned, read-only directory bound onto itself and
        made a *shared* mount: a container that binds it with ``rslave``
        propagation sees what :meth:`fill_slot` later mounts on it (the
        kernel propagates the new mount into the container's namespace), and
        nothing the container does propagates back.
        """
        path = self.slot(name)
        try:
            path.parent.mkdir(mode=0o711, exist_ok=True)
            path.mkdir(mode=0o555)
            mounts.bind(path, path)
            mounts.make_shared(path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.remove_slot(name)
            raise self._explain(exc) from None
        return path

    def fill_slot(self, name: str, workspace: str) -> None:
        """Mount workspace ``workspace`` on slot ``name``: its container now sees it as its workspace."""
        try:
            mounts.bind(self.path(workspace), self.slot(name))
        except OSError as exc:
            raise BackendError(f"mounting workspace {workspace} on its slot: {exc.strerror}") from None

    def remove_slot(self, name: str) -> None:
        """Unmount everything on slot ``name`` and remove it (idempotent)."""
        path = self.slot(name)
        try:
            mounts.unmount_all(path)
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise BackendError(f"removing the slot {name}: {exc.strerror}") from None

    def used(self, name: str) -> int:
        """Bytes workspace ``name`` references (its qgroup's count)."""
        return self._qgroup(name)[0]

    def limit(self, name: str) -> int | None:
        """The quota the kernel enforces on workspace ``name`` (max referenced bytes), if any."""
        return self._qgroup(name)[1]

    def _qgroup(self, name: str) -> tuple[int, int | None]:
        with contextlib.suppress(OSError, ValueError):
            return btrfs.qgroup_usage(self.path(name))
        # A kernel without qgroups in sysfs (before 5.9): ask btrfs-progs.
        out = _run([_btrfs(), "qgroup", "show", "-rf", "--raw", str(self.path(name))], "reading usage")
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0].startswith("0/") and len(parts) >= 4 and parts[1].isdigit():
                return int(parts[1]), int(parts[3]) if parts[3].isdigit() else None
        return 0, None

    def _explain(self, exc: BaseException) -> BackendError:
        """A failure to make a workspace, with the pool's state and the fix."""
        if not _is_btrfs(str(self.root)):
            _found.pop(str(self.root), None)
            return RuntimeNotAvailableError(
                f"the storage pool at {self.root} is not mounted (any more); mount it again with "
                "`agentnest setup` (as root), or use workspace='memory'"
            )
        with contextlib.suppress(OSError):
            why = self.shortage()
            if why is not None:
                return _refused(*why)
            if isinstance(exc, OSError) and exc.errno in _FULL:
                return _refused(
                    "no_space",
                    f"the storage pool at {self.root} is full ({exc.strerror}); "
                    "destroy sandboxes, run `agentnest prune`, or make a bigger pool",
                )
        detail = f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror else str(exc)
        return BackendError(
            f"making a workspace failed: {detail}; `agentnest doctor` checks the storage pool"
        )

    def _limit(self, path: Path, size: int) -> None:
        # The qgroup limit is what the kernel enforces (EDQUOT inside the
        # sandbox): referenced bytes, so a fork's shared blocks count too and
        # "holds up to disk=" means what the sandbox sees.
        try:
            btrfs.limit(path, size)
        except OSError as exc:
            raise BackendError(f"limiting the workspace {path.name}: {exc.strerror}") from None

    # -- housekeeping --------------------------------------------------------

    def orphans(self, live: set[str], *, now: float | None = None) -> list[str]:
        """Slots, workspaces and reader snapshots no live sandbox or process owns.

        ``live``: the sandbox ids the caller's engine still has a container
        for.  Whatever a process anywhere on the host has mounted is in use as
        well, whichever engine it runs on: the pool is the host's, and a
        second engine's sandboxes are not in ``live`` (see
        :func:`~agentnest.runtime.mounts.roots_in_use`).  Slots come first: a
        workspace mounted on a slot is deleted only once that mount is gone.
        """
        now = time.time() if now is None else now
        mounted = mounts.roots_in_use(os.path.realpath(self.root))
        found: list[str] = []
        with contextlib.suppress(FileNotFoundError):
            for name in sorted(os.listdir(self.root / "slot")):
                if _NAME.fullmatch(name) and name not in live and f"/slot/{name}" not in mounted:
                    with contextlib.suppress(OSError):
                        if now - os.lstat(self.root / "slot" / name).st_mtime >= ORPHAN_AGE:
                            found.append(f"slot/{name}")
        for name in self.names():
            if name in live or f"/ws/{name}" in mounted:
                continue
            with contextlib.suppress(OSError):
                if now - os.lstat(self.path(name)).st_mtime >= ORPHAN_AGE:
                    found.append(f"ws/{name}")
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(self.root / "snap"):
                pid = entry.split("-", 1)[0]
                # A reader's snapshot is in use while its process lives.
                if not (pid.isdigit() and os.path.exists(f"/proc/{pid}")):
                    found.append(f"snap/{entry}")
        return found

    def delete_entry(self, entry: str) -> None:
        """Delete one entry of :meth:`orphans` (``slot/NAME``, ``ws/NAME`` or ``snap/NAME``)."""
        kind, _, name = entry.partition("/")
        if kind not in ("ws", "snap", "slot") or not _NAME.fullmatch(name):
            raise ConfigurationError(f"{entry!r:.80} is not a storage pool entry")
        if kind == "slot":
            self.remove_slot(name)
        else:
            _delete(self.root / kind / name)

    def reclaim(self) -> None:
        """Wait until deleted subvolumes are gone and hand their blocks back to the host."""
        # A commit wakes btrfs's cleaner; without it the deleted subvolumes
        # wait for the next periodic commit (up to 30 s).
        _run([_btrfs(), "filesystem", "sync", str(self.root)], "committing the storage pool")
        _run([_btrfs(), "subvolume", "sync", str(self.root)], "waiting for deleted workspaces")
        fstrim = shutil.which("fstrim") or "/usr/sbin/fstrim"
        with contextlib.suppress(BackendError):
            _run([fstrim, str(self.root)], "returning freed blocks to the host")

    def backing_file(self) -> Path | None:
        """The loop file the pool lives on (what it costs the host's disk), if it is one."""
        mount = _mount_of(str(self.root))
        if mount is None or not mount[1].startswith("/dev/loop"):
            return None
        try:
            text = Path(f"/sys/block/{mount[1].rsplit('/', 1)[-1]}/loop/backing_file").read_text().strip()
        except OSError:
            return None
        return Path(text) if text else None

    def status(self) -> PoolStatus:
        total, free = self.capacity()
        host = self.host_capacity()
        return PoolStatus(
            str(self.root),
            True,
            why[1] if (why := self.shortage()) is not None else "ready",
            total,
            free,
            len(self.names()),
            host[1] if host is not None else None,
        )


def _read_only(root: Path) -> bool:
    try:
        return bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _refused(reason: str, message: str) -> BackendError:
    error = BackendError(message)
    error.reason = reason
    return error


def _delete(path: Path) -> None:
    if not os.path.lexists(path):
        return
    # One ioctl; btrfs frees the blocks in the background (see reclaim).
    try:
        btrfs.delete(path)
    except FileNotFoundError:
        pass  # deleted meanwhile (two destroys racing)
    except OSError as exc:
        raise BackendError(f"deleting the workspace {path.name}: {exc.strerror}") from None


def human_size(n: int) -> str:
    """``n`` bytes for people: ``"7.5g"``, ``"300m"``."""
    for unit, size in (("g", GiB), ("m", MiB)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0", "")
    return f"{n}b"


_found: dict[str, StoragePool | None] = {}
#: When a pool that was not there is looked for again (monotonic seconds), per root.
_missing: dict[str, float] = {}
_LOOK_AGAIN = 5.0


def pool_root() -> str:
    return os.environ.get("AGENTNEST_STORAGE") or DEFAULT_ROOT


def find_pool(root: str | None = None) -> StoragePool | None:
    """The pool at ``root`` (default :func:`pool_root`) if it is ready, else ``None``.

    Ready means: a mounted btrfs filesystem with quotas on, a ``btrfs``
    command, and root (qgroup limits need CAP_SYS_ADMIN).  Cached per root
    once found; a missing pool is looked for again at the next call.
    """
    root = root or pool_root()
    pool = _found.get(root)
    if pool is not None:
        return pool
    # Not found is asked again only after a while: every capabilities()
    # call looks for the pool, and a probe reads mountinfo (and may run btrfs).
    if time.monotonic() < _missing.get(root, 0.0):
        return None
    if probe(root).ready:
        pool = _found[root] = StoragePool(root)
        return pool
    _missing[root] = time.monotonic() + _LOOK_AGAIN
    return None


def probe(root: str | None = None) -> PoolStatus:
    """Whether the pool at ``root`` is usable, and if not, why (for ``doctor``)."""
    root = root or pool_root()
    if os.geteuid() != 0:
        return PoolStatus(root, False, "disk workspaces need root on the engine's host (qgroups, loop mount)")
    if shutil.which("btrfs") is None and not os.access("/usr/sbin/btrfs", os.X_OK):
        return PoolStatus(root, False, "btrfs-progs is not installed")
    if not _is_btrfs(root):
        return PoolStatus(root, False, f"no btrfs storage pool is mounted at {root}")
    try:
        out = _run([_btrfs(), "qgroup", "show", "--raw", root], "checking quotas")
    except BackendError as exc:
        return PoolStatus(root, False, f"quotas are not enabled on {root} ({str(exc)[-120:]})")
    del out
    return StoragePool(root).status()


def setup(
    root: str | None = None, image: str | None = None, size: int | None = None
) -> tuple[PoolStatus, list[str]]:
    """Make the pool (idempotent): a sparse file, btrfs on it, mounted with quotas on.

    Returns the pool's status and the steps taken.  Needs root.
    """
    root = root or pool_root()
    image = (
        image
        or os.environ.get("AGENTNEST_STORAGE_IMAGE")
        or (DEFAULT_IMAGE if root == DEFAULT_ROOT else root.rstrip("/") + ".img")
    )
    steps: list[str] = []
    if os.geteuid() != 0:
        raise RuntimeNotAvailableError(
            "making the storage pool needs root (a loop mount and btrfs quotas); run `sudo agentnest setup`"
        )
    btrfs = _btrfs()
    if not _is_btrfs(root):
        Path(root).mkdir(parents=True, exist_ok=True)
        if not os.path.exists(image):
            Path(image).parent.mkdir(parents=True, exist_ok=True)
            if size is None:
                free = shutil.disk_usage(Path(image).parent).free
                size = int(min(_DEFAULT_POOL_CAP, free * _DEFAULT_POOL_SHARE)) // GiB * GiB
            if size < GiB:
                raise ConfigurationError(
                    f"a storage pool of {human_size(size)} is too small; free disk or pass --size (1g+)"
                )
            fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, size)  # sparse: costs nothing until written
            finally:
                os.close(fd)
            mkfs = shutil.which("mkfs.btrfs") or "/usr/sbin/mkfs.btrfs"
            _run([mkfs, "-q", image], "formatting the storage pool")
            steps.append(f"made a {human_size(size)} sparse pool file {image}")
        # discard: deleted workspaces punch holes in the loop file (the host
        # gets its disk back); nosuid/nodev: nothing in a workspace is a
        # setuid program or a device node to the host, whatever the sandbox wrote.
        _run(
            ["mount", "-o", "loop,discard=async,nosuid,nodev,noatime", image, root],
            "mounting the storage pool",
        )
        steps.append(f"mounted it at {root}")
    with contextlib.suppress(BackendError):
        _run([btrfs, "qgroup", "show", root], "checking quotas")
        status = probe(root)
        if status.ready:
            _found.pop(root, None)
            _missing.pop(root, None)
            return status, steps
    _run([btrfs, "quota", "enable", root], "enabling quotas")
    steps.append("enabled quotas")
    for sub in ("ws", "snap", "slot"):
        (Path(root) / sub).mkdir(mode=0o711, exist_ok=True)
    _found.pop(root, None)
    _missing.pop(root, None)
    return probe(root), steps
