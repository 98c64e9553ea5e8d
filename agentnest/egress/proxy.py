"""AgentNest's egress proxy: the only way out of an allowlisted sandbox.

Stdlib only and Python 3.8 compatible: the Docker backend ships this file as
source into a hardened container from the base image (see
:mod:`agentnest.runtime.docker.egress`), and the unit tests run it in-process.
It imports nothing outside the standard library.

What it serves:

* ``CONNECT host:port HTTP/1.1`` (HTTPS and anything else over TLS).  The
  first bytes through the tunnel must be a TLS ClientHello whose SNI names
  the CONNECT host: no domain fronting, no plain protocols smuggled through
  a tunnel, no hello at all means no connection.
* Plain HTTP in absolute form (``GET http://host/path HTTP/1.1``).  The
  ``Host`` header must name the same host and port as the request target.
  One request per client connection (``Connection: close`` upstream), so a
  pipelined second request cannot carry another ``Host``.

Every decision follows the same steps: the port must be allowed; a name must
match the allowlist (a listed name and, unless ``subdomains`` is off, the
names below it; ``*.suffix`` for names strictly below the suffix); it is
resolved (the ``hosts`` mapping first, else DNS); private, loopback,
link-local (cloud metadata), multicast, reserved and unspecified addresses
are refused unless a ``cidrs`` range admits them.  An address literal as
destination is admitted if it is listed itself (an IP address among the
domains: the user's explicit choice of exactly that address) or inside a
``cidrs`` range.  The proxy connects to the very address it checked, so a
DNS answer that changes between check and use (rebinding) cannot redirect it.

Every connection, allowed or refused, ends in one JSON line (an event) on
stdout: ``type`` (``egress.allowed`` / ``egress.denied``), ``host``,
``port``, ``address``, ``reason`` (a stable code, see :data:`REASONS`),
``detail``, ``method``, ``bytes_up``, ``bytes_down``, ``duration``, ``time``.
An allowed connection's line comes when it closes, with its byte counts.

Run as a program::

    python3 proxy.py '{"listen": ["198.18.0.2", 3128], "domains": ["*.example.com"], ...}'

It prints ``{"type": "proxy.ready", ...}`` once it listens and exits at
``deadline`` (epoch seconds), if given.
"""

# The proxy runs on the image's Python (>= 3.8): keep typing.Dict & co and %-formatting.
# ruff: noqa: UP006, UP007, UP031, UP035, UP045

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

EVENT_ALLOWED = "egress.allowed"
EVENT_DENIED = "egress.denied"
EVENT_READY = "proxy.ready"

#: Every ``reason`` an event can carry, and what it means.
REASONS: Dict[str, str] = {
    "allowed": "the connection was made and has ended",
    "port_not_allowed": "the destination port is not in the allowed ports",
    "domain_not_allowed": "the host name matches no allowlist entry",
    "ip_not_allowed": "an address literal neither listed in domains nor inside an allowed cidr",
    "address_refused": "the name resolved only to private/loopback/link-local/reserved addresses",
    "bad_host": "the host is not a valid host name or address",
    "resolve_failed": "the name did not resolve",
    "connect_failed": "the allowed destination did not accept the connection",
    "bad_request": "the request line or headers are malformed",
    "header_too_large": "the request head exceeded the size limit",
    "header_timeout": "the request head did not arrive in time (slow client)",
    "method_not_allowed": "only CONNECT and absolute-form plain HTTP are served",
    "host_mismatch": "the Host header disagrees with the request target",
    "no_client_hello": "no TLS ClientHello arrived through the tunnel in time",
    "bad_client_hello": "the tunnel's first bytes are not a well-formed TLS ClientHello",
    "sni_missing": "the ClientHello names no server (SNI) for a named CONNECT host",
    "sni_mismatch": "the ClientHello's SNI disagrees with the CONNECT host",
    "too_many_connections": "the proxy's connection limit was reached",
    "client_not_allowed": "the client is not on the sandbox's network",
    "proxy_closed": "the proxy shut down (its deadline) before deciding",
}

