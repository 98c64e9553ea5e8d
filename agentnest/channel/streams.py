"""Byte streams between the host and an agent.

A backend's only job towards the channel is to hand over one of these: a
bidirectional byte stream whose far end is the agent's stdin/stdout.
"""

from __future__ import annotations

import socket
import struct
import threading
from abc import ABC, abstractmethod
from collections import deque
from typing import Any


class ByteStream(ABC):
    """A blocking, bidirectional byte stream to an agent.

    ``read`` returns at most ``max_bytes`` (at least one) or ``b""`` at end of
    stream; ``write`` sends everything or raises ``OSError``.  ``close`` is
    idempotent and unblocks a concurrent ``read``.
    """

    @abstractmethod
    def read(self, max_bytes: int) -> bytes: ...

    @abstractmethod
    def write(self, data: bytes) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def diagnostics(self) -> str:
        """What the agent wrote to its stderr, if the transport keeps it."""
        return ""


class SocketStream(ByteStream):
    """A plain connected socket (socketpair, unix or TCP)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._closed = False

    def read(self, max_bytes: int) -> bytes:
        try:
            return self._sock.recv(max_bytes)
        except OSError:
            if self._closed:
                return b""
            raise

    def write(self, data: bytes) -> None:
        self._sock.sendall(data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


_MUX = struct.Struct(">BxxxI")


class DockerMuxStream(ByteStream):
    """A hijacked Docker attach/exec socket of a container without a TTY.

    Docker multiplexes the process's stdout and stderr on one connection with
    an 8-byte header per piece (stream type, 3 zero bytes, big-endian length).
    stdout carries agent frames; stderr is the agent's diagnostics, of which
    only the last ``keep_stderr`` bytes are kept (sandbox code can write
    there too, so it is bounded and never parsed).
    """

    def __init__(
        self,
        sock: socket.socket,
        keep_stderr: int = 16 * 1024,
        owner: Any = None,
        eof_marker: bytes | None = None,
    ) -> None:
        self._sock = sock
        # The transport's wrapper around the socket (docker-py's SocketIO): it
        # holds a reference that keeps the descriptor open until it is closed.
        self._owner = owner
        # A stderr line that means "the agent exited" (see runtime.bootstrap):
        # the engine keeps an attach stream open while the container runs.
        self._eof_marker = eof_marker
        self._tail = b""
        self._eof = False
        self._buf = bytearray()
        self._kind = 0
        self._left = 0
        self._stderr: deque[bytes] = deque()
        self._stderr_len = 0
        self._keep = keep_stderr
        self._closed = False
        self._lock = threading.Lock()

    def _fill(self) -> bool:
        try:
            data = self._sock.recv(1024 * 1024)
        except OSError:
            if self._closed:
                return False
            raise
        if not data:
            return False
        self._buf += data
        return True

    def read(self, max_bytes: int) -> bytes:
        while True:
            if self._eof:
                return b""
            if self._left == 0:
                while len(self._buf) < _MUX.size:
                    if not self._fill():
                        return b""
                self._kind, self._left = _MUX.unpack_from(self._buf)
                del self._buf[: _MUX.size]
                continue
            if not self._buf and not self._fill():
                return b""
            n = min(self._left, len(self._buf), max_bytes)
            piece = bytes(self._buf[:n])
            del self._buf[:n]
            self._left -= n
            if self._kind == 2:
                self._keep_stderr(piece)
                continue
            if self._kind != 1:
                continue  # stdin echo or unknown: ignore
            return piece

    def _keep_stderr(self, piece: bytes) -> None:
        if self._eof_marker is not None:
            window = self._tail + piece
            if self._eof_marker in window:
                self._eof = True
            self._tail = window[-len(self._eof_marker) :]
        self._stderr.append(piece)
        self._stderr_len += len(piece)
        while self._stderr_len > self._keep and len(self._stderr) > 1:
            self._stderr_len -= len(self._stderr.popleft())

    def diagnostics(self) -> str:
        return b"".join(self._stderr)[-self._keep :].decode("utf-8", "replace")

    def write(self, data: bytes) -> None:
        with self._lock:
            self._sock.sendall(data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self._owner is not None:
            try:
                self._owner.close()
            except OSError:
                pass
