"""The server's record of one live sandbox (:class:`Entry`) and what reaps it early (:class:`Lease`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from ..aio import AsyncPythonSession, AsyncSandbox
from . import schemas as s
from .admission import Grant


class Lease:
    """What reaps a sandbox before its deadline: nothing, idleness, or its client's connections closing.

    Times are ``time.monotonic()``: a wall-clock jump neither reaps nor spares a sandbox.
    """

    def __init__(self, kind: str = "deadline", idle_timeout: float | None = None) -> None:
        self.kind = kind
        self.idle_timeout = idle_timeout
        now = time.monotonic()
        self.last_used = now
        self.holders = 0
        self.unheld_since = now

    def touch(self) -> None:
        """The client used the sandbox (a call, a keepalive): an idle lease starts over."""
        self.last_used = time.monotonic()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A connection of the client (channel, stream) holds the sandbox while open."""
        self.holders += 1
        self.touch()
        try:
            yield
        finally:
            self.holders -= 1
            self.touch()
            if not self.holders:
                self.unheld_since = time.monotonic()

    def expires(self, grace: float) -> float | None:
        """When (monotonic) it lapses if nothing renews it; None: not by itself."""
        if self.kind == "idle" and self.idle_timeout is not None and not self.holders:
            return self.last_used + self.idle_timeout
        if self.kind == "session" and not self.holders:
            return self.unheld_since + grace
        return None

    def out(self, grace: float) -> s.LeaseOut:
        expires = self.expires(grace)
        return s.LeaseOut(
            kind=self.kind,  # type: ignore[arg-type]
            expires_at=None if expires is None else round(time.time() + (expires - time.monotonic()), 3),
            idle_timeout=self.idle_timeout,
            holders=self.holders,
        )


class Entry:
    """One live sandbox of one token."""

    def __init__(
        self,
        token_id: str,
        sandbox: AsyncSandbox,
        backend_name: str,
        grant: Grant,
        lease: Lease | None = None,
    ) -> None:
        self.token_id = token_id
        self.sandbox = sandbox
        self.backend_name = backend_name
        self.grant = grant
        self.lease = lease or Lease()
        self.created = time.time()
        self.sessions: dict[str, AsyncPythonSession] = {}
        self.channels = 0
        self.gone = asyncio.Event()
        """Set when the server destroys it (ends the streams that hold it)."""
        self.until: float | None = None
        """A claimed warm sandbox's deadline as its client asked (the server reaps it then; its
        engine deadline, set when it was started warm, may be later and stays the backstop)."""
        self.claimed_at = time.time()

    @property
    def deadline(self) -> float:
        if self.until is None:
            return self.sandbox.deadline
        return min(self.until, self.sandbox.deadline)


__all__ = ["Entry", "Lease"]
