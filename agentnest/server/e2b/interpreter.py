"""The code interpreter's ``POST /execute`` (NDJSON) and ``/contexts``, served by AgentNest's Python sessions.

A context is a persistent :class:`~agentnest.AsyncPythonSession` of the
sandbox (counted in its session limit, closed with it); the default one is
opened on the first run without a context.  Output streams as it comes
(secrets redacted by the guard); display items (``display()``, figures,
objects with ``_repr_png_`` and friends) and the trailing expression's value
become ``result`` lines with E2B's MIME keys; an exception becomes the
``error`` line.  Python only: another language is answered with a clear
400.  A client that goes away interrupts the run (``KeyboardInterrupt``),
as the E2B server interrupts its kernel.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ...aio import AsyncPythonSession
from ...errors import AgentNestError, ConfigurationError
from ...session import DisplayItem, SessionResult
from ..inputs import check_env, confine, is_json, media_type
from ..service import MAX_SESSIONS
from .state import Box

#: Seconds between keepalive lines while a run is quiet (the E2B server's).
KEEPALIVE = 5.0
#: Largest piece of code one run takes (characters).
MAX_CODE = 1 << 20
_LANGUAGES = {"python", "py", "python3"}
_MIME_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


@dataclass
class Context:
    id: str
    cwd: str
    session: AsyncPythonSession
    count: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def out(self, owner: Box) -> dict[str, str]:
        return {"id": self.id, "language": "python", "cwd": owner.e2b_path(self.cwd)}


_M = TypeVar("_M", bound=BaseModel)


class ExecuteIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str = Field(max_length=MAX_CODE)
    context_id: str | None = Field(default=None, max_length=128)
    language: str | None = Field(default=None, max_length=64)
    env_vars: dict[str, str] | None = Field(default=None, max_length=1024)


class ContextIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    language: str | None = Field(default=None, max_length=64)
    cwd: str | None = Field(default=None, max_length=4096)


def _language_problem(language: str | None) -> str | None:
    if language is None or language.lower() in _LANGUAGES:
        return None
    return (
        f"language {language[:40]!r} is not available: AgentNest's code interpreter runs Python only "
        "(run other languages with sandbox.commands.run)"
    )


class Interpreter:
    """Contexts and runs of every sandbox (state lives in each :class:`Box`)."""

    async def _open(self, owner: Box, cwd: str | None) -> Context:
        entry = owner.entry
        if len(entry.sessions) >= MAX_SESSIONS:
            raise _Refused(429, f"a sandbox has at most {MAX_SESSIONS} sessions; remove a context first")
        try:
            # Confined before the session opens: a context at "../../.." would start at "/".
            where = confine(owner.workdir, owner.sandbox_path(cwd), cwd)
        except ConfigurationError as exc:
            raise _Refused(400, str(exc)) from None
        session = await entry.sandbox.python_session()
        entry.sessions[session.id] = session
        context = Context(session.id, where, session)
        if where != owner.workdir:
            try:
                result = await session.run(f"import os as _o; _o.chdir({where!r}); del _o", timeout=30)
            except AgentNestError:
                await self._drop(owner, context)
                raise
            if result.error is not None:
                await self._drop(owner, context)
                raise _Refused(
                    400, f"cannot use {cwd!r} as the working directory: {result.error.strip()[-300:]}"
                )
        owner.contexts[context.id] = context
        return context

    async def _drop(self, owner: Box, context: Context) -> None:
        owner.contexts.pop(context.id, None)
        owner.entry.sessions.pop(context.id, None)
        try:
            await context.session.close()
        except AgentNestError:
            pass  # the sandbox is going, its sessions with it

    async def _default(self, owner: Box) -> Context:
        async with owner.opening:
            context = owner.contexts.get(owner.default_context or "")
            if context is None:
                context = await self._open(owner, None)
                owner.default_context = context.id
            return context

    async def execute(self, request: Request, owner: Box) -> Response:
        body: ExecuteIn
        try:
            body = await _body(request, ExecuteIn)
            check_env(body.env_vars or {}, "env_vars")
        except _Refused as exc:
            return _refused(exc.status, exc.message)
        except ConfigurationError as exc:
            return _refused(400, str(exc))
        if body.context_id is not None and body.language is not None:
            return _refused(400, "You can provide context_id or language, but not both at the same time.")
        problem = _language_problem(body.language)
        if problem is not None:
            return _refused(400, problem)
        try:
            if body.context_id is not None:
                context = owner.contexts.get(body.context_id)
                if context is None:
                    return _refused(404, f"Context {body.context_id[:128]} not found")
            else:
                context = await self._default(owner)
        except _Refused as exc:
            return _refused(exc.status, exc.message)
        except AgentNestError as exc:
            return _refused(502, f"cannot open the Python session: {exc}")
        return StreamingResponse(
            self._run(owner, context, body),
            media_type="application/x-ndjson",
            headers={"Cache-Control": "no-store"},
        )

    async def _run(self, owner: Box, context: Context, body: ExecuteIn) -> AsyncIterator[bytes]:
        async with context.lock:  # one run at a time per context, in order
            context.count += 1
            yield _line({"type": "number_of_executions", "execution_count": context.count})
            session = context.session
            with owner.entry.lease.held():
                if body.env_vars:
                    error = await _set_env(session, body.env_vars)
                    if error is not None:
                        yield _line(error)
                        yield _end()
                        return
                try:
                    async for line in _stream(session, shell_escapes(body.code)):
                        yield line
                finally:
                    if body.env_vars:
                        await _restore_env(session)
            yield _end()

    # -- contexts ------------------------------------------------------------------

    async def contexts(self, request: Request, owner: Box, rest: str) -> Response:
        method = request.method
        if rest == "" and method == "GET":
            return JSONResponse([c.out(owner) for c in owner.contexts.values()])
        if rest == "" and method == "POST":
            try:
                body = await _body(request, ContextIn)
            except _Refused as exc:
                return _refused(exc.status, exc.message)
            problem = _language_problem(body.language)
            if problem is not None:
                return _refused(400, problem)
            try:
                context = await self._open(owner, body.cwd)
            except _Refused as exc:
                return _refused(exc.status, exc.message)
            except AgentNestError as exc:
                return _refused(502, f"cannot open the Python session: {exc}")
            return JSONResponse(context.out(owner))
        context_id, _, action = rest.partition("/")
        found = owner.contexts.get(context_id)
        if found is None:
            return _refused(404, f"Context {context_id[:128]} not found")
        context = found
        try:
            if method == "DELETE" and not action:
                await self._drop(owner, context)
                return Response(status_code=204)
            if method == "POST" and action == "restart":
                async with context.lock:
                    await context.session.reset()
                    context.count = 0
                    if context.cwd != owner.workdir:
                        await context.session.run(
                            f"import os as _o; _o.chdir({context.cwd!r}); del _o", timeout=30
                        )
                return Response(status_code=204)
        except AgentNestError as exc:
            return _refused(502, f"the Python session failed: {exc}")
        return _refused(404, f"{method} /contexts/{rest[:100]} is not a route")


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _refused(status: int, message: str) -> Response:
    """An error as the code interpreter's server (FastAPI) answers one: ``{"detail": message}``."""
    return JSONResponse({"detail": message}, status_code=status)


