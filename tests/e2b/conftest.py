"""The E2B acceptance suite's set-up: ``agentnest serve`` on loopback, the stock SDKs in venvs.

Each test module gets its own server (runc, in a thread) with two tokens (``alice``, the
SDK's key, and ``bob``, another tenant).  The SDK sets come from
:data:`.sdks.MATRIX` (tests/e2b/sdks.py: one venv each, built once and cached), or from
``AGENTNEST_E2B_MATRIX``: ``latest`` for whatever PyPI serves today (``make e2b-latest``),
or a comma-separated list of the matrix's names.  A scenario of ``sdk_driver.py`` runs in
the SDK's venv as a child process pointed at the server by ``E2B_API_URL``,
``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` only; what it observed comes back as
:class:`Observed`, and the tests assert on that.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

DRIVER = Path(__file__).resolve().with_name("sdk_driver.py")
#: The server's upload limit in these tests (small, so the over-limit upload is quick).
UPLOAD_LIMIT = 2 * 1024 * 1024
#: Seconds one driver process may take (its checks are cut at 60 s each inside).
DRIVER_TIMEOUT = 240.0


def matrix() -> dict[str, tuple[str, ...]]:
    """The SDK sets to run: the pinned matrix, or what ``AGENTNEST_E2B_MATRIX`` names."""
    from .sdks import MATRIX, latest_matrix

    chosen = os.environ.get("AGENTNEST_E2B_MATRIX", "").strip()
    if not chosen:
        return dict(MATRIX)
    if chosen == "latest":
        return latest_matrix()
    names = [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in names if n not in MATRIX]
    if unknown:
        raise pytest.UsageError(f"AGENTNEST_E2B_MATRIX: unknown SDK sets {unknown}; known: {sorted(MATRIX)}")
    return {n: MATRIX[n] for n in names}


def _dist(requirement: str) -> str:
    return requirement.split("=")[0].split("<")[0].split(">")[0].strip().lower()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every SDK set for each module; a module's ``NEEDS`` (distributions) narrows them."""
    if "sdk" in metafunc.fixturenames:
        needs = set(getattr(metafunc.module, "NEEDS", ()))
        names = [n for n, reqs in matrix().items() if needs <= {_dist(r) for r in reqs}]
        metafunc.parametrize("sdk", names, indirect=True, scope="module")


def skip_unsupported() -> None:
    """Skip (with the reason printed by ``-ra``) where the SDK cannot run: Python < 3.11."""
    from .sdks import unsupported_reason

    reason = unsupported_reason()
    if reason:
        pytest.skip(reason)


@dataclass
class Server:
    url: str
    alice: str
    bob: str
    events: Any

    @property
    def key(self) -> str:
        from agentnest.server.e2b import e2b_key

        return str(e2b_key(self.alice))

    @property
    def other_key(self) -> str:
        from agentnest.server.e2b import e2b_key

        return str(e2b_key(self.bob))


