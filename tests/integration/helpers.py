"""Helpers for the integration tests (engine look-ups, in-sandbox probes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentnest import Sandbox
from agentnest.runtime.storage import StoragePool
from agentnest.state import SPARES

SANDBOX_UID = 65532
OCI_RUNTIME = {"docker": "runc", "gvisor": "runsc"}

#: argv of every process in the sandbox, as JSON (coreutils ``ps``/``ls`` do
#: not work under this gVisor, so the probe reads /proc itself).
PROCESSES = r"""
import json, os
out = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                raw = f.read()
        except OSError:
            continue
        if raw:
            out.append([a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")])
print(json.dumps(out))
"""


def owner_label() -> str:
    """The ``agentnest.owner`` label of sandboxes created by this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def containers_of(client: Any, sandbox_id: str) -> list[Any]:
    """Every container (running or not) labelled with this sandbox id."""
    # ignore_removed: a container removed between the listing and its inspection
    # (a pool replacing one, a destroy in progress) is gone, not an error.
    return list(
        client.containers.list(
            all=True, ignore_removed=True, filters={"label": f"agentnest.sandbox={sandbox_id}"}
        )
    )


def container_of(client: Any, sb: Sandbox) -> Any:
    (found,) = containers_of(client, sb.id)
    return found


def owned_containers(client: Any) -> set[str]:
    """Ids of every container this test process created (other sessions may share the engine).

    Warm spares kept for the next fork (agentnest.state.spares) are not
    counted: they are no leak while the sandbox that forked lives, and
    tests that end it check that its spare went with it.
    """
    assert SPARES.wait_idle(60), "a warm spare was still being made after 60 s"
    spares = {h.info.get("container") for h in SPARES.handles()}
    found = client.containers.list(
        all=True, ignore_removed=True, filters={"label": f"agentnest.owner={owner_label()}"}
    )
    return {c.id for c in found if c.id not in spares}


def wait_until_stopped(client: Any, sandbox_id: str, within: float) -> float | None:
    """Poll until no container of the sandbox runs; return the seconds it took, or None."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        running = [c for c in containers_of(client, sandbox_id) if c.status == "running"]
        if not running:
            return time.monotonic() - start
        time.sleep(0.25)
    return None


def processes(sb: Sandbox) -> list[list[str]]:
    found: list[list[str]] = sb.exec_json(PROCESSES, timeout=30)
    return found


def xfail_on(request: pytest.FixtureRequest, backend_name: str, backend: str, reason: str) -> None:
    """Expect this test to fail (strictly) on one runtime: a known bug there."""
    if backend_name == backend:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


class Background:
    """Run a call in a thread and keep its outcome (never an unhandled thread error)."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._call = call
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._call()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True if the call has finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


REPO = Path(__file__).resolve().parents[2]


def spawn_host(code: str, *args: str) -> subprocess.Popen[str]:
    """Run ``code`` as a separate host process (this checkout on its path), its stdout piped.

    For crash tests: the test kills it and looks at what it left behind.
    """
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )


def need_storage_pool() -> StoragePool:
    """The storage pool of disk workspaces; a skip without one (a failure under ``make test``)."""
    from agentnest.runtime import storage

    pool = storage.find_pool()
    if pool is None:
        reason = f"no storage pool: {storage.probe().detail} (make it with `agentnest setup`)"
        if os.environ.get("AGENTNEST_REQUIRE_ENGINE") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return pool


#: Every path, kind, mode, owner and content digest in the workspace (a tree fingerprint).
TREE_LISTING = r"""
import hashlib, os, stat
for base, dirs, files in os.walk("."):
    dirs.sort()
    for name in sorted(dirs + files):
        p = os.path.join(base, name)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            print(p, "link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            print(p, "dir", oct(st.st_mode & 0o777))
        else:
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()[:16]
            print(p, "file", oct(st.st_mode & 0o777), st.st_uid, st.st_size, h)
"""


def listing(sb: Sandbox) -> str:
    """The workspace's tree fingerprint (:data:`TREE_LISTING`), as the sandbox sees it."""
    return sb.exec_python(TREE_LISTING, timeout=60).check().stdout
