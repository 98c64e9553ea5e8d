"""The HTTP routes of ``agentnest serve``: one module a concern, each an ``APIRouter`` over the service.

Every route gets the service and the caller's token from :mod:`.deps`, and
is a thin call on :class:`~agentnest.server.service.Service` or the sandbox
the token owns.  :func:`agentnest.server.app.create_app` includes them.

.. versionadded:: 0.4.0
"""
