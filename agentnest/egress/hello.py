"""The TLS ClientHello at the start of a tunnel: which server it names (SNI), if it is one at all.

Sans-I/O, as h11 is for HTTP/1.1: :class:`ClientHelloReader` says how many
bytes it needs next and takes them; the proxy (:mod:`.proxy`) owns the socket
and the timeouts.  It decides whether a tunnel's first bytes are a
well-formed ClientHello, and which host name its ``server_name`` extension
names, so that the proxy can refuse a tunnel that names another host than
its ``CONNECT`` (domain fronting), carries no TLS, or never says hello.

Every field is distrusted: every length must fit exactly, an extension may
appear once, ``server_name`` must hold exactly one valid host name (never an
address), the records must be TLS handshake records of a sane length, and the
whole hello is bounded by ``max_bytes``.  Malformed input raises
:class:`HelloError` and nothing else.  The reader never asks for a byte past
the hello's last record: what the client sends next stays in the stream, for
the server.

Stdlib only and Python 3.8 compatible: it ships into the proxy's container
as source (see :mod:`agentnest.runtime.egresslog`).
"""

# The proxy runs on the image's Python (>= 3.8): keep typing.Dict & co and %-formatting.
# ruff: noqa: UP006, UP031, UP035, UP045

from __future__ import annotations

from typing import List, Optional, Set, Tuple

from .rules import normalize_host, parse_ip

#: A TLS record's header: content type (1), version (2), length (2).
RECORD_HEADER = 5
#: The longest record a peer may send (RFC 8446 5.1 allows 2^14 plus 256 of expansion).
MAX_RECORD = 16384 + 256


class HelloError(Exception):
    """The bytes are not a well-formed ClientHello; the message says where."""


class ClientHelloReader:
    """Reads the ClientHello that opens a TLS tunnel, possibly over several records.

    Feed it exactly what :attr:`need` asks for (a record header, then that
    record's body), until :meth:`feed` returns ``(sni, raw)``: the SNI host
    name (or None if the hello names none) and every byte read, to send on.

    Args:
        max_bytes: the most the hello (records and headers) may take.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.need = RECORD_HEADER
        """How many bytes :meth:`feed` takes next (0 once done or refused)."""
        self._raw = bytearray()
        self._handshake = bytearray()
        self._step = bytearray()  # the header or record body read so far
        self._body = False  # reading a record's body, not its header

    def feed(self, data: bytes) -> Optional[Tuple[Optional[str], bytes]]:
        """Take up to :attr:`need` bytes; return ``(sni, raw)`` once the hello is complete, else None.

        Raises:
            HelloError: not TLS, malformed, or larger than ``max_bytes``;
                the reader is then done (:attr:`need` is 0).
            ValueError: more bytes than :attr:`need`, or a feed after the end
                (the caller's mistake, never the client's).
        """
        if not self.need or len(data) > self.need:
            raise ValueError("fed %d bytes, %d wanted" % (len(data), self.need))
        self._step += data
        self.need -= len(data)
        if self.need:
            return None
        step, self._step = bytes(self._step), bytearray()
        try:
            if self._body:
                return self._record_body(step)
            self._record_header(step)
            return None
        except HelloError:
            self.need = 0
            raise

    def _record_header(self, header: bytes) -> None:
        self._raw += header
        if header[0] != 0x16:
            raise HelloError("the first bytes through the tunnel are not a TLS handshake record")
        if header[1] != 3:
            raise HelloError("record version is not TLS")
        length = (header[3] << 8) | header[4]
        if length == 0 or length > MAX_RECORD:
            raise HelloError("bad TLS record length %d" % length)
        if len(self._raw) + length > self.max_bytes:
            raise HelloError("ClientHello larger than %d bytes" % self.max_bytes)
        self._body, self.need = True, length

    def _record_body(self, fragment: bytes) -> Optional[Tuple[Optional[str], bytes]]:
        self._raw += fragment
        self._handshake += fragment
        self._body, self.need = False, RECORD_HEADER
        handshake = self._handshake
        if len(handshake) >= 4:
            if handshake[0] != 1:
                raise HelloError("the first handshake message is not a ClientHello")
            size = (handshake[1] << 16) | (handshake[2] << 8) | handshake[3]
            if 4 + size > self.max_bytes:
                raise HelloError("ClientHello larger than %d bytes" % self.max_bytes)
            if len(handshake) >= 4 + size:
                if len(handshake) != 4 + size:
                    raise HelloError("data after the ClientHello in its records")
                self.need = 0
                return parse_client_hello(bytes(handshake[4:])), bytes(self._raw)
        return None


def parse_client_hello(body: bytes) -> Optional[str]:
    """The SNI host name of a ClientHello handshake body, or None if it has none.

    Strict: every length must fit exactly, an extension may appear once,
    the server_name list must hold exactly one ``host_name`` that is a
    valid host name.

    Raises:
        HelloError: malformed.
    """
    view = memoryview(body)
    pos = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if n < 0 or pos + n > len(view):
            raise HelloError("truncated ClientHello")
        piece = view[pos : pos + n]
        pos += n
        return piece

    def u8() -> int:
        return take(1)[0]

    def u16() -> int:
        b = take(2)
        return (b[0] << 8) | b[1]

    major = u8()
    u8()  # legacy minor version
    if major != 3:
        raise HelloError("ClientHello version is not TLS")
    take(32)  # random
    session_len = u8()
    if session_len > 32:
        raise HelloError("session id longer than 32 bytes")
    take(session_len)
    suites = u16()
    if suites < 2 or suites % 2:
        raise HelloError("bad cipher suite list")
    take(suites)
    compressions = u8()
    if compressions < 1:
        raise HelloError("empty compression list")
    take(compressions)
    if pos == len(view):
        return None  # no extensions at all
    ext_total = u16()
    if pos + ext_total != len(view):
        raise HelloError("extension block length does not match the message")
    seen: Set[int] = set()
    sni: Optional[str] = None
    while pos < len(view):
        ext_type = u16()
        ext_len = u16()
        data = take(ext_len)
        if ext_type in seen:
            raise HelloError("duplicate extension %d" % ext_type)
        seen.add(ext_type)
        if ext_type != 0:
            continue
        if ext_len < 2 or ((data[0] << 8) | data[1]) != ext_len - 2:
            raise HelloError("bad server_name list length")
        i = 2
        names: List[bytes] = []
        while i < ext_len:
            if i + 3 > ext_len:
                raise HelloError("truncated server_name entry")
            name_type = data[i]
            name_len = (data[i + 1] << 8) | data[i + 2]
            i += 3
            if i + name_len > ext_len:
                raise HelloError("truncated server name")
            raw = bytes(data[i : i + name_len])
            i += name_len
            if name_type == 0:
                names.append(raw)
        if len(names) != 1:
            raise HelloError("server_name must hold exactly one host name")
        try:
            text = names[0].decode("ascii")
        except UnicodeDecodeError:
            raise HelloError("server name is not ASCII") from None
        host = normalize_host(text)
        if host is None or parse_ip(text) is not None:
            raise HelloError("server name %r is not a host name" % text[:80])
        sni = host
    return sni
