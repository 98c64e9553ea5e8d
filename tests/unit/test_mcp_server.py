"""agentnest mcp without an engine: the service's limits and ceilings, and its MCP face.

Sandboxes here are directories with the real agent running as a local child
process (``doubles.local_agent.LocalAgent``), so the guard, the channel
and the agent run for real; the MCP face is driven by the SDK's own client
connected in-process.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from doubles.local_agent import LocalBackend

from agentnest import (
    ConfigurationError,
    FileAccessError,
    MemoryObserver,
    MissingDependencyError,
    PolicyDeniedError,
    SandboxDestroyedError,
    SecurityPolicy,
)
from agentnest.cli import main
from agentnest.cli.mcp import check_host, settings_from_args
from agentnest.mcp import (
    MAX_TEXT_CHARS,
    SandboxService,
    ServerSettings,
    build_server,
)

pytestmark = pytest.mark.timeout(120)

IMAGE = "local-image"


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    (tmp_path / "boxes").mkdir()
    return LocalBackend(tmp_path / "boxes")


#: Small in-memory filesystems, so that clients can ask for little memory.
SMALL = {"image": IMAGE, "workspace_size": "32m", "scratch_size": "16m"}


def make(tmp_path: Path, backend: LocalBackend, **settings: Any) -> SandboxService:
    settings.setdefault("sandbox_kwargs", SMALL)
    settings.setdefault("snapshot_dir", tmp_path / "snapshots")
    return SandboxService(ServerSettings(backend=backend, **settings))


@pytest.fixture
def service(tmp_path: Path, backend: LocalBackend) -> Iterator[SandboxService]:
    svc = make(tmp_path, backend, max_sandboxes=3)
    try:
        yield svc
    finally:
        svc.close()
        assert backend.live() == set()


# -- settings and the policy ceiling ------------------------------------------------------


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="max_sandboxes"):
        ServerSettings(max_sandboxes=0)
    with pytest.raises(ConfigurationError, match="max_sandboxes"):
        ServerSettings(max_sandboxes=True)
    with pytest.raises(ConfigurationError, match="lifetime"):
        ServerSettings(lifetime=float("nan"))
    with pytest.raises(ConfigurationError, match="longer than max_lifetime"):
        ServerSettings(lifetime=700, max_lifetime=600)
    with pytest.raises(ConfigurationError, match="backend"):
        ServerSettings(sandbox_kwargs={"backend": "docker"})


def test_the_ceiling_is_the_server_settings_without_explicit_maxima(
    tmp_path: Path, backend: LocalBackend
) -> None:
    svc = make(tmp_path, backend, sandbox_kwargs={"image": IMAGE, "memory": "400m", "cpus": 0.5})
    try:
        assert svc.policy.max_memory == 400 * 2**20
        assert svc.policy.max_cpus == 0.5
        assert svc.policy.max_timeout == 3600
        assert svc.policy.allowed_images == (IMAGE,)
        assert svc.policy.max_file_bytes == 2**20
    finally:
        svc.close()


def test_an_explicit_policy_ceiling_is_kept(tmp_path: Path, backend: LocalBackend) -> None:
    policy = SecurityPolicy(max_memory="1g", max_cpus=2, max_timeout=900, allowed_images=("local-*",))
    svc = make(tmp_path, backend, policy=policy)
    try:
        assert svc.policy.max_memory == 2**30
        assert svc.policy.max_cpus == 2
        assert svc.policy.max_timeout == 900
        assert svc.policy.allowed_images == ("local-*",)
    finally:
        svc.close()
    with pytest.raises(ConfigurationError, match="max_timeout"):
        make(tmp_path, backend, policy=SecurityPolicy(max_timeout=60))  # default lifetime 600


def test_a_client_may_narrow_but_never_widen(service: SandboxService, backend: LocalBackend) -> None:
    small = service.create_sandbox(memory="128m", cpus=0.5, timeout=60)
    assert small["memory"] == 128 * 2**20 and small["cpus"] == 0.5
    assert 0 < small["expires_in"] <= 60
    refused: list[tuple[dict[str, Any], str]] = [
        ({"memory": "4g"}, "max_memory"),
        ({"cpus": 8}, "max_cpus"),
        ({"timeout": 7200}, "max_timeout"),
        ({"image": "attacker/miner:latest"}, "allowed_images"),
    ]
    for kwargs, match in refused:
        with pytest.raises(PolicyDeniedError, match=match):
            service.create_sandbox(**kwargs)
    assert backend.created == [small["sandbox_id"]]  # nothing else was created
    denied = [e for e in service.audit() if e["type"] == "policy.denied"]
    assert len(denied) == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"memory": "lots"}, "memory"),
        ({"memory": True}, "memory"),
        ({"cpus": -1}, "cpus"),
        ({"cpus": "1"}, "cpus"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"image": 3}, "image"),
    ],
)
def test_bad_create_arguments(
    service: SandboxService, backend: LocalBackend, kwargs: Any, match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        service.create_sandbox(**kwargs)
    assert backend.created == []


def test_the_number_of_sandboxes_is_limited(service: SandboxService, backend: LocalBackend) -> None:
    first = service.create_sandbox()["sandbox_id"]
    service.create_sandbox()
    service.fork(first)  # a fork counts too
    assert service.list_sandboxes()["available"] == 0
    with pytest.raises(PolicyDeniedError, match="3 of at most 3"):
        service.create_sandbox()
    with pytest.raises(PolicyDeniedError, match="at most 3"):
        service.fork(first)
    assert len(backend.created) == 3
    service.destroy(first)
    assert first not in backend.live()
    assert service.list_sandboxes()["available"] == 1
    service.create_sandbox()


def test_concurrent_creations_never_pass_the_limit(service: SandboxService, backend: LocalBackend) -> None:
    outcomes: list[str] = []

    def create() -> None:
        try:
            service.create_sandbox()
            outcomes.append("ok")
        except PolicyDeniedError:
            outcomes.append("denied")

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["denied"] * 3 + ["ok"] * 3
    assert len(backend.created) == 3


def test_an_expired_sandbox_is_removed_and_frees_its_slot(tmp_path: Path, backend: LocalBackend) -> None:
    svc = make(tmp_path, backend, max_sandboxes=1)
    try:
        sid = svc.create_sandbox(timeout=1)["sandbox_id"]
        deadline = time.time() + 1
        while time.time() < deadline + 0.05:  # the condition itself: its deadline has passed
            time.sleep(0.05)
        with pytest.raises(SandboxDestroyedError, match="lifetime"):
            svc.exec_shell(sid, "true")
        assert sid not in backend.live()
        assert svc.list_sandboxes()["available"] == 1
        svc.create_sandbox()
    finally:
        svc.close()


# -- ids and names ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "x" * 65, " abc", "abc\n", 7, None, ["abc"]])
def test_bad_sandbox_ids_are_refused(service: SandboxService, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="not a sandbox id"):
        service.exec_shell(bad, "true")
    with pytest.raises(ConfigurationError, match="not a sandbox id"):
        service.destroy(bad)


def test_an_unknown_id_names_the_fix(service: SandboxService) -> None:
    with pytest.raises(ConfigurationError, match="list_sandboxes"):
        service.read_file("0123456789ab", "x")
    sid = service.create_sandbox()["sandbox_id"]
    service.destroy(sid)
    with pytest.raises(ConfigurationError, match="no sandbox"):
        service.exec_shell(sid, "true")
    with pytest.raises(ConfigurationError, match="no sandbox"):
        service.destroy(sid)


@pytest.mark.parametrize(
    "bad", ["", "../x", "a/b", ".hidden", "x" * 65, "/etc/passwd", "a\0b", "-rf", "..", 5]
)
def test_bad_snapshot_names_are_refused(service: SandboxService, tmp_path: Path, bad: Any) -> None:
    sid = service.create_sandbox()["sandbox_id"]
    with pytest.raises(ConfigurationError, match="snapshot name"):
        service.snapshot(sid, bad)
    with pytest.raises(ConfigurationError, match="snapshot name"):
        service.restore(sid, bad)
    folder = tmp_path / "snapshots"
    assert not folder.exists() or list(folder.iterdir()) == []


def test_snapshot_and_restore_stay_in_the_server_directory(service: SandboxService, tmp_path: Path) -> None:
    sid = service.create_sandbox()["sandbox_id"]
    service.write_file(sid, "keep.txt", "v1")
    meta = service.snapshot(sid, "base.v1")
    assert meta["name"] == "base.v1" and meta["files"] >= 1 and len(meta["sha256"]) == 64
    assert "path" not in meta  # the host path is the server's business
    folder = tmp_path / "snapshots"
    assert [p.name for p in folder.iterdir()] == ["base.v1.tar"]
    service.write_file(sid, "keep.txt", "v2")
    service.write_file(sid, "new.txt", "x")
    assert service.restore(sid, "base.v1")["restored"] is True
    assert service.read_file(sid, "keep.txt")["content"] == "v1"
    names = [e["path"] for e in service.list_files(sid)["entries"]]
    assert names == ["keep.txt"]
    with pytest.raises(ConfigurationError, match="no snapshot named 'other'"):
        service.restore(sid, "other")
    again = service.snapshot(sid, "base.v1")  # a name reused replaces the snapshot
    assert again["files"] == meta["files"]
    assert [p.name for p in folder.iterdir()] == ["base.v1.tar"]


def test_a_private_snapshot_directory_is_0700_and_removed_at_close(
    tmp_path: Path, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    svc = SandboxService(ServerSettings(backend=backend, sandbox_kwargs={"image": IMAGE}))
    sid = svc.create_sandbox()["sandbox_id"]
    svc.snapshot(sid, "one")
    folder = svc.snapshot_dir
    assert folder.parent == tmp_path / "state" / "agentnest" / "mcp-snapshots"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert (folder / "one.tar").is_file()
    svc.close()
    assert not folder.exists()
    assert backend.live() == set()


def test_snapshot_errors_do_not_show_the_host_directory(service: SandboxService, tmp_path: Path) -> None:
    sid = service.create_sandbox()["sandbox_id"]
    folder = tmp_path / "snapshots"
    folder.mkdir()
    (folder / "broken.tar").write_bytes(b"not a tar at all" * 10)
    with pytest.raises(Exception) as info:
        service.restore(sid, "broken")
    assert str(folder) not in str(info.value)


# -- commands, sessions, files ------------------------------------------------------------


def test_exec_results_are_json_ready_and_bounded(service: SandboxService) -> None:
    sid = service.create_sandbox()["sandbox_id"]
    result = service.exec_shell(sid, "echo out; echo err >&2; exit 3")
    assert result["exit_code"] == 3
    assert result["stdout"] == "out\n" and result["stderr"] == "err\n"
    assert result["timed_out"] is False and result["truncated"] is False
    json.dumps(result)
    big = service.exec_python(sid, f"print('a' * 1000 + 'b' * {MAX_TEXT_CHARS * 2} + 'z' * 1000)")
    assert big["truncated"] is True
    assert len(big["stdout"]) < MAX_TEXT_CHARS + 100
    assert big["stdout"].startswith("a" * 1000) and big["stdout"].rstrip().endswith("z" * 1000)
    assert "characters cut by agentnest mcp" in big["stdout"]


def test_a_timed_out_command_is_an_outcome_not_an_error(service: SandboxService) -> None:
    sid = service.create_sandbox()["sandbox_id"]
    result = service.exec_shell(sid, "echo started; sleep 30", timeout=0.5)
    assert result["timed_out"] is True
    assert result["stdout"] == "started\n"
    with pytest.raises(ConfigurationError, match="over the limit"):
        service.exec_shell(sid, "true", timeout=10_000)
    assert service.exec_shell(sid, "echo alive")["stdout"] == "alive\n"


def test_session_run_keeps_state_per_sandbox(service: SandboxService) -> None:
    a = service.create_sandbox()["sandbox_id"]
    b = service.create_sandbox()["sandbox_id"]
    assert service.session_run(a, "x = 41")["ok"] is True
    out = service.session_run(a, "print('hi'); x + 1")
    assert out["result"] == "42" and out["stdout"] == "hi\n" and out["ok"] is True
    assert service.list_sandboxes()["sandboxes"][0]["session_open"] is True
    other = service.session_run(b, "x")
    assert other["ok"] is False and "NameError" in other["error"]
    slow = service.session_run(a, "import time; time.sleep(30)", timeout=0.5)
    assert slow["timed_out"] is True
    assert service.session_run(a, "x")["result"] == "41"  # the session survived its timeout


def test_a_lost_session_is_replaced_on_the_next_call(service: SandboxService) -> None:
    sid = service.create_sandbox()["sandbox_id"]
    service.session_run(sid, "y = 1")
    with pytest.raises(Exception, match="fresh interpreter"):
        service.session_run(sid, "import os; os._exit(1)")
    fresh = service.session_run(sid, "'y' in dir()")
    assert fresh["result"] == "False"


def test_files_round_trip_with_bounds(service: SandboxService) -> None:
    sid = service.create_sandbox()["sandbox_id"]
    assert service.write_file(sid, "dir/a.txt", "héllo") == {"path": "dir/a.txt", "size": 6}
    assert service.read_file(sid, "dir/a.txt")["content"] == "héllo"
    listing = service.list_files(sid, ".", recursive=True)
    assert [(e["path"], e["type"]) for e in listing["entries"]] == [("dir", "dir"), ("dir/a.txt", "file")]
    assert listing["truncated"] is False
    with pytest.raises(FileAccessError, match="for one write through MCP"):
        service.write_file(sid, "big.txt", "x" * (2**20 + 1))
    with pytest.raises(ConfigurationError, match="content must be a string"):
        service.write_file(sid, "b.bin", b"bytes")  # type: ignore[arg-type]
    with pytest.raises(FileAccessError):
        service.write_file(sid, "../escape.txt", "x")
    service.exec_python(sid, "open('bin.dat', 'wb').write(bytes([0xff, 0xfe, 0]))")
    with pytest.raises(FileAccessError, match="base64"):
        service.read_file(sid, "bin.dat")
    with pytest.raises(ConfigurationError, match="recursive"):
        service.list_files(sid, ".", recursive="yes")  # type: ignore[arg-type]


def test_list_files_is_bounded(service: SandboxService) -> None:
    sid = service.create_sandbox()["sandbox_id"]
    service.exec_python(sid, "import os\nfor i in range(1005): open('f%04d' % i, 'w').close()")
    listing = service.list_files(sid)
    assert len(listing["entries"]) == 1000 and listing["truncated"] is True


def test_events_feed_the_bounded_audit(service: SandboxService) -> None:
    a = service.create_sandbox()["sandbox_id"]
    b = service.create_sandbox()["sandbox_id"]
    service.exec_shell(a, "echo hi")
    service.write_file(b, "f", "x")
    types_a = [e["type"] for e in service.audit(a)]
    assert types_a[0] == "sandbox.created" and "exec.started" in types_a and "file.written" not in types_a
    assert {e["sandbox_id"] for e in service.audit()} == {a, b}
    assert len(service.audit(limit=2)) == 2
    assert service.knows(a) and not service.knows("feedfeedfeed")
    service.destroy(a)
    assert service.knows(a)  # its events are still kept
    assert service.audit(a)[-1]["type"] == "sandbox.destroyed"


def test_extra_observers_get_every_event(tmp_path: Path, backend: LocalBackend) -> None:
    memory = MemoryObserver()
    svc = make(tmp_path, backend, observers=(memory,))
    try:
        sid = svc.create_sandbox()["sandbox_id"]
        svc.exec_shell(sid, "true")
    finally:
        svc.close()
    assert memory.types()[:2] == ["sandbox.created", "exec.started"]
    assert memory.types()[-1] == "sandbox.destroyed"


def test_close_destroys_every_sandbox_and_refuses_new_ones(tmp_path: Path, backend: LocalBackend) -> None:
    svc = make(tmp_path, backend)
    ids = {svc.create_sandbox()["sandbox_id"] for _ in range(3)}
    svc.session_run(next(iter(ids)), "1")
    svc.close()
    assert backend.live() == set()
    assert set(backend.destroyed) == ids
    with pytest.raises(SandboxDestroyedError, match="shutting down"):
        svc.create_sandbox()


# -- the MCP face, through the SDK's in-process client ----------------------------------------

mcp_client = pytest.importorskip("mcp")

TOOLS = {
    "create_sandbox",
    "exec_shell",
    "exec_python",
    "session_run",
    "read_file",
    "write_file",
    "list_files",
    "fork",
    "snapshot",
    "restore",
    "destroy",
    "list_sandboxes",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def resource_json(result: Any) -> Any:
    (content,) = result.contents
    assert content.mime_type == "application/json"
    return json.loads(content.text)


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


@pytest.mark.anyio
async def test_tools_and_resources_are_listed_with_schemas(service: SandboxService) -> None:
    from mcp import Client

    async with Client(build_server(service)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        schema = tools["exec_shell"].input_schema
        assert schema["required"] == ["sandbox_id", "command"]
        assert "description" in schema["properties"]["command"]
        assert tools["destroy"].annotations is not None and tools["destroy"].annotations.destructive_hint
        assert tools["read_file"].annotations is not None and tools["read_file"].annotations.read_only_hint
        resources = [str(r.uri) for r in (await client.list_resources()).resources]
        assert resources == ["agentnest://audit"]
        templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
        assert templates == ["agentnest://sandboxes/{sandbox_id}/audit"]


@pytest.mark.anyio
async def test_tool_calls_return_structured_json(service: SandboxService) -> None:
    from mcp import Client

    async with Client(build_server(service)) as client:
        created = await client.call_tool("create_sandbox", {"timeout": 120})
        assert not created.is_error
        sid = created.structured_content["sandbox_id"]
        assert json.loads(text_of(created))["sandbox_id"] == sid
        ran = await client.call_tool("exec_shell", {"sandbox_id": sid, "command": "echo $((6*7))"})
        assert ran.structured_content["stdout"] == "42\n" and ran.structured_content["exit_code"] == 0
        listed = await client.call_tool("list_sandboxes", {})
        assert [s["sandbox_id"] for s in listed.structured_content["sandboxes"]] == [sid]
        audit = await client.read_resource(f"agentnest://sandboxes/{sid}/audit")
        events = resource_json(audit)["events"]
        assert [e["type"] for e in events][:2] == ["sandbox.created", "exec.started"]
        everything = resource_json(await client.read_resource("agentnest://audit"))
        assert {e["sandbox_id"] for e in everything["events"]} == {sid}


@pytest.mark.anyio
async def test_errors_are_tool_errors_and_the_server_keeps_serving(
    service: SandboxService, backend: LocalBackend
) -> None:
    from mcp import Client

    async with Client(build_server(service)) as client:
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("exec_shell", {"sandbox_id": "nope", "command": "true"}, "no sandbox 'nope'"),
            ("exec_shell", {"sandbox_id": "../../x", "command": "true"}, "not a sandbox id"),
            ("exec_shell", {"sandbox_id": 5, "command": "true"}, "sandbox_id"),
            ("exec_shell", {"command": "true"}, "sandbox_id"),
            ("exec_shell", {"sandbox_id": "abc", "command": "true", "timeout": "soon"}, "timeout"),
            ("exec_shell", {"sandbox_id": "abc", "command": "true", "timeout": -1}, "timeout"),
            ("create_sandbox", {"memory": "64g"}, "PolicyDeniedError"),
            ("create_sandbox", {"image": "evil/image"}, "allowed_images"),
            ("snapshot", {"sandbox_id": "abc", "name": "../../etc/x"}, "name"),
            ("no_such_tool", {}, "no_such_tool"),
        ]
        for name, arguments, match in cases:
            result = await client.call_tool(name, arguments)
            assert result.is_error, (name, arguments)
            assert match in text_of(result), (name, text_of(result))
        assert backend.created == []
        sid = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        big = await client.call_tool(
            "write_file", {"sandbox_id": sid, "path": "f", "content": "x" * (2**20 + 1)}
        )
        assert big.is_error and "FileAccessError" in text_of(big)
        ok = await client.call_tool("exec_python", {"sandbox_id": sid, "code": "print(1 + 1)"})
        assert ok.structured_content["stdout"] == "2\n"
        with pytest.raises(Exception, match="no sandbox"):
            await client.read_resource("agentnest://sandboxes/feedfeedfeed/audit")


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch, service: SandboxService) -> None:
    monkeypatch.setitem(sys.modules, "mcp.server.mcpserver", None)
    with pytest.raises(MissingDependencyError, match=r"agentnest\[mcp\]"):
        build_server(service)


def test_importing_agentnest_and_its_cli_does_not_import_mcp() -> None:
    code = (
        "import sys, agentnest, agentnest.cli, agentnest.mcp, agentnest.cli.mcp\n"
        "assert not any(m == 'mcp' or m.startswith('mcp.') for m in sys.modules), 'mcp imported'\n"
        "assert 'pydantic' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- the command line ----------------------------------------------------------------------


def test_mcp_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--transport", "--max-sandboxes", "--profile", "--audit-log", "--snapshot-dir"):
        assert option in out


@pytest.mark.parametrize(
    "argv",
    [
        ["mcp", "--transport", "carrier-pigeon"],
        ["mcp", "--max-sandboxes", "0"],
        ["mcp", "--port", "70000"],
        ["mcp", "--lifetime", "-5"],
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com", "::", "127.0.0.2"])
def test_http_refuses_non_loopback_addresses(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "--transport", "http", "--host", host, "--no-audit-log"]) == 2
    assert "loopback" in capsys.readouterr().err


def test_loopback_addresses_are_accepted() -> None:
    for host in ("127.0.0.1", "::1", "localhost"):
        assert check_host(host) == host


def test_options_become_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentnest.cli import build_parser

    pytest.importorskip("yaml")
    profiles = tmp_path / "agentnest.yaml"
    profiles.write_text(
        "profiles:\n"
        "  small:\n"
        "    image: local-image\n"
        "    memory: 400m\n"
        "    timeout: 300\n"
        "    max_memory: 1g\n"
        "    backend: gvisor\n"
    )
    args = build_parser().parse_args(
        [
            "mcp",
            "--profile",
            "small",
            "--profile-file",
            str(profiles),
            "--max-sandboxes",
            "2",
            "--no-audit-log",
        ]
    )
    settings = settings_from_args(args)
    assert settings.backend == "gvisor" and settings.lifetime == 300 and settings.max_sandboxes == 2
    assert settings.sandbox_kwargs["memory"] == 400 * 2**20
    assert settings.policy.max_memory == 2**30
    assert settings.observers == ()
    args = build_parser().parse_args(["mcp", "--backend", "docker", "--audit-log", str(tmp_path / "a.jsonl")])
    settings = settings_from_args(args)
    assert settings.backend == "docker" and settings.lifetime == 600
    (observer,) = settings.observers
    assert Path(observer.path) == tmp_path / "a.jsonl"
    assert settings.presets == ()  # no browser sandboxes unless the operator says so
    args = build_parser().parse_args(
        ["mcp", "--no-audit-log", "--allow-preset", "browser", "--allow-preset", "browser"]
    )
    assert settings_from_args(args).presets == ("browser",)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["mcp", "--allow-preset", "chrome"])
    args = build_parser().parse_args(["mcp", "--no-audit-log", "--audit-log", "x"])
    with pytest.raises(ConfigurationError, match="either"):
        settings_from_args(args)
