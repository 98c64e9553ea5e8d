"""Sandbox.stat and Sandbox.rename in real sandboxes: confined like the rest of the file API."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentnest import AsyncSandbox, FileAccessError, MemoryObserver, Sandbox


@pytest.fixture(scope="module")
def events() -> MemoryObserver:
    return MemoryObserver()


@pytest.fixture(scope="module")
def sb(backend_name: str, events: MemoryObserver) -> Iterator[Sandbox]:
    """One observed sandbox per runtime for this module."""
    with Sandbox(backend=backend_name, timeout=900, observers=[events]) as sandbox:
        yield sandbox


@pytest.fixture
def d(sb: Sandbox) -> Iterator[str]:
    """A fresh directory in the sandbox's workspace."""
    name = f"mv-{os.urandom(4).hex()}"
    sb.mkdir(name)
    yield name
    sb.remove_file(name, recursive=True)


def sh(sb: Sandbox, script: str) -> str:
    return sb.exec_shell(script, timeout=30).check().stdout


def code_of(call: object, *args: str) -> str:
    assert callable(call)
    with pytest.raises(FileAccessError) as info:
        call(*args)
    assert info.value.code is not None
    return info.value.code


# -- stat ----------------------------------------------------------------------------------


def test_stat_of_a_file_a_directory_a_link_and_a_fifo(sb: Sandbox, d: str) -> None:
    sb.write_file(f"{d}/f.txt", "12345", mode=0o640)
    sh(sb, f"ln -s /etc/passwd {d}/link && mkfifo {d}/fifo && touch -d @1700000000 {d}/f.txt")
    f = sb.stat(f"{d}/f.txt")
    assert (f.path, f.type, f.size, f.mode, f.mtime) == (f"{d}/f.txt", "file", 5, 0o640, 1700000000.0)
    assert sb.stat(f"/workspace/{d}/f.txt") == f
    dd = sb.stat(d)
    assert (dd.path, dd.type, dd.is_dir) == (d, "dir", True)
    link = sb.stat(f"{d}/link")
    # The link itself, not /etc/passwd: its size is the length of its target.
    assert (link.path, link.type, link.size) == (f"{d}/link", "symlink", len("/etc/passwd"))
    assert sb.stat(f"{d}/fifo").type == "other"
    root = sb.stat("/workspace")
    assert (root.path, root.type) == (".", "dir")
    # stat agrees with list_files on every entry.
    assert {e.path: e for e in sb.list_files(d)} == {
        p: sb.stat(p) for p in (f"{d}/f.txt", f"{d}/link", f"{d}/fifo")
    }


def test_stat_of_a_missing_path_and_through_links(sb: Sandbox, d: str) -> None:
    assert code_of(sb.stat, f"{d}/missing") == "not_found"
    assert not sb.exists(f"{d}/missing")
    sh(sb, f"ln -s /etc {d}/etc")
    assert code_of(sb.stat, f"{d}/etc/passwd") == "symlink"
    assert code_of(sb.stat, "../etc/passwd") == "outside_workspace"
    assert code_of(sb.stat, "/etc/passwd") == "outside_workspace"


# -- rename --------------------------------------------------------------------------------


def test_rename_a_file(sb: Sandbox, d: str, events: MemoryObserver) -> None:
    sb.write_file(f"{d}/a.txt", "A")
    sb.rename(f"{d}/a.txt", f"/workspace/{d}/b.txt")
    assert sb.read_file(f"{d}/b.txt") == "A"
    assert not sb.exists(f"{d}/a.txt")
    assert sh(sb, f"cat {d}/b.txt; find {d} -mindepth 1") == f"A{d}/b.txt\n"
    moved = [dict(e.data) for e in events.events if e.type.value == "file.moved" and d in e.data["path"]]
    assert moved == [{"path": f"{d}/a.txt", "to": f"{d}/b.txt"}]


def test_rename_into_a_new_nested_directory(sb: Sandbox, d: str) -> None:
    sb.write_file(f"{d}/a.txt", "A")
    sb.rename(f"{d}/a.txt", f"{d}/x/y/z/a.txt")
    assert sb.read_file(f"{d}/x/y/z/a.txt") == "A"
    assert sb.stat(f"{d}/x/y").type == "dir"
    # A directory moves with its contents.
    sb.rename(f"{d}/x", f"{d}/moved/x2")
    assert sb.read_file(f"{d}/moved/x2/y/z/a.txt") == "A"
    assert not sb.exists(f"{d}/x")


def test_rename_replaces_an_existing_file(sb: Sandbox, d: str) -> None:
    sb.write_file(f"{d}/new", "new")
    sb.write_file(f"{d}/old", "old")
    sh(sb, f"ln {d}/old {d}/other-name-of-old")  # the replaced inode lives on under its other name
    sb.rename(f"{d}/new", f"{d}/old")
    assert sb.read_file(f"{d}/old") == "new"
    assert sb.read_file(f"{d}/other-name-of-old") == "old"
    assert not sb.exists(f"{d}/new")


