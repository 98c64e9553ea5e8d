"""OpenTelemetry traces of ``agentnest serve``, where the ``observability`` extra is installed.

Every HTTP request (and websocket) is a SERVER span named after its route
(``POST /v1/sandboxes/{sandbox_id}/exec``), continuing the client's trace when
the request carries a W3C ``traceparent``.  Inside it: ``agentnest.admission``
(the tenant, what it asked for, how long it waited; a refusal is an error
with its reason), ``agentnest.sandbox.start`` (the backend's cold start) and
every guard event of the request as a span event (``exec.started``,
``exec.finished``, ``network.denied``, ...), through
:class:`~agentnest.audit.OpenTelemetryObserver`.  The token's tenant and id
are attributes of the request span; the token itself, headers and query
strings never are.

Only the OpenTelemetry *API* is used: spans go to whatever tracer provider is
configured (``ServerSettings.tracer_provider``, else the global one, e.g. set
up by ``opentelemetry-instrument agentnest serve`` from ``OTEL_*`` variables).
Without a configured SDK every span is a no-op.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
from collections.abc import Iterator
from typing import Any

from .._version import __version__
from ..audit import OpenTelemetryObserver

#: The request span of the request being served (set by the middleware).
_REQUEST_SPAN: contextvars.ContextVar[Any] = contextvars.ContextVar("agentnest_request_span", default=None)


def fastapi_options() -> dict[str, Any]:
    """Extra ``FastAPI(...)`` arguments: FastAPI's own request spans off where it has them
    (0.16x, ``telemetry=``), so each request is one span, ours, on every FastAPI version."""
    from fastapi import FastAPI

    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False}}
    return {}


class _NoSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        pass


class Tracing:
    """The server's tracer, or nothing (``enabled`` False) without ``opentelemetry-api``.

    Args:
        tracer_provider: where spans go (default: the global provider).
        enabled: False turns tracing off even with the API installed.
    """

    def __init__(self, tracer_provider: Any = None, *, enabled: bool = True) -> None:
        self.enabled = False
        self.observer: OpenTelemetryObserver | None = None
        if not enabled:
            return
        try:
            # import_module: the package is optional and untyped here (as audit.py does).
            self._trace = importlib.import_module("opentelemetry.trace")
            self._propagate = importlib.import_module("opentelemetry.propagate")
        except ImportError:
            return
        self.enabled = True
        self.tracer = self._trace.get_tracer("agentnest.server", __version__, tracer_provider=tracer_provider)
        self.observer = OpenTelemetryObserver(self.tracer)

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Any]:
        """A child span of the current one; ``attributes`` are prefixed ``agentnest.``."""
        if not self.enabled:
            yield _NoSpan()
            return
        attrs = {f"agentnest.{k}": v for k, v in attributes.items() if v is not None}
        with self.tracer.start_as_current_span(name, attributes=attrs) as span:
            yield span

    def annotate(self, **attributes: Any) -> None:
        """Set ``agentnest.*`` attributes on the request's span (none outside a request)."""
        span = _REQUEST_SPAN.get()
        if span is None:
            return
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(f"agentnest.{key}", value)


class TracingMiddleware:
    """ASGI middleware: a SERVER span around each request (see the module's docstring)."""

    def __init__(self, app: Any, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        trace = self.tracing._trace
        # Continuing a client's trace is safe: a traceparent only links spans; it
        # carries no authority and is parsed by the OpenTelemetry propagator.
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        context = self.tracing._propagate.extract(carrier)
        method = scope.get("method") or "WEBSOCKET"
        attributes = {
            "http.request.method": method,
            "url.path": str(scope.get("path", ""))[:512],
            "url.scheme": scope.get("scheme", "http"),
        }
        with self.tracing.tracer.start_as_current_span(
            method, context=context, kind=trace.SpanKind.SERVER, attributes=attributes
        ) as span:
            _REQUEST_SPAN.set(span)  # this task's context: the request's code sees it

            async def traced_send(message: Any) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(trace.Status(trace.StatusCode.ERROR))
                await send(message)

            try:
                await self.app(scope, receive, traced_send)
            finally:
                # The router stores the matched route in the (shared) scope.
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)


__all__ = ["Tracing", "TracingMiddleware", "fastapi_options"]
