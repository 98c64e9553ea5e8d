"""Docker backend (runc, runsc, kata-runtime)."""

from .backend import DockerBackend
from .engine import map_docker_errors
from .images import base_image, build_base_image
from .spec import DockerSpec

__all__ = ["DockerBackend", "DockerSpec", "base_image", "build_base_image", "map_docker_errors"]
