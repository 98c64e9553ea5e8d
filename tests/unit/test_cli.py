"""The command line without an engine: parsing, help, exit codes, errors, and prune's logic."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest
import requests

from agentnest.cli import backends as backends_cmd
from agentnest.cli import build_parser, main
from agentnest.cli import doctor as doctor_cmd
from agentnest.cli import prune as prune_cmd
from agentnest.cli._output import human_bytes, mark, table
from agentnest.cli._workspace import PROBE as workspace_probe
from agentnest.cli._workspace import Workspace, read_workspace
from agentnest.cli.run import command_argv
from agentnest.config import ResourceLimits
from agentnest.errors import AgentNestError, BackendError, ConfigurationError
from agentnest.runtime import registry
from agentnest.runtime.docker import DockerBackend, labels
from agentnest.runtime.docker.prune import EVERYTHING, EXPIRED, OWNER_GONE, PruneReport, prune

COMMANDS = [
    ["demo"],
    ["doctor"],
    ["run"],
    ["prune"],
    ["image"],
    ["image", "base"],
    ["image", "build"],
    ["image", "list"],
    ["backends"],
]


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine, even when one runs here: docker-py gets an address that refuses connections."""
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    monkeypatch.delenv("AGENTNEST_IMAGE", raising=False)
    monkeypatch.setattr(registry, "_shared", {})


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- help and usage --------------------------------------------------------------------


def test_top_level_help_lists_every_command_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for name in ("demo", "doctor", "run", "prune", "image", "backends"):
        assert f"    {name}" in out
    assert "examples:" in out
    assert "agentnest run -- " in out


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    code, out, err = run_cli(capsys, *command, "--help")
    assert code == 0, err
    assert "example" in out
    # The example shows the command itself being used.
    assert f"agentnest {' '.join(command)}" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0
    assert out.startswith("agentnest ")


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys)
    assert code == 2
    assert out == ""
    assert "usage: agentnest" in err


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "explode")
    assert code == 2
    assert "invalid choice: 'explode'" in err


def test_image_without_action_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "image")
    assert code == 2
    assert out == ""
    assert "error: choose an action: base, build, browser or list" in err


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "prune", "--everything-please")
    assert code == 2
    assert "unrecognized arguments: --everything-please" in err


