"""A small client for the Kubernetes pod exec websocket (``pods/{name}/exec``).

Why our own: the official client's ``stream()`` buffers without bound, polls,
and patches a shared ``ApiClient`` (research/kubernetes.md §1.4, §1.6).  This
module is one sans-I/O core and two thin faces over the ``websockets``
package:

- the core (:func:`encode`, :func:`decode`, :func:`parse_status`,
  :class:`ExecSession`) turns websocket messages into stdout bytes, a bounded
  stderr tail and one outcome, and stdin into bounded frames.  It does no I/O.
- :class:`ExecStream` (blocking, a :class:`~agentnest.channel.streams.ByteStream`)
  and :class:`AsyncExecStream` (the same methods, awaited) only send and
  receive.  :func:`run` / :func:`arun` are one-shot execs with bounded output.

The wire (``k8s.io/apimachinery/pkg/util/remotecommand``): every message is
binary, one channel byte then the payload; 0 stdin, 1 stdout, 2 stderr,
3 status (one ``metav1.Status`` JSON), 4 resize and, in ``v5.channel.k8s.io``
only, 255 = CLOSE sent as ``[255, channel]`` (half-closes that stream, so the
process sees EOF on stdin).  ``v4.channel.k8s.io`` (pre-1.30 clusters, or the
kubelet path) cannot close stdin: :meth:`ExecStream.close_stdin` returns
``False`` there and only closing the socket ends the session.

Outcomes are read strictly: ``Success`` is exit 0; ``Failure`` with reason
``NonZeroExitCode`` and a cause ``{"reason": "ExitCode", "message": "<n>"}``
is exit ``n``; any other ``Failure`` is an infrastructure error
(:class:`ExecFailedError`); a stream that ends with no status was *lost*
(:class:`ExecStreamLostError`), never exit 0 (k8s#73056 is kubectl getting
this wrong).

Keepalive: websocket pings every 20 s keep the TCP path and load balancers
alive and detect a dead peer.  Whether control frames reset the apiserver's
and kubelet's idle timers is unverified (the apiserver resets its deadline
per data message, and the kubelet's ``streamingConnectionIdleTimeout`` may be
as low as 5 min under the CIS benchmark), so a long-lived stream must carry
data: the agent channel's in-band heartbeats do exactly that.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import json
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any

from ...channel.streams import ByteStream
from ...errors import (
    AgentNestError,
    BackendError,
    ConfigurationError,
    ExecutionTimeoutError,
    MissingDependencyError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
)
from .connection import ExecTarget, exec_url
from .execproto import (
    CLOSE_TIMEOUT,
    DEFAULT_STDERR_TAIL,
    MAX_ERROR_TEXT,
    MAX_MESSAGE_BYTES,
    MAX_QUEUE,
    MAX_STATUS_BYTES,
    PING_INTERVAL,
    PING_TIMEOUT,
    SUBPROTOCOLS,
    ExecProtocolError,
    ExecSession,
    ExecStreamLostError,
)
from .reasons import api_error

# --------------------------------------------------------------------------- handshake errors


def _refusal_text(body: bytes) -> tuple[str, str]:
    """(message, reason) from an apiserver's error body (a Status, or plain text)."""
    body = bytes(body[:MAX_STATUS_BYTES])
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace").strip()[:MAX_ERROR_TEXT], ""
    if isinstance(doc, dict):
        message = doc.get("message")
        reason = doc.get("reason")
        return (
            (message if isinstance(message, str) else json.dumps(doc))[:MAX_ERROR_TEXT],
            reason if isinstance(reason, str) else "",
        )
    return str(doc)[:MAX_ERROR_TEXT], ""


