"""docs/openapi.json matches the app, and a property-based fuzz run (schemathesis) against that
spec over real HTTP on loopback finds no server error.  No engine: local agent processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_fakes import LocalBackend, add_token, auth, make_settings

from agentnest.server.app import create_app, openapi_document
from agentnest.server.thread import serve_in_thread

SPEC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
#: Operations that run commands: on local agent processes they would run on this
#: machine unsandboxed, so they are fuzzed only against the engine
#: (tests/integration/test_server_engine.py).
HOST_UNSAFE = {
    "POST /v1/sandboxes/{sandbox_id}/exec",
    "POST /v1/sandboxes/{sandbox_id}/exec/stream",
    "POST /v1/sandboxes/{sandbox_id}/sessions/{session_id}/run",
}
#: Streams that stay open as long as their sandbox lives (by design): a fuzz call would wait
#: out its timeout.  tests/unit/test_server_leases.py covers it.
LONG_LIVED = {"GET /v1/sandboxes/{sandbox_id}/lease"}


def test_published_spec_matches_the_app(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    current = openapi_document(create_app(make_settings(tmp_path, backend)))
    assert SPEC.read_text("utf-8") == current, (
        "docs/openapi.json is out of date: run `agentnest serve --openapi > docs/openapi.json`"
    )


def test_spec_names_the_bearer_scheme_and_error_shape() -> None:
    import json

    doc = json.loads(SPEC.read_text("utf-8"))
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "ErrorOut" in doc["components"]["schemas"]
    assert doc["paths"]["/v1/sandboxes"]["post"]["responses"]["403"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str], LocalBackend, str]]:
    root = tmp_path_factory.mktemp("fuzz")
    backend = LocalBackend(root / "sandboxes")
    backend.root.mkdir()
    server_settings = make_settings(root, backend)
    headers = auth(add_token(server_settings, "fuzz", max_sandboxes=3, max_timeout=120.0))
    try:
        with serve_in_thread(create_app(server_settings)) as url:
            yield url, headers, backend, _live_sandbox(url, headers)
        # The server's shutdown destroyed every sandbox it made.
        assert backend.live_agents() == 0
    finally:
        backend.kill_all()
    # Here, after the module's last test, whatever order the tests ran in.
    if len(SEEN) == len(OPERATIONS):
        check_the_fuzz_reached_the_handlers()


def _operations() -> list[Any]:
    schema = schemathesis.openapi.from_path(SPEC)
    found = []
    for result in schema.get_all_operations():
        operation: Any = result.ok()  # type: ignore[union-attr]  # an invalid spec fails here, loudly
        if f"{operation.method.upper()} {operation.path}" not in HOST_UNSAFE | LONG_LIVED:
            found.append(operation)
    return found


OPERATIONS = _operations()
#: Status codes each fuzzed operation answered (checked at the end: the fuzz reached the handlers).
SEEN: dict[str, set[int]] = {}
_CURRENT: list[str] = []


def _live_sandbox(url: str, headers: dict[str, str]) -> str:
    """A live sandbox of the fuzz token (the fuzz may have deleted the last one, or filled the quota)."""
    import httpx

    mine = httpx.get(f"{url}/v1/sandboxes", headers=headers, timeout=30).json()["sandboxes"]
    ids = [s["id"] for s in mine]
    if _CURRENT and _CURRENT[-1] in ids:
        return _CURRENT[-1]
    for sid in ids:
        httpx.delete(f"{url}/v1/sandboxes/{sid}", headers=headers, timeout=30)
    made = httpx.post(f"{url}/v1/sandboxes", json={"timeout": 120}, headers=headers, timeout=30)
    assert made.status_code == 201, made.text
    _CURRENT.append(made.json()["id"])
    return _CURRENT[-1]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: f"{op.method.upper()} {op.path}")
def test_fuzz_finds_no_server_error(
    operation: Any, live: tuple[str, dict[str, str], LocalBackend, str]
) -> None:
    url, headers, _, _ = live

    @settings(
        max_examples=25,
        deadline=None,
        derandomize=True,  # the same examples on every run
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(), real_id=st.booleans())
    def run(case: Any, real_id: bool) -> None:
        # Half the cases aim at a live sandbox, so the handlers behind the
        # ownership check are fuzzed too, not only the 404.
        if real_id and case.path_parameters and "sandbox_id" in case.path_parameters:
            case.path_parameters["sandbox_id"] = _live_sandbox(url, headers)
        response = case.call(base_url=url, headers=headers, timeout=30)
        SEEN.setdefault(f"{case.method} {case.path}", set()).add(response.status_code)
        assert response.status_code < 500, (
            case.method,
            case.formatted_path,
            response.status_code,
            response.text,
        )

    run()


def check_the_fuzz_reached_the_handlers() -> None:
    """Not everything was a 404 or a 422: the handlers behind the ownership check answered.

    Checked when :func:`live` is torn down once every operation was fuzzed (a
    test of its own would depend on running last, which a shuffled order breaks).
    """
    ok = {op for op, codes in SEEN.items() if codes - {401, 404, 422}}
    for op in (
        "GET /v1/sandboxes/{sandbox_id}",
        "PUT /v1/sandboxes/{sandbox_id}/files/{path}",
        "GET /v1/sandboxes/{sandbox_id}/files",
        "POST /v1/sandboxes/{sandbox_id}/sessions",
        "POST /v1/sandboxes/{sandbox_id}/extend",
    ):
        assert op in ok, (op, SEEN.get(op))
