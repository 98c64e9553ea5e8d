"""A pty through the stock SDK (input, resize, exit code), a directory watch, and pause then
connect, which resumes the sandbox."""

from __future__ import annotations

import pytest

from .conftest import SDK, Observed

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def terminal(sdk: SDK) -> Observed:
    return sdk.run("terminal")


def test_a_pty_takes_input_is_resized_and_ends_with_its_code(terminal: Observed) -> None:
    assert terminal.value("pty_create")["pid"] > 0
    waited = terminal.value("pty_wait")
    assert "pty-42" in waited["output"]  # the shell ran what was typed
    assert "30 100" in waited["output"]  # stty saw the new size
    assert waited["exit_code"] == 7


def test_a_watch_reports_what_was_written(terminal: Observed) -> None:
    events = terminal.value("watch_events")
    assert ["watched/a.txt", "CREATE"] in events
    assert terminal.value("watch_stop") is True


def test_pause_then_connect_resumes(terminal: Observed) -> None:
    assert terminal.value("state_paused") == "paused"
    assert terminal.value("connect_resumes") == "back\n"
    assert terminal.value("state_running") == "running"
    terminal.value("kill")
