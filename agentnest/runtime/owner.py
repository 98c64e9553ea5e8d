"""Which host process owns a sandbox: ``host:pid``, for reaping what a crashed process left.

Every backend records it with the sandbox (a Docker label, a Pod annotation);
``agentnest prune --orphans`` asks :func:`owner_alive` about it.
"""

from __future__ import annotations

import os
import socket

__all__ = ["owner", "owner_alive"]


def owner() -> str:
    """``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(value: str) -> bool | None:
    """Whether the owning process still runs; None if it is on another host (or unreadable)."""
    hostname, _, pid = value.rpartition(":")
    if hostname != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