def handshake_error(status: int, body: bytes, target: ExecTarget) -> AgentNestError:
    """Map an HTTP refusal of the exec upgrade to the error tree, with the apiserver's own words."""
    message, reason = _refusal_text(body)
    where = f"pod {target.namespace}/{target.pod}"
    said = f"HTTP {status}: {message or reason or '(no message)'}"
    if status == 404:
        return SandboxDestroyedError(f"{where} is gone ({said})")
    if status in (401, 403):
        # The same refusals as any REST call (credentials, RBAC: pods/exec
        # needs get and, from 1.35, create), with the same fixes and reasons.
        return api_error(status, body[:MAX_STATUS_BYTES], action=f"exec into {where} (HTTP {status})")
    low = message.lower()
    if "completed pod" in low or "container not found" in low:
        # The container exited (or was replaced): the sandbox as we knew it is gone.
        return SandboxDestroyedError(f"the container of {where} is not running ({said})")
    return BackendError(f"the apiserver refused the exec into {where} ({said})")


def _map_connect_error(exc: BaseException, target: ExecTarget) -> AgentNestError:
    from websockets.exceptions import InvalidHandshake, InvalidStatus

    host = target.connection.host
    if isinstance(exc, InvalidStatus):
        return handshake_error(exc.response.status_code, bytes(exc.response.body), target)
    if isinstance(exc, InvalidHandshake):
        return ExecProtocolError(f"the exec handshake with {host} failed: {exc}")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return RuntimeNotAvailableError(
            f"TLS verification of {host} failed ({exc.verify_message}); check the kubeconfig's "
            "certificate-authority"
        )
    if isinstance(exc, TimeoutError):
        return RuntimeNotAvailableError(f"the apiserver at {host} did not answer the exec in time")
    return RuntimeNotAvailableError(f"cannot reach the apiserver at {host}: {exc}")


def _websockets() -> Any:
    try:
        import websockets
    except ImportError:  # pragma: no cover - a dependency of the kubernetes extra
        raise MissingDependencyError(
            "the Kubernetes backend needs the websockets package: pip install 'agentnest[kubernetes]'"
        ) from None
    return websockets


class _SerialTLSSocket:
    """An ``ssl.SSLSocket`` whose OpenSSL calls never overlap, for websockets' sync connection.

    That connection reads the socket in its own thread while other threads
    ``sendall`` on it; over TLS both are calls into one OpenSSL ``SSL``
    object, which OpenSSL forbids from two threads at once, and Python's
    ``ssl`` module does not serialise them (CPython 3.13.6 tried, with a lock
    held across a blocking read, and deadlocked websockets: gh-137583).  It is not harmless: right
    after the handshake a TLS 1.3 server sends its session tickets, the
    receive thread's ``SSL_read`` processes them (OpenSSL's handshake state
    machine, briefly "in init") while the caller's ``SSL_write`` sends the
    upgrade request, and the request can vanish: ``SSL_write`` reported all
    of it written and not a byte of it reached the socket (the kernel's
    counters: only the ClientHello and Finished went out), so the server never
    saw a request and the client waited out its ``open_timeout`` ("did not
    answer the exec in time").  Seen about once in 500 to 1000 execs against
    the double with two CPUs busy; a Go apiserver sends session tickets too.

    Here the socket is non-blocking and every OpenSSL call runs under one
    lock, which is never held while waiting: a read or write that would block
    releases it and waits in ``select`` for the socket, then tries again.  So
    the receive thread waits outside OpenSSL, and a write goes between its
    reads.  ``settimeout`` (websockets' close deadline) bounds each wait.
    """

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock
        self._timeout = sock.gettimeout()
        self._closed = False
        self._openssl = threading.Lock()  # held around one non-blocking OpenSSL call, never a wait
        self._sending = threading.Lock()  # a retried SSL_write must see the rest of the same data
        sock.setblocking(False)

    def fileno(self) -> int:
        return self._sock.fileno()

    def getsockname(self) -> Any:
        return self._sock.getsockname()

    def getpeername(self) -> Any:
        return self._sock.getpeername()

    def gettimeout(self) -> float | None:
        return self._timeout

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def _wait(self, writable: bool, deadline: float | None, *, briefly: bool = False) -> None:
        """Until the socket is ready (``writable``, else readable), closed, or a while has passed.

        A while: 50 ms ``briefly``, else 250 ms.  ``close()`` shuts the socket
        down first, which wakes a wait; the slices bound one that starts just
        as it closes (epoll forgets a closed descriptor, and nothing wakes it).

        Raises TimeoutError past ``deadline`` (monotonic; None: never).
        """
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError("timed out")
        slice_ = 0.05 if briefly else 0.25
        left = slice_ if left is None else min(left, slice_)
        fd = self._sock.fileno()
        if self._closed or fd < 0:
            return
        event = selectors.EVENT_WRITE if writable else selectors.EVENT_READ
        with selectors.DefaultSelector() as selector:
            selector.register(fd, event)
            selector.select(left)

    def recv(self, bufsize: int) -> bytes:
        deadline = self._deadline()
        while True:
            with self._openssl:
                if self._closed:
                    return b""
                try:
                    data = self._sock.recv(bufsize)
                except (ssl.SSLWantReadError, BlockingIOError):
                    writable = False
                except ssl.SSLWantWriteError:
                    writable = True
                else:
                    # What OpenSSL has decrypted already, select() cannot see: take it now.
                    with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLWantWriteError):
                        while data and len(data) < bufsize and self._sock.pending():
                            data += self._sock.recv(bufsize - len(data))
                    return data
            self._wait(writable, deadline)

    def sendall(self, data: bytes) -> None:
        deadline = self._deadline()
        with self._sending:
            view = memoryview(data).cast("B")
            while view:
                with self._openssl:
                    if self._closed:
                        raise OSError(errno.EBADF, "the socket is closed")
                    try:
                        view = view[self._sock.send(view) :]
                        continue
                    except (ssl.SSLWantWriteError, BlockingIOError):
                        writable = True
                    except ssl.SSLWantReadError:
                        writable = False  # a TLS 1.2 renegotiation: never from a Go server
                # A write waiting to read may see the receive thread take what it waits for: look again soon.
                self._wait(writable, deadline, briefly=not writable)

    def shutdown(self, how: int) -> None:
        with self._openssl:
            self._sock.shutdown(how)

    def close(self) -> None:
        with self._openssl:
            self._closed = True
            # The shutdown wakes a thread waiting for the socket in _wait.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()


