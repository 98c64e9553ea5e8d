"""``agentnest doctor``: check the engine, and that a sandbox's limits are really enforced."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..errors import AgentNestError, ImageNotFoundError, RuntimeNotAvailableError
from ._output import Commands, add_command, human_bytes

if TYPE_CHECKING:
    from ..runtime.base import RuntimeBackend
    from ..runtime.docker import DockerBackend
    from ..sandbox import Sandbox

OK = "ok"
FAIL = "fail"
SKIP = "skip"
"""Not checkable here (e.g. not visible inside gVisor); does not fail the run."""

ENGINE_HINT = "start it with `make engine` or `sudo systemctl start docker` (or set DOCKER_HOST)"

_EPILOG = """\
Checks, one line each (OK, FAIL with a fix, or SKIP when a fact cannot be
seen from here): the engine answers; the runc and runsc (gVisor) OCI
runtimes are registered; the default image is present; then, inside a real
sandbox per backend, that the limits hold: uid 65532, no capabilities,
no-new-privileges, seccomp, read-only root, loopback only, memory, process
and workspace limits.  By default the sandbox checks run on docker, and on
gvisor too when runsc is registered.  Exit code 0 when nothing failed.

examples:
  agentnest doctor
  agentnest doctor --backend gvisor
  agentnest doctor --json | python3 -m json.tool
"""

#: Runs inside the sandbox and reports what the workload can see, as JSON.
_PROBE = """\
import errno, json, os
def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
status = {}
for line in (read("/proc/self/status") or "").splitlines():
    key, _, value = line.partition(":")
    status[key] = value.strip()
try:
    open("/agentnest-doctor-probe", "w").close()
    root_write = "succeeded"
except OSError as e:
    root_write = e.strerror or str(e)
root_options = ""
for line in (read("/proc/self/mounts") or "").splitlines():
    fields = line.split()
    if len(fields) > 3 and fields[1] == "/":
        root_options = fields[3]
dev = (read("/proc/net/dev") or "").splitlines()[2:]
meminfo = dict(l.split(":", 1) for l in (read("/proc/meminfo") or "").splitlines() if ":" in l)
vfs = os.statvfs("/workspace")
print(json.dumps({
    "status": status,
    "root_write": root_write,
    "root_options": root_options,
    "interfaces": [l.split(":")[0].strip() for l in dev if ":" in l],
    "memory": {p: read(p) for p in (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max")},
    "pids": {p: read(p) for p in ("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")},
    "mem_total_kib": meminfo.get("MemTotal", "").strip().split(" ")[0],
    "workspace_bytes": vfs.f_blocks * vfs.f_frsize,
    "kernel": os.uname().release,
}))
"""


@dataclass(frozen=True, slots=True)
class Check:
    """The outcome of one check."""

    scope: str
    name: str
    status: str
    detail: str
    hint: str = ""


def register(commands: Commands) -> None:
    """Add ``doctor`` to the command line."""
    parser = add_command(
        commands,
        "doctor",
        "check the engine and that sandbox limits are enforced",
        "Check the Docker engine and its OCI runtimes, then verify from inside a real sandbox "
        "that every default limit is in force.",
        _EPILOG,
    )
    parser.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help="run the sandbox checks on this backend (repeatable; default: docker, plus gvisor if available)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as one JSON document")
    parser.set_defaults(handler=handle)


class _Report:
    """Collects checks; prints each as it comes unless the output is JSON."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.checks: list[Check] = []
        self._scope = ""

    def add(self, scope: str, name: str, status: str, detail: str, hint: str = "") -> None:
        check = Check(scope, name, status, detail, hint if status != OK else "")
        self.checks.append(check)
        if self.as_json:
            return
        if scope != self._scope:
            self._scope = scope
            print(f"\n{scope}" if self.checks[:-1] else scope)
        print(f"  {status.upper():<5} {name:<24} {detail}", flush=True)
        if check.hint:
            print(f"  {'':<5} {'':<24} fix: {check.hint}")

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]


def handle(args: argparse.Namespace) -> int:
    """Run every check; 0 when none failed."""
    from ..runtime.docker import DockerBackend
    from ..runtime.registry import get_backend
    from ..sandbox import default_image

    report = _Report(args.json)
    requested: list[str] | None = args.backend
    names = list(dict.fromkeys(requested or ["docker"]))
    backends: dict[str, RuntimeBackend] = {name: get_backend(name) for name in names}
    docker = get_backend("docker")
    assert isinstance(docker, DockerBackend)
    gvisor_wanted = any(
        isinstance(b, DockerBackend) and b.spec.oci_runtime == "runsc" for b in backends.values()
    )
    engine_ok = _engine_checks(report, docker, default_image(), gvisor_wanted=gvisor_wanted)
    if requested is None and engine_ok and "runsc" in (docker.engine_info().get("Runtimes") or {}):
        backends["gvisor"] = get_backend("gvisor")
    for name, backend in backends.items():
        if isinstance(backend, DockerBackend) and not engine_ok:
            continue  # the engine line already says why
        _sandbox_checks(report, name, backend)
    failed = report.failed
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [asdict(c) for c in report.checks]}, indent=2))
    else:
        print()
        if failed:
            print(f"{len(failed)} check(s) failed: {', '.join(f'{c.scope}: {c.name}' for c in failed)}")
        else:
            print("all checks passed")
    return 1 if failed else 0


