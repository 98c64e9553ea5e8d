"""Run the real agent as a plain, unsandboxed child process (tests only).

This exercises the agent, the bootstrap and the channel for real without a
container engine.  It isolates nothing: never point it at untrusted code.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from ..channel.streams import SocketStream
from ..runtime import bootstrap


class LocalAgent:
    """An agent child process connected over a socketpair."""

    def __init__(
        self, workspace: str, python: str = sys.executable, env: dict[str, str] | None = None
    ) -> None:
        host, child = socket.socketpair()
        full_env = dict(os.environ if env is None else env)
        full_env["AGENTNEST_WORKSPACE"] = workspace
        self.proc = subprocess.Popen(
            bootstrap.command("agent", python=python),
            stdin=child.fileno(),
            stdout=child.fileno(),
            stderr=None if os.environ.get("AGENTNEST_DEBUG_AGENT") else subprocess.DEVNULL,
            cwd=workspace,
            env=full_env,
            close_fds=True,
        )
        child.close()
        self.stream = SocketStream(host)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stream.close()