async def _body(request: Request, model: type[_M]) -> _M:
    """The request's JSON body as ``model`` (415 for another content type, 400 for bad JSON)."""
    kind = request.headers.get("content-type")
    if not is_json(kind):
        raise _Refused(415, f"unsupported Content-Type {media_type(kind)[:80]!r}: send application/json")
    try:
        return model.model_validate_json(await request.body() or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise _Refused(400, f"malformed request: {where}: {first.get('msg', 'invalid')}") from None


_ESCAPE = re.compile(r"^[ \t]*(?:!|%pip |%conda )", re.MULTILINE)
_SHELL_HELPER = (
    "def _agentnest_shell_(command):\n"
    "    import subprocess as _s, sys as _y\n"
    "    _p = _s.run(command, shell=True, stdout=_s.PIPE, stderr=_s.STDOUT)\n"
    "    _y.stdout.write(_p.stdout.decode('utf-8', 'replace'))\n"
)


def shell_escapes(code: str) -> str:
    """IPython's ``!command`` and ``%pip ...`` lines, as a notebook kernel runs them.

    Code that compiles as it is stays as it is (a ``!`` inside a string is
    never touched); otherwise each line that starts with ``!`` (or ``%pip``,
    ``%conda``) runs its command in a shell, output to stdout, exit status
    ignored, as IPython does.  Agent frameworks send these (smolagents' E2B
    executor installs its packages with ``!pip install``).
    """
    if _ESCAPE.search(code) is None:
        return code  # the common case: no line that could be one, nothing compiled here
    try:
        compile(code, "<cell>", "exec", dont_inherit=True)
        return code
    except (SyntaxError, ValueError):
        pass
    lines = code.split("\n")
    changed = False
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        command = None
        if stripped.startswith("!") or stripped.startswith(("%pip ", "%conda ")):
            command = stripped[1:]
        if command is not None:
            lines[i] = f"{indent}_agentnest_shell_({command.strip()!r})"
            changed = True
    return _SHELL_HELPER + "\n".join(lines) if changed else code


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8") + b"\n"


def _end() -> bytes:
    return _line({"type": "end_of_execution"})


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


async def _set_env(session: AsyncPythonSession, env: dict[str, str]) -> dict[str, Any] | None:
    code = (
        "import os as _o\n"
        f"_agentnest_env_saved = {{k: _o.environ.get(k) for k in {list(env)!r}}}\n"
        f"_o.environ.update({env!r})\n"
        "del _o\n"
    )
    result = await session.run(code, timeout=30)
    return None if result.error is None else _error(result.error)


async def _restore_env(session: AsyncPythonSession) -> None:
    code = (
        "import os as _o\n"
        "for _k, _v in _agentnest_env_saved.items():\n"
        "    _o.environ.pop(_k, None) if _v is None else _o.environ.__setitem__(_k, _v)\n"
        "del _o, _k, _v, _agentnest_env_saved\n"
    )
    try:
        await session.run(code, timeout=30)
    except AgentNestError:
        pass  # the session is gone: nothing left to restore


async def _stream(session: AsyncPythonSession, code: str) -> AsyncIterator[bytes]:
    """The run's lines: output as it comes (keepalives while quiet), then results and the error."""
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
    stream = session.stream(code, timeout=None)

    async def pump() -> None:
        try:
            async for chunk in stream:
                if chunk.data:
                    queue.put_nowait(_line({"type": chunk.stream, "text": chunk.data, "timestamp": _now()}))
        except BaseException as exc:  # handed to the reader, which raises or reports it
            queue.put_nowait(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            queue.put_nowait(None)

    task = asyncio.ensure_future(pump())
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), KEEPALIVE)
            except asyncio.TimeoutError:
                yield _line({"type": "keepalive"})
                continue
            if item is None:
                break
            if isinstance(item, AgentNestError):
                yield _line(
                    {"type": "error", "name": type(item).__name__, "value": str(item), "traceback": str(item)}
                )
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if not task.done():
            # The client went away mid-run: interrupt the code (the session stays).  The pump's
            # cancellation does it (and closes the stream once its fetch returned: closing it
            # first, from here, would close a generator its thread is still running).
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(task, return_exceptions=True)
                await stream.aclose()
    result = stream.result
    if result is not None:
        for doc in _results(result):
            yield _line(doc)
        if result.error is not None:
            yield _line(_error(result.error))


