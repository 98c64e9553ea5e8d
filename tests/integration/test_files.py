"""The file API: confined to the workspace, never following links, bounded in size."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentnest import FileAccessError, Sandbox, SecurityPolicy

MiB = 1024 * 1024

DIR_SYMLINK_FOLLOWED_ON_RUNSC = (
    "BUG: under runsc (gVisor 20221219) open(O_DIRECTORY|O_NOFOLLOW) follows a symlink, so "
    "the agent's component-by-component walk goes through a directory link planted in the "
    "workspace and the file API reads, lists and writes outside it"
)


@pytest.fixture
def d(shared_sandbox: Sandbox) -> Iterator[str]:
    """A fresh directory in the shared sandbox's workspace."""
    name = f"files-{os.urandom(4).hex()}"
    shared_sandbox.mkdir(name)
    yield name
    shared_sandbox.remove_file(name, recursive=True)


def sh(sb: Sandbox, script: str) -> str:
    return sb.exec_shell(script, timeout=30).check().stdout


def test_text_and_bytes_round_trip(shared_sandbox: Sandbox, d: str) -> None:
    shared_sandbox.write_file(f"{d}/a/b/text.txt", "héllo ✓\n")
    assert shared_sandbox.read_file(f"{d}/a/b/text.txt") == "héllo ✓\n"
    assert shared_sandbox.read_file(f"/workspace/{d}/a/b/text.txt") == "héllo ✓\n"
    assert shared_sandbox.read_file(f"{d}/a/b/text.txt", encoding=None) == "héllo ✓\n".encode()
    # The sandbox sees what the API wrote.
    assert sh(shared_sandbox, f"cat {d}/a/b/text.txt") == "héllo ✓\n"
    shared_sandbox.write_file(f"{d}/empty", b"")
    assert shared_sandbox.read_file(f"{d}/empty", encoding=None) == b""


def test_large_binary_round_trip(shared_sandbox: Sandbox, d: str) -> None:
    data = os.urandom(10 * MiB)
    digest = hashlib.sha256(data).hexdigest()
    shared_sandbox.write_file(f"{d}/blob.bin", data)
    inside = f"import hashlib; print(hashlib.sha256(open('{d}/blob.bin', 'rb').read()).hexdigest())"
    assert shared_sandbox.exec_python(inside).stdout.strip() == digest
    back = shared_sandbox.read_file(f"{d}/blob.bin", encoding=None)
    assert isinstance(back, bytes)
    assert hashlib.sha256(back).hexdigest() == digest


def test_write_file_mode(shared_sandbox: Sandbox, d: str) -> None:
    shared_sandbox.write_file(f"{d}/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sh(
        shared_sandbox, f"python3 -c \"import os; print(oct(os.stat('{d}/run.sh').st_mode & 0o777))\""
    ) == ("0o755\n")
    # /workspace is mounted noexec, so run it through the shell.
    assert sh(shared_sandbox, f"sh {d}/run.sh") == "ran\n"


def test_invalid_utf8_needs_encoding_none(shared_sandbox: Sandbox, d: str) -> None:
    shared_sandbox.write_file(f"{d}/bad.bin", b"ok\xff\xfe")
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.read_file(f"{d}/bad.bin")
    assert "encoding=None" in str(info.value)
    assert info.value.code == "decode"
    assert shared_sandbox.read_file(f"{d}/bad.bin", encoding=None) == b"ok\xff\xfe"


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../x", "/workspace/../etc/passwd", "a/../../x", "/tmp/x", "/workspace-x/y"]
)
def test_paths_outside_the_workspace_are_refused(shared_sandbox: Sandbox, path: str) -> None:
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.read_file(path)
    assert info.value.code == "outside_workspace"
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.write_file(path, "escaped")
    assert info.value.code == "outside_workspace"
    for call in (
        shared_sandbox.exists,
        shared_sandbox.list_files,
        shared_sandbox.mkdir,
        shared_sandbox.remove_file,
    ):
        with pytest.raises(FileAccessError):
            call(path)


def test_refused_paths_create_nothing_anywhere(shared_sandbox: Sandbox) -> None:
    name = f"agentnest-escape-{os.urandom(4).hex()}"
    for path in (f"../{name}", f"/tmp/{name}", f"/workspace/../tmp/{name}"):
        with pytest.raises(FileAccessError):
            shared_sandbox.write_file(path, "escaped")
    host = [Path.cwd() / ".." / name, Path("/") / name, Path("/tmp") / name, Path.cwd() / name]
    assert [p for p in host if p.exists()] == []
    inside = f"import os; print([p for p in ('/{name}', '/tmp/{name}') if os.path.lexists(p)])"
    assert shared_sandbox.exec_python(inside).stdout == "[]\n"


def test_final_symlink_is_not_followed(shared_sandbox: Sandbox, d: str) -> None:
    target = f"/tmp/{d}-target"
    sh(shared_sandbox, f"echo outside > {target}; ln -s {target} {d}/link; ln -s /etc/passwd {d}/passwd")
    for link in (f"{d}/link", f"{d}/passwd"):
        with pytest.raises(FileAccessError) as info:
            shared_sandbox.read_file(link)
        assert info.value.code == "symlink"
    # Writing replaces the link itself; the file it pointed to is untouched.
    shared_sandbox.write_file(f"{d}/link", "inside")
    assert sh(shared_sandbox, f"cat {target}") == "outside\n"
    assert shared_sandbox.read_file(f"{d}/link") == "inside"
    # Removing a link removes the link, not its target.
    shared_sandbox.remove_file(f"{d}/passwd")
    assert sh(shared_sandbox, "head -c 5 /etc/passwd") == "root:"


