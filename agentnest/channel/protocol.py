"""Sans-I/O side of the host's protocol: the codec, limits, and every check on the agent's frames.

Everything the agent sends is untrusted: each field, the frames a request accepts, the output
budget, the bounds of a read or a listing, the deadline and the heartbeat are checked here and
turned into typed values or :class:`ProtocolViolation`; ``client.py`` only moves bytes.
"""

from __future__ import annotations

import json
from typing import Any

from ..agent import limits, wire
from ..agent.wire import PROTOCOL_VERSION, Decoder, Frame, Header, WireError, encode
from ..errors import ChannelError, FileAccessError, FileTooLargeError, SessionLostError
from .values import Hello, RawDisplay, RawExit, RawSessionRun, RawValue, SessionBusy, SessionInfo

__all__ = [
    "BINARY_MIMES", "DISPLAY_MIMES", "HOST_MAX_BODY", "MAX_DISPLAY_ITEMS", "MAX_SESSION_VALUE",
    "PROTOCOL_VERSION", "Collected", "Decoder", "ExecFrames", "Frame", "Header", "Hello", "ProtocolViolation",
    "RawDisplay", "RawExit", "RawSessionRun", "RawValue", "RunFrames", "SessionBusy", "SessionInfo",
    "WireError", "check_opened", "check_written", "encode", "error_fields", "new_decoder", "parse_display",
    "parse_exit", "parse_hello", "parse_session_list", "parse_session_opened", "parse_session_ran",
    "parse_value", "raise_if_error", "session_error", "session_reply", "wait_time",
]  # fmt: skip

#: The agent sends output in frames of at most 256 KiB, file data in 1 MiB: anything larger is a violation.
HOST_MAX_BODY = 2 * 1024 * 1024
#: Display MIME types a Python session may send: a closed table, so that the
#: host (never the sandbox) decides how each is decoded.
DISPLAY_MIMES = limits.DISPLAY_MIMES
#: Of those, the ones whose data is binary (base64 in ``DisplayItem.data``).
BINARY_MIMES = limits.BINARY_MIMES
#: Largest ``value`` body (a result's repr or a traceback, bounded in the sandbox too); more is a violation.
MAX_SESSION_VALUE = limits.VALUE_MAX_BYTES
#: Display items in one session run; more are dropped (``truncated``).
MAX_DISPLAY_ITEMS = limits.MAX_DISPLAY_ITEMS
Out = tuple[int, bytes]  # an ``out`` frame's (fd, bytes)


class ProtocolViolation(Exception):
    """The agent broke the protocol: the channel closes (with ``reason``), the caller gets ``error``."""

    def __init__(self, what: str, *, reason: str | None = None, error: str | None = None) -> None:
        super().__init__(what)
        self.reason = f"protocol violation: {what}" if reason is None else reason
        self.error = f"the agent broke the protocol: {what}" if error is None else error


def new_decoder() -> Decoder:
    return wire.Decoder(max_header_bytes=64 * 1024, max_body_bytes=HOST_MAX_BODY)


def _int(h: Header, key: str, low: int, high: int) -> int:
    v = h.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ProtocolViolation(f"{h.get('t')!r} frame field {key!r} is invalid: {v!r:.40}")
    return v


def _str(h: Header, key: str, max_len: int = 200) -> str:
    v = h.get(key)
    if not isinstance(v, str) or len(v) > max_len:
        raise ProtocolViolation(f"{h.get('t')!r} frame field {key!r} is invalid")
    return v


def parse_hello(h: Header) -> Hello:
    if h.get("t") != "hello":
        raise ProtocolViolation(f"expected a hello frame, got {h.get('t')!r:.40}")
    version = _int(h, "v", 0, 1 << 16)
    if version != PROTOCOL_VERSION:
        raise ProtocolViolation(f"agent speaks protocol {version}, this host speaks {PROTOCOL_VERSION}")
    caps = h.get("caps", [])
    if not isinstance(caps, list) or len(caps) > 64 or not all(isinstance(c, str) for c in caps):
        raise ProtocolViolation("hello frame capabilities are invalid")
    return Hello(
        version=version,
        agent=_str(h, "agent", 40),
        pid=_int(h, "pid", 1, 1 << 22),
        uid=_int(h, "uid", 0, 1 << 32),
        python=_str(h, "python", 40),
        capabilities=frozenset(c[:40] for c in caps),
    )


