"""A command's process tree: which processes belong to it, and the kill that ends them all.

A command runs in its own session (``setsid``, see :func:`.exec.spawn`) with :data:`MARKER` in its
environment.  The agent is a child subreaper (:func:`set_subreaper`): orphans are reparented to it and
reaped.  A command with a timeout is made one too (:func:`become_subreaper`; where the kernel has them,
gVisor 20221219 does not): an orphan of its tree -- the double-forked daemon that called ``setsid``,
cleared its environment and left for a process group of its own -- goes to the command's top process
instead of the agent and stays below it while the top lives, which no descendant can undo.
:func:`kill_tree` (timeout, cancel) keeps that attribution while it works; :func:`members` says who
belongs.  What is not guaranteed (no subreapers, a top that clears the bit or makes a sibling, what
runs on after the top exits) is in :mod:`.exec` and docs/architecture.md.  Kept apart from spawning
and terminals so that a reviewer reads the whole promise in one file.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Dict, List, Optional, Set, Tuple

Stat = Tuple[int, int, int, bytes]  # (ppid, pgrp, session, state): see _proc_stat
MARKER = "AGENTNEST_EXEC"
#: Bounds on the scans of one tree kill (each scan reads /proc once).
FREEZE_ROUNDS = 30
KILL_ROUNDS = 50

# prctl(2) from libc, kept where the kernel has child subreapers: timed commands become one.
_PRCTL: Any = None
_PR_SET_CHILD_SUBREAPER = 36


def set_subreaper(libc: Any) -> bool:
    """Make the agent a child subreaper (orphaned descendants are reparented to it and reaped)."""
    global _PRCTL
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return False
    _PRCTL = libc.prctl
    return True


def become_subreaper() -> None:
    """In a child before ``exec``: adopt the orphans of its own tree (best effort)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _pids() -> List[str]:
    """The process ids in /proc (as strings), or none if it cannot be read."""
    try:
        return [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _proc_stat(pid: str) -> Optional[Stat]:
    """``(ppid, pgrp, session, state)`` of a live process; None for a zombie or a gone one."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        if fields[0] in (b"Z", b"X", b"x"):
            return None  # already dead; its parent reaps it
        return int(fields[1]), int(fields[2]), int(fields[3]), fields[0]
    except (IndexError, ValueError):
        return None


def _has_marker(pid: str, marker: bytes) -> bool:
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            return marker in f.read().split(b"\x00")
    except OSError:
        return False


def members(procs: Dict[int, Stat], root: int, marked: Set[int], root_alive: bool = True) -> Set[int]:
    """The processes of ``procs`` (pid: ppid, pgrp, session, state) that belong to ``root``'s command.

    A member is the root (while ``root_alive``: a reaped root's pid may be
    someone else's by now), a process in the root's process group or
    session, one in ``marked`` (it carries the command's marker), and --
    to a fixed point -- a child of a member, or a process whose process
    group or session id is a member's pid.  The last rule is sound: such an
    id is the pid of the process that created the group or session, and the
    kernel gives no other process a pid while it names a live group or
    session.
    """
    found: Set[int] = set()
    for pid, (_ppid, pgrp, sid, _state) in procs.items():
        if (root_alive and pid == root) or pgrp == root or sid == root or pid in marked:
            found.add(pid)
    changed = True
    while changed:
        changed = False
        for pid, (ppid, pgrp, sid, _state) in procs.items():
            if pid not in found and (ppid in found or pgrp in found or sid in found):
                found.add(pid)
                changed = True
    return found


def _scan(marker: str) -> Tuple[Dict[int, Stat], Set[int]]:
    """Every live process but the agent and PID 1, and those carrying ``marker``."""
    me = os.getpid()
    needle = ("%s=%s" % (MARKER, marker)).encode()
    procs: Dict[int, Stat] = {}
    marked: Set[int] = set()
    for p in _pids():
        pid = int(p)
        if pid in (me, 1):
            continue
        st = _proc_stat(p)
        if st is None:
            continue
        procs[pid] = st
        if _has_marker(p, needle):
            marked.add(pid)
    return procs, marked


def tree(root: int, marker: str, root_alive: bool = True) -> Set[int]:
    """Every live process that belongs to the command rooted at ``root`` (see :func:`members`)."""
    procs, marked = _scan(marker)
    return members(procs, root, marked, root_alive)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


def kill_tree(root: int, marker: str, root_alive: bool = True) -> int:
    """SIGKILL the command's whole tree, the root last; return how many processes were hit.

    ``root_alive``: whether ``root`` is still the command's own process (not
    yet reaped).  Order matters where the root is a child subreaper: while
    it lives, even stopped, it adopts the orphans its tree makes, so they
    stay its descendants until the scans have found them.  SIGKILL, not SIGTERM: it
    cannot be ignored and the command has had its time.
    """
    # 1. Freeze: a stopped process forks no more and keeps its children's
    #    parent link.  Done when a scan finds no new member and every member
    #    has stopped (bounded: a process in the kernel stops on its way out).
    if root_alive:
        # Only while the root is the command's own: a reaped root's pid (and
        # so its group id, once the group is empty) may be another's by now.
        try:
            os.killpg(root, signal.SIGSTOP)
        except OSError:
            pass
    stopped: Set[int] = set()
    for _ in range(FREEZE_ROUNDS):
        procs, marked = _scan(marker)
        found = members(procs, root, marked, root_alive)
        new = found - stopped
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped |= found
        if not new and all(procs[pid][3] in (b"T", b"t") for pid in found):
            break
    # 2. Kill everything below the root until a scan finds nothing, then the root.
    #    The first round also takes what the freeze stopped (a stopped
    #    process cannot exit, so its pid is still its own).
    hit = 0
    for _ in range(KILL_ROUNDS):
        procs, marked = _scan(marker)
        below = members(procs, root, marked, root_alive) | (stopped & set(procs))
        below.discard(root)
        stopped = set()
        if not below:
            break
        for pid in below:
            hit += _signal(pid, signal.SIGKILL)
    if root_alive:
        hit += _signal(root, signal.SIGKILL)
    # 3. Sweep: whatever the root's death let go of that the rules still see.
    for _ in range(KILL_ROUNDS):
        left = tree(root, marker, root_alive=False)
        if not left:
            break
        for pid in left:
            hit += _signal(pid, signal.SIGKILL)
    return hit
