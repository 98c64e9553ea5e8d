"""A private PostgreSQL server for tests and benchmarks: its own data directory, a free
loopback port, trust authentication, stopped and deleted at the end.

Needs Debian's server binaries (``scripts/setup-postgres.sh`` installs them).
PostgreSQL refuses to run as root, so under root the server runs as the
``postgres`` user in a directory it owns.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


def binaries() -> Path | None:
    """The newest installed PostgreSQL ``bin`` directory, or ``None``."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4] or 0))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One private server; :meth:`start`, :meth:`stop` (and start again), :meth:`destroy`."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="agentnest-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._user: str | None = None
        if os.geteuid() == 0:
            # The server will not run as root: hand it a directory the postgres user owns.
            self._user = "postgres"
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        os.chmod(self.root, 0o700)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "agentnest", "--no-sync", "-E", "UTF8")

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://agentnest@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            # fsync off: only an OS crash could lose data, and tests never outlive one.  Commits
            # stay synchronous, so a stop (-m immediate, as when the server dies) loses none.
            "-c fsync=off"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", "start")

    def stop(self) -> None:
        """Stop at once (``-m immediate``: connections cut, as when the server dies)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A started private server, destroyed on exit; raises ``LookupError`` without the binaries."""
    bindir = binaries()
    if bindir is None:
        raise LookupError("PostgreSQL is not installed (scripts/setup-postgres.sh installs it)")
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.destroy()


__all__ = ["PostgresServer", "binaries", "postgres_server"]
