"""What a sandbox's workspace really is, for ``demo`` and ``doctor`` to print.

Read, never assumed from the configuration: the mount at the workdir as the
sandbox's own kernel shows it (``/proc/self/mountinfo``: a ``tmpfs``, or a
directory of the host's disk: ``btrfs`` on runc, ``9p`` through gVisor's
gofer), its size as ``statfs`` reports it inside, and a disk workspace's quota
as the backend reads it on the host (inside, ``statfs`` shows the whole pool).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..verify import human_bytes

if TYPE_CHECKING:
    from ..sandbox import Sandbox

__all__ = ["PROBE", "Workspace", "read_workspace"]

#: Prints the workdir's top mount (file system type, options) and its statfs size as JSON.
PROBE = """\
import json, os, sys
target = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
fstype = options = None
try:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) > 4 and fields[4] == target and rest:
                fstype, options = rest[0], rest[2] if len(rest) > 2 else ""
except OSError:
    pass
vfs = os.statvfs(target)
print(json.dumps({"fstype": fstype, "options": options, "bytes": vfs.f_blocks * vfs.f_frsize}))
"""


@dataclass(frozen=True, slots=True)
class Workspace:
    """A sandbox's workspace as it was found.

    Attributes:
        path: the workdir.
        fstype: the file system type of its mount inside the sandbox (``None``: not seen).
        size: its size as ``statfs`` reports it inside (a disk workspace's whole pool).
        quota: a disk workspace's quota as the backend reads it on the host, or ``None``.
    """

    path: str
    fstype: str | None
    size: int | None
    quota: int | None

    @property
    def medium(self) -> str | None:
        """``memory`` (a tmpfs), ``disk`` (anything else), or ``None`` when the mount was not seen."""
        if self.fstype is None:
            return None
        return "memory" if self.fstype == "tmpfs" else "disk"

    def describe(self) -> str:
        """One phrase: ``/workspace is a tmpfs of 256.0 MiB ...`` or ``... on the host's disk ...``."""
        if self.medium is None:
            return f"{self.path}: its mount could not be read inside the sandbox"
        if self.medium == "memory":
            size = human_bytes(self.size) if self.size else "unknown size"
            return f"{self.path} is a tmpfs of {size}, in memory (counted against the memory limit)"
        if self.quota is not None:
            return (
                f"{self.path} is on the host's disk ({self.fstype}), held to {human_bytes(self.quota)} "
                "by a quota read on the host"
            )
        return f"{self.path} is on the host's disk ({self.fstype}); no quota was found on the host"


def read_workspace(sandbox: Sandbox) -> Workspace:
    """Look at ``sandbox``'s workspace from inside (its mount) and from the host (its quota)."""
    path = sandbox.config.workdir
    result = sandbox.exec(["python3", "-c", PROBE, path], timeout=30)
    report = _parse(result.stdout) if result.ok else {}
    fstype = report.get("fstype")
    size = report.get("bytes")
    return Workspace(
        path=path,
        fstype=fstype if isinstance(fstype, str) else None,
        size=size if isinstance(size, int) else None,
        quota=sandbox.backend.workspace_quota(sandbox.handle),
    )


def _parse(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
