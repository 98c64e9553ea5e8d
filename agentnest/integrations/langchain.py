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

import functools
from typing import TYPE_CHECKING, Any

from ..errors import AgentNestError as AgentNestError  # 0.3.0 had it here
from ..errors import ConfigurationError, MissingDependencyError
from ._browse import is_browser_sandbox
from .base import Language, RunOutput
from .base import SandboxRunner as SandboxRunner  # 0.3.0 had it here

if TYPE_CHECKING:
    from langchain_core.tools import StructuredTool

    from ..aio import AsyncSandbox
    from ..sandbox import Sandbox

__all__ = ["AgentNestError", "SandboxRunner", "build_langchain_tool", "build_langchain_tools"]


def _structured_tool() -> type[StructuredTool]:
    """LangChain's ``StructuredTool``, imported when a tool is built (as 0.3.0 did)."""
    try:
        from langchain_core.tools import StructuredTool
    except ImportError as exc:
        raise MissingDependencyError(
            f"agentnest.integrations.langchain needs langchain-core ({exc}); "
            "install it with: pip install 'agentnest[langchain]'"
        ) from exc
    return StructuredTool


@functools.cache
def _schemas() -> dict[str, Any]:
    """The tools' pydantic argument models (pydantic comes with langchain-core)."""
    from pydantic import BaseModel, Field

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

    class BrowseInput(BaseModel):
        """Arguments of the browse tool."""

        url: str = Field(
            description="An http:// or https:// URL, a file:// URL, or the absolute path of a file in "
            "the sandbox (such as /workspace/index.html)."
        )
        full_page: bool = Field(
            default=False, description="Screenshot the whole page rather than the visible window."
        )

    return {
        "python": PythonInput,
        "shell": ShellInput,
        "read": ReadFileInput,
        "write": WriteFileInput,
        "browse": BrowseInput,
    }


def _runner(
    target: Sandbox | AsyncSandbox | SandboxRunner | None, runner_kwargs: dict[str, Any]
) -> SandboxRunner:
    if isinstance(target, SandboxRunner):
        if runner_kwargs:
            raise ConfigurationError(
                "pass a SandboxRunner or arguments to create one, not both "
                f"(got a runner and {', '.join(sorted(runner_kwargs))})"
            )
        return target
    return SandboxRunner(target, **runner_kwargs)


def build_langchain_tool(
    runner: Sandbox | AsyncSandbox | SandboxRunner | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    language: Language = "python",
    return_direct: bool = False,
    **runner_kwargs: Any,
) -> StructuredTool:
    """A LangChain ``StructuredTool`` that runs code in the sandbox.

    Example (0.3.0's form: the tool's runner creates its own sandbox)::

        tool = build_langchain_tool(network_enabled=False)
        tool.invoke({"code": "print(6 * 7)"})              # '42'

    Args:
        runner: a :class:`~agentnest.integrations.SandboxRunner` (pass one
            to share a Python session between tools, or to close its
            sandbox when done), a :class:`~agentnest.Sandbox` or an
            :class:`~agentnest.AsyncSandbox` (a runner is made for it with
            ``runner_kwargs``), or ``None``: a runner is created from
            ``runner_kwargs``, and with it a sandbox that lives ``timeout``
            seconds (as in 0.3.0; pass a runner to close it sooner).
        name: the tool's name; ``python_sandbox`` or ``shell_sandbox`` by default.
        description: what the model reads; by default
            :meth:`SandboxRunner.describe` (it names the limits and the network).
        language: ``"python"`` (argument ``code``, a persistent session) or
            ``"shell"`` (argument ``command``).
        return_direct: LangChain's flag: the tool's answer ends the agent run.
        runner_kwargs: arguments for the :class:`SandboxRunner` created when
            ``runner`` is not one (``timeout``, ``network_enabled``,
            ``security_policy``, ``stateful``, ``max_output_chars``, any
            ``Sandbox`` argument...).

    Returns:
        A ``StructuredTool`` with a pydantic ``args_schema``, a sync ``func``
        and an async ``coroutine`` (a worker thread; cancelling it
        interrupts the Python code).

    Raises:
        ConfigurationError: an unknown ``language``, or a runner given with
            ``runner_kwargs``.
        MissingDependencyError: langchain-core is not installed.

    .. versionchanged:: 0.4.0
       ``runner`` may also be a sandbox; ``language``, ``return_direct``; an
       async ``coroutine``; the answer is :attr:`RunOutput.text
       <agentnest.integrations.RunOutput.text>` (``Out: <value>`` for a final
       expression) rather than 0.3.0's :meth:`SandboxRunner.run` text.
    """
    tool_class = _structured_tool()
    if language not in ("python", "shell"):
        raise ConfigurationError(f"language {language!r} is not supported; use 'python' or 'shell'")
    active = _runner(runner, runner_kwargs)
    text = description if description is not None else active.describe(language)
    if language == "python":

        def run_python(code: str) -> str:
            return active.run_python(code).text

        async def arun_python(code: str) -> str:
            return (await active.arun_python(code)).text

        return tool_class.from_function(
            func=run_python,
            coroutine=arun_python,
            name=name or "python_sandbox",
            description=text,
            args_schema=_schemas()["python"],
            return_direct=return_direct,
        )

    def run_shell(command: str) -> str:
        return active.run_shell(command).text

    async def arun_shell(command: str) -> str:
        return (await active.arun_shell(command)).text

    return tool_class.from_function(
        func=run_shell,
        coroutine=arun_shell,
        name=name or "shell_sandbox",
        description=text,
        args_schema=_schemas()["shell"],
        return_direct=return_direct,
    )