def parse_exit(h: Header) -> RawExit:
    sig = h.get("signal")
    if sig is not None and (isinstance(sig, bool) or not isinstance(sig, int) or not 0 < sig < 128):
        raise ProtocolViolation("exit frame signal is invalid")
    duration = _duration(h, "exit")
    return RawExit(
        code=_int(h, "code", -1, 255),
        signal=sig,
        timed_out=h.get("timed_out") is True,
        truncated=h.get("truncated") is True,
        cancelled=h.get("cancelled") is True,
        duration=duration,
        spawn_error=h.get("spawn_error") is True,
    )


def _duration(h: Header, kind: str) -> float:
    duration = h.get("duration", 0.0)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < 1e7:
        raise ProtocolViolation(f"{kind} frame duration is invalid")
    return float(duration)


def parse_session_opened(h: Header) -> SessionInfo:
    if h.get("t") != "done":
        raise ProtocolViolation(f"expected a done frame for the session, got {h.get('t')!r:.40}")
    return _session(h)


def parse_session_list(h: Header) -> tuple[SessionInfo, ...]:
    """The reply to ``session.list``: at most ``MAX_SESSIONS`` distinct live sessions."""
    if h.get("t") != "done":
        raise ProtocolViolation(f"expected a done frame for the session list, got {h.get('t')!r:.40}")
    entries = h.get("sessions")
    if not isinstance(entries, list) or len(entries) > limits.MAX_SESSIONS:
        raise ProtocolViolation(f"the session list is not a list of at most {limits.MAX_SESSIONS}")
    found: list[SessionInfo] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise ProtocolViolation("a session list entry is not an object")
        info = _session(entry)
        if not info.key:
            raise ProtocolViolation("a session list entry has no key")
        found.append(info)
    names = [i.name for i in found if i.name is not None]
    if len({i.session for i in found}) != len(found) or len(set(names)) != len(names):
        raise ProtocolViolation("the session list repeats a session or a name")
    return tuple(found)


def _session(h: Header) -> SessionInfo:
    name = h.get("name")
    if name is not None and not limits.valid_name(name):
        raise ProtocolViolation(f"session name {name!r:.80} is invalid")
    key = h.get("key", "")
    if key != "" and not limits.valid_key(key):
        raise ProtocolViolation(f"session key {key!r:.80} is invalid")
    started = h.get("started", 0.0)
    # NaN and infinities fail the range check too.
    if isinstance(started, bool) or not isinstance(started, (int, float)) or not 0 <= started < 1e11:
        raise ProtocolViolation(f"session start time {started!r:.40} is invalid")
    state = h.get("state", "idle")
    if state not in ("starting", "idle", "running"):
        raise ProtocolViolation(f"session state {state!r:.40} is invalid")
    return SessionInfo(
        session=_int(h, "session", 1, 1 << 62),
        pid=_int(h, "pid", 1, 1 << 22),
        python=_str(h, "python", 40),
        name=name,
        key=key,
        started=float(started),
        busy=state != "idle",
        attached=h.get("attached") is True,
    )


def parse_session_ran(h: Header) -> RawSessionRun:
    reason = h.get("reason", "")
    if not isinstance(reason, str):
        raise ProtocolViolation("ran frame reason is invalid")
    return RawSessionRun(
        timed_out=h.get("timed_out") is True,
        interrupted=h.get("interrupted") is True,
        truncated=h.get("truncated") is True,
        duration=_duration(h, repr(h.get("t"))),
        lost=h.get("lost") is True,
        reason=reason[:1000],
    )


def parse_display(h: Header) -> tuple[str, bool]:
    """The (mime, final) of one piece of a display item."""
    mime = h.get("mime")
    if not isinstance(mime, str) or mime not in DISPLAY_MIMES:
        raise ProtocolViolation(f"display frame MIME type {mime!r:.60} is not one AgentNest accepts")
    return mime, h.get("final") is True


def parse_value(h: Header, body: bytes) -> RawValue:
    name = h.get("name")
    if name not in ("result", "error"):
        raise ProtocolViolation(f"value frame name {name!r:.40} is invalid")
    if len(body) > MAX_SESSION_VALUE:
        raise ProtocolViolation(f"value frame of {len(body)} bytes is over the limit of {MAX_SESSION_VALUE}")
    return RawValue(name, body.decode("utf-8", "replace"))


