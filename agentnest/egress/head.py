"""HTTP request heads as the egress proxy reads them: strict, so that it and the server agree.

Pure (no sockets, no I/O): the proxy (:mod:`.proxy`) reads a head off the
client's socket, bounded in size and time, and hands the bytes here.  This
module decides whether a request is well formed, where it goes, and what
goes upstream:

* the request line and headers (:func:`parse_head`): no obsolete line
  folding, no whitespace before a colon, no control characters, at most
  ``max_headers``: parsers that disagree here are how requests get smuggled
  past a proxy;
* the destination (:func:`split_authority`, :func:`origin_form`): a plain
  HTTP request's ``Host`` header must name the same host and port as its
  absolute-form target, and no user information is accepted;
* the body's framing (:func:`body_framing`): ``Content-Length`` or
  ``chunked``, never both, never ambiguous (:func:`chunk_size`);
* the head sent upstream (:func:`upstream_head`): hop-by-hop headers
  dropped and ``Connection: close``, so a pipelined second request (perhaps
  with another ``Host``) is never forwarded;
* the refusal the client gets (:func:`refusal`).

Malformed input raises :class:`RequestError` (with a stable reason, a key of
:data:`.rules.REASONS`) and nothing else.

Stdlib only and Python 3.8 compatible: it ships into the proxy's container
as source (see :mod:`agentnest.runtime.egresslog`).
"""

# The proxy runs on the image's Python (>= 3.8): keep typing.Dict & co and %-formatting.
# ruff: noqa: UP006, UP007, UP031, UP035, UP045

from __future__ import annotations

import re
from typing import List, Optional, Tuple, Union

