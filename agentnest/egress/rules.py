"""What the egress proxy admits: allowlist entries, host matching, address checks.

Pure (no sockets, no I/O): the one module of :mod:`agentnest.egress` that the
host imports (:mod:`agentnest.policy` validates allowlist entries with
:func:`check_pattern`, so that the policy and the proxy can never disagree on
what an entry means), and the first one the proxy's program loads.  It also
holds the vocabulary of the proxy's events (:data:`REASONS`), which the host
checks every event line against.

It decides:

* whether an allowlist entry is safe to list (:func:`check_pattern`): a host
  name, a ``*.suffix`` pattern of at least two labels, or an address literal
  that names a server; never ``*``, ``*.com``, ``0.0.0.0`` or a name that a
  resolver would read as an address (``10.1.2``);
* whether a host name matches the allowlist (:func:`match_host`);
* why a resolved address is refused (:func:`address_category`): private,
  loopback, link-local (cloud metadata), multicast, reserved, translated
  (NAT64, 6to4, Teredo) and unspecified addresses, unless a ``cidrs`` range
  admits them (:class:`Rules`).

Stdlib only and Python 3.8 compatible: it ships into the proxy's container
as source (see :mod:`agentnest.runtime.egresslog`).
"""

# The proxy runs on the image's Python (>= 3.8): keep typing.Dict & co and %-formatting.
# ruff: noqa: UP006, UP007, UP031, UP035, UP045

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

# -- what the proxy says -------------------------------------------------------

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

# Host name labels per RFC 1123, lower case.  \Z, not $: '$' also matches
# before a final newline, and 'a\n' is no label.
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
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
