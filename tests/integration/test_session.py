"""Python sessions in real sandboxes, on runc and on gVisor.

A session is an interpreter process the in-sandbox agent starts; these tests
check what users rely on under each runtime: state across runs, results,
streaming, tracebacks, timeouts that keep the state, interpreters that die
(and say so), bounded results, display items, several sessions at once,
secret redaction, and that nothing is written to the workspace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentnest import (
    ExecutionTimeoutError,
    PythonSession,
    Sandbox,
    Secret,
    SessionLostError,
    SessionResult,
)
from agentnest.agent.limits import INTERRUPT_GRACE, RESULT_LIMIT

from .helpers import Background, processes

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def session(shared_sandbox: Sandbox) -> Iterator[PythonSession]:
    with shared_sandbox.python_session() as s:
        yield s


def interpreters(sb: Sandbox) -> list[list[str]]:
    """The argv of every session interpreter running in the sandbox."""
    return [argv for argv in processes(sb) if "-c" in argv and any("agentnest_session" in a for a in argv)]


def test_state_and_results_persist(session: PythonSession, shared_sandbox: Sandbox) -> None:
    session.run("import json, os\nx = 41\nhandle = open('session.log', 'w')")
    assert session.run("x + 1").check().result == "42"
    assert session.run("json.dumps([x])").result == "'[41]'"
    session.run("handle.write('kept open'); handle.close()")
    assert shared_sandbox.read_file("session.log") == "kept open"
    assert session.run("(os.getuid(), os.getcwd())").result == "(65532, '/workspace')"
    assert session.run("print('out'); import sys; print('err', file=sys.stderr)").output == "out\nerr\n"
    shared_sandbox.remove_file("session.log")


def test_output_streams_while_the_code_runs(session: PythonSession, shared_sandbox: Sandbox) -> None:
    code = (
        "import os, time\n"
        "print('first', flush=True)\n"
        "while not os.path.exists('stream-go'):\n"
        "    time.sleep(0.01)\n"
        "print('second')"
    )
    stream = session.stream(code, timeout=60)
    chunks = iter(stream)
    assert next(chunks).data == "first\n"
    assert stream.result is None
    shared_sandbox.write_file("stream-go", "")
    assert [c.data for c in chunks] == ["second\n"]
    final: SessionResult | None = stream.result
    assert final is not None and final.ok
    shared_sandbox.remove_file("stream-go")


def test_errors_and_syntax_errors_keep_the_session(session: PythonSession) -> None:
    session.run("x = 1")
    got = session.run("1 / 0")
    assert got.error is not None and got.error.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "agentnest" not in got.error
    got = session.run("def broken(:")
    assert got.error is not None and "SyntaxError" in got.error
    assert session.run("x").result == "1"


def test_timeout_interrupts_and_keeps_the_state(session: PythonSession) -> None:
    session.run("x = 1")
    started = time.monotonic()
    with pytest.raises(ExecutionTimeoutError) as info:
        session.run("y = 2\nwhile True:\n    pass", timeout=1)
    assert time.monotonic() - started < 1 + 5
    partial = info.value.result
    assert isinstance(partial, SessionResult) and partial.timed_out
    assert partial.error is not None and "KeyboardInterrupt" in partial.error
    assert session.run("x + y").result == "3"


def test_code_ignoring_the_interrupt_is_killed_and_reset_recovers(
    session: PythonSession, shared_sandbox: Sandbox
) -> None:
    session.run("x = 1")
    code = (
        "import time\nwhile True:\n    try:\n        time.sleep(10)\n"
        "    except KeyboardInterrupt:\n        print('ignored', flush=True)"
    )
    before = len(interpreters(shared_sandbox))
    started = time.monotonic()
    with pytest.raises(SessionLostError, match="did not stop") as info:
        session.run(code, timeout=1)
    assert time.monotonic() - started < 1 + INTERRUPT_GRACE + 5
    assert info.value.result is not None and info.value.result.stdout == "ignored\n"
    assert len(interpreters(shared_sandbox)) == before - 1  # killed, not left running
    with pytest.raises(SessionLostError):
        session.run("x")
    session.reset()
    assert session.run("'x' in globals()").result == "False"
    assert shared_sandbox.exec(["true"]).exit_code == 0


def test_an_exiting_interpreter_loses_the_session(session: PythonSession) -> None:
    session.run("x = 1")
    with pytest.raises(SessionLostError, match="exited with status 0"):
        session.run("import os; os._exit(0)")
    with pytest.raises(SessionLostError):
        session.run("x")  # never a stale answer
    session.reset()
    with pytest.raises(SessionLostError, match="SIGSEGV") as info:
        session.run("import ctypes; ctypes.string_at(0)")
    assert info.value.result is not None and "Fatal Python error" in info.value.result.stderr
    session.reset()
    assert session.run("6 * 7").result == "42"


def test_a_huge_result_is_bounded(session: PythonSession) -> None:
    got = session.run("b'y' * (64 << 20)")
    assert got.truncated
    assert got.result is not None and len(got.result) == RESULT_LIMIT and got.result.startswith("b'yyy")
    got = session.run("class Big:\n    def __repr__(self):\n        return 'z' * (32 << 20)\nBig()")
    assert got.truncated and got.result == "z" * RESULT_LIMIT


def test_a_one_gigabyte_result(backend_name: str) -> None:
    with Sandbox(backend=backend_name, timeout=120) as sb, sb.python_session() as s:
        s.run("x = 1")
        if backend_name == "gvisor":
            # RLIMIT_AS per process: the allocation fails inside the interpreter.
            got = s.run("'x' * (1 << 30)")
            assert got.error is not None and "MemoryError" in got.error
            assert s.run("x").result == "1"
        else:
            # runc: the cgroup's OOM killer ends the interpreter, not the sandbox.
            with pytest.raises(SessionLostError, match="out of memory"):
                s.run("'x' * (1 << 30)")
            s.reset()
        assert s.run("'still here'").result == "'still here'"
        assert sb.exec_shell("echo intact").stdout == "intact\n"


FAKE_PYPLOT = """
from matplotlib.figure import Figure
_figures = {}
def figure(num=None):
    num = num or max(_figures, default=0) + 1
    return _figures.setdefault(num, Figure(num))
