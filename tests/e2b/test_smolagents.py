"""smolagents' ``E2BExecutor`` (``CodeAgent(executor_type="e2b")``) against the server: a
scripted model (no network, no model call) whose code runs in one of our sandboxes.

E2B's ``code-interpreter-v1`` template ships Pillow and NumPy, and smolagents relies on
them (the final-answer tool's code imports PIL; the executor first runs
``!pip install numpy pillow``), so this module's server runs the base image plus Debian's
``python3-pil`` and ``python3-numpy`` as its default image, which ``code-interpreter-v1``
maps to (a template built once, then cached by the engine).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import pytest

from .conftest import SDK, Observed, Server, serve, skip_unsupported

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]
#: Only the SDK sets that carry smolagents.
NEEDS = ("smolagents",)


@pytest.fixture(scope="module")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from agentnest import Template

    skip_unsupported()
    image = Template(apt_packages=("python3-pil", "python3-numpy")).build()
    with serve(tmp_path_factory.mktemp("e2b-smol"), image=image) as server:
        yield server


@pytest.fixture(scope="module")
def agent_run(sdk: SDK) -> Observed:
    return sdk.run("smolagents", tag=f"smol-{uuid.uuid4().hex[:8]}")


def test_a_scripted_code_agent_answers_from_the_sandbox(agent_run: Observed) -> None:
    assert agent_run.value("agent")["sandbox_id"]
    answer = agent_run.value("run")
    assert answer["value"] == 42
    assert answer["uid"] != 0
    assert answer["hostname"] and answer["hostname"] != socket.gethostname()
    steps = agent_run.value("steps")
    assert [s["error"] for s in steps if s["code"]] == ["", ""], steps


def test_cleanup_kills_the_sandbox(agent_run: Observed) -> None:
    agent_run.value("cleanup")
    agent_run.error("gone", "NotFoundException")