def build_langchain_tools(
    runner: Sandbox | AsyncSandbox | SandboxRunner | None = None,
    *,
    prefix: str = "",
    **runner_kwargs: Any,
) -> list[StructuredTool]:
    """Four tools over one runner: Python, shell, read a file, write a file (and browse).

    They share the runner, so they share its Python session and take turns.
    Names: ``python_sandbox``, ``shell_sandbox``, ``read_file``,
    ``write_file``, each with ``prefix`` in front.  ``runner`` and
    ``runner_kwargs`` as for :func:`build_langchain_tool`.

    In a browser sandbox (``Sandbox(preset="browser")``, or
    ``preset="browser"`` among ``runner_kwargs``) a fifth tool, ``browse``
    (arguments ``url`` and ``full_page``), opens a page with
    :meth:`SandboxRunner.browse`: the model reads its text; the tool's
    response format is ``content_and_artifact``, so a ``ToolMessage``'s
    ``artifact`` is the :class:`~agentnest.integrations.RunOutput`, whose
    ``display`` holds the screenshot (``image/png``).

    .. versionchanged:: 0.4.0
       The ``browse`` tool in a browser sandbox.

    Raises:
        ConfigurationError: a runner given with ``runner_kwargs``.
        MissingDependencyError: langchain-core is not installed.
    """
    tool_class = _structured_tool()
    schemas = _schemas()
    shared = _runner(runner, runner_kwargs)
    workdir = shared.sandbox.config.workdir

    def read_file(path: str) -> str:
        return shared.read_file(path).text

    async def aread_file(path: str) -> str:
        return (await shared.aread_file(path)).text

    def write_file(path: str, content: str) -> str:
        return shared.write_file(path, content).text

    async def awrite_file(path: str, content: str) -> str:
        return (await shared.awrite_file(path, content)).text

    files: list[Any] = [
        tool_class.from_function(
            func=read_file,
            coroutine=aread_file,
            name=f"{prefix}read_file",
            description=f"Read a text file of the sandbox's workspace ({workdir}).",
            args_schema=schemas["read"],
        ),
        tool_class.from_function(
            func=write_file,
            coroutine=awrite_file,
            name=f"{prefix}write_file",
            description=f"Write a text file in the sandbox's workspace ({workdir}); parents are created.",
            args_schema=schemas["write"],
        ),
    ]
    if is_browser_sandbox(shared.sandbox):

        def browse(url: str, full_page: bool = False) -> tuple[str, RunOutput]:
            out = shared.browse(url, full_page=full_page)
            return out.text, out

        async def abrowse(url: str, full_page: bool = False) -> tuple[str, RunOutput]:
            out = await shared.abrowse(url, full_page=full_page)
            return out.text, out

        files.append(
            tool_class.from_function(
                func=browse,
                coroutine=abrowse,
                name=f"{prefix}browse",
                description=shared.describe("browse"),
                args_schema=schemas["browse"],
                response_format="content_and_artifact",
            )
        )
    return [
        build_langchain_tool(shared, name=f"{prefix}python_sandbox", language="python"),
        build_langchain_tool(shared, name=f"{prefix}shell_sandbox", language="shell"),
        *files,
    ]
