"""Named Python sessions and ``Sandbox.sessions()`` in real sandboxes, on runc and on gVisor.

The in-sandbox agent keeps the names: a name finds the live interpreter
that has it, an anonymous session is always a new one, the list shows what
lives and drops what was closed or ended, and a new agent (after the old
one was killed) knows none of the old names.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentnest import (
    AsyncSandbox,
    ChannelError,
    ConfigurationError,
    PythonSessionInfo,
    Sandbox,
    SessionLostError,
)

from .helpers import processes

pytestmark = pytest.mark.timeout(240)


def interpreters(sb: Sandbox) -> list[int]:
    """How many session interpreters run in the sandbox (one entry each)."""
    return [1 for argv in processes(sb) if "-c" in argv and any("agentnest_session" in a for a in argv)]


@pytest.fixture
def sandbox(shared_sandbox: Sandbox) -> Iterator[Sandbox]:
    """The module's sandbox of this runtime; each test closes what it opened."""
    assert shared_sandbox.sessions() == ()
    yield shared_sandbox
    assert shared_sandbox.sessions() == (), "a test left a session open"


def test_the_same_name_reaches_the_same_interpreter(sandbox: Sandbox) -> None:
    s1 = sandbox.python_session(name="main")
    s1.run("x = 41")
    assert sandbox.python_session(name="main").run("x + 1").result == "42"
    assert sandbox.python_session(name="main") is s1
    assert len(interpreters(sandbox)) == 1
    s1.close()


def test_anonymous_sessions_are_distinct(sandbox: Sandbox) -> None:
    with sandbox.python_session() as a, sandbox.python_session() as b:
        a.run("y = 1")
        got = b.run("y")
        assert got.error is not None and "NameError" in got.error
        assert a.id != b.id and a.pid != b.pid
        assert {i.id for i in sandbox.sessions()} == {a.id, b.id}
        assert [i.name for i in sandbox.sessions()] == [None, None]


def test_sessions_lists_what_lives_and_drops_what_was_closed(sandbox: Sandbox) -> None:
    before = time.time()
    main = sandbox.python_session(name="main")
    other = sandbox.python_session()
    listed = sandbox.sessions()
    assert all(isinstance(i, PythonSessionInfo) for i in listed)
    assert [(i.name, i.id, i.pid, i.busy) for i in listed] == [
        ("main", main.id, main.pid, False),
        (None, other.id, other.pid, False),
    ]
    # The sandbox's clock and the host's are the same kernel's here.
    assert all(before - 5 <= i.started <= time.time() + 5 for i in listed)
    other.close()
    assert [i.name for i in sandbox.sessions()] == ["main"]
    main.close()
    assert sandbox.sessions() == ()
    # The name is free again: a new interpreter, without the old state.
    again = sandbox.python_session(name="main")
    assert again is not main and again.run("'x' in globals()").result == "False"
    again.close()


def test_busy_while_code_runs(sandbox: Sandbox) -> None:
    with sandbox.python_session(name="worker") as s:
        code = (
            "import os, time\nprint('go', flush=True)\n"
            "while not os.path.exists('names-go'):\n    time.sleep(0.01)"
        )
        stream = s.stream(code, timeout=60)
        chunks = iter(stream)
        assert next(chunks).data == "go\n"
        assert [(i.name, i.busy) for i in sandbox.sessions()] == [("worker", True)]
        sandbox.write_file("names-go", "")
        assert list(chunks) == []
        assert [(i.name, i.busy) for i in sandbox.sessions()] == [("worker", False)]
        sandbox.remove_file("names-go")


def test_an_ended_interpreter_starts_again_under_its_name(sandbox: Sandbox) -> None:
    s = sandbox.python_session(name="main")
    s.run("x = 1")
    with pytest.raises(SessionLostError):
        s.run("import os; os._exit(3)")
    assert sandbox.sessions() == ()
    assert sandbox.python_session(name="main") is s
    assert s.run("'x' in globals()").result == "False"
    assert [i.name for i in sandbox.sessions()] == ["main"]
    s.close()


@pytest.mark.parametrize("name", ["", "two words", "-x", "x" * 65, "ünï", "a/b", 7])
def test_a_bad_name_is_refused_clearly(sandbox: Sandbox, name: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"session name .* is invalid: use 1 to 64 letters"):
        sandbox.python_session(name=name)
    assert sandbox.sessions() == ()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_async_face(sandbox: Sandbox) -> None:
    sb = AsyncSandbox(sandbox)
    s1 = await sb.python_session(name="main")
    await s1.run("x = 41")
    s2 = await sb.python_session(name="main")
    assert s2.name == "main" and s2.id == s1.id
    assert (await s2.run("x + 1")).result == "42"
    anon = await sb.python_session()
    assert anon.name is None and anon.id != s1.id
    assert [(i.name, i.id) for i in await sb.sessions()] == [("main", s1.id), (None, anon.id)]
    with pytest.raises(ConfigurationError, match="session name"):
        await sb.python_session(name="no spaces")
    await anon.close()
    await s1.close()
    assert await sb.sessions() == ()


def test_a_new_agent_knows_no_old_names(sandbox: Sandbox) -> None:
    old = sandbox.python_session(name="main")
    old.run("x = 1")
    with pytest.raises(ChannelError):
        sandbox.exec_shell("kill -9 $PPID", timeout=60)  # the agent: the next call starts a new one
    with pytest.raises(SessionLostError, match="agent"):
        old.run("x")
    assert sandbox.sessions() == ()
    new = sandbox.python_session(name="main")
    assert new is not old and new.run("'x' in globals()").result == "False"
    new.close()
    old.close()
