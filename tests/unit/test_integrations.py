"""Integrations (SandboxRunner, LangChain, smolagents) and git helpers, without an engine.

``LocalBackend`` below runs each sandbox's real agent as a plain child process
in a temporary directory (``doubles.local_agent.LocalAgent``), so the
runner, the guard, the channel and the Python sessions run for real.  The
frameworks are the real libraries: LangChain's ``StructuredTool`` is invoked
directly and smolagents' ``CodeAgent`` runs with a scripted ``Model`` that
returns fixed code (no model is ever called).  Nothing here is isolated: the
code is the test's own.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from doubles.local_agent import LocalBackend

from agentnest import (
    AsyncSandbox,
    ConfigurationError,
    MemoryObserver,
    PolicyDeniedError,
    Sandbox,
    SandboxDestroyedError,
    Secret,
)
from agentnest.git import (
    DiffFile,
    GitError,
    GitWorkspace,
    StatusEntry,
    _parse_numstat,
    _parse_status,
    _summary,
)
from agentnest.guard import ApprovalRequest
from agentnest.integrations import RunOutput, SandboxRunner
from agentnest.integrations._text import bound_text
from agentnest.runtime.base import Capability

pytestmark = pytest.mark.timeout(120)

WAIT = 15.0
TOKEN = "tok-3x4mpl3-V4lu3-9f2c"  # a test secret


#: What these tests' backend claims (it enforces none of it).
CAPS = frozenset({Capability.NETWORK_DENIED, Capability.RESOURCE_LIMITS, Capability.READ_ONLY_ROOT})


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path, CAPS, environment=True)


@pytest.fixture
def sandbox(backend: LocalBackend) -> Iterator[Sandbox]:
    with Sandbox("local", 300, backend=backend, environment={"TOKEN": Secret(TOKEN)}) as sb:
        yield sb


@pytest.fixture
def runner(sandbox: Sandbox) -> Iterator[SandboxRunner]:
    with SandboxRunner(sandbox, timeout=30) as r:
        yield r


def deny(kind: str) -> Any:
    def hook(request: ApprovalRequest) -> bool:
        return request.kind != kind

    return hook


# -- SandboxRunner: Python ------------------------------------------------------------------


def test_python_state_persists_and_the_trailing_value_is_shown(runner: SandboxRunner) -> None:
    first = runner.run_python("import math\nr = 2\nprint('radius', r)")
    assert first.ok and first.text == "radius 2" and first.result is None
    second = runner.run_python("math.pi * r ** 2")
    assert second.ok and second.result == repr(3.141592653589793 * 4)
    assert second.text == f"Out: {second.result}"
    assert isinstance(second, RunOutput) and str(second) == second.text


def test_python_errors_are_answers_and_keep_state(runner: SandboxRunner) -> None:
    runner.run_python("kept = 41")
    out = runner.run_python("print('before')\n1 / 0")
    assert not out.ok and out.error is not None and "ZeroDivisionError" in out.error
    assert out.text.startswith("before\nTraceback") and out.text.rstrip().endswith("division by zero")
    syntax = runner.run_python("def (:")
    assert not syntax.ok and "SyntaxError" in syntax.text
    assert runner.run_python("kept + 1").result == "42"


def test_python_timeout_interrupts_and_keeps_variables(runner: SandboxRunner) -> None:
    runner.run_python("kept = 'yes'")
    out = runner.run_python("print('looping', flush=True)\nwhile True: pass", timeout=0.5)
    assert out.timed_out and not out.ok
    assert "looping" in out.text and "timed out after 0.5s" in out.text and "KeyboardInterrupt" in out.text
    assert runner.run_python("kept").result == "'yes'"


def test_dead_interpreter_is_replaced_and_the_model_is_told(runner: SandboxRunner) -> None:
    runner.run_python("lost = 1")
    out = runner.run_python("import os\nprint('bye', flush=True)\nos._exit(3)")
    assert not out.ok and "bye" in out.text
    assert "interpreter died" in out.text and "variables" in out.text
    after = runner.run_python("'lost' in globals()")
    assert after.ok and after.result == "False"


def test_output_is_bounded_head_and_tail(sandbox: Sandbox) -> None:
    runner = SandboxRunner(sandbox, max_output_chars=1000)
    out = runner.run_python("print('HEAD' + 'x' * 100000 + 'TAIL')")
    assert out.truncated and out.ok
    assert len(out.text) < 1100 and out.text.startswith("HEAD") and out.text.endswith("TAIL")
    assert "characters cut" in out.text
    assert len(out.stdout) > 100000  # the structured field keeps what the sandbox sent


def test_bound_text() -> None:
    assert bound_text("short", 10) == ("short", False)
    text, cut = bound_text("a" * 50 + "b" * 50, 30)
    assert cut and text.startswith("a" * 10) and text.endswith("b" * 20) and "[70 characters cut]" in text


def test_secrets_are_redacted_everywhere_the_runner_answers(runner: SandboxRunner) -> None:
    py = runner.run_python("import os\nv = os.environ['TOKEN']\nprint(v)\nv")
    assert TOKEN not in py.text and py.text.count("[REDACTED]") == 2
    err = runner.run_python("raise ValueError(v)")
    assert TOKEN not in err.text and "ValueError: [REDACTED]" in err.text
    sh = runner.run_shell('echo "$TOKEN" >&2; printf %s "$TOKEN" | base64')
    assert TOKEN not in sh.text and sh.text == "[REDACTED]\n[REDACTED]"
    runner.run_shell('printf %s "$TOKEN" > token.txt')
    assert runner.read_file("token.txt").text == "[REDACTED]"


def test_runner_refuses_non_text_from_the_program(runner: SandboxRunner, sandbox: Sandbox) -> None:
    with pytest.raises(ConfigurationError):
        runner.run_python(b"1")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        runner.run_shell(["ls"])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        SandboxRunner(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        SandboxRunner(sandbox, timeout=0)


# -- SandboxRunner: shell and files -----------------------------------------------------------


def test_shell_exit_codes_and_timeouts_are_answers(runner: SandboxRunner) -> None:
    out = runner.run_shell("echo out; echo err >&2; exit 3")
    assert not out.ok and out.exit_code == 3 and (out.stdout, out.stderr) == ("out\n", "err\n")
    assert out.text == "out\nerr\n[exit code 3]"
    ok = runner.run_shell("true")
    assert ok.ok and ok.text == "(no output)" and ok.exit_code == 0
    slow = runner.run_shell("echo started; sleep 30", timeout=0.5)
    assert slow.timed_out and not slow.ok and "started" in slow.text and "killed" in slow.text
    assert runner.run_shell("echo alive").text == "alive"


def test_files_round_trip_and_bad_paths_are_answers(runner: SandboxRunner, sandbox: Sandbox) -> None:
    wrote = runner.write_file("notes/a.txt", "héllo\n")
    assert wrote.ok and wrote.text == "wrote 7 bytes to notes/a.txt"
    assert sandbox.read_file("notes/a.txt") == "héllo\n"
    assert runner.read_file("notes/a.txt").text == "héllo\n"
    missing = runner.read_file("nope.txt")
    assert not missing.ok and missing.text.startswith("cannot read 'nope.txt'")
    outside = runner.write_file("../../etc/x", "no")
    assert not outside.ok and "outside the workspace" in outside.text
    sandbox.write_file("bin.dat", b"\xff\xfe\x00")
    assert not runner.read_file("bin.dat").ok


def test_denials_are_answers_by_default_and_nothing_runs(backend: LocalBackend) -> None:
    events = MemoryObserver()
    with Sandbox("local", 120, backend=backend, approval_hook=deny("exec"), observers=[events]) as sb:
        runner = SandboxRunner(sb)
        out = runner.run_shell("touch ran.txt")
        assert out.denied and not out.ok and out.text.startswith("denied: ")
        assert not sb.exists("ran.txt")
        assert [e for e in events.events if e.type.value == "policy.denied"]
        assert runner.run_python("1 + 1").result == "2"  # sessions are a different kind
        with pytest.raises(PolicyDeniedError):
            SandboxRunner(sb, raise_denied=True).run_shell("touch ran.txt")
    with Sandbox("local", 120, backend=backend, approval_hook=deny("session.run")) as sb:
        out = SandboxRunner(sb).run_python("open('ran.txt', 'w').close()")
        assert out.denied and not sb.exists("ran.txt")
    with Sandbox("local", 120, backend=backend, approval_hook=deny("file.write")) as sb:
        assert SandboxRunner(sb).write_file("a.txt", "x").denied


def test_a_destroyed_sandbox_raises(sandbox: Sandbox) -> None:
    runner = SandboxRunner(sandbox)
    runner.run_python("x = 1")
    sandbox.destroy()
    calls: list[Callable[[], object]] = [
        lambda: runner.run_python("x"),
        lambda: runner.run_shell("true"),
        lambda: runner.read_file("a"),
        lambda: runner.write_file("a", "b"),
    ]
    for call in calls:
        with pytest.raises(SandboxDestroyedError):
            call()


def test_calls_from_threads_take_turns(runner: SandboxRunner) -> None:
    runner.run_python("import time\nlog = []")
    results: list[RunOutput] = []

    def call(i: int) -> None:
        results.append(runner.run_python(f"log.append({i}); time.sleep(0.05); len(log)"))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert all(r.ok for r in results), [r.text for r in results]
    assert sorted(str(r.result) for r in results) == ["1", "2", "3", "4"]


def test_describe_names_the_limits(runner: SandboxRunner) -> None:
    text = runner.describe("python")
    assert "persistent" in text and "30 seconds" in text and "no network" in text and "/workspace" in text
    assert "/bin/sh" in runner.describe("shell")
    with pytest.raises(ConfigurationError):
        runner.describe("ruby")  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_async_calls_and_cancellation_interrupts(backend: LocalBackend, anyio_backend: str) -> None:
    events = MemoryObserver()
    sandbox = Sandbox("local", 120, backend=backend, observers=[events])
    runner = SandboxRunner(AsyncSandbox(sandbox), timeout=60)
    assert runner.sandbox is sandbox
    assert (await runner.arun_python("kept = 6 * 7")).ok
    assert (await runner.arun_shell("echo hi")).text == "hi"
    assert (await runner.awrite_file("f.txt", "data")).ok
    assert (await runner.aread_file("f.txt")).text == "data"
    code = "import pathlib\npathlib.Path('started').touch()\nwhile True: pass\n"
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.arun_python, code)
            deadline = time.monotonic() + WAIT
            while not sandbox.exists("started"):
                assert time.monotonic() < deadline, "the code did not start"
                await anyio.sleep(0.01)
            scope.cancel()
    # The next call waits for the interrupted one: without the interrupt it would take the 60 s timeout.
    start = time.monotonic()
    after = await runner.arun_python("kept")
    assert after.result == "42" and time.monotonic() - start < WAIT
    ran = [e.data for e in events.events if e.type.value == "session.ran" and "while True" in e.data["code"]]
    assert len(ran) == 1 and ran[0]["ok"] is False
    sandbox.destroy()


# -- LangChain ----------------------------------------------------------------------------------


def test_langchain_python_tool(sandbox: Sandbox) -> None:
    pytest.importorskip("langchain_core", reason="the dev extra installs langchain-core")
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import StructuredTool

    from agentnest.integrations.langchain import build_langchain_tool

    tool = build_langchain_tool(sandbox)
    assert isinstance(tool, StructuredTool) and tool.name == "python_sandbox"
    assert "persistent" in tool.description
    schema = tool.tool_call_schema.model_json_schema()  # type: ignore[union-attr]
    assert schema["required"] == ["code"] and schema["properties"]["code"]["type"] == "string"
    assert tool.invoke({"code": "x = 6 * 7\nprint('set')"}) == "set"
    assert tool.invoke({"code": "x"}) == "Out: 42"
    assert "ZeroDivisionError" in tool.invoke({"code": "1/0"})
    message = tool.invoke(
        {"name": "python_sandbox", "args": {"code": "x + 1"}, "id": "call-1", "type": "tool_call"}
    )
    assert (
        isinstance(message, ToolMessage) and message.content == "Out: 43" and message.tool_call_id == "call-1"
    )
    assert anyio.run(tool.ainvoke, {"code": "x - 1"}) == "Out: 41"
    assert "[REDACTED]" in tool.invoke({"code": "import os; os.environ['TOKEN']"})


def test_langchain_shell_tool_denials_and_names(backend: LocalBackend) -> None:
    pytest.importorskip("langchain_core", reason="the dev extra installs langchain-core")
    from langchain_core.tools import StructuredTool

    from agentnest.integrations.langchain import build_langchain_tool, build_langchain_tools

    with Sandbox("local", 120, backend=backend, approval_hook=deny("exec")) as sb:
        shell = build_langchain_tool(sb, language="shell", name="sh", description="run it")
        assert (shell.name, shell.description) == ("sh", "run it")
        assert list(shell.args) == ["command"]
        assert shell.invoke({"command": "touch x"}).startswith("denied: ")
        assert not sb.exists("x")
        with pytest.raises(ConfigurationError):
            build_langchain_tool(sb, language="ruby")  # type: ignore[arg-type]
    with Sandbox("local", 120, backend=backend) as sb:
        tools = build_langchain_tools(SandboxRunner(sb), prefix="sb_")
        assert all(isinstance(t, StructuredTool) for t in tools)
        by_name = {t.name: t for t in tools}
        assert sorted(by_name) == ["sb_python_sandbox", "sb_read_file", "sb_shell_sandbox", "sb_write_file"]
        assert (
            by_name["sb_write_file"].invoke({"path": "a.py", "content": "V = 7\n"}) == "wrote 6 bytes to a.py"
        )
        assert by_name["sb_shell_sandbox"].invoke({"command": "cat a.py"}) == "V = 7"
        assert by_name["sb_python_sandbox"].invoke({"code": "exec(open('a.py').read()); V"}) == "Out: 7"
        assert by_name["sb_python_sandbox"].invoke({"code": "V * 2"}) == "Out: 14"  # one shared session
        assert by_name["sb_read_file"].invoke({"path": "a.py"}) == "V = 7\n"


# -- smolagents -----------------------------------------------------------------------------------


def scripted_model(replies: list[str]) -> Any:
    """A smolagents Model that returns fixed replies: no network, no model call."""
    from smolagents import ChatMessage, MessageRole, Model  # type: ignore[import-untyped]
    from smolagents.models import TokenUsage  # type: ignore[import-untyped]

    class Scripted(Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(model_id="scripted")
            self.replies = list(replies)
            self.prompts: list[str] = []

        def generate(self, messages: list[Any], **kwargs: Any) -> Any:
            texts = []
            for message in messages:
                content = message.content if hasattr(message, "content") else message["content"]
                for part in content if isinstance(content, list) else [{"text": content}]:
                    texts.append(str(part.get("text", "")))
            self.prompts.append("\n".join(texts))
            return ChatMessage(
                role=MessageRole.ASSISTANT, content=self.replies.pop(0), token_usage=TokenUsage(1, 1)
            )

    return Scripted()


def test_smolagents_code_agent_runs_its_code_and_tools_in_the_sandbox(sandbox: Sandbox) -> None:
    pytest.importorskip("smolagents", reason="the dev extra installs smolagents")
    from smolagents import CodeAgent, tool

    from agentnest.integrations.smolagents import AgentNestExecutor

    @tool  # type: ignore[untyped-decorator]
    def where() -> int:
        """Return the process id this tool runs in."""
        import os

        return os.getpid()

    sandbox_pid = int(sandbox.exec_shell("echo $PPID").stdout)  # the agent: parent of a shell
    model = scripted_model(
        [
            "Thought: compute.\n<code>\nimport os\ntotal = sum(range(10)) * n\n"
            "print('tool ran in', where(), 'code ran in', os.getpid())\ntotal\n</code>",
            "Thought: oops.\n<code>\nundefined_name\n</code>",
            "Thought: done.\n<code>\nfinal_answer({'total': total, 'tool_pid': where()})\n</code>",
        ]
    )
    executor = AgentNestExecutor(sandbox)
    agent = CodeAgent(tools=[where], model=model, executor=executor, max_steps=5)
    answer = agent.run("Sum the range", additional_args={"n": 3})
    assert answer["total"] == 135
    # The tool ran inside the sandbox's session interpreter, not on the host.
    assert answer["tool_pid"] != os.getpid()
    assert executor._session is not None
    session_pid = executor._session.pid
    assert answer["tool_pid"] == session_pid and session_pid != sandbox_pid
    # The model read the sandbox's output and the error of the second step.
    assert "tool ran in" in model.prompts[1] and "Last output from code snippet:\n135" in model.prompts[1]
    assert "NameError: name 'undefined_name' is not defined" in model.prompts[2]
    executor.cleanup()
    assert not sandbox.destroyed  # a sandbox passed in stays with its owner


def test_smolagents_final_answer_is_redacted_and_json_only(sandbox: Sandbox) -> None:
    pytest.importorskip("smolagents", reason="the dev extra installs smolagents")
    from smolagents import CodeAgent

    from agentnest.integrations.smolagents import AgentNestExecutor

    with pytest.raises(ConfigurationError, match="unpickle"):
        AgentNestExecutor(sandbox, allow_pickle=True)
    model = scripted_model(["<code>\nimport os\nfinal_answer('key=' + os.environ['TOKEN'])\n</code>"])
    agent = CodeAgent(tools=[], model=model, executor=AgentNestExecutor(sandbox), max_steps=2)
    assert agent.run("leak it") == "key=[REDACTED]"


def test_smolagents_executor_errors_timeouts_and_lost_interpreters(sandbox: Sandbox) -> None:
    pytest.importorskip("smolagents", reason="the dev extra installs smolagents")
    from smolagents import FinalAnswerTool
    from smolagents.utils import AgentError  # type: ignore[import-untyped]

    from agentnest.integrations.smolagents import AgentNestExecutor

    executor = AgentNestExecutor(sandbox, ["json"])
    executor.timeout = 1.0  # for the steps only: the package check above may take longer under load
    executor.send_variables({"seed": [1, 2]})
    executor.send_tools({"final_answer": FinalAnswerTool()})
    out = executor("print('hi')\nseed + [3]")
    assert (out.output, out.logs, out.is_final_answer) == ("[1, 2, 3]", "hi\n", False)
    with pytest.raises(AgentError, match="timed out after 1s"):
        executor("while True: pass")
    assert executor("seed").output == "[1, 2]"
    with pytest.raises(AgentError, match="interpreter died"):
        executor("import os\nos._exit(1)")
    # A fresh interpreter got the variables and the tools again.
    assert executor("seed").output == "[1, 2]"
    final = executor("final_answer({'a': (1, 2)})")
    assert final.is_final_answer and final.output == {"a": (1, 2)}


def test_smolagents_missing_imports_are_refused(sandbox: Sandbox) -> None:
    pytest.importorskip("smolagents", reason="the dev extra installs smolagents")
    from agentnest.integrations.smolagents import AgentNestExecutor

    with pytest.raises(ConfigurationError, match="lacks no_such_module_xyz"):
        AgentNestExecutor(sandbox, ["json", "no_such_module_xyz"])


def test_smolagents_executor_can_own_its_sandbox(backend: LocalBackend) -> None:
    pytest.importorskip("smolagents", reason="the dev extra installs smolagents")
    from agentnest.integrations.smolagents import AgentNestExecutor

    executor = AgentNestExecutor(image="local", timeout=5, backend=backend)
    assert executor("1 + 1").output == "2"
    executor.cleanup()
    assert executor.sandbox.destroyed and backend.agents == {}
    with pytest.raises(ConfigurationError):
        AgentNestExecutor(executor.sandbox, image="local")


# -- lazy imports -----------------------------------------------------------------------------------


def test_import_loads_no_framework_and_missing_ones_name_the_extra() -> None:
    # As in 0.3.0, the framework modules import without their framework (and
    # 0.3.0's SandboxExecutor needs none); building what needs one raises.
    check = (
        "import sys, agentnest, agentnest.integrations\n"
        "import agentnest.integrations.langchain, agentnest.integrations.smolagents\n"
        "assert 'langchain_core' not in sys.modules and 'smolagents' not in sys.modules, 'eager'\n"
        "sys.modules['langchain_core'] = None\n"
        "sys.modules['smolagents'] = None\n"
        "from agentnest.errors import AgentNestError, MissingDependencyError\n"
        "from agentnest.integrations.smolagents import SandboxExecutor, SandboxRunner\n"
        "from agentnest.integrations.langchain import build_langchain_tool, build_langchain_tools\n"
        "def smolagents():\n"
        "    from agentnest.integrations.smolagents import AgentNestExecutor\n"
        "calls = ((build_langchain_tool, 'agentnest[langchain]', 'langchain-core'),\n"
        "         (build_langchain_tools, 'agentnest[langchain]', 'langchain-core'),\n"
        "         (smolagents, 'agentnest[smolagents]', 'smolagents'))\n"
        "for call, extra, name in calls:\n"
        "    try:\n"
        "        call()\n"
        "    except MissingDependencyError as exc:\n"
        "        assert isinstance(exc, ImportError) and isinstance(exc, AgentNestError), exc\n"
        "        assert extra in str(exc) and name in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError(repr(call) + ' worked')\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr


# -- git: parsing -------------------------------------------------------------------------------------


def test_parse_status_porcelain_v2() -> None:
    text = "\0".join(
        [
            "# branch.oid 1234abcd",
            "# branch.head main",
            "# branch.upstream origin/main",
            "# branch.ab +2 -1",
            "1 .M N... 100644 100644 100644 aaa bbb src/a file.py",
            "1 A. N... 000000 100644 100644 000 ccc new.txt",
            "2 R. N... 100644 100644 100644 ddd ddd R100 moved.py",
            "old.py",
            "u UU N... 100644 100644 100644 100644 e f g conflict.txt",
            "? untracked dir/x.txt",
            "",
        ]
    )
    status = _parse_status(text)
    assert (status.branch, status.head, status.upstream, status.ahead, status.behind) == (
        "main",
        "1234abcd",
        "origin/main",
        2,
        1,
    )
    assert status.entries == (
        StatusEntry("src/a file.py", ".", "M"),
        StatusEntry("new.txt", "A", "."),
        StatusEntry("moved.py", "R", ".", "old.py"),
        StatusEntry("conflict.txt", "U", "U"),
        StatusEntry("untracked dir/x.txt", "?", "?"),
    )
    assert [e.staged for e in status.entries] == [False, True, True, True, False]
    assert status.entries[3].conflicted and status.entries[4].untracked and not status.clean
    empty = _parse_status("# branch.oid (initial)\0# branch.head (detached)\0")
    assert empty.head is None and empty.branch is None and empty.clean


def test_parse_numstat() -> None:
    text = "3\t1\ta.py\0-\t-\timg.png\0" + "0\t0\t\0old name.py\0new name.py\0"
    assert _parse_numstat(text) == (
        DiffFile("a.py", 3, 1),
        DiffFile("img.png", None, None),
        DiffFile("new name.py", 0, 0, "old name.py"),
    )
    assert _parse_numstat("")[:1] == ()
    assert DiffFile("img.png", None, None).binary


def test_test_summaries() -> None:
    pytest_out = "....F.\n=== 1 failed, 5 passed, 2 skipped, 1 warning in 0.12s ===\n"
    assert _summary(pytest_out) == {"failed": 1, "passed": 5, "skipped": 2, "warnings": 1}
    assert _summary("3 passed in 1.01s\n") == {"passed": 3}
    unittest_out = "..F\n----\nRan 3 tests in 0.001s\n\nFAILED (failures=1)\n"
    assert _summary(unittest_out) == {"ran": 3, "failures": 1, "failed": 1, "passed": 2}
    assert _summary("Ran 2 tests in 0.000s\n\nOK\n") == {"ran": 2, "failed": 0, "passed": 2}
    assert _summary("nothing recognisable") == {}


def test_git_arguments_are_checked_before_anything_runs(sandbox: Sandbox) -> None:
    repo = GitWorkspace(sandbox)
    with pytest.raises(ConfigurationError, match="Secret"):
        repo.clone("https://example.invalid/r.git", credentials="plain")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="password"):
        repo.clone("https://user:pw@example.invalid/r.git")
    with pytest.raises(ConfigurationError):
        repo.clone("--upload-pack=touch /tmp/x")
    with pytest.raises(ConfigurationError):
        repo.clone("file:///x", branch="--orphan")
    with pytest.raises(ConfigurationError):
        repo.clone("file:///x", depth=0)
    for bad in ("/etc", "../up", "-x"):
        with pytest.raises(ConfigurationError):
            GitWorkspace(sandbox, bad)
    with pytest.raises(ConfigurationError):
        repo.diff(ref="--output=/tmp/x")
    assert sandbox.list_files() == []


# -- git: against the host's git (the engine tests use a template image) ------------------------


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")


@needs_git
def test_git_workspace_with_the_local_agent(sandbox: Sandbox) -> None:
    setup = (
        "set -e\n"
        "git init -q -b main src && cd src\n"
        "git config user.email t@example.invalid && git config user.name T\n"
        "printf 'def add(a, b):\\n    return a + b\\n' > calc.py\n"
        "printf 'import unittest, calc\\nclass T(unittest.TestCase):\\n"
        "    def test_add(self):\\n        self.assertEqual(calc.add(2, 2), 4)\\n' > test_calc.py\n"
        "git add . && git commit -q -m init\n"
        "cd .. && git clone -q --bare src origin.git\n"
    )
    sandbox.exec_shell(setup).check()
    origin = f"file://{sandbox.exec_shell('pwd').stdout.strip()}/origin.git"
    repo = GitWorkspace(sandbox, "work")
    cloned = repo.clone(origin, depth=1, branch="main")
    assert cloned.path == "work" and cloned.branch == "main" and len(cloned.head) == 40
    assert repo.status().clean
    sandbox.write_file("work/calc.py", "def add(a, b):\n    return a - b\n")
    sandbox.write_file("work/notes.txt", "new\n")
    status = repo.status()
    assert status.branch == "main" and status.upstream == "origin/main"
    assert status.entries == (StatusEntry("calc.py", ".", "M"), StatusEntry("notes.txt", "?", "?"))
    diff = repo.diff()
    assert diff.files == (DiffFile("calc.py", 1, 1),)
    assert "-    return a + b\n+    return a - b" in diff.text
    assert repo.diff(staged=True).empty
    # run_tests runs in the repository (cwd=/workspace/work): the engine tests cover it.
    with pytest.raises(GitError, match="git clone failed") as info:
        GitWorkspace(sandbox, "again").clone("file:///nonexistent/repo.git")
    assert info.value.result is not None and not info.value.result.ok


def test_tool_code_imports_of_optional_modules_are_guarded() -> None:
    pytest.importorskip("smolagents", reason="the dev extra installs smolagents")
    from agentnest.integrations._smolagents import _guard_imports

    code = "import json\nimport PIL\nfrom numpy.linalg import norm as n\n    import indented\nx = 1"
    guarded = _guard_imports(code)
    assert guarded.startswith("import json\ntry:\n    import PIL\nexcept ImportError:\n    pass\n")
    assert "try:\n    from numpy.linalg import norm as n\nexcept ImportError:" in guarded
    assert guarded.endswith("\n    import indented\nx = 1")
    namespace: dict[str, Any] = {}
    exec(_guard_imports("import no_such_module_for_this_test\nvalue = 3"), namespace)
    assert namespace["value"] == 3


# -- 0.3.0's forms: a runner that owns its sandbox, run(), stateful=False ----------------------------


def test_runner_creates_and_owns_a_sandbox_from_0_3_0_arguments(backend: LocalBackend) -> None:
    with SandboxRunner(image="local", backend=backend, timeout=45, environment={"A": "1"}) as runner:
        assert runner.owns_sandbox and len(backend.agents) == 1
        # 0.3.0's timeout is the created sandbox's lifetime; it bounds each call too.
        assert runner.sandbox.config.lifetime == 45 and runner.timeout == 45
        assert runner.sandbox.config.network.mode.value == "denied"
        assert runner.run("import os\nprint(os.environ['A'])\n6 * 7") == "1\n42"
    assert runner.sandbox.destroyed and backend.agents == {}
    runner.close()  # idempotent
    # The image as the first argument, as 0.3.0's runtime was.
    with SandboxRunner("local", backend=backend) as positional:
        assert positional.sandbox.config.image == "local" and positional.timeout == 300
    with pytest.deprecated_call(match=r"runtime=\) is the agentnest 0.3.0 name of image="):
        deprecated = SandboxRunner(runtime="local", backend=backend)
    assert deprecated.sandbox.config.image == "local"
    deprecated.close()
    assert backend.agents == {}


def test_runner_refuses_a_sandbox_with_arguments_to_create_one(
    sandbox: Sandbox, backend: LocalBackend
) -> None:
    for extra in ({"network_enabled": True}, {"memory": "1g"}, {"image": "local"}):
        with pytest.raises(ConfigurationError, match="not both"):
            SandboxRunner(sandbox, **extra)
    with pytest.raises(ConfigurationError, match="once"):
        SandboxRunner("local", image="other", backend=backend)
    with pytest.raises(ConfigurationError, match="stateful"):
        SandboxRunner(sandbox, stateful="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="timeout"):
        SandboxRunner(timeout=-1, image="local", backend=backend)
    assert backend.agents.keys() == {sandbox.handle.id}  # nothing was created by the refusals
    passed = SandboxRunner(sandbox)
    passed.close()
    assert not passed.owns_sandbox and not sandbox.destroyed  # a sandbox passed in stays


def test_run_returns_0_3_0_combined_text(runner: SandboxRunner) -> None:
    assert runner.run("print('  padded  ')") == "padded"
    assert runner.run("x = 41") == ""
    assert runner.run("x + 1") == "42"
    assert runner.run("'text'") == "'text'"  # the repr, as 0.3.0's session returned it
    # 0.3.0 dropped the session's stderr and kept stdout, value and traceback.
    failed = runner.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n1 / 0")
    assert failed.startswith("out\nTraceback") and failed.endswith("ZeroDivisionError: division by zero")
    assert "err" not in failed.splitlines()
    timed = runner.run_python("while True: pass", timeout=0.5)
    assert timed.note is not None and "timed out after 0.5s" in timed.note
    assert TOKEN not in runner.run("import os\nprint(os.environ['TOKEN'])\nos.environ['TOKEN']")


def test_run_is_bounded_and_says_why_it_failed(sandbox: Sandbox) -> None:
    runner = SandboxRunner(sandbox, timeout=1, max_output_chars=500)
    big = runner.run("print('x' * 100000)")
    assert len(big) < 600 and "characters cut" in big
    timed = runner.run("while True: pass").splitlines()
    assert timed[-2:] == ["KeyboardInterrupt", timed[-1]] and "timed out after 1s" in timed[-1]
    died = runner.run("import os\nos._exit(3)")
    assert "interpreter died" in died


def test_stateless_runner_runs_each_call_in_a_fresh_interpreter(sandbox: Sandbox) -> None:
    with SandboxRunner(sandbox, stateful=False, timeout=5) as runner:
        assert runner.run("x = 1\nprint(x)") == "1"
        forgot = runner.run_python("print(x)")
        assert not forgot.ok and forgot.exit_code == 1 and "NameError" in forgot.text
        # 0.3.0's one-shot form: stdout then stderr, stripped.
        assert runner.run("import sys\nprint('out')\nprint('err', file=sys.stderr)") == "out\nerr"
        assert runner.run("6 * 7") == ""  # no trailing-value display without a session
        assert "timed out after 0.5s" in runner.run_python("while True: pass", timeout=0.5).text
        assert "fresh interpreter" in runner.describe("python")
        assert runner._session is None  # never opened a session


def test_langchain_tool_in_0_3_0_forms(backend: LocalBackend) -> None:
    pytest.importorskip("langchain_core", reason="the dev extra installs langchain-core")
    from agentnest.integrations import langchain

    assert langchain.SandboxRunner is SandboxRunner and issubclass(langchain.AgentNestError, Exception)
    # The 0.3.0 README's line: the tool's runner creates its own sandbox...
    tool = langchain.build_langchain_tool(network_enabled=False, image="local", backend=backend)
    assert tool.name == "python_sandbox" and len(backend.agents) == 1
    assert tool.invoke({"code": "nums = [n * n for n in range(5)]; print(sum(nums))"}) == "30"
    # ... which nobody can close: it goes with the tool, not at its deadline.
    del tool
    gc.collect()
    assert backend.agents == {}
    # 0.3.0's example: a shared runner, closed by its owner.
    with SandboxRunner(network_enabled=False, image="local", backend=backend) as runner:
        shared = langchain.build_langchain_tool(runner, name="py", description="Python")
        assert (shared.name, shared.description) == ("py", "Python")
        shared.invoke({"code": "v = 5"})
        assert shared.invoke({"code": "print(v)"}) == "5"
        with pytest.raises(ConfigurationError, match="not both"):
            langchain.build_langchain_tool(runner, timeout=3)
    assert runner.sandbox.destroyed
    # A sandbox with runner arguments: the runner is made for it.
    with Sandbox("local", 120, backend=backend) as sb:
        quick = langchain.build_langchain_tool(sb, timeout=7)
        assert "7 seconds" in quick.description
        assert len(langchain.build_langchain_tools(sb, prefix="x_", stateful=False)) == 4


def test_sandbox_executor_has_0_3_0_interface(backend: LocalBackend) -> None:
    from agentnest.integrations import smolagents

    assert smolagents.SandboxRunner is SandboxRunner
    executor = smolagents.SandboxExecutor(network_enabled=False, image="local", backend=backend)
    try:
        executor.send_variables({"threshold": 10, "pair": (1, 2), "tags": {"a"}, "raw": b"\x00"})
        executor.send_tools({"anything": object()})  # 0.3.0: tools are not brought into the sandbox
        first = executor("primes = [n for n in range(2, 20) if all(n % d for d in range(2, n))]")
        assert first == ("", "", False)
        out, logs, final = executor("print([p for p in primes if p > threshold])\n(pair, tags, raw)")
        assert out == logs == "[11, 13, 17, 19]\n((1, 2), {'a'}, b'\\x00')" and final is False
        error = executor("undefined_name")
        assert "NameError" in error[0] and error[2] is False  # an answer, not an exception
        with pytest.raises(ConfigurationError, match="not a Python literal"):
            executor.send_variables({"obj": object()})
        with pytest.raises(ConfigurationError, match="identifier"):
            executor.send_variables({"import os; x": 1})
        assert executor.sandbox is executor.runner.sandbox
    finally:
        executor.cleanup()
    assert executor.sandbox.destroyed and backend.agents == {}


def test_stateless_sandbox_executor_defines_variables_before_every_action(backend: LocalBackend) -> None:
    from agentnest.integrations.smolagents import SandboxExecutor

    executor = SandboxExecutor(stateful=False, image="local", backend=backend)
    try:
        executor.send_variables({"n": 3})
        executor("m = 1")
        assert executor("print(n * 2)")[0] == "6"
        assert "NameError" in executor("print(m)")[0]  # nothing else is kept
    finally:
        executor.cleanup()


# -- git: 0.3.0's forms ---------------------------------------------------------------------------------


def test_git_workspace_takes_0_3_0_directories(sandbox: Sandbox) -> None:
    default = GitWorkspace(sandbox)
    assert (default.path, default.directory, default.sandbox) == ("repo", "/workspace/repo", sandbox)
    for spelled in (
        GitWorkspace(sandbox, "/workspace/src"),
        GitWorkspace(sandbox, directory="/workspace/src"),
    ):
        assert spelled.path == "src" and spelled.directory == "/workspace/src"
    assert GitWorkspace(sandbox, directory="/workspace").path == "."
    assert GitWorkspace(sandbox, directory="rel/dir").directory == "/workspace/rel/dir"
    moved = GitWorkspace(sandbox)
    moved.directory = "/workspace/other"
    assert moved.path == "other"
    for outside in ("/tmp/repo", "/workspace/../etc", "/workspacex"):
        with pytest.raises(ConfigurationError, match="inside /workspace"):
            GitWorkspace(sandbox, directory=outside)
    with pytest.raises(ConfigurationError, match="once"):
        GitWorkspace(sandbox, "a", directory="/workspace/b")
    with pytest.raises(ConfigurationError, match="once"):
        default.clone("file:///x", ref="main", branch="main")
    with pytest.raises(ConfigurationError):
        default.apply_patch(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # 0.3.0 raised ValueError for a depth <= 0
        default.clone("file:///x", depth=-1)
    assert sandbox.list_files() == []


def test_git_results_are_0_3_0_strings_carrying_parsed_fields() -> None:
    from agentnest.git import CloneResult, ExecutionResult, GitDiff, GitStatus
    from agentnest.git import Sandbox as GitSandbox

    assert GitSandbox is Sandbox
    status = GitStatus("main", None, entries=(StatusEntry("a.py", ".", "M"),), text=" M a.py\n")
    assert isinstance(status, str) and status == " M a.py\n" and "a.py" in status and status.branch == "main"
    assert hash(status) == hash(" M a.py\n") and not status.clean
    assert not GitStatus("main", "abc") and GitStatus("main", "abc").clean  # clean: the empty string
    diff = GitDiff("--- a\n+++ b\n", (DiffFile("a", 1, 0),))
    assert diff == "--- a\n+++ b\n" and diff.text == str(diff) and diff.splitlines()[0] == "--- a"
    assert not GitDiff("") and GitDiff("").empty
    clone = CloneResult("git clone", 0, "", "Cloning...\n", 0.1, path="repo", head="f" * 40, branch="main")
    assert isinstance(clone, ExecutionResult) and clone.ok and clone.check() is clone
    assert clone.output == "Cloning...\n" and clone.branch == "main"


@needs_git
def test_git_workspace_0_3_0_calls_with_the_local_agent(sandbox: Sandbox) -> None:
    setup = (
        "set -e\n"
        "git init -q -b main src && cd src\n"
        "git config user.email t@example.invalid && git config user.name T\n"
        "printf 'a\\nb\\n' > f.txt && git add . && git commit -q -m init\n"
        "git checkout -q -b feature && echo x > feature.txt && git add . && git commit -q -m f\n"
        "git checkout -q main && cd .. && git clone -q --bare src origin.git\n"
    )
    sandbox.exec_shell(setup).check()
    origin = f"file://{sandbox.exec_shell('pwd').stdout.strip()}/origin.git"
    repo = GitWorkspace(sandbox, "/workspace/repo03")
    result = repo.clone(origin, ref="feature")  # depth=1 by default, as in 0.3.0
    assert result.ok and result.exit_code == 0 and result.check() is result and result.branch == "feature"
    assert sandbox.exec(["git", "-C", "repo03", "rev-list", "--count", "HEAD"]).stdout.strip() == "1"
    assert repo.status() == "" and repo.diff() == ""
    sandbox.write_file("repo03/f.txt", "a\nB\n")
    sandbox.write_file("repo03/new/n.txt", "n\n")
    status = repo.status()
    assert status == " M f.txt\n?? new/\n"  # git status --short, as 0.3.0 returned
    assert [e.path for e in status.entries] == ["f.txt", "new/n.txt"]
    patch = repo.diff()
    assert isinstance(patch, str) and "-b\n+B\n" in patch and repo.diff(staged=True) == ""
    sandbox.exec(["git", "-C", "repo03", "checkout", "--", "f.txt"]).check()
    applied = repo.apply_patch(patch)
    assert applied.ok and sandbox.read_file("repo03/f.txt") == "a\nB\n"
    assert not sandbox.exists("repo03/.agentnest.patch")
    again = repo.apply_patch(patch)  # no longer applies: a result, not an exception
    assert not again.ok and again.exit_code != 0 and "patch does not apply" in again.stderr
    assert sandbox.read_file("repo03/f.txt") == "a\nB\n"