def error_fields(h: Header) -> tuple[str, str]:
    """The (code, message) of an error frame, bounded."""
    code, msg = h.get("code"), h.get("message")
    code = code[:40] if isinstance(code, str) else "unknown"
    return code, msg[:2000] if isinstance(msg, str) else "agent reported an error"


def wait_time(left: float | None, quiet: float, stall: float | None, held: bool, what: str) -> float | None:
    """How long to wait for a frame (None: no limit), ``left`` seconds before the deadline; with ``stall``,
    ``quiet`` seconds without a frame (since the last, or the request) fail too unless ``held`` (paused).
    A late agent misbehaves: drop the channel so the owner starts a fresh agent instead of waiting."""
    if left is not None and left <= 0:
        late = f"the agent did not deliver {what} in time; the channel was reset"
    elif stall is not None and not held and quiet >= stall:
        late = f"the channel stalled for {quiet:.0f}s (no heartbeat) while waiting for {what}; it was reset"
    elif stall is None:
        return left
    else:
        wait = 1.0 if held else stall - quiet  # held: look again once resumed
        return wait if left is None else min(left, wait)
    raise ProtocolViolation(late, reason="the agent stopped answering", error=late)


def raise_if_error(h: Header, path: str | None) -> None:
    """Raise the error an ``error`` reply names, from a closed table; any other frame passes."""
    if h["t"] != "error":
        return
    code, message = error_fields(h)
    if code in ("protocol", "internal", "unknown", "invalid"):
        raise ChannelError(f"the agent refused the request ({code}): {message}")
    if code == "too_large":
        raise FileTooLargeError(message, path=path)
    raise FileAccessError(message, path=path, code=code)


def session_error(h: Header) -> Exception:
    code, message = error_fields(h)
    # A closed table: the agent's code picks one of these, never a class.
    if code in ("session_lost", "no_session", "spawn", "too_many_sessions"):
        return SessionLostError(message)
    if code == "busy":
        return SessionBusy(f"the agent refused the run: {message}")
    return ChannelError(f"the agent refused the session request ({code}): {message}")


def session_reply(reply: Header, asked: str) -> Header:
    """The ``done`` reply to session request ``asked``; an ``error`` reply raises its error."""
    if reply["t"] == "error":
        raise session_error(reply)
    if reply["t"] != "done":
        what = f"{reply['t']!r:.30} frame in reply to {asked!r}"
        raise ProtocolViolation(what, error=f"the agent answered {asked!r} with a {reply['t']!r:.30} frame")
    return reply


def check_opened(reply: Header, *, reset: int | None, name: str | None) -> SessionInfo:
    """The session a ``session.open`` (``reset``: ``session.reset``) started: the one asked for."""
    info = parse_session_opened(reply)
    did = "reset another session" if reset is not None and info.session != reset else ""
    did = "opened a session of another name" if reset is None and info.name != name else did
    if did:
        raise ProtocolViolation(f"the agent {did}", error=f"the agent broke the protocol: it {did}")
    return info


def check_written(reply: Header, path: str, n: int) -> None:
    """A write's reply: no error, and ``size`` is the ``n`` bytes sent."""
    raise_if_error(reply, path)
    if not isinstance(size := reply.get("size"), int) or size != n:
        raise ChannelError(f"the agent reported {size!r} bytes written for {path!r}, expected {n}")


class Collected:
    """The ``data`` and ``done`` that answer a file read, or a listing (``max_entries``): past
    ``max_bytes`` or ``max_entries``, or not JSON, is a violation; a ``done`` that disagrees fails."""

    def __init__(self, what: str, path: str, max_bytes: int, max_entries: int | None = None) -> None:
        self.what, self.path, self.total, self.max_entries = what, path, 0, max_entries
        self.chunks, self.entries = list[bytes](), list[Any]()
        # A listing's entry is a path (at most a few KiB) and four numbers.
        self.max_bytes = max_bytes if max_entries is None else max_entries * 8192

    def receive(self, h: Header, body: bytes) -> Header | None:
        """None after a ``data`` frame; the ``done`` header once it agrees with the data."""
        if h["t"] == "data":
            self.total += len(body)
            if self.total > self.max_bytes:
                raise _sent(
                    f"more than allowed for {self.what}", f"more than {self.max_bytes} bytes for {self.what}"
                )
            if self.max_entries is None:
                self.chunks.append(body)
                return None
            try:
                self.entries.extend(json.loads(line) for line in body.splitlines() if line)
            except (ValueError, RecursionError):  # nested past the parser's stack: malformed too
                raise _sent("a malformed listing", "a malformed listing") from None
            if len(self.entries) > self.max_entries:
                raise _sent("more entries than asked for", f"more than {self.max_entries} entries")
            return None
        if h["t"] != "done":
            raise_if_error(h, self.path)
            raise ChannelError(f"unexpected {h['t']!r:.30} frame for {self.what}")
        if self.max_entries is None and h.get("size") != self.total:
            raise ChannelError(f"the agent's size for {self.path!r} does not match its data")
        listed = h.get("count") == len(self.entries) and isinstance(h.get("truncated"), bool)
        if self.max_entries is not None and not listed:
            raise ChannelError("the agent's listing count does not match its entries")
        return h


