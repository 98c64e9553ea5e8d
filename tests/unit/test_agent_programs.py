"""Programs shipped as source on a command line: ``agent/git_clone.py`` and ``agent/deadline_file.py``.

Run here as the sandbox would run them (``python3 -I -S -c SOURCE ...``,
through :func:`agentnest.runtime.launch.script_command`), on this host.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentnest.runtime.launch import script_command

AGENT_DIR = Path(__file__).resolve().parents[2] / "agentnest" / "agent"


@pytest.mark.parametrize("name", ["git_clone", "deadline_file"])
def test_programs_import_only_the_stdlib(name: str) -> None:
    tree = ast.parse((AGENT_DIR / f"{name}.py").read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert all(a.name.split(".")[0] in sys.stdlib_module_names for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module is not None
            assert node.module.split(".")[0] in sys.stdlib_module_names or node.module == "__future__"


def test_git_clone_hands_the_credentials_to_a_helper_only(tmp_path: Path) -> None:
    # Stands in for git: $3 is the helper config the program inserted after
    # "credential.helper="; run it as git would (sh -c "... get").
    fake_git = ["sh", "-c", 'sh -c "${3#credential.helper=!} get"; printf "%s\\n" "$3"', "sh"]
    argv = script_command(sys.executable, "git_clone", *fake_git, "credential.helper=")
    done = subprocess.run(argv, input=b"username=u\npassword=p4ss\n", capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert lines[:2] == ["username=u", "password=p4ss"]
    helper = lines[2]
    assert helper.startswith('credential.helper=!f() { test "$1" = get && cat \'/tmp/.agentnest-git-')
    home = os.path.dirname(helper.split("cat '")[1].split("'")[0])
    assert b"p4ss" not in b"\0".join(a.encode() for a in argv)
    assert not os.path.exists(home)  # removed once "git" exited


def test_git_clone_exits_with_gits_status() -> None:
    argv = script_command(sys.executable, "git_clone", "sh", "-c", "exit 7", "sh", "credential.helper=")
    assert subprocess.run(argv, input=b"", capture_output=True, timeout=30).returncode == 7


def deadline(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        script_command(sys.executable, "deadline_file", *args), capture_output=True, timeout=30
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the program trusts only a root-owned file")
def test_deadline_file_writes_and_reads(tmp_path: Path) -> None:
    path = str(tmp_path / "deadline")
    assert deadline("write", path, "123.500").returncode == 0
    assert Path(path).read_text() == "123.500"
    assert deadline("read", path).stdout == b"123.500\n"
    assert deadline("write", path, "200.000").returncode == 0  # replaced atomically
    assert deadline("read", path).stdout == b"200.000\n"


def test_deadline_file_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "deadline"
    # Something planted at the temporary name: the write fails, nothing followed.
    target = tmp_path / "target"
    (tmp_path / "deadline.new").symlink_to(target)
    assert deadline("write", str(path), "1.0").returncode != 0
    assert not target.exists() and not path.exists()
    # Missing, a link, or not root's: nothing read.
    assert deadline("read", str(path)).stdout == b""
    real = tmp_path / "real"
    real.write_text("5.0")
    path.symlink_to(real)
    assert deadline("read", str(path)).stdout == b""
    if os.geteuid() == 0:
        other = tmp_path / "other"
        other.write_text("6.0")
        os.chown(other, 65532, 65532)
        assert deadline("read", str(other)).stdout == b""
