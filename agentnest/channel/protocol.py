"""Sans-I/O side of the host's protocol: the codec, limits, and reply checks.

Everything the agent sends is untrusted.  This module turns its frames into
typed values or raises :class:`ProtocolViolation`; it never trusts a field
it has not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..agent import limits, wire
from ..agent.wire import PROTOCOL_VERSION, Decoder, Frame, Header, WireError, encode

__all__ = [
    "BINARY_MIMES",
    "DISPLAY_MIMES",
    "HOST_MAX_BODY",
    "MAX_DISPLAY_ITEMS",
    "MAX_SESSION_VALUE",
    "PROTOCOL_VERSION",
    "Decoder",
    "Frame",
    "Header",
    "Hello",
    "ProtocolViolation",
    "RawDisplay",
    "RawExit",
    "RawSessionRun",
    "RawValue",
    "SessionInfo",
    "WireError",
    "encode",
    "new_decoder",
    "parse_display",
    "parse_exit",
    "parse_hello",
    "parse_session_list",
    "parse_session_opened",
    "parse_session_ran",
    "parse_value",
]

#: The agent sends output in frames of at most 256 KiB and file data in 1 MiB;
#: anything larger is a violation.
HOST_MAX_BODY = 2 * 1024 * 1024
#: Display MIME types a Python session may send: a closed table, so that the
#: host (never the sandbox) decides how each is decoded.
DISPLAY_MIMES = limits.DISPLAY_MIMES
#: Of those, the ones whose data is binary (base64 in ``DisplayItem.data``).
BINARY_MIMES = limits.BINARY_MIMES
#: Largest ``value`` body (a result's repr or a traceback, already bounded in
#: the sandbox); a bigger one is a violation.
MAX_SESSION_VALUE = limits.VALUE_MAX_BYTES
#: Display items in one session run; more are dropped (``truncated``).
MAX_DISPLAY_ITEMS = limits.MAX_DISPLAY_ITEMS


class ProtocolViolation(Exception):
    """The agent sent something outside the protocol."""


def new_decoder() -> Decoder:
    return wire.Decoder(max_header_bytes=64 * 1024, max_body_bytes=HOST_MAX_BODY)


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    agent: str
    pid: int
    uid: int
    python: str
    capabilities: frozenset[str]


@dataclass(frozen=True, slots=True)
class RawExit:
    """How a command ended, as the agent reported it (checked)."""

    code: int
    signal: int | None
    timed_out: bool
    truncated: bool
    cancelled: bool
    duration: float
    spawn_error: bool = False


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
    duration = h.get("duration", 0.0)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < 1e7:
        raise ProtocolViolation("exit frame duration is invalid")
    return RawExit(
        code=_int(h, "code", -1, 255),
        signal=sig,
        timed_out=h.get("timed_out") is True,
        truncated=h.get("truncated") is True,
        cancelled=h.get("cancelled") is True,
        duration=float(duration),
        spawn_error=h.get("spawn_error") is True,
    )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A Python session the agent started, attached to or listed (checked)."""

    session: int
    pid: int
    python: str
    name: str | None = None
    """Its name; None for an anonymous session."""
    key: str = ""
    """The id the host gave it, as the agent keeps it ("" if the reply had none)."""
    started: float = 0.0
    """When its interpreter started: Unix time by the sandbox's clock (0.0: not said)."""
    busy: bool = False
    """It runs code or is still starting."""
    attached: bool = False
    """The interpreter already existed: a ``session.open`` by name attached to it."""


@dataclass(frozen=True, slots=True)
class RawSessionRun:
    """How a session run ended, as the agent reported it (checked)."""

    timed_out: bool
    interrupted: bool
    truncated: bool
    duration: float
    lost: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RawDisplay:
    """One complete display item of a session run."""

    mime: str
    data: bytes
    main: bool = False
    """The trailing expression's rich form (not a ``display()`` call)."""


@dataclass(frozen=True, slots=True)
class RawValue:
    """A session run's ``result`` (repr of the trailing expression) or ``error`` (traceback)."""

    name: str
    text: str


def _duration(h: Header) -> float:
    duration = h.get("duration", 0.0)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < 1e7:
        raise ProtocolViolation(f"{h.get('t')!r} frame duration is invalid")
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
        duration=_duration(h),
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
    code = h.get("code")
    msg = h.get("message")
    return (
        code[:40] if isinstance(code, str) else "unknown",
        msg[:2000] if isinstance(msg, str) else "agent reported an error",
    )