def _engine_checks(report: _Report, docker: DockerBackend, image: str, *, gvisor_wanted: bool) -> bool:
    """Engine, runtimes and image; False when the engine is not reachable."""
    from ..runtime.docker import map_docker_errors
    from ..runtime.docker.images import image_exists

    scope = "Docker engine"
    try:
        with map_docker_errors("asking the engine for its version"):
            version = docker.api.version()
        info = docker.engine_info()
    except RuntimeNotAvailableError as exc:
        report.add(scope, "engine reachable", FAIL, _first_clause(str(exc)), ENGINE_HINT)
        return False
    except AgentNestError as exc:
        report.add(scope, "engine reachable", FAIL, str(exc), ENGINE_HINT)
        return False
    report.add(
        scope,
        "engine reachable",
        OK,
        f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')}), "
        f"cgroup v{info.get('CgroupVersion', '?')}, {info.get('OperatingSystem', '?')}",
    )
    runtimes = info.get("Runtimes") or {}
    registered = ", ".join(sorted(runtimes)) or "none"
    if "runc" in runtimes:
        report.add(scope, "runtime runc", OK, "registered")
    else:
        report.add(
            scope, "runtime runc", FAIL, f"not registered (engine has: {registered})", "reinstall Docker"
        )
    runsc_hint = "install gVisor and register runsc in /etc/docker/daemon.json (`make engine` does both)"
    if "runsc" in runtimes:
        report.add(scope, "runtime runsc (gVisor)", OK, f"registered at {runtimes['runsc'].get('path', '?')}")
    elif gvisor_wanted:
        report.add(
            scope, "runtime runsc (gVisor)", FAIL, f"not registered (engine has: {registered})", runsc_hint
        )
    else:
        report.add(scope, "runtime runsc (gVisor)", SKIP, f"not registered (optional); {runsc_hint}")
    try:
        with map_docker_errors("looking up the default image", image):
            present = image_exists(docker.api, image)
    except AgentNestError as exc:
        report.add(scope, "default image", FAIL, str(exc))
        return True
    if present:
        report.add(scope, "default image", OK, f"{image} present")
    else:
        report.add(
            scope,
            "default image",
            FAIL,
            f"{image} missing",
            "build it: `agentnest image base` (or `make image`)",
        )
    return True


