"""Ship the agent into a sandbox over its own stdin.

A backend starts ``python3 -S -c BOOTSTRAP MODE [SECONDS]`` inside the
sandbox with stdin/stdout connected to the host, then writes
:func:`bundle` to it.  The bootstrap loads the agent's modules from that
bundle straight into memory: nothing is written to the sandbox's
filesystem, so a read-only root and a remote engine both work, and the
sandbox cannot plant a modified agent for the next start.

Modes:

``keeper SECONDS``
    Used as the container's main process.  It forks the agent (which keeps
    stdin/stdout), then becomes ``sleep SECONDS``: the sandbox's lifetime.
    When the deadline passes the keeper exits, the init process exits, and
    the engine stops the container, whether or not the host is still alive.
    A killed agent does not end the container; the backend starts a new one
    with ``agent`` mode.
``agent``
    Just the agent (restarts, and backends that keep the lifetime elsewhere).
"""

from __future__ import annotations

import json
import zlib
from functools import lru_cache
from importlib import resources

#: Load order matters: a module's relative imports must already be loaded.
AGENT_MODULES = ("wire", "files", "exec", "loop")
PACKAGE = "agentnest_agent"

BOOTSTRAP = r"""
import os, sys
def load():
    import json, types, zlib
    b = sys.stdin.buffer
    n = int(b.readline())
    mods = json.loads(zlib.decompress(b.read(n)))
    pkg = types.ModuleType("%(pkg)s"); pkg.__path__ = []; pkg.__package__ = "%(pkg)s"
    sys.modules["%(pkg)s"] = pkg
    for name, src in mods:
        m = types.ModuleType("%(pkg)s." + name); m.__package__ = "%(pkg)s"
        m.__file__ = "<agentnest-agent/" + name + ".py>"
        sys.modules[m.__name__] = m; setattr(pkg, name, m)
        exec(compile(src, m.__file__, "exec"), m.__dict__)
    return sys.modules["%(pkg)s.loop"]
if sys.argv[1] == "keeper":
    pid = os.fork()
    if pid == 0:
        if os.fork():
            os._exit(0)
        load().main()
        os._exit(0)
    os.waitpid(pid, 0)
    # Let go of the host's stream: its end-of-file belongs to the agent.
    fd = os.open("/dev/null", os.O_RDWR); os.dup2(fd, 0); os.dup2(fd, 1)
    try:
        os.execvp("sleep", ["sleep", sys.argv[2]])
    except OSError:
        import time; time.sleep(float(sys.argv[2]))
else:
    load().main()
""".replace("%(pkg)s", PACKAGE)


@lru_cache(maxsize=1)
def bundle() -> bytes:
    """The agent's sources, compressed and length-prefixed, ready to send."""
    pkg = resources.files("agentnest.agent")
    mods = [(name, (pkg / f"{name}.py").read_text("utf-8")) for name in AGENT_MODULES]
    blob = zlib.compress(json.dumps(mods).encode("utf-8"), 6)
    return b"%d\n" % len(blob) + blob


def command(mode: str, python: str = "python3", lifetime: float | None = None) -> list[str]:
    """The argv that starts the bootstrap in ``mode``."""
    argv = [python, "-S", "-c", BOOTSTRAP, mode]
    if mode == "keeper":
        if lifetime is None:
            raise ValueError("keeper mode needs a lifetime")
        argv.append(f"{max(1.0, lifetime):.3f}")
    return argv