# Every pattern ends in \Z, never $: '$' also matches before a final newline,
# and a bare LF that the proxy lets through is where it and the server would
# disagree on where a line ends.
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_REQUEST_LINE = re.compile(rb"^([A-Z]{1,16}) ([\x21-\x7e]{1,8192}) HTTP/1\.([01])\Z")
_PORT = re.compile(r"^[0-9]{1,5}\Z")
_CHUNK_SIZE = re.compile(rb"^([0-9a-fA-F]{1,16})(;[\x20-\x7e\t]*)?\Z")
#: A Content-Length: ASCII digits only (str.isdigit also takes '²', which int() refuses).
_LENGTH = re.compile(r"^[0-9]{1,15}\Z")
#: Headers that describe one hop and are not forwarded upstream.
HOP_BY_HOP = frozenset((
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
    "trailer", "upgrade",
))  # fmt: skip
_PHRASES = {
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class RequestError(Exception):
    """A refused request: ``reason`` is a key of :data:`REASONS`, ``status`` the HTTP reply.

    ``host`` and ``port``, when given, are the destination the refused
    request named, for its event.
    """

    def __init__(self, reason: str, detail: str, status: int = 400, host: str = "", port: int = 0) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status
        self.host = host
        self.port = port


class Request:
    """A parsed request head."""

    def __init__(self, method: str, target: str, minor: int, headers: List[Tuple[str, str]]) -> None:
        self.method = method
        self.target = target
        self.minor = minor
        self.headers = headers

    def values(self, name: str) -> List[str]:
        return [v for k, v in self.headers if k.lower() == name]


def parse_head(head: bytes, max_headers: int) -> Request:
    """Parse a request head (request line and headers, CRLF line ends, no final blank line).

    Raises:
        RequestError: malformed.
    """
    lines = head.split(b"\r\n")
    match = _REQUEST_LINE.match(lines[0])
    if match is None:
        raise RequestError("bad_request", "malformed request line %r" % lines[0][:100])
    headers: List[Tuple[str, str]] = []
    if len(lines) - 1 > max_headers:
        raise RequestError("header_too_large", "more than %d headers" % max_headers, 431)
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        # No obsolete line folding, no whitespace before the colon, no
        # control characters: parsers that disagree here are how requests
        # get smuggled past a proxy.
        if not sep or not _TOKEN.match(name):
            raise RequestError("bad_request", "malformed header line %r" % line[:100])
        value = value.strip(b" \t")
        if any((c < 0x20 and c != 0x09) or c == 0x7F for c in value):
            raise RequestError("bad_request", "control character in header %r" % name[:60])
        headers.append((name.decode("ascii"), value.decode("latin-1")))
    return Request(
        match.group(1).decode("ascii"), match.group(2).decode("ascii"), int(match.group(3)), headers
    )


def split_authority(authority: str, default_port: Optional[int]) -> Tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) -> (host, port).

    Raises:
        RequestError: malformed, or no port where one is required.
    """
    if "@" in authority:
        raise RequestError("bad_request", "user information in the request target is refused")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise RequestError("bad_host", "unterminated IPv6 literal")
        host, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise RequestError("bad_host", "garbage after IPv6 literal")
        port_text = rest[1:] if rest else ""
        has_port = bool(rest)
    else:
        host, sep, port_text = authority.rpartition(":")
        has_port = bool(sep)
        if not sep:
            host = authority
    if not has_port:
        if default_port is None:
            raise RequestError("bad_request", "CONNECT target %r has no port" % authority[:100])
        return host, default_port
    if not _PORT.match(port_text) or not 1 <= int(port_text) <= 65535:
        raise RequestError("bad_request", "bad port in %r" % authority[:100])
    return host, int(port_text)


def origin_form(request: Request) -> Tuple[str, int, str]:
    """``(host, port, path)`` of an absolute-form plain HTTP request (``GET http://host/path``).

    The path comes without its fragment and always starts with ``/``.

    Raises:
        RequestError: no host in the target, or the ``Host`` header is not
            exactly one that names the same host and port (``host_mismatch``;
            ``host`` and ``port`` then carry the target's).
    """
    rest = request.target[len("http://") :]
    slash = min([i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0] or [len(rest)])
    authority, path = rest[:slash], rest[slash:]
    if not authority:
        raise RequestError("bad_request", "request target without a host")
    path = path.split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    host, port = split_authority(authority, 80)
    hosts = request.values("host")
    if len(hosts) != 1:
        raise RequestError("host_mismatch", "expected exactly one Host header, got %d" % len(hosts))
    h_host, h_port = split_authority(hosts[0], 80)
    if h_port != port or h_host.lower().rstrip(".") != host.lower().rstrip("."):
        raise RequestError(
            "host_mismatch", "Host %r, target %r" % (hosts[0][:100], authority[:100]), host=host, port=port
        )
    return host, port, path


def body_framing(request: Request) -> Union[int, str]:
    """Content length, or ``"chunked"``.

    Raises:
        RequestError: ambiguous framing (a request-smuggling vector).
    """
    lengths = request.values("content-length")
    encodings = request.values("transfer-encoding")
    if lengths and encodings:
        raise RequestError("bad_request", "both Content-Length and Transfer-Encoding")
    if encodings:
        if len(encodings) != 1 or encodings[0].strip().lower() != "chunked":
            raise RequestError("bad_request", "unsupported Transfer-Encoding %r" % encodings[:2])
        return "chunked"
    if lengths:
        if len(set(lengths)) != 1 or not _LENGTH.match(lengths[0]):
            raise RequestError("bad_request", "bad Content-Length %r" % lengths[:2])
        return int(lengths[0])
    return 0


def chunk_size(line: bytes) -> int:
    """The size a chunk-size line (without its CRLF) announces.

    Raises:
        RequestError: malformed.
    """
    match = _CHUNK_SIZE.match(line)
    if match is None:
        raise RequestError("bad_request", "malformed chunk size line")
    return int(match.group(1), 16)


def upstream_head(request: Request, path: str) -> bytes:
    """The head sent upstream: origin form, hop-by-hop headers dropped, ``Connection: close``."""
    lines = ["%s %s HTTP/1.1" % (request.method, path)]
    for name, value in request.headers:
        if name.lower() not in HOP_BY_HOP:
            lines.append("%s: %s" % (name, value))
    # One request per connection: a pipelined second request (perhaps
    # with another Host) is never read, let alone forwarded.
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def refusal(exc: RequestError) -> bytes:
    """The reply a refused client gets: the status, the reason in a header and a line of text."""
    body = ("agentnest egress proxy refused this connection: %s (%s)\n" % (exc.reason, exc.detail)).encode(
        "utf-8", "replace"
    )
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
        b"X-AgentNest-Egress: denied; reason=%s\r\nConnection: close\r\n\r\n"
        % (exc.status, _PHRASES.get(exc.status, "Refused").encode(), len(body), exc.reason.encode())
        + body
    )
