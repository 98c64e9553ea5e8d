"""The subreaper trampoline of agent/exec.py, run on this machine (Linux x86-64 only)."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Iterator

import pytest

from agentnest.agent import exec as execmod
from agentnest.agent import tree as treemod

REPORT = r"""
import ctypes, json, os
v = ctypes.c_int(-1)
ctypes.CDLL(None).prctl(37, ctypes.byref(v), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
argv0 = open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode()
print(json.dumps({"subreaper": v.value, "argv0": argv0, "fds": sorted(os.listdir("/proc/self/fd"))}))
"""


@pytest.fixture
def trampoline(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("the trampoline is x86-64 Linux only")
    monkeypatch.setattr(treemod, "_PRCTL", ctypes.CDLL(None, use_errno=True).prctl)
    monkeypatch.setattr(execmod, "_TRAMPOLINE", None)
    execmod._make_trampoline()
    fd = execmod._TRAMPOLINE
    assert fd is not None
    yield fd
    execmod._drop_trampoline()


def output(argv: list[str], subreaper: bool) -> bytes:
    cmd = execmod.spawn(1, argv, dict(os.environ), os.getcwd(), False, 1 << 20, "t", subreaper=subreaper)
    assert cmd.proc.wait(30) == 0
    assert cmd.proc.stdout is not None
    os.set_blocking(cmd.proc.stdout.fileno(), True)
    out = cmd.proc.stdout.read()
    cmd.proc.stdout.close()
    assert cmd.proc.stderr is not None
    cmd.proc.stderr.close()
    return out


def run(argv: list[str], subreaper: bool) -> dict[str, object]:
    found: dict[str, object] = json.loads(output(argv, subreaper))
    return found


def test_a_timed_command_is_a_subreaper_with_its_own_argv0_and_no_extra_descriptor(trampoline: int) -> None:
    found = run([sys.executable, "-c", REPORT], subreaper=True)
    assert found == {"subreaper": 1, "argv0": sys.executable, "fds": ["0", "1", "2", "3"]}  # 3: the listing's
    assert run([sys.executable, "-c", REPORT], subreaper=False)["subreaper"] == 0
    # A name found on PATH: the program still sees the name it was given.
    assert output(["sh", "-c", 'echo "$0"'], subreaper=True) == b"sh\n"


def test_a_trampoline_the_system_will_not_run_gives_way_to_the_preexec_fn(trampoline: int) -> None:
    os.close(trampoline)
    execmod._TRAMPOLINE = os.open("/dev/null", os.O_RDONLY)  # exec refused: EACCES
    assert run([sys.executable, "-c", REPORT], subreaper=True)["subreaper"] == 1
    assert execmod._TRAMPOLINE is None
