"""The backend contract suite against Docker with runc and with runsc."""

from __future__ import annotations

import pytest

from agentnest.runtime.base import RuntimeBackend
from agentnest.runtime.docker import DockerBackend, DockerSpec, base_image
from agentnest.testing.contract import BackendContract


@pytest.mark.docker
class TestDockerRunc(BackendContract):
    @pytest.fixture
    def backend(self) -> RuntimeBackend:
        return DockerBackend(DockerSpec(oci_runtime="runc"))

    @pytest.fixture
    def image(self) -> str:
        return base_image()


@pytest.mark.gvisor
class TestDockerRunsc(BackendContract):
    @pytest.fixture
    def backend(self) -> RuntimeBackend:
        return DockerBackend(DockerSpec(oci_runtime="runsc"), name="gvisor")

    @pytest.fixture
    def image(self) -> str:
        return base_image()