# The same label rule as agentnest.policy (host names per RFC 1123, lower case).
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_REQUEST_LINE = re.compile(rb"^([A-Z]{1,16}) ([\x21-\x7e]{1,8192}) HTTP/1\.([01])$")
_PORT = re.compile(r"^[0-9]{1,5}$")
_CHUNK_SIZE = re.compile(rb"^([0-9a-fA-F]{1,16})(;[\x20-\x7e\t]*)?$")
#: Headers that describe one hop and are not forwarded upstream.
_HOP_BY_HOP = frozenset(
    [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    ]
)
#: Address ranges that embed another (IPv4) address or translate to one:
#: refused like private ranges, since the embedded address is not checked.
_TRANSLATED = (
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64
    ipaddress.ip_network("64:ff9b:1::/48"),  # local-use NAT64
    ipaddress.ip_network("2002::/16"),  # 6to4
    ipaddress.ip_network("2001::/32"),  # Teredo
)


# -- host names and patterns ---------------------------------------------------


def normalize_host(name: str) -> Optional[str]:
    """``name`` in lower case without a trailing dot, or None if it is no host name."""
    if not isinstance(name, str) or not name.isascii() or len(name) > 254:
        return None
    host = name.lower()
    if host.endswith("."):
        host = host[:-1]
    labels = host.split(".")
    if not host or len(host) > 253 or not all(_LABEL.match(label) for label in labels):
        return None
    return host


def check_pattern(pattern: str) -> str:
    """Validate an allowlist entry; return it normalised.

    An entry is a host name (``pypi.org``), a ``*.suffix`` pattern
    (``*.example.com``), or an IP address literal (``10.20.30.40``, ``::1``,
    ``[::1]``), which comes back in its canonical form (``::1``).

    Raises:
        ValueError: not a host name, pattern or address; too broad (``*``,
            ``*.com``); an address that is no destination (``0.0.0.0``,
            multicast); or a name that only looks like an address (``10.1.2``).
    """
    if not isinstance(pattern, str):
        raise ValueError("allowlist domain %r must be a string" % (pattern,))
    p = pattern.strip().lower()
    if p.endswith("."):
        p = p[:-1]
    literal = _pattern_literal(p)
    if literal is not None:
        reached = unmapped(literal)
        if reached.is_unspecified or reached.is_multicast:
            # 0.0.0.0 and :: mean "this host" to connect(), multicast is no TCP
            # peer: neither names a server, so listing one is a mistake.
            raise ValueError(
                "allowlist address %r is %s, not a server's address"
                % (pattern, "unspecified" if reached.is_unspecified else "multicast")
            )
        return str(literal)
    wildcard = p.startswith("*.")
    host = p[2:] if wildcard else p
    if normalize_host(host) is None:
        raise ValueError(
            "allowlist domain %r is not a host name, '*.suffix' pattern or IP address" % (pattern,)
        )
    if host.rsplit(".", 1)[-1].isdigit():
        # No top-level domain is all digits; resolvers read '10.1.2' or
        # '2130706433' as an IPv4 address in a legacy notation.
        raise ValueError(
            "allowlist domain %r is neither a host name nor an IP address; write an IPv4 address "
            "as four decimal numbers, like '10.20.30.40'" % (pattern,)
        )
    if wildcard and len(host.split(".")) < 2:
        # '*' or '*.com' would admit a whole top-level domain.
        raise ValueError(
            "allowlist pattern %r is too broad; name at least two labels, like '*.example.com'" % (pattern,)
        )
    return p


def _pattern_literal(text: str) -> Optional[IPAddress]:
    """The address an allowlist entry names, or None if it is no address literal.

    Stricter than :func:`parse_ip`: brackets only around IPv6, no zone (``%eth0``).
    """
    bracketed = text.startswith("[") and text.endswith("]")
    if bracketed:
        text = text[1:-1]
    if "%" in text:
        return None  # a zone names an interface of the proxy's host, not a destination
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if bracketed and ip.version != 6:
        return None
    return ip


