"""Backend names, built-in and from the ``agentnest.backends`` entry points."""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from .. import templates
from ..errors import ConfigurationError
from .base import RuntimeBackend

ENTRY_POINT_GROUP = "agentnest.backends"

BackendFactory = Callable[[], RuntimeBackend]


def _docker() -> RuntimeBackend:
    from .docker import DockerBackend

    return DockerBackend()


def _gvisor() -> RuntimeBackend:
    from .docker import DockerBackend, DockerSpec

    return DockerBackend(DockerSpec(oci_runtime="runsc"), name="gvisor")


def _kata() -> RuntimeBackend:
    from .docker import DockerBackend, DockerSpec

    return DockerBackend(DockerSpec(oci_runtime="kata-runtime"), name="kata")


def _remote() -> RuntimeBackend:
    from .remote import RemoteBackend

    return RemoteBackend()  # $AGENTNEST_REMOTE_URL, $AGENTNEST_REMOTE_TOKEN, $AGENTNEST_REMOTE_BACKEND


def _kubernetes() -> RuntimeBackend:
    # Reads $KUBECONFIG (or ~/.kube/config, or the in-cluster config) on first use.
    from .kubernetes.backend import KubernetesBackend

    return KubernetesBackend()


BUILTIN: dict[str, BackendFactory] = {
    "docker": _docker,
    "gvisor": _gvisor,
    "kata": _kata,
    "kubernetes": _kubernetes,
    "remote": _remote,
}
"""Built-in backends: Docker with runc, runsc (gVisor) or kata-runtime; Kubernetes; a server."""


def docker_api() -> Any:
    """The docker-py ``APIClient`` of the shared ``docker`` backend."""
    from .docker import DockerBackend

    backend = get_backend("docker")
    if not isinstance(backend, DockerBackend):  # pragma: no cover - "docker" is built in
        raise ConfigurationError("the docker backend is not a Docker engine backend")
    return backend.api


def _template_engine() -> templates.TemplateEngine:
    from .docker.builder import DockerTemplateEngine

    return DockerTemplateEngine(docker_api)


# Templates are built by the docker backend's builder; templates.py (below runtime/) is told so here.
templates.use_engine(_template_engine)

_shared: dict[str, RuntimeBackend] = {}
_lock = threading.Lock()


def _plugins() -> dict[str, BackendFactory]:
    found: dict[str, BackendFactory] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.load
    return found


def available_backends() -> list[str]:
    """Every backend name this installation knows."""
    return sorted(set(BUILTIN) | set(_plugins()))


def get_backend(name: str) -> RuntimeBackend:
    """The shared backend instance for ``name`` (one engine client per name)."""
    if not isinstance(name, str):
        raise ConfigurationError(f"backend must be a name or a RuntimeBackend, not {type(name).__name__}")
    with _lock:
        backend = _shared.get(name)
        if backend is not None:
            return backend
        factory = BUILTIN.get(name)
        if factory is None:
            plugin = _plugins().get(name)
            if plugin is None:
                raise ConfigurationError(
                    f"unknown backend {name!r}; available: {', '.join(available_backends())}"
                )
            loaded = plugin()
            if not callable(loaded):
                raise ConfigurationError(f"entry point {name!r} is not a backend factory")
            factory = loaded
        backend = factory()
        if not isinstance(backend, RuntimeBackend):
            raise ConfigurationError(f"backend {name!r} did not produce a RuntimeBackend")
        _shared[name] = backend
        return backend