def test_directory_symlink_is_not_followed(
    request: pytest.FixtureRequest, backend_name: str, shared_sandbox: Sandbox, d: str
) -> None:
    scratch = f"/tmp/{d}-dir"
    sh(
        shared_sandbox,
        f"mkdir {scratch}; echo outside > {scratch}/f; ln -s /etc {d}/etc; ln -s {scratch} {d}/tmp",
    )
    refused = []
    calls: dict[str, Callable[[], object]] = {
        "read through /etc link": lambda: shared_sandbox.read_file(f"{d}/etc/passwd"),
        "read through /tmp link": lambda: shared_sandbox.read_file(f"{d}/tmp/f"),
        "list through link": lambda: shared_sandbox.list_files(f"{d}/tmp"),
        "write through link": lambda: shared_sandbox.write_file(f"{d}/tmp/planted", "x"),
        "mkdir through link": lambda: shared_sandbox.mkdir(f"{d}/tmp/newdir"),
        "remove through link": lambda: shared_sandbox.remove_file(f"{d}/tmp/f"),
    }
    for name, call in calls.items():
        try:
            call()
        except FileAccessError:
            refused.append(name)
    found = sh(shared_sandbox, f"cd {scratch} && echo *")
    assert found == "f\n", "the file API changed a directory outside the workspace"
    assert len(refused) == 6, f"only refused: {refused}"


def test_fifo_is_refused_without_hanging(shared_sandbox: Sandbox, d: str) -> None:
    sh(shared_sandbox, f"mkfifo {d}/fifo")
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.read_file(f"{d}/fifo")
    assert info.value.code == "not_regular"
    assert shared_sandbox.exec_shell("echo alive").stdout == "alive\n"


def test_list_mkdir_exists_remove(shared_sandbox: Sandbox, d: str) -> None:
    shared_sandbox.mkdir(f"{d}/x/y")
    shared_sandbox.write_file(f"{d}/x/y/f.txt", "12345")
    shared_sandbox.write_file(f"{d}/top.txt", "1")
    sh(shared_sandbox, f"ln -s top.txt {d}/link")
    assert shared_sandbox.exists(f"{d}/x/y/f.txt")
    assert shared_sandbox.exists(f"{d}/link")
    assert not shared_sandbox.exists(f"{d}/nope")
    top = {(e.path, e.type) for e in shared_sandbox.list_files(d)}
    assert top == {(f"{d}/x", "dir"), (f"{d}/top.txt", "file"), (f"{d}/link", "symlink")}
    deep = {e.path: e for e in shared_sandbox.list_files(d, recursive=True)}
    assert deep[f"{d}/x/y/f.txt"].size == 5
    assert deep[f"{d}/x/y"].is_dir
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.mkdir(f"{d}/p/q", parents=False)
    assert info.value.code == "not_found"
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.remove_file(f"{d}/x")
    assert info.value.code == "not_empty"
    shared_sandbox.remove_file(f"{d}/x", recursive=True)
    assert not shared_sandbox.exists(f"{d}/x")
    shared_sandbox.remove_file(f"{d}/top.txt")
    assert not shared_sandbox.exists(f"{d}/top.txt")
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.read_file(f"{d}/top.txt")
    assert info.value.code == "not_found"
    with pytest.raises(FileAccessError) as info:
        shared_sandbox.read_file(d)
    assert info.value.code == "is_directory"


def test_files_over_max_file_bytes_are_refused(backend_name: str) -> None:
    policy = SecurityPolicy(max_file_bytes=1_000_000)
    with Sandbox(backend=backend_name, timeout=60, security_policy=policy) as sb:
        with pytest.raises(FileAccessError) as info:
            sb.write_file("big.bin", b"x" * 1_000_001)
        assert info.value.code == "too_large"
        assert not sb.exists("big.bin")
        sb.write_file("ok.bin", b"x" * 1_000_000)
        sb.exec_shell("head -c 2000000 /dev/zero > made-inside.bin").check()
        with pytest.raises(FileAccessError) as info:
            sb.read_file("made-inside.bin", encoding=None)
        assert info.value.code == "too_large"
        assert len(sb.read_file("ok.bin", encoding=None)) == 1_000_000


def test_filling_the_workspace_fails_cleanly(backend_name: str) -> None:
    with Sandbox(
        backend=backend_name, timeout=60, memory="128m", workspace_size="32m", scratch_size="16m"
    ) as sb:
        sb.write_file("keep.txt", "keep")
        with pytest.raises(FileAccessError) as info:
            sb.write_file("fill.bin", b"z" * (40 * MiB))
        assert info.value.code == "no_space"
        # No half-written file or temp file is left behind, and there is room again.
        assert [e.path for e in sb.list_files()] == ["keep.txt"]
        sb.write_file("after.bin", b"y" * (16 * MiB))
        assert sb.read_file("keep.txt") == "keep"
        assert sb.exec_shell("echo alive").stdout == "alive\n"


def test_upload_and_download(shared_sandbox: Sandbox, d: str, tmp_path: Path) -> None:
    data = os.urandom(MiB + 17)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    shared_sandbox.upload_file(source, f"{d}/up.bin")
    inside = f"import hashlib; print(hashlib.sha256(open('{d}/up.bin', 'rb').read()).hexdigest())"
    assert shared_sandbox.exec_python(inside).stdout.strip() == hashlib.sha256(data).hexdigest()
    target = tmp_path / "out" / "down.bin"
    target.parent.mkdir()
    shared_sandbox.download_file(f"{d}/up.bin", target)
    assert target.read_bytes() == data
    assert sorted(p.name for p in target.parent.iterdir()) == ["down.bin"]  # no temp file left
    with pytest.raises(FileAccessError):
        shared_sandbox.download_file(f"{d}/missing.bin", tmp_path / "missing.bin")
    assert not (tmp_path / "missing.bin").exists()
