"""Integrations (SandboxRunner, LangChain, smolagents) and git helpers, without an engine.

``LocalBackend`` below runs each sandbox's real agent as a plain child process
in a temporary directory (``agentnest.testing.process.LocalAgent``), so the
runner, the guard, the channel and the Python sessions run for real.  The
frameworks are the real libraries: LangChain's ``StructuredTool`` is invoked
directly and smolagents' ``CodeAgent`` runs with a scripted ``Model`` that
returns fixed code (no model is ever called).  Nothing here is isolated: the
code is the test's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentnest import (
    AsyncSandbox,
    ConfigurationError,
    MemoryObserver,
    PolicyDeniedError,
    Sandbox,
    SandboxDestroyedError,
    Secret,
)
from agentnest.channel.streams import ByteStream
from agentnest.config import SandboxConfig
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
from agentnest.integrations.base import bound_text
from agentnest.runtime.base import Capability, RuntimeBackend, SandboxHandle
from agentnest.testing.process import LocalAgent

pytestmark = pytest.mark.timeout(120)

WAIT = 15.0
TOKEN = "tok-3x4mpl3-V4lu3-9f2c"  # a test secret


class LocalBackend(RuntimeBackend):
    """Each sandbox is a LocalAgent in its own directory (tests only: isolates nothing)."""

    name = "local-test"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.agents: dict[str, LocalAgent] = {}

    def capabilities(self) -> frozenset[Capability]:
        return frozenset({Capability.NETWORK_DENIED, Capability.RESOURCE_LIMITS, Capability.READ_ONLY_ROOT})

    def create(self, config: SandboxConfig) -> SandboxHandle:
        sid = uuid.uuid4().hex[:12]
        workspace = self.root / sid
        workspace.mkdir()
        info = {"workspace": str(workspace), "env": {**os.environ, **config.container_environment()}}
        return SandboxHandle(sid, self.name, time.time() + config.lifetime, info)

    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        # As an engine does: the sandbox's environment (secrets included) is the agent's.
        agent = LocalAgent(handle.info["workspace"], env=handle.info["env"])
        self.agents[handle.id] = agent
        return agent.stream

    def is_running(self, handle: SandboxHandle) -> bool:
        agent = self.agents.get(handle.id)
        return agent is not None and agent.proc.poll() is None

    def destroy(self, handle: SandboxHandle) -> None:
        agent = self.agents.pop(handle.id, None)
        if agent is not None:
            agent.kill()


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(tmp_path)


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

    executor = AgentNestExecutor(sandbox, ["json"], timeout=1)
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
    check = (
        "import sys, agentnest, agentnest.integrations\n"
        "assert 'langchain_core' not in sys.modules and 'smolagents' not in sys.modules, 'eager'\n"
        "sys.modules['langchain_core'] = None\n"
        "sys.modules['smolagents'] = None\n"
        "from agentnest.errors import MissingDependencyError\n"
        "extras = (('langchain', 'agentnest[langchain]'), ('smolagents', 'agentnest[smolagents]'))\n"
        "for mod, extra in extras:\n"
        "    try:\n"
        "        __import__('agentnest.integrations.' + mod)\n"
        "    except MissingDependencyError as exc:\n"
        "        assert isinstance(exc, ImportError) and extra in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError(mod + ' imported')\n"
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
    from agentnest.integrations.smolagents import _guard_imports

    code = "import json\nimport PIL\nfrom numpy.linalg import norm as n\n    import indented\nx = 1"
    guarded = _guard_imports(code)
    assert guarded.startswith("import json\ntry:\n    import PIL\nexcept ImportError:\n    pass\n")
    assert "try:\n    from numpy.linalg import norm as n\nexcept ImportError:" in guarded
    assert guarded.endswith("\n    import indented\nx = 1")
    namespace: dict[str, Any] = {}
    exec(_guard_imports("import no_such_module_for_this_test\nvalue = 3"), namespace)
    assert namespace["value"] == 3
