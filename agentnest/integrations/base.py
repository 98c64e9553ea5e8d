"""``SandboxRunner``: a sandbox as tools for any agent framework.

The runner turns a :class:`~agentnest.Sandbox` into the handful of calls an
agent loop makes -- run Python, run a shell command, read and write a file,
and in a browser sandbox (``Sandbox(preset="browser")``) browse a page --
and answers each with a :class:`RunOutput` whose ``text`` is ready to go back
to a language model: bounded, with errors written out, secrets redacted (by
the sandbox's guard, before the runner sees anything).

Python runs in one persistent :class:`~agentnest.PythonSession`, so
variables, imports and open files live from one call to the next, as in a
notebook.  The framework adapters (:mod:`agentnest.integrations.langchain`,
:mod:`agentnest.integrations.smolagents`) are thin layers over it.

What is returned and what is raised:

* The code's own failures are *answers*, not exceptions: an exception in the
  code, a non-zero exit, a timeout (the sandbox and the session's variables
  survive it), a Python interpreter that died (a fresh one is started and the
  text says the variables are gone), a file that does not exist, a page that
  does not load (a bad URL, a refused site, a page past its timeout).  The model
  reads them and tries again.
* A refusal by the policy or an approval hook (:class:`PolicyDeniedError`) is
  also an answer by default, ``"denied: <reason>"`` with ``denied=True``, so
  that an agent loop goes on and the model can choose another way; the guard
  has already recorded the ``policy.denied`` event.  ``raise_denied=True``
  raises it instead, for loops that must stop on a refusal.
* What means the sandbox itself is gone or broken is raised:
  :class:`SandboxDestroyedError` (destroyed, or past its deadline),
  :class:`BackendError`, :class:`AuditError` (an event could not be
  recorded: fail loud), and a bad argument from the *program* (not the model),
  such as code that is not a ``str``: :class:`ConfigurationError`; browsing
  in a sandbox that is not a browser sandbox:
  :class:`UnsupportedCapabilityError`.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import anyio.to_thread

from .._aliases import deprecated
from ..errors import (
    AgentNestError,
    BrowserError,
    BrowserTimeoutError,
    ChannelError,
    ConfigurationError,
    ExecutionTimeoutError,
    FileAccessError,
    PolicyDeniedError,
    SessionLostError,
)
from ..session import DisplayItem, PythonSession, SessionResult
from ._text import bound_text

if TYPE_CHECKING:
    from ..aio import AsyncSandbox
    from ..browser.driver import Browser
    from ..config import ExecutionResult
    from ..policy import SecurityPolicy
    from ..sandbox import Sandbox

__all__ = ["DEFAULT_MAX_OUTPUT_CHARS", "RunOutput", "SandboxRunner"]

#: Characters of ``RunOutput.text`` kept by default (head and tail).
DEFAULT_MAX_OUTPUT_CHARS = 20_000
#: Seconds one call may run by default before it is interrupted.
DEFAULT_TIMEOUT = 300

Language = Literal["python", "shell"]
#: What :meth:`SandboxRunner.describe` describes: a language, or the browse tool.
ToolKind = Literal["python", "shell", "browse"]
#: Seconds one page action of :meth:`SandboxRunner.browse` may take by default
#: (the runner's ``timeout``, if lower, wins), and at most.
BROWSE_TIMEOUT = 30.0
MAX_BROWSE_TIMEOUT = 600.0
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RunOutput:
    """The answer to one runner call, for a model to read.

    ``text`` is what a tool returns to the model: the output, the trailing
    expression's value (``Out: ...``), the traceback or exit status, cut to
    the runner's ``max_output_chars`` (the head and the tail are kept).  The
    other fields are the same facts, structured, for the program.  Every
    text has the sandbox's secrets redacted.

    .. versionadded:: 0.4.0
    """

    text: str
    """Everything the model should see, bounded."""
    ok: bool
    """True when the code ran and succeeded (no exception, exit code 0, no timeout, no denial)."""
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    """Python: ``repr()`` of the trailing expression, as the session returned it."""
    error: str | None = None
    """Python: the traceback; otherwise a one-line reason the call failed."""
    exit_code: int | None = None
    """Shell: the command's exit code (None for Python and file calls)."""
    timed_out: bool = False
    denied: bool = False
    """The policy or an approval hook refused the call (``text`` starts with ``denied:``)."""
    truncated: bool = False
    """Output was cut: by the sandbox's ``max_output_bytes`` or by ``max_output_chars``."""
    display: tuple[DisplayItem, ...] = ()
    """Python: rich outputs (figures, HTML), as :class:`~agentnest.DisplayItem`;
    :meth:`SandboxRunner.browse`: the screenshot (``image/png``)."""
    note: str | None = None
    """The runner's own one-line remark on the call (timed out, interpreter lost), also in ``text``."""

    def __str__(self) -> str:
        return self.text


