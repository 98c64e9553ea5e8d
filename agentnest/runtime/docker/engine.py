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

__all__ = ["Background", "explain", "map_docker_errors", "missing_image_hint", "raw_socket"]


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
            f"{what}: the Docker engine is not reachable ({str(exc)[:200]}); "
            "start it (`make engine`, or `sudo systemctl start docker`) or set DOCKER_HOST"
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
