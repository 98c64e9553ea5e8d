"""``agentnest mcp``: sandboxes as tools of the Model Context Protocol.

The package, by concern: :mod:`.settings` (:class:`ServerSettings`: what
the operator decides), :mod:`.service` (:class:`SandboxService`: plain
AgentNest; it owns the sandboxes one server created, enforces the server's
limits and policy ceiling, and turns results into bounded JSON-ready dicts;
it imports no MCP code and is tested without it), :mod:`.server`
(:func:`build_server` puts an MCP face on the service with the official SDK,
``mcp.server.mcpserver.MCPServer`` from the ``mcp`` extra, imported only
there and only when called: one tool per operation, the audit log as
resources, every :class:`~agentnest.errors.AgentNestError` a tool error
(``isError``) with its message, which the guard has redacted; :func:`run`
serves it) and :mod:`.browse` (browser sandboxes and the ``browse`` tool).

Security model (docs/mcp.md):

- The server's :class:`~agentnest.SecurityPolicy` is the ceiling.  A client
  can ask for less memory, fewer CPUs or a shorter lifetime, never more, and
  cannot choose the backend, the network, the environment or a writable root.
  The ceiling is built into the policy each sandbox gets, so the guard itself
  refuses a request over it (with a ``policy.denied`` event).
- Only images the operator allowed: ``allowed_images`` of the policy, else the
  server's own image.  A client cannot make the host pull arbitrary images.
- Browser sandboxes (``preset="browser"``, with the ``browse`` tool) only
  when the operator allows the preset (``ServerSettings.presets``), within
  the same ceiling (see :mod:`agentnest.mcp.browse`).
- Snapshots go to a directory the server owns; clients name them with a short
  validated name, never a host path.
- At most ``max_sandboxes`` live sandboxes, each with a lifetime (it stops
  itself at its deadline even if the server is killed); all of them are
  destroyed when the server stops.

.. versionadded:: 0.4.0
"""

from .server import build_server, run
from .service import MAX_TEXT_CHARS, SandboxService
from .settings import DEFAULT_LIFETIME, DEFAULT_MAX_SANDBOXES, MAX_FILE_BYTES, ServerSettings

__all__ = [
    "DEFAULT_LIFETIME",
    "DEFAULT_MAX_SANDBOXES",
    "MAX_FILE_BYTES",
    "MAX_TEXT_CHARS",
    "SandboxService",
    "ServerSettings",
    "build_server",
    "run",
]
