"""Shared test set-up: engine gating and sandbox fixtures.

Tests marked ``docker`` or ``gvisor`` need the real engine.  Under
``make test`` (AGENTNEST_REQUIRE_ENGINE=1) a missing engine is an error, not
a skip, so CI cannot pass without running them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import lru_cache

import pytest

REQUIRE_ENGINE = os.environ.get("AGENTNEST_REQUIRE_ENGINE") == "1"


@lru_cache(maxsize=1)
def engine_state() -> tuple[bool, set[str], str]:
    """(reachable, runtimes, reason)."""
    import socket

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        # Looked at first: docker-py leaks the socket of a refused connection while it
        # negotiates the API version, and that ResourceWarning then fails some other test.
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(10)
            try:
                probe.connect(host.removeprefix("unix://"))
            except OSError as exc:
                return False, set(), f"Docker engine not reachable: {exc}"
    try:
        import docker

        client = docker.from_env(timeout=10)
    except Exception as exc:  # any failure means "no engine" here
        return False, set(), f"Docker engine not reachable: {exc}"
    try:
        info = client.info()
    except Exception as exc:
        return False, set(), f"Docker engine not reachable: {exc}"
    finally:
        client.close()  # a refused connection's socket too (else a ResourceWarning lands in some test)
    return True, set(info.get("Runtimes") or {}), ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ok, runtimes, reason = engine_state()
    for item in items:
        wants_docker = item.get_closest_marker("docker") or item.get_closest_marker("gvisor")
        if not wants_docker:
            continue
        missing = None
        if not ok:
            missing = reason
        elif item.get_closest_marker("gvisor") and "runsc" not in runtimes:
            missing = "the runsc runtime is not registered with Docker"
        if missing:
            if REQUIRE_ENGINE:
                item.add_marker(pytest.mark.xfail(reason=missing, strict=True, run=False))
                raise pytest.UsageError(f"{item.nodeid}: {missing} (AGENTNEST_REQUIRE_ENGINE=1)")
            item.add_marker(pytest.mark.skip(reason=missing))


BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker, id="runc"),
    pytest.param("gvisor", marks=pytest.mark.gvisor, id="runsc"),
]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """Each engine-backed test runs on runc and on runsc."""
    return str(request.param)


@pytest.fixture
def sandbox(backend_name: str) -> Iterator[object]:
    from agentnest import Sandbox

    with Sandbox(backend=backend_name, timeout=120) as sb:
        yield sb


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A docker-py client for looking at what the engine holds (tests only)."""
    import docker

    client = docker.from_env(timeout=60)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[object]:
    """A private PostgreSQL server for the whole run (its own port and data directory).

    Missing binaries skip the test, except under ``make test`` (AGENTNEST_REQUIRE_ENGINE=1),
    which installs them first (scripts/setup-postgres.sh): there it is an error.
    """
    from doubles.postgres import postgres_server as start

    try:
        with start() as server:
            yield server
    except LookupError as exc:
        if REQUIRE_ENGINE:
            pytest.fail(f"{exc} (AGENTNEST_REQUIRE_ENGINE=1)")
        pytest.skip(str(exc))


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """A fresh, empty database: a SQLite file, or a new database on the private PostgreSQL server."""
    import uuid
    from pathlib import Path

    if request.param == "sqlite":
        return f"sqlite:///{Path(str(tmp_path)) / 'manager.db'}"
    server = request.getfixturevalue("postgres_server")
    return str(server.create_database(f"t{uuid.uuid4().hex[:12]}"))


@pytest.fixture
def db(database_url: str) -> Iterator[object]:
    """The manager's database (``agentnest.server.db.Database``) on ``database_url``, migrated."""
    from agentnest.server.db import Database

    database = Database(database_url)
    database.upgrade()
    try:
        yield database
    finally:
        database.close()
