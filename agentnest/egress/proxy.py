"""AgentNest's egress proxy: the only way out of an allowlisted sandbox.

The shell that applies the decisions of the pure modules beside it: the
allowlist (:mod:`.rules`), the TLS ClientHello (:mod:`.hello`) and the HTTP
request head (:mod:`.head`).  This module owns the sockets, the timeouts and
the connection limit (asyncio: one task per client connection) and the events
on stdout; :mod:`.serve` runs it as a program (config, startup, deadline).

Stdlib only and Python 3.8 compatible: the backends ship this package as
source into a hardened container (Docker) or Pod (Kubernetes) from the base
image (see :mod:`agentnest.runtime.egresslog`), and the unit tests run it
in-process.  It imports nothing outside the standard library and its package.

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
``port``, ``address``, ``reason`` (a stable code, see :data:`.rules.REASONS`),
``detail``, ``method``, ``bytes_up``, ``bytes_down``, ``duration``, ``time``.
An allowed connection's line comes when it closes, with its byte counts.
"""

# The proxy runs on the image's Python (>= 3.8): keep typing.Dict & co and %-formatting.
# ruff: noqa: UP006, UP007, UP031, UP035, UP045

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from .head import (
    Request,
    RequestError,
    body_framing,
    chunk_size,
    origin_form,
    parse_head,
    refusal,
    split_authority,
    upstream_head,
)
from .hello import ClientHelloReader, HelloError
from .rules import EVENT_ALLOWED, EVENT_DENIED, EVENT_READY, IPAddress, Rules, normalize_host, parse_ip

# The proxy, and the names its importers take from here.
__all__ = ["EVENT_READY", "Limits", "Proxy", "Rules", "parse_ip", "print_event", "read_client_hello"]


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


# -- TLS ClientHello -----------------------------------------------------------


async def read_client_hello(reader: asyncio.StreamReader, max_bytes: int) -> Tuple[Optional[str], bytes]:
    """Read one ClientHello (possibly over several TLS records); return (SNI, raw bytes).

    :class:`.hello.ClientHelloReader` decides; this only reads what it asks for.

    Raises:
        HelloError: not TLS, malformed, or larger than ``max_bytes``.
        asyncio.IncompleteReadError: the client closed first.
    """
    hello = ClientHelloReader(max_bytes)
    while True:
        result = hello.feed(await reader.readexactly(hello.need))
        if result is not None:
            return result


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


def print_event(event: Dict[str, Any]) -> None:
    """Write ``event`` as one JSON line on stdout: the default sink of every decision."""
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
        self.emit = emit or print_event
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
            host, port, path = origin_form(request)
            body = body_framing(request)
            ip = await self._decide(conn, host, port)
            up_reader, up_writer = await self._open(conn, ip, port)
        except RequestError as exc:
            if exc.host:  # a Host header that disagrees: the event names the target
                conn.host, conn.port = exc.host, exc.port
            await self._refuse(writer, conn, exc)
            return
        head = upstream_head(request, path)
        try:
            up_writer.write(head)
            conn.bytes_up += len(head)
            await self._relay(reader, writer, up_reader, up_writer, conn, request_body=body)
        finally:
            up_writer.close()
        self._finish(conn)

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
                    size = chunk_size(line[:-2])
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
        writer.write(refusal(exc))
        try:
            await asyncio.wait_for(writer.drain(), 5.0)
        except (OSError, asyncio.TimeoutError):
            pass

    def _deny(self, conn: _Conn, reason: str, detail: str) -> None:
        self.emit(conn.event(False, reason, detail))

    def _finish(self, conn: _Conn) -> None:
        self.emit(conn.event(True, "allowed"))
