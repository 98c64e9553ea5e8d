"""Every request of the Docker engine client fails in AgentNest's tree, in bounded time.

Against unix sockets made here: one that does not exist (a stopped engine) and one
that accepts and never answers (a wedged engine, or a socket file replaced).
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentnest.errors import ConfigurationError, RuntimeNotAvailableError
from agentnest.runtime.docker.engine import engine_client
from agentnest.runtime.docker.spec import DEFAULT_API_TIMEOUT, DockerSpec

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[str]:
    """A unix socket that accepts every connection and never sends a byte."""
    path = str(tmp_path / "silent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"unix://{path}"
    finally:
        stop.set()
        thread.join(5)
        server.close()
        for conn in held:
            conn.close()


def test_an_engine_that_never_answers_fails_after_the_timeout(silent: str) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeNotAvailableError, match=r"did not answer GET /version within 0.5s"):
        engine_client(0.5, base_url=silent, version="auto")
    assert time.monotonic() - started < 5


def test_a_call_on_a_client_whose_engine_went_silent_fails_after_the_timeout(silent: str) -> None:
    api = engine_client(0.5, base_url=silent, version="1.41")  # no request at construction
    started = time.monotonic()
    with pytest.raises(
        RuntimeNotAvailableError, match=r"containers/c1/json within 0.5s.*AGENTNEST_DOCKER_TIMEOUT"
    ):
        api.inspect_container("c1")
    assert time.monotonic() - started < 5
    api.close()


# docker-py's unix connection does not close the socket of a connect() that failed; the
# garbage collector does (collected here, so the warning is this test's, and ignored).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_stopped_engine_is_not_reachable(tmp_path: Path) -> None:
    api = engine_client(5, base_url=f"unix://{tmp_path / 'gone.sock'}", version="1.41")
    with pytest.raises(RuntimeNotAvailableError, match=r"not reachable.*make engine"):
        api.ping()
    api.close()
    gc.collect()


def test_the_timeout_comes_from_the_spec_the_environment_or_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENTNEST_DOCKER_TIMEOUT", raising=False)
    assert DockerSpec().engine_timeout() == DEFAULT_API_TIMEOUT
    monkeypatch.setenv("AGENTNEST_DOCKER_TIMEOUT", "7.5")
    assert DockerSpec().engine_timeout() == 7.5
    assert DockerSpec(api_timeout=3).engine_timeout() == 3.0
    monkeypatch.setenv("AGENTNEST_DOCKER_TIMEOUT", "soon")
    with pytest.raises(ConfigurationError, match="AGENTNEST_DOCKER_TIMEOUT='soon'"):
        DockerSpec().engine_timeout()
    with pytest.raises(ConfigurationError, match="api_timeout must be seconds"):
        DockerSpec(api_timeout=0)
