"""The argv and payloads that start AgentNest's programs inside a sandbox.

Plumbing around :mod:`.bootstrap`, which keeps the PID-1 keeper and its
deadline: this module enforces nothing, it packs sources and builds command
lines.  The agent's bundle (:func:`bundle`) goes to the bootstrap's stdin (or,
in a pod, into the keeper's argv: :func:`listen_command`);
standalone scripts of ``agent/`` (:func:`script_command`, :func:`bridge_command`)
and packaged programs such as the egress proxy (:func:`program_command`) carry
their sources in their argv.  Nothing is written to a sandbox's filesystem, so
its root stays read-only and nothing in the image can replace what runs.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import zlib
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .bootstrap import command
from .unpack import AGENT_MODULES, UNPACK


def pack(package: str, modules: Sequence[str]) -> bytes:
    """A bundle: ``agentnest/<package>/<name>.py`` of each of ``modules`` (in load order), compressed.

    What :data:`.unpack.UNPACK` loads.  A module's relative imports must come
    earlier in ``modules``; the package imports nothing outside itself.
    """
    pkg = resources.files(f"agentnest.{package}")
    mods = [(name, (pkg / f"{name}.py").read_text("utf-8")) for name in modules]
    return zlib.compress(json.dumps(mods).encode("utf-8"), 6)


#: ``python -S -c RUN PKG MODULE BUNDLE ARGS...``: unpack the base64 bundle
#: as package PKG, then ``sys.exit(PKG.MODULE.main(ARGS))``.
RUN = UNPACK + (
    "import base64\n"
    "pkg = unpack(sys.argv[1], base64.b64decode(sys.argv[3]))[0]\n"
    "sys.exit(getattr(pkg, sys.argv[2]).main(sys.argv[4:]))\n"
)


def program_command(python: str, package: str, blob: str, module: str, *args: str) -> list[str]:
    """The argv that runs ``main(args)`` of ``agentnest/<package>/<module>.py`` from a bundle.

    ``blob`` is :func:`pack`'s bundle of the package, base64-encoded: it
    travels in the argv, so nothing is written to the container's filesystem
    (its root stays read-only) and nothing in the image can replace it.  The
    package is loaded as ``agentnest_<package>``.
    """
    return [python, "-S", "-c", RUN, f"agentnest_{package}", module, blob, *args]


@lru_cache(maxsize=1)
def bundle() -> bytes:
    """The agent's sources, compressed and length-prefixed, ready to send."""
    blob = pack("agent", AGENT_MODULES)
    return b"%d\n" % len(blob) + blob


def listen_command(python: str, lifetime: float, socket_path: str) -> list[str]:
    """The argv of a pod's main process: the keeper, with the agent listening on ``socket_path``.

    The agent's sources travel in the argv (base64, ~40 KiB: well under the
    kernel's 128 KiB per argument), since nothing may be attached to the
    pod's stdin (see :func:`agentnest.agent.loop.listen`).  The keeper and
    its lifetime are :func:`.bootstrap.command`'s.
    """
    sources = base64.b64encode(bundle().split(b"\n", 1)[1]).decode("ascii")
    return command("listen", python, lifetime, socket_path, sources)


def script_command(python: str, script: str, *args: str) -> list[str]:
    """The argv that runs the standalone ``agentnest/agent/<script>.py`` in a sandbox.

    Its source travels in the argv (``-I -S``: no environment, no site
    packages), so nothing is installed in the image and nothing it holds can
    replace the script.
    """
    source = (resources.files("agentnest.agent") / f"{script}.py").read_text("utf-8")
    return [python, "-I", "-S", "-c", source, *args]


def bridge_command(python: str, socket_path: str, wait: float = 0.0) -> list[str]:
    """The argv of one host connection to a pod's agent: ``agent/bridge.py`` relaying stdio to the socket.

    ``wait``: how long the bridge waits for the socket to appear (a new pod's
    agent is still starting).
    """
    source = (resources.files("agentnest.agent") / "bridge.py").read_text("utf-8")
    return [python, "-I", "-S", "-c", source, socket_path, f"{max(0.0, wait):.1f}"]


@lru_cache(maxsize=1)
def host_python() -> str | None:
    """An interpreter on this host that any user may run, or ``None``.

    The programs run as the sandbox's UID, which cannot run an interpreter
    in a private directory (a venv or pyenv under /root); -I -S need nothing
    of a venv, so the real interpreter, or the system's, does.
    """
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(os.path.realpath(candidate))
        try:
            if not path.is_file() or path.stat().st_mode & 0o005 != 0o005:
                continue
            if all(parent.stat().st_mode & 0o001 for parent in path.parents):
                return str(path)
        except OSError:
            continue
    return None
