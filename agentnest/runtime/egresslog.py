"""The egress proxy's program and its event log, shared by every backend that runs the proxy.

The proxy (:mod:`agentnest.egress`) runs as its own container (Docker) or
Pod (Kubernetes) from its sources shipped in its command line as a bundle,
loaded by the same loader as the agent (:func:`proxy_command`); it writes one
JSON event per connection on stdout.
:class:`EgressLog` takes those lines, as untrusted input, and keeps the
validated events for ``Sandbox.network_log()`` and subscribers.  How the
lines travel differs: an attach stream on Docker (``docker/egress.py``), the
pod's log on Kubernetes (``kubernetes/egress.py``).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import ipaddress
import json
import math
import threading
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from ..egress.rules import EVENT_ALLOWED, EVENT_DENIED, EVENT_READY, REASONS
from .launch import pack, program_command

__all__ = ["LOG_SIZE", "MAX_LINE", "PROXY_MODULES", "EgressLog", "proxy_command", "proxy_source_blob"]

#: Events kept per sandbox for :meth:`EgressLog.log` (the oldest are dropped).
LOG_SIZE = 1000
#: Longest event line read from the proxy; a longer one is dropped.
MAX_LINE = 16 * 1024

#: The proxy's modules, in load order (a module's relative imports come first).
PROXY_MODULES = ("rules", "hello", "head", "proxy", "serve")


@lru_cache(maxsize=1)
def proxy_source_blob() -> str:
    """The proxy's sources (:data:`PROXY_MODULES`), bundled and base64-encoded for its command line."""
    return base64.b64encode(pack("egress", PROXY_MODULES)).decode("ascii")


def proxy_command(python: str, config: Mapping[str, Any]) -> list[str]:
    """The argv that runs the proxy from source with ``config``.

    The sources travel in the command line (about 23 KB), loaded by the
    agent's loader (:func:`agentnest.runtime.launch.program_command`):
    nothing is written to the container's filesystem, so its root stays
    read-only.
    """
    config_json = json.dumps(config, separators=(",", ":"))
    return program_command(python, "egress", proxy_source_blob(), "serve", config_json)


# -- events ------------------------------------------------------------------------


class EgressLog:
    """The egress events of one sandbox, as its proxy reports them.

    ``handle.info["egress"]`` of a Docker sandbox with an allowlist.  Each
    event is a dict: ``type`` (``egress.allowed`` / ``egress.denied``),
    ``host``, ``port``, ``address``, ``reason`` (a key of
    :data:`agentnest.egress.REASONS`), ``detail``, ``method``,
    ``bytes_up``, ``bytes_down``, ``duration`` (seconds), ``time`` (epoch
    seconds, when the connection ended), ``sandbox``.  Lines from the proxy
    are untrusted (it runs in a container next to hostile code): each is
    bounded, parsed strictly, and dropped (counted in :attr:`invalid`) unless
    every field has the right type and range.

    .. versionadded:: 0.4.0
    """

    def __init__(self, sandbox_id: str, size: int = LOG_SIZE) -> None:
        self.sandbox_id = sandbox_id
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self._subscribers: list[Callable[[dict[str, Any]], None]] = []
        self._lock = threading.Lock()
        self.ready = threading.Event()
        self.closed = threading.Event()
        self.invalid = 0
        """Lines from the proxy that were not valid events (dropped)."""
        self.callback_errors: collections.deque[BaseException] = collections.deque(maxlen=20)
        """The latest exceptions raised by subscribers (they cannot reach a caller)."""
        self.listen: tuple[str, int] | None = None

    def subscribe(
        self, callback: Callable[[dict[str, Any]], None], *, replay: bool = True
    ) -> Callable[[], None]:
        """Call ``callback(event)`` for every event, from the reader thread.

        Args:
            callback: receives a fresh copy of each event dict.  It should
                not block; an exception it raises is kept in
                :attr:`callback_errors` and does not stop other subscribers.
            replay: first call it with the events already logged, so that
                none is missed between ``create`` and subscribing.

        Returns:
            A function that unsubscribes.
        """
        with self._lock:
            backlog = list(self._events) if replay else []
            self._subscribers.append(callback)
            for event in backlog:
                self._call(callback, event)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._subscribers.remove(callback)

        return unsubscribe

    def clear(self) -> None:
        """Forget every record kept so far (a pooled sandbox's next user starts with none)."""
        with self._lock:
            self._events.clear()

    def log(self) -> list[dict[str, Any]]:
        """The most recent events (up to ``size``), oldest first; copies."""
        with self._lock:
            return [dict(e) for e in self._events]

    def feed_line(self, line: bytes) -> None:
        """Take one line the proxy wrote (without its newline)."""
        event = self._validate(line)
        if event is None:
            return
        with self._lock:
            self._events.append(event)
            for callback in list(self._subscribers):
                self._call(callback, event)

    def _call(self, callback: Callable[[dict[str, Any]], None], event: dict[str, Any]) -> None:
        try:
            callback(dict(event))
        except Exception as exc:  # a subscriber's bug must not stop the log
            self.callback_errors.append(exc)

    def _validate(self, line: bytes) -> dict[str, Any] | None:
        try:
            raw = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raw = None
        if not isinstance(raw, dict):
            self.invalid += 1
            return None
        kind = raw.get("type")
        if kind == EVENT_READY:
            listen = raw.get("listen")
            if (
                isinstance(listen, list)
                and len(listen) == 2
                and isinstance(listen[0], str)
                and isinstance(listen[1], int)
            ):
                self.listen = (listen[0][:64], listen[1])
            self.ready.set()
            return None
        try:
            event = {
                "type": _choice(kind, (EVENT_ALLOWED, EVENT_DENIED)),
                "host": _text(raw.get("host"), 255),
                "port": _integer(raw.get("port"), 0, 65535),
                "address": _address(raw.get("address")),
                "reason": _choice(raw.get("reason"), tuple(REASONS)),
                "detail": _text(raw.get("detail", ""), 300),
                "method": _text(raw.get("method", ""), 16),
                "bytes_up": _integer(raw.get("bytes_up"), 0, 2**62),
                "bytes_down": _integer(raw.get("bytes_down"), 0, 2**62),
                "duration": _number(raw.get("duration"), 0.0, 1e9),
                "time": _number(raw.get("time"), 0.0, 1e11),
                "sandbox": self.sandbox_id,
            }
        except ValueError:
            self.invalid += 1
            return None
        return event


def _choice(value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(value)
    return value


def _text(value: object, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(value)
    return value


def _integer(value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(value)
    return value


def _number(value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(value)
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise ValueError(value)
    return number


def _address(value: object) -> str:
    if value == "":
        return ""
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(value)
    return str(ipaddress.ip_address(value))
