"""GPUs on the Docker engine: can it give them, how many, and how to ask.

A pure core and a thin shell, as the rest of the package:

* :class:`GPUFacts` is what can be seen about GPUs from here: the engine's
  ``info()`` (its OCI runtimes and their arguments, the default runtime, CDI
  spec directories) and, when the engine runs on this host (a unix socket),
  the NVIDIA device nodes and the NVIDIA Container Toolkit's programs;
* :func:`decide` turns facts and the sandbox's OCI runtime into a
  :class:`GPUSupport`: yes or no, how many GPUs are visible, how to request
  them, and when no, why and how to fix it;
* :func:`request` turns a support and a count into a :class:`GPURequest` (the
  ``device_requests``, ``runtime`` and environment of the container), or
  raises :class:`~agentnest.errors.GPUUnavailableError` before anything exists;
* :func:`gather` reads the facts through docker-py (cheap; the backend caches them).

The ways to ask, in order of preference:

``device_request``
    docker-py's ``DeviceRequest`` with the ``nvidia`` driver, what
    ``docker run --gpus N`` sends; dockerd handles it when it finds
    ``nvidia-container-runtime-hook`` (the NVIDIA Container Toolkit).
``cdi``
    a ``DeviceRequest`` with the ``cdi`` driver and ``nvidia.com/gpu=I``
    ids (Docker 25+ with CDI enabled and ``nvidia-ctk cdi generate`` run).
``nvidia_runtime``
    the ``nvidia`` OCI runtime (a runc wrapper) with ``NVIDIA_VISIBLE_DEVICES``,
    when that is all the host has registered.

gVisor (runsc) passes GPUs through only with its ``nvproxy``, which is
opt-in: the runsc runtime must be registered with ``--nvproxy=true``, and
then the device request reaches gVisor, which proxies the driver's ioctls.
Never the ``nvidia`` runtime there: it would swap gVisor for runc.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...errors import GPUUnavailableError

__all__ = [
    "NVPROXY_FIX",
    "TOOLKIT_FIX",
    "TOOLKIT_PROGRAMS",
    "GPUFacts",
    "GPURequest",
    "GPUSupport",
    "decide",
    "gather",
    "nvproxy_enabled",
    "request",
]

#: The toolkit's programs looked for on this host: dockerd calls the hook for
#: ``--gpus``, the hook calls the CLI, ``nvidia-ctk`` configures the engine.
TOOLKIT_PROGRAMS = ("nvidia-container-runtime-hook", "nvidia-container-cli", "nvidia-ctk")
#: Where packages install them, in case this process's PATH is narrower than dockerd's.
_SYSTEM_BIN = ("/usr/bin", "/usr/local/bin", "/usr/sbin", "/usr/local/sbin")
#: One node per GPU (``/dev/nvidiactl``, ``/dev/nvidia-uvm`` are not GPUs).
_GPU_NODE = re.compile(r"^nvidia[0-9]+$")
#: The default CDI spec directories (Docker 25+ reports its own in ``info()``).
_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")

TOOLKIT_FIX = (
    "install the NVIDIA driver and the NVIDIA Container Toolkit on the engine's host "
    "(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html), "
    "run `sudo nvidia-ctk runtime configure --runtime=docker` and restart the engine "
    "(`sudo systemctl restart docker`)"
)
NVPROXY_FIX = (
    "gVisor's GPU support (nvproxy) is opt-in: with a gVisor release that has nvproxy (the Debian "
    'runsc 20221219 has none; use a release from https://gvisor.dev), add "--nvproxy=true" to the '
    'runsc runtime\'s "runtimeArgs" in /etc/docker/daemon.json, restart the engine, and install the '
    "NVIDIA Container Toolkit; or use backend='docker' (runc)"
)


@dataclass(frozen=True, slots=True)
class GPUFacts:
    """What can be seen about GPUs from here.

    Attributes:
        runtimes: the engine's ``Runtimes`` (name -> ``{"path", "runtimeArgs"}``).
        default_runtime: the engine's ``DefaultRuntime``.
        cdi_spec_dirs: the engine's ``CDISpecDirs`` (empty: CDI off or an older engine).
        local: the engine runs on this host (a unix socket), so the rest was looked at.
        devices: the GPU device nodes (``/dev/nvidia0``...) on this host; ``None`` when
            not local (unknown).
        programs: which of :data:`TOOLKIT_PROGRAMS` are installed on this host.
        cdi_nvidia: an NVIDIA CDI spec (``nvidia-ctk cdi generate``) is in a CDI directory.
    """

    runtimes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    default_runtime: str = "runc"
    cdi_spec_dirs: tuple[str, ...] = ()
    local: bool = True
    devices: tuple[str, ...] | None = ()
    programs: frozenset[str] = frozenset()
    cdi_nvidia: bool = False

    @classmethod
    def from_info(cls, info: Mapping[str, Any], **seen: Any) -> GPUFacts:
        """Facts from a ``docker info`` dict plus what was ``seen`` on the host."""
        runtimes = info.get("Runtimes") or {}
        return cls(
            runtimes=MappingProxyType({str(k): dict(v or {}) for k, v in runtimes.items()}),
            default_runtime=str(info.get("DefaultRuntime") or "runc"),
            cdi_spec_dirs=tuple(str(d) for d in info.get("CDISpecDirs") or ()),
            **seen,
        )


@dataclass(frozen=True, slots=True)
class GPUSupport:
    """Whether, and how, this engine gives GPUs to a sandbox of one OCI runtime.

    Attributes:
        oci_runtime: the sandbox's OCI runtime this was decided for.
        available: GPUs can be requested (``method`` says how).
        method: ``device_request``, ``cdi``, ``nvidia_runtime``, or ``none``.
        visible: GPUs visible on the host; ``None`` when unknown (a remote engine).
        verified: the toolkit was seen on the host; ``False`` on a remote engine,
            where the engine itself accepts or refuses the request.
        reason: why not (``available=False``), or how (for people to read).
        fix: what to do when not available.
        nvproxy: the OCI runtime is gVisor with nvproxy on (``False`` for others).
    """

    oci_runtime: str
    available: bool
    method: str
    visible: int | None
    verified: bool
    reason: str
    fix: str = ""
    nvproxy: bool = False

    def describe(self) -> str:
        """One line for ``doctor``: how many GPUs and how they are requested, or why none."""
        if not self.available:
            return self.reason
        count = (
            "an unknown number of GPU(s) (remote engine)"
            if self.visible is None
            else f"{self.visible} GPU(s)"
        )
        how = {
            "device_request": "a device request (the NVIDIA toolkit's hook, as `docker run --gpus`)",
            "cdi": "a CDI device request (nvidia.com/gpu)",
            "nvidia_runtime": "the nvidia OCI runtime",
        }.get(self.method, self.method)
        return f"{count}, requested through {how}" + (" under gVisor nvproxy" if self.nvproxy else "")


@dataclass(frozen=True, slots=True)
class GPURequest:
    """What a GPU sandbox's container is created with.

    Attributes:
        count: GPUs asked for.
        driver: the ``DeviceRequest`` driver (``nvidia``, ``cdi``, or ``""``: the
            engine's choice); unused with the ``nvidia`` runtime.
        device_ids: CDI device names (``cdi`` only).
        runtime: an OCI runtime replacing the sandbox's (``nvidia``), or ``None``.
        environment: variables set after the caller's, so they win.
    """

    count: int
    driver: str = ""
    device_ids: tuple[str, ...] = ()
    runtime: str | None = None
    environment: Mapping[str, str] = field(default_factory=dict, hash=False)

    def device_requests(self) -> list[dict[str, Any]] | None:
        """``DeviceRequests`` for ``create_host_config``, as the Engine API spells them (``None``: none).

        The same fields docker-py's ``DeviceRequest`` sends, as plain data, so
        the container's hardening stays a pure builder (:mod:`.hardening`).
        """
        if self.runtime is not None:
            return None  # the nvidia runtime reads NVIDIA_VISIBLE_DEVICES instead
        if self.device_ids:
            ids, count, capabilities = list(self.device_ids), 0, []
        else:
            ids, count, capabilities = [], self.count, [["gpu"]]
        return [
            {
                "Driver": self.driver,
                "Count": count,
                "DeviceIDs": ids,
                "Capabilities": capabilities,
                "Options": {},
            }
        ]


def nvproxy_enabled(runtime: Mapping[str, Any] | None) -> bool:
    """Whether a runsc runtime entry of ``docker info`` has ``--nvproxy`` (or ``--nvproxy=true``) on."""
    args = (runtime or {}).get("runtimeArgs") or ()
    on = False
    for arg in args:
        # runsc's flags take the last value given, with one or two dashes.
        flag = str(arg).lstrip("-")
        if flag in ("nvproxy", "nvproxy=true", "nvproxy=1", "nvproxy=True"):
            on = True
        elif flag.startswith("nvproxy="):
            on = False
    return on


def decide(facts: GPUFacts, oci_runtime: str) -> GPUSupport:
    """Whether the engine of ``facts`` gives GPUs to a sandbox running ``oci_runtime``, and how."""
    gvisor = oci_runtime.startswith("runsc")
    visible = None if facts.devices is None else len(facts.devices)
    nvproxy = gvisor and nvproxy_enabled(facts.runtimes.get(oci_runtime))

    def no(reason: str, fix: str) -> GPUSupport:
        return GPUSupport(oci_runtime, False, "none", visible, facts.local, reason, fix, nvproxy)

    def yes(method: str, reason: str) -> GPUSupport:
        return GPUSupport(oci_runtime, True, method, visible, facts.local, reason, "", nvproxy)

    if gvisor and not nvproxy:
        return no(
            f"OCI runtime {oci_runtime!r} (gVisor) is registered without --nvproxy, so it cannot pass "
            "GPUs through",
            NVPROXY_FIX,
        )
    if not gvisor and oci_runtime not in ("runc", "nvidia"):
        return no(
            f"AgentNest does not pass GPUs through with OCI runtime {oci_runtime!r}",
            "use backend='docker' (runc) or gVisor with nvproxy (backend='gvisor')",
        )
    if not facts.local:
        # Nothing on the engine's host can be looked at from here: ask as
        # `docker run --gpus` does and let the engine accept or refuse.
        if "nvidia" in facts.runtimes and not gvisor:
            return GPUSupport(
                oci_runtime,
                True,
                "device_request",
                None,
                False,
                "the engine has the nvidia runtime",
                "",
                nvproxy,
            )
        return GPUSupport(
            oci_runtime, True, "device_request", None, False, "a remote engine: not verified", "", nvproxy
        )
    if not visible:
        missing = _missing_programs(facts)
        return no(
            "no NVIDIA GPU is visible on this host (no /dev/nvidia0...)"
            + (f" and {missing}" if missing else ""),
            "run on a host with an NVIDIA GPU; " + TOOLKIT_FIX,
        )
    hook = "nvidia-container-runtime-hook" in facts.programs
    cli = "nvidia-container-cli" in facts.programs
    if hook and cli:
        return yes("device_request", "the NVIDIA Container Toolkit's hook")
    if facts.cdi_nvidia and facts.cdi_spec_dirs:
        return yes("cdi", "an NVIDIA CDI spec")
    if not gvisor and "nvidia" in facts.runtimes:
        return yes("nvidia_runtime", "the nvidia runtime")
    return no(
        f"{visible} GPU(s) are visible but {_missing_programs(facts) or 'the toolkit is broken'}", TOOLKIT_FIX
    )


def _missing_programs(facts: GPUFacts) -> str:
    missing = [p for p in TOOLKIT_PROGRAMS[:2] if p not in facts.programs]
    if not missing:
        return ""
    return f"the NVIDIA Container Toolkit is not installed ({', '.join(missing)} not found)"


def request(support: GPUSupport, count: int) -> GPURequest:
    """The container options for ``count`` GPUs, or GPUUnavailableError before anything exists.

    Raises:
        GPUUnavailableError: the engine cannot give GPUs to this OCI runtime, or
            fewer than ``count`` are visible on the host.
    """
    if not support.available:
        raise GPUUnavailableError(
            f"{count} GPU(s) requested, but this Docker engine cannot give GPUs to OCI runtime "
            f"{support.oci_runtime!r}: {support.reason}; {support.fix}; no sandbox was created",
            requested=count,
            available=support.visible if support.visible is not None else 0,
        )
    if support.visible is not None and count > support.visible:
        raise GPUUnavailableError(
            f"{count} GPUs requested, but this host has {support.visible} visible; ask for at most "
            f"{support.visible} (gpus={support.visible}) or run on a host with more; no sandbox was created",
            requested=count,
            available=support.visible,
        )
    # Always ours, after the caller's environment: a sandbox must not widen its
    # own GPU set by naming NVIDIA_VISIBLE_DEVICES=all itself (the toolkit
    # reads that variable), so what was asked is all it gets.
    indices = ",".join(str(i) for i in range(count))
    if support.method == "nvidia_runtime":
        return GPURequest(
            count,
            runtime="nvidia",
            environment=MappingProxyType(
                {"NVIDIA_VISIBLE_DEVICES": indices, "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
            ),
        )
    if support.method == "cdi":
        return GPURequest(count, driver="cdi", device_ids=tuple(f"nvidia.com/gpu={i}" for i in range(count)))
    driver = "nvidia" if support.verified else ""  # remote: the engine picks, as `--gpus` does
    return GPURequest(count, driver=driver, environment=MappingProxyType({"NVIDIA_VISIBLE_DEVICES": indices}))


# -- the shell: facts from the engine and this host ------------------------------------------------


def gather(info: Mapping[str, Any], local: bool, *, dev: str = "/dev", path: str | None = None) -> GPUFacts:
    """The facts: ``info`` is the engine's ``info()``; the host is looked at only when ``local``."""
    if not local:
        return GPUFacts.from_info(info, local=False, devices=None, programs=frozenset(), cdi_nvidia=False)
    try:
        devices = tuple(sorted(f"{dev}/{n}" for n in os.listdir(dev) if _GPU_NODE.match(n)))
    except OSError:
        devices = ()
    search = os.pathsep.join([path if path is not None else os.environ.get("PATH", ""), *_SYSTEM_BIN])
    programs = frozenset(p for p in TOOLKIT_PROGRAMS if shutil.which(p, path=search))
    dirs: Sequence[str] = tuple(info.get("CDISpecDirs") or ()) or _CDI_DIRS
    return GPUFacts.from_info(
        info, local=True, devices=devices, programs=programs, cdi_nvidia=_has_nvidia_cdi(dirs)
    )


def _has_nvidia_cdi(dirs: Sequence[str]) -> bool:
    for directory in dirs:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if name.startswith("nvidia") and Path(name).suffix in (".yaml", ".yml", ".json"):
                return True
    return False