@functools.lru_cache(maxsize=1)
def _connection_class() -> Any:
    """websockets' sync ClientConnection: its TLS calls serialised, its socket shut down before it is closed.

    Over TLS its socket is a :class:`_SerialTLSSocket` (why: there).  Its
    receive thread waits in ``select`` and then reads: over TLS the data that
    woke it may be no application data at all (a TLS 1.3 session ticket right
    after the handshake), so the read waits on, and ``close()`` of the socket
    from another thread does not wake it.  A failed or timed-out handshake
    then hung forever in ``connect()`` (websockets 17.4, a server that never
    answers the upgrade: reproduced).  ``shutdown`` wakes that wait.
    """
    from websockets.sync.client import ClientConnection

    class ShutdownFirst(ClientConnection):
        def __init__(self, sock: Any, protocol: Any, **kwargs: Any) -> None:
            if isinstance(sock, ssl.SSLSocket):
                sock = _SerialTLSSocket(sock)
            super().__init__(sock, protocol, **kwargs)

        def close_socket(self) -> None:
            with contextlib.suppress(OSError):
                self.socket.shutdown(socket.SHUT_RDWR)
            super().close_socket()

    return ShutdownFirst


def _connect_kwargs(target: ExecTarget, open_timeout: float, connect: Any) -> dict[str, Any]:
    conn = target.connection
    kwargs: dict[str, Any] = {
        "additional_headers": conn.request_headers(),
        "subprotocols": list(SUBPROTOCOLS),
        "max_size": MAX_MESSAGE_BYTES,
        "max_queue": MAX_QUEUE,
        "ping_interval": PING_INTERVAL,
        "ping_timeout": PING_TIMEOUT,
        "close_timeout": CLOSE_TIMEOUT,
        "open_timeout": open_timeout,
        # Never silently pick up HTTPS_PROXY: the token would go wherever it points.
        "proxy": conn.proxy,
        "compression": None,
        "user_agent_header": "agentnest-wsexec",
    }
    if "proxy" not in inspect.signature(connect).parameters:
        # websockets < 15 has no proxy support (and reads no environment proxy either).
        if conn.proxy is not None:
            raise ConfigurationError(f"the kubeconfig names proxy {conn.proxy}; that needs websockets >= 15")
        del kwargs["proxy"]
    if conn.ssl is not None:
        kwargs["ssl"] = conn.ssl
        if conn.server_hostname:
            kwargs["server_hostname"] = conn.server_hostname
    return kwargs


