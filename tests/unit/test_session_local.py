"""Python sessions against the real agent, run as a plain child over a socketpair.

``LocalBackend`` below hands ``Sandbox`` a :class:`LocalAgent` instead of a
container, so the whole path runs for real -- ``PythonSession``, the guard,
the channel, the agent and its interpreter children -- without an engine.
Nothing is isolated: the code here is the test's own.  A hand-played agent
(``Peer``) checks that the host trusts nothing a session sends.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from doubles.local_agent import LocalAgent, LocalBackend

from agentnest import (
    ConfigurationError,
    DisplayItem,
    ExecutionError,
    ExecutionTimeoutError,
    MemoryObserver,
    PolicyDeniedError,
    PythonSession,
    Sandbox,
    Secret,
    SecurityPolicy,
    SessionLostError,
    SessionResult,
)
from agentnest.agent import limits
from agentnest.agent.limits import RESULT_LIMIT
from agentnest.agent.repl import bounded_repr, clip
from agentnest.channel import client
from agentnest.channel.client import Channel
from agentnest.channel.protocol import (
    MAX_SESSION_VALUE,
    ProtocolViolation,
    RawDisplay,
    RawSessionRun,
    RawValue,
    parse_display,
    parse_session_opened,
    parse_session_ran,
    parse_value,
)
from agentnest.errors import ChannelError
from agentnest.guard import ApprovalRequest
from agentnest.runtime import launch
from agentnest.testing.peer import Peer as BasePeer

pytestmark = pytest.mark.timeout(60)

#: How long any single wait in these tests may take before it counts as a hang.
WAIT = 15.0


# -- helpers -------------------------------------------------------------------------


def alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] not in (b"Z", b"X")


def wait_until(predicate: Callable[[], bool], within: float = WAIT, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        time.sleep(0.01)


class Box:
    """A sandbox on the local backend, its workspace, events and approvals."""

    def __init__(self, root: Path, **kwargs: Any) -> None:
        self.backend = LocalBackend(root)
        self.events = MemoryObserver()
        self.approvals: list[ApprovalRequest] = []
        self.deny = False
        self.sandbox = Sandbox(
            "local",
            timeout=120,
            backend=self.backend,
            observers=[self.events],
            approval_hook=self._approve,
            **kwargs,
        )
        self.workspace = root / self.sandbox.id

    def _approve(self, request: ApprovalRequest) -> bool:
        self.approvals.append(request)
        return not self.deny

    def agent(self) -> LocalAgent:
        return self.backend.agents[self.sandbox.id][-1]


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    b = Box(tmp_path, environment={"TOKEN": Secret("s3cr3t-t0ken")})
    try:
        yield b
    finally:
        b.sandbox.destroy()


@pytest.fixture
def session(box: Box) -> Iterator[PythonSession]:
    with box.sandbox.python_session() as s:
        yield s


# -- state, results, output ------------------------------------------------------------


def test_state_persists_across_runs(session: PythonSession, box: Box) -> None:
    assert session.run("import json\nx = 41").result is None
    assert session.run("x + 1").check().result == "42"
    session.run("def double(v):\n    return 2 * v")
    assert session.run("json.dumps({'d': double(x)})").result == "'{\"d\": 82}'"
    session.run("handle = open('log.txt', 'w')")
    session.run("handle.write('one\\n')")
    session.run("handle.write('two\\n'); handle.close()")
    assert (box.workspace / "log.txt").read_text() == "one\ntwo\n"


def test_result_is_the_repr_of_a_trailing_expression(session: PythonSession) -> None:
    assert session.run("'hi'").result == "'hi'"
    assert session.run("x = 1; x").result == "1"  # after a statement on the same line
    assert session.run("None").result is None  # as a notebook shows nothing
    assert session.run("print('p')").result is None
    assert session.run("y = 2").result is None
    got = session.run("class P:\n    def __repr__(self):\n        return 'P!'\nP()")
    assert got.result == "P!"
    assert got.ok and got.error is None and not got.timed_out and not got.truncated


def test_stdout_and_stderr_include_subprocesses_and_c_level_writes(session: PythonSession) -> None:
    got = session.run(
        "import os, subprocess, sys\n"
        "print('from print')\n"
        "print('to stderr', file=sys.stderr)\n"
        "subprocess.run(['echo', 'from a child'], check=True)\n"
        "os.write(1, b'from fd 1\\n')\n"
    )
    assert got.stdout == "from print\nfrom a child\nfrom fd 1\n"
    assert got.stderr == "to stderr\n"
    assert got.output == got.stdout + got.stderr


def test_output_streams_while_the_code_runs(session: PythonSession, box: Box) -> None:
    code = (
        "import os, time\n"
        "print('first', flush=True)\n"
        "while not os.path.exists('go'):\n"
        "    time.sleep(0.01)\n"
        "print('second')\n"
        "'done'"
    )
    stream = session.stream(code, timeout=WAIT)
    chunks = iter(stream)
    first = next(chunks)
    assert (first.stream, first.data) == ("stdout", "first\n")
    assert stream.result is None  # the code is still waiting for us
    (box.workspace / "go").touch()
    rest = list(chunks)
    assert [c.data for c in rest] == ["second\n"]
    final: SessionResult | None = stream.result
    assert final is not None
    assert final.result == "'done'"
    assert final.stdout == "first\nsecond\n"


def test_input_gets_end_of_file(session: PythonSession) -> None:
    got = session.run("input('? ')")
    assert got.error is not None and "EOFError" in got.error


def test_top_level_await(session: PythonSession) -> None:
    assert session.run("import asyncio\nawait asyncio.sleep(0)\n6 * 7").result == "42"
    assert session.run("async def f():\n    return 'async'\nawait f()").result == "'async'"


def test_session_namespace_is_main(session: PythonSession) -> None:
    session.run("import pickle, inspect\nclass Point:\n    pass\ndef f():\n    return 1")
    assert session.run("__name__").result == "'__main__'"
    assert session.run("type(pickle.loads(pickle.dumps(Point()))).__name__").result == "'Point'"
    assert session.run("inspect.getsource(f)").result == repr("def f():\n    return 1")


def test_workspace_modules_import_but_do_not_break_the_interpreter(box: Box) -> None:
    # A file named like a module the interpreter loads itself must not replace it.
    (box.workspace / "json.py").write_text("raise RuntimeError('shadowed')\n")
    (box.workspace / "helper.py").write_text("VALUE = 7\n")
    with box.sandbox.python_session() as s:
        assert s.run("import helper; helper.VALUE").result == "7"
        assert s.run("import os; os.getcwd() == os.path.realpath('.')").result == "True"


# -- errors ---------------------------------------------------------------------------


def test_exception_comes_back_as_a_traceback(session: PythonSession) -> None:
    session.run("x = 5")
    got = session.run("def f():\n    return 1 / 0\nf()")
    assert not got.ok
    assert got.error is not None
    assert got.error.startswith("Traceback (most recent call last):")
    assert 'File "<cell-2>", line 2, in f' in got.error
    assert got.error.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "agentnest" not in got.error  # the interpreter's own frames are hidden
    with pytest.raises(ExecutionError, match="ZeroDivisionError") as info:
        got.check()
    assert info.value.result is got
    assert session.run("x").result == "5"  # still usable, state intact


def test_syntax_error_runs_nothing_and_keeps_the_session(session: PythonSession) -> None:
    session.run("x = 1")
    got = session.run("x = 2\ndef broken(:\n    pass")
    assert got.error is not None
    assert "SyntaxError" in got.error
    assert '"<cell-2>", line 2' in got.error
    assert session.run("x").result == "1"  # the first line did not run either


def test_system_exit_is_an_error_not_an_exit(session: PythonSession) -> None:
    got = session.run("import sys; sys.exit(3)")
    assert got.error is not None and "SystemExit: 3" in got.error
    assert session.run("1 + 1").result == "2"


def test_invalid_arguments(session: PythonSession) -> None:
    with pytest.raises(ConfigurationError, match="str"):
        session.run(b"1")  # type: ignore[arg-type]
    for bad in (0, -1, float("nan"), True, "1"):
        with pytest.raises(ConfigurationError, match="timeout"):
            session.run("1", timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="limit"):
        session.run("#" * (limits.MAX_CODE_BYTES + 1))
    assert session.run("1").result == "1"


# -- timeouts and interrupts ------------------------------------------------------------


def test_timeout_interrupts_and_keeps_the_state(session: PythonSession, box: Box) -> None:
    session.run("x = 1")
    started = time.monotonic()
    with pytest.raises(ExecutionTimeoutError, match="intact") as info:
        session.run("y = 2\nprint('before')\nwhile True:\n    pass", timeout=0.5)
    assert time.monotonic() - started < 0.5 + 3
    partial = info.value.result
    assert isinstance(partial, SessionResult)
    assert partial.timed_out and not partial.ok
    assert partial.stdout == "before\n"
    assert partial.error is not None and partial.error.rstrip().endswith("KeyboardInterrupt")
    assert isinstance(info.value, TimeoutError)
    assert session.run("(x, y)").result == "(1, 2)"  # both survive, y from the interrupted run
    assert "session.timed_out" in box.events.types()


def test_timeout_interrupts_a_blocking_call(session: PythonSession) -> None:
    with pytest.raises(ExecutionTimeoutError):
        session.run("import time; time.sleep(60)", timeout=0.3)
    assert session.run("'alive'").result == "'alive'"


def test_timeout_interrupts_a_wait_for_a_subprocess(session: PythonSession) -> None:
    with pytest.raises(ExecutionTimeoutError):
        session.run("import subprocess\nproc = subprocess.Popen(['sleep', '60'])\nproc.wait()", timeout=0.5)
    # subprocess.Popen.__exit__ is not involved: the code still holds the child.
    pid = int(session.run("proc.pid").result or "0")
    session.run("proc.kill(); proc.wait()")
    assert not alive(pid)


def test_code_that_ignores_the_interrupt_is_killed_and_the_session_lost(session: PythonSession) -> None:
    session.run("x = 1")
    old_pid = session.pid
    assert old_pid is not None and alive(old_pid)
    code = (
        "import time\nwhile True:\n    try:\n        time.sleep(10)\n"
        "    except KeyboardInterrupt:\n        pass"
    )
    started = time.monotonic()
    with pytest.raises(SessionLostError, match="did not stop") as info:
        session.run(code, timeout=0.5)
    took = time.monotonic() - started
    assert 0.5 + limits.INTERRUPT_GRACE - 0.2 < took < 0.5 + limits.INTERRUPT_GRACE + 3
    assert info.value.result is not None and info.value.result.timed_out
    wait_until(lambda: not alive(old_pid), what="the killed interpreter to vanish")
    assert session.pid is None
    with pytest.raises(SessionLostError, match="reset"):
        session.run("x")  # never a stale answer
    session.reset()
    got = session.run("'x' in globals()")
    assert got.result == "False"  # a fresh interpreter
    new_pid: int | None = session.pid
    assert new_pid is not None and new_pid != old_pid


def test_interrupt_from_another_thread(session: PythonSession, box: Box) -> None:
    code = "import time\nopen('started', 'w').close()\nwhile True:\n    time.sleep(0.01)"
    results: list[SessionResult] = []
    runner = threading.Thread(target=lambda: results.append(session.run(code)))
    runner.start()
    wait_until((box.workspace / "started").exists, what="the run to start")
    session.interrupt()
    runner.join(WAIT)
    assert not runner.is_alive()
    (got,) = results
    assert not got.timed_out  # interrupted, not timed out
    assert got.error is not None and "KeyboardInterrupt" in got.error
    session.interrupt()  # nothing running: a no-op
    assert session.run("2").result == "2"


def test_leaving_a_stream_early_interrupts_the_code(session: PythonSession) -> None:
    session.run("n = 0")
    code = "import time\nwhile True:\n    n += 1\n    print(n, flush=True)\n    time.sleep(0.01)"
    for chunk in session.stream(code):
        assert chunk.data.startswith("1")
        break
    # The next run waits for the interrupted one to end, then sees its state.
    assert int(session.run("n").result or "0") >= 1
    assert session.run("'next'").result == "'next'"


def test_stream_close_interrupts_the_code(session: PythonSession) -> None:
    stream = session.stream("import time\nprint('go', flush=True)\nwhile True:\n    time.sleep(0.01)")
    chunks = iter(stream)
    assert next(chunks).data == "go\n"
    stream.close()
    assert session.run("3").result == "3"


def test_one_run_at_a_time(session: PythonSession, box: Box) -> None:
    stream = session.stream("import os, time\nwhile not os.path.exists('free'):\n    time.sleep(0.01)\n1")
    chunks = iter(stream)
    waiter = threading.Thread(target=lambda: list(chunks))
    waiter.start()
    wait_until(lambda: stream.result is None and session._current is not None, what="the run to start")
    with pytest.raises(ConfigurationError, match="already running"):
        session.run("2")
    with pytest.raises(ConfigurationError, match="running code"):
        session.reset()
    (box.workspace / "free").touch()
    waiter.join(WAIT)
    assert stream.result is not None and stream.result.result == "1"
    with pytest.raises(ConfigurationError, match="once"):
        iter(stream)


def test_a_silent_run_is_kept_alive_by_heartbeats(
    session: PythonSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "STALL_AFTER", 1.5)
    got = session.run("import time\ntime.sleep(2.6)\n'slept'")  # silent for longer than STALL_AFTER
    assert got.result == "'slept'"


# -- a session that dies ------------------------------------------------------------------


def test_os_exit_loses_the_session_and_reset_recovers(session: PythonSession, box: Box) -> None:
    session.run("x = 1")
    with pytest.raises(SessionLostError, match="exited with status 0"):
        session.run("import os\nprint('bye', flush=True)\nos._exit(0)")
    for code in ("x", "1 + 1"):
        with pytest.raises(SessionLostError, match="earlier"):
            session.run(code)
    assert box.events.types().count("session.lost") == 1
    session.reset()
    assert session.run("1 + 1").result == "2"
    assert "session.reset" in box.events.types()
    assert box.sandbox.exec(["true"]).exit_code == 0  # the sandbox is intact


def test_lost_run_keeps_its_partial_output(session: PythonSession) -> None:
    with pytest.raises(SessionLostError) as info:
        session.run("import os\nprint('partial', flush=True)\nos._exit(3)")
    assert info.value.result is not None
    assert info.value.result.stdout == "partial\n"
    assert "status 3" in str(info.value)


def test_a_crash_is_reported_with_its_fault_trace(session: PythonSession) -> None:
    with pytest.raises(SessionLostError, match="SIGSEGV") as info:
        session.run("import ctypes\nctypes.string_at(0)")
    assert info.value.result is not None
    assert "Fatal Python error" in info.value.result.stderr  # faulthandler's report


def test_interpreter_killed_from_outside(session: PythonSession) -> None:
    pid = session.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), what="the interpreter to die")
    with pytest.raises(SessionLostError, match="signal 9"):
        session.run("1")


def test_a_forked_copy_never_answers_for_the_session(session: PythonSession) -> None:
    got = session.run("import os\npid = os.fork()\npid != 0")
    assert got.result == "True"
    assert session.run("'after fork'").result == "'after fork'"


def test_agent_restart_loses_the_session(session: PythonSession, box: Box) -> None:
    session.run("x = 1")
    pid = session.pid
    assert pid is not None
    box.agent().kill()
    with pytest.raises(SessionLostError, match="agent"):
        session.run("x")
    # The interpreter dies with its agent (parent-death signal), not at the deadline.
    wait_until(lambda: not alive(pid), what="the orphaned interpreter to die")
    session.reset()
    assert session.run("'x' in globals()").result == "False"


def test_close_ends_the_interpreter(box: Box) -> None:
    s = box.sandbox.python_session()
    s.run("import subprocess\nbg = subprocess.Popen(['sleep', '60'])")
    pids = [s.pid, int(s.run("bg.pid").result or "0")]
    s.close()
    s.close()  # idempotent
    assert s.closed
    for pid in pids:
        assert pid is not None
        wait_until(lambda: not alive(pid), what=f"process {pid} to end")  # noqa: B023 - waited at once
    with pytest.raises(SessionLostError, match="closed"):
        s.run("1")
    with pytest.raises(SessionLostError, match="closed"):
        s.reset()
    assert box.events.types().count("session.closed") == 1


def test_several_sessions_are_independent_and_concurrent(box: Box) -> None:
    with box.sandbox.python_session() as a, box.sandbox.python_session() as b:
        assert a.id != b.id and a.pid != b.pid
        a.run("x = 'a'")
        b.run("x = 'b'")
        assert (a.run("x").result, b.run("x").result) == ("'a'", "'b'")
        # a waits for a file only b creates: both must run at once.
        waiting = "import os, time\nwhile not os.path.exists('from-b'):\n    time.sleep(0.01)\n'a done'"
        results: list[SessionResult] = []
        runner = threading.Thread(target=lambda: results.append(a.run(waiting, timeout=WAIT)))
        runner.start()
        assert b.run("open('from-b', 'w').close()\n'b done'").result == "'b done'"
        runner.join(WAIT)
        assert [r.result for r in results] == ["'a done'"]


def test_output_between_runs_arrives_with_the_next_run(session: PythonSession, box: Box) -> None:
    session.run(
        "import os, threading, time\n"
        "def later():\n"
        "    while not os.path.exists('go'):\n"
        "        time.sleep(0.01)\n"
        "    print('late', flush=True)\n"
        "    open('printed', 'w').close()\n"
        "threading.Thread(target=later).start()"
    )
    (box.workspace / "go").touch()
    wait_until((box.workspace / "printed").exists, what="the thread to print")
    got = session.run("print('now')")
    assert got.stdout == "late\nnow\n"


# -- bounds ----------------------------------------------------------------------------


def test_a_huge_result_is_cut_in_the_sandbox(session: PythonSession) -> None:
    got = session.run("'x' * 50_000_000")
    assert got.truncated
    assert got.result is not None and len(got.result) == RESULT_LIMIT
    assert got.result.startswith("'xxx")
    got = session.run("list(range(10_000_000))")
    assert got.truncated and got.result is not None
    assert len(got.result) == RESULT_LIMIT and got.result.startswith("[0, 1, 2")
    got = session.run("class Big:\n    def __repr__(self):\n        return 'y' * 20_000_000\nBig()")
    assert got.truncated and got.result == "y" * RESULT_LIMIT
    assert not session.run("1").truncated


def test_a_huge_traceback_is_cut(session: PythonSession) -> None:
    got = session.run("raise ValueError('z' * 1_000_000)")
    assert got.truncated and got.error is not None
    assert len(got.error) <= limits.ERROR_LIMIT + 100
    assert "characters cut" in got.error
    assert got.error.startswith("Traceback")


def test_output_is_bounded_by_the_policy(tmp_path: Path) -> None:
    b = Box(tmp_path, security_policy=SecurityPolicy(max_output_bytes=100_000))
    try:
        with b.sandbox.python_session() as s:
            got = s.run("import sys\nsys.stdout.write('a' * 3_000_000)\nsys.stdout.flush()\n'end'")
            assert got.truncated
            assert got.stdout == "a" * 100_000
            assert got.result == "'end'"
            # A display item over what is left of the budget is dropped whole.
            got = s.run(
                "class Img:\n    def _repr_png_(self):\n        return b'p' * 200_000\ndisplay(Img())"
            )
            assert got.truncated and got.display == ()
    finally:
        b.sandbox.destroy()


def test_repr_bounds_are_exact_under_the_limit() -> None:
    rec: list[Any] = [1]
    rec.append(rec)
    d: dict[str, Any] = {"b": 1, "a": [2, (3,)], "c": {"x": frozenset({1})}}
    d["self"] = d
    values: list[Any] = [
        0,
        "s'q\"",
        b"\x00\xff",
        bytearray(b"ab"),
        [],
        (),
        (1,),
        (1, 2),
        {},
        set(),
        frozenset(),
        {3, 1, 2},
        frozenset({"a"}),
        rec,
        d,
        [[[]]],
        {1: {2: {3: None}}},
        1.5,
        None,
    ]
    for value in values:
        assert bounded_repr(value) == (repr(value), False), value
    assert bounded_repr("abcdef", 4) == ("'abc", True)
    assert bounded_repr(list(range(100)), 10) == ("[0, 1, 2, ", True)
    assert bounded_repr({"k": "v" * 50}, 8) == ("{'k': 'v", True)
    assert clip("x" * 100, 200) == ("x" * 100, False)
    text, cut = clip("".join(str(i % 10) for i in range(10_000)), 1000)
    assert cut and len(text) <= 1000 + 40 and text.startswith("0123") and text.endswith("789")


# -- rich output -------------------------------------------------------------------------

RICH = """
class Obj:
    def __init__(self, **reprs):
        for name, value in reprs.items():
            setattr(self, '_repr_%s_' % name, lambda value=value: value)
