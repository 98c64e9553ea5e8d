"""The Docker sandbox container's hardening: golden files, purity, and that the backend applies it.

Golden files live in ``tests/unit/golden/docker/``: each is exactly what
:func:`agentnest.runtime.docker.hardening.container` hands docker-py for one
representative sandbox.  After an intended change, regenerate them and review
the diff::

    AGENTNEST_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_docker_hardening.py

The keeper's argv (the bootstrap and the agent's sources) and the seccomp
profile's JSON are long; the golden scenarios pass short stand-ins so the
files stay readable, and separate tests check that the backend passes the
real ones (the profile itself is proven on the engine by
tests/integration/test_defaults.py and tests/escapes/test_kernel.py).
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.errors import UnsupportedCapabilityError
from agentnest.policy import NetworkPolicy
from agentnest.runtime import bootstrap
from agentnest.runtime.docker import DockerBackend, DockerSpec, hardening, seccomp
from agentnest.runtime.docker.gpus import GPURequest
from agentnest.runtime.docker.hardening import EgressNetwork, WorkspaceBind
from agentnest.secrets import Secret

GOLDEN = Path(__file__).parent / "golden" / "docker"
UPDATE = os.environ.get("AGENTNEST_UPDATE_GOLDEN") == "1"
SANDBOX = "0123456789ab"
COMMAND = ["python3", "-S", "-c", "<bootstrap>", "keeper", "300.000"]
SECCOMP = "<seccomp profile JSON>"
LABELS = {
    "agentnest.managed": "true",
    "agentnest.sandbox": SANDBOX,
    "agentnest.owner": "laptop:4242",
    "agentnest.created": "1800000000.000",
    "agentnest.deadline": "1800000300.000",
    "agentnest.backend": "docker",
    "agentnest.version": "0.0.0",
    "agentnest.role": "sandbox",
}
EGRESS = EgressNetwork(
    name="agentnest-egress-0123456789ab",
    sandbox_ip="172.30.0.2",
    proxy_ip="172.30.0.3",
    environment={
        "HTTP_PROXY": "http://172.30.0.3:3128",
        "HTTPS_PROXY": "http://172.30.0.3:3128",
        "NO_PROXY": "localhost,127.0.0.1,::1",
    },
)


def _plan(config: SandboxConfig, **facts: Any) -> hardening.ContainerPlan:
    kwargs: dict[str, Any] = {
        "name": f"agentnest-{SANDBOX}",
        "command": COMMAND,
        "labels": LABELS,
        "oci_runtime": "runc",
        "gvisor": False,
        "seccomp_profile": SECCOMP,
    }
    kwargs.update(facts)
    return hardening.container(config, **kwargs)


def _runc() -> hardening.ContainerPlan:
    return _plan(SandboxConfig(image="python:3.12-slim"))


def _runsc() -> hardening.ContainerPlan:
    config = SandboxConfig(image="python:3.12-slim", limits=ResourceLimits.build(memory="1g", pids=128))
    return _plan(config, oci_runtime="runsc", gvisor=True)


def _allowlist() -> hardening.ContainerPlan:
    config = SandboxConfig(
        image="python:3.12-slim",
        environment={"MODE": "ci", "API_TOKEN": Secret("s3cret"), "KEY": Secret("file", as_file=True)},
        network=NetworkPolicy.allowlist(["pypi.org"]),
        labels={"example.com/team": "ml"},
    )
    return _plan(config, egress=EGRESS)


def _gpus() -> hardening.ContainerPlan:
    config = SandboxConfig(image="example/cuda:12.4", limits=ResourceLimits(gpus=2))
    gpu = GPURequest(count=2, driver="nvidia", environment={"NVIDIA_VISIBLE_DEVICES": "0,1"})
    return _plan(config, gpu=gpu)


def _disk() -> hardening.ContainerPlan:
    config = SandboxConfig(
        image="python:3.12-slim",
        limits=ResourceLimits.build(memory="2g", cpus=1.5, workspace="10g", workspace_medium="disk"),
        user="1000:1000",
    )
    return _plan(config, workspace=WorkspaceBind("/var/lib/agentnest/pool/ws/" + SANDBOX))


def _memory_workspace() -> hardening.ContainerPlan:
    config = SandboxConfig(
        image="python:3.12-slim",
        limits=ResourceLimits.build(
            memory="512m",
            workspace="128m",
            scratch="32m",
            workspace_medium="memory",
        ),
    )
    return _plan(config)


def _writable_root() -> hardening.ContainerPlan:
    config = SandboxConfig(
        image="python:3.12-slim",
        read_only_root=False,
        apparmor_profile="agentnest-default",
        preset="browser",
    )
    return _plan(config, oci_runtime="runsc", gvisor=True)


SCENARIOS: dict[str, Callable[[], hardening.ContainerPlan]] = {
    "default-runc": _runc,
    "runsc": _runsc,
    "allowlist": _allowlist,
    "gpus": _gpus,
    "disk-workspace": _disk,
    "memory-workspace": _memory_workspace,
    "writable-root-browser-gvisor": _writable_root,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden(name: str) -> None:
    document = SCENARIOS[name]().as_json()
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    assert path.exists(), f"{path} is missing; run with AGENTNEST_UPDATE_GOLDEN=1 (see this file's docstring)"
    assert json.loads(path.read_text(encoding="utf-8")) == document, (
        f"{path.name} differs from what the builder makes: the sandbox container's hardening changed. "
        "If that is intended, regenerate with AGENTNEST_UPDATE_GOLDEN=1 .venv/bin/python -m pytest "
        "tests/unit/test_docker_hardening.py and review the diff"
    )


def test_no_golden_file_is_left_without_a_scenario() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(SCENARIOS)


# -- what every scenario keeps ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_sandbox_keeps_the_invariants(name: str) -> None:
    plan = SCENARIOS[name]()
    host = plan.host_config
    assert host["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in host["security_opt"]
    assert f"seccomp={SECCOMP}" in host["security_opt"]
    assert host["memswap_limit"] == host["mem_limit"] > 0  # no swap
    assert host["pids_limit"] > 0 and host["nano_cpus"] > 0
    assert host["init"] is False and host["ipc_mode"] == "private" and host["oom_score_adj"] == 500
    assert host["log_config"] == {"Type": "none", "Config": {}}
    assert {"Name": "core", "Soft": 0, "Hard": 0} in host["ulimits"]
    assert "size=" in host["tmpfs"]["/tmp"] and "nosuid,nodev" in host["tmpfs"]["/tmp"]
    assert plan.create["use_config_proxy"] is False and plan.create["stdin_open"] is True
    assert plan.user != "0" and not plan.user.startswith("0:")
    assert plan.create["labels"]["agentnest.sandbox"] == SANDBOX


def test_network_modes() -> None:
    assert _runc().host_config["network_mode"] == "none" and _runc().host_config["dns"] is None
    open_ = _plan(SandboxConfig(image="i", network=NetworkPolicy.open()))
    assert open_.host_config["network_mode"] == "bridge"
    plan = _allowlist()
    assert plan.host_config["network_mode"] == EGRESS.name
    assert plan.host_config["dns"] == [EGRESS.proxy_ip]  # where nothing answers DNS
    assert plan.create["networking_config"] == {
        "EndpointsConfig": {EGRESS.name: {"IPAMConfig": {"IPv4Address": EGRESS.sandbox_ip}}}
    }


def test_a_disk_workspace_needs_its_bind_mount() -> None:
    config = SandboxConfig(image="i", limits=ResourceLimits.build(workspace_medium="disk"))
    with pytest.raises(ValueError, match="bind mount"):
        _plan(config)
    spare = _plan(config, workspace=WorkspaceBind("/pool/slots/x", slot=True))
    (mount,) = spare.host_config["mounts"]
    assert mount["BindOptions"] == {"Propagation": "rslave"}  # host to container, never back
    assert config.workdir not in spare.host_config["tmpfs"]


def test_confinement_the_engine_cannot_honour_is_refused() -> None:
    hardening.check_confinement(SandboxConfig(image="i"), [])
    with pytest.raises(UnsupportedCapabilityError, match="rootless"):
        hardening.check_confinement(SandboxConfig(image="i", rootless=True), ["name=seccomp"])
    hardening.check_confinement(SandboxConfig(image="i", rootless=True), ["name=rootless"])
    with pytest.raises(UnsupportedCapabilityError, match="AppArmor"):
        hardening.check_confinement(SandboxConfig(image="i", apparmor_profile="p"), ["name=seccomp"])
    hardening.check_confinement(SandboxConfig(image="i", apparmor_profile="p"), ["name=apparmor"])


def test_gvisor_gets_headroom_and_per_process_rlimits() -> None:
    assert hardening.pids_ceiling(100, gvisor=False) == 100
    assert hardening.pids_ceiling(100, gvisor=True) == 100 * 6 + 512
    names = [u["Name"] for u in _runsc().host_config["ulimits"]]
    assert names == ["core", "nofile", "nproc", "as"]
    assert [u["Name"] for u in _runc().host_config["ulimits"]] == ["core", "nofile"]
    # No address-space limit for a browser (Chromium reserves tens of GiB) or GPUs (CUDA).
    assert "as" not in [u["Name"] for u in _writable_root().host_config["ulimits"]]


# -- pure ---------------------------------------------------------------------------------------------

FORBIDDEN = {"socket", "subprocess", "threading", "docker", "requests", "kubernetes", "httpx", "fastapi"}


def test_the_builder_is_pure() -> None:
    """hardening.py imports no socket, process, thread, engine or web library (nor in functions)."""
    tree = ast.parse(Path(hardening.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("open", "__import__"):
            raise AssertionError(f"hardening.py calls {node.func.id}()")  # type: ignore[attr-defined]
    assert not imported & FORBIDDEN, imported & FORBIDDEN


# -- the backend applies it -----------------------------------------------------------------------------


class Created(Exception):
    """Stops the backend right after create_container."""


class RecordingAPI:
    """docker-py's APIClient at the edge: records what the backend hands it."""

    def __init__(self) -> None:
        self.host_config: dict[str, Any] = {}
        self.container: dict[str, Any] = {}

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        self.host_config = kwargs
        return {"recorded": True}

    def create_container(self, **kwargs: Any) -> dict[str, str]:
        self.container = kwargs
        raise Created


