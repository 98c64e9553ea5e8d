"""LangChain tools backed by an AgentNest sandbox (``pip install 'agentnest[langchain]'``).

Example::

    from agentnest import Sandbox
    from agentnest.integrations.langchain import build_langchain_tool

    with Sandbox(timeout=600) as sandbox:
        tool = build_langchain_tool(sandbox)               # a StructuredTool named "python_sandbox"
        print(tool.invoke({"code": "x = 6 * 7\\nx"}))       # Out: 42
        llm_with_tools = chat_model.bind_tools([tool])     # any LangChain chat model

The tool answers with :attr:`RunOutput.text <agentnest.integrations.RunOutput.text>`:
the code's errors, timeouts and policy denials come back as text for the
model; a destroyed sandbox raises (see :mod:`agentnest.integrations.base`).
Only ``langchain-core`` is needed, not ``langchain``.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, MissingDependencyError
from .base import Language, SandboxRunner

try:
    from langchain_core.tools import StructuredTool
    from pydantic import BaseModel, Field
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError(
        f"agentnest.integrations.langchain needs langchain-core ({exc}); "
        "install it with: pip install 'agentnest[langchain]'"
    ) from exc

if TYPE_CHECKING:
    from ..aio import AsyncSandbox
    from ..sandbox import Sandbox

__all__ = ["build_langchain_tool", "build_langchain_tools"]


class PythonInput(BaseModel):
    """Arguments of the Python tool."""

    code: str = Field(
        description="Python code to run. State persists between calls; the value of a final "
        "expression is returned."
    )


class ShellInput(BaseModel):
    """Arguments of the shell tool."""

    command: str = Field(description="A shell command line, run with /bin/sh -c in the workspace.")


class ReadFileInput(BaseModel):
    """Arguments of the file-reading tool."""

    path: str = Field(description="Path of a text file, relative to the workspace.")


class WriteFileInput(BaseModel):
    """Arguments of the file-writing tool."""

    path: str = Field(description="Path of the file to write, relative to the workspace.")
    content: str = Field(description="The whole text content of the file.")


def _runner(target: Sandbox | AsyncSandbox | SandboxRunner) -> SandboxRunner:
    return target if isinstance(target, SandboxRunner) else SandboxRunner(target)


def build_langchain_tool(
    sandbox_or_runner: Sandbox | AsyncSandbox | SandboxRunner,
    *,
    name: str | None = None,
    description: str | None = None,
    language: Language = "python",
    return_direct: bool = False,
) -> StructuredTool:
    """A LangChain ``StructuredTool`` that runs code in the sandbox.

    Args:
        sandbox_or_runner: a :class:`~agentnest.Sandbox`, an
            :class:`~agentnest.AsyncSandbox` or a
            :class:`~agentnest.integrations.SandboxRunner` (pass a runner to
            share one Python session between tools, or to set its timeout,
            output bound or ``raise_denied``).
        name: the tool's name; ``python_sandbox`` or ``shell_sandbox`` by default.
        description: what the model reads; by default
            :meth:`SandboxRunner.describe` (it names the limits and the network).
        language: ``"python"`` (argument ``code``, a persistent session) or
            ``"shell"`` (argument ``command``).
        return_direct: LangChain's flag: the tool's answer ends the agent run.

    Returns:
        A ``StructuredTool`` with a pydantic ``args_schema``, a sync ``func``
        and an async ``coroutine`` (a worker thread; cancelling it
        interrupts the Python code).

    Raises:
        ConfigurationError: an unknown ``language``.
    """
    runner = _runner(sandbox_or_runner)
    text = description if description is not None else runner.describe(language)
    if language == "python":

        def run_python(code: str) -> str:
            return runner.run_python(code).text

        async def arun_python(code: str) -> str:
            return (await runner.arun_python(code)).text

        return StructuredTool.from_function(
            func=run_python,
            coroutine=arun_python,
            name=name or "python_sandbox",
            description=text,
            args_schema=PythonInput,
            return_direct=return_direct,
        )
    if language == "shell":

        def run_shell(command: str) -> str:
            return runner.run_shell(command).text

        async def arun_shell(command: str) -> str:
            return (await runner.arun_shell(command)).text

        return StructuredTool.from_function(
            func=run_shell,
            coroutine=arun_shell,
            name=name or "shell_sandbox",
            description=text,
            args_schema=ShellInput,
            return_direct=return_direct,
        )
    raise ConfigurationError(f"language {language!r} is not supported; use 'python' or 'shell'")


def build_langchain_tools(
    sandbox_or_runner: Sandbox | AsyncSandbox | SandboxRunner, *, prefix: str = ""
) -> list[StructuredTool]:
    """Four tools over one runner: Python, shell, read a file, write a file.

    They share the runner, so they share its Python session and take turns.
    Names: ``python_sandbox``, ``shell_sandbox``, ``read_file``,
    ``write_file``, each with ``prefix`` in front.
    """
    runner = _runner(sandbox_or_runner)
    workdir = runner.sandbox.config.workdir

    def read_file(path: str) -> str:
        return runner.read_file(path).text

    async def aread_file(path: str) -> str:
        return (await runner.aread_file(path)).text

    def write_file(path: str, content: str) -> str:
        return runner.write_file(path, content).text

    async def awrite_file(path: str, content: str) -> str:
        return (await runner.awrite_file(path, content)).text

    files: list[Any] = [
        StructuredTool.from_function(
            func=read_file,
            coroutine=aread_file,
            name=f"{prefix}read_file",
            description=f"Read a text file of the sandbox's workspace ({workdir}).",
            args_schema=ReadFileInput,
        ),
        StructuredTool.from_function(
            func=write_file,
            coroutine=awrite_file,
            name=f"{prefix}write_file",
            description=f"Write a text file in the sandbox's workspace ({workdir}); parents are created.",
            args_schema=WriteFileInput,
        ),
    ]
    return [
        build_langchain_tool(runner, name=f"{prefix}python_sandbox", language="python"),
        build_langchain_tool(runner, name=f"{prefix}shell_sandbox", language="shell"),
        *files,
    ]
