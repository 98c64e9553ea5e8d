"""The one frame codec of the agent protocol, shared by the agent and the host.

A frame is::

    +----------------+----------------+------------------+-------------+
    | header length  | body length    | header           | body        |
    | 4 bytes, BE    | 4 bytes, BE    | JSON object UTF-8| raw bytes   |
    +----------------+----------------+------------------+-------------+

The header is a JSON object with at least ``"t"`` (the frame type) and, for
anything tied to a request, ``"id"`` (an integer chosen by the host).  Bodies
carry raw bytes (command output, file contents) so that they never pass
through JSON.

This module is stdlib-only and imports nothing outside ``agent/``: it is
shipped into the sandbox as source.  The host imports the very same module
(``agentnest.channel.protocol``), so both ends cannot drift apart.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Dict, List, Optional, Tuple

PROTOCOL_VERSION = 1

_PREFIX = struct.Struct(">II")
PREFIX_SIZE = _PREFIX.size

#: Hard ceiling on a header.  Headers are small JSON objects; anything bigger
#: is a protocol violation, not a large message.
MAX_HEADER_BYTES = 64 * 1024
#: Default ceiling on a body.  Large payloads are sent as many frames.
MAX_BODY_BYTES = 4 * 1024 * 1024

Header = Dict[str, Any]
Frame = Tuple[Header, bytes]


class WireError(Exception):
    """The peer sent bytes that are not a valid frame."""


def encode(header: Header, body: bytes = b"") -> bytes:
    """Encode one frame."""
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return b"".join((_PREFIX.pack(len(raw), len(body)), raw, body))


class Decoder:
    """Incremental, bounded frame decoder (sans-I/O).

    Feed it bytes with :meth:`feed`, then pull complete frames with
    :meth:`frames`.  A frame larger than the limits raises :class:`WireError`
    before its bytes are buffered, so a hostile peer cannot make the decoder
    hold more than ``max_header_bytes + max_body_bytes`` plus one read.
    """

    def __init__(
        self,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._buf = bytearray()
        self._max_header = max_header_bytes
        self._max_body = max_body_bytes
        self._need: Optional[Tuple[int, int]] = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> List[Frame]:
        out: List[Frame] = []
        buf = self._buf
        pos = 0
        while True:
            if self._need is None:
                if len(buf) - pos < PREFIX_SIZE:
                    break
                hlen, blen = _PREFIX.unpack_from(buf, pos)
                check_prefix(hlen, blen, self._max_header, self._max_body)
                self._need = (hlen, blen)
                pos += PREFIX_SIZE
            hlen, blen = self._need
            if len(buf) - pos < hlen + blen:
                break
            raw = bytes(buf[pos : pos + hlen])
            body = bytes(buf[pos + hlen : pos + hlen + blen])
            pos += hlen + blen
            self._need = None
            out.append((decode_header(raw), body))
        if pos:
            del buf[:pos]
        return out


def check_prefix(
    hlen: int, blen: int, max_header: int = MAX_HEADER_BYTES, max_body: int = MAX_BODY_BYTES
) -> None:
    """Refuse a frame whose prefix announces a header or body out of bounds."""
    if hlen == 0 or hlen > max_header:
        raise WireError(f"frame header of {hlen} bytes is out of bounds")
    if blen > max_body:
        raise WireError(f"frame body of {blen} bytes exceeds the limit of {max_body}")


def decode_header(raw: bytes) -> Header:
    """Strictly decode a header: UTF-8, a JSON object, a string ``t``."""
    try:
        header = json.loads(raw.decode("utf-8", errors="strict"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # RecursionError: a header nested deeper than the parser's stack is not a ValueError,
        # and left uncaught it would end the reader without marking the channel broken.
        raise WireError(f"frame header is not valid UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise WireError("frame header is not a JSON object")
    kind = header.get("t")
    if not isinstance(kind, str):
        raise WireError("frame header has no string 't' field")
    rid = header.get("id")
    if rid is not None and (not isinstance(rid, int) or isinstance(rid, bool)):
        raise WireError("frame header 'id' is not an integer")
    return header
