"""``agentnest doctor``'s live-restore line: a pure function of the engine's ``docker info``.

OK when the engine reports ``LiveRestoreEnabled``; a warning (never a failure) when it
is off, with the fix, or with why it cannot be on in swarm mode.  The real engine's line
is checked in tests/integration/test_cli_engine.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentnest.cli import doctor as doctor_cmd


def line(info: dict[str, Any]) -> dict[str, str]:
    report = doctor_cmd._Report(as_json=True)
    doctor_cmd._live_restore_check(report, "Docker engine", info)
    (check,) = report.checks
    assert report.failed == []  # never a failure, whatever the engine says
    return {"name": check.name, "status": check.status, "detail": check.detail, "hint": check.hint}


def swarm(state: str) -> dict[str, Any]:
    return {"LocalNodeState": state, "NodeID": "", "ControlAvailable": False}


def test_live_restore_on_is_ok() -> None:
    got = line({"LiveRestoreEnabled": True, "Swarm": swarm("inactive")})
    assert (got["name"], got["status"], got["hint"]) == ("live-restore", "ok", "")
    assert "keep running while dockerd restarts" in got["detail"]


def test_live_restore_off_warns_with_the_fix() -> None:
    got = line({"LiveRestoreEnabled": False, "Swarm": swarm("inactive")})
    assert got["status"] == doctor_cmd.WARN == "warn"
    assert "sandboxes are stopped when dockerd restarts" in got["detail"]
    assert "`make engine`" in got["hint"]
    assert '"live-restore": true' in got["hint"] and "/etc/docker/daemon.json" in got["hint"]
    assert "kill -HUP $(pidof dockerd)" in got["hint"]


@pytest.mark.parametrize("state", ["active", "locked", "pending"])
def test_live_restore_off_in_swarm_mode_says_they_are_incompatible(state: str) -> None:
    got = line({"LiveRestoreEnabled": False, "Swarm": swarm(state)})
    assert got["status"] == "warn"
    assert f"swarm mode ({state})" in got["detail"] and "refuses together with live-restore" in got["detail"]
    assert "docker swarm leave" in got["hint"]
    assert "kill -HUP" not in got["hint"]  # reloading would not help


def test_an_engine_that_does_not_say_is_skipped() -> None:
    got = line({"Swarm": swarm("inactive")})
    assert got["status"] == "skip" and "does not report" in got["detail"]


def test_a_warning_prints_its_fix_and_is_counted_apart_from_failures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = doctor_cmd._Report(as_json=False)
    doctor_cmd._live_restore_check(report, "Docker engine", {"LiveRestoreEnabled": False, "Swarm": {}})
    out = capsys.readouterr().out
    assert "  WARN  live-restore             off: sandboxes are stopped when dockerd restarts" in out
    assert "fix: `make engine`" in out
    assert report.failed == []