def match_host(host: str, patterns: Sequence[str], subdomains: bool = True) -> bool:
    """Whether normalised host name ``host`` matches an allowlist entry.

    A ``*.suffix`` entry matches the names strictly below the suffix.  A name
    entry matches itself and, with ``subdomains``, every name below it
    (``pypi.org`` matches ``files.pypi.org``, never ``notpypi.org``), except a
    one-label name (``localhost``, ``com``), which matches only itself: below
    it would be a whole top-level domain.  An address entry matches no name.
    """
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
            continue
        if host == pattern:
            return True
        # '10.0.0.1' must not admit the name 'x.10.0.0.1'.
        below = subdomains and "." in pattern and parse_ip(pattern) is None
        if below and host.endswith("." + pattern):
            return True
    return False


def parse_ip(text: str) -> Optional[IPAddress]:
    """An address literal (``[v6]`` brackets allowed), or None."""
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def unmapped(ip: IPAddress) -> IPAddress:
    """``ip``, or the IPv4 address an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) reaches."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_category(ip: IPAddress) -> Optional[str]:
    """Why ``ip`` is not a public unicast address (``"private"``...), or None if it is."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # ::ffff:10.0.0.1 reaches 10.0.0.1: judge the IPv4 address.
        return address_category(ip.ipv4_mapped)
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"  # 169.254.169.254 and other metadata endpoints
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if isinstance(ip, ipaddress.IPv6Address) and any(ip in net for net in _TRANSLATED):
        return "translated"
    if ip.is_private:
        return "private"  # includes fd00:ec2::254 (ULA) and documentation ranges
    if not ip.is_global:
        return "not-global"  # e.g. 100.64.0.0/10 (shared address space, 100.100.100.200)
    return None


class Rules:
    """What the proxy admits: domains, address ranges, ports, and the name mapping.

    Args:
        domains: host names, ``*.suffix`` patterns and IP address literals
            (see :func:`check_pattern`).  A listed address is admitted as a
            destination literal, whatever its range; a name that resolves
            to it is not (the address check below still applies).
        cidrs: ranges admitted even though private or reserved; an address
            literal as destination must be listed or in one of them.
        ports: allowed destination ports.
        hosts: name -> address(es) that replace DNS for those names (tests,
            air-gapped setups).  A mapped address still goes through the
            address check.
        subdomains: a listed name also admits the names below it (see
            :func:`match_host`); ``False`` admits exactly the listed names.

    Raises:
        ValueError: an entry is invalid.
    """

    def __init__(
        self,
        domains: Sequence[str] = (),
        cidrs: Sequence[str] = (),
        ports: Sequence[int] = (80, 443),
        hosts: Optional[Dict[str, Union[str, Sequence[str]]]] = None,
        subdomains: bool = True,
    ) -> None:
        if not isinstance(subdomains, bool):
            raise ValueError("subdomains must be true or false, not %r" % (subdomains,))
        self.subdomains = subdomains
        names: List[str] = []
        literals: List[IPAddress] = []
        for entry in domains:
            pattern = check_pattern(entry)
            literal = parse_ip(pattern)
            if literal is None:
                names.append(pattern)
            else:
                literals.append(unmapped(literal))
        # Names and '*.suffix' patterns; addresses apart (IPv4-mapped ones as
        # the IPv4 address they reach), so that no name can match an address.
        self.domains = tuple(names)
        self.addresses: Tuple[IPAddress, ...] = tuple(literals)
        self.cidrs: Tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)
        checked_ports = []
        for port in ports:
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError("port %r is not a TCP port (1-65535)" % (port,))
            checked_ports.append(port)
        self.ports = frozenset(checked_ports)
        self.hosts: Dict[str, Tuple[IPAddress, ...]] = {}
        for name, value in (hosts or {}).items():
            host = normalize_host(name)
            if host is None:
                raise ValueError("hosts mapping: %r is not a host name" % (name,))
            values = [value] if isinstance(value, str) else list(value)
            addresses = tuple(parse_ip(v) if isinstance(v, str) else None for v in values)
            if not addresses or any(a is None for a in addresses):
                raise ValueError("hosts mapping: %r must map to IP addresses, not %r" % (name, value))
            self.hosts[host] = tuple(a for a in addresses if a is not None)

    def in_cidrs(self, ip: IPAddress) -> bool:
        ip = unmapped(ip)
        return any(ip.version == net.version and ip in net for net in self.cidrs)

    def listed(self, ip: IPAddress) -> bool:
        """Whether address literal ``ip`` is itself an allowlist entry."""
        return unmapped(ip) in self.addresses

    def admits_name(self, host: str) -> bool:
        """Whether normalised host name ``host`` matches a name entry."""
        return match_host(host, self.domains, self.subdomains)

    def refusal(self, ip: IPAddress) -> Optional[str]:
        """Why connecting to resolved address ``ip`` is refused, or None."""
        if self.in_cidrs(ip):
            return None
        category = address_category(ip)
        return None if category is None else "%s is %s" % (ip, category)

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> Rules:
        return cls(
            config.get("domains") or (),
            config.get("cidrs") or (),
            config.get("ports") or (80, 443),
            config.get("hosts") or None,
            subdomains=config.get("subdomains", True),
        )


