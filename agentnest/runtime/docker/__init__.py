"""Docker backend (runc, runsc, kata-runtime)."""

from .backend import DockerBackend, DockerSpec, map_docker_errors
from .images import base_image, build_base_image

__all__ = ["DockerBackend", "DockerSpec", "base_image", "build_base_image", "map_docker_errors"]
