"""AgentNestExecutor, smolagents' executor protocol over a sandbox (needs smolagents).

Import it from :mod:`agentnest.integrations.smolagents`, which documents it;
it lives here so that the public module imports without smolagents (as
0.3.0's did: its ``SandboxExecutor`` needs no framework).

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import json
import re
import sys
import threading
from typing import TYPE_CHECKING, Any

from ..errors import (
    ChannelError,
    ConfigurationError,
    ExecutionTimeoutError,
    MissingDependencyError,
    PolicyDeniedError,
    SessionLostError,
)
from ..session import PythonSession, SessionResult
from ._text import bound_text

try:
    from smolagents.local_python_executor import CodeOutput  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from smolagents.monitoring import AgentLogger, LogLevel  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from smolagents.remote_executors import RemotePythonExecutor  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from smolagents.serialization import SerializationError  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from smolagents.tools import Tool, get_tools_definition_code  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from smolagents.utils import AgentError  # type: ignore[import-untyped,import-not-found,unused-ignore]
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError(
        f"agentnest.integrations.smolagents needs smolagents ({exc}); "
        "install it with: pip install 'agentnest[smolagents]'"
    ) from exc

if TYPE_CHECKING:
    from ..aio import AsyncSandbox
    from ..sandbox import Sandbox

__all__ = ["AgentNestExecutor"]

#: Characters of print output returned per step (smolagents' own default).
DEFAULT_MAX_LOG_CHARS = 50_000
#: Seconds one step's code may run by default.
DEFAULT_TIMEOUT = 120.0

#: The last line of the traceback that ``final_answer`` raises in the sandbox:
#: ``<qualified name>FinalAnswerException: safe:<json>``.
_FINAL_ANSWER = re.compile(r"^(?:[\w.<>]+\.)?FinalAnswerException: (safe:.*)$")

#: A top-level ``import x`` / ``from x... import y`` line.
_TOP_IMPORT = re.compile(r"^(?:import|from) ([A-Za-z_]\w*)[\w.]*(?: import [\w, ]+)?(?: as \w+)?\s*$")

#: Checks, inside the sandbox, which modules / distributions are missing.
_MISSING = """
import importlib.metadata, importlib.util, json, sys
missing = []
for name in json.loads(sys.stdin.read()):
    try:
        importlib.metadata.distribution(name)
        continue
    except Exception:
        pass
    try:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            continue
    except Exception:
        pass
    missing.append(name)