"""


def test_display_items_for_each_mime_type(session: PythonSession) -> None:
    session.run(RICH)
    cases = {
        "png=b'\\x89PNG-data'": ("image/png", b"\x89PNG-data"),
        "jpeg=b'\\xff\\xd8jpeg'": ("image/jpeg", b"\xff\xd8jpeg"),
        "svg='<svg/>'": ("image/svg+xml", b"<svg/>"),
        "html='<b>hi</b>'": ("text/html", b"<b>hi</b>"),
        "markdown='# t'": ("text/markdown", b"# t"),
        "latex='$x$'": ("text/latex", b"$x$"),
        "json={'a': [1]}": ("application/json", b'{"a": [1]}'),
    }
    for args, (mime, data) in cases.items():
        got = session.run(f"Obj({args})")
        assert len(got.display) == 1, args
        item = got.display[0]
        assert (item.mime, item.raw()) == (mime, data)
        assert item.binary == (mime in ("image/png", "image/jpeg"))
        assert got.result is not None and got.result.startswith("<__main__.Obj object")


def test_display_picks_the_richest_representation(session: PythonSession) -> None:
    session.run(RICH)
    got = session.run("Obj(html='<i>h</i>', png=b'img', markdown='m')")
    assert [d.mime for d in got.display] == ["image/png"]
    got = session.run("Obj(png=None, html='<i>h</i>')")  # None means "not this one"
    assert [(d.mime, d.data) for d in got.display] == [("text/html", "<i>h</i>")]
    got = session.run("import base64\nObj(png=base64.b64encode(b'b64').decode())")
    assert got.display[0].raw() == b"b64"  # base64 text from a library is accepted


def test_display_function_and_plain_objects(session: PythonSession) -> None:
    session.run(RICH)
    got = session.run("display(Obj(html='<p>1</p>'), [1, 2], 'text')\nx = 1")
    assert [(d.mime, d.data) for d in got.display] == [
        ("text/html", "<p>1</p>"),
        ("text/plain", "[1, 2]"),
        ("text/plain", "'text'"),
    ]
    assert got.result is None
    assert session.run("[1, 2]").display == ()  # a plain trailing value is only the result
    assert not any(d.result for d in got.display)


def test_the_trailing_values_rich_form_is_marked(session: PythonSession) -> None:
    session.run(RICH)
    got = session.run("display(Obj(html='<p>shown</p>'))\nObj(png=b'tail')")
    assert [(d.mime, d.result) for d in got.display] == [("text/html", False), ("image/png", True)]
    assert got.result is not None and "Obj" in got.result


def test_display_ignores_broken_and_impostor_objects(session: PythonSession) -> None:
    got = session.run(
        "class Broken:\n"
        "    def _repr_html_(self):\n"
        "        raise ValueError('no html')\n"
        "    def _repr_markdown_(self):\n"
        "        return '*md*'\n"
        "Broken()"
    )
    assert [(d.mime, d.data) for d in got.display] == [("text/markdown", "*md*")]
    assert "Broken._repr_html_() raised ValueError: no html" in got.stderr
    got = session.run(
        "class Anything:\n    def __getattr__(self, name):\n        return lambda: '<x>'\nAnything()"
    )
    assert got.display == ()  # claims every attribute: trusted for none
    got = session.run("class WithRepr:\n    def _repr_html_(self):\n        return '<x>'\nWithRepr")
    assert got.display == ()  # the class itself is not an instance


def test_large_display_items_arrive_whole(session: PythonSession) -> None:
    got = session.run(
        "import hashlib, os\n"
        "blob = os.urandom(3 * 1024 * 1024 + 5)\n"
        "class Img:\n    def _repr_png_(self):\n        return blob\n"
        "display(Img())\n"
        "hashlib.sha256(blob).hexdigest()"
    )
    (item,) = got.display
    assert repr(hashlib.sha256(item.raw()).hexdigest()) == got.result


def test_display_items_are_capped_per_run(session: PythonSession) -> None:
    got = session.run(f"for i in range({limits.MAX_DISPLAY_ITEMS + 10}):\n    display(i)")
    assert len(got.display) == limits.MAX_DISPLAY_ITEMS
    assert got.truncated


FAKE_PYPLOT = """
from matplotlib.figure import Figure
_figures = {}
def figure(num=None):
    if num is None:
        num = max(_figures, default=0) + 1
    return _figures.setdefault(num, Figure(num))