# --------------------------------------------------------------------------- sync face


class ExecStream(ByteStream):
    """A blocking exec stream: stdout is the byte stream, stdin is :meth:`write`.

    Safe to :meth:`read` in one thread while :meth:`write` runs in another
    (websockets' sync connection allows one receiver and serialised senders;
    writes are serialised here).  The connection's receive thread stops
    reading the socket while ``MAX_QUEUE`` messages wait (backpressure).

    Example::

        stream = ExecStream.open(target, ["cat"])
        stream.write(b"hi"); stream.close_stdin()
        assert stream.read(10) == b"hi"
    """

    def __init__(self, connection: Any, session: ExecSession) -> None:
        self._ws = connection
        self.session = session
        self._buf = b""
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(
        cls,
        target: ExecTarget,
        argv: Sequence[str],
        *,
        stdin: bool = True,
        open_timeout: float = 30.0,
        keep_stderr: int = DEFAULT_STDERR_TAIL,
    ) -> ExecStream:
        """Start ``argv`` in the target container.

        Raises:
            SandboxDestroyedError: the pod or its container is gone.
            BackendError: the apiserver refused (RBAC, pod not running...).
            RuntimeNotAvailableError: the apiserver cannot be reached.
            ExecProtocolError: no usable subprotocol was negotiated.
        """
        websockets = _websockets()
        from websockets.sync.client import connect

        url = exec_url(target, argv, stdin=stdin)
        kwargs = _connect_kwargs(target, open_timeout, connect)
        if "create_connection" in inspect.signature(connect).parameters:
            kwargs["create_connection"] = _connection_class()  # the sync face only
        if "legacy" in inspect.signature(connect).parameters:
            # 17.1+ warns unless connect() is a context manager; this object
            # outlives any with-block, and closes in close().
            kwargs["legacy"] = True
        try:
            ws = connect(url, **kwargs)
        except (OSError, TimeoutError, websockets.exceptions.InvalidHandshake) as exc:
            raise _map_connect_error(exc, target) from None
        try:
            session = ExecSession(ws.subprotocol, keep_stderr=keep_stderr)
        except ExecProtocolError:
            ws.close()
            raise
        return cls(ws, session)

    @property
    def subprotocol(self) -> str:
        return self.session.subprotocol

    def _recv(self, timeout: float | None = None) -> bytes | None:
        """One stdout payload (maybe empty), or ``None`` at the end of the stream."""
        from websockets.exceptions import ConnectionClosed

        if self.session.finished:
            return None
        try:
            message = self._ws.recv(timeout)
        except ConnectionClosed:
            self.session.connection_closed()
            return None
        except TimeoutError:
            raise
        except (OSError, RuntimeError):
            self.session.connection_closed()
            if self._closed:
                return None
            raise
        if isinstance(message, str):
            # The channel protocols are binary; a text frame is a legacy or broken server.
            self.session.error = ExecProtocolError("the exec endpoint sent a text message")
            return None
        return self.session.receive(message)

    def _recv_before(self, deadline: float, late: str) -> bytes | None:
        """:meth:`_recv`, waiting until ``deadline`` (monotonic); then ExecutionTimeoutError(``late``)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExecutionTimeoutError(late)
            try:
                return self._recv(left)
            except TimeoutError:
                continue

    def read(self, max_bytes: int) -> bytes:
        while not self._buf:
            data = self._recv()
            if data is None:
                return b""
            self._buf = data
        piece, self._buf = self._buf[:max_bytes], self._buf[max_bytes:]
        return piece

    def read_line(self, limit: int, timeout: float) -> bytes:
        """The stream's first bytes up to and including ``\n``; what follows stays for :meth:`read`.

        For a program that speaks one line before the stream becomes
        something else (the network check before the bridge).

        Raises:
            ExecutionTimeoutError: no full line within ``timeout`` seconds.
            ExecProtocolError: ``limit`` bytes without a newline.
            ExecStreamLostError: the stream ended first (see ``ExecSession.exit_code``
                for why: the status, stderr).
        """
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            if len(self._buf) >= limit:
                raise ExecProtocolError(f"no line within the first {limit} bytes of the exec's output")
            data = self._recv_before(deadline, f"the exec printed no line within {timeout:g} s")
            if data is None:
                tail = self.session.stderr()[-300:].decode("utf-8", "replace")
                ending = self.session.describe() or "no status"
                raise ExecStreamLostError(f"the exec ended before its first line ({ending}): {tail!r}")
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line + b"\n"

    def write(self, data: bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        with self._lock:
            try:
                for frame in self.session.stdin(bytes(data)):
                    self._ws.send(frame)
            except ConnectionClosed as exc:
                raise OSError(f"the exec stream is closed ({exc})") from None

    def close_stdin(self) -> bool:
        """Send EOF to the process's stdin; ``False`` where the protocol cannot (v4)."""
        from websockets.exceptions import ConnectionClosed

        with self._lock:
            frame = self.session.close_stdin()
            if frame is None:
                return self.session.stdin_closed
            try:
                self._ws.send(frame)
            except ConnectionClosed as exc:
                raise OSError(f"the exec stream is closed ({exc})") from None
        return True

    def exit_code(self, timeout: float | None = None) -> int:
        """Drain the stream (stdout discarded) and return the exit code (see ``ExecSession.exit_code``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.session.finished:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ExecutionTimeoutError("the exec did not finish in time")
            try:
                self._recv(left)
            except TimeoutError:
                raise ExecutionTimeoutError("the exec did not finish in time") from None
        return self.session.exit_code()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # v5: half-close stdin first, so a process that exits on EOF (the
        # bridge) ends now; an exec'd process survives the client's
        # disconnect otherwise (runc#3359).
        try:
            if not self.session.finished:
                self.close_stdin()
        except (OSError, RuntimeError):
            pass
        try:
            self._ws.close()
        except (OSError, RuntimeError):
            pass

    def diagnostics(self) -> str:
        text = self.session.stderr().decode("utf-8", "replace")
        ending = self.session.describe()
        return f"{text}\n[{ending}]" if ending else text


def _take(sink: bytearray, data: bytes, limit: int) -> None:
    room = limit - len(sink)
    if room > 0:
        sink += data[:room]


def run(
    target: ExecTarget,
    argv: Sequence[str],
    stdin: bytes = b"",
    timeout: float = 60.0,
    *,
    max_output: int = 1024 * 1024,
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` once: ``(exit_code, stdout, stderr)``, each output capped at ``max_output``.

    stdout keeps its first ``max_output`` bytes, stderr its last.  On v4
    stdin cannot be closed: with ``stdin`` empty, the process gets none;
    otherwise it must exit without waiting for EOF.

    Raises:
        ExecutionTimeoutError: not finished within ``timeout`` (the stream is closed).
        ExecFailedError / ExecStreamLostError / ExecProtocolError: see :meth:`ExecSession.exit_code`.
        and the errors of :meth:`ExecStream.open`.
    """
    deadline = time.monotonic() + timeout
    stream = ExecStream.open(target, argv, stdin=bool(stdin), open_timeout=timeout, keep_stderr=max_output)
    errors: list[BaseException] = []

    def feed() -> None:
        try:
            stream.write(stdin)
            stream.close_stdin()
        except OSError as exc:  # the process may exit before reading all of it
            errors.append(exc)

    writer = threading.Thread(target=feed, daemon=True, name="agentnest-wsexec-stdin")
    if stdin:
        writer.start()
    out = bytearray()
    try:
        while True:
            data = stream._recv_before(deadline, f"{argv[0]!r} did not finish within {timeout} s")
            if data is None:
                break
            _take(out, data, max_output)
        code = stream.session.exit_code()
        return code, bytes(out), stream.session.stderr()
    finally:
        stream.close()
        if stdin:
            writer.join(timeout=CLOSE_TIMEOUT)