@pytest.fixture(scope="module")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``agentnest serve`` with its E2B face, on loopback, runc; two tenants."""
    skip_unsupported()
    with serve(tmp_path_factory.mktemp("e2b-serve")) as server:
        yield server


@contextlib.contextmanager
def serve(root: Path, **overrides: Any) -> Iterator[Server]:
    """The server of :func:`e2b_server`; ``overrides`` go to ``ServerSettings`` as well."""
    from agentnest import MemoryObserver
    from agentnest.runtime.docker import base_image
    from agentnest.server.app import create_app
    from agentnest.server.auth import Ceiling, TokenStore
    from agentnest.server.settings import ServerSettings
    from agentnest.server.thread import serve_in_thread

    store = TokenStore(root / "tokens.json")
    _, alice = store.create("alice", Ceiling(max_sandboxes=8, max_timeout=600.0))
    _, bob = store.create("bob", Ceiling(max_sandboxes=2, max_timeout=600.0))
    events = MemoryObserver()
    options: dict[str, Any] = {
        "backends": {"docker": "docker"},
        "image": base_image(),
        "observers": (events,),
        "max_upload_bytes": UPLOAD_LIMIT,
    }
    settings = ServerSettings(tokens=store, **{**options, **overrides})
    with serve_in_thread(create_app(settings)) as url:
        yield Server(url, alice, bob, events)


@dataclass
class Observed:
    """What one driver run reported: each check's value or the SDK exception it raised."""

    scenario: str
    sdk: str
    args: dict[str, Any] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    done: bool = False
    returncode: int | None = None
    stderr: str = field(default="", repr=False)
    timed_out: bool = False

    def _trouble(self) -> str:
        errors = [
            f"  {k}: {r['error']['type']}: {r['error']['message'][:300]}"
            for k, r in self.records.items()
            if "error" in r
        ]
        how = "timed out" if self.timed_out else f"exited {self.returncode}" if not self.done else "finished"
        tail = self.stderr.strip()[-2500:]
        return (
            f"[{self.sdk}] scenario {self.scenario!r} {how}"
            + ("; errors so far:\n" + "\n".join(errors) if errors else "")
            + (f"\n--- driver stderr (end) ---\n{tail}" if tail else "")
        )

    def record(self, key: str) -> dict[str, Any]:
        if key not in self.records:
            pytest.fail(f"no check {key!r} was reported: {self._trouble()}", pytrace=False)
        return self.records[key]

    def value(self, key: str) -> Any:
        """The check's value; fails with the SDK's exception if it raised."""
        got = self.record(key)
        if "error" in got:
            err = got["error"]
            pytest.fail(
                f"[{self.sdk}] {key}: the SDK raised {err['module']}.{err['type']}: {err['message']}"
                + (f"\n{err['traceback']}" if err.get("traceback") else ""),
                pytrace=False,
            )
        return got["value"]

    def error(self, key: str, *types: str) -> dict[str, Any]:
        """The exception the check raised; fails if it returned, or raised none of ``types``."""
        got = self.record(key)
        if "error" not in got:
            pytest.fail(
                f"[{self.sdk}] {key}: expected the SDK to raise {' or '.join(types)}, "
                f"it returned {json.dumps(got['value'])[:1000]}",
                pytrace=False,
            )
        err: dict[str, Any] = got["error"]
        if types and not set(types) & set(err["mro"]):
            pytest.fail(
                f"[{self.sdk}] {key}: expected {' or '.join(types)}, the SDK raised "
                f"{err['module']}.{err['type']} (mro {err['mro']}): {err['message']}",
                pytrace=False,
            )
        return err


@dataclass
class SDK:
    """One SDK set in its venv, pointed at one server."""

    name: str
    python: Path
    installed: Mapping[str, str]
    server: Server

    def has(self, distribution: str) -> bool:
        return distribution in self.installed

    def env(self, key: str | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("E2B_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
        }
        env.update(
            E2B_API_URL=self.server.url,
            E2B_SANDBOX_URL=self.server.url,
            E2B_API_KEY=key if key is not None else self.server.key,
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
            PYTHONUNBUFFERED="1",
        )
        return env

    def run(
        self, scenario: str, *, key: str | None = None, timeout: float = DRIVER_TIMEOUT, **args: Any
    ) -> Observed:
        """Run one scenario of the driver in the SDK's venv; what it observed."""
        observed = Observed(scenario, self.name, args)
        try:
            proc = subprocess.run(
                [str(self.python), str(DRIVER), scenario],
                input=json.dumps(args),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.env(key),
                cwd=str(DRIVER.parent),
                check=False,
            )
            stdout, stderr, observed.returncode = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            observed.timed_out = True
            stdout, stderr = _text(exc.stdout), _text(exc.stderr)
        observed.stderr = stderr
        for line in stdout.splitlines():
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("done"):
                observed.done = True
            elif "key" in record:
                observed.records[record["key"]] = record
        return observed


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


@pytest.fixture(scope="module")
def sdk(request: pytest.FixtureRequest, e2b_server: Server) -> SDK:
    """One SDK set (the module's parameter), its venv built on first use."""
    from agentnest.errors import MissingDependencyError

    from .sdks import prune, sdk_venv, stamp

    skip_unsupported()
    name = str(request.param)
    requirements = matrix()[name]
    if name.startswith("latest-"):
        prune(keep=[name])  # yesterday's canary
    try:
        python = sdk_venv(name, requirements)
    except MissingDependencyError as exc:
        pytest.fail(f"the SDK set {name} could not be installed: {exc}", pytrace=False)
    installed = stamp(python.parent.parent).get("installed")
    versions = {str(k): str(v) for k, v in installed.items()} if isinstance(installed, dict) else {}
    print(f"\nE2B SDK set {name}: {versions} ({sys.version.split()[0]})", flush=True)
    return SDK(name, python, versions, e2b_server)


@pytest.fixture(scope="module")
def shared_sandbox(sdk: SDK) -> Iterator[str]:
    """A code-interpreter sandbox made through the SDK, reused by the module's scenarios."""
    created = sdk.run("create", metadata={"role": "shared", "run": uuid.uuid4().hex[:8]})
    sandbox_id = str(created.value("create")["sandbox_id"])
    yield sandbox_id
    sdk.run("kill", sandbox_id=sandbox_id, timeout=60)
