"""The framework integrations against real sandboxes (runc; gVisor for a smoke test).

LangChain's ``StructuredTool`` is invoked directly and smolagents' ``CodeAgent``
runs with a scripted ``Model`` (fixed replies, no network, no model call):
what is checked is that the code runs in the container, under its policy,
and that what comes back to the model is bounded and redacted.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from agentnest import ApprovalRequest, MemoryObserver, Sandbox, Secret
from agentnest.integrations import SandboxRunner
from agentnest.testing.wait import wait_until

from .helpers import containers_of

pytestmark = [pytest.mark.timeout(300)]

TOKEN = "sk-live-Int3gr4ti0n-5ecret"  # a test secret


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with Sandbox(backend="docker", timeout=600, environment={"API_KEY": Secret(TOKEN)}) as sb:
        yield sb


def scripted_model(replies: list[str]) -> Any:
    """A smolagents Model that returns fixed replies: no network, no model call."""
    from smolagents import ChatMessage, MessageRole, Model  # type: ignore[import-untyped]
    from smolagents.models import TokenUsage  # type: ignore[import-untyped]

    class Scripted(Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(model_id="scripted")
            self.replies = list(replies)

        def generate(self, messages: list[Any], **kwargs: Any) -> Any:
            return ChatMessage(
                role=MessageRole.ASSISTANT, content=self.replies.pop(0), token_usage=TokenUsage(1, 1)
            )

    return Scripted()


@pytest.mark.docker
def test_runner_in_a_container(sandbox: Sandbox) -> None:
    with SandboxRunner(sandbox, timeout=20, max_output_chars=2000) as runner:
        assert runner.run_python("import os\nuid = os.getuid()").ok
        assert runner.run_python("(uid, os.getcwd())").text == "Out: (65532, '/workspace')"
        err = runner.run_python("open('/etc/passwd', 'a')")
        assert not err.ok and ("Errno 30" in err.text or "Errno 13" in err.text), err.text
        leak = runner.run_python("print(os.environ['API_KEY'])\nos.environ['API_KEY'].encode().hex()")
        assert TOKEN not in leak.text and leak.text.count("[REDACTED]") == 2
        net = runner.run_python("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)")
        assert not net.ok and ("OSError" in net.text or "unreachable" in net.text)
        timed = runner.run_python("while True: pass", timeout=1)
        assert timed.timed_out and runner.run_python("uid").result == "65532"
        died = runner.run_python("os._exit(9)")
        assert "interpreter died" in died.text and runner.run_python("'uid' in globals()").result == "False"
        big = runner.run_shell("head -c 100000 /dev/zero | tr '\\0' x")
        assert big.ok and big.truncated and len(big.text) < 2100
        assert runner.run_shell("id -u; exit 4").text == "65532\n[exit code 4]"


@pytest.mark.docker
def test_denials_come_back_as_text_and_nothing_runs() -> None:
    def hook(request: ApprovalRequest) -> bool:
        return not (request.kind == "exec" and "rm" in request.details["command"])

    events = MemoryObserver()
    with Sandbox(backend="docker", timeout=120, approval_hook=hook, observers=[events]) as sb:
        sb.write_file("keep.txt", "x")
        out = SandboxRunner(sb).run_shell("rm keep.txt")
        assert out.denied and out.text.startswith("denied: ")
        assert sb.exists("keep.txt")
        assert any(e.type.value == "policy.denied" for e in events.events)


@pytest.mark.docker
def test_langchain_tool_in_a_container(sandbox: Sandbox) -> None:
    from agentnest.integrations.langchain import build_langchain_tool

    tool = build_langchain_tool(sandbox)
    assert tool.invoke({"code": "import platform\nsystem = platform.system()"}) == "(no output)"
    assert tool.invoke({"code": "system"}) == "Out: 'Linux'"
    assert anyio.run(tool.ainvoke, {"code": "import os\nos.getuid()"}) == "Out: 65532"
    shell = build_langchain_tool(sandbox, language="shell")
    assert shell.invoke({"command": 'echo "$API_KEY"'}) == "[REDACTED]"


@pytest.mark.parametrize(
    "backend",
    [pytest.param("docker", marks=pytest.mark.docker), pytest.param("gvisor", marks=pytest.mark.gvisor)],
)
def test_smolagents_code_agent_final_answer_is_computed_in_the_sandbox(backend: str) -> None:
    from smolagents import CodeAgent, tool

    from agentnest.integrations.smolagents import AgentNestExecutor

    @tool  # type: ignore[untyped-decorator]
    def whoami() -> int:
        """Return the user id the tool runs as."""
        import os

        return os.getuid()

    replies = [
        "Thought: count.\n<code>\nimport os\nfiles = sorted(os.listdir('/workspace'))\nprint(files)\n</code>",
        "Thought: answer.\n<code>\nfinal_answer({'files': files, 'uid': whoami(), "
        "'hostname': open('/etc/hostname').read().strip(), 'n': n * 2})\n</code>",
    ]
    with Sandbox(backend=backend, timeout=300) as sb:
        sb.write_file("data.csv", "a,b\n")
        agent = CodeAgent(
            tools=[whoami], model=scripted_model(replies), executor=AgentNestExecutor(sb), max_steps=3
        )
        answer = agent.run("Describe the workspace", additional_args={"n": 21})
        hostname = sb.exec_shell("cat /etc/hostname").stdout.strip()
    assert answer == {"files": ["data.csv"], "uid": 65532, "hostname": hostname, "n": 42}
    assert answer["uid"] != os.getuid() and hostname != os.uname().nodename


# -- 0.3.0's forms against the engine --------------------------------------------------------------
#
# 0.3.0's examples/langchain_tool.py and examples/smolagents_executor.py, as
# code: they create their sandboxes with 0.3.0's arguments and no image (ours:
# the default base image, the one 0.3.0's python:3.12-slim maps to).


@pytest.mark.docker
def test_0_3_0_langchain_example(docker_client: Any) -> None:
    from agentnest.integrations.langchain import build_langchain_tool

    with SandboxRunner(network_enabled=False) as runner:
        tool = build_langchain_tool(runner)
        assert tool.invoke({"code": "nums = [n * n for n in range(5)]; print(sum(nums))"}) == "30"
        sandbox_id = runner.sandbox.id
        assert runner.owns_sandbox and runner.sandbox.config.lifetime == 300
        assert runner.run("import os\nos.getuid()") == "65532"
        refused = runner.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)")
        assert "OSError" in refused or "unreachable" in refused, refused
    # The runner created the sandbox, so closing it removed the container.
    wait_until(lambda: containers_of(docker_client, sandbox_id) == [], "the runner's container to go")
    # The 0.3.0 README's line: nobody holds the runner, so the tool's end is the sandbox's.
    readme = build_langchain_tool(network_enabled=False)
    assert readme.invoke({"code": "print('hi')"}) == "hi"
    (owned,) = _runner_ids(readme)
    assert containers_of(docker_client, owned) != []
    del readme
    gc.collect()
    wait_until(lambda: containers_of(docker_client, owned) == [], "the README tool's container to go")


def _runner_ids(tool: Any) -> set[str]:
    """The sandbox id of the runner a tool's function closes over (test introspection)."""
    cells = tool.func.__closure__ or ()
    return {c.cell_contents.sandbox.id for c in cells if isinstance(c.cell_contents, SandboxRunner)}


