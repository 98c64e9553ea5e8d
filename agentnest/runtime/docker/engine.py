"""The Docker engine as AgentNest's modules of this package use it: errors mapped into
AgentNest's tree, the raw socket under an attach stream, a background step.

A module of its own so that the backend, the egress topology, the template
builder and prune all import it at the top (no import of the backend from
below it).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

from ...errors import BackendError, ImageNotFoundError, RuntimeNotAvailableError

__all__ = ["Background", "engine_client", "explain", "map_docker_errors", "missing_image_hint", "raw_socket"]

_FIX = "start it (`make engine`, or `sudo systemctl start docker`) or set DOCKER_HOST"


def engine_client(timeout: float, **kwargs: Any) -> Any:
    """A docker-py ``APIClient`` whose every request fails in AgentNest's tree.

    docker-py lets ``requests`` errors through (a stopped engine is a
    ``ConnectionError``, one that accepts and never answers a ``ReadTimeout``
    after ``timeout`` seconds).  Mapped here, in ``send``, they cannot escape
    from any call of any module, wrapped in :func:`map_docker_errors` or not.
    """
    import docker
    import requests.exceptions
    from docker.constants import DEFAULT_DOCKER_API_VERSION

    class EngineClient(docker.APIClient):
        def send(self, request: Any, **kw: Any) -> Any:
            try:
                return super().send(request, **kw)
            except requests.exceptions.Timeout:
                raise RuntimeNotAvailableError(
                    f"the Docker engine did not answer {request.method} {_path(request.url)} within "
                    f"{timeout:g}s; check that dockerd is healthy (`docker info`), or raise "
                    "AGENTNEST_DOCKER_TIMEOUT / DockerSpec(api_timeout=) for a slow engine"
                ) from None
            except requests.exceptions.ConnectionError as exc:
                raise RuntimeNotAvailableError(
                    f"the Docker engine is not reachable ({str(exc)[:200]}); {_FIX}"
                ) from None

    version = kwargs.pop("version", None)
    auto = version is None or str(version).lower() == "auto"
    # The version is asked for here rather than in the constructor: a client
    # whose first request fails is closed, not left to the garbage collector
    # with a socket open.
    client = EngineClient(
        timeout=timeout,  # type: ignore[arg-type]
        version=DEFAULT_DOCKER_API_VERSION if auto else version,
        **kwargs,
    )
    if auto:
        try:
            found = client.version(api_version=False).get("ApiVersion")
        except BaseException:
            client.close()
            raise
        if not isinstance(found, str) or not found:
            client.close()
            raise RuntimeNotAvailableError(f"the Docker engine did not say its API version ({found!r:.40})")
        client._version = found  # type: ignore[attr-defined]
    return client


def _path(url: Any) -> str:
    text = str(url or "")
    start = text.find("/", text.find("//") + 2) if "//" in text else 0
    return text[max(start, 0) :].split("?", 1)[0][:120]


@contextlib.contextmanager
def map_docker_errors(what: str, image: str | None = None) -> Iterator[None]:
    """Turn docker-py and connection errors into AgentNest's tree."""
    import docker.errors
    import requests.exceptions

    try:
        yield
    except docker.errors.ImageNotFound:
        raise ImageNotFoundError(missing_image_hint(image or "?")) from None
    except docker.errors.NotFound as exc:
        raise BackendError(f"{what}: not found ({explain(exc)})") from None
    except docker.errors.APIError as exc:
        raise BackendError(f"{what}: the engine refused: {explain(exc)}") from None
    except (requests.exceptions.ConnectionError, docker.errors.DockerException) as exc:
        raise RuntimeNotAvailableError(
            f"{what}: the Docker engine is not reachable ({str(exc)[:200]}); {_FIX}"
        ) from None


def explain(exc: Any) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return str(text)[:500]


def missing_image_hint(image: str) -> str:
    from .images import BASE_REPOSITORY

    if image.startswith(BASE_REPOSITORY + ":"):
        return (
            f"image {image!r} is not built on this engine; build it offline with "
            "`agentnest image base` (or `make image`)"
        )
    return (
        f"image {image!r} is not on this engine and could not be pulled; pull or build it "
        "(`docker pull IMAGE`, `docker build`), or use the default image built by `agentnest image base`"
    )


def raw_socket(obj: Any) -> socket.socket:
    """The plain socket under docker-py's hijacked response wrapper."""
    sock = getattr(obj, "_sock", obj)
    if not isinstance(sock, socket.socket):
        raise BackendError(f"unexpected attach stream type {type(sock).__name__}")
    return sock


class Background:
    """Run ``fn`` in a thread now; ``result()`` joins it and re-raises its exception."""

    def __init__(self, fn: Any) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Any) -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