def plot(*args):
    fig = figure(max(_figures, default=1))
    fig.lines.append(args)
def get_fignums():
    return sorted(_figures)
def close(which):
    assert which == "all"
    _figures.clear()
def show():
    raise AssertionError("the session replaces show()")
"""
FAKE_FIGURE = """
class Figure:
    def __init__(self, num):
        self.num = num
        self.lines = []
    def savefig(self, buf, format, bbox_inches=None):
        assert format == "png"
        buf.write(b"\\x89PNG fake %d %r" % (self.num, self.lines))
"""


def fake_matplotlib(workspace: Path) -> None:
    """A stand-in with the pyplot calls the session relies on (the image has no matplotlib)."""
    package = workspace / "matplotlib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pyplot.py").write_text(FAKE_PYPLOT)
    (package / "figure.py").write_text(FAKE_FIGURE)


def test_open_figures_are_shown_and_closed_after_each_run(session: PythonSession, box: Box) -> None:
    fake_matplotlib(box.workspace)
    got = session.run("import matplotlib.pyplot as plt\nplt.figure()\nplt.plot(1)\nplt.figure()\n'drawn'")
    assert got.result == "'drawn'"
    assert [(d.mime, d.raw()) for d in got.display] == [
        ("image/png", b"\x89PNG fake 1 [(1,)]"),
        ("image/png", b"\x89PNG fake 2 []"),
    ]
    assert session.run("plt.get_fignums()").result == "[]"  # closed, as in a notebook
    assert session.run("'nothing new'").display == ()
    # A figure is never mistaken for an object displayed before it (ids are reused).
    session.run(RICH)
    got = session.run("for i in range(20):\n    display(Obj(html='<p/>'))\n    plt.figure()")
    assert [d.mime for d in got.display] == ["text/html"] * 20 + ["image/png"] * 20


def test_show_displays_at_once_and_figures_display_once(session: PythonSession, box: Box) -> None:
    fake_matplotlib(box.workspace)
    got = session.run("import matplotlib.pyplot as plt\nfor i in range(3):\n    plt.plot(i)\n    plt.show()")
    assert [d.raw() for d in got.display] == [b"\x89PNG fake 1 [(%d,)]" % i for i in range(3)]
    got = session.run("fig = plt.figure()\ndisplay(fig)\nfig")
    assert len(got.display) == 1  # shown by display(), not again as the value or when closing
    assert got.result is not None and got.result.startswith("<matplotlib.figure.Figure")


def test_real_matplotlib_renders_png(session: PythonSession) -> None:
    pytest.importorskip("matplotlib")
    got = session.run(
        "import matplotlib, matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2])\nplt.show()\nmatplotlib.get_backend()"
    )
    assert got.error is None, got.error
    assert got.result == "'Agg'"
    (item,) = got.display
    assert item.mime == "image/png" and item.raw().startswith(b"\x89PNG\r\n\x1a\n")
    assert got.stderr == ""  # no "non-interactive backend" warning


# -- the guard: secrets, approvals, events --------------------------------------------------


def test_secrets_are_redacted_everywhere(session: PythonSession) -> None:
    got = session.run(
        "s = 's3cr3t-' + 't0ken'\n"
        "print(s)\n"
        "import sys; print(s, file=sys.stderr)\n"
        "class H:\n    def _repr_html_(self):\n        return '<b>' + s + '</b>'\n"
        "display(H())\n"
        "s"
    )
    for text in (got.stdout, got.stderr, got.result, got.display[0].data):
        assert text is not None
        assert "s3cr3t-t0ken" not in text
        assert "[REDACTED]" in text
    got = session.run("raise KeyError(s)")
    assert got.error is not None and "s3cr3t-t0ken" not in got.error and "[REDACTED]" in got.error
    chunks = "".join(c.data for c in session.stream("print(s[:3], end='', flush=True); print(s[3:])"))
    assert chunks == "[REDACTED]\n"  # split across two writes, still caught


def test_each_run_is_approved_with_its_code(session: PythonSession, box: Box) -> None:
    box.approvals.clear()
    session.run("x = 's3cr3t-t0ken'")
    (request,) = box.approvals
    assert request.kind == "session.run"
    assert request.details["session"] == session.id
    assert request.details["code"] == "x = '[REDACTED]'"
    box.deny = True
    with pytest.raises(PolicyDeniedError):
        session.run("y = 1")
    box.deny = False
    assert session.run("'y' in globals()").result == "False"  # the denied code never ran
    assert "policy.denied" in box.events.types()


def test_events_tell_the_session_story(box: Box) -> None:
    with box.sandbox.python_session() as s:
        s.run("x = 1")
        with pytest.raises(ExecutionTimeoutError):
            s.run("while True: pass", timeout=0.3)
        with pytest.raises(SessionLostError):
            s.run("import os; os._exit(1)")
        s.reset()
    kinds = [e.type.value for e in box.events.events if e.type.value.startswith("session.")]
    assert kinds == [
        "session.opened",
        "session.ran",
        "session.timed_out",
        "session.lost",
        "session.opened",
        "session.reset",
        "session.closed",
    ]
    ran = next(e for e in box.events.events if e.type.value == "session.ran")
    assert ran.data["session"] == s.id and ran.data["code"] == "x = 1" and ran.data["ok"] is True


def test_destroyed_sandbox(box: Box) -> None:
    s = box.sandbox.python_session()
    box.sandbox.destroy()
    with pytest.raises(Exception, match="destroyed"):
        s.run("1")
    s.close()


# -- protocol checks (host side) ------------------------------------------------------------


def test_parse_helpers() -> None:
    info = parse_session_opened({"t": "done", "session": 3, "pid": 99, "python": "3.11.2"})
    assert (info.session, info.pid, info.python) == (3, 99, "3.11.2")
    for bad in ({"t": "done", "session": "3", "pid": 9, "python": ""}, {"t": "pong"}, {"t": "done"}):
        with pytest.raises(ProtocolViolation):
            parse_session_opened(bad)
    ran = parse_session_ran({"t": "ran", "timed_out": True, "duration": 1.5, "lost": 1, "reason": "r"})
    assert ran == RawSessionRun(True, False, False, 1.5, lost=False, reason="r")  # only True is true
    for bad_ran in ({"duration": -1}, {"duration": "1"}, {"duration": 1e9}, {"reason": 5}):
        with pytest.raises(ProtocolViolation):
            parse_session_ran({"t": "ran", **bad_ran})
    assert parse_display({"t": "display", "mime": "image/png", "final": True}) == ("image/png", True)
    for mime in ("application/x-evil", "text/html; charset=x", None, 5):
        with pytest.raises(ProtocolViolation):
            parse_display({"t": "display", "mime": mime})
    assert parse_value({"t": "value", "name": "error"}, b"\xff") == RawValue("error", "\ufffd")
    with pytest.raises(ProtocolViolation):
        parse_value({"t": "value", "name": "stdout"}, b"")
    with pytest.raises(ProtocolViolation):
        parse_value({"t": "value", "name": "result"}, b"x" * (MAX_SESSION_VALUE + 1))


class Peer(BasePeer):
    """A hand-played agent that has said hello with the session capability."""

    def __init__(self) -> None:
        super().__init__(WAIT)
        self.hello(agent="9", pid=42, python="3", caps=["exec", "session"])
        self.channel = Channel.connect(self.stream, None, timeout=5)

    def run(self, *frames: tuple[dict[str, Any], bytes], max_output: int = 1 << 20) -> list[Any]:
        """Start a run, answer it with ``frames`` (id filled in); return the host's events."""
        handle = self.channel.start_session_run(1, b"code", timeout=None, max_output=max_output)
        request, body = self.receive()
        assert (request["t"], request["session"], body) == ("session.run", 1, b"code")
        for header, data in frames:
            self.send({**header, "id": request["id"]}, data)
        events: list[Any] = []
        while handle.result is None:
            events.append(handle.next_event(time.monotonic() + WAIT))
        return events


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    try:
        yield p
    finally:
        p.close()