def get_fignums():
    return sorted(_figures)
def close(which):
    _figures.clear()
"""
FAKE_FIGURE = """
class Figure:
    def __init__(self, num):
        self.num = num
    def savefig(self, buf, format, bbox_inches=None):
        buf.write(b"\\x89PNG figure %d" % self.num)
"""


def test_display_items(session: PythonSession, shared_sandbox: Sandbox) -> None:
    # The base image has no matplotlib: a stand-in with the pyplot calls used.
    shared_sandbox.write_file("matplotlib/__init__.py", "")
    shared_sandbox.write_file("matplotlib/pyplot.py", FAKE_PYPLOT)
    shared_sandbox.write_file("matplotlib/figure.py", FAKE_FIGURE)
    try:
        got = session.run(
            "import matplotlib.pyplot as plt\n"
            "class Table:\n    def _repr_html_(self):\n        return '<table></table>'\n"
            "display(Table())\nplt.figure()\nplt.figure()\n"
            "class Image:\n    def _repr_png_(self):\n        return bytes(range(256)) * 8192\n"
            "Image()"
        )
        assert [d.mime for d in got.display] == ["text/html", "image/png", "image/png", "image/png"]
        assert got.display[0].data == "<table></table>"
        assert got.display[1].raw() == bytes(range(256)) * 8192  # 2 MiB: sent in pieces
        assert [d.raw() for d in got.display[2:]] == [b"\x89PNG figure 1", b"\x89PNG figure 2"]
    finally:
        shared_sandbox.remove_file("matplotlib", recursive=True)


def test_several_sessions_run_at_once(shared_sandbox: Sandbox) -> None:
    with shared_sandbox.python_session() as a, shared_sandbox.python_session() as b:
        a.run("x = 'a'")
        b.run("x = 'b'")
        waiting = "import os, time\nwhile not os.path.exists('from-b'):\n    time.sleep(0.01)\nx"
        call = Background(lambda: a.run(waiting, timeout=60))
        b.run("open('from-b', 'w').close()")
        assert call.join(60)
        assert call.error is None and call.result.result == "'a'"
        assert b.run("x").result == "'b'"
        shared_sandbox.remove_file("from-b")


def test_nothing_is_written_to_the_workspace_and_close_ends_the_interpreter(
    shared_sandbox: Sandbox,
) -> None:
    before = len(interpreters(shared_sandbox))
    s = shared_sandbox.python_session()
    s.run("import subprocess\nbg = subprocess.Popen(['sleep', '300'])\nx = 1")
    assert shared_sandbox.list_files(".") == []
    assert len(interpreters(shared_sandbox)) == before + 1
    s.close()
    assert len(interpreters(shared_sandbox)) == before
    assert not any(argv[:2] == ["sleep", "300"] for argv in processes(shared_sandbox))


def test_secrets_are_redacted(backend_name: str) -> None:
    with (
        Sandbox(backend=backend_name, timeout=120, environment={"TOKEN": Secret("tok-5ecret-99")}) as sb,
        sb.python_session() as s,
    ):
        got = s.run("import os\nprint(os.environ['TOKEN'])\nos.environ['TOKEN']")
        assert got.stdout == "[REDACTED]\n"
        assert got.result == "'[REDACTED]'"


def test_killing_the_agent_loses_the_session(backend_name: str) -> None:
    with Sandbox(backend=backend_name, timeout=120) as sb, sb.python_session() as s:
        s.run("x = 1")
        assert len(interpreters(sb)) == 1
        with pytest.raises(SessionLostError, match="agent"):
            s.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time; time.sleep(30)")
        with pytest.raises(SessionLostError):
            s.run("x")
        # The orphaned interpreter died with its agent.
        assert interpreters(sb) == []
        s.reset()  # on the new agent
        assert s.run("'x' in globals()").result == "False"