class Limits:
    """Bounds on what a client may make the proxy hold or wait for."""

    def __init__(
        self,
        max_header_bytes: int = 16 * 1024,
        max_headers: int = 100,
        header_timeout: float = 10.0,
        hello_timeout: float = 10.0,
        max_hello_bytes: int = 64 * 1024,
        connect_timeout: float = 10.0,
        resolve_timeout: float = 10.0,
        idle_timeout: float = 300.0,
        max_connections: int = 512,
    ) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.header_timeout = header_timeout
        self.hello_timeout = hello_timeout
        self.max_hello_bytes = max_hello_bytes
        self.connect_timeout = connect_timeout
        self.resolve_timeout = resolve_timeout
        self.idle_timeout = idle_timeout
        self.max_connections = max_connections

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> Limits:
        limits = cls()
        for key, value in (config.get("limits") or {}).items():
            if not hasattr(limits, key) or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError("unknown or invalid limit %r=%r" % (key, value))
            if value <= 0:
                raise ValueError("limit %r must be positive" % (key,))
            setattr(limits, key, type(getattr(limits, key))(value))
        return limits


# -- TLS ClientHello -----------------------------------------------------------


class HelloError(Exception):
    """The bytes are not a well-formed ClientHello; the message says where."""


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
    seen = set()
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
        names = []
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


async def read_client_hello(reader: asyncio.StreamReader, max_bytes: int) -> Tuple[Optional[str], bytes]:
    """Read one ClientHello (possibly over several TLS records); return (SNI, raw bytes).

    Raises:
        HelloError: not TLS, malformed, or larger than ``max_bytes``.
        asyncio.IncompleteReadError: the client closed first.
    """
    raw = bytearray()
    handshake = bytearray()
    while True:
        header = await reader.readexactly(5)
        raw += header
        if header[0] != 0x16:
            raise HelloError("the first bytes through the tunnel are not a TLS handshake record")
        if header[1] != 3:
            raise HelloError("record version is not TLS")
        length = (header[3] << 8) | header[4]
        if length == 0 or length > 16384 + 256:
            raise HelloError("bad TLS record length %d" % length)
        if len(raw) + length > max_bytes:
            raise HelloError("ClientHello larger than %d bytes" % max_bytes)
        fragment = await reader.readexactly(length)
        raw += fragment
        handshake += fragment
        if len(handshake) >= 4:
            if handshake[0] != 1:
                raise HelloError("the first handshake message is not a ClientHello")
            size = (handshake[1] << 16) | (handshake[2] << 8) | handshake[3]
            if 4 + size > max_bytes:
                raise HelloError("ClientHello larger than %d bytes" % max_bytes)
            if len(handshake) >= 4 + size:
                if len(handshake) != 4 + size:
                    raise HelloError("data after the ClientHello in its records")
                return parse_client_hello(bytes(handshake[4:])), bytes(raw)


# -- HTTP heads ----------------------------------------------------------------


class RequestError(Exception):
    """A refused request: ``reason`` is a key of :data:`REASONS`, ``status`` the HTTP reply."""

    def __init__(self, reason: str, detail: str, status: int = 400) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status


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


# -- the proxy -----------------------------------------------------------------


