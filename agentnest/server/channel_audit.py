"""Audit events for what a ``remote`` client does over the raw agent channel.

The server relays the agent protocol between a websocket and the agent in the
sandbox (see :mod:`agentnest.server.routes.channel`).  Relaying alone would leave the
server's audit log blind to every command a remote client runs, so the relay
also reads the frames' headers as they pass: a command, a file written, read
or removed becomes the same event a local :class:`~agentnest.Sandbox` records
(``exec.started``, ``exec.finished``/``exec.timed_out``, ``file.*``), with
``actor="remote"`` and the token's id in ``data``.

Only headers are parsed, each at most :data:`~agentnest.agent.wire.MAX_HEADER_BYTES`;
bodies (output, file contents) are counted and skipped, never buffered, so
auditing costs the relay almost nothing on large transfers.  What the client
sends must be well formed: a frame the agent protocol does not allow is a
:class:`~agentnest.agent.wire.WireError`, and the server closes the channel
rather than pass it on.  Environment values are never recorded (a remote
client's secrets travel in them; the server cannot know which are secret),
only their names.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..agent import wire
from ..events import EventType

#: The client's stream opens with the agent bundle, ``b"<length>\\n"`` and that
#: many bytes; its length may have at most this many digits...
MAX_BUNDLE_DIGITS = 9
#: ...and be at most this large (today's bundle is about 60 KB compressed).
MAX_BUNDLE_BYTES = 16 * 1024 * 1024
#: Requests awaiting their answer that the audit remembers; past this the
#: oldest is forgotten (the agent bounds concurrent commands far below it).
MAX_PENDING = 1024
#: At most this many argv items and environment names go into one event.
MAX_ITEMS = 64
#: The first this many bytes of session code go into its event (as locally).
MAX_CODE_BYTES = 2000

Emit = Callable[[EventType, Mapping[str, Any], str], None]
#: One scanned frame: its header, its body's length, the captured start of its body.
Scanned = tuple[wire.Header, int, bytes]


class FrameScanner:
    """Incremental scanner of an agent-protocol byte stream: headers out, bodies skipped.

    ``bundle=True`` for the client's direction, which starts with the
    agent bundle (skipped).  :meth:`feed` returns the frames completed by
    the bytes: each header, its body's length, and the first
    ``capture[kind]`` bytes of its body (empty for kinds not named); it
    raises :class:`~agentnest.agent.wire.WireError` on anything malformed,
    and after an error the scanner stays failed.
    """

    def __init__(self, *, bundle: bool, capture: Mapping[str, int] | None = None) -> None:
        self._state = "bundle" if bundle else "prefix"
        self._capture = dict(capture or {})
        self._buf = bytearray()
        self._skip = 0
        self._need = 0  # header (state "header") or captured body (state "body") bytes expected
        self._body = 0  # the current frame's body length
        self._header: wire.Header = {}
        self._failed: str | None = None

    def feed(self, data: bytes) -> list[Scanned]:
        if self._failed is not None:
            raise wire.WireError(self._failed)
        try:
            return self._feed(data)
        except wire.WireError as exc:
            self._failed = str(exc)
            raise

    def _feed(self, data: bytes) -> list[Scanned]:
        out: list[Scanned] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                continue
            if self._state == "bundle":
                newline = data.find(b"\n", pos)
                stop = end if newline < 0 else newline
                self._buf += data[pos:stop]
                if len(self._buf) > MAX_BUNDLE_DIGITS or (self._buf and not self._buf.isdigit()):
                    raise wire.WireError("the channel does not start with an agent bundle length")
                pos = stop
                if newline < 0:
                    continue
                pos += 1
                if not self._buf:
                    raise wire.WireError("the agent bundle's length is empty")
                size = int(self._buf)
                self._buf.clear()
                if size > MAX_BUNDLE_BYTES:
                    raise wire.WireError(f"an agent bundle of {size} bytes exceeds {MAX_BUNDLE_BYTES}")
                self._skip = size
                self._state = "prefix"
                continue
            if self._state == "prefix":
                take = min(wire.PREFIX_SIZE - len(self._buf), end - pos)
                self._buf += data[pos : pos + take]
                pos += take
                if len(self._buf) < wire.PREFIX_SIZE:
                    continue
                hlen = int.from_bytes(self._buf[:4], "big")
                blen = int.from_bytes(self._buf[4:8], "big")
                self._buf.clear()
                wire.check_prefix(hlen, blen)
                self._need, self._body = hlen, blen
                self._state = "header"
                continue
            take = min(self._need - len(self._buf), end - pos)
            self._buf += data[pos : pos + take]
            pos += take
            if len(self._buf) < self._need:
                continue
            if self._state == "header":
                self._header = wire.decode_header(bytes(self._buf))
                self._buf.clear()
                self._need = min(self._body, self._capture.get(self._header["t"], 0))
                self._state = "body"
                if self._need:
                    continue
            captured = bytes(self._buf)
            self._buf.clear()
            out.append((self._header, self._body, captured))
            self._skip = self._body - len(captured)
            self._state = "prefix"
        return out


class ChannelAudit:
    """Turns one channel's frames, both ways, into audit events.

    Call :meth:`from_client` with each chunk the client sends *before*
    forwarding it (it raises :class:`~agentnest.agent.wire.WireError` for a
    chunk that must not reach the agent), :meth:`from_agent` with each chunk
    the agent sends, and :meth:`close` when the channel ends: commands that
    never reported an exit are recorded as cancelled, which is what the agent
    does to them when its stream closes.
    """

    def __init__(self, emit: Emit, token_id: str) -> None:
        self._emit = emit
        self._token = token_id
        self._client = FrameScanner(bundle=True, capture={"session.run": MAX_CODE_BYTES})
        self._agent = FrameScanner(bundle=False)
        self._agent_failed = False
        # request id -> (kind, event data); both directions run in their own threads
        self._pending: dict[int, tuple[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def _event(self, kind: EventType, data: dict[str, Any]) -> None:
        self._emit(kind, {**data, "token": self._token, "via": "channel"}, "remote")

    def _remember(self, rid: object, kind: str, data: dict[str, Any]) -> None:
        if not isinstance(rid, int):
            return
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._pending.pop(next(iter(self._pending)))
            self._pending[rid] = (kind, data)

    def from_client(self, data: bytes) -> None:
        for header, _, body in self._client.feed(data):
            kind = header["t"]
            rid = header.get("id")
            if kind == "exec":
                argv = header.get("argv")
                env = header.get("env")
                started: dict[str, Any] = {
                    "argv": [str(a) for a in argv[:MAX_ITEMS]] if isinstance(argv, list) else [],
                    "timeout": _number(header.get("timeout")),
                    "cwd": header.get("cwd") if isinstance(header.get("cwd"), str) else None,
                    # Names only: values may be the client's secrets.
                    "env": sorted(str(k) for k in env)[:MAX_ITEMS] if isinstance(env, dict) else [],
                    "pty": isinstance(header.get("pty"), dict),
                }
                self._event(EventType.EXEC_STARTED, started)
                self._remember(rid, "exec", {"argv": started["argv"][:8], "started": time.monotonic()})
            elif kind == "write" and header.get("first"):
                self._remember(rid, "write", {"path": _text(header.get("path"))})
            elif kind in ("read", "remove"):
                self._remember(rid, kind, {"path": _text(header.get("path"))})
            elif kind == "move":
                self._remember(
                    rid, "move", {"path": _text(header.get("path")), "to": _text(header.get("to"))}
                )
            elif kind == "session.run":
                code = body.decode("utf-8", "replace")
                self._remember(rid, "session", {"session": _number(header.get("session")), "code": code})

    def from_agent(self, data: bytes) -> None:
        if self._agent_failed:
            return
        try:
            frames = self._agent.feed(data)
        except wire.WireError:
            # The client's own decoder reports it; the audit just stops here.
            self._agent_failed = True
            return
        for header, _, _ in frames:
            kind = header["t"]
            if kind not in ("exit", "done", "error", "ran"):
                continue
            rid = header.get("id")
            if not isinstance(rid, int):
                continue
            with self._lock:
                pending = self._pending.pop(rid, None)
            if pending is None:
                continue
            what, info = pending
            if kind == "error":
                if what == "exec":  # it never ran (no such program, bad directory...)
                    message = header.get("message")
                    self._event(
                        EventType.EXEC_FINISHED,
                        {"argv": info["argv"], "exit_code": None, "error": _text(message)[:1000]},
                    )
                continue
            if what == "exec" and kind == "exit":
                timed_out = header.get("timed_out") is True
                self._event(
                    EventType.EXEC_TIMED_OUT if timed_out else EventType.EXEC_FINISHED,
                    {
                        "argv": info["argv"],
                        "exit_code": header.get("code") if isinstance(header.get("code"), int) else None,
                        "signal": header.get("signal") if isinstance(header.get("signal"), int) else None,
                        "duration": _number(header.get("duration")),
                        "truncated": header.get("truncated") is True,
                        "cancelled": header.get("cancelled") is True,
                    },
                )
            elif what == "session" and kind == "ran":
                lost = header.get("lost") is True
                self._event(
                    EventType.SESSION_LOST
                    if lost
                    else EventType.SESSION_TIMED_OUT
                    if header.get("timed_out") is True
                    else EventType.SESSION_RAN,
                    {
                        **info,
                        "duration": _number(header.get("duration")),
                        "truncated": header.get("truncated") is True,
                        "interrupted": header.get("interrupted") is True,
                    },
                )
            elif kind == "done" and what in _FILE_EVENTS:
                size = header.get("size")
                data_out: dict[str, Any] = {"path": info["path"]}
                if what == "move":
                    data_out["to"] = info["to"]
                elif what != "remove":
                    data_out["size"] = size if isinstance(size, int) and size >= 0 else None
                self._event(_FILE_EVENTS[what], data_out)

    def close(self) -> None:
        """The channel ended: its unanswered commands were killed by the agent."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for what, info in pending.values():
            if what == "exec":
                self._event(
                    EventType.EXEC_FINISHED,
                    {
                        "argv": info["argv"],
                        "exit_code": None,
                        "signal": None,
                        "duration": round(time.monotonic() - info["started"], 6),
                        "truncated": False,
                        "cancelled": True,
                        "reason": "the channel closed",
                    },
                )


_FILE_EVENTS = {
    "write": EventType.FILE_WRITTEN,
    "read": EventType.FILE_READ,
    "remove": EventType.FILE_REMOVED,
    "move": EventType.FILE_MOVED,
}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


__all__ = ["ChannelAudit", "FrameScanner", "Scanned"]
