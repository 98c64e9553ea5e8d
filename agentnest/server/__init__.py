"""``agentnest serve``: the authenticated HTTP API (``server`` extra).

``auth`` (tokens and ceilings) needs nothing extra; ``app`` and ``schemas``
need FastAPI and pydantic and say so with :class:`MissingDependencyError`.
Nothing here is imported by ``import agentnest``.

.. versionadded:: 0.4.0
"""
