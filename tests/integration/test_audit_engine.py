"""A scripted scenario on a real engine leaves exactly the expected events in the JSONL log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentnest import JsonLogObserver, Sandbox


@pytest.mark.docker
def test_scripted_scenario_writes_the_expected_event_sequence(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    sb = Sandbox(backend="docker", timeout=300, observers=[JsonLogObserver(path)])
    try:
        assert sb.exec_shell("echo hi").stdout == "hi\n"
        sb.write_file("note.txt", "hello")
        assert sb.read_file("note.txt") == "hello"
    finally:
        sb.destroy()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in records] == [
        "sandbox.created",
        "exec.started",
        "exec.finished",
        "file.written",
        "file.read",
        "sandbox.destroyed",
    ]
    assert {r["sandbox_id"] for r in records} == {sb.id}