def _sandbox_checks(report: _Report, name: str, backend: RuntimeBackend) -> None:
    """Create a sandbox on ``backend`` and verify its limits from the inside."""
    from ..runtime.docker import DockerBackend
    from ..sandbox import Sandbox

    runtime = backend.spec.oci_runtime if isinstance(backend, DockerBackend) else ""
    scope = (
        f"{name} ({runtime}): limits enforced inside a sandbox"
        if runtime
        else f"{name}: limits inside a sandbox"
    )
    gvisor = runtime == "runsc"
    started = time.monotonic()
    try:
        sandbox = Sandbox(None, 120, backend=backend)
    except AgentNestError as exc:
        report.add(scope, "create a sandbox", FAIL, str(exc), _create_hint(exc))
        return
    try:
        report.add(
            scope,
            "create a sandbox",
            OK,
            f"{sandbox.id} from {sandbox.config.image} in {time.monotonic() - started:.1f}s",
        )
        try:
            seen = sandbox.exec_json(_PROBE, timeout=60)
        except AgentNestError as exc:
            report.add(scope, "probe", FAIL, f"could not run the probe: {exc}")
            return
        if not isinstance(seen, dict):
            report.add(scope, "probe", FAIL, f"unexpected probe output {seen!r:.200}")
            return
        _judge(report, scope, sandbox, seen, gvisor, _engine_pids_limit(backend, sandbox.id))
    finally:
        sandbox.destroy()


def _judge(
    report: _Report, scope: str, sandbox: Sandbox, seen: dict[str, Any], gvisor: bool, engine_pids: int | None
) -> None:
    """Compare what the probe saw with the sandbox's configuration."""
    limits = sandbox.config.limits
    status: dict[str, str] = {str(k): str(v) for k, v in (seen.get("status") or {}).items()}
    kernel = str(seen.get("kernel", "?"))
    gvisor_note = f"gVisor (kernel {kernel}) serves the workload's system calls itself"

    uid = status.get("Uid", "?").split()
    uid0 = uid[0] if uid else "?"
    report.add(
        scope,
        "non-root user",
        OK if uid0 == "65532" else FAIL,
        f"uid {uid0}",
        "the sandbox runs as a different user; check SandboxConfig.user",
    )

    caps = {k: v for k, v in status.items() if k.startswith("Cap")}
    zero = "CapEff" in caps and all(_is_hex(v) and int(v, 16) == 0 for v in caps.values())
    report.add(
        scope,
        "no capabilities",
        OK if zero else FAIL,
        f"CapEff={caps.get('CapEff', '?')} ({len(caps)} capability sets, all zero)" if zero else f"{caps}",
        "the container kept capabilities; it must be created with cap_drop=['ALL']",
    )

    nnp = status.get("NoNewPrivs")
    if nnp == "1":
        report.add(scope, "no-new-privileges", OK, "NoNewPrivs: 1")
    elif nnp is None and gvisor:
        report.add(
            scope, "no-new-privileges", SKIP, "not reported inside gVisor (the engine passes it to runsc)"
        )
    else:
        report.add(
            scope,
            "no-new-privileges",
            FAIL,
            f"NoNewPrivs: {nnp}",
            "create the container with security_opt no-new-privileges:true",
        )

    seccomp = status.get("Seccomp")
    if seccomp == "2":
        report.add(scope, "seccomp filter", OK, "Seccomp: 2 (filter mode)")
    elif gvisor:
        report.add(
            scope,
            "seccomp filter",
            SKIP,
            f"Seccomp: {seccomp}; {gvisor_note}; the OCI seccomp profile is not applied inside it",
        )
    else:
        report.add(
            scope,
            "seccomp filter",
            FAIL,
            f"Seccomp: {seccomp}",
            "create the container with AgentNest's seccomp profile",
        )

    root_options = str(seen.get("root_options", ""))
    root_write = str(seen.get("root_write", "?"))
    read_only = "ro" in root_options.split(",") and root_write != "succeeded"
    report.add(
        scope,
        "read-only root",
        OK if read_only else FAIL,
        f"/ mounted {root_options.split(',')[0] or '?'}; writing /agentnest-doctor-probe: {root_write}",
        "create the container with read_only=True",
    )

    interfaces = [str(i) for i in seen.get("interfaces") or []]
    report.add(
        scope,
        "no network",
        OK if interfaces == ["lo"] else FAIL,
        f"interfaces: {', '.join(interfaces) or 'none'}",
        "the sandbox has a network interface besides loopback; use network_mode=none",
    )

    _limit_check(
        report,
        scope,
        "memory limit",
        limits.memory,
        seen.get("memory") or {},
        human_bytes,
        gvisor,
        fallback=_mem_total(seen),
    )
    _limit_check(
        report,
        scope,
        "process limit",
        limits.pids,
        seen.get("pids") or {},
        str,
        gvisor,
        engine_value=engine_pids,
    )

    size = seen.get("workspace_bytes")
    bounded = isinstance(size, int) and 0 < size <= limits.workspace
    report.add(
        scope,
        "workspace size",
        OK if bounded else FAIL,
        f"/workspace holds at most {human_bytes(size) if isinstance(size, int) else size} "
        f"(limit {human_bytes(limits.workspace)})",
        "/workspace must be a size-limited tmpfs",
    )


