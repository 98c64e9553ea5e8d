"""OpenTelemetry traces of ``agentnest serve`` with the real SDK (an in-memory exporter): a span per
request named after its route, continuing the client's trace, admission and start as child spans,
guard events as span events, tenant and token id as attributes, never the secret.  Over real HTTP
on loopback (uvicorn), local agent processes behind the server (no engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from server_fakes import IMAGE, LocalBackend, auth, make_settings

from agentnest.server.app import create_app
from agentnest.server.auth import Ceiling
from agentnest.server.tenants import Tenant
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[str, str, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    backend = LocalBackend(tmp_path / "sandboxes")
    backend.root.mkdir()
    settings = make_settings(tmp_path, backend, tracer_provider=provider)
    settings.tokens.create_tenant(Tenant("team-a", max_sandboxes=1, rate=100.0, burst=100))
    _, secret = settings.tokens.create("a1", Ceiling(images=(IMAGE,), max_sandboxes=4), tenant="team-a")
    try:
        with serve_in_thread(create_app(settings)) as url:
            yield url, secret, exporter
    finally:
        backend.kill_all()
        provider.shutdown()


def _named(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_requests_admissions_and_commands_are_spans_of_the_client_s_trace(
    traced: tuple[str, str, InMemorySpanExporter],
) -> None:
    url, secret, exporter = traced
    parent = {"traceparent": f"00-{TRACE_ID}-{PARENT}-01"}
    with httpx.Client(base_url=url, headers=auth(secret), timeout=30) as http:
        made = http.post("/v1/sandboxes", json={}, headers=parent).json()
        http.post(f"/v1/sandboxes/{made['id']}/exec", json={"shell": "echo traced"}, headers=parent)
        refused = http.post("/v1/sandboxes", json={"max_wait": 0})
        assert refused.status_code == 429

    # A request's span ends after its answer has gone out: wait for the last ones to end.
    wait_until(
        lambda: (
            len(_named(exporter, "POST /v1/sandboxes")) == 2
            and len(_named(exporter, "POST /v1/sandboxes/{sandbox_id}/exec")) == 1
        ),
        "the requests' spans ending",
        within=10,
    )
    creates = _named(exporter, "POST /v1/sandboxes")
    assert len(creates) == 2
    create = next(s for s in creates if s.attributes["http.response.status_code"] == 201)
    assert create.kind is SpanKind.SERVER
    assert format(create.context.trace_id, "032x") == TRACE_ID
    assert format(create.parent.span_id, "016x") == PARENT
    assert create.attributes["http.route"] == "/v1/sandboxes"
    assert create.attributes["agentnest.tenant"] == "team-a"
    assert create.attributes["agentnest.sandbox_id"] == made["id"]
    assert create.attributes["agentnest.launch"] == "cold"
    assert secret not in str(create.attributes)

    admission = next(s for s in _named(exporter, "agentnest.admission") if s.status.is_ok)
    assert admission.parent.span_id == create.context.span_id
    assert admission.attributes["agentnest.tenant"] == "team-a"
    assert admission.attributes["agentnest.admission.waited"] >= 0
    (start,) = _named(exporter, "agentnest.sandbox.start")
    assert start.parent.span_id == create.context.span_id
    assert start.attributes["agentnest.backend"] == "local"

    (run,) = _named(exporter, "POST /v1/sandboxes/{sandbox_id}/exec")
    assert run.context.trace_id == create.context.trace_id
    events = {e.name: e for e in run.events}
    assert {"exec.started", "exec.finished"} <= set(events)
    assert events["exec.finished"].attributes["agentnest.data.exit_code"] == 0

    # The refused create: its own trace, the admission span an error naming the reason.
    rejected = next(s for s in _named(exporter, "agentnest.admission") if not s.status.is_ok)
    assert rejected.status.status_code is StatusCode.ERROR
    assert rejected.attributes["agentnest.admission.reason"] == "tenant_cap"
    assert "AdmissionRefusedError" in str(rejected.status.description)
    refused_span = next(s for s in creates if s is not create)
    assert refused_span.attributes["http.response.status_code"] == 429
    assert format(refused_span.context.trace_id, "032x") != TRACE_ID


def test_tracing_off_makes_no_spans(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    backend = LocalBackend(tmp_path / "sandboxes")
    backend.root.mkdir()
    settings = make_settings(tmp_path, backend, tracer_provider=provider, tracing=False)
    _, secret = settings.tokens.create("a1", Ceiling(images=(IMAGE,)))
    try:
        with serve_in_thread(create_app(settings)) as url:
            assert httpx.get(f"{url}/v1/info", headers=auth(secret), timeout=30).status_code == 200
    finally:
        backend.kill_all()
    assert exporter.get_finished_spans() == ()


def test_opentelemetry_instrument_exports_the_server_s_spans(tmp_path: Path) -> None:
    """The documented set-up: ``opentelemetry-instrument agentnest serve`` with the SDK's console
    exporter, a real server process; one span per request, named by route, with the tenant."""
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys

    from agentnest.server.auth import TokenStore
    from agentnest.testing.wait import wait_until

    _, secret = TokenStore(tmp_path / "tokens.json").create("t", Ceiling())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "AGENTNEST_TOKEN_FILE": str(tmp_path / "tokens.json"),
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "agentnest-test",
    }
    argv = [str(bindir / "opentelemetry-instrument"), str(bindir / "agentnest"), "serve"]
    argv += ["--port", str(port), "--no-database", "--no-audit-log"]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:

            def up() -> bool:
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
                except httpx.TransportError:
                    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                    return False

            wait_until(up, "the instrumented server answering", within=30)
            info = httpx.get(
                f"http://127.0.0.1:{port}/v1/info",
                headers={**auth(secret), "traceparent": f"00-{TRACE_ID}-{PARENT}-01"},
                timeout=10,
            )
            assert info.status_code == 200
        finally:
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=30)
    decoder = json.JSONDecoder()
    spans, at = [], out.find("{")
    while at >= 0:
        span, end = decoder.raw_decode(out, at)
        spans.append(span)
        at = out.find("{", end)
    traced = [s for s in spans if s["context"]["trace_id"] == f"0x{TRACE_ID}"]
    assert [s["name"] for s in traced] == ["GET /v1/info"]  # one span per request: ours
    assert traced[0]["attributes"]["agentnest.tenant"] == "default"
    assert traced[0]["resource"]["attributes"]["service.name"] == "agentnest-test"