def test_import_is_cheap() -> None:
    """``import agentnest.cli`` (every ``agentnest`` start) does not load docker-py."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, agentnest.cli; print('docker' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout.strip() == "False"


# -- run: arguments -------------------------------------------------------------------


def parse_run(*argv: str) -> list[str]:
    args = build_parser().parse_args(["run", *argv])
    return command_argv(args.command)


def test_run_takes_the_command_after_double_dash() -> None:
    assert parse_run("--timeout", "5", "--", "ls", "-la", "/") == ["ls", "-la", "/"]
    assert parse_run("--", "sh", "-c", "echo a  b") == ["sh", "-c", "echo a  b"]


def test_run_takes_the_command_without_double_dash() -> None:
    assert parse_run("ls", "-la") == ["ls", "-la"]
    assert parse_run("--image", "x:1", "python3", "-V") == ["python3", "-V"]


def test_run_options_after_the_command_belong_to_the_command() -> None:
    args = build_parser().parse_args(["run", "--", "grep", "--timeout", "x"])
    assert args.timeout is None
    assert command_argv(args.command) == ["grep", "--timeout", "x"]


def test_run_splits_one_string_with_spaces_into_argv() -> None:
    assert parse_run("--", "echo 'a  b' c") == ["echo", "a  b", "c"]
    assert parse_run("ls -la /workspace") == ["ls", "-la", "/workspace"]
    # A single word stays as it is.
    assert parse_run("--", "true") == ["true"]


def test_run_refuses_an_unsplittable_string() -> None:
    with pytest.raises(ConfigurationError, match="cannot split"):
        parse_run("--", "echo 'unbalanced")


def test_run_parses_options() -> None:
    argv = ["run", "--image", "img:1", "--backend", "gvisor", "--timeout", "2.5", "--memory", "1g"]
    args = build_parser().parse_args([*argv, "-e", "A=1=2", "--env", "B=", "--", "true"])
    assert (args.image, args.backend, args.timeout, args.memory) == ("img:1", "gvisor", 2.5, "1g")
    assert args.env == [("A", "1=2"), ("B", "")]
    assert args.network is None  # not given: the profile or the default decides


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf", "nan"])
def test_run_refuses_bad_timeouts(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, _, err = run_cli(capsys, "run", "--timeout", value, "--", "true")
    assert code == 2
    assert "argument --timeout" in err


def test_run_refuses_a_bad_env_pair(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", "-e", "NOVALUE", "--", "true")
    assert code == 2
    assert "'NOVALUE' is not NAME=VALUE" in err


def test_run_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", "--timeout", "3")
    assert code == 2
    assert out == ""
    assert err.startswith("error: no command given")


def test_run_with_a_timeout_longer_than_the_lifetime(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", "--timeout", "700", "--lifetime", "600", "--", "true")
    assert code == 2
    assert "must be shorter than the lifetime 600" in err


def test_run_with_a_bad_memory_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", "--memory", "banana", "--", "true")
    assert code == 2
    assert err.startswith("error: ") and "banana" in err
    assert "Traceback" not in err


def test_run_with_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", "--backend", "nope", "--", "true")
    assert code == 2
    assert "error: unknown backend 'nope'" in err


# -- errors become messages and exit codes --------------------------------------------------


@pytest.mark.parametrize(
    ("raised", "expected_code", "expected_err"),
    [
        (BackendError("the engine refused: boom"), 1, "error: the engine refused: boom\n"),
        (AgentNestError("plain"), 1, "error: plain\n"),
        (ConfigurationError("bad value"), 2, "error: bad value\n"),
        (KeyboardInterrupt(), 130, "\ninterrupted\n"),
        (BrokenPipeError(), 141, ""),
    ],
)
def test_handler_errors_map_to_exit_codes(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    expected_code: int,
    expected_err: str,
) -> None:
    def explode(args: Any) -> int:
        raise raised

    monkeypatch.setattr(backends_cmd, "handle", explode)
    code, _, err = run_cli(capsys, "backends")
    assert code == expected_code
    assert err == expected_err


def test_unexpected_errors_are_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug is a bug: only AgentNest's own errors become one-line messages."""

    def explode(args: Any) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(backends_cmd, "handle", explode)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["backends"])


# -- no engine ----------------------------------------------------------------------


def test_doctor_without_engine_says_how_to_start_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 1
    assert "FAIL  engine reachable" in out
    assert "start it with `make engine` or `sudo systemctl start docker`" in out
    # Nothing else is attempted against an engine that is not there.
    assert "create a sandbox" not in out


def test_doctor_json_without_engine(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "doctor", "--json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    assert [(c["name"], c["status"]) for c in report["checks"]] == [("engine reachable", "fail")]
    assert "make engine" in report["checks"][0]["hint"]


@pytest.mark.parametrize("argv", [["prune"], ["run", "--", "true"], ["image", "list"], ["image", "base"]])
def test_commands_without_engine_print_one_error_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 1
    assert out == ""
    assert err.startswith("error: ")
    assert "not reachable" in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_backends_without_engine_still_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "backends")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) >= {"docker", "gvisor", "kata"}
    assert all("engine not reachable" in rows[name] for name in ("docker", "gvisor", "kata"))


# -- prune, against a fake engine ------------------------------------------------------


