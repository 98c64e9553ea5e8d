"""The egress proxy as a program: its config, its startup, its lifetime.

:mod:`.proxy` decides every connection; this module only starts it.  It
parses the JSON config into :class:`.rules.Rules` (which checks the
allowlist) and :class:`.proxy.Limits`, listens, prints ``proxy.ready`` and
keeps the proxy's deadline: the program ends with its sandbox, and a moved
deadline (``Sandbox.extend()``) is read from a root-owned file.  Nothing here
admits or refuses a connection, which is why it stands apart from the proxy.

Stdlib only and Python 3.8 compatible, shipped with the proxy as the last
module of its bundle and its entry point (:data:`agentnest.runtime.egresslog.PROXY_MODULES`).

Run as a program (the backends run it from the shipped bundle instead, with
:func:`agentnest.runtime.egresslog.proxy_command`)::

    python3 -m agentnest.egress.serve '{"listen": ["198.18.0.2", 3128], "domains": ["*.example.com"], ...}'

It prints ``{"type": "proxy.ready", ...}`` once it listens and exits at
``deadline`` (epoch seconds), if given.
"""

# The proxy runs on the image's Python (>= 3.8): keep typing.Dict & co and %-formatting.
# ruff: noqa: UP006, UP031, UP035, UP045

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from .proxy import Limits, Proxy, print_event
from .rules import EVENT_READY, Rules

__all__ = ["limits_from_config", "main", "read_deadline"]


def limits_from_config(config: Dict[str, Any]) -> Limits:
    """The config's ``limits`` over the defaults: known names, positive numbers only.

    Raises:
        ValueError: an unknown name, or a value that is not a positive number.
    """
    limits = Limits()
    for key, value in (config.get("limits") or {}).items():
        if not hasattr(limits, key) or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("unknown or invalid limit %r=%r" % (key, value))
        if value <= 0:
            raise ValueError("limit %r must be positive" % (key,))
        setattr(limits, key, type(getattr(limits, key))(value))
    return limits


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
        sys.stderr.write("usage: serve.py CONFIG_JSON\n")
        return 2
    config = json.loads(args[0])
    rules = Rules.from_config(config)
    limits = limits_from_config(config)
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
        timer: List[asyncio.TimerHandle] = []

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
        print_event({"type": EVENT_READY, "listen": [host, port], "time": round(time.time(), 6)})
        await stop
        await proxy.close()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
