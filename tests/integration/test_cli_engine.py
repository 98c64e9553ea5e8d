"""The command line against the real engine: run, prune, doctor, image, backends, demo."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentnest.cli import main
from agentnest.runtime.docker import labels
from agentnest.runtime.docker.images import base_image, image_exists

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def api() -> Iterator[Any]:
    import docker

    client = docker.APIClient(version="auto", timeout=60)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def no_leftovers(api: Any) -> Iterator[None]:
    """Every sandbox a command created in this process is gone when it returns."""
    yield
    mine = api.containers(all=True, filters={"label": [f"{labels.OWNER}={labels.owner()}"]})
    for container in mine:
        api.remove_container(container["Id"], force=True, v=True)
    assert mine == [], "a command left containers behind"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- run ------------------------------------------------------------------------------


def test_run_streams_output_and_returns_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", "--", "sh", "-c", "echo out; echo err >&2; id -u; exit 3")
    assert code == 3
    assert out == "out\n65532\n"
    assert err == "err\n"


@pytest.mark.parametrize(("answer", "code"), [("y\n", 0), ("n\n", 1), ("", 1)])
def test_run_approve_prompt_asks_on_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, answer: str, code: int
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(answer))
    got, out, err = run_cli(capsys, "run", "--approve", "prompt", "--", "sh", "-c", "echo ran")
    assert got == code
    assert "asks to exec: sh -c 'echo ran'" in err and "allow? [y/N]" in err
    assert (out == "ran\n") is (code == 0)  # refused: the command never ran
    if code:
        assert "exec denied: the approval hook refused" in err


def test_run_with_a_profile_file(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    path = tmp_path / "agentnest.yaml"
    path.write_text("profiles:\n  tiny:\n    memory: 200m\n    workspace_size: 64m\n    scratch_size: 32m\n")
    code, out, _ = run_cli(
        capsys,
        "run",
        "--profile",
        "tiny",
        "--profile-file",
        str(path),
        "--",
        "sh",
        "-c",
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max",
    )
    assert code == 0
    assert out == f"{200 * 1024**2}\n"


def test_run_splits_a_single_string(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "run", "printf '%s|' 'a  b' c")
    assert code == 0
    assert out == "a  b|c|"


def test_run_timeout_exits_124_with_partial_output(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code, out, err = run_cli(
        capsys, "run", "--timeout", "1", "--", "sh", "-c", "echo started; sleep 30; echo never"
    )
    assert code == 124
    assert out == "started\n"
    assert "timed out after 1" in err
    assert time.monotonic() - started < 20


def test_run_reports_a_missing_program(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "run", "--", "no-such-program-here")
    assert code == 127
    assert "no-such-program-here" in err


def test_run_passes_environment_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys,
        "run",
        "--memory",
        "1g",
        "-e",
        "GREETING=hi there",
        "--",
        "sh",
        "-c",
        'echo "$GREETING"; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null '
        "|| cat /sys/fs/cgroup/memory.max",
    )
    assert code == 0
    assert out.splitlines() == ["hi there", str(2**30)]


def test_run_with_a_missing_image_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "run", "--image", "agentnest/base:no-such-tag", "--", "true")
    assert code == 1
    assert out == ""
    assert err.startswith("error: image 'agentnest/base:no-such-tag'")
    assert "agentnest image base" in err


@pytest.mark.gvisor
def test_run_on_gvisor(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "run", "--backend", "gvisor", "--", "sh", "-c", "id -u; cat /proc/version")
    assert code == 0
    assert out.splitlines()[0] == "65532"
    # gVisor's own kernel answers, not the host's.
    with open("/proc/version") as host:
        assert out.splitlines()[1] != host.read().strip()


# -- prune ------------------------------------------------------------------------------


def dead_owner() -> str:
    proc = subprocess.Popen(["true"])
    proc.wait()
    owner = f"{socket.gethostname()}:{proc.pid}"
    assert labels.owner_alive(owner) is False
    return owner


@pytest.fixture
def planted(api: Any) -> Iterator[dict[str, str]]:
    """Containers, a network and a volume labelled as AgentNest's, some expired."""
    now = time.time()
    tag = f"clitest{os.getpid()}{os.urandom(3).hex()}"
    specs = {
        "expired": (now - 120, labels.owner()),
        "live": (now + 3600, labels.owner()),
        "orphan": (now + 3600, dead_owner()),
    }
    made: dict[str, str] = {}
    try:
        for role, (deadline, owner) in specs.items():
            tags = labels.for_sandbox(f"{tag}-{role}", "docker", now - 200, deadline)
            tags[labels.OWNER] = owner
            made[role] = api.create_container(
                base_image(), command=["sleep", "60"], labels=tags, name=f"{tag}-{role}", user="65532:65532"
            )["Id"]
        api.start(made["expired"])  # a running one too: prune must force it
        expired = labels.for_sandbox(tag, "docker", now - 200, now - 120)
        made["network"] = api.create_network(f"{tag}-net", labels=expired)["Id"]
        made["volume"] = api.create_volume(f"{tag}-vol", labels=expired)["Name"]
        made["tag"] = tag
        yield made
    finally:
        for role in specs:
            if role in made:
                try:
                    api.remove_container(made[role], force=True, v=True)
                except Exception:
                    pass
        for remove, key in ((api.remove_network, "network"), (api.remove_volume, "volume")):
            if key in made:
                try:
                    remove(made[key])
                except Exception:
                    pass