def _limit_check(
    report: _Report,
    scope: str,
    name: str,
    expected: int,
    files: dict[str, Any],
    show: Callable[[int], str],
    gvisor: bool,
    *,
    fallback: int | None = None,
    engine_value: int | None = None,
) -> None:
    """A cgroup limit as seen from inside, v1 or v2 file, with a gVisor fallback."""
    for path, raw in files.items():
        if raw is None:
            continue
        value = str(raw).strip()
        if value.isdigit() and int(value) == expected:
            report.add(scope, name, OK, f"{show(expected)} ({path})")
        else:
            report.add(
                scope,
                name,
                FAIL,
                f"{path} says {value!r}, expected {show(expected)}",
                "the engine did not apply the limit; check the container's HostConfig",
            )
        return
    if fallback is not None and fallback == expected:
        report.add(scope, name, OK, f"{show(expected)} (MemTotal: gVisor sizes its kernel to the limit)")
    elif gvisor:
        set_on = f"; the engine has {engine_value} set on the container" if engine_value is not None else ""
        report.add(scope, name, SKIP, f"no cgroup files visible inside gVisor{set_on}")
    else:
        report.add(
            scope,
            name,
            FAIL,
            "no cgroup limit file is visible inside the sandbox",
            "the engine did not apply the limit, or cgroups are hidden",
        )


def _create_hint(exc: AgentNestError) -> str:
    if isinstance(exc, ImageNotFoundError):
        return "build the default image: `agentnest image base` (or `make image`)"
    if isinstance(exc, RuntimeNotAvailableError):
        return "install the OCI runtime and register it with the engine (see the message)"
    return "see the message; `agentnest run -- true` reproduces it"


def _mem_total(seen: dict[str, Any]) -> int | None:
    raw = str(seen.get("mem_total_kib", ""))
    return int(raw) * 1024 if raw.isdigit() else None


def _engine_pids_limit(backend: RuntimeBackend, sandbox_id: str) -> int | None:
    """``HostConfig.PidsLimit`` of the sandbox's container, if it is a Docker one."""
    from ..runtime.docker import DockerBackend, labels

    if not isinstance(backend, DockerBackend):
        return None
    try:
        found = backend.api.containers(filters={"label": [f"{labels.SANDBOX}={sandbox_id}"]})
        if not found:
            return None
        value = backend.api.inspect_container(found[0]["Id"])["HostConfig"].get("PidsLimit")
    except Exception:  # informational only: any engine hiccup just hides the value
        return None
    return value if isinstance(value, int) else None


def _is_hex(value: str) -> bool:
    try:
        int(value, 16)
    except ValueError:
        return False
    return True


def _first_clause(message: str) -> str:
    return message.split(";")[0]


__all__ = ["Check", "handle", "register"]
