"""GPUs on Docker (agentnest/runtime/docker/gpus.py): facts -> decision -> container options.

No GPU exists on the machines that run this suite: the decision is a pure
function of facts, tested here as a table; the container options are read
from what the backend hands docker-py (a fake at the SDK edge records the
``create_host_config`` and ``create_container`` calls); ``doctor``'s lines
come from faked facts.  tests/integration/test_presets_engine.py sees the
real refusal, tests/integration/test_gpu_real.py a real GPU (opt-in).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentnest import GPUUnavailableError, NetworkPolicy, UnsupportedCapabilityError
from agentnest.cli import doctor as doctor_cmd
from agentnest.config import ResourceLimits, SandboxConfig
from agentnest.runtime.docker import DockerBackend, DockerSpec
from agentnest.runtime.docker.gpus import GPUFacts, decide, gather, nvproxy_enabled, request

RUNC = {"runc": {"path": "runc"}}
RUNSC = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp"]}
NVPROXY = {"path": "/usr/local/bin/runsc", "runtimeArgs": ["--oci-seccomp", "--nvproxy=true"]}
NVIDIA = {"path": "nvidia-container-runtime"}
HOOK = frozenset({"nvidia-container-runtime-hook", "nvidia-container-cli", "nvidia-ctk"})
TWO = ("/dev/nvidia0", "/dev/nvidia1")


def facts(runtimes: dict[str, Any] | None = None, **kw: Any) -> GPUFacts:
    info = {"Runtimes": {**RUNC, **(runtimes or {})}, "DefaultRuntime": "runc"}
    if "cdi_spec_dirs" in kw:
        info["CDISpecDirs"] = list(kw.pop("cdi_spec_dirs"))
    return GPUFacts.from_info(info, **kw)


# -- the decision ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fact_set", "oci_runtime", "expected"),
    [
        # (available, method, visible, verified)
        (
            "toolkit and two GPUs",
            facts(devices=TWO, programs=HOOK),
            "runc",
            (True, "device_request", 2, True),
        ),
        (
            "hook without its CLI",
            facts(devices=TWO, programs=frozenset({"nvidia-container-runtime-hook"})),
            "runc",
            (False, "none", 2, True),
        ),
        (
            "only the nvidia runtime",
            facts({"nvidia": NVIDIA}, devices=TWO),
            "runc",
            (True, "nvidia_runtime", 2, True),
        ),
        (
            "CDI spec on a CDI engine",
            facts(devices=TWO, cdi_nvidia=True, cdi_spec_dirs=["/etc/cdi"]),
            "runc",
            (True, "cdi", 2, True),
        ),
        (
            "CDI spec, engine without CDI",
            facts(devices=TWO, cdi_nvidia=True),
            "runc",
            (False, "none", 2, True),
        ),
        ("no GPU, no toolkit (this host)", facts(devices=()), "runc", (False, "none", 0, True)),
        ("toolkit but no GPU", facts(devices=(), programs=HOOK), "runc", (False, "none", 0, True)),
        ("GPUs, no toolkit", facts(devices=TWO), "runc", (False, "none", 2, True)),
        ("remote engine", facts(local=False, devices=None), "runc", (True, "device_request", None, False)),
        (
            "remote engine, gVisor without nvproxy",
            facts({"runsc": RUNSC}, local=False, devices=None),
            "runsc",
            (False, "none", None, False),
        ),
        (
            "gVisor without nvproxy, GPUs and toolkit",
            facts({"runsc": RUNSC}, devices=TWO, programs=HOOK),
            "runsc",
            (False, "none", 2, True),
        ),
        (
            "gVisor with nvproxy",
            facts({"runsc": NVPROXY}, devices=TWO, programs=HOOK),
            "runsc",
            (True, "device_request", 2, True),
        ),
        # Never the nvidia runtime under gVisor: it would swap runsc for runc.
        (
            "gVisor with nvproxy, only the nvidia runtime",
            facts({"runsc": NVPROXY, "nvidia": NVIDIA}, devices=TWO),
            "runsc",
            (False, "none", 2, True),
        ),
        (
            "runsc-host with nvproxy",
            facts({"runsc-host": NVPROXY}, devices=TWO, programs=HOOK),
            "runsc-host",
            (True, "device_request", 2, True),
        ),
        (
            "Kata",
            facts({"kata-runtime": {"path": "kata"}}, devices=TWO, programs=HOOK),
            "kata-runtime",
            (False, "none", 2, True),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_decide(name: str, fact_set: GPUFacts, oci_runtime: str, expected: tuple[Any, ...]) -> None:
    support = decide(fact_set, oci_runtime)
    assert (support.available, support.method, support.visible, support.verified) == expected, name
    assert support.oci_runtime == oci_runtime
    if not support.available:
        assert support.reason and support.fix


def test_the_reasons_and_fixes_say_what_is_missing() -> None:
    here = decide(facts(devices=()), "runc")
    assert "no NVIDIA GPU is visible" in here.reason and "nvidia-container-runtime-hook" in here.reason
    assert "nvidia-ctk runtime configure --runtime=docker" in here.fix and "restart" in here.fix
    gvisor = decide(facts({"runsc": RUNSC}, devices=TWO, programs=HOOK), "runsc")
    assert "without --nvproxy" in gvisor.reason and not gvisor.nvproxy
    assert (
        "opt-in" in gvisor.fix
        and '"--nvproxy=true"' in gvisor.fix
        and "/etc/docker/daemon.json" in gvisor.fix
    )
    assert "20221219 has none" in gvisor.fix
    kata = decide(facts(devices=TWO, programs=HOOK), "kata-runtime")
    assert "'kata-runtime'" in kata.reason and "gVisor with nvproxy" in kata.fix


@pytest.mark.parametrize(
    ("args", "on"),
    [
        (["--nvproxy"], True),
        (["--nvproxy=true"], True),
        (["-nvproxy=true"], True),
        (["--nvproxy=false"], False),
        (["--nvproxy=true", "--nvproxy=false"], False),  # the last one wins, as in runsc
        (["--nvproxy-docker"], False),
        (["--network=none", "--oci-seccomp"], False),
        ([], False),
    ],
)
def test_nvproxy_is_read_from_the_runtime_args(args: list[str], on: bool) -> None:
    assert nvproxy_enabled({"runtimeArgs": args}) is on
    assert (
        decide(facts({"runsc": {"runtimeArgs": args}}, devices=TWO, programs=HOOK), "runsc").available is on
    )


def test_describe_says_how_many_and_how() -> None:
    assert (
        decide(facts(devices=TWO, programs=HOOK), "runc")
        .describe()
        .startswith("2 GPU(s), requested through a device")
    )
    assert "nvidia OCI runtime" in decide(facts({"nvidia": NVIDIA}, devices=TWO), "runc").describe()
    assert (
        "under gVisor nvproxy"
        in decide(facts({"runsc": NVPROXY}, devices=TWO, programs=HOOK), "runsc").describe()
    )
    assert "unknown number" in decide(facts(local=False, devices=None), "runc").describe()


# -- the request --------------------------------------------------------------------------------


def test_request_device_request_with_the_nvidia_driver() -> None:
    req = request(decide(facts(devices=TWO, programs=HOOK), "runc"), 2)
    assert (req.runtime, req.driver, dict(req.environment)) == (
        None,
        "nvidia",
        {"NVIDIA_VISIBLE_DEVICES": "0,1"},
    )
    (dr,) = req.device_requests() or []
    assert dict(dr) == {
        "Driver": "nvidia",
        "Count": 2,
        "DeviceIDs": [],
        "Capabilities": [["gpu"]],
        "Options": {},
    }


def test_request_on_a_remote_engine_lets_the_engine_pick_the_driver() -> None:
    req = request(decide(facts(local=False, devices=None), "runc"), 8)  # no count to check against
    (dr,) = req.device_requests() or []
    assert (dr["Driver"], dr["Count"]) == ("", 8)


def test_request_through_the_nvidia_runtime() -> None:
    req = request(decide(facts({"nvidia": NVIDIA}, devices=TWO), "runc"), 1)
    assert req.runtime == "nvidia" and req.device_requests() is None
    assert dict(req.environment) == {
        "NVIDIA_VISIBLE_DEVICES": "0",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }


def test_request_through_cdi() -> None:
    req = request(decide(facts(devices=TWO, cdi_nvidia=True, cdi_spec_dirs=["/etc/cdi"]), "runc"), 2)
    (dr,) = req.device_requests() or []
    assert (dr["Driver"], dr["DeviceIDs"], dr["Count"]) == (
        "cdi",
        ["nvidia.com/gpu=0", "nvidia.com/gpu=1"],
        0,
    )


def test_request_refuses_without_gpus_naming_why_and_the_fix() -> None:
    with pytest.raises(GPUUnavailableError) as info:
        request(decide(facts(devices=()), "runc"), 1)
    message = str(info.value)
    assert "1 GPU(s) requested" in message and "'runc'" in message and "no NVIDIA GPU is visible" in message
    assert "NVIDIA Container Toolkit" in message and "no sandbox was created" in message
    assert (info.value.requested, info.value.available) == (1, 0)
    assert isinstance(info.value, UnsupportedCapabilityError)


def test_request_refuses_more_than_the_host_shows_naming_both_numbers() -> None:
    with pytest.raises(GPUUnavailableError) as info:
        request(decide(facts(devices=TWO, programs=HOOK), "runc"), 3)
    assert "3 GPUs requested, but this host has 2 visible" in str(info.value)
    assert "gpus=2" in str(info.value)
    assert (info.value.requested, info.value.available) == (3, 2)
    assert request(decide(facts(devices=TWO, programs=HOOK), "runc"), 2).count == 2


# -- gathering the facts ------------------------------------------------------------------------


def test_gather_looks_at_devices_programs_and_cdi(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for node in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"):
        (dev / node).touch()
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    hook = bin_ / "nvidia-container-runtime-hook"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    info = {"Runtimes": RUNC, "DefaultRuntime": "runc", "CDISpecDirs": [str(cdi)]}
    seen = gather(info, True, dev=str(dev), path=str(bin_))
    assert seen.devices == (f"{dev}/nvidia0", f"{dev}/nvidia1")  # not nvidiactl, nvidia-uvm
    assert "nvidia-container-runtime-hook" in seen.programs
    assert seen.cdi_nvidia and seen.cdi_spec_dirs == (str(cdi),) and seen.local


def test_gather_on_a_remote_engine_looks_at_nothing_here(tmp_path: Path) -> None:
    seen = gather({"Runtimes": RUNC}, False, dev=str(tmp_path))
    assert (seen.local, seen.devices, seen.programs, seen.cdi_nvidia) == (False, None, frozenset(), False)


def test_gather_without_a_dev_directory_sees_no_gpu(tmp_path: Path) -> None:
    assert gather({"Runtimes": RUNC}, True, dev=str(tmp_path / "missing"), path="").devices == ()


# -- what the backend hands docker-py -----------------------------------------------------------


class Created(Exception):
    """Raised by the fake once create_container was called: nothing is started."""


class RecordingAPI:
    """docker-py's APIClient at the edge: records the host config and the container's options."""

    def __init__(self) -> None:
        self.host_config: dict[str, Any] = {}
        self.container: dict[str, Any] = {}
        self.calls: list[str] = []

    def create_host_config(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append("create_host_config")
        self.host_config = kwargs
        return kwargs

    def create_container(self, image: str, **kwargs: Any) -> dict[str, str]:
        self.calls.append("create_container")
        self.container = kwargs
        raise Created

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise AssertionError(f"unexpected docker-py call {name}")

        return record


def fake_backend(
    fact_set: GPUFacts, runtimes: dict[str, Any] | None = None, oci_runtime: str = "runc"
) -> tuple[DockerBackend, RecordingAPI]:
    backend = DockerBackend(DockerSpec(oci_runtime=oci_runtime, storage=""))
    api = RecordingAPI()
    backend._api = api  # type: ignore[assignment]  # the fake stands in for docker-py
    backend._info = {
        "Runtimes": {**RUNC, "runsc": RUNSC, "runsc-host": RUNSC, **(runtimes or {})},
        "SecurityOptions": ["name=seccomp,profile=default"],
        "Architecture": "x86_64",
    }
    backend._gpu_facts = fact_set
    backend._known_images.add("img")
    return backend, api


def gpu_config(count: int, **kw: Any) -> SandboxConfig:
    return SandboxConfig(image="img", limits=ResourceLimits(gpus=count), environment=kw)


def test_the_backend_creates_a_device_request() -> None:
    backend, api = fake_backend(facts(devices=TWO, programs=HOOK))
    with pytest.raises(Created):
        # A sandbox naming NVIDIA_VISIBLE_DEVICES=all itself still gets only what it asked for.
        backend.create(gpu_config(1, NVIDIA_VISIBLE_DEVICES="all"))
    (dr,) = api.host_config["device_requests"]
    assert (dr["Driver"], dr["Count"], dr["Capabilities"]) == ("nvidia", 1, [["gpu"]])
    assert api.host_config["runtime"] == "runc"
    assert api.container["environment"]["NVIDIA_VISIBLE_DEVICES"] == "0"
    # The hardening is the same as without GPUs.
    assert api.host_config["cap_drop"] == ["ALL"] and api.host_config["read_only"] is True


def test_the_backend_uses_the_nvidia_runtime_when_that_is_all_there_is() -> None:
    backend, api = fake_backend(facts({"nvidia": NVIDIA}, devices=TWO), {"nvidia": NVIDIA})
    with pytest.raises(Created):
        backend.create(gpu_config(2))
    assert api.host_config["runtime"] == "nvidia" and api.host_config["device_requests"] is None
    env = api.container["environment"]
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("0,1", "compute,utility")


def test_a_sandbox_without_gpus_asks_for_none() -> None:
    backend, api = fake_backend(facts(devices=TWO, programs=HOOK))
    with pytest.raises(Created):
        backend.create(gpu_config(0))
    assert api.host_config["device_requests"] is None and api.host_config["runtime"] == "runc"
    assert "NVIDIA_VISIBLE_DEVICES" not in api.container["environment"]


@pytest.mark.parametrize(
    ("fact_set", "oci_runtime", "count", "said"),
    [
        (facts(devices=()), "runc", 1, "no NVIDIA GPU is visible"),
        (facts(devices=TWO, programs=HOOK), "runc", 3, "3 GPUs requested, but this host has 2 visible"),
        (facts({"runsc": RUNSC}, devices=TWO, programs=HOOK), "runsc", 1, "nvproxy"),
    ],
)
def test_the_backend_refuses_before_any_engine_call(
    fact_set: GPUFacts, oci_runtime: str, count: int, said: str
) -> None:
    backend, api = fake_backend(fact_set, oci_runtime=oci_runtime)
    with pytest.raises(GPUUnavailableError, match=said):
        backend.create(gpu_config(count))
    allowlisted = SandboxConfig(
        image="img", limits=ResourceLimits(gpus=count), network=NetworkPolicy.allowlist(["example.com"])
    )
    with pytest.raises(GPUUnavailableError):
        backend.create(allowlisted)  # before its network and proxy, too
    assert api.calls == []


# -- doctor ---------------------------------------------------------------------------------------


def doctor_lines(fact_set: GPUFacts, runtimes: dict[str, Any] | None = None) -> list[dict[str, str]]:
    backend, _ = fake_backend(fact_set)
    if runtimes is not None:
        assert backend._info is not None
        backend._info["Runtimes"] = runtimes
    report = doctor_cmd._Report(as_json=True)
    doctor_cmd._gpu_checks(report, "Docker engine", backend)
    return [{"name": c.name, "status": c.status, "detail": c.detail, "hint": c.hint} for c in report.checks]


def test_doctor_on_a_host_without_gpus_skips_with_the_fix() -> None:
    gpu, nvproxy = doctor_lines(facts({"runsc": RUNSC}, devices=()), {**RUNC, "runsc": RUNSC})
    assert (gpu["name"], gpu["status"]) == ("gpu", "skip")
    assert "no GPU for sandboxes (optional)" in gpu["detail"] and "no NVIDIA GPU is visible" in gpu["detail"]
    assert "nvidia-ctk runtime configure --runtime=docker" in gpu["hint"]
    assert (nvproxy["name"], nvproxy["status"]) == ("gpu (gVisor nvproxy)", "skip")
    assert "opt-in and off" in nvproxy["detail"] and "--nvproxy=true" in nvproxy["hint"]


def test_doctor_on_a_gpu_host_says_how_many_and_how() -> None:
    gpu, nvproxy = doctor_lines(
        facts({"runsc": NVPROXY}, devices=TWO, programs=HOOK), {**RUNC, "runsc": NVPROXY}
    )
    assert (gpu["status"], gpu["hint"]) == ("ok", "")
    assert gpu["detail"].startswith("2 GPU(s), requested through a device request")
    assert nvproxy["status"] == "ok" and "under gVisor nvproxy" in nvproxy["detail"]


def test_doctor_with_nvproxy_on_but_no_gpu_says_so() -> None:
    _, nvproxy = doctor_lines(facts({"runsc": NVPROXY}, devices=()), {**RUNC, "runsc": NVPROXY})
    assert nvproxy["status"] == "skip" and nvproxy["detail"].startswith("nvproxy is on, but no NVIDIA GPU")


def test_doctor_without_runsc_skips_the_nvproxy_line() -> None:
    _, nvproxy = doctor_lines(facts(devices=()), dict(RUNC))
    assert nvproxy["status"] == "skip" and "runsc is not registered" in nvproxy["detail"]


def test_the_gpu_lines_never_fail_the_doctor() -> None:
    for fact_set in (facts(devices=()), facts(devices=TWO), facts(local=False, devices=None)):
        assert all(line["status"] in ("ok", "skip") for line in doctor_lines(fact_set))