def exists(api: Any, container_id: str) -> bool:
    import docker.errors

    try:
        api.inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    return True


def test_prune_dry_run_then_prune(
    capsys: pytest.CaptureFixture[str], api: Any, planted: dict[str, str]
) -> None:
    tag = planted["tag"]
    code, out, err = run_cli(capsys, "prune", "--dry-run")
    assert code == 0, err
    assert f"{tag}-expired" in out and f"{tag}-net" in out and f"{tag}-vol" in out
    assert f"{tag}-live" not in out and f"{tag}-orphan" not in out
    assert "dry run: nothing was removed" in out
    assert exists(api, planted["expired"])

    code, out, err = run_cli(capsys, "prune")
    assert code == 0, err
    assert "removed " in out.splitlines()[-1]
    assert not exists(api, planted["expired"])
    assert api.networks(names=[f"{tag}-net"]) == []
    assert all(v["Name"] != f"{tag}-vol" for v in (api.volumes().get("Volumes") or []))
    # Not expired, and an orphan only counts with --orphans.
    assert exists(api, planted["live"])
    assert exists(api, planted["orphan"])

    code, out, _ = run_cli(capsys, "prune", "--orphans")
    assert code == 0
    assert f"{tag}-orphan" in out and "owner gone" in out
    assert not exists(api, planted["orphan"])
    # Its owner (this test process) is alive and its deadline is an hour away.
    assert exists(api, planted["live"])


# -- doctor, image, backends ------------------------------------------------------------


def engine_runtimes(api: Any) -> set[str]:
    return set(api.info().get("Runtimes") or {})


def test_doctor_passes_on_a_healthy_engine(capsys: pytest.CaptureFixture[str], api: Any) -> None:
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 0, out
    assert "FAIL" not in out
    assert "OK    engine reachable" in out
    assert "docker (runc): limits enforced inside a sandbox" in out
    for name in ("non-root user", "no capabilities", "seccomp filter", "read-only root", "no network"):
        assert f"OK    {name}" in out
    assert out.rstrip().endswith("all checks passed")
    assert ("gvisor (runsc)" in out) == ("runsc" in engine_runtimes(api))
    # live-restore: OK when the engine has it, otherwise a warning (not a failure) with the fix.
    if api.info().get("LiveRestoreEnabled"):
        assert "OK    live-restore" in out
    else:
        assert "WARN  live-restore" in out and "sandboxes are stopped when dockerd restarts" in out


def test_doctor_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "doctor", "--json", "--backend", "docker")
    assert code == 0
    report = json.loads(out)
    assert report["ok"] is True
    runc = {c["name"]: c["status"] for c in report["checks"] if c["scope"].startswith("docker (runc)")}
    assert runc["memory limit"] == runc["process limit"] == runc["workspace size"] == "ok"
    assert all(c["status"] in ("ok", "skip", "warn") for c in report["checks"])
    (live_restore,) = [c for c in report["checks"] if c["name"] == "live-restore"]
    assert live_restore["status"] in ("ok", "warn")


