"""Audit sinks (JSONL file, OpenTelemetry) and ``agentnest audit``, without an engine."""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import agentnest
from agentnest import AuditError, EventType, JsonLogObserver, SandboxEvent
from agentnest.audit import default_audit_path, rotated_paths
from agentnest.cli import audit as audit_cmd
from agentnest.cli import main
from agentnest.errors import AgentNestError, ConfigurationError, MissingDependencyError
from agentnest.events import OpenTelemetryObserver


def event(
    kind: EventType = EventType.EXEC_STARTED, sandbox: str = "sb1", when: float = 1000.0, **data: Any
) -> SandboxEvent:
    # A fixed id: records compare equal when their content does.
    return SandboxEvent(kind, sandbox, timestamp=when, attributes=data, event_id=f"{kind.value}@{when}")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- JsonLogObserver ---------------------------------------------------------


def test_writes_one_json_line_per_event(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.jsonl"
    log = JsonLogObserver(path)
    log(event(EventType.SANDBOX_CREATED, image="python:3.12"))
    log(event(EventType.EXEC_STARTED, argv=["ls", "-l"]))
    log.close()
    records = lines(path)
    assert [r["type"] for r in records] == ["sandbox.created", "exec.started"]
    assert records[0] == event(EventType.SANDBOX_CREATED, image="python:3.12").to_dict()
    assert records[1]["data"] == {"argv": ["ls", "-l"]}
    assert path.stat().st_mode & 0o777 == 0o600


def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    JsonLogObserver(path)(event(sandbox="one"))
    JsonLogObserver(path)(event(sandbox="two"))
    assert [r["sandbox_id"] for r in lines(path)] == ["one", "two"]


def test_default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AGENTNEST_AUDIT_LOG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_audit_path() == tmp_path / "agentnest" / "audit.jsonl"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_audit_path() == tmp_path / ".local" / "state" / "agentnest" / "audit.jsonl"
    monkeypatch.setenv("AGENTNEST_AUDIT_LOG", str(tmp_path / "x.jsonl"))
    assert default_audit_path() == tmp_path / "x.jsonl"
    assert JsonLogObserver().path == tmp_path / "x.jsonl"


def test_rotation_keeps_backups_and_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    one = len(json.dumps(event(n=0).to_dict(), separators=(",", ":"))) + 1
    log = JsonLogObserver(path, max_bytes=one * 2, backups=2)
    for n in range(7):
        log(event(n=n))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.jsonl.1", "a.jsonl.2"]
    assert [r["data"]["n"] for r in lines(path)] == [6]
    assert [r["data"]["n"] for r in lines(Path(f"{path}.1"))] == [4, 5]
    assert [r["data"]["n"] for r in lines(Path(f"{path}.2"))] == [2, 3]
    assert rotated_paths(path, 2) == [Path(f"{path}.2"), Path(f"{path}.1"), path]
    for p in rotated_paths(path, 2):
        assert p.stat().st_size <= one * 2


def test_rotation_without_backups_truncates(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLogObserver(path, max_bytes=10, backups=0)
    for n in range(3):
        log(event(n=n))
    assert [r["data"]["n"] for r in lines(path)] == [2]
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]


def test_follows_a_rotation_by_another_writer(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLogObserver(path)
    log(event(n=0))
    os.replace(path, f"{path}.1")  # another process rotated
    log(event(n=1))
    assert [r["data"]["n"] for r in lines(path)] == [1]


def test_concurrent_threads_write_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLogObserver(path)
    payload = "x" * 5000  # larger than one pipe buffer: a torn write would show

    def writer(t: int) -> None:
        for n in range(50):
            log(event(sandbox=f"t{t}", n=n, payload=payload))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = lines(path)  # every line parses
    assert len(records) == 400
    for w in range(8):
        assert [r["data"]["n"] for r in records if r["sandbox_id"] == f"t{w}"] == list(range(50))


def test_a_directory_in_the_way_raises_audit_error(tmp_path: Path) -> None:
    log = JsonLogObserver(tmp_path)  # the path is a directory
    with pytest.raises(AuditError, match=r"cannot record exec\.started") as info:
        log(event())
    assert isinstance(info.value, AgentNestError)
    assert isinstance(info.value.__cause__, OSError)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_read_only_directory_raises_audit_error(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(AuditError, match="Permission denied"):
            JsonLogObserver(locked / "a.jsonl")(event())
    finally:
        locked.chmod(0o700)


def test_disk_full_raises_audit_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = JsonLogObserver(tmp_path / "a.jsonl")

    def full(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(AuditError, match="No space left"):
        log(event())


def test_a_failing_sink_fails_the_operation(tmp_path: Path) -> None:
    """Fail loud: the guard lets the sink's AuditError out of the operation."""
    from agentnest.config import SandboxConfig
    from agentnest.guard import Guard
    from agentnest.policy import SecurityPolicy

    guard = Guard(SandboxConfig(image="img"), SecurityPolicy(), [JsonLogObserver(tmp_path)], None)
    with pytest.raises(AuditError):
        guard.emit(EventType.EXEC_STARTED, {"argv": ["true"]})


def test_bad_settings() -> None:
    with pytest.raises(ConfigurationError):
        JsonLogObserver("x", max_bytes=0)
    with pytest.raises(ConfigurationError):
        JsonLogObserver("x", backups=-1)


# -- OpenTelemetryObserver ---------------------------------------------------


def test_opentelemetry_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_otel(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_otel)
    # An earlier test may have imported it already: hide the cached modules too.
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with pytest.raises(MissingDependencyError, match=r"agentnest\[observability\]") as info:
        OpenTelemetryObserver()
    assert isinstance(info.value, ImportError)


def test_opentelemetry_records_span_events() -> None:
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk not installed (observability extra)")
    sdk_trace = importlib.import_module("opentelemetry.sdk.trace")
    export = importlib.import_module("opentelemetry.sdk.trace.export")
    memory = importlib.import_module("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    exporter = memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    otel = OpenTelemetryObserver(provider)
    otel(event(EventType.EXEC_STARTED, argv=["ls"], timeout=5))
    (span,) = exporter.get_finished_spans()
    assert span.name == "agentnest.exec.started"
    (recorded,) = span.events
    assert recorded.name == "exec.started"
    assert recorded.attributes is not None
    assert recorded.attributes["agentnest.sandbox_id"] == "sb1"
    assert recorded.attributes["agentnest.data.argv"] == '["ls"]'
    assert recorded.attributes["agentnest.data.timeout"] == 5


def test_exported() -> None:
    for name in ("AuditError", "JsonLogObserver", "OpenTelemetryObserver"):
        assert name in agentnest.__all__


# -- agentnest audit ---------------------------------------------------------


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    log = JsonLogObserver(path)
    log(event(EventType.SANDBOX_CREATED, "aaa111", 1000.0, image="img"))
    log(event(EventType.EXEC_STARTED, "aaa111", 1010.0, argv=["echo", "hi"]))
    log(event(EventType.SANDBOX_CREATED, "bbb222", 1020.0))
    log(event(EventType.POLICY_DENIED, "bbb222", 1030.0, reason="no"))
    log.close()
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_cli_prints_every_event(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--file", str(log_file))
    assert code == 0 and err == ""
    assert len(out) == 4
    assert out[0] == "1970-01-01T00:16:40.000Z  sandbox.created  aaa111  image=img"
    assert out[1].endswith('exec.started  aaa111  argv=["echo","hi"]')


def test_cli_filters(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = ["--file", str(log_file)]
    _, out, _ = run(capsys, *f, "--sandbox", "bbb")
    assert [line.split()[2] for line in out] == ["bbb222", "bbb222"]
    _, out, _ = run(capsys, *f, "--type", "sandbox.created", "--type", "policy.denied")
    assert [line.split()[1] for line in out] == ["sandbox.created", "sandbox.created", "policy.denied"]
    _, out, _ = run(capsys, *f, "--since", "1010", "--until", "1030")
    assert [line.split()[1] for line in out] == ["exec.started", "sandbox.created"]
    _, out, _ = run(capsys, *f, "--since", "1970-01-01T00:16:50Z")
    assert len(out) == 3
    _, out, _ = run(capsys, *f, "--since", "1h")  # all are from 1970
    assert out == []


def test_cli_json(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--file", str(log_file), "--json", "--type", "exec.started")
    assert code == 0
    assert [json.loads(line) for line in out] == [
        event(EventType.EXEC_STARTED, "aaa111", 1010.0, argv=["echo", "hi"]).to_dict()
    ]


def test_cli_reads_rotated_files_oldest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLogObserver(path, max_bytes=10, backups=3)
    for n in range(4):
        log(event(n=n))
    _, out, _ = run(capsys, "--file", str(path), "--json")
    assert [json.loads(line)["data"]["n"] for line in out] == [0, 1, 2, 3]


def test_cli_default_file_from_environment(
    log_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTNEST_AUDIT_LOG", str(log_file))
    _, out, _ = run(capsys)
    assert len(out) == 4


def test_cli_malformed_lines_are_reported_and_skipped(
    log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with log_file.open("a") as f:
        f.write("{not json\n[1, 2]\n\n")
    JsonLogObserver(log_file)(event(EventType.SANDBOX_DESTROYED, "aaa111", 2000.0))
    code, out, err = run(capsys, "--file", str(log_file))
    assert code == 0
    assert len(out) == 5 and "sandbox.destroyed" in out[-1]
    assert f"{log_file}:5: malformed line skipped" in err
    assert f"{log_file}:6: not an audit event, skipped" in err


def test_cli_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--file", str(tmp_path / "nope.jsonl"))
    assert code == 1 and out == []
    assert "no audit log" in err


def test_cli_bad_time(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--since", "yesterday-ish")
    assert code == 2
    assert "is not a time" in err


def test_cli_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "--follow" in out


def test_cli_follow_stops_after_max_events(log_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--file", str(log_file), "--follow", "--max-events", "2")
    assert code == 0 and len(out) == 2


def test_follow_sees_appends_rotation_and_partial_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLogObserver(path)
    log(event(n=0))
    seen: list[int] = []
    steps = iter(range(10))

    def sleep(_: float) -> None:
        # Each poll the "other process" does one more thing.
        step = next(steps)
        if step == 0:
            log(event(n=1))
        elif step == 1:
            os.replace(path, f"{path}.1")  # rotated, then a partial line in the new file
            with path.open("ab") as f:
                f.write(json.dumps(event(n=2).to_dict()).encode()[:10])
        elif step == 2:
            with path.open("ab") as f:
                f.write(json.dumps(event(n=2).to_dict()).encode()[10:] + b"\nbad\n")
            log(event(n=3))

    def emit(e: dict[str, Any]) -> bool:
        seen.append(e["data"]["n"])
        return len(seen) < 4

    audit_cmd.follow(path, emit, interval=0.01, sleep=sleep)
    assert seen == [0, 1, 2, 3]
    assert "malformed line skipped" in capsys.readouterr().err


def test_follow_waits_for_the_file(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    seen: list[dict[str, Any]] = []

    def sleep(_: float) -> None:
        JsonLogObserver(path)(event())

    def emit(e: dict[str, Any]) -> bool:
        seen.append(e)
        return False

    audit_cmd.follow(path, emit, sleep=sleep)
    assert len(seen) == 1


def test_parse_time() -> None:
    assert audit_cmd.parse_time("15m", now=1000.0) == 100.0
    assert audit_cmd.parse_time("2d", now=200000.0) == 200000.0 - 172800
    assert audit_cmd.parse_time("12.5") == 12.5
    assert audit_cmd.parse_time("1970-01-01T00:01:00") == 60.0
    assert audit_cmd.parse_time("1970-01-01T01:00:00+01:00") == 0.0
