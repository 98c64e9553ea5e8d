"""The Docker sandbox container's hardening: golden files, purity, and that the backend applies it.

Golden files live in ``tests/unit/golden/docker/``: each is exactly what
:func:`agentnest.runtime.docker.hardening.container` hands docker-py for one
representative sandbox, and, for an allowlist, what
:func:`~agentnest.runtime.docker.hardening.proxy_container`,
:func:`~agentnest.runtime.docker.hardening.proxy_config` and
:func:`~agentnest.runtime.docker.hardening.egress_network` hand it for the proxy
and the sandbox's internal network.  After an intended change, regenerate them
and review the diff::

    AGENTNEST_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_docker_hardening.py

The keeper's argv (the bootstrap and the agent's sources) and the seccomp
profile's JSON are long; the golden scenarios pass short stand-ins so the
files stay readable, and separate tests check that the backend passes the
real ones (the profile itself is proven on the engine by
tests/integration/test_defaults.py and tests/escapes/test_kernel.py).
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.errors import UnsupportedCapabilityError
from agentnest.policy import NetworkPolicy
from agentnest.runtime import bootstrap
from agentnest.runtime.docker import DockerBackend, DockerSpec, egress, hardening
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


# -- the egress proxy and the sandbox's internal network ------------------------------------

PROXY_COMMAND = ["python3", "-I", "-S", "-c", "<proxy loader>", "<proxy config JSON>"]
NETWORK = f"agentnest-{SANDBOX}-net"
SUBNET = "198.18.0.8/29"
PROXY_LABELS = {**LABELS, "agentnest.role": "proxy"}


def _proxy_plan() -> hardening.ContainerPlan:
    return hardening.proxy_container(
        name=f"agentnest-{SANDBOX}-proxy",
        image="python:3.12-slim",
        command=PROXY_COMMAND,
        labels=PROXY_LABELS,
        network=NETWORK,
        proxy_ip="198.18.0.10",
        oci_runtime="runc",
        arch="x86_64",
    )


def _proxy_config() -> dict[str, Any]:
    policy = NetworkPolicy.allowlist(["pypi.org"], cidrs=["10.1.2.0/24"], ports=[443, 8443])
    hosts = {"files.example": "10.1.2.3"}
    return hardening.proxy_config(
        policy, proxy_ip="198.18.0.10", subnet=SUBNET, hosts=hosts, deadline=1800000300.0
    )


def _egress_proxy() -> dict[str, Any]:
    document = _proxy_plan().as_json()
    # The profile is AgentNest's own (checked below); the file shows a stand-in.
    opts = document["host_config"]["security_opt"]
    document["host_config"]["security_opt"] = [
        f"seccomp={SECCOMP}" if o.startswith("seccomp=") else o for o in opts
    ]
    return {**document, "proxy_config": _proxy_config()}


def _egress_network() -> dict[str, Any]:
    labels = {**LABELS, "agentnest.role": "egress-network"}
    return {"create_network": hardening.egress_network(SUBNET, "198.18.0.9", labels)}


def _as_json(scenario: Callable[[], Any]) -> Callable[[], dict[str, Any]]:
    return lambda: dict(scenario().as_json())


DOCUMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    **{name: _as_json(scenario) for name, scenario in SCENARIOS.items()},
    "egress-proxy": _egress_proxy,
    "egress-network": _egress_network,
}


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_golden(name: str) -> None:
    document = DOCUMENTS[name]()
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
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(DOCUMENTS)


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


def test_the_proxy_is_hardened_like_a_sandbox_and_reaches_only_its_two_networks() -> None:
    plan = _proxy_plan()
    host, create = plan.host_config, plan.create
    assert host["cap_drop"] == ["ALL"] and host["read_only"] is True
    # AgentNest's own profile (never a policy's), as for a runc sandbox.
    assert host["security_opt"] == ["no-new-privileges:true", f"seccomp={hardening.profile_json('x86_64')}"]
    assert host["memswap_limit"] == host["mem_limit"] and host["pids_limit"] > 0
    assert host["sysctls"] == {"net.ipv4.ip_forward": "0"}  # never routes the sandbox's packets
    assert host["log_config"] == {"Type": "none", "Config": {}}
    assert "noexec" in host["tmpfs"]["/tmp"] and "size=" in host["tmpfs"]["/tmp"]
    assert host["network_mode"] == NETWORK and "port_bindings" not in host and "ports" not in create
    assert create["networking_config"] == {
        "EndpointsConfig": {NETWORK: {"IPAMConfig": {"IPv4Address": "198.18.0.10"}}}
    }
    assert create["user"] == "65532:65532" and create["use_config_proxy"] is False


def test_the_proxy_serves_only_the_sandbox_and_always_states_the_matching() -> None:
    config = _proxy_config()
    assert config["listen"] == ["198.18.0.10", hardening.PROXY_PORT] and config["clients"] == [SUBNET]
    off = hardening.proxy_config(
        NetworkPolicy.allowlist(["a.test"], subdomains=False),
        proxy_ip="x",
        subnet=SUBNET,
        hosts={},
        deadline=1,
    )
    assert off["subdomains"] is False and config["subdomains"] is True


def test_the_internal_network_has_no_route_out_and_no_host_address() -> None:
    network = _egress_network()["create_network"]
    assert network["internal"] is True and network["enable_ipv6"] is False
    assert network["options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"


def test_the_engine_shapes_are_docker_pys() -> None:
    """The plain dicts are what docker-py's own types make, so the engine receives the same JSON."""
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=SUBNET, gateway="198.18.0.9")])
    assert _egress_network()["create_network"]["ipam"] == ipam
    api = docker.APIClient(base_url="unix:///nonexistent", version="1.41")
    host = _proxy_plan().host_config
    typed = {
        **host,
        "log_config": docker.types.LogConfig(type="none", config={}),
        "ulimits": [
            docker.types.Ulimit(name=u["Name"], soft=u["Soft"], hard=u["Hard"]) for u in host["ulimits"]
        ],
    }
    assert api.create_host_config(**host) == api.create_host_config(**typed)
    endpoint = docker.types.NetworkingConfig(
        # docker-py takes {network: EndpointConfig}; types-docker's stub says one EndpointConfig.
        {NETWORK: api.create_endpoint_config(ipv4_address="198.18.0.10")}  # type: ignore[arg-type]
    )
    assert _proxy_plan().create["networking_config"] == endpoint


