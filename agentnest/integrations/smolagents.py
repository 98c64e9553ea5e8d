"""smolagents code executors that run the agent's code in an AgentNest sandbox.

Two executors:

* :class:`AgentNestExecutor` (``pip install 'agentnest[smolagents]'``), a
  real smolagents executor: tools, variables and final answers as below.
* :class:`SandboxExecutor`, 0.3.0's duck-typed executor, kept for 0.3.0
  programs: ``executor(code) -> (output, logs, is_final_answer)``.  It needs
  no framework at all (this module imports without smolagents; only
  :class:`AgentNestExecutor` needs it).

smolagents' ``CodeAgent`` takes a ready executor through its ``executor=``
argument (its ``executor_type`` names only the executors smolagents ships)::

    from smolagents import CodeAgent, InferenceClientModel
    from agentnest import Sandbox
    from agentnest.integrations.smolagents import AgentNestExecutor

    with Sandbox(timeout=1800) as sandbox:
        agent = CodeAgent(tools=[], model=InferenceClientModel(),
                          executor=AgentNestExecutor(sandbox))
        print(agent.run("What is the 20th Fibonacci number?"))

:class:`AgentNestExecutor` is a smolagents ``RemotePythonExecutor``, like
smolagents' own Docker and E2B executors, and follows their protocol: tools
are sent as their source code and defined in the sandbox (so a tool runs
*inside* the sandbox, with the sandbox's network and files), variables are
sent as JSON, and the ``final_answer`` tool ends a step by raising
``FinalAnswerException`` with the JSON-serialized answer, which the executor
reads back.  The code runs in one persistent
:class:`~agentnest.PythonSession`, so state lives across steps.

Security choices:

* ``allow_pickle=True`` is refused: it would unpickle the final answer on
  the host, and the sandboxed code decides what that pickle holds (code
  execution on the host).  Answers travel as JSON only.
* Packages are never installed at run time (the sandbox's network is usually
  denied): an import the agent is allowed, or a tool's requirement, must be in
  the image already (bake it into a :class:`~agentnest.Template`); a missing
  one raises :class:`~agentnest.ConfigurationError` naming it.
* Everything that comes back (logs, values, tracebacks, the final answer)
  has the sandbox's secrets redacted by its guard.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import ast
import keyword
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, ExecutionError
from .base import SandboxRunner as SandboxRunner  # 0.3.0 had it here

if TYPE_CHECKING:
    from ..sandbox import Sandbox
    from ._smolagents import AgentNestExecutor as AgentNestExecutor

__all__ = ["AgentNestExecutor", "SandboxExecutor", "SandboxRunner"]


class SandboxExecutor:
    """0.3.0's smolagents executor: each code action runs in a :class:`SandboxRunner`.

    Kept so that 0.3.0 programs run unchanged; new code should use
    :class:`AgentNestExecutor`, which defines the agent's tools in the
    sandbox and reads ``final_answer`` back.

    Example::

        executor = SandboxExecutor(network_enabled=False)
        try:
            executor.send_variables({"threshold": 10})
            output, logs, is_final = executor("print(threshold * 2)")   # ('20', '20', False)
        finally:
            executor.cleanup()

    Args:
        runner_kwargs: arguments of :class:`SandboxRunner` (``timeout``,
            ``network_enabled``, ``security_policy``, ``stateful``, any
            ``Sandbox`` argument, or ``sandbox=`` an existing sandbox, which
            :meth:`cleanup` then leaves to its owner).

    Raises:
        ConfigurationError: as :class:`SandboxRunner` does.
    """

    def __init__(self, **runner_kwargs: Any) -> None:
        self._runner = SandboxRunner(**runner_kwargs)
        #: stateful=False: the variables, defined again before every action.
        self._prelude = ""

    @property
    def runner(self) -> SandboxRunner:
        """The runner the actions run in.

        .. versionadded:: 0.4.0
        """
        return self._runner

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox the actions run in.

        .. versionadded:: 0.4.0
        """
        return self._runner.sandbox

    def __call__(self, code_action: str) -> tuple[str, str, bool]:
        """Run one code action; return ``(output, logs, is_final_answer)``.

        ``output`` and ``logs`` are both :meth:`SandboxRunner.run`'s text (the
        output, the final expression's value, the traceback), as in 0.3.0;
        an error in the code is text there, not an exception.
        ``is_final_answer`` is always False: no ``final_answer`` tool is
        defined in the sandbox (see :meth:`send_tools`).

        Raises:
            SandboxDestroyedError: the sandbox is gone.
            ConfigurationError: ``code_action`` is not a ``str``.
        """
        if self._prelude and isinstance(code_action, str):
            code_action = self._prelude + code_action
        output = self._runner.run(code_action)
        return output, output, False

    def send_variables(self, variables: dict[str, Any]) -> None:
        """Define ``variables`` in the sandbox's Python.

        Values travel as their ``repr``, which must be a Python literal
        (numbers, strings, bytes, None, booleans and lists, tuples, sets and
        dicts of them), checked on the host first; a literal has no side
        effect when the sandbox evaluates it.  With ``stateful=False`` they
        are defined again before every action.

        Raises:
            ConfigurationError: a name is not an identifier, or a value's
                ``repr`` is not a literal (0.3.0 sent it anyway, and the
                sandbox failed on it silently).
            ExecutionError: the sandbox could not define them (the message
                says why: a denial, a timeout...).
        """
        lines = []
        for name, value in variables.items():
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                raise ConfigurationError(f"variable name {name!r} is not a Python identifier")
            text = repr(value)
            try:
                ast.literal_eval(text)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                raise ConfigurationError(
                    f"variable {name!r} cannot be sent: its repr is not a Python literal "
                    f"({text[:80]!r}); send plain data (numbers, strings, lists, dicts...)"
                ) from None
            lines.append(f"{name} = {text}\n")
        code = "".join(lines)
        if not code:
            return
        if not self._runner.stateful:
            self._prelude += code
            return
        out = self._runner.run_python(code)
        if not out.ok:
            raise ExecutionError(f"could not define the variables in the sandbox: {out.text}")

    def send_tools(self, tools: dict[str, Any]) -> None:
        """Do nothing, as in 0.3.0: host tool callables are not brought into the sandbox.

        :class:`AgentNestExecutor` defines tools in the sandbox from their
        source code (so they run inside it).
        """

    def cleanup(self) -> None:
        """End the session; destroy the sandbox if this executor created it.  Idempotent."""
        self._runner.close()

    def __repr__(self) -> str:
        return f"<SandboxExecutor in {self._runner.sandbox!r}>"


def __getattr__(name: str) -> Any:
    # AgentNestExecutor subclasses smolagents' RemotePythonExecutor, so it is
    # defined (and smolagents imported) on first use: SandboxExecutor, as in
    # 0.3.0, works without smolagents.  Missing, it raises MissingDependencyError.
    if name in ("AgentNestExecutor", "DEFAULT_MAX_LOG_CHARS"):
        from . import _smolagents

        return getattr(_smolagents, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "AgentNestExecutor", "DEFAULT_MAX_LOG_CHARS"})
