"""``sandbox.files`` through the stock SDK: every call, relative and absolute paths under
E2B's home (the workspace), and the refusals: paths outside it, uploads above the limit."""

from __future__ import annotations

import base64

import pytest

from .conftest import SDK, UPLOAD_LIMIT, Observed

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

HOME = "/home/user"
BLOB = bytes(range(256)) * 4


@pytest.fixture(scope="module")
def files(sdk: SDK, shared_sandbox: str) -> Observed:
    return sdk.run("files", sandbox_id=shared_sandbox, upload_limit=UPLOAD_LIMIT)


def test_write_str_bytes_and_file_objects(files: Observed) -> None:
    a = files.value("write_str")
    assert a["name"] == "a.txt" and a["path"] == f"{HOME}/fs/a.txt", a
    assert files.value("write_bytes")["path"] == f"{HOME}/fs/b.bin"
    assert files.value("write_filelike")["path"] == f"{HOME}/fs/c.txt"
    assert files.value("write_textio")["path"] == f"{HOME}/fs/t.txt"


def test_write_files_writes_several(files: Observed) -> None:
    paths = [e["path"] for e in files.value("write_files")]
    assert paths == [f"{HOME}/fs/multi/x.txt", f"{HOME}/fs/multi/y.bin", f"{HOME}/fs/multi/deep/z.txt"]
    assert files.value("read_multi") == ["x-data", "y-data", "z-data"]


def test_read_text_bytes_and_stream(files: Observed) -> None:
    assert files.value("read_text") == "hello\nworld\n"
    assert files.value("read_absolute") == "hello\nworld\n"
    assert base64.b64decode(files.value("read_bytes")) == BLOB
    assert files.value("read_stream") == "from a file object"
    assert files.value("read_textio") == "text io"
    files.error("read_missing", "NotFoundException")


def test_list_depth_one_and_two(files: Observed) -> None:
    one = {e["path"]: e for e in files.value("list_depth1")}
    assert set(one) == {f"{HOME}/fs/{n}" for n in ("a.txt", "b.bin", "c.txt", "t.txt", "multi")}, one
    assert one[f"{HOME}/fs/multi"]["type"] == "dir" and one[f"{HOME}/fs/b.bin"]["type"] == "file"
    assert one[f"{HOME}/fs/b.bin"]["size"] == len(BLOB)
    two = {e["path"] for e in files.value("list_depth2")}
    assert set(one) | {f"{HOME}/fs/multi/x.txt", f"{HOME}/fs/multi/y.bin", f"{HOME}/fs/multi/deep"} == two
    assert f"{HOME}/fs" in {e["path"] for e in files.value("list_home")}
    files.error("list_missing", "NotFoundException")


def test_exists_and_get_info(files: Observed) -> None:
    assert files.value("exists_file") is True
    assert files.value("exists_dir") is True
    assert files.value("exists_missing") is False
    info = files.value("info_file")
    assert info == {"name": "b.bin", "path": f"{HOME}/fs/b.bin", "type": "file", "size": len(BLOB)}
    assert files.value("info_dir")["type"] == "dir"
    files.error("info_missing", "NotFoundException")


def test_make_dir_rename_remove(files: Observed) -> None:
    assert files.value("make_dir_new") is True
    assert files.value("make_dir_again") is False
    assert files.value("make_dir_is_dir")["type"] == "dir"
    assert files.value("rename")["path"] == f"{HOME}/fs/made/renamed.txt"
    assert files.value("rename_old_gone") is False
    assert files.value("rename_new_read") == "hello\nworld\n"
    files.error("rename_missing", "NotFoundException")
    files.value("remove_file")
    assert files.value("remove_file_gone") is False
    files.value("remove_dir")
    assert files.value("remove_dir_gone") is False


def test_paths_outside_the_workspace_are_refused(files: Observed) -> None:
    for key in (
        "outside_read",
        "outside_read_dotdot",
        "outside_write",
        "outside_write_dotdot",
        "outside_list",
        "outside_make_dir",
        "outside_rename",
        "outside_remove",
    ):
        err = files.error(key, "SandboxException")
        assert "root:x:" not in err["message"], f"{key} leaked /etc/passwd"
    # Nothing was written, moved or removed outside the workspace.
    assert files.value("outside_seen_by_shell")["stdout"] == "hostname-kept\n"


def test_an_upload_above_the_limit_is_refused(files: Observed) -> None:
    files.error("upload_too_big", "SandboxException")
    files.error("upload_too_big_filelike", "SandboxException")
    assert files.value("upload_too_big_left") == [False, False]
    assert files.value("upload_at_limit")["path"] == f"{HOME}/fs/fits.bin"