def test_doctor_fails_for_a_runtime_the_engine_lacks(capsys: pytest.CaptureFixture[str], api: Any) -> None:
    if "kata-runtime" in engine_runtimes(api):
        pytest.skip("kata-runtime is registered here")
    code, out, _ = run_cli(capsys, "doctor", "--backend", "kata")
    assert code == 1
    assert "FAIL  create a sandbox" in out
    assert "kata-runtime" in out


def test_image_base_is_up_to_date(capsys: pytest.CaptureFixture[str], api: Any) -> None:
    if not image_exists(api, base_image()):
        pytest.skip("the base image is not built (`agentnest image base` needs root and a mirror)")
    code, out, _ = run_cli(capsys, "image", "base")
    assert code == 0
    assert out.splitlines()[-1] == f"{base_image()}: up to date (use --force to rebuild)"


def test_image_list_stars_the_default(capsys: pytest.CaptureFixture[str], api: Any) -> None:
    if not image_exists(api, base_image()):
        pytest.skip("the base image is not built")
    code, out, _ = run_cli(capsys, "image", "list")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith(base_image()))
    assert row.rstrip().endswith("*")


def test_backends_shows_runtime_registration(capsys: pytest.CaptureFixture[str], api: Any) -> None:
    code, out, _ = run_cli(capsys, "backends")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rows["docker"].rstrip().endswith("ready")
    registered = engine_runtimes(api)
    assert rows["gvisor"].rstrip().endswith("ready") == ("runsc" in registered)
    assert rows["kata"].rstrip().endswith("ready") == ("kata-runtime" in registered)


# -- demo ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["docker", pytest.param("gvisor", marks=pytest.mark.gvisor)])
def test_demo_walks_through_every_step(capsys: pytest.CaptureFixture[str], backend: str) -> None:
    code, out, _ = run_cli(capsys, "demo", "--backend", backend)
    assert code == 0, out
    for step in range(1, 8):
        assert f"[{step}/7] " in out
    assert "✗" not in out and "FAIL" not in out
    assert out.count("✓") >= 8
    assert "uid=65532" in out
    assert "ExecutionTimeoutError" in out
    assert out.rstrip().endswith("all 7 steps passed")
    # The workspace is described as the sandbox got it (its mount and the host's quota), never assumed.
    from agentnest.runtime.base import Capability
    from agentnest.runtime.registry import get_backend

    on_disk = Capability.DISK_WORKSPACE in get_backend(backend).capabilities()
    (line,) = [x for x in out.splitlines() if x.strip().startswith("workspace ")]
    if on_disk:
        assert "/workspace is on the host's disk" in line and "by a quota read on the host" in line, line
        assert "tmpfs" not in out.split("[6/7]")[0], out
    else:
        assert "/workspace is a tmpfs of 256.0 MiB" in line, line
    assert "host read it back (/workspace is " in out


def test_doctor_describes_the_workspace_the_sandbox_got(capsys: pytest.CaptureFixture[str]) -> None:
    from agentnest.runtime.base import Capability
    from agentnest.runtime.registry import get_backend

    code, out, _ = run_cli(capsys, "doctor", "--json", "--backend", "docker")
    assert code == 0, out
    (found,) = [c for c in json.loads(out)["checks"] if c["name"] == "workspace"]
    assert found["status"] == "ok"
    if Capability.DISK_WORKSPACE in get_backend("docker").capabilities():
        assert found["detail"].startswith("/workspace is on the host's disk (btrfs), held to 8.0 GiB")
    else:
        assert found["detail"].startswith("/workspace is a tmpfs of")


def test_image_browser_names_the_built_browser_image(capsys: pytest.CaptureFixture[str], api: Any) -> None:
    from agentnest.browser.image import BROWSER_IMAGE
    from agentnest.templates import LABEL

    # `make test` builds it first, so this is the cached path: a tag and nothing rebuilt.
    code, out, _ = run_cli(capsys, "image", "browser", "-q")
    assert code == 0
    tag = out.strip()
    assert tag.startswith("agentnest/template:")
    found = api.inspect_image(tag)
    assert api.inspect_image(BROWSER_IMAGE)["Id"] == found["Id"]
    assert found["Config"]["Labels"][LABEL].startswith(tag.split(":")[1])
    code, out, _ = run_cli(capsys, "image", "browser")
    assert code == 0 and out.startswith(f"{tag} ({BROWSER_IMAGE}): cached")