def api_error(status: int, text: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return cls(text, response=response, explanation=text)


class FakeDockerAPI:
    """The slice of docker-py's APIClient that prune uses, with scripted failures."""

    def __init__(self) -> None:
        self.containers_: list[dict[str, Any]] = []
        self.networks_: list[dict[str, Any]] = []
        self.volumes_: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.failures: dict[str, Exception] = {}
        self.filters_seen: list[Any] = []
        self.extended: dict[str, float] = {}
        """Deadlines moved inside containers (Sandbox.extend), read through exec as root."""

    def exec_create(self, cid: str, argv: list[str], **kwargs: Any) -> dict[str, str]:
        assert kwargs.get("user") == "0", "the deadline file is only trusted when root wrote it"
        return {"Id": cid}

    def exec_start(self, exec_id: str, **kwargs: Any) -> bytes:
        value = self.extended.get(exec_id)
        return b"" if value is None else f"{value:.3f}\n".encode()

    def exec_inspect(self, exec_id: str) -> dict[str, int]:
        return {"ExitCode": 0}

    def _managed(self, items: list[dict[str, Any]], filters: Any) -> list[dict[str, Any]]:
        self.filters_seen.append(filters)
        wanted = dict(f.split("=", 1) for f in filters["label"])
        return [i for i in items if all((i.get("Labels") or {}).get(k) == v for k, v in wanted.items())]

    def containers(self, *, all: bool = False, filters: Any = None) -> list[dict[str, Any]]:
        assert all, "stopped containers must be listed too"
        return self._managed(self.containers_, filters)

    def networks(self, *, filters: Any = None) -> list[dict[str, Any]]:
        return self._managed(self.networks_, filters)

    def volumes(self, *, filters: Any = None) -> dict[str, Any]:
        return {"Volumes": self._managed(self.volumes_, filters), "Warnings": None}

    def _remove(self, kind: str, rid: str, **kwargs: Any) -> None:
        self.calls.append((kind, rid, kwargs))
        if rid in self.failures:
            raise self.failures[rid]

    def remove_container(self, rid: str, **kwargs: Any) -> None:
        self._remove("container", rid, **kwargs)

    def remove_network(self, rid: str) -> None:
        self._remove("network", rid)

    def remove_volume(self, rid: str) -> None:
        self._remove("volume", rid)


#: Real time, because the prune command compares with the clock.
NOW = time.time()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def tags(deadline: float | str | None, owner: str | None = None, sandbox: str = "") -> dict[str, str]:
    out = {labels.MANAGED: "true", labels.SANDBOX: sandbox}
    if deadline is not None:
        out[labels.DEADLINE] = str(deadline)
    out[labels.OWNER] = owner if owner is not None else labels.owner()
    return out


@pytest.fixture
def api() -> FakeDockerAPI:
    fake = FakeDockerAPI()
    fake.containers_ = [
        {"Id": "c-expired", "Names": ["/agentnest-exp"], "Labels": tags(NOW - 10, sandbox="exp")},
        {"Id": "c-live", "Names": ["/agentnest-live"], "Labels": tags(NOW + 3600, sandbox="live")},
        {"Id": "c-foreign", "Names": ["/someone-else"], "Labels": {labels.DEADLINE: str(NOW - 1000)}},
    ]
    fake.networks_ = [
        {"Id": "n-expired", "Name": "agentnest-net-exp", "Labels": tags(NOW - 1)},
        {"Id": "n-live", "Name": "agentnest-net-live", "Labels": tags(NOW + 3600)},
    ]
    fake.volumes_ = [
        {"Name": "v-expired", "Labels": tags(NOW - 1)},
        {"Name": "v-live", "Labels": tags(NOW + 3600)},
    ]
    return fake


def removed(fake: FakeDockerAPI) -> list[str]:
    return [rid for _, rid, _ in fake.calls]


def test_prune_removes_only_expired_managed_resources(api: FakeDockerAPI) -> None:
    report = prune(api, now=NOW)
    assert [r.id for r in report.containers] == ["c-expired"]
    assert [r.id for r in report.networks] == ["n-expired"]
    assert [r.id for r in report.volumes] == ["v-expired"]
    assert report.errors == () and report.ok
    # Containers first, so their networks and volumes are free when their turn comes.
    assert removed(api) == ["c-expired", "n-expired", "v-expired"]
    assert api.calls[0] == ("container", "c-expired", {"force": True, "v": True})
    assert report.containers[0].reason == EXPIRED
    assert report.containers[0].name == "agentnest-exp"
    assert report.containers[0].sandbox == "exp"
    assert report.containers[0].deadline == NOW - 10
    # Only AgentNest's label is ever asked for.
    assert all(f == {"label": [f"{labels.MANAGED}=true"]} for f in api.filters_seen)


def test_prune_dry_run_removes_nothing(api: FakeDockerAPI) -> None:
    report = prune(api, now=NOW, dry_run=True)
    assert api.calls == []
    assert report.dry_run
    assert [r.id for r in report.resources] == ["c-expired", "n-expired", "v-expired"]


def test_prune_everything(api: FakeDockerAPI) -> None:
    report = prune(api, now=NOW, everything=True)
    assert removed(api) == ["c-expired", "c-live", "n-expired", "n-live", "v-expired", "v-live"]
    assert {r.reason for r in report.resources} == {EVERYTHING}
    assert "c-foreign" not in removed(api)


def test_prune_orphans_only_when_asked(api: FakeDockerAPI) -> None:
    host = socket.gethostname()
    api.containers_ += [
        {"Id": "c-orphan", "Names": ["/o"], "Labels": tags(NOW + 300, owner=f"{host}:{dead_pid()}")},
        {"Id": "c-elsewhere", "Names": ["/e"], "Labels": tags(NOW + 300, owner="another-host:1")},
    ]
    assert [r.id for r in prune(api, now=NOW, dry_run=True).containers] == ["c-expired"]
    report = prune(api, now=NOW, orphans=True)
    assert [(r.id, r.reason) for r in report.containers] == [("c-expired", EXPIRED), ("c-orphan", OWNER_GONE)]
    # Our own process is alive; another host's process cannot be checked: both stay.
    assert "c-live" not in removed(api) and "c-elsewhere" not in removed(api)


@pytest.mark.parametrize("deadline", [None, "", "soon", "nan", "inf", "-inf"])
def test_prune_keeps_resources_with_unusable_deadlines(api: FakeDockerAPI, deadline: str | None) -> None:
    api.containers_ = [{"Id": "c-odd", "Names": ["/odd"], "Labels": tags(deadline)}]
    api.networks_ = api.volumes_ = []
    assert prune(api, now=NOW).containers == ()
    assert prune(api, now=NOW, everything=True).containers[0].deadline is None


def test_prune_tolerates_races_and_collects_other_errors(api: FakeDockerAPI) -> None:
    api.containers_ = [
        {"Id": f"c-{n}", "Names": [f"/c-{n}"], "Labels": tags(NOW - 1)}
        for n in ("gone", "busy", "broken", "ok")
    ]
    api.failures = {
        "c-gone": api_error(404, "No such container"),
        "c-busy": api_error(409, "removal of container c-busy is already in progress"),
        "c-broken": api_error(500, "driver failed"),
        "v-expired": api_error(409, "volume is in use"),
    }
    report = prune(api, now=NOW)
    # The failure did not stop the sweep: everything was attempted.
    assert removed(api) == ["c-gone", "c-busy", "c-broken", "c-ok", "n-expired", "v-expired"]
    assert [r.id for r in report.containers] == ["c-gone", "c-busy", "c-ok"]
    assert report.volumes == ()
    assert len(report.errors) == 2
    assert "container c-broken: driver failed" in report.errors[0]
    assert "volume v-expired: volume is in use" in report.errors[1]
    assert not report.ok


def test_prune_honours_a_deadline_moved_inside_a_running_container(api: FakeDockerAPI) -> None:
    api.containers_[0]["State"] = "running"  # c-expired, sandbox "exp"
    api.networks_[0]["Labels"] = tags(NOW - 1, sandbox="exp")
    api.extended = {"c-expired": NOW + 600}
    report = prune(api, now=NOW)
    assert report.containers == ()
    assert [r.id for r in report.networks] == []  # its sandbox still runs on it
    api.extended = {"c-expired": NOW - 5}  # moved, but passed too
    assert [r.id for r in prune(api, now=NOW).containers] == ["c-expired"]


def test_prune_report_is_frozen() -> None:
    report = PruneReport()
    with pytest.raises(AttributeError):
        report.errors = ("x",)  # type: ignore[misc]


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch, api: FakeDockerAPI) -> FakeDockerAPI:
    backend = DockerBackend()
    backend._api = api  # type: ignore[assignment]  # the fake stands in for docker-py
    monkeypatch.setattr(registry, "_shared", {"docker": backend})
    return api


