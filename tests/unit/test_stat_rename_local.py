"""Sandbox.stat and Sandbox.rename: the agent's ``move`` and the host's face, without an engine.

``Workspace.move`` is called directly on a temporary directory (the agent's pure
file logic); the host side runs over :class:`~doubles.local_agent.LocalBackend`,
the real agent as an unsandboxed child.  tests/integration/test_files_stat_rename.py
runs the same operations in real sandboxes on runc and runsc.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from doubles.local_agent import LocalBackend

from agentnest import (
    FileAccessError,
    MemoryObserver,
    PolicyDeniedError,
    Sandbox,
    UnsupportedCapabilityError,
)
from agentnest._core import core_of
from agentnest.agent import loop
from agentnest.agent.files import FileError, Workspace
from agentnest.approvals import ApprovalRule, RuleApprover
from agentnest.errors import ChannelError

# -- Workspace.move: the agent's logic ---------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "precious").write_bytes(b"keep me")
    return out


def move(ws: Path, src: str, dst: str) -> None:
    Workspace(str(ws)).move(src, dst)


def refused(ws: Path, src: str, dst: str) -> str:
    with pytest.raises(FileError) as info:
        move(ws, src, dst)
    return info.value.code


def test_move_a_file(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"A")
    move(ws, "a.txt", "b.txt")
    assert not (ws / "a.txt").exists()
    assert (ws / "b.txt").read_bytes() == b"A"


def test_move_creates_the_destination_parents(ws: Path) -> None:
    (ws / "a.txt").write_bytes(b"A")
    move(ws, "a.txt", "x/y/z/a.txt")
    assert (ws / "x" / "y" / "z" / "a.txt").read_bytes() == b"A"
    assert not (ws / "a.txt").exists()


def test_move_a_directory_with_its_contents(ws: Path) -> None:
    (ws / "d" / "sub").mkdir(parents=True)
    (ws / "d" / "sub" / "f").write_bytes(b"F")
    move(ws, "d", "e/d2")
    assert (ws / "e" / "d2" / "sub" / "f").read_bytes() == b"F"
    assert not (ws / "d").exists()


def test_move_replaces_an_existing_file(ws: Path) -> None:
    (ws / "new").write_bytes(b"new")
    (ws / "old").write_bytes(b"old")
    move(ws, "new", "old")
    assert (ws / "old").read_bytes() == b"new"
    assert sorted(os.listdir(ws)) == ["old"]


def test_move_replaces_an_empty_directory_but_not_a_full_one(ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "f").write_bytes(b"")
    (ws / "empty").mkdir()
    move(ws, "src", "empty")
    assert (ws / "empty" / "f").exists()
    (ws / "src2").mkdir()
    assert refused(ws, "src2", "empty") == "not_empty"
    assert (ws / "src2").is_dir() and (ws / "empty" / "f").exists()


def test_move_between_a_file_and_a_directory_is_refused(ws: Path) -> None:
    (ws / "f").write_bytes(b"")
    (ws / "d").mkdir()
    assert refused(ws, "f", "d") == "is_directory"
    assert refused(ws, "d", "f") == "not_directory"
    assert (ws / "f").is_file() and (ws / "d").is_dir()


def test_a_missing_source_is_not_found_and_creates_nothing(ws: Path) -> None:
    assert refused(ws, "missing", "new/dir/x") == "not_found"
    assert refused(ws, "no/such/dir", "y") == "not_found"
    assert os.listdir(ws) == []


@pytest.mark.parametrize(("src", "dst"), [("", "x"), (".", "x"), ("f", ""), ("f", ".")])
def test_the_workspace_root_is_neither_source_nor_destination(ws: Path, src: str, dst: str) -> None:
    (ws / "f").write_bytes(b"")
    assert refused(ws, src, dst) == "invalid_path"
    assert os.listdir(ws) == ["f"]


def test_a_directory_cannot_move_into_itself(ws: Path) -> None:
    (ws / "d").mkdir()
    with pytest.raises(FileError) as info:
        move(ws, "d", "d/sub/d")
    assert info.value.code == "invalid_path" and "into itself" in info.value.message
    assert os.listdir(ws / "d") == []  # no parent was created first


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../b", "a//b", "./a", "a\x00b"])
def test_paths_that_are_not_normalised_are_refused(ws: Path, outside: Path, bad: str) -> None:
    (ws / "f").write_bytes(b"")
    assert refused(ws, "f", bad) in ("outside_workspace", "invalid_path")
    assert refused(ws, bad, "g") in ("outside_workspace", "invalid_path")
    assert os.listdir(ws) == ["f"]
    assert os.listdir(outside) == ["precious"]


def test_a_symlinked_destination_parent_is_refused(ws: Path, outside: Path) -> None:
    (ws / "f").write_bytes(b"planted")
    os.symlink(outside, ws / "link")
    assert refused(ws, "f", "link/f") == "symlink"
    assert refused(ws, "f", "link/deeper/f") == "symlink"
    assert os.listdir(outside) == ["precious"]
    assert (ws / "f").read_bytes() == b"planted"


def test_a_symlinked_source_parent_is_refused(ws: Path, outside: Path) -> None:
    os.symlink(outside, ws / "link")
    assert refused(ws, "link/precious", "stolen") == "symlink"
    assert (outside / "precious").read_bytes() == b"keep me"
    assert not (ws / "stolen").exists()


def test_a_final_symlink_is_moved_and_replaced_as_a_link(ws: Path, outside: Path) -> None:
    os.symlink(outside / "precious", ws / "link")
    move(ws, "link", "moved")
    assert os.readlink(ws / "moved") == str(outside / "precious")
    (ws / "f").write_bytes(b"mine")
    move(ws, "f", "moved")  # replaces the link, never writes through it
    assert not (ws / "moved").is_symlink() and (ws / "moved").read_bytes() == b"mine"
    assert (outside / "precious").read_bytes() == b"keep me"


def test_moving_onto_itself_changes_nothing(ws: Path) -> None:
    (ws / "f").write_bytes(b"x")
    move(ws, "f", "f")
    assert (ws / "f").read_bytes() == b"x"


def test_the_agent_announces_move() -> None:
    assert "move" in loop.CAPABILITIES
    assert len(loop.CAPABILITIES) <= 64  # the host's bound on a hello's list


# -- Sandbox.stat and Sandbox.rename over the real agent ----------------------------------


@pytest.fixture
def observer() -> MemoryObserver:
    return MemoryObserver()


@pytest.fixture
def sandbox(tmp_path: Path, observer: MemoryObserver) -> Iterator[Sandbox]:
    with Sandbox("local", timeout=120, backend=LocalBackend(tmp_path), observers=[observer]) as sb:
        yield sb


def root_of(sb: Sandbox) -> Path:
    return Path(sb.handle.info["workspace"])


def test_stat_a_file_a_directory_a_link_and_the_root(sandbox: Sandbox) -> None:
    sandbox.write_file("d/f.txt", "hello", mode=0o640)
    os.symlink("/etc/passwd", root_of(sandbox) / "link")
    f = sandbox.stat("d/f.txt")
    assert (f.path, f.type, f.size, f.mode) == ("d/f.txt", "file", 5, 0o640)
    assert abs(f.mtime - (root_of(sandbox) / "d" / "f.txt").stat().st_mtime) < 1
    assert sandbox.stat("/workspace/d/f.txt") == f
    d = sandbox.stat("d")
    assert (d.path, d.type, d.is_dir) == ("d", "dir", True)
    link = sandbox.stat("link")
    assert (link.path, link.type) == ("link", "symlink")  # not followed
    assert sandbox.stat("/workspace").path == "."
    assert sandbox.stat(".").type == "dir"


def test_stat_of_a_missing_path_is_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(FileAccessError) as info:
        sandbox.stat("missing")
    assert info.value.code == "not_found"
    assert not sandbox.exists("missing")
    with pytest.raises(FileAccessError) as info:
        sandbox.stat("../etc/passwd")
    assert info.value.code == "outside_workspace"


def test_stat_redacts_a_secret_file_name(sandbox: Sandbox) -> None:
    sandbox.add_secret("hunter2-very-secret")
    (root_of(sandbox) / "hunter2-very-secret.txt").write_bytes(b"")
    info = sandbox.stat("hunter2-very-secret.txt")
    assert "hunter2-very-secret" not in info.path


def test_rename_moves_and_emits_file_moved(sandbox: Sandbox, observer: MemoryObserver) -> None:
    sandbox.write_file("a.txt", "A")
    sandbox.rename("a.txt", "/workspace/out/deep/b.txt")
    assert sandbox.read_file("out/deep/b.txt") == "A"
    assert not sandbox.exists("a.txt")
    moved = [e for e in observer.events if e.type.value == "file.moved"]
    assert [dict(e.data) for e in moved] == [{"path": "a.txt", "to": "out/deep/b.txt"}]


def test_rename_errors_carry_their_codes(sandbox: Sandbox, observer: MemoryObserver) -> None:
    sandbox.write_file("d/f", "x")
    sandbox.write_file("g", "y")
    cases = {
        ("missing", "x"): "not_found",
        ("g", "d"): "is_directory",
        ("d", "g"): "not_directory",
        (".", "x"): "invalid_path",
        ("g", "/workspace"): "invalid_path",
        ("g", "../g"): "outside_workspace",
        ("/etc/passwd", "p"): "outside_workspace",
        ("d", "d/e/d"): "invalid_path",
    }
    for (src, dst), code in cases.items():
        with pytest.raises(FileAccessError) as info:
            sandbox.rename(src, dst)
        assert info.value.code == code, (src, dst, info.value)
    sandbox.write_file("e/inside", "z")
    with pytest.raises(FileAccessError) as info:
        sandbox.rename("d", "e")
    assert info.value.code == "not_empty" and "not empty" in str(info.value)
    assert not [e for e in observer.events if e.type.value == "file.moved"]
    assert sandbox.read_file("d/f") == "x" and sandbox.read_file("g") == "y"


def test_rename_asks_about_both_paths(tmp_path: Path) -> None:
    rules = RuleApprover(
        [ApprovalRule("file.write", "/workspace/protected/*", "deny")],
        default="allow",
    )
    obs = MemoryObserver()
    with Sandbox(
        "local", timeout=120, backend=LocalBackend(tmp_path), observers=[obs], approval_hook=rules
    ) as sb:
        sb.write_file("f", "x")
        with pytest.raises(PolicyDeniedError) as info:
            sb.rename("f", "protected/f")
        assert info.value.request.kind == "file.write"
        assert dict(info.value.request.details) == {"path": "/workspace/protected/f", "from": "/workspace/f"}
        assert sb.exists("f") and not sb.exists("protected")
        sb.rename("f", "g")
        asked = [dict(e.data) for e in obs.events if e.type.value == "approval.requested"]
        assert {"kind": "file.remove", "path": "/workspace/f", "to": "/workspace/g"} in asked
        assert {"kind": "file.write", "path": "/workspace/g", "from": "/workspace/f"} in asked


def test_rename_on_an_agent_without_move_says_it_is_too_old(sandbox: Sandbox) -> None:
    sandbox.write_file("a", "A")
    channel = core_of(sandbox).link()
    assert channel.hello is not None
    # What a host sees of an agent from before "move" (a restored older checkpoint).
    channel.hello = dataclasses.replace(channel.hello, capabilities=channel.hello.capabilities - {"move"})
    with pytest.raises(UnsupportedCapabilityError, match="too old for rename; recreate the sandbox"):
        sandbox.rename("a", "b")
    assert sandbox.exists("a") and not sandbox.exists("b")
    assert channel.alive  # refused before anything was sent


def test_an_unknown_request_leaves_the_agent_serving(sandbox: Sandbox) -> None:
    # What an older agent does with "move": an error frame, and it lives on.
    with pytest.raises(ChannelError, match="unknown"):
        core_of(sandbox).link().request({"t": "no-such-request"}, None)
    assert sandbox.exec_shell("echo alive").stdout == "alive\n"
