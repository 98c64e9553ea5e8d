"""Fixtures shared by the integration tests.

``backend_name`` is overridden here with module scope (same parameters, ids
and markers as the top-level fixture) so that a module can share one sandbox
per runtime through :func:`shared_sandbox`; the top-level ``sandbox`` fixture
keeps giving each test a fresh one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentnest import Sandbox

BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker, id="runc"),
    pytest.param("gvisor", marks=pytest.mark.gvisor, id="runsc"),
]


@pytest.fixture(scope="module", params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """Each engine-backed test runs on runc and on runsc."""
    return str(request.param)


@pytest.fixture(scope="module")
def shared_sandbox(backend_name: str) -> Iterator[Sandbox]:
    """One sandbox per runtime and module, for tests that leave no global trace."""
    with Sandbox(backend=backend_name, timeout=900) as sb:
        yield sb
