"""Sans-I/O side of the host's protocol: the codec, limits, and reply checks.

Everything the agent sends is untrusted.  This module turns its frames into
typed values or raises :class:`ProtocolViolation`; it never trusts a field
it has not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..agent import wire
from ..agent.wire import PROTOCOL_VERSION, Decoder, Frame, Header, WireError, encode

__all__ = [
    "HOST_MAX_BODY",
    "PROTOCOL_VERSION",
    "Decoder",
    "Frame",
    "Header",
    "Hello",
    "ProtocolViolation",
    "RawExit",
    "WireError",
    "encode",
    "new_decoder",
    "parse_exit",
    "parse_hello",
]

#: The agent sends output in frames of at most 256 KiB and file data in 1 MiB;
#: anything larger is a violation.
HOST_MAX_BODY = 2 * 1024 * 1024


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


def error_fields(h: Header) -> tuple[str, str]:
    """The (code, message) of an error frame, bounded."""
    code = h.get("code")
    msg = h.get("message")
    return (
        code[:40] if isinstance(code, str) else "unknown",
        msg[:2000] if isinstance(msg, str) else "agent reported an error",
    )


def field(h: Header, key: str, default: Any = None) -> Any:
    return h.get(key, default)