def test_prune_command_dry_run(capsys: pytest.CaptureFixture[str], fake_engine: FakeDockerAPI) -> None:
    fake_engine.containers_[0]["Labels"][labels.DEADLINE] = str(time.time() - 300)
    code, out, err = run_cli(capsys, "prune", "--dry-run")
    assert code == 0, err
    assert fake_engine.calls == []
    lines = out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "SANDBOX", "REASON", "DEADLINE", "OWNER"]
    assert lines[1].split()[:5] == ["container", "agentnest-exp", "exp", "expired", "5m"]
    assert "agentnest-live" not in out
    assert lines[-1] == "would remove 1 container, 1 network, 1 volume (dry run: nothing was removed)"


def test_prune_command_reports_errors_and_fails(
    capsys: pytest.CaptureFixture[str], fake_engine: FakeDockerAPI
) -> None:
    for item in fake_engine.containers_ + fake_engine.networks_ + fake_engine.volumes_:
        item.setdefault("Labels", {})[labels.DEADLINE] = "1"  # long expired
    fake_engine.failures = {"n-live": api_error(403, "network has active endpoints")}
    code, out, err = run_cli(capsys, "prune")
    assert code == 1
    assert out.splitlines()[-1] == "removed 2 containers, 1 network, 2 volumes"
    assert err == "error: network agentnest-net-live: network has active endpoints\n"


