"""The exec websocket's wire, without I/O: frames, the strict status, one session's state.

The wire (``k8s.io/apimachinery/pkg/util/remotecommand``): every message is
binary, one channel byte then the payload; 0 stdin, 1 stdout, 2 stderr,
3 status (one ``metav1.Status`` JSON), 4 resize and, in ``v5.channel.k8s.io``
only, 255 = CLOSE sent as ``[255, channel]`` (half-closes that stream, so the
process sees EOF on stdin).  ``v4.channel.k8s.io`` (pre-1.30 clusters, or the
kubelet path) cannot close stdin.

Outcomes are read strictly: ``Success`` is exit 0; ``Failure`` with reason
``NonZeroExitCode`` and a cause ``{"reason": "ExitCode", "message": "<n>"}``
is exit ``n``; any other ``Failure`` is an infrastructure error
(:class:`ExecFailedError`); a stream that ends with no status was *lost*
(:class:`ExecStreamLostError`), never exit 0 (k8s#73056 is kubectl getting
this wrong).  The faces that do the I/O are in :mod:`.wsexec`.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from ...errors import AgentNestError, BackendError, ChannelError

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
#: Offered in this order: the server picks v5 when it can (it is the only one that can close stdin).
SUBPROTOCOLS = (V5, V4)

STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255

#: Stdin frames are cut at this size: the apiserver reads whole client frames
#: (x/net/websocket, 32 MiB cap) and clients saw resets at tens of MiB and a
#: silently empty stdin above ~40 MiB (research §1.3).
MAX_STDIN_CHUNK = 256 * 1024
#: The largest websocket message accepted from the server.  The apiserver
#: relays output in ~32 KiB messages; anything this large is a broken peer.
MAX_MESSAGE_BYTES = 1024 * 1024
#: Messages the receive thread may queue before it stops reading the socket
#: (backpressure): at most MAX_QUEUE * MAX_MESSAGE_BYTES buffered.
MAX_QUEUE = 16
#: A real Status is a few hundred bytes; a bigger one is refused, not parsed.
MAX_STATUS_BYTES = 64 * 1024
#: Stderr is diagnostics (sandbox code may write there too): only a tail is kept.
DEFAULT_STDERR_TAIL = 16 * 1024
#: How much of an apiserver's refusal is quoted in an error message.
MAX_ERROR_TEXT = 2048
PING_INTERVAL = 20.0
PING_TIMEOUT = 20.0
CLOSE_TIMEOUT = 2.0


# --------------------------------------------------------------------------- errors


class ExecProtocolError(ChannelError):
    """The exec endpoint broke the channel protocol (bad subprotocol, malformed or oversized status).

    .. versionadded:: 0.4.0
    """


class ExecStreamLostError(ChannelError):
    """The exec stream ended without a status: the command's outcome is unknown (not exit 0).

    .. versionadded:: 0.4.0
    """


class ExecFailedError(BackendError):
    """The cluster reported a failure that is not the command's exit code (``reason`` says which).

    .. versionadded:: 0.4.0
    """

    def __init__(self, message: str, reason: str = "", code: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


# --------------------------------------------------------------------------- codec


def encode(channel: int, payload: bytes = b"") -> bytes:
    """One websocket message: the channel byte, then the payload."""
    if not 0 <= channel <= 255:
        raise ValueError(f"channel {channel} is not a byte")
    return bytes((channel,)) + bytes(payload)


def decode(message: bytes) -> tuple[int, bytes] | None:
    """``(channel, payload)`` of a message, or ``None`` for an empty one (skipped, as the server does)."""
    if not message:
        return None
    return message[0], bytes(message[1:])


def stdin_frames(data: bytes, chunk: int = MAX_STDIN_CHUNK) -> Iterator[bytes]:
    """``data`` as stdin messages of at most ``chunk`` payload bytes each."""
    if chunk <= 0:
        raise ValueError("chunk must be positive")
    view = memoryview(data)
    for start in range(0, len(view), chunk):
        yield encode(STDIN, view[start : start + chunk].tobytes())


@dataclass(frozen=True, slots=True)
class ExecStatus:
    """The channel-3 outcome: ``exit_code`` is set for a command that ran, else a cluster failure."""

    exit_code: int | None
    reason: str = ""
    message: str = ""
    code: int | None = None

    def error(self) -> ExecFailedError:
        """The infrastructure error this status stands for (only when ``exit_code`` is ``None``)."""
        return ExecFailedError(
            f"the cluster failed the exec: {self.reason or 'Failure'}: {self.message or '(no message)'}",
            self.reason,
            self.code,
        )


def parse_status(raw: bytes, max_bytes: int = MAX_STATUS_BYTES) -> ExecStatus:
    """Read one ``metav1.Status`` strictly (research §1.2).

    Raises:
        ExecProtocolError: too large, not JSON, not a Status, or an exit code
            that is missing or not an integer.
    """
    if len(raw) > max_bytes:
        raise ExecProtocolError(f"the exec status is over {max_bytes} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ExecProtocolError(f"the exec status is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ExecProtocolError("the exec status is not a JSON object")
    status = doc.get("status")
    reason = doc.get("reason") or ""
    message = doc.get("message") or ""
    code = doc.get("code")
    if not isinstance(reason, str) or not isinstance(message, str):
        raise ExecProtocolError("the exec status has a non-string reason or message")
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        raise ExecProtocolError("the exec status has a non-integer code")
    message = message[:MAX_ERROR_TEXT]
    if status == "Success":
        return ExecStatus(0, reason, message, code)
    if status != "Failure":
        raise ExecProtocolError(f"the exec status is neither Success nor Failure: {str(status)[:64]!r}")
    if reason != "NonZeroExitCode":
        return ExecStatus(None, reason, message, code)
    details = doc.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if isinstance(causes, list):
        for cause in causes:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                text = cause.get("message")
                # Only plain decimal digits: int() would also take " 3", "+3", "٣" or "3_0".
                if isinstance(text, str) and 0 < len(text) <= 10 and text.isascii() and text.isdigit():
                    exit_code = int(text)
                    if exit_code != 0:
                        return ExecStatus(exit_code, reason, message, code)
                raise ExecProtocolError(f"the exec status has a bad exit code: {str(text)[:32]!r}")
    raise ExecProtocolError("the exec status says NonZeroExitCode but carries no ExitCode cause")


class ExecSession:
    """The state of one exec stream, without I/O: feed it messages, send what it returns.

    Args:
        subprotocol: what the server selected in the handshake.
        keep_stderr: how many trailing stderr bytes to keep.
        max_status: the cap on the channel-3 status.

    Raises:
        ExecProtocolError: the server selected no subprotocol, or one we did not offer.
    """

    def __init__(
        self,
        subprotocol: str | None,
        *,
        keep_stderr: int = DEFAULT_STDERR_TAIL,
        max_status: int = MAX_STATUS_BYTES,
    ) -> None:
        if subprotocol not in SUBPROTOCOLS:
            # No subprotocol means a legacy server speaking the v1 protocol,
            # whose status is a bare string: an exit code cannot be trusted.
            raise ExecProtocolError(
                f"the exec endpoint selected subprotocol {subprotocol!r}; "
                f"this client speaks {', '.join(SUBPROTOCOLS)}"
            )
        self.subprotocol = subprotocol
        self._keep = keep_stderr
        self._max_status = max_status
        self._stderr: deque[bytes] = deque()
        self._stderr_len = 0
        self._status_buf = bytearray()
        self.status: ExecStatus | None = None
        self.error: AgentNestError | None = None
        self.closed = False
        self.stdin_closed = False

    @property
    def can_close_stdin(self) -> bool:
        """Only v5 has the CLOSE signal (KEP-4006)."""
        return self.subprotocol == V5

    @property
    def finished(self) -> bool:
        """A status arrived, the peer broke the protocol, or the connection ended."""
        return self.status is not None or self.error is not None or self.closed

    def receive(self, message: bytes) -> bytes:
        """Take one server message; return its stdout payload (``b""`` for anything else)."""
        if self.finished:
            return b""
        decoded = decode(message)
        if decoded is None:
            return b""
        channel, payload = decoded
        if channel == STDOUT:
            return payload
        if channel == STDERR:
            self._keep_stderr(payload)
        elif channel == STATUS:
            self._status_buf += payload
            if len(self._status_buf) > self._max_status:
                self.error = ExecProtocolError(f"the exec status is over {self._max_status} bytes")
                self._status_buf.clear()
                return b""
            try:
                json.loads(self._status_buf)
            except (ValueError, UnicodeDecodeError):
                # Go writes the status in one message, but a reader must not
                # assume it: keep what came until it parses or the stream ends
                # (connection_closed then reports it as malformed).
                return b""
            try:
                self.status = parse_status(bytes(self._status_buf), self._max_status)
            except ExecProtocolError as exc:
                self.error = exc
        # Anything else (resize echoes, unknown channels) is ignored, as the server does.
        return b""

    def _keep_stderr(self, piece: bytes) -> None:
        if not piece:
            return
        self._stderr.append(piece)
        self._stderr_len += len(piece)
        while self._stderr_len - len(self._stderr[0]) >= self._keep and len(self._stderr) > 1:
            self._stderr_len -= len(self._stderr.popleft())

    def stderr(self) -> bytes:
        """The last ``keep_stderr`` bytes of stderr."""
        return b"".join(self._stderr)[-self._keep :] if self._keep else b""

    def connection_closed(self) -> None:
        """The websocket ended: without a status, the stream is lost."""
        if self.closed:
            return
        self.closed = True
        if self.status is None and self.error is None:
            if self._status_buf:
                try:
                    parse_status(bytes(self._status_buf), self._max_status)
                except ExecProtocolError as exc:
                    self.error = exc
                else:  # pragma: no cover - a complete status is parsed on arrival
                    self.error = ExecProtocolError("the exec status was cut short")
            else:
                self.error = ExecStreamLostError(
                    "the exec stream ended without a status: the command's outcome is unknown"
                )

    def stdin(self, data: bytes, chunk: int = MAX_STDIN_CHUNK) -> list[bytes]:
        """The messages that carry ``data`` to the process's stdin."""
        if self.stdin_closed:
            raise OSError("stdin of the exec stream is closed")
        return list(stdin_frames(data, chunk))

    def close_stdin(self) -> bytes | None:
        """The CLOSE message for stdin (v5), or ``None`` where the protocol has none (v4)."""
        if not self.can_close_stdin:
            return None
        if self.stdin_closed:
            return None
        self.stdin_closed = True
        return encode(CLOSE, bytes((STDIN,)))

    def exit_code(self) -> int:
        """The command's exit code once finished.

        Raises:
            ExecFailedError: the cluster reported a failure that is not an exit code.
            ExecProtocolError: the status was malformed or oversized.
            ExecStreamLostError: the stream ended without a status.
        """
        if self.status is not None:
            if self.status.exit_code is None:
                raise self.status.error()
            return self.status.exit_code
        if self.error is not None:
            raise self.error
        raise ExecStreamLostError("the exec stream has not finished")

    def describe(self) -> str:
        """One line on how the stream ended, for diagnostics."""
        if self.status is not None:
            if self.status.exit_code is not None:
                return f"exec finished with exit code {self.status.exit_code}"
            return str(self.status.error())
        if self.error is not None:
            return str(self.error)
        return ""