print(json.dumps(missing))
"""


class AgentNestExecutor(RemotePythonExecutor):  # type: ignore[misc]  # smolagents is untyped
    """Run a smolagents ``CodeAgent``'s code in an AgentNest sandbox.

    Args:
        sandbox: the :class:`~agentnest.Sandbox` (or
            :class:`~agentnest.AsyncSandbox`) to run in.  ``None`` creates
            one from ``sandbox_kwargs`` (``Sandbox(**sandbox_kwargs)``), which
            :meth:`cleanup` then destroys; a sandbox passed in is left to
            its owner.
        additional_imports: modules the agent's code imports beyond the
            standard library; they must be in the image (checked now).
        logger: a smolagents ``AgentLogger``; by default one that logs errors only.
        timeout: seconds one step's code may run; it is then interrupted
            (``KeyboardInterrupt``), the step fails with a message, and the
            variables defined before stay.
        max_log_chars: bound on the print output returned per step.
        allow_pickle: must be False (see the module's security notes).
        sandbox_kwargs: arguments for the sandbox created when ``sandbox`` is None.

    Raises:
        ConfigurationError: ``allow_pickle=True``, or an import is missing from the image.

    .. versionadded:: 0.4.0
    """

    def __init__(
        self,
        sandbox: Sandbox | AsyncSandbox | None = None,
        additional_imports: list[str] | tuple[str, ...] = (),
        logger: AgentLogger | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_log_chars: int = DEFAULT_MAX_LOG_CHARS,
        allow_pickle: bool = False,
        **sandbox_kwargs: Any,
    ) -> None:
        from .._core import core_of
        from ..aio import AsyncSandbox
        from ..sandbox import Sandbox, wrap

        if allow_pickle:
            raise ConfigurationError(
                "allow_pickle=True would unpickle data chosen by the sandboxed code on the host "
                "(code execution outside the sandbox); AgentNestExecutor returns answers as JSON only"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds")
        if sandbox is not None and sandbox_kwargs:
            raise ConfigurationError("pass a sandbox or arguments to create one, not both")
        super().__init__(list(additional_imports), logger or AgentLogger(level=LogLevel.ERROR), False)
        if isinstance(sandbox, AsyncSandbox):
            sandbox = wrap(core_of(sandbox))  # a Sandbox face of the same core
        self._owned = sandbox is None
        self.sandbox: Sandbox = Sandbox(**sandbox_kwargs) if sandbox is None else sandbox
        if not isinstance(self.sandbox, Sandbox):
            raise ConfigurationError(
                f"sandbox must be a Sandbox or AsyncSandbox, not {type(sandbox).__name__}"
            )
        self.timeout = float(timeout)
        self.max_log_chars = max_log_chars
        self._lock = threading.RLock()
        self._session: PythonSession | None = None
        self._tools: dict[str, Tool] = {}
        self._variables: dict[str, Any] = {}
        try:
            self.installed_packages = self.install_packages(list(additional_imports))
        except BaseException:
            self.cleanup()
            raise

    # -- the smolagents executor interface ------------------------------------------

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Run ``code`` in the session; return its ``CodeOutput``.

        Raises:
            AgentError: the code raised, timed out, lost its interpreter or
                was denied; the message (logs and traceback) is what the
                model reads in its next step.
            SandboxDestroyedError: the sandbox is gone.
        """
        with self._lock:
            try:
                result = self._session_for_run().run(code, timeout=self.timeout)
            except ExecutionTimeoutError as exc:
                logs = self._logs(exc.result if isinstance(exc.result, SessionResult) else None)
                raise AgentError(
                    f"{logs}\nCode execution timed out after {self.timeout:g}s and was interrupted; "
                    "variables defined before are kept.",
                    self.logger,
                ) from None
            except SessionLostError as exc:
                logs = self._logs(exc.result if isinstance(exc.result, SessionResult) else None)
                self._restore()
                raise AgentError(
                    f"{logs}\nThe Python interpreter died ({_first_line(str(exc))}); every variable and "
                    "import is gone. A fresh interpreter was started and the tools defined again.",
                    self.logger,
                ) from None
            except PolicyDeniedError as exc:
                raise AgentError(f"denied: {exc}", self.logger) from None
            except ChannelError as exc:
                raise AgentError(f"The sandbox's agent was lost: {exc}", self.logger) from None
        logs = self._logs(result)
        if result.error is not None:
            lines = result.error.rstrip("\n").splitlines()
            match = _FINAL_ANSWER.match(lines[-1]) if lines else None
            if match is not None:
                return CodeOutput(output=self._final_answer(match.group(1)), logs=logs, is_final_answer=True)
            raise AgentError(f"{logs}\nExecuting code yielded an error:\n{result.error}", self.logger)
        return CodeOutput(output=result.result, logs=logs, is_final_answer=False)

    def send_tools(self, tools: dict[str, Tool]) -> None:
        """Define ``tools`` in the sandbox from their source code (as smolagents' remote executors do)."""
        with self._lock:
            # Requirements are read before final_answer is patched: the patch's own
            # imports (numpy, PIL) are optional (guarded by ImportError) but would be listed.
            wanted = {
                "pillow" if pkg == "PIL" else pkg
                for tool in tools.values()
                for pkg in tool.to_dict()["requirements"]
                if pkg != "smolagents" and pkg not in self.installed_packages
            }
            if "final_answer" in tools:
                self._patch_final_answer_with_exception(tools["final_answer"])
            if wanted:
                self.installed_packages += self.install_packages(sorted(wanted))
            code = _guard_imports(get_tools_definition_code(tools))
            if code:
                self.run_code_raise_errors(code)
            self._tools = dict(tools)

    def send_variables(self, variables: dict[str, Any]) -> None:
        """Define ``variables`` in the session; values travel as JSON, never pickled."""
        with self._lock:
            super().send_variables(variables)
            self._variables = dict(variables)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Check that the packages are in the image; never install anything.

        Raises:
            ConfigurationError: some are missing; the message names them and
                how to build an image with them.
        """
        wanted = sorted({name.removesuffix(".*") for name in additional_imports if name and name != "*"})
        if not wanted:
            return list(additional_imports)
        found = self.sandbox.exec(
            ["python3", "-c", _MISSING], input=json.dumps(wanted), timeout=self.timeout
        ).check()
        try:
            missing = json.loads(found.stdout)
        except ValueError:
            raise ConfigurationError(
                f"could not check the sandbox's packages: {found.stdout[:200]!r}"
            ) from None
        if missing:
            raise ConfigurationError(
                f"the sandbox image {self.sandbox.config.image!r} lacks {', '.join(map(str, missing))}; "
                "AgentNest does not install packages at run time: build an image that has them, e.g. "
                "agentnest.Template(wheels='dist/') or Template(apt_packages=('python3-numpy',))"
            )
        return list(additional_imports)

    def cleanup(self) -> None:
        """Close the session; destroy the sandbox if this executor created it.  Idempotent."""
        with self._lock:
            session, self._session = self._session, None
            if session is not None:
                session.close()
            if self._owned:
                self.sandbox.destroy()

    # -- internals ------------------------------------------------------------------------

    def _session_for_run(self) -> PythonSession:
        if self._session is None or self._session.closed:
            self._session = self.sandbox.python_session()
        return self._session

    def _restore(self) -> None:
        """After a lost interpreter: a fresh one, with the tools and variables sent again."""
        try:
            self._session_for_run().reset()
        except SessionLostError:
            self._session = None
        if self._variables:
            super().send_variables(self._variables)
        if self._tools:
            # The tools were patched (final_answer) and checked the first time: send the same code.
            self.run_code_raise_errors(_guard_imports(get_tools_definition_code(self._tools)))

    def _logs(self, result: SessionResult | None) -> str:
        if result is None:
            return ""
        text, _ = bound_text(result.stdout + result.stderr, self.max_log_chars)
        return text

    def _final_answer(self, encoded: str) -> Any:
        try:
            return self._deserialize_final_answer(encoded, allow_pickle=False)
        except (ValueError, SerializationError) as exc:
            raise AgentError(
                f"The final answer could not be read back ({exc}); answers must be JSON-serializable "
                "and under about 60 KB: write a large answer to a file and return its path.",
                self.logger,
            ) from None

    def __repr__(self) -> str:
        return f"<AgentNestExecutor in {self.sandbox!r}>"


# Documented and imported as agentnest.integrations.smolagents.AgentNestExecutor.
AgentNestExecutor.__module__ = "agentnest.integrations.smolagents"


def _guard_imports(code: str) -> str:
    """Make the top-level imports of third-party modules in tool code optional.

    smolagents hoists every import it finds in a tool's source to the top,
    including the patched ``final_answer``'s guarded ``import PIL`` and
    ``import numpy``, which smolagents' own remote executors pip-install.
    Requirements the tools really have were checked by :meth:`install_packages`
    before this runs, so a module missing here is an optional one.
    """
    out = []
    for line in code.splitlines():
        match = _TOP_IMPORT.match(line)
        if match and match.group(1) not in sys.stdlib_module_names:
            out.append(f"try:\n    {line}\nexcept ImportError:\n    pass")
        else:
            out.append(line)
    return "\n".join(out)


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:500]