def test_prune_command_with_nothing_to_do(
    capsys: pytest.CaptureFixture[str], fake_engine: FakeDockerAPI
) -> None:
    fake_engine.containers_ = fake_engine.networks_ = fake_engine.volumes_ = []
    code, out, _ = run_cli(capsys, "prune", "--orphans")
    assert (code, out) == (0, "nothing to prune\n")


def test_prune_render_deadlines() -> None:
    report = prune(FakeDockerAPI(), now=NOW, dry_run=True)
    assert prune_cmd.render(report, NOW) == "nothing to prune"
    assert prune_cmd._deadline(NOW - 30, NOW) == "30s ago"
    assert prune_cmd._deadline(NOW + 3 * 3600, NOW) == "in 3h"
    assert prune_cmd._deadline(None, NOW) == "-"


# -- doctor's judgement of what a sandbox saw -------------------------------------------------


GOOD_RUNC = {
    "status": {
        "Uid": "65532\t65532\t65532\t65532",
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    },
    "root_write": "Read-only file system",
    "root_options": "ro,relatime,lowerdir=x",
    "interfaces": ["lo"],
    "memory": {
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": str(512 * 2**20),
        "/sys/fs/cgroup/memory.max": None,
    },
    "pids": {"/sys/fs/cgroup/pids/pids.max": "256", "/sys/fs/cgroup/pids.max": None},
    "mem_total_kib": "24684092",
    "workspace_bytes": 256 * 2**20,
    "kernel": "6.1.0",
}


TMPFS = Workspace("/workspace", "tmpfs", 256 * 2**20, None)


def judge(
    seen: dict[str, Any],
    gvisor: bool = False,
    engine_pids: int | None = None,
    workspace: Workspace = TMPFS,
    limits: ResourceLimits | None = None,
) -> dict[str, tuple[str, str]]:
    report = doctor_cmd._Report(as_json=True)
    fake_sandbox: Any = SimpleNamespace(config=SimpleNamespace(limits=limits or ResourceLimits()))
    doctor_cmd._judge(report, "scope", fake_sandbox, seen, gvisor, engine_pids, workspace)
    return {c.name: (c.status, c.detail) for c in report.checks}


def altered(**changes: Any) -> dict[str, Any]:
    seen: dict[str, Any] = json.loads(json.dumps(GOOD_RUNC))
    for key, value in changes.items():
        if key in seen["status"]:
            seen["status"][key] = value
        else:
            seen[key] = value
    return seen


