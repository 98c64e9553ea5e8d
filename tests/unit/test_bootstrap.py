"""Shipping the agent and the egress proxy (runtime/bootstrap.py, launch.py): bundles, one loader, starts."""

from __future__ import annotations

import ast
import base64
import json
import os
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from agentnest.agent.wire import PROTOCOL_VERSION, Decoder
from agentnest.runtime import bootstrap, launch
from agentnest.runtime import unpack as loader

AGENT_DIR = Path(bootstrap.__file__).resolve().parent.parent / "agent"


def unpack(bundle: bytes) -> list[tuple[str, str]]:
    length, _, blob = bundle.partition(b"\n")
    assert int(length) == len(blob)
    return [(name, src) for name, src in json.loads(zlib.decompress(blob))]


def test_bundle_holds_the_agent_modules_in_load_order() -> None:
    mods = unpack(launch.bundle())
    assert [name for name, _ in mods] == list(loader.AGENT_MODULES)
    for name, src in mods:
        assert src == (AGENT_DIR / f"{name}.py").read_text("utf-8")


def test_agent_command() -> None:
    argv = bootstrap.command("agent", python="/usr/bin/python3")
    assert argv[0] == "/usr/bin/python3"
    assert "-S" in argv
    assert argv[-1] == "agent"


def test_keeper_commands_carry_a_lifetime_of_at_least_a_second() -> None:
    assert bootstrap.command("keeper", "py", 0.2)[3:] == [bootstrap.BOOTSTRAP, "keeper", "1.000"]
    for mode in ("keeper", "listen"):
        with pytest.raises(ValueError, match=f"{mode} mode needs a lifetime"):
            bootstrap.command(mode)
    argv = launch.listen_command("py", 90.5, "/run/a.sock")
    assert argv[:7] == ["py", "-S", "-c", bootstrap.BOOTSTRAP, "listen", "90.500", "/run/a.sock"]
    assert base64.b64decode(argv[7]) == launch.bundle().split(b"\n", 1)[1]
    assert len(argv) == 8


@pytest.mark.parametrize("name", loader.AGENT_MODULES)
def test_agent_modules_import_only_the_stdlib_and_each_other(name: str) -> None:
    tree = ast.parse((AGENT_DIR / f"{name}.py").read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in sys.stdlib_module_names, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level == 1, "the agent imports nothing outside agent/"
                for alias in node.names:
                    if node.module is None:
                        assert alias.name in loader.AGENT_MODULES, alias.name
            else:
                assert node.module is not None
                assert node.module.split(".")[0] in sys.stdlib_module_names, node.module


def test_bootstrap_starts_the_agent_without_agentnest_installed(tmp_path: Path) -> None:
    host, child = socket.socketpair()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AGENTNEST_WORKSPACE": str(tmp_path)}
    proc = subprocess.Popen(
        bootstrap.command("agent", python=sys.executable),
        stdin=child.fileno(),
        stdout=child.fileno(),
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    child.close()
    try:
        host.settimeout(15)
        host.sendall(launch.bundle())
        decoder = Decoder()
        deadline = time.monotonic() + 15
        frames: list[tuple[dict[str, object], bytes]] = []
        while not frames and time.monotonic() < deadline:
            data = host.recv(65536)
            assert data, "the agent exited before saying hello"
            decoder.feed(data)
            frames = decoder.frames()
        header, _ = frames[0]
        assert header["t"] == "hello"
        assert header["v"] == PROTOCOL_VERSION
        assert header["workspace"] == str(tmp_path)
        host.shutdown(socket.SHUT_WR)  # end of stream: the agent exits
        assert proc.wait(timeout=15) == 0
    finally:
        host.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


# -- one loader for every shipped program ------------------------------------------------


def test_the_agent_and_the_proxy_share_one_loader() -> None:
    from agentnest.runtime.egresslog import PROXY_MODULES, proxy_command

    assert bootstrap.BOOTSTRAP.startswith(loader.UNPACK)
    assert launch.RUN.startswith(loader.UNPACK)
    argv = proxy_command("python3", {"listen": ["127.0.0.1", 0]})
    assert argv[:4] == ["python3", "-S", "-c", launch.RUN]
    assert argv[4:6] == ["agentnest_egress", "serve"]
    egress = Path(bootstrap.__file__).resolve().parent.parent / "egress"
    mods = json.loads(zlib.decompress(base64.b64decode(argv[6])))
    assert [name for name, _ in mods] == list(PROXY_MODULES)
    for name, src in mods:
        assert src == (egress / f"{name}.py").read_text("utf-8")
    assert json.loads(argv[7]) == {"listen": ["127.0.0.1", 0]}


def test_a_bundled_program_runs_without_agentnest_installed(tmp_path: Path) -> None:
    """``program_command``: the package is defined in memory, its main's return is the exit code."""
    from agentnest.runtime.egresslog import proxy_source_blob

    argv = launch.program_command(sys.executable, "egress", proxy_source_blob(), "serve")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (2, "usage: serve.py CONFIG_JSON\n")  # main() without a config
    extra = subprocess.run([*argv, "{}", "extra"], cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert extra.returncode == 2
    bad = subprocess.run(
        [*argv, "not json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 1
    # Tracebacks name the shipped file, as the agent's do.
    assert 'File "<agentnest-egress/serve.py>"' in bad.stderr