class _Conn:
    """Book-keeping of one client connection, turned into its event at the end."""

    def __init__(self, client: str) -> None:
        self.start = time.monotonic()
        self.client = client
        self.method = ""
        self.host = ""
        self.port = 0
        self.address = ""
        self.bytes_up = 0
        self.bytes_down = 0
        self.opened = False
        self.last_activity = self.start

    def event(self, allowed: bool, reason: str, detail: str = "") -> Dict[str, Any]:
        return {
            "type": EVENT_ALLOWED if allowed else EVENT_DENIED,
            "host": self.host[:255],
            "port": self.port,
            "address": self.address,
            "reason": reason,
            "detail": detail[:300],
            "method": self.method,
            "client": self.client,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "duration": round(time.monotonic() - self.start, 6),
            "time": round(time.time(), 6),
        }


def _print_event(event: Dict[str, Any]) -> None:
    # A blocking write: if the host stops reading, the proxy stalls rather
    # than serving connections that nobody records (fail closed).
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class Proxy:
    """The filtering proxy.  Create it, ``await start()``, ``await close()``.

    Args:
        rules: what is admitted.
        limits: bounds on clients.
        emit: called with every event dict (default: one JSON line on stdout).
        clients: ranges a client must connect from (empty: any); the
            container proxy admits only the sandbox's own network.
    """

    def __init__(
        self,
        rules: Rules,
        limits: Optional[Limits] = None,
        emit: Optional[Callable[[Dict[str, Any]], None]] = None,
        clients: Sequence[str] = (),
    ) -> None:
        self.rules = rules
        self.limits = limits or Limits()
        self.emit = emit or _print_event
        self.clients = tuple(ipaddress.ip_network(c, strict=False) for c in clients)
        self.active = 0
        self._server: Optional[asyncio.AbstractServer] = None
        self._tasks: Set[asyncio.Task[Any]] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> Tuple[str, int]:
        """Listen on ``host:port`` (0: any free port); return the bound address."""
        self._server = await asyncio.start_server(
            self._accept, host, port, limit=self.limits.max_header_bytes, backlog=1024
        )
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop listening and end every open connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- per connection --------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        peer = writer.get_extra_info("peername") or ("?", 0)
        conn = _Conn(str(peer[0]))
        self.active += 1
        try:
            if self.clients:
                ip = parse_ip(str(peer[0]))
                if ip is None or not any(ip.version == n.version and ip in n for n in self.clients):
                    self._deny(
                        conn, "client_not_allowed", "client %s is not on the sandbox network" % peer[0]
                    )
                    return
            if self.active > self.limits.max_connections:
                await self._refuse(writer, conn, RequestError("too_many_connections", "limit reached", 503))
                return
            await self._serve(reader, writer, conn)
        except asyncio.CancelledError:
            # The proxy is closing (its deadline): the connection still gets
            # its event.  Not re-raised: the task ends here either way, and
            # asyncio would log a cancelled client task as an error.
            if conn.opened:
                self.emit(conn.event(True, "allowed", "ended by the proxy shutting down"))
            else:
                self._deny(conn, "proxy_closed", "the proxy shut down before a decision")
        except Exception as exc:  # one bad client must never stop the proxy
            self._deny(conn, "bad_request", "internal error: %s" % type(exc).__name__)
        finally:
            self.active -= 1
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn) -> None:
        try:
            head = await asyncio.wait_for(self._read_head(reader), self.limits.header_timeout)
            request = parse_head(head, self.limits.max_headers)
        except asyncio.TimeoutError:
            await self._refuse(writer, conn, RequestError("header_timeout", "request head not complete", 408))
            return
        except RequestError as exc:
            await self._refuse(writer, conn, exc)
            return
        conn.method = request.method
        if request.method == "CONNECT":
            await self._tunnel(reader, writer, conn, request)
        elif request.target.startswith("http://"):
            await self._forward(reader, writer, conn, request)
        else:
            hint = "; use CONNECT for https" if request.target.lower().startswith("https:") else ""
            await self._refuse(
                writer,
                conn,
                RequestError("method_not_allowed", "request target %r%s" % (request.target[:100], hint), 405),
            )

    async def _read_head(self, reader: asyncio.StreamReader) -> bytes:
        try:
            data = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise RequestError(
                "header_too_large", "request head over %d bytes" % self.limits.max_header_bytes, 431
            ) from None
        except asyncio.IncompleteReadError as exc:
            raise RequestError(
                "bad_request", "client closed after %d bytes of head" % len(exc.partial)
            ) from None
        if len(data) > self.limits.max_header_bytes:
            raise RequestError(
                "header_too_large", "request head over %d bytes" % self.limits.max_header_bytes, 431
            )
        return data[:-4]

    async def _decide(self, conn: _Conn, host: str, port: int) -> IPAddress:
        """Check ``host:port`` against the rules; return the address to connect to.

        Raises:
            RequestError: refused.
        """
        conn.host, conn.port = host, port
        if port not in self.rules.ports:
            raise RequestError("port_not_allowed", "port %d is not allowed" % port, 403)
        literal = parse_ip(host)
        if literal is not None:
            conn.address = str(literal)
            # A listed address is the user's explicit choice of that one
            # destination, so it skips the private-range check; a name
            # resolving to it does not (below).
            if not (self.rules.listed(literal) or self.rules.in_cidrs(literal)):
                raise RequestError(
                    "ip_not_allowed", "address %s is neither listed nor in an allowed cidr" % literal, 403
                )
            return literal
        name = normalize_host(host)
        if name is None:
            raise RequestError("bad_host", "%r is not a host name" % host[:100], 400)
        conn.host = name
        if not self.rules.admits_name(name):
            raise RequestError("domain_not_allowed", "%s is not on the allowlist" % name, 403)
        mapped = self.rules.hosts.get(name)
        if mapped is not None:
            candidates = list(mapped)
        else:
            candidates = await self._resolve(name, port)
        refusals = []
        for ip in sorted(candidates, key=lambda a: a.version):  # IPv4 first
            why = self.rules.refusal(ip)
            if why is None:
                conn.address = str(ip)
                return ip
            refusals.append(why)
        conn.address = str(candidates[0]) if candidates else ""
        raise RequestError("address_refused", "; ".join(refusals)[:300], 403)

    async def _resolve(self, name: str, port: int) -> List[IPAddress]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                # The absolute name (trailing dot): never a resolver search-list expansion.
                loop.getaddrinfo(name + ".", port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP),
                self.limits.resolve_timeout,
            )
        except (OSError, asyncio.TimeoutError, UnicodeError) as exc:
            raise RequestError("resolve_failed", "%s: %s" % (name, exc), 502) from None
        out: List[IPAddress] = []
        for info in infos:
            ip = parse_ip(str(info[4][0]).split("%")[0])
            if ip is not None and ip not in out:
                out.append(ip)
        if not out:
            raise RequestError("resolve_failed", "%s has no address" % name, 502)
        return out

    async def _open(
        self, conn: _Conn, ip: IPAddress, port: int
    ) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            # The checked address itself, never the name again: a second
            # resolution could answer differently (DNS rebinding).
            pair = await asyncio.wait_for(
                asyncio.open_connection(str(ip), port, limit=256 * 1024), self.limits.connect_timeout
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise RequestError("connect_failed", "%s:%d: %s" % (ip, port, exc or "timed out"), 502) from None
        conn.opened = True
        return pair

    async def _tunnel(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn, request: Request
    ) -> None:
        try:
            host, port = split_authority(request.target, None)
            ip = await self._decide(conn, host, port)
        except RequestError as exc:
            await self._refuse(writer, conn, exc)
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        # Nothing goes upstream until the ClientHello has been read and its
        # SNI checked: the tunnel carries TLS for the CONNECT host or nothing.
        try:
            sni, hello = await asyncio.wait_for(
                read_client_hello(reader, self.limits.max_hello_bytes), self.limits.hello_timeout
            )
        except asyncio.TimeoutError:
            self._deny(conn, "no_client_hello", "no ClientHello within %.0f s" % self.limits.hello_timeout)
            return
        except asyncio.IncompleteReadError:
            self._deny(conn, "no_client_hello", "client closed the tunnel before a ClientHello")
            return
        except HelloError as exc:
            self._deny(conn, "bad_client_hello", str(exc))
            return
        if sni is None:
            # An admitted address literal has no name to front;
            # a named host must be named in the hello too.
            if parse_ip(host) is None:
                self._deny(conn, "sni_missing", "ClientHello without server_name for %s" % conn.host)
                return
        elif parse_ip(host) is not None or sni != conn.host:
            self._deny(conn, "sni_mismatch", "SNI %r, CONNECT %r" % (sni, conn.host))
            return
        try:
            up_reader, up_writer = await self._open(conn, ip, port)
        except RequestError as exc:
            self._deny(conn, exc.reason, exc.detail)
            return
        try:
            up_writer.write(hello)
            conn.bytes_up += len(hello)
            await self._relay(reader, writer, up_reader, up_writer, conn, request_body=None)
        finally:
            up_writer.close()
        self._finish(conn)

    async def _forward(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn, request: Request
    ) -> None:
        try:
            rest = request.target[len("http://") :]
            slash = min(
                [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0] or [len(rest)]
            )
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
                conn.host, conn.port = host, port
                raise RequestError("host_mismatch", "Host %r, target %r" % (hosts[0][:100], authority[:100]))
            body = self._body_framing(request)
            ip = await self._decide(conn, host, port)
            up_reader, up_writer = await self._open(conn, ip, port)
        except RequestError as exc:
            await self._refuse(writer, conn, exc)
            return
        lines = ["%s %s HTTP/1.1" % (request.method, path)]
        for name, value in request.headers:
            if name.lower() not in _HOP_BY_HOP:
                lines.append("%s: %s" % (name, value))
        # One request per connection: a pipelined second request (perhaps
        # with another Host) is never read, let alone forwarded.
        lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            up_writer.write(head)
            conn.bytes_up += len(head)
            await self._relay(reader, writer, up_reader, up_writer, conn, request_body=body)
        finally:
            up_writer.close()
        self._finish(conn)

    @staticmethod
    def _body_framing(request: Request) -> Union[int, str]:
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
            if len(set(lengths)) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 15:
                raise RequestError("bad_request", "bad Content-Length %r" % lengths[:2])
            return int(lengths[0])
        return 0

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        conn: _Conn,
        request_body: Union[int, str, None],
    ) -> None:
        """Copy bytes both ways until the upstream side ends or both go idle."""

        async def read(source: asyncio.StreamReader, n: int) -> bytes:
            while True:
                try:
                    return await asyncio.wait_for(source.read(n), self.limits.idle_timeout)
                except asyncio.TimeoutError:
                    if time.monotonic() - conn.last_activity >= self.limits.idle_timeout:
                        raise
                    # The other direction is busy (a long download): keep waiting.

        async def send(target: asyncio.StreamWriter, data: bytes) -> None:
            target.write(data)
            await target.drain()
            conn.last_activity = time.monotonic()

        async def upstream() -> None:
            if request_body is None:  # a tunnel: everything until the client stops
                while True:
                    data = await read(reader, 65536)
                    if not data:
                        break
                    conn.bytes_up += len(data)
                    await send(up_writer, data)
            elif request_body == "chunked":
                while True:
                    line = await asyncio.wait_for(reader.readuntil(b"\r\n"), self.limits.idle_timeout)
                    match = _CHUNK_SIZE.match(line[:-2])
                    if match is None:
                        raise RequestError("bad_request", "malformed chunk size line")
                    size = int(match.group(1), 16)
                    data = line + (await reader.readexactly(size + 2) if size else b"")
                    if size and not data.endswith(b"\r\n"):
                        raise RequestError("bad_request", "chunk not followed by CRLF")
                    conn.bytes_up += len(data)
                    await send(up_writer, data)
                    if size == 0:
                        trailers = 0
                        while True:
                            t = await asyncio.wait_for(reader.readuntil(b"\r\n"), self.limits.idle_timeout)
                            trailers += len(t)
                            if trailers > self.limits.max_header_bytes:
                                raise RequestError("header_too_large", "chunked trailers too large")
                            conn.bytes_up += len(t)
                            await send(up_writer, t)
                            if t == b"\r\n":
                                break
                        break
            else:
                left = int(request_body)
                while left > 0:
                    data = await read(reader, min(left, 65536))
                    if not data:
                        break
                    left -= len(data)
                    conn.bytes_up += len(data)
                    await send(up_writer, data)
            if up_writer.can_write_eof() and request_body is None:
                up_writer.write_eof()

        async def downstream() -> None:
            while True:
                data = await read(up_reader, 65536)
                if not data:
                    break
                conn.bytes_down += len(data)
                await send(writer, data)

        up = asyncio.ensure_future(upstream())
        down = asyncio.ensure_future(downstream())
        try:
            await down  # the response (or the tunnel's far side) decides the end
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            if not up.done():
                up.cancel()
            try:
                await up
            except (
                asyncio.CancelledError,
                OSError,
                asyncio.TimeoutError,
                asyncio.IncompleteReadError,
                RequestError,
            ):
                pass
            except asyncio.LimitOverrunError:
                pass

    # -- refusals and events ---------------------------------------------------

    async def _refuse(self, writer: asyncio.StreamWriter, conn: _Conn, exc: RequestError) -> None:
        self._deny(conn, exc.reason, exc.detail)
        body = (
            "agentnest egress proxy refused this connection: %s (%s)\n" % (exc.reason, exc.detail)
        ).encode("utf-8", "replace")
        phrase = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed", 408: "Request Timeout"}
        phrase.update(
            {431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable"}
        )
        writer.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
            b"X-AgentNest-Egress: denied; reason=%s\r\nConnection: close\r\n\r\n"
            % (exc.status, phrase.get(exc.status, "Refused").encode(), len(body), exc.reason.encode())
            + body
        )
        try:
            await asyncio.wait_for(writer.drain(), 5.0)
        except (OSError, asyncio.TimeoutError):
            pass

    def _deny(self, conn: _Conn, reason: str, detail: str) -> None:
        self.emit(conn.event(False, reason, detail))

    def _finish(self, conn: _Conn) -> None:
        self.emit(conn.event(True, "allowed"))