class SandboxRunner:
    """Run code, commands and file operations in a sandbox on behalf of an agent.

    Example::

        from agentnest import Sandbox
        from agentnest.integrations import SandboxRunner

        with Sandbox(timeout=600) as sandbox:
            runner = SandboxRunner(sandbox)
            runner.run_python("import math; r = 2")
            print(runner.run_python("math.pi * r ** 2").text)   # Out: 12.566370614359172
            print(runner.run_shell("ls /workspace; exit 3").text)

        # 0.3.0's form: the runner creates (and owns) its sandbox.
        with SandboxRunner(network_enabled=False) as runner:
            print(runner.run("print(6 * 7)"))                  # 42

    Args:
        sandbox: a :class:`~agentnest.Sandbox` or :class:`~agentnest.AsyncSandbox`
            to work in; the runner does not own it (``close()`` only ends the
            runner's Python session: destroy it yourself).  ``None`` (or an
            image reference, 0.3.0's ``runtime``) makes the runner create a
            sandbox, ``Sandbox(image, timeout, network_enabled=...,
            security_policy=..., **sandbox_kwargs)``, which it owns:
            ``close()`` destroys it (so do the runner's garbage collection
            and the interpreter's exit).
        timeout: seconds one call may run (Python code is interrupted with
            ``KeyboardInterrupt`` and keeps its variables; a shell command is
            killed with its process tree).  A sandbox the runner creates also
            lives this long (0.3.0's meaning of ``timeout``).
        network_enabled: 0.3.0 switch for open networking of the sandbox the
            runner creates; prefer ``security_policy``.
        security_policy: the policy of the sandbox the runner creates.
        stateful: True (default) runs Python in one persistent session;
            False runs each call in a fresh interpreter (a one-shot
            ``exec_python``), so nothing is kept between calls.
        max_output_chars: bound on ``RunOutput.text`` (and on :meth:`run`'s text).
        raise_denied: raise :class:`PolicyDeniedError` instead of answering
            ``"denied: ..."``.
        runtime: 0.3.0's name for the image of the sandbox the runner
            creates (deprecated: pass the image as the first argument or as
            ``image=``).
        sandbox_kwargs: any other :class:`~agentnest.Sandbox` argument for
            the sandbox the runner creates (``image``, ``memory``,
            ``environment``, ``backend``, ``observers``...).

    Raises:
        ConfigurationError: a bad argument, or a sandbox given together with
            arguments for creating one.

    One call runs at a time (calls from several threads wait their turn):
    the Python session runs one piece of code at a time, like a notebook.
    The ``a``-prefixed methods are the same calls for ``async`` frameworks;
    cancelling one interrupts the Python code it runs (a shell command runs
    on until its timeout).

    .. versionadded:: 0.4.0
       A sandbox as the first argument, ``max_output_chars``, ``raise_denied``
       and ``**sandbox_kwargs``; the ``run_*`` methods.
    """

    def __init__(
        self,
        sandbox: Sandbox | AsyncSandbox | str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        network_enabled: bool = False,
        security_policy: SecurityPolicy | None = None,
        stateful: bool = True,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        raise_denied: bool = False,
        runtime: str | None = None,
        **sandbox_kwargs: Any,
    ) -> None:
        from .._core import core_of
        from ..aio import AsyncSandbox
        from ..sandbox import Sandbox, wrap

        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds")
        if (
            isinstance(max_output_chars, bool)
            or not isinstance(max_output_chars, int)
            or max_output_chars < 200
        ):
            raise ConfigurationError(f"max_output_chars={max_output_chars!r} must be an int of at least 200")
        if not isinstance(stateful, bool):
            raise ConfigurationError(f"stateful={stateful!r} must be True or False")
        if runtime is not None:
            deprecated("SandboxRunner(runtime=)", "image= (or the image as the first argument)")
        if isinstance(sandbox, AsyncSandbox):
            sandbox = wrap(core_of(sandbox))  # a Sandbox face of the same core
        if isinstance(sandbox, Sandbox):
            given = [
                name
                for name, value in (
                    ("network_enabled", network_enabled),
                    ("security_policy", security_policy),
                    ("runtime", runtime),
                )
                if value is not None and value is not False
            ] + sorted(sandbox_kwargs)
            if given:
                raise ConfigurationError(
                    "pass a sandbox or arguments to create one, not both "
                    f"(got a sandbox and {', '.join(given)})"
                )
            self._sandbox = sandbox
            self._owned = False
            self._finalizer: weakref.finalize[Any, Any] | None = None
        elif sandbox is None or isinstance(sandbox, str):
            images = [i for i in (sandbox, runtime, sandbox_kwargs.pop("image", None)) if i is not None]
            if len(images) > 1:
                raise ConfigurationError("give the image once: as the first argument, image= or runtime=")
            # 0.3.0's SandboxRunner created its own sandbox living `timeout`
            # seconds; so does this one, and destroys it on close().
            self._sandbox = Sandbox(
                images[0] if images else None,
                timeout,
                network_enabled=network_enabled,
                security_policy=security_policy,
                **sandbox_kwargs,
            )
            self._owned = True
            # A runner built in passing (0.3.0's build_langchain_tool(**kwargs))
            # has no one to close it: destroy its sandbox when the runner is
            # collected or the interpreter exits, not at its deadline.
            self._finalizer = weakref.finalize(self, self._sandbox.destroy)
        else:
            raise ConfigurationError(
                "SandboxRunner needs a Sandbox, an AsyncSandbox, an image name or nothing, "
                f"not {type(sandbox).__name__}"
            )
        self.timeout = float(timeout)
        self.stateful = stateful
        self.max_output_chars = max_output_chars
        self.raise_denied = bool(raise_denied)
        self._session: PythonSession | None = None
        self._browser: Browser | None = None
        # Serializes calls: a session runs one piece of code at a time, and
        # frameworks may call tools from several threads at once.
        self._lock = threading.RLock()

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox the runner works in."""
        return self._sandbox

    @property
    def owns_sandbox(self) -> bool:
        """True when the runner created its sandbox (``close()`` then destroys it).

        .. versionadded:: 0.4.0
        """
        return self._owned

    # -- 0.3.0's call ----------------------------------------------------------------

    def run(self, code: str) -> str:
        """Run ``code`` and return one combined text, as 0.3.0's ``SandboxRunner.run`` did.

        Stateful: the session's stdout, the trailing expression's ``repr``
        and the traceback, each stripped, one per line.  Stateless:
        stdout and stderr of the one-shot interpreter, stripped.  A timeout,
        a lost interpreter or a denial adds its one-line reason.  The text
        is bounded by ``max_output_chars`` and has secrets redacted;
        :meth:`run_python` returns the same facts structured.

        Raises:
            As :meth:`run_python` does.
        """
        out = self.run_python(code)
        if out.denied:
            return out.text
        if self.stateful:
            parts = [out.stdout.strip(), out.result or "", (out.error or "").strip()]
        else:
            parts = [(out.stdout + out.stderr).strip(), (out.error or "").strip()]
        if out.note and out.note != out.error:
            parts.append(out.note)
        text, _ = bound_text("\n".join(p for p in parts if p).strip(), self.max_output_chars)
        return text

    # -- describing the tools ------------------------------------------------------

    def describe(self, language: ToolKind = "python") -> str:
        """A tool description for a model: what the tool does and what the sandbox allows.

        .. versionchanged:: 0.4.0
           ``"browse"``: the :meth:`browse` tool of a browser sandbox.
        """
        config = self._sandbox.config
        network = config.network
        if network.mode.value == "denied":
            net = "There is no network access."
        elif network.mode.value == "allowlist":
            net = "Network access is limited to: " + ", ".join(network.domains) + "."
        else:
            net = "The network is reachable."
        limits = (
            f"Each call may run {self.timeout:g} seconds; output is cut to about "
            f"{self.max_output_chars} characters. Files live in {config.workdir}. {net}"
        )
        if language == "python" and not self.stateful:
            return (
                "Run Python code in an isolated sandbox, each call in a fresh interpreter: "
                "nothing is kept between calls except files. Print what you need to see. "
                "Errors come back as a traceback. " + limits
            )
        if language == "python":
            return (
                "Run Python code in an isolated, persistent sandbox. Variables, imports and "
                "functions stay defined from one call to the next, like notebook cells. "
                "Print what you need to see; the value of a final expression is shown as 'Out:'. "
                "Errors come back as a traceback. " + limits
            )
        if language == "shell":
            return (
                "Run a shell command (/bin/sh -c) in an isolated sandbox and get its output and "
                "exit code. Files persist between calls. " + limits
            )
        if language == "browse":
            return (
                "Open a web page in the sandbox's browser (Chromium) and get its title, its visible "
                "text, its console messages and a screenshot (PNG, also saved in "
                f"{config.workdir.rstrip('/')}/screenshots). Give an http:// or https:// URL, a "
                "file:// URL or the absolute path of a file in the sandbox "
                f"(e.g. {config.workdir.rstrip('/')}/index.html). " + limits
            )
        raise ConfigurationError(f"language {language!r} is not supported; use 'python' or 'shell'")

    # -- Python ----------------------------------------------------------------------

    def run_python(self, code: str, *, timeout: float | None = None) -> RunOutput:
        """Run ``code`` in the runner's persistent Python session.

        With ``stateful=False`` the code runs in a fresh interpreter instead
        (``exec_python``): ``exit_code`` is set and ``result`` is None.

        Returns:
            A :class:`RunOutput`.  An exception in the code, a timeout or a
            dead interpreter is an answer (``ok=False``), not an error.

        Raises:
            SandboxDestroyedError: the sandbox is gone.
            PolicyDeniedError: only with ``raise_denied=True``.
            ConfigurationError: ``code`` is not a ``str``.
        """
        code = _text(code, "code")
        if not self.stateful:
            return self._run_once(code, self._timeout(timeout))
        with self._lock:
            try:
                result = self._python_session().run(code, timeout=self._timeout(timeout))
            except ExecutionTimeoutError as exc:
                partial = exc.result if isinstance(exc.result, SessionResult) else None
                return self._python_output(
                    partial,
                    timed_out=True,
                    note=f"[timed out after {self._timeout(timeout):g}s: interrupted with KeyboardInterrupt; "
                    "what was defined before is kept]",
                )
            except SessionLostError as exc:
                partial = exc.result if isinstance(exc.result, SessionResult) else None
                note = self._restart_session(str(exc))
                return self._python_output(partial, lost=note)
            except (PolicyDeniedError, ChannelError) as exc:
                return self._refused(exc)
            return self._python_output(result)

    def _run_once(self, code: str, limit: float) -> RunOutput:
        """``stateful=False``: the code in a fresh interpreter (``exec_python``)."""
        return self._one_shot(
            lambda: self._sandbox.exec_python(code, timeout=limit),
            limit,
            "the interpreter was killed",
            lambda exc: f"the sandbox's agent was lost: {exc}",
        )

    def _one_shot(
        self,
        call: Callable[[], ExecutionResult],
        limit: float,
        killed: str,
        lost: Callable[[ChannelError], str],
    ) -> RunOutput:
        """One command under the lock, its failures turned into a :class:`RunOutput`."""
        with self._lock:
            try:
                result = call()
            except ExecutionTimeoutError as exc:
                return self._shell_output(
                    None if isinstance(exc.result, SessionResult) else exc.result,
                    timed_out=True,
                    note=f"[timed out after {limit:g}s: {killed}]",
                )
            except PolicyDeniedError as exc:
                return self._denied(exc)
            except ChannelError as exc:
                return self._failed(lost(exc))
            return self._shell_output(result)

    def reset(self) -> None:
        """Start a fresh Python interpreter: every variable and import is gone."""
        with self._lock:
            if self._session is not None:
                self._session.reset()

    def close(self) -> None:
        """End the runner's Python session; destroy the sandbox if the runner created it.

        A sandbox passed in stays with its owner.  Idempotent.
        """
        with self._lock:
            session, self._session = self._session, None
            browser, self._browser = self._browser, None
            try:
                if session is not None:
                    session.close()
                if browser is not None and not self._sandbox.destroyed:
                    # The browser's session (and Chromium) go; a sandbox
                    # already gone or failing took them with it.
                    with contextlib.suppress(AgentNestError):
                        browser.close()
            finally:
                if self._finalizer is not None:
                    self._finalizer()  # destroys the sandbox, once

    def __enter__(self) -> SandboxRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _python_session(self) -> PythonSession:
        if self._session is None or self._session.closed:
            self._session = self._sandbox.python_session()
        return self._session

    def _restart_session(self, reason: str) -> str:
        """After a lost interpreter: start a fresh one, say so."""
        note = "[the Python interpreter died, so every variable and import is gone"
        try:
            self._python_session().reset()
        except SessionLostError:
            self._session = None  # the next call opens a new session
        return f"{note}; a fresh interpreter was started: {_first_line(reason)}]"

    def _python_output(
        self,
        result: SessionResult | None,
        *,
        timed_out: bool = False,
        note: str | None = None,
        lost: str | None = None,
    ) -> RunOutput:
        parts: list[str] = []
        stdout = stderr = ""
        value = error = None
        display: tuple[DisplayItem, ...] = ()
        truncated = False
        if result is not None:
            stdout, stderr, value, error = result.stdout, result.stderr, result.result, result.error
            display, truncated = result.display, result.truncated
            parts += [p for p in (stdout, stderr) if p]
            parts += [f"[display: {item.mime}]" for item in display]
            if value is not None:
                parts.append(f"Out: {value}")
            if error is not None:
                parts.append(error)
        for extra in (note, lost):
            if extra:
                parts.append(extra)
        if truncated:
            parts.append("[output was cut at the sandbox's output limit]")
        ok = result is not None and result.ok and not timed_out and lost is None
        if error is None and lost is not None:
            error = lost
        text, cut = bound_text(
            "\n".join(p.rstrip("\n") for p in parts) or "(no output)", self.max_output_chars
        )
        return RunOutput(
            text=text,
            ok=ok,
            stdout=stdout,
            stderr=stderr,
            result=value,
            error=error,
            timed_out=timed_out,
            truncated=truncated or cut,
            display=display,
            note=note or lost,
        )

    # -- shell -------------------------------------------------------------------------

    def run_shell(self, command: str, *, timeout: float | None = None) -> RunOutput:
        """Run ``command`` with ``/bin/sh -c`` in the workspace.

        A non-zero exit or a timeout is an answer (``ok=False``).  Raises as
        :meth:`run_python` does.
        """
        command = _text(command, "command")
        limit = self._timeout(timeout)
        return self._one_shot(
            lambda: self._sandbox.exec_shell(command, timeout=limit),
            limit,
            "the command was killed with its processes",
            lambda exc: (
                f"the command took the sandbox's agent down ({_first_line(str(exc))}); "
                "the sandbox and its files are intact"
            ),
        )

    def _shell_output(
        self, result: ExecutionResult | None, *, timed_out: bool = False, note: str | None = None
    ) -> RunOutput:
        stdout = result.stdout if result is not None else ""
        stderr = result.stderr if result is not None else ""
        code = result.exit_code if result is not None else None
        parts = [p for p in (stdout, stderr) if p]
        if result is not None and result.truncated:
            parts.append("[output was cut at the sandbox's output limit]")
        if note:
            parts.append(note)
        elif code not in (0, None):
            parts.append(f"[exit code {code}]")
        text, cut = bound_text(
            "\n".join(p.rstrip("\n") for p in parts) or "(no output)", self.max_output_chars
        )
        return RunOutput(
            text=text,
            ok=result is not None and result.ok and not timed_out,
            stdout=stdout,
            stderr=stderr,
            exit_code=code,
            error=note if timed_out else None,
            timed_out=timed_out,
            truncated=cut or (result is not None and result.truncated),
            note=note,
        )

    # -- files ---------------------------------------------------------------------------

    def read_file(self, path: str) -> RunOutput:
        """Read a text file of the workspace; ``text`` is its content (bounded).

        A missing file, a directory, a path outside the workspace or a
        binary file is an answer (``ok=False``) saying so.
        """
        path = _text(path, "path")
        with self._lock:
            try:
                content = self._sandbox.read_file(path)
            except FileAccessError as exc:
                return self._failed(f"cannot read {path!r}: {exc}")
            except (PolicyDeniedError, ChannelError) as exc:
                return self._refused(exc)
        text, cut = bound_text(content, self.max_output_chars)
        return RunOutput(text=text, ok=True, stdout=content, truncated=cut)

    def write_file(self, path: str, content: str) -> RunOutput:
        """Write ``content`` to a workspace file (parents are created)."""
        path = _text(path, "path")
        content = _text(content, "content")
        with self._lock:
            try:
                self._sandbox.write_file(path, content)
            except FileAccessError as exc:
                return self._failed(f"cannot write {path!r}: {exc}")
            except (PolicyDeniedError, ChannelError) as exc:
                return self._refused(exc)
        size = len(content.encode("utf-8"))
        return RunOutput(text=f"wrote {size} bytes to {path}", ok=True)

    # -- browsing --------------------------------------------------------------------------

    def browse(self, url: str, *, full_page: bool = False, timeout: float | None = None) -> RunOutput:
        """Open ``url`` in a browser sandbox's Chromium: its text, console and a screenshot.

        ``url`` is an http, https or file URL, or the absolute path of a file
        in the sandbox (``/workspace/index.html``).  ``text`` has the page's
        title, URL and status, its visible text (bounded by
        ``max_output_chars``), its console messages and the size and sandbox
        path of the screenshot; ``display`` holds the screenshot itself
        (``image/png``) and ``stdout`` the whole page text.  The screenshot is
        of the viewport (1280x720), or of the whole page with ``full_page``.

        Each page action may take ``timeout`` seconds (by default 30, or the
        runner's ``timeout`` if lower; at most 600).  A page that does not
        load (a bad URL, a site the egress policy refuses, a timeout) is an
        answer (``ok=False``); the browser starts afresh on the next call
        when it had to be stopped.

        Raises:
            UnsupportedCapabilityError: the sandbox is not a browser sandbox
                (create it with ``Sandbox(preset="browser")``).
            ConfigurationError: ``url`` is not a ``str`` or ``full_page`` not a bool.
            SandboxDestroyedError: the sandbox is gone.
            PolicyDeniedError: only with ``raise_denied=True``.

        .. versionadded:: 0.4.0
        """
        from ._browse import format_browse, require_browser_sandbox

        url = _text(url, "url")
        if not isinstance(full_page, bool):
            raise ConfigurationError(f"full_page={full_page!r} must be True or False")
        if timeout is None:
            limit = min(self.timeout, BROWSE_TIMEOUT)
        else:
            limit = min(self._timeout(timeout), MAX_BROWSE_TIMEOUT)
        require_browser_sandbox(self._sandbox)
        with self._lock:
            try:
                if self._browser is None:
                    self._browser = self._sandbox.browser()
                result = self._browser.browse(url, timeout=limit, full_page=full_page)
            except BrowserTimeoutError as exc:
                return self._failed(f"browse {url[:200]!r}: timed out: {exc}", timed_out=True)
            except BrowserError as exc:
                return self._failed(f"browse {url[:200]!r} failed ({type(exc).__name__}): {exc}")
            except ConfigurationError as exc:
                # The URL is the model's: a bad one is an answer it can fix.
                return self._failed(f"browse {url[:200]!r}: {exc}")
            except (PolicyDeniedError, ChannelError) as exc:
                return self._refused(exc)
        text, cut = format_browse(result, self.max_output_chars)
        return RunOutput(
            text=text,
            ok=True,
            stdout=result.text,
            truncated=cut,
            display=(result.screenshot.display,),
        )

    # -- async twins -------------------------------------------------------------------

    async def arun_python(self, code: str, *, timeout: float | None = None) -> RunOutput:
        """:meth:`run_python`, awaited.  Cancelling it interrupts the code."""
        return await self._in_thread(
            functools.partial(self.run_python, code, timeout=timeout), self._interrupt
        )

    async def arun_shell(self, command: str, *, timeout: float | None = None) -> RunOutput:
        """:meth:`run_shell`, awaited.  A cancelled command runs on until its timeout."""
        return await self._in_thread(functools.partial(self.run_shell, command, timeout=timeout))

    async def aread_file(self, path: str) -> RunOutput:
        """:meth:`read_file`, awaited."""
        return await self._in_thread(functools.partial(self.read_file, path))

    async def awrite_file(self, path: str, content: str) -> RunOutput:
        """:meth:`write_file`, awaited."""
        return await self._in_thread(functools.partial(self.write_file, path, content))

    async def abrowse(self, url: str, *, full_page: bool = False, timeout: float | None = None) -> RunOutput:
        """:meth:`browse`, awaited.  A cancelled call runs on until its page's timeout.

        .. versionadded:: 0.4.0
        """
        return await self._in_thread(
            functools.partial(self.browse, url, full_page=full_page, timeout=timeout)
        )

    async def _in_thread(self, call: Callable[[], _T], on_cancel: Callable[[], None] | None = None) -> _T:
        try:
            return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            if on_cancel is not None:
                on_cancel()
            raise

    def _interrupt(self) -> None:
        session = self._session
        if session is not None:
            session.interrupt()

    # -- helpers -----------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds")
        return float(timeout)

    def _denied(self, exc: PolicyDeniedError) -> RunOutput:
        if self.raise_denied:
            raise exc
        reason = str(exc)
        return RunOutput(text=f"denied: {reason}", ok=False, error=reason, denied=True)

    def _refused(self, exc: PolicyDeniedError | ChannelError) -> RunOutput:
        """A call the policy refused, or whose agent was lost, as an answer."""
        if isinstance(exc, PolicyDeniedError):
            return self._denied(exc)
        return self._failed(f"the sandbox's agent was lost: {exc}")

    def _failed(self, reason: str, *, timed_out: bool = False) -> RunOutput:
        text, cut = bound_text(reason, self.max_output_chars)
        return RunOutput(text=text, ok=False, error=reason, truncated=cut, timed_out=timed_out)

    def __repr__(self) -> str:
        owner = " (owned)" if self._owned else ""
        return f"<SandboxRunner of {self._sandbox!r}{owner}>"


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be str, not {type(value).__name__}")
    return value


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:500]