def _bundle(item: DisplayItem) -> dict[str, Any]:
    """One display item (one ``display()`` call shows one, its richest form) under E2B's keys."""
    key = _MIME_KEYS.get(item.mime)
    if key == "json":
        try:
            return {"json": json.loads(item.data)}
        except ValueError:
            key = None
    return {"extra": {item.mime: item.data}} if key is None else {key: item.data}


def _results(result: SessionResult) -> list[dict[str, Any]]:
    """``display_data`` results, then the ``execute_result``: the trailing value's text and its rich form."""
    docs = [
        {"type": "result", "is_main_result": False, **_bundle(item)}
        for item in result.display
        if not item.result
    ]
    if result.result is not None:
        main: dict[str, Any] = {"type": "result", "is_main_result": True, "text": result.result}
        for item in result.display:
            if item.result:
                main.update(_bundle(item))
        docs.append(main)
    return docs


def _error(traceback: str) -> dict[str, Any]:
    """E2B's error line from a formatted traceback: the last line is ``Name: value``."""
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "Error"
    name, sep, value = last.partition(":")
    if not sep or " " in name.strip():
        name, value = "Error", last
    # The class's own name, as a kernel reports it: "json.decoder.JSONDecodeError" and a
    # class defined in a function ("f.<locals>.Stop") are "JSONDecodeError" and "Stop".
    name = name.strip().rsplit(".", 1)[-1]
    return {"type": "error", "name": name, "value": value.strip(), "traceback": traceback}