def _sent(what: str, error: str) -> ProtocolViolation:
    return ProtocolViolation(what, reason=f"the agent sent {what}", error=f"the agent sent {error}")


class Output:
    """A command's or a run's output, cut at the caller's ``max_output`` (``truncated``)."""

    def __init__(self, max_output: int) -> None:
        self.max, self.seen, self.truncated = max_output, 0, False
        self.held = 0  # bytes of a display item still in pieces: they count against the budget
        self.ended = False  # the request's last frame came (its outcome or an error): stop listening

    def out(self, h: Header, body: bytes) -> Out | None:
        """An ``out`` frame's (fd, bytes), cut to the budget; None when nothing of it is left."""
        fd = h.get("fd")
        if fd not in (1, 2):
            raise ProtocolViolation("output frame with an invalid fd")
        room = self.max - self.seen - self.held
        if len(body) > room:
            self.truncated = True
            body = body[: max(room, 0)]
        self.seen += len(body)
        return (fd, body) if body else None


class ExecFrames(Output):
    """What a command may send: ``out`` frames, then its ``exit`` (or an ``error`` reply)."""

    result: RawExit | None = None

    def receive(self, h: Header, body: bytes) -> Out | RawExit | None:
        if h["t"] == "out":
            return self.out(h, body)
        if h["t"] == "exit":
            self.result = parse_exit(h)
            self.ended = True
            return self.result
        self.ended = h["t"] == "error"
        raise_if_error(h, None)
        raise ProtocolViolation(f"unexpected {h['t']!r:.30} frame during a command")


class RunFrames(Output):
    """What a session run may send: ``out``, ``display`` pieces, one value of each name, then ``ran``;
    output and display items share the budget, and at most :data:`MAX_DISPLAY_ITEMS` items are kept."""

    result: RawSessionRun | None = None

    def __init__(self, max_output: int) -> None:
        super().__init__(max_output)
        self.mime: str | None = None
        self.items, self.parts, self.dropping, self.values = 0, list[bytes](), False, set[str]()

    def receive(self, h: Header, body: bytes) -> Out | RawDisplay | RawValue | RawSessionRun | None:
        kind = h["t"]
        if kind == "out":
            return self.out(h, body)
        if kind == "display":
            return self._display(h, body)
        if kind == "value":
            value = parse_value(h, body)
            if value.name in self.values:
                raise ProtocolViolation(f"a second {value.name!r} value in one run")
            self.values.add(value.name)
            return value
        if kind == "ran":
            if self.mime is not None:
                raise ProtocolViolation("the run ended inside a display item")
            self.result = parse_session_ran(h)
            self.ended = True
            return self.result
        if kind == "error":
            self.ended = True
            raise session_error(h)
        raise ProtocolViolation(f"unexpected {kind!r:.30} frame during a session run")

    def _display(self, h: Header, body: bytes) -> RawDisplay | None:
        mime, final = parse_display(h)
        if self.mime is not None and mime != self.mime:
            raise ProtocolViolation("a display item changed its MIME type midway")
        self.mime = mime
        if not self.dropping:
            if self.items >= MAX_DISPLAY_ITEMS or self.seen + self.held + len(body) > self.max:
                # Over budget: drop the whole item, never hand out part of an image.
                self.dropping, self.truncated, self.parts, self.held = True, True, [], 0
            else:
                self.parts.append(body)
                self.held += len(body)
        if not final:
            return None
        item = None if self.dropping else RawDisplay(mime, b"".join(self.parts), h.get("main") is True)
        if item is not None:
            self.items += 1
            self.seen += self.held
        self.mime, self.parts, self.held, self.dropping = None, [], 0, False
        return item
