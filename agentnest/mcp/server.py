"""The MCP face of :class:`~agentnest.mcp.service.SandboxService`: :func:`build_server` and :func:`run`.

It decides how the service looks to an MCP client and nothing about what a
call may do: one tool per service method (with input schemas and read-only,
mutating or destructive hints), the audit log as resources, and every
:class:`~agentnest.errors.AgentNestError` as a tool error (``isError``) with
its message, which the guard has redacted; any other exception becomes the
SDK's generic error, so nothing else leaks.  :func:`run` serves over stdio
or HTTP and destroys every sandbox on the way out.

The official SDK (``mcp.server.mcpserver.MCPServer``, the ``mcp`` extra) is
imported only here and only when called, so importing :mod:`agentnest.mcp`
needs no optional package.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations`` here: the MCP SDK reads the tool
# functions' annotations (built inside build_server from lazily imported
# pydantic) as objects to make the input schemas.

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from ..errors import AgentNestError, MissingDependencyError
from .service import (
    _SANDBOX_ID,
    AUDIT_RETURN,
    DEFAULT_EXEC_TIMEOUT,
    MAX_EXEC_TIMEOUT,
    SandboxService,
)
from .settings import ServerSettings

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

_T = TypeVar("_T")

_INSTRUCTIONS = """\
AgentNest sandboxes: disposable, isolated Linux containers with Python.  Call
create_sandbox first and pass the sandbox_id it returns to the other tools.
Files live under /workspace (relative paths are relative to it).  A sandbox
has no network unless the server allows it, stops at the end of its lifetime
(expires_in), and is gone after destroy.  session_run keeps Python variables
between calls; exec_python starts a fresh interpreter each time."""


def _import_sdk() -> None:
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            "agentnest mcp needs the MCP Python SDK 2.x: pip install 'agentnest[mcp]'"
        ) from exc


def build_server(service: SandboxService) -> "MCPServer":
    """An ``MCPServer`` (MCP Python SDK) whose tools and resources drive ``service``.

    Raises:
        MissingDependencyError: the ``mcp`` extra is not installed.
    """
    _import_sdk()
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
    from mcp.types import ToolAnnotations
    from pydantic import Field

    from .._version import __version__
    from .browse import BROWSE_INSTRUCTIONS

    browsing = "browser" in service.settings.presets
    server: MCPServer = MCPServer(
        "agentnest",
        version=__version__,
        instructions=_INSTRUCTIONS + (BROWSE_INSTRUCTIONS if browsing else ""),
        log_level="WARNING",
    )

    def call(fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except AgentNestError as exc:
            # Messages are written for people and already redacted by the
            # guard; anything else becomes the SDK's generic error (no leak).
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    SandboxId = Annotated[str, Field(description="id returned by create_sandbox", max_length=64)]
    Timeout = Annotated[
        float | None,
        Field(
            description=f"seconds before the command and its processes are killed "
            f"(default {DEFAULT_EXEC_TIMEOUT:g}, at most {MAX_EXEC_TIMEOUT:g})",
            gt=0,
        ),
    ]
    Path_ = Annotated[str, Field(description="path in the workspace, relative to /workspace or absolute")]
    SnapshotName = Annotated[str, Field(description="1-64 letters, digits, '.', '_' or '-'", max_length=64)]
    readonly = ToolAnnotations(read_only_hint=True, destructive_hint=False)
    mutating = ToolAnnotations(read_only_hint=False, destructive_hint=False)
    destructive = ToolAnnotations(read_only_hint=False, destructive_hint=True)

    @server.tool(annotations=mutating)
    def create_sandbox(
        image: Annotated[
            str | None, Field(description="image; only those the server allows (default: its own)")
        ] = None,
        timeout: Annotated[
            float | None,
            Field(
                description="lifetime in seconds; the sandbox stops itself then "
                f"(default {service.settings.lifetime:g}, at most {service.policy.max_timeout:g})",
                gt=0,
            ),
        ] = None,
        memory: Annotated[
            str | None, Field(description="memory limit such as '256m', at most the server's")
        ] = None,
        cpus: Annotated[float | None, Field(description="CPU limit, at most the server's", gt=0)] = None,
        preset: Annotated[
            str | None,
            Field(
                description="'browser' for a sandbox with Chromium, to use with browse; presets this "
                f"server allows: {', '.join(service.settings.presets) or 'none'}",
                max_length=32,
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Create an isolated sandbox and return its sandbox_id, limits and time left."""
        return call(service.create_sandbox, image, timeout, memory, cpus, preset)

    @server.tool(annotations=mutating)
    def exec_shell(
        sandbox_id: SandboxId,
        command: Annotated[str, Field(description="shell script, run with /bin/sh -c in /workspace")],
        timeout: Timeout = None,
    ) -> dict[str, Any]:
        """Run a shell command; returns exit_code, stdout, stderr, timed_out, truncated."""
        return call(service.exec_shell, sandbox_id, command, timeout)

    @server.tool(annotations=mutating)
    def exec_python(
        sandbox_id: SandboxId,
        code: Annotated[str, Field(description="Python source, run by a fresh python3 process")],
        timeout: Timeout = None,
    ) -> dict[str, Any]:
        """Run Python code in a new interpreter; returns exit_code, stdout, stderr."""
        return call(service.exec_python, sandbox_id, code, timeout)

    @server.tool(annotations=mutating)
    def session_run(
        sandbox_id: SandboxId,
        code: Annotated[str, Field(description="Python source; a trailing expression's repr is returned")],
        timeout: Timeout = None,
    ) -> dict[str, Any]:
        """Run code in the sandbox's persistent Python session: variables and imports stay between calls."""
        return call(service.session_run, sandbox_id, code, timeout)

    @server.tool(annotations=readonly)
    def read_file(sandbox_id: SandboxId, path: Path_) -> dict[str, Any]:
        """Read a UTF-8 text file of the workspace (at most 1 MiB)."""
        return call(service.read_file, sandbox_id, path)

    @server.tool(annotations=mutating)
    def write_file(
        sandbox_id: SandboxId,
        path: Path_,
        content: Annotated[str, Field(description="the file's new text (UTF-8, at most 1 MiB)")],
    ) -> dict[str, Any]:
        """Write a text file in the workspace, creating parent directories."""
        return call(service.write_file, sandbox_id, path, content)

    @server.tool(annotations=readonly)
    def list_files(
        sandbox_id: SandboxId,
        path: Annotated[str, Field(description="directory in the workspace")] = ".",
        recursive: Annotated[bool, Field(description="descend into subdirectories")] = False,
    ) -> dict[str, Any]:
        """List a workspace directory (links are listed, never followed; at most 1000 entries)."""
        return call(service.list_files, sandbox_id, path, recursive)

    @server.tool(annotations=mutating)
    def fork(
        sandbox_id: SandboxId,
        timeout: Annotated[
            float | None, Field(description="the new sandbox's lifetime in seconds", gt=0)
        ] = None,
    ) -> dict[str, Any]:
        """Branch a sandbox into a new one with a copy of its workspace; returns the new sandbox."""
        return call(service.fork, sandbox_id, timeout)

    @server.tool(annotations=mutating)
    def snapshot(sandbox_id: SandboxId, name: SnapshotName) -> dict[str, Any]:
        """Save the workspace under a name (kept by the server; a name reused replaces it)."""
        return call(service.snapshot, sandbox_id, name)

    @server.tool(annotations=destructive)
    def restore(sandbox_id: SandboxId, name: SnapshotName) -> dict[str, Any]:
        """Replace the workspace's files with a snapshot made earlier by snapshot."""
        return call(service.restore, sandbox_id, name)

    @server.tool(annotations=destructive)
    def destroy(sandbox_id: SandboxId) -> dict[str, Any]:
        """Destroy a sandbox and everything in it."""
        return call(service.destroy, sandbox_id)

    if browsing:
        from .browse import register_browse

        register_browse(server, service, call, SandboxId, mutating)

    @server.tool(annotations=readonly)
    def list_sandboxes() -> dict[str, Any]:
        """The live sandboxes of this server and how many more may be created."""
        return call(service.list_sandboxes)

    @server.resource(
        "agentnest://audit",
        name="audit",
        description=f"the last {AUDIT_RETURN} audit events of this server's sandboxes (JSON)",
        mime_type="application/json",
    )
    def audit_log() -> str:
        return _json({"events": service.audit()})

    @server.resource(
        "agentnest://sandboxes/{sandbox_id}/audit",
        name="sandbox-audit",
        description=f"the last {AUDIT_RETURN} audit events of one sandbox (JSON)",
        mime_type="application/json",
    )
    def sandbox_audit(sandbox_id: str) -> str:
        if not _SANDBOX_ID.fullmatch(sandbox_id) or not service.knows(sandbox_id):
            raise ResourceNotFoundError(f"no sandbox {sandbox_id!r:.80} on this server")
        return _json({"sandbox_id": sandbox_id, "events": service.audit(sandbox_id)})

    return server


def _json(value: Any) -> str:
    import json

    return json.dumps(value, default=str, indent=1)


def run(
    settings: ServerSettings,
    transport: Literal["stdio", "http"] = "stdio",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Serve until the client disconnects (stdio) or the process is stopped.

    Every sandbox is destroyed on the way out: when stdin ends (stdio), and
    on SIGTERM or SIGINT, after which the process exits with 128 + the signal
    number.  Further signals are ignored while the sandboxes are destroyed.
    """
    _import_sdk()
    service = SandboxService(settings)
    stop = (signal.SIGTERM, signal.SIGINT)
    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.getsignal(sig) for sig in stop} if in_main else {}

    def hold_signals() -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Clean up here and exit at once: unwinding instead would wait for
        # the SDK's stdin reader, a worker thread blocked in read() that no
        # cancellation reaches, so the process would never exit.  (uvicorn
        # runs its own graceful shutdown first and then re-raises the signal
        # to this handler.)
        hold_signals()
        try:
            service.close()
        finally:
            os._exit(128 + signum)

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        server = build_server(service)
        if transport == "stdio":
            server.run("stdio")
        else:
            server.run("streamable-http", host=host, port=port)
    finally:
        hold_signals()  # let the clean-up finish
        try:
            service.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