@pytest.mark.docker
def test_0_3_0_smolagents_example(docker_client: Any) -> None:
    from agentnest.integrations.smolagents import SandboxExecutor

    executor = SandboxExecutor(network_enabled=False)
    try:
        executor.send_variables({"threshold": 10})
        sieve = "primes = [n for n in range(2, 20) if all(n % d for d in range(2, n))]"
        first_output, _, _ = executor(sieve)
        second_output, _, is_final = executor("print([p for p in primes if p > threshold])")
        assert (first_output, second_output, is_final) == ("", "[11, 13, 17, 19]", False)
        sandbox_id = executor.sandbox.id
    finally:
        executor.cleanup()
    wait_until(lambda: containers_of(docker_client, sandbox_id) == [], "the executor's container to go")


@pytest.mark.docker
def test_stateless_runner_in_a_container(sandbox: Sandbox) -> None:
    runner = SandboxRunner(sandbox, stateful=False, timeout=30)
    first = runner.run_python("import os\nx = 1\nprint(os.getpid(), os.getuid())")
    assert first.ok and first.exit_code == 0 and first.text.split()[1] == "65532"
    second = runner.run_python("print(x)")
    assert not second.ok and "NameError" in second.text
    assert runner.run("import os\nprint(os.environ['API_KEY'])") == "[REDACTED]"