def test_doctor_judges_a_good_runc_sandbox_ok() -> None:
    results = judge(GOOD_RUNC)
    assert {status for status, _ in results.values()} == {"ok"}
    assert set(results) == {
        "non-root user",
        "no capabilities",
        "no-new-privileges",
        "seccomp filter",
        "read-only root",
        "no network",
        "memory limit",
        "process limit",
        "workspace",
        "workspace size",
    }
    assert (
        results["workspace"][1]
        == "/workspace is a tmpfs of 256.0 MiB, in memory (counted against the memory limit)"
    )


def test_doctor_says_what_the_workspace_is_not_what_was_asked() -> None:
    disk = ResourceLimits.build(workspace="8g", workspace_medium="disk")
    btrfs = Workspace("/workspace", "btrfs", 40 * 2**30, 8 * 2**30)
    results = judge(GOOD_RUNC, workspace=btrfs, limits=disk)
    assert results["workspace"] == (
        "ok",
        "/workspace is on the host's disk (btrfs), held to 8.0 GiB by a quota read on the host",
    )
    assert results["workspace size"][0] == "ok" and "8.0 GiB" in results["workspace size"][1]
    # A disk workspace asked for and a tmpfs found (or the other way round) is a failure.
    assert judge(GOOD_RUNC, workspace=TMPFS, limits=disk)["workspace"][0] == "fail"
    assert judge(GOOD_RUNC, workspace=btrfs)["workspace"][0] == "fail"
    unseen = judge(GOOD_RUNC, workspace=Workspace("/workspace", None, None, None))["workspace"]
    assert unseen == ("fail", "/workspace: its mount could not be read inside the sandbox")


def test_workspace_descriptions_come_from_what_was_seen() -> None:
    gofer = Workspace("/workspace", "9p", 40 * 2**30, None)
    assert (gofer.medium, TMPFS.medium) == ("disk", "memory")
    assert gofer.describe() == "/workspace is on the host's disk (9p); no quota was found on the host"


def test_read_workspace_reads_the_mount_and_the_quota() -> None:
    seen: list[list[str]] = []

    def exec_(argv: list[str], timeout: float) -> Any:
        seen.append(argv)
        out = json.dumps({"fstype": "btrfs", "options": "rw,subvol=/ws/x", "bytes": 40 * 2**30})
        return SimpleNamespace(ok=True, stdout=out)

    sandbox: Any = SimpleNamespace(
        config=SimpleNamespace(workdir="/workspace"),
        exec=exec_,
        handle="h",
        backend=SimpleNamespace(workspace_quota=lambda handle: 8 * 2**30 if handle == "h" else None),
    )
    assert read_workspace(sandbox) == Workspace("/workspace", "btrfs", 40 * 2**30, 8 * 2**30)
    assert seen[0][-1] == "/workspace"
    sandbox.exec = lambda argv, timeout: SimpleNamespace(ok=False, stdout="")
    assert read_workspace(sandbox).medium is None


def test_the_workspace_probe_reads_this_hosts_mount_table() -> None:
    out = subprocess.run(
        [sys.executable, "-c", workspace_probe, "/"], capture_output=True, text=True, check=True
    ).stdout
    report = json.loads(out)
    assert isinstance(report["fstype"], str) and report["bytes"] > 0


@pytest.mark.parametrize(
    ("changes", "failing"),
    [
        ({"Uid": "0\t0\t0\t0"}, "non-root user"),
        ({"CapEff": "00000000a80425fb"}, "no capabilities"),
        ({"CapBnd": "not-hex"}, "no capabilities"),
        ({"NoNewPrivs": "0"}, "no-new-privileges"),
        ({"Seccomp": "0"}, "seccomp filter"),
        ({"root_options": "rw,relatime"}, "read-only root"),
        ({"root_write": "succeeded"}, "read-only root"),
        ({"interfaces": ["lo", "eth0"]}, "no network"),
        ({"memory": {"/sys/fs/cgroup/memory.max": "max"}}, "memory limit"),
        ({"memory": {"/sys/fs/cgroup/memory.max": None}}, "memory limit"),
        ({"pids": {"/sys/fs/cgroup/pids.max": "max"}}, "process limit"),
        ({"workspace_bytes": 50 * 2**30}, "workspace size"),
    ],
)
def test_doctor_flags_each_broken_limit(changes: dict[str, Any], failing: str) -> None:
    results = judge(altered(**changes))
    assert [name for name, (status, _) in results.items() if status == "fail"] == [failing]