RAN = ({"t": "ran", "duration": 0.1}, b"")


def test_peer_display_pieces_are_reassembled(peer: Peer) -> None:
    events = peer.run(
        ({"t": "display", "mime": "image/png", "final": False}, b"ab"),
        ({"t": "display", "mime": "image/png", "final": True}, b"cd"),
        ({"t": "value", "name": "result"}, b"'r'"),
        RAN,
    )
    assert events[:2] == [RawDisplay("image/png", b"abcd"), RawValue("result", "'r'")]
    assert isinstance(events[2], RawSessionRun)
    assert peer.channel.alive


def test_peer_display_over_budget_is_dropped_whole(peer: Peer) -> None:
    handle_events = peer.run(
        ({"t": "out", "fd": 1}, b"o" * 60),
        ({"t": "display", "mime": "image/png", "final": False}, b"x" * 30),
        ({"t": "display", "mime": "image/png", "final": True}, b"y" * 30),
        ({"t": "display", "mime": "text/plain", "final": True}, b"ok"),
        RAN,
        max_output=100,
    )
    assert handle_events[0] == (1, b"o" * 60)
    assert handle_events[1] == RawDisplay("text/plain", b"ok")
    assert peer.channel.alive


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([({"t": "display", "mime": "application/x-evil", "final": True}, b"")], id="bad-mime"),
        pytest.param(
            [
                ({"t": "display", "mime": "image/png", "final": False}, b""),
                ({"t": "display", "mime": "text/html", "final": True}, b""),
            ],
            id="mime-changes-midway",
        ),
        pytest.param(
            [({"t": "display", "mime": "image/png", "final": False}, b""), RAN], id="ends-inside-an-item"
        ),
        pytest.param(
            [({"t": "value", "name": "result"}, b"1"), ({"t": "value", "name": "result"}, b"2")],
            id="two-results",
        ),
        pytest.param([({"t": "value", "name": "result"}, b"x" * (MAX_SESSION_VALUE + 1))], id="huge-value"),
        pytest.param([({"t": "out", "fd": 7}, b"x")], id="bad-fd"),
        pytest.param([({"t": "exit", "code": 0}, b"")], id="wrong-frame"),
        pytest.param([({"t": "ran", "duration": -5}, b"")], id="bad-duration"),
    ],
)
def test_peer_violations_close_the_channel(peer: Peer, frames: list[tuple[dict[str, Any], bytes]]) -> None:
    with pytest.raises(ChannelError, match="protocol"):
        peer.run(*frames)
    assert not peer.channel.alive


