"""The egress proxy's events on Kubernetes: its pod's log, followed and fed into an :class:`EgressLog`.

The proxy pod writes one JSON line per connection to stdout, so the
kubelet keeps them in the proxy container's log (host names, ports and
verdicts: nothing of the sandbox's own stream, which never goes through a
container log).  A thread follows that log (``follow=true&timestamps=true``).
The apiserver and kubelet end a follow now and then (a silent stream, a
restarted apiserver, a proxy in front of it): the thread reconnects with
``sinceTime`` and drops the lines it already took, by their timestamps (the
server's ``sinceTime`` has whole seconds).  Lines are untrusted; EgressLog
validates them.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Any

from ...errors import AgentNestError
from ..egresslog import MAX_LINE, EgressLog

__all__ = ["ProxyLogFollower", "split_timestamp"]

#: How long one follow may stay silent before it is reopened (and the stop flag looked at).
READ_TIMEOUT = 20.0
#: How long one follow may last before it is reopened (a bound on any one request).
FOLLOW_TIMEOUT = 600.0
#: The wait between attempts while the apiserver does not answer.
RETRY_DELAY = 1.0

# RFC 3339 with up to nanoseconds, as the kubelet writes it (trailing zeros trimmed).
_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ")


def split_timestamp(line: bytes) -> tuple[tuple[str, int], bytes] | None:
    """``(("2026-12-03T16:50:00", nanoseconds), rest)`` of a timestamped log line; ``None`` if it has none.

    Compared as a tuple: the kubelet trims trailing zeros, so the text alone
    does not order (``.1234Z`` against ``.12345Z``).
    """
    match = _STAMP.match(line)
    if match is None:
        return None
    fraction = (match.group(2) or b"").decode().ljust(9, "0")
    return (match.group(1).decode(), int(fraction)), line[match.end() :]


class ProxyLogFollower:
    """Feeds ``log`` from the log of ``pod``'s ``proxy`` container until :meth:`stop`.

    ``api`` is a :class:`.api.KubeApi`.  The thread ends by itself when the
    pod is gone or its container ended for good; ``log.closed`` is set then.
    """

    def __init__(self, api: Any, pod: str, log: EgressLog, container: str = "proxy") -> None:
        self.api = api
        self.pod = pod
        self.log = log
        self.container = container
        self.last_error: str = ""
        self._stop = threading.Event()
        self._last: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self._run, name=f"agentnest-egress-{pod}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: float = 0.0) -> None:
        """Stop following (the current read ends at its next line or read timeout)."""
        self._stop.set()
        if wait:
            self._thread.join(wait)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                ended = self._follow_once()
                if self._stop.is_set() or (ended and self._finished()):
                    return
                if not ended:
                    self._stop.wait(RETRY_DELAY)
        finally:
            self.log.closed.set()
            self.log.ready.set()  # wake a waiter: ``closed`` says the proxy ended

    def _follow_once(self) -> bool:
        """One follow; ``True`` if the server ended it (the container may have stopped)."""
        since = f"{self._last[0]}Z" if self._last is not None else None
        try:
            for line in self.api.log_lines(
                self.pod,
                self.container,
                since_time=since,
                timeout=FOLLOW_TIMEOUT,
                read_timeout=READ_TIMEOUT,
                max_line=MAX_LINE + 64,
            ):
                if self._stop.is_set():
                    return True
                parsed = split_timestamp(line)
                if parsed is None:
                    self.log.invalid += 1
                    continue
                stamp, text = parsed
                if self._last is not None and stamp <= self._last:
                    continue  # seen before this reconnect
                self._last = stamp
                self.log.feed_line(text)
        except AgentNestError as exc:
            # A silent stream (read timeout), a refused line or a lost
            # apiserver: reconnect from the last line taken.
            self.last_error = str(exc)[:300]
            return False
        return True

    def _finished(self) -> bool:
        """Whether the proxy container is gone for good (the follow will not resume)."""
        from .api import pod_running

        with contextlib.suppress(AgentNestError):
            pod = self.api.get("Pod", self.pod)
            return pod is None or not pod_running(pod)
        self._stop.wait(RETRY_DELAY)  # stop() ends the wait at once
        return False