def test_doctor_under_gvisor_skips_what_gvisor_hides_but_checks_the_rest() -> None:
    seen = altered(
        Seccomp="0",
        memory={"/sys/fs/cgroup/memory/memory.limit_in_bytes": None},
        pids={"/sys/fs/cgroup/pids/pids.max": None},
        mem_total_kib=str(512 * 1024),
        kernel="4.4.0",
    )
    del seen["status"]["NoNewPrivs"]
    results = judge(seen, gvisor=True, engine_pids=256)
    assert results["seccomp filter"][0] == "skip" and "4.4.0" in results["seccomp filter"][1]
    assert results["no-new-privileges"][0] == "skip"
    assert results["memory limit"] == ("ok", "512.0 MiB (MemTotal: gVisor sizes its kernel to the limit)")
    assert results["process limit"][0] == "skip" and "256" in results["process limit"][1]
    # The same hidden facts on runc are failures, not skips.
    runc = judge(seen, gvisor=False)
    assert runc["seccomp filter"][0] == runc["no-new-privileges"][0] == runc["process limit"][0] == "fail"


# -- output helpers ---------------------------------------------------------------------


class _Stream:
    def __init__(self, encoding: str) -> None:
        self.encoding = encoding


def test_marks_fall_back_to_words_on_ascii_terminals() -> None:
    assert (mark(True, _Stream("utf-8")), mark(False, _Stream("utf-8"))) == ("✓", "✗")  # type: ignore[arg-type]
    assert (mark(True, _Stream("ascii")), mark(False, _Stream("ascii"))) == ("OK", "FAIL")  # type: ignore[arg-type]


def test_table_aligns_columns() -> None:
    assert table(["A", "LONGER"], [["xyz", "1"], ["q", ""]]) == "A    LONGER\nxyz  1\nq"


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (512, 1536, 256 * 2**20, 3 * 2**30)] == [
        "512 B",
        "1.5 KiB",
        "256.0 MiB",
        "3.0 GiB",
    ]


def test_demo_tour_counts_failed_checks(capsys: pytest.CaptureFixture[str]) -> None:
    from agentnest.cli.demo import _Tour

    tour = _Tour()
    tour.step("First")
    assert tour.check(True, "held", "broke") is True
    assert tour.check(False, "held", "broke") is False
    out = capsys.readouterr().out
    assert tour.failures == 1
    assert "[1/7] First" in out
    assert "✓ held" in out and "✗ broke" in out


def test_verify_judges_the_network_by_mode_and_honours_a_writable_root() -> None:
    from agentnest.verify import judge as verify_judge

    limits = ResourceLimits()

    def status_of(seen: dict[str, Any], **kwargs: Any) -> dict[str, str]:
        return {f.name: f.status for f in verify_judge(seen, limits, gvisor=False, **kwargs)}

    proxied = altered(interfaces=["lo", "eth0"], default_route=False)
    assert status_of(proxied, network="allowlist")["only the proxy"] == "ok"
    assert (
        status_of(altered(interfaces=["lo", "eth0"], default_route=True), network="allowlist")[
            "only the proxy"
        ]
        == "fail"
    )
    assert status_of(proxied)["no network"] == "fail"  # denied: any interface but lo fails
    assert status_of(altered(root_write="succeeded"), read_only=False)["read-only root"] == "skip"
    assert status_of(GOOD_RUNC, uid=1000)["non-root user"] == "fail"
    assert status_of(altered(Uid="0\t0\t0\t0"), uid=0)["non-root user"] == "fail"
