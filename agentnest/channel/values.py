"""The types :mod:`.protocol` produces: typed values of the agent's frames, and an error.

Plain frozen records and an exception class: they hold no check (every field
was checked by the function in ``protocol.py`` that built it, and the error is
raised there), so they stand apart from the checks a reviewer reads.
``protocol`` re-exports each of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ChannelError

__all__ = [
    "Hello",
    "RawDisplay",
    "RawExit",
    "RawSessionRun",
    "RawValue",
    "SessionBusy",
    "SessionInfo",
]


class SessionBusy(ChannelError):
    """The agent refused a run: the session runs other code (sent on an earlier channel)."""


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    agent: str
    pid: int
    uid: int
    python: str
    capabilities: frozenset[str]


@dataclass(frozen=True, slots=True)
class RawExit:
    """How a command ended, as the agent reported it (checked)."""

    code: int
    signal: int | None
    timed_out: bool
    truncated: bool
    cancelled: bool
    duration: float
    spawn_error: bool = False


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A Python session the agent started, attached to or listed (checked)."""

    session: int
    pid: int
    python: str
    name: str | None = None
    """Its name; None for an anonymous session."""
    key: str = ""
    """The id the host gave it, as the agent keeps it ("" if the reply had none)."""
    started: float = 0.0
    """When its interpreter started: Unix time by the sandbox's clock (0.0: not said)."""
    busy: bool = False
    """It runs code or is still starting."""
    attached: bool = False
    """The interpreter already existed: a ``session.open`` by name attached to it."""


@dataclass(frozen=True, slots=True)
class RawSessionRun:
    """How a session run ended, as the agent reported it (checked)."""

    timed_out: bool
    interrupted: bool
    truncated: bool
    duration: float
    lost: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RawDisplay:
    """One complete display item of a session run."""

    mime: str
    data: bytes
    main: bool = False
    """The trailing expression's rich form (not a ``display()`` call)."""


@dataclass(frozen=True, slots=True)
class RawValue:
    """A session run's ``result`` (repr of the trailing expression) or ``error`` (traceback)."""

    name: str
    text: str