# --------------------------------------------------------------------------- async face


class AsyncExecStream:
    """:class:`ExecStream`, awaited (``websockets.asyncio``); the same methods, same contract."""

    def __init__(self, connection: Any, session: ExecSession) -> None:
        import asyncio

        self._ws = connection
        self.session = session
        self._buf = b""
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def open(
        cls,
        target: ExecTarget,
        argv: Sequence[str],
        *,
        stdin: bool = True,
        open_timeout: float = 30.0,
        keep_stderr: int = DEFAULT_STDERR_TAIL,
    ) -> AsyncExecStream:
        """See :meth:`ExecStream.open`."""
        websockets = _websockets()
        from websockets.asyncio.client import connect

        url = exec_url(target, argv, stdin=stdin)
        try:
            ws = await connect(url, **_connect_kwargs(target, open_timeout, connect))
        except (OSError, TimeoutError, websockets.exceptions.InvalidHandshake) as exc:
            raise _map_connect_error(exc, target) from None
        try:
            session = ExecSession(ws.subprotocol, keep_stderr=keep_stderr)
        except ExecProtocolError:
            await ws.close()
            raise
        return cls(ws, session)

    @property
    def subprotocol(self) -> str:
        return self.session.subprotocol

    async def _recv(self) -> bytes | None:
        from websockets.exceptions import ConnectionClosed

        if self.session.finished:
            return None
        try:
            message = await self._ws.recv()
        except ConnectionClosed:
            self.session.connection_closed()
            return None
        if isinstance(message, str):
            self.session.error = ExecProtocolError("the exec endpoint sent a text message")
            return None
        return self.session.receive(message)

    async def read(self, max_bytes: int) -> bytes:
        while not self._buf:
            data = await self._recv()
            if data is None:
                return b""
            self._buf = data
        piece, self._buf = self._buf[:max_bytes], self._buf[max_bytes:]
        return piece

    async def write(self, data: bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        async with self._lock:
            try:
                for frame in self.session.stdin(bytes(data)):
                    await self._ws.send(frame)
            except ConnectionClosed as exc:
                raise OSError(f"the exec stream is closed ({exc})") from None

    async def close_stdin(self) -> bool:
        from websockets.exceptions import ConnectionClosed

        async with self._lock:
            frame = self.session.close_stdin()
            if frame is None:
                return self.session.stdin_closed
            try:
                await self._ws.send(frame)
            except ConnectionClosed as exc:
                raise OSError(f"the exec stream is closed ({exc})") from None
        return True

    async def exit_code(self) -> int:
        while await self._recv() is not None:
            pass
        return self.session.exit_code()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not self.session.finished:
                await self.close_stdin()
        except (OSError, RuntimeError):
            pass
        try:
            await self._ws.close()
        except (OSError, RuntimeError):
            pass

    def diagnostics(self) -> str:
        text = self.session.stderr().decode("utf-8", "replace")
        ending = self.session.describe()
        return f"{text}\n[{ending}]" if ending else text


async def arun(
    target: ExecTarget,
    argv: Sequence[str],
    stdin: bytes = b"",
    timeout: float = 60.0,
    *,
    max_output: int = 1024 * 1024,
) -> tuple[int, bytes, bytes]:
    """:func:`run`, awaited."""
    import asyncio

    async def go() -> tuple[int, bytes, bytes]:
        stream = await AsyncExecStream.open(
            target, argv, stdin=bool(stdin), open_timeout=timeout, keep_stderr=max_output
        )

        async def feed() -> None:
            try:
                await stream.write(stdin)
                await stream.close_stdin()
            except OSError:
                pass

        writer = asyncio.ensure_future(feed()) if stdin else None
        out = bytearray()
        try:
            while (data := await stream._recv()) is not None:
                _take(out, data, max_output)
            return stream.session.exit_code(), bytes(out), stream.session.stderr()
        finally:
            if writer is not None:
                writer.cancel()
            await stream.close()

    try:
        return await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        raise ExecutionTimeoutError(f"{argv[0]!r} did not finish within {timeout} s") from None
