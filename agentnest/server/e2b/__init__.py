"""An E2B-compatible face on ``agentnest serve``: the stock E2B SDKs run against a self-hosted AgentNest.

Importing this package needs nothing beyond the server's own dependencies;
the face itself (:mod:`.face`, which :func:`agentnest.server.app.create_app`
mounts) needs ``connectrpc`` (Python 3.11 or later).  docs/e2b.md explains
the mapping.

.. versionadded:: 0.4.0
"""

from .state import DEFAULT_TEMPLATES, ENVD_VERSION, HOME, E2BTemplate, e2b_key

__all__ = ["DEFAULT_TEMPLATES", "ENVD_VERSION", "HOME", "E2BTemplate", "e2b_key"]
