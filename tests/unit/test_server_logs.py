"""``agentnest serve --log-format json``: one JSON object per line, access lines included."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentnest.server.logs import JsonFormatter
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_record_becomes_one_json_line_with_its_extra_fields_and_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("agentnest.server").makeRecord(
            "agentnest.server", logging.ERROR, "f.py", 1, "sandbox %s failed", ("sb1",), sys.exc_info(),
            extra={"tenant": "team-a"},
        )  # fmt: skip
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "sandbox sb1 failed" and doc["level"] == "error" and doc["tenant"] == "team-a"
    assert (
        doc["logger"] == "agentnest.server" and doc["ts"].endswith("Z") and "ValueError: boom" in doc["exc"]
    )


def test_the_server_logs_json_lines_when_asked(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "agentnest", "serve", "--port", str(port), "--no-audit-log"]
    argv += ["--tokens", str(tmp_path / "tokens.json"), "--image", "local/none:1", "--log-format", "json"]
    # The default database (a SQLite file under $XDG_STATE_HOME) goes under the test's directory.
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env) as server:
        try:

            def up() -> bool:
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(up, "the server answering /healthz", within=30)
        finally:
            server.terminate()
            _, err = server.communicate(timeout=30)
    lines = [line for line in err.splitlines() if line.startswith("{")]
    docs = [json.loads(line) for line in lines]
    assert any(d["logger"] == "uvicorn.access" and "/healthz" in d["message"] for d in docs), err
    assert all({"ts", "level", "logger", "message"} <= d.keys() for d in docs)
