"""scripts/engine_config.py: the daemon.json merge `make engine` does (runsc, experimental, live-restore).

The script is not part of the package (the system python3 runs it before any venv
exists), so it is imported by path.  The command line runs against files in
tmp_path through ``--file``, never the real /etc/docker/daemon.json.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "engine_config.py"
RUNSC = "/usr/bin/runsc"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("engine_config", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ec = load()


def merged(text: str | None, swarm: bool = False, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(ec.plan(text, RUNSC, swarm, **kw).text)
    return out


def refusal(text: str) -> str:
    with pytest.raises(ec.ConfigError) as info:
        ec.merge(text, RUNSC, False, path="/etc/docker/daemon.json")
    return str(info.value)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--runsc", RUNSC, *args], capture_output=True, text=True, check=False
    )


# -- the merge -----------------------------------------------------------------------------


def test_a_missing_file_gets_runsc_experimental_and_live_restore() -> None:
    plan = ec.plan(None, RUNSC, False)
    assert plan.changed and plan.live_restore == "on" and plan.notes == []
    assert json.loads(plan.text) == {
        "runtimes": {
            "runsc": {"path": RUNSC, "runtimeArgs": ["--network=none", "--oci-seccomp"]},
            "runsc-host": {"path": RUNSC, "runtimeArgs": ["--network=host", "--oci-seccomp"]},
        },
        "experimental": True,
        "live-restore": True,
    }


@pytest.mark.parametrize("text", ["", "  \n", "\ufeff\n"])
def test_an_empty_file_is_an_empty_configuration_as_for_dockerd(text: str) -> None:
    plan = ec.plan(text, RUNSC, False)
    assert plan.changed
    assert json.loads(plan.text) == json.loads(ec.merge(None, RUNSC, False))


def test_every_other_setting_is_kept_in_its_order() -> None:
    before: dict[str, Any] = {
        "log-driver": "journald",
        "runtimes": {"kata": {"path": "/usr/bin/kata-runtime"}},
        "data-root": "/srv/docker",
        "default-ulimits": {"nofile": {"Name": "nofile", "Hard": 65536, "Soft": 1024}},
        "registry-mirrors": ["https://mirror.example"],
        "labels": ["zone=é"],
    }
    after = merged(json.dumps(before))
    assert list(after) == [*before, "experimental", "live-restore"]
    assert list(after["runtimes"]) == ["kata", "runsc", "runsc-host"]
    assert after["runtimes"]["kata"] == before["runtimes"]["kata"]
    for key in ("log-driver", "data-root", "default-ulimits", "registry-mirrors", "labels"):
        assert after[key] == before[key]
    assert "zone=é" in ec.merge(json.dumps(before), RUNSC, False)  # not \\u-escaped


def test_a_second_run_changes_nothing_and_keeps_the_text_byte_for_byte() -> None:
    first = ec.merge(None, RUNSC, False)
    second = ec.plan(first, RUNSC, False)
    assert (second.changed, second.text, second.live_restore) == (False, first, "on")
    # An admin's formatting of a file that already has everything is not rewritten either.
    compact = json.dumps(json.loads(first), separators=(",", ":"))
    assert ec.plan(compact, RUNSC, False) == (compact, False, "on", [])


def test_the_file_before_live_restore_gains_only_that_key() -> None:
    old = {"runtimes": ec.wanted_runtimes(RUNSC), "experimental": True}
    plan = ec.plan(json.dumps(old, indent=2), RUNSC, False)
    assert plan.changed and json.loads(plan.text) == {**old, "live-restore": True}


def test_a_stale_runsc_entry_is_brought_back_to_agentnests() -> None:
    old = {"runtimes": {"runsc": {"path": "/opt/old/runsc"}}}
    assert merged(json.dumps(old))["runtimes"]["runsc"]["path"] == RUNSC


# -- refused: the file is left as it is ----------------------------------------------------


def test_invalid_json_is_refused_with_line_and_column_and_the_fix() -> None:
    message = refusal('{\n  "experimental": true,\n  "log-driver": "journald",\n}\n')
    assert "/etc/docker/daemon.json is not valid JSON" in message
    assert "line 4, column 1" in message
    assert "left untouched" in message
    assert "move it aside" in message and "rerun `make engine`" in message


@pytest.mark.parametrize(
    ("text", "kind"), [("[]", "an array"), ('"x"', "a string"), ("null", "null"), ("3", "a number")]
)
def test_a_top_level_that_is_not_an_object_is_refused(text: str, kind: str) -> None:
    message = refusal(text)
    assert "must hold a JSON object" in message and f"not {kind}" in message


@pytest.mark.parametrize("runtimes", [[], "runsc", 1])
def test_runtimes_that_are_not_an_object_are_refused(runtimes: Any) -> None:
    message = refusal(json.dumps({"runtimes": runtimes}))
    assert '"runtimes" must be a JSON object' in message


def test_a_live_restore_that_is_not_a_boolean_is_refused() -> None:
    message = refusal('{"live-restore": "true"}')
    assert '"live-restore" must be true or false, not "true"' in message


# -- live-restore: swarm, an admin's false, dockerd's flag ----------------------------------


def test_a_swarm_node_gets_no_live_restore_and_a_note_why() -> None:
    plan = ec.plan(None, RUNSC, True)
    cfg = json.loads(plan.text)
    assert "live-restore" not in cfg and cfg["experimental"] is True and "runsc" in cfg["runtimes"]
    assert plan.live_restore == "unset"
    (note,) = plan.notes
    assert "swarm mode" in note and "will not survive a restart of dockerd" in note


def test_a_swarm_node_keeps_an_admins_live_restore_but_is_told_it_clashes() -> None:
    text = ec.merge(None, RUNSC, False)
    plan = ec.plan(text, RUNSC, True)
    assert not plan.changed and json.loads(plan.text)["live-restore"] is True
    assert "refuses live-restore in swarm mode" in plan.notes[0]


def test_an_admins_live_restore_false_is_respected_with_a_note() -> None:
    text = json.dumps({"live-restore": False, "runtimes": ec.wanted_runtimes(RUNSC), "experimental": True})
    plan = ec.plan(text, RUNSC, False)
    assert (plan.changed, plan.text, plan.live_restore) == (False, text, "off")
    (note,) = plan.notes
    assert '"live-restore": false, kept' in note
    assert "will not survive a restart of dockerd" in note and "kill -HUP $(pidof dockerd)" in note


def test_a_dockerd_with_the_flag_does_not_get_it_in_the_file_too() -> None:
    plan = ec.plan(None, RUNSC, False, live_restore_flag=True)
    assert "live-restore" not in json.loads(plan.text)
    assert "command line" in plan.notes[0]


# -- the command line ---------------------------------------------------------------------


def test_cli_writes_a_missing_file_then_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "docker" / "daemon.json"
    first = run_cli("--file", str(path))
    assert first.returncode == 0, first.stderr
    assert first.stdout == "changed=yes live-restore=on\n"
    written = path.read_text()
    assert json.loads(written)["live-restore"] is True
    second = run_cli("--file", str(path))
    assert (second.returncode, second.stdout) == (0, "changed=no live-restore=on\n")
    assert path.read_text() == written
    assert [p.name for p in path.parent.iterdir()] == ["daemon.json"]  # no temporary file left


def test_cli_keeps_the_files_mode_and_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text('{"log-level": "warn"}')
    real.chmod(0o600)
    link = tmp_path / "daemon.json"
    link.symlink_to(real)
    assert run_cli("--file", str(link)).returncode == 0
    assert link.is_symlink() and (real.stat().st_mode & 0o777) == 0o600
    assert json.loads(real.read_text())["log-level"] == "warn"


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (b'{"debug": true,,}', "line 1, column 16"),
        (b"[1, 2]", "must hold a JSON object"),
        (b'{"runtimes": []}', '"runtimes" must be a JSON object'),
        (b'{"debug": "\xff"}', "not UTF-8 text"),
    ],
)
def test_cli_refuses_a_bad_file_with_exit_3(tmp_path: Path, content: bytes, expect: str) -> None:
    path = tmp_path / "daemon.json"
    path.write_bytes(content)
    result = run_cli("--file", str(path))
    assert result.returncode == 3
    assert result.stdout == ""
    assert str(path) in result.stderr and expect in result.stderr and "make engine" in result.stderr
    assert path.read_bytes() == content


def test_cli_swarm_and_an_admins_false_print_their_notes(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    swarm = run_cli("--file", str(path), "--swarm")
    assert (swarm.returncode, swarm.stdout) == (0, "changed=yes live-restore=unset\n")
    assert "engine: note: live-restore not enabled: this engine is in swarm mode" in swarm.stderr
    assert "live-restore" not in json.loads(path.read_text())
    path.write_text(json.dumps({**json.loads(path.read_text()), "live-restore": False}))
    off = run_cli("--file", str(path))
    assert (off.returncode, off.stdout) == (0, "changed=no live-restore=off\n")
    assert '"live-restore": false, kept' in off.stderr


def test_cli_dry_run_prints_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}')
    result = run_cli("--file", str(path), "--dry-run")
    assert result.returncode == 0
    assert json.loads(result.stdout) == {**json.loads(ec.merge('{"debug": true}', RUNSC, False))}
    assert path.read_text() == '{"debug": true}'


def test_cli_cannot_write_exits_1(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = run_cli("--file", str(blocker / "daemon.json"))
    assert result.returncode == 1 and "engine: cannot" in result.stderr


def test_cli_bad_arguments_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--file", str(tmp_path / "d.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "--runsc" in result.stderr
    assert not (tmp_path / "d.json").exists()