def test_rename_refusals_and_their_codes(sb: Sandbox, d: str) -> None:
    sb.write_file(f"{d}/f", "f")
    sb.write_file(f"{d}/full/inside", "i")
    sb.mkdir(f"{d}/dir")
    assert code_of(sb.rename, f"{d}/missing", f"{d}/new/x") == "not_found"
    assert not sb.exists(f"{d}/new")  # nothing created for a missing source
    assert code_of(sb.rename, f"{d}/dir", f"{d}/full") == "not_empty"
    assert code_of(sb.rename, f"{d}/f", f"{d}/dir") == "is_directory"
    assert code_of(sb.rename, f"{d}/dir", f"{d}/f") == "not_directory"
    assert code_of(sb.rename, f"{d}/dir", f"{d}/dir/sub/dir") == "invalid_path"
    assert sh(sb, f"cd {d} && find . | sort") == ".\n./dir\n./f\n./full\n./full/inside\n"


@pytest.mark.parametrize(
    ("source", "destination"),
    [
        ("/workspace", "elsewhere"),
        (".", "elsewhere"),
        ("{d}/f", "/workspace"),
        ("{d}/f", "{d}/.."),
        ("{d}/f", "../escaped"),
        ("{d}/f", "/tmp/escaped"),
        ("{d}/f", "/workspace/../tmp/escaped"),
        ("{d}/f", "{d}/../../escaped"),
        ("/etc/hostname", "{d}/stolen"),
        ("../etc/hostname", "{d}/stolen"),
    ],
)
def test_rename_never_leaves_the_workspace_nor_moves_its_root(
    sb: Sandbox, d: str, source: str, destination: str
) -> None:
    sb.write_file(f"{d}/f", "f")
    code = code_of(sb.rename, source.format(d=d), destination.format(d=d))
    assert code in ("outside_workspace", "invalid_path")
    assert sb.read_file(f"{d}/f") == "f"
    left = "find /tmp/escaped /escaped /workspace/escaped /workspace/elsewhere 2>/dev/null; true"
    assert sh(sb, f"find {d} -mindepth 1; {left}") == f"{d}/f\n"


def test_rename_through_symlinked_parents_is_refused(sb: Sandbox, d: str) -> None:
    scratch = f"/tmp/{d}-outside"
    sh(
        sb,
        f"mkdir {scratch} && echo outside > {scratch}/precious && "
        f"ln -s /etc {d}/etc && ln -s {scratch} {d}/tmp",
    )
    sb.write_file(f"{d}/f", "planted")
    attempts = [
        (f"{d}/f", f"{d}/etc/f"),  # into a link to /etc
        (f"{d}/f", f"{d}/tmp/f"),  # into a link to a directory the sandbox user may write
        (f"{d}/f", f"{d}/tmp/new/deeper/f"),  # and no parents created through it
        (f"{d}/etc/hostname", f"{d}/stolen"),  # out of a link
        (f"{d}/tmp/precious", f"{d}/stolen"),
    ]
    for source, destination in attempts:
        assert code_of(sb.rename, source, destination) == "symlink", (source, destination)
    assert sh(sb, f"find {scratch} -mindepth 1; cat {scratch}/precious") == f"{scratch}/precious\noutside\n"
    assert sh(sb, "test -e /etc/f || echo no; test -s /etc/hostname && echo kept") == "no\nkept\n"
    assert sorted(e.path for e in sb.list_files(d)) == [f"{d}/etc", f"{d}/f", f"{d}/tmp"]
    assert sb.read_file(f"{d}/f") == "planted"
    # A final link is moved as the link itself, never through it.
    sb.rename(f"{d}/tmp", f"{d}/tmp-link")
    assert sb.stat(f"{d}/tmp-link").type == "symlink"
    assert sh(sb, f"readlink {d}/tmp-link; find {scratch} -mindepth 1") == f"{scratch}\n{scratch}/precious\n"


def test_a_refused_rename_emits_no_event(sb: Sandbox, d: str, events: MemoryObserver) -> None:
    code_of(sb.rename, f"{d}/missing", f"{d}/x")
    assert not [e for e in events.events if e.type.value == "file.moved" and d in e.data["path"]]


# -- the async face ------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_async_stat_and_rename(sb: Sandbox, d: str, events: MemoryObserver) -> None:
    asb = AsyncSandbox(sb)
    await asb.write_file(f"{d}/a.txt", "A")
    info = await asb.stat(f"{d}/a.txt")
    assert (info.path, info.type, info.size) == (f"{d}/a.txt", "file", 1)
    await asb.rename(f"{d}/a.txt", f"{d}/n/b.txt")
    assert await asb.read_file(f"{d}/n/b.txt") == "A"
    assert not await asb.exists(f"{d}/a.txt")
    with pytest.raises(FileAccessError) as info_missing:
        await asb.stat(f"{d}/a.txt")
    assert info_missing.value.code == "not_found"
    with pytest.raises(FileAccessError) as refused:
        await asb.rename(f"{d}/n/b.txt", "../b.txt")
    assert refused.value.code == "outside_workspace"
    moved = [dict(e.data) for e in events.events if e.type.value == "file.moved" and d in e.data["path"]]
    assert moved == [{"path": f"{d}/a.txt", "to": f"{d}/n/b.txt"}]