@pytest.mark.parametrize(
    ("code", "error"),
    [("session_lost", SessionLostError), ("no_session", SessionLostError), ("busy", ChannelError)],
)
def test_peer_error_codes(peer: Peer, code: str, error: type[Exception]) -> None:
    with pytest.raises(error, match="msg"):
        peer.run(({"t": "error", "code": code, "message": "msg"}, b""))
    assert peer.channel.alive


def test_peer_session_calls(peer: Peer) -> None:
    results: list[Any] = []

    def open_one() -> None:
        try:
            results.append(peer.channel.open_session(time.monotonic() + WAIT))
        except Exception as exc:
            results.append(exc)

    t = threading.Thread(target=open_one)
    t.start()
    request, _ = peer.receive()
    assert request["t"] == "session.open"
    peer.send({"t": "error", "id": request["id"], "code": "spawn", "message": "no python3"})
    t.join(WAIT)
    assert isinstance(results[0], SessionLostError) and "no python3" in str(results[0])
    t = threading.Thread(target=open_one)
    t.start()
    request, _ = peer.receive()
    peer.send({"t": "done", "id": request["id"], "session": 5, "pid": "nope", "python": "3"})
    t.join(WAIT)
    assert isinstance(results[1], ChannelError)
    assert not peer.channel.alive