def _backend(oci_runtime: str) -> tuple[DockerBackend, RecordingAPI]:
    backend = DockerBackend(DockerSpec(oci_runtime=oci_runtime, storage=""))
    api = RecordingAPI()
    backend._api = api  # type: ignore[assignment]  # the fake stands in for docker-py
    backend._info = {
        "Runtimes": {"runc": {}, "runsc": {"runtimeArgs": ["--oci-seccomp"]}},
        "SecurityOptions": ["name=seccomp,profile=default"],
        "Architecture": "x86_64",
    }
    backend._known_images.add("img")
    return backend, api


@pytest.mark.parametrize("oci_runtime", ["runc", "runsc"])
def test_the_backend_applies_the_builder(oci_runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, api = _backend(oci_runtime)
    monkeypatch.setattr("os.urandom", lambda n: bytes.fromhex(SANDBOX)[:n])
    config = SandboxConfig(image="img", labels={"team": "ml"})
    with pytest.raises(Created):
        backend.create(config)
    gvisor = oci_runtime == "runsc"
    created = float(api.container["labels"]["agentnest.created"])
    deadline = float(api.container["labels"]["agentnest.deadline"])
    expected = hardening.container(
        config,
        name=f"agentnest-{SANDBOX}",
        command=bootstrap.command("keeper", backend.spec.python, deadline - created),
        labels={k: v for k, v in api.container["labels"].items() if k != "team"},
        oci_runtime=oci_runtime,
        gvisor=gvisor,
        seccomp_profile=seccomp.profile_json("x86_64", gvisor=gvisor),
    )
    assert api.host_config == expected.host_config
    assert {**api.container, "host_config": None} == {**expected.create, "host_config": None}
    assert api.container["host_config"] == {"recorded": True}


def test_the_backend_refuses_before_creating_anything() -> None:
    backend, api = _backend("runc")
    with pytest.raises(UnsupportedCapabilityError, match="rootless"):
        backend.create(SandboxConfig(image="img", rootless=True))
    assert api.host_config == {} and api.container == {}
