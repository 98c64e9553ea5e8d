"""The few btrfs operations the storage pool runs on every sandbox, as ioctls.

``btrfs-progs`` runs the same ioctls; calling them from this process saves a
fork and an exec of the ``btrfs`` command per operation (5-10 ms each here,
and a fork makes two of them: the snapshot and its quota).  The layouts are
the kernel's stable UAPI (``include/uapi/linux/btrfs.h``); the structures are
packed by hand because they are a few fixed-size fields and a name.

Everything here needs root (``CAP_SYS_ADMIN``), as the pool itself does.
Errors come back as :class:`OSError` with the kernel's errno; the pool turns
them into AgentNest's errors with the fix.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

__all__ = ["create", "delete", "limit", "qgroup_usage", "snapshot", "subvolume_id"]

_MAGIC = 0x94
#: ``struct btrfs_ioctl_vol_args``: ``__s64 fd; char name[4088]``.
_VOL_ARGS = 4096
_VOL_NAME = 4088
#: ``struct btrfs_ioctl_vol_args_v2``: ``__s64 fd; __u64 transid; __u64 flags;
#: __u64 unused[4]; char name[4040]``.
_VOL_ARGS_V2 = 4096
_VOL_NAME_V2 = 4040
#: ``struct btrfs_ioctl_qgroup_limit_args``: ``__u64 qgroupid; struct
#: btrfs_qgroup_limit { __u64 flags, max_rfer, max_excl, rsv_rfer, rsv_excl; }``.
_QGROUP_LIMIT_ARGS = 48
#: ``struct btrfs_ioctl_ino_lookup_args``: ``__u64 treeid, objectid; char name[4080]``.
_INO_LOOKUP_ARGS = 4096
#: ``struct btrfs_ioctl_fs_info_args``: 1024 bytes, the fsid at offset 16.
_FS_INFO_ARGS = 1024

_SUBVOL_RDONLY = 1 << 1
_QGROUP_LIMIT_MAX_RFER = 1 << 0
#: The inode number of every subvolume's root directory.
_FIRST_FREE_OBJECTID = 256


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (_MAGIC << 8) | nr


_WRITE, _READ = 1, 2
_SUBVOL_CREATE = _ioc(_WRITE, 14, _VOL_ARGS)
_SNAP_DESTROY = _ioc(_WRITE, 15, _VOL_ARGS)
_INO_LOOKUP = _ioc(_READ | _WRITE, 18, _INO_LOOKUP_ARGS)
_SNAP_CREATE_V2 = _ioc(_WRITE, 23, _VOL_ARGS_V2)
_FS_INFO = _ioc(_READ, 31, _FS_INFO_ARGS)
# _IOR, not _IOW: a historical slip in the kernel header that is now ABI.
_QGROUP_LIMIT = _ioc(_READ, 43, _QGROUP_LIMIT_ARGS)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _name(path: Path, room: int) -> bytes:
    raw = os.fsencode(path.name)
    if not raw or b"/" in raw or raw in (b".", b"..") or len(raw) >= room:
        raise OSError(errno.EINVAL, "not a valid subvolume name", str(path))
    return raw


def _in_parent(path: Path, request: int, build: bytes) -> None:
    parent = os.open(path.parent, _DIR_FLAGS)
    try:
        fcntl.ioctl(parent, request, bytearray(build))
    finally:
        os.close(parent)


def create(path: Path) -> None:
    """A new empty subvolume at ``path`` (its parent must exist)."""
    name = _name(path, _VOL_NAME)
    _in_parent(path, _SUBVOL_CREATE, struct.pack("=q", 0) + name.ljust(_VOL_NAME, b"\0"))


def snapshot(source: Path, path: Path, *, read_only: bool = False) -> None:
    """A copy-on-write snapshot of subvolume ``source`` at ``path``.

    btrfs first writes back the source's dirty data (a snapshot holds what
    is on disk), so its cost is the data written since the last commit.
    """
    name = _name(path, _VOL_NAME_V2)
    src = os.open(source, _DIR_FLAGS)
    try:
        flags = _SUBVOL_RDONLY if read_only else 0
        args = struct.pack("=qQQ32x", src, 0, flags) + name.ljust(_VOL_NAME_V2, b"\0")
        _in_parent(path, _SNAP_CREATE_V2, args)
    finally:
        os.close(src)


def delete(path: Path) -> None:
    """Delete subvolume ``path``; btrfs frees its blocks in the background."""
    name = _name(path, _VOL_NAME)
    _in_parent(path, _SNAP_DESTROY, struct.pack("=q", 0) + name.ljust(_VOL_NAME, b"\0"))


def limit(path: Path, max_referenced: int) -> None:
    """Set the quota of subvolume ``path``: at most ``max_referenced`` bytes (EDQUOT beyond)."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        # qgroupid 0: the qgroup of the subvolume ``fd`` is in.
        args = struct.pack("=QQQQQQ", 0, _QGROUP_LIMIT_MAX_RFER, max_referenced, 0, 0, 0)
        fcntl.ioctl(fd, _QGROUP_LIMIT, bytearray(args))
    finally:
        os.close(fd)


def subvolume_id(path: Path) -> int:
    """The id of the subvolume ``path`` is in (its qgroup is ``0/<id>``)."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        buf = bytearray(struct.pack("=QQ", 0, _FIRST_FREE_OBJECTID).ljust(_INO_LOOKUP_ARGS, b"\0"))
        fcntl.ioctl(fd, _INO_LOOKUP, buf)
    finally:
        os.close(fd)
    return int(struct.unpack_from("=Q", buf, 0)[0])


def _fsid(path: Path) -> str:
    fd = os.open(path, _DIR_FLAGS)
    try:
        buf = bytearray(_FS_INFO_ARGS)
        fcntl.ioctl(fd, _FS_INFO, buf)
    finally:
        os.close(fd)
    raw = bytes(buf[16:32]).hex()
    return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"


def qgroup_usage(path: Path) -> tuple[int, int | None]:
    """``(referenced bytes, limit or None)`` of the subvolume at ``path``, from sysfs.

    The kernel updates the counts at each transaction commit (every 30 s at
    most, and at every snapshot): data written since is not in them yet.

    Raises:
        OSError: no such subvolume, or a kernel without qgroups in sysfs (< 5.9).
    """
    base = Path("/sys/fs/btrfs") / _fsid(path) / "qgroups" / f"0_{subvolume_id(path)}"
    referenced = int((base / "referenced").read_text().strip())
    raw = (base / "max_referenced").read_text().strip()
    cap = int(raw) if raw.isdigit() else None
    return referenced, cap if cap else None