def oldest_python() -> str | None:
    """A working Python 3.8 interpreter on this machine, if any (the agent's oldest target)."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    candidates.append(shutil.which("python3.8") or "")
    for path in filter(None, candidates):
        try:
            probe = subprocess.run(
                [path, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True
            )
        except OSError:
            continue
        if probe.stdout.strip() == b"(3, 8)":
            return path
    return None


def test_sessions_work_on_python_3_8(tmp_path: Path) -> None:
    python = oldest_python()
    if python is None:
        pytest.skip("no Python 3.8 on this machine")
    agent = LocalAgent(str(tmp_path), python=python)
    try:
        channel = Channel.connect(agent.stream, launch.bundle(), timeout=WAIT)
        info = channel.open_session(time.monotonic() + WAIT)
        assert info.python.startswith("3.8.")

        def run(code: str, timeout: float | None = None) -> list[Any]:
            handle = channel.start_session_run(
                info.session, code.encode(), timeout=timeout, max_output=1 << 20
            )
            events = []
            while handle.result is None:
                events.append(handle.next_event(time.monotonic() + WAIT))
            return events

        assert run("x = 41\nprint('p')\nx + 1")[:2] == [(1, b"p\n"), RawValue("result", "42")]
        error = run("1 / 0")[0]
        assert isinstance(error, RawValue) and "ZeroDivisionError" in error.text
        interrupted = run("while True:\n    pass", timeout=0.3)
        assert isinstance(interrupted[-1], RawSessionRun) and interrupted[-1].timed_out
        shown = run("class H:\n    def _repr_html_(self):\n        return '<b/>'\nH()")
        assert shown[0] == RawDisplay("text/html", b"<b/>", main=True)  # the trailing value's rich form
        assert run("await __import__('asyncio').sleep(0, 'aw')")[0] == RawValue("result", "'aw'")
        channel.close()
    finally:
        agent.kill()


def test_display_item_type() -> None:
    item = DisplayItem("image/png", "aGk=")
    assert item.binary and item.raw() == b"hi"
    text = DisplayItem("text/html", "<b>é</b>")
    assert not text.binary and text.raw() == "<b>é</b>".encode()
    ok = SessionResult(stdout="", stderr="", result="1")
    assert ok.check() is ok
    with pytest.raises(ExecutionTimeoutError):
        SessionResult(stdout="", stderr="", timed_out=True).check()