class RecordingEngine:
    """docker-py's APIClient at the edge, for the egress topology."""

    def __init__(self) -> None:
        self.network: dict[str, Any] = {}
        self.host_config: dict[str, Any] = {}
        self.container: dict[str, Any] = {}

    def create_network(self, name: str, **kwargs: Any) -> dict[str, str]:
        self.network = {"name": name, **kwargs}
        return {"Id": "n1"}

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        self.host_config = kwargs
        return {"recorded": True}

    def create_container(self, **kwargs: Any) -> dict[str, str]:
        self.container = kwargs
        raise Created


def test_the_egress_topology_applies_the_builder() -> None:
    api = RecordingEngine()
    policy = NetworkPolicy.allowlist(["pypi.org"])
    topology = egress.EgressTopology(
        api,  # type: ignore[arg-type]  # the fake stands in for docker-py
        sandbox_id=SANDBOX,
        backend="docker",
        created=1800000000.0,
        deadline=1800000300.0,
        policy=policy,
        hosts={},
        image="proxy-image",
        python="python3",
        oci_runtime="runc",
        egress_network="bridge",
        subnets=egress.DEFAULT_SUBNETS,
        arch="x86_64",
        extra_labels={},
    )
    topology.create_network()
    subnet = topology.subnet
    assert subnet is not None and subnet.subnet_of(ipaddress.IPv4Network(egress.DEFAULT_SUBNETS))
    gateway = str(subnet.network_address + 1)
    assert api.network == {
        "name": topology.network_name,
        **hardening.egress_network(str(subnet), gateway, topology.network_labels),
    }
    with pytest.raises(Created):
        topology.start_proxy()
    expected = hardening.proxy_container(
        name=topology.proxy_name,
        image="proxy-image",
        command=egress.proxy_command("python3", topology.proxy_config()),
        labels=topology.labels,
        network=topology.network_name,
        proxy_ip=topology.proxy_ip,
        oci_runtime="runc",
        arch="x86_64",
    )
    assert api.host_config == expected.host_config
    assert {**api.container, "host_config": None} == {**expected.create, "host_config": None}
    assert topology.proxy_config() == hardening.proxy_config(
        policy, proxy_ip=topology.proxy_ip, subnet=str(subnet), hosts={}, deadline=1800000300.0
    )


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
        seccomp_profile=hardening.profile_json("x86_64", gvisor=gvisor),
    )
    assert api.host_config == expected.host_config
    assert {**api.container, "host_config": None} == {**expected.create, "host_config": None}
    assert api.container["host_config"] == {"recorded": True}


def test_the_backend_refuses_before_creating_anything() -> None:
    backend, api = _backend("runc")
    with pytest.raises(UnsupportedCapabilityError, match="rootless"):
        backend.create(SandboxConfig(image="img", rootless=True))
    assert api.host_config == {} and api.container == {}