# -- program -------------------------------------------------------------------


def read_deadline(path: str, follow: bool = False) -> Optional[float]:
    """The deadline in ``path`` if it is a root-owned regular file, else None.

    ``follow=False`` (Docker: the host writes the file into a directory the
    container shares) refuses a symbolic link.  ``follow=True`` is for a
    Kubernetes downwardAPI volume, whose files are links into the kubelet's
    atomically swapped ``..data`` directory; the volume is read-only and
    root-owned, and nothing but the proxy runs in its pod.
    """
    import os
    import stat

    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or not stat.S_ISREG(st.st_mode):
            return None
        value = float(os.read(fd, 64))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the proxy from a JSON config (``argv[0]``) until its deadline."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: proxy.py CONFIG_JSON\n")
        return 2
    config = json.loads(args[0])
    rules = Rules.from_config(config)
    limits = Limits.from_config(config)
    listen = config.get("listen") or ["127.0.0.1", 3128]
    deadline = config.get("deadline")
    deadline_file = config.get("deadline_file")
    follow = bool(config.get("deadline_follow"))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = loop.create_future()

        def done() -> None:
            if not stop.done():
                stop.set_result(None)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, done)
        timer = []  # type: List[asyncio.TimerHandle]

        def expire() -> None:
            # At the deadline, look once more: a moved deadline whose signal
            # never came (Kubernetes sends none) is still honoured.
            new = read_deadline(str(deadline_file), follow) if deadline_file else None
            if new is not None and new > time.time():
                arm(new)
            else:
                done()

        def arm(when: float) -> None:
            for handle in timer:
                handle.cancel()
            timer[:] = [loop.call_later(max(0.0, when - time.time()), expire)]

        if deadline is not None:
            # The proxy ends with its sandbox even if the host process died.
            arm(float(deadline))

        def moved() -> None:
            # Sandbox.extend(): the host (as root) wrote a new deadline.  Only a
            # root-owned regular file counts: this process (UID 65532) cannot forge one.
            new = read_deadline(str(deadline_file), follow) if deadline_file else None
            if new is not None:
                arm(new)

        loop.add_signal_handler(signal.SIGUSR1, moved)
        proxy = Proxy(rules, limits, clients=config.get("clients") or ())
        host, port = await proxy.start(str(listen[0]), int(listen[1]))
        _print_event({"type": EVENT_READY, "listen": [host, port], "time": round(time.time(), 6)})
        await stop
        await proxy.close()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
