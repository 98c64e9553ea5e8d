"""Which processes belong to a command's tree: agent/tree.py's ``members``, on made-up process tables."""

from __future__ import annotations

from agentnest.agent.tree import members

AGENT = 7
ROOT = 100


def proc(ppid: int, pgrp: int, sid: int, state: bytes = b"S") -> tuple[int, int, int, bytes]:
    return ppid, pgrp, sid, state


def test_the_root_its_descendants_and_its_session_and_group() -> None:
    procs = {
        ROOT: proc(AGENT, ROOT, ROOT),
        101: proc(ROOT, ROOT, ROOT),
        102: proc(101, 102, 102),  # left for a session of its own; its parent still lives
        103: proc(102, 103, 102),
        104: proc(AGENT, ROOT, ROOT),  # an orphan still in the root's session
        200: proc(AGENT, 200, 200),  # another command
        201: proc(200, 200, 200),
    }
    assert members(procs, ROOT, set()) == {ROOT, 101, 102, 103, 104}


def test_an_orphan_in_a_live_members_session_or_group_belongs() -> None:
    procs = {
        ROOT: proc(AGENT, ROOT, ROOT),
        101: proc(ROOT, 101, 101),
        102: proc(AGENT, 105, 101),  # its parent exited; the session is 101's
        103: proc(AGENT, 101, 110),  # listed by group only
        300: proc(AGENT, 300, 300),
    }
    assert members(procs, ROOT, set()) == {ROOT, 101, 102, 103}


def test_the_marker_catches_what_nothing_else_links() -> None:
    procs = {
        ROOT: proc(AGENT, ROOT, ROOT),
        150: proc(AGENT, 150, 150),
        151: proc(150, 151, 150),
        300: proc(AGENT, 300, 300),
    }
    assert members(procs, ROOT, {150}) == {ROOT, 150, 151}


def test_an_unlinked_orphan_is_not_attributed() -> None:
    # Parent and session leader gone, own group, no marker: nothing sound says whose it is.
    procs = {ROOT: proc(AGENT, ROOT, ROOT), 150: proc(AGENT, 150, 149)}
    assert members(procs, ROOT, set()) == {ROOT}


def test_a_reaped_roots_pid_is_not_trusted() -> None:
    # The root was reaped and its pid now names someone else's process.
    reused = {ROOT: proc(AGENT, 50, 50), 101: proc(ROOT, 50, 50)}
    assert members(reused, ROOT, set(), root_alive=False) == set()
    # Its session outlives it (then the kernel does not reuse the pid): still the command's.
    left = {102: proc(AGENT, ROOT, ROOT), 103: proc(102, 103, ROOT)}
    assert members(left, ROOT, set(), root_alive=False) == {102, 103}
