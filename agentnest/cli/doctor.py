"""``agentnest doctor``: check the engine, and that a sandbox's limits are really enforced."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .. import verify
from ..errors import AgentNestError, ImageNotFoundError, RuntimeNotAvailableError
from ._output import Commands, add_command, status
from ._workspace import Workspace, read_workspace

if TYPE_CHECKING:
    from ..runtime.base import RuntimeBackend
    from ..runtime.docker import DockerBackend
    from ..sandbox import Sandbox

from ..verify import FAIL, OK, SKIP

WARN = "warn"  # works, but something an operator should fix: never a failure

ENGINE_HINT = "start it with `make engine` or `sudo systemctl start docker` (or set DOCKER_HOST)"

_EPILOG = """\
Checks, one line each (OK, FAIL with a fix, WARN with a fix but not a
failure, or SKIP when a fact cannot be seen from here): the engine answers;
the runc and runsc (gVisor) OCI runtimes are registered; live-restore
(sandboxes survive a restart of dockerd; WARN when off); the storage pool for disk workspaces is mounted
(optional); whether the engine can give GPUs, on runc and under gVisor's
opt-in nvproxy (optional: never a failure); the default image is present;
then, inside a real
sandbox per backend, that the limits hold: uid 65532, no capabilities,
no-new-privileges, seccomp, read-only root, loopback only, memory, process
and workspace limits.  By default the sandbox checks run on docker, and on
gvisor too when runsc is registered.  Exit code 0 when nothing failed.

examples:
  agentnest doctor
  agentnest doctor --backend gvisor
  agentnest doctor --json | python3 -m json.tool
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
        warned = [c for c in report.checks if c.status == WARN]
        if warned:
            print(f"{len(warned)} warning(s): {', '.join(f'{c.scope}: {c.name}' for c in warned)}")
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
    _live_restore_check(report, scope, info)
    try:
        with map_docker_errors("looking up the default image", image):
            present = image_exists(docker.api, image)
    except AgentNestError as exc:
        report.add(scope, "default image", FAIL, str(exc))
        return True
    _storage_check(report, scope, docker)
    _gpu_checks(report, scope, docker)
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


LIVE_RESTORE_FIX = (
    '`make engine`, or add "live-restore": true to /etc/docker/daemon.json on the engine\'s host '
    "and reload dockerd: `kill -HUP $(pidof dockerd)` (or `systemctl reload docker`)"
)


def _live_restore_check(report: _Report, scope: str, info: dict[str, Any]) -> None:
    """live-restore: without it every sandbox dies when dockerd restarts; a warning, never a failure."""
    name = "live-restore"
    enabled = info.get("LiveRestoreEnabled")
    swarm = (info.get("Swarm") or {}).get("LocalNodeState") or "inactive"
    if enabled is True:
        report.add(scope, name, OK, "on: sandboxes keep running while dockerd restarts")
    elif enabled is None:
        report.add(scope, name, SKIP, "the engine does not report LiveRestoreEnabled")
    elif swarm != "inactive":
        report.add(
            scope,
            name,
            WARN,
            f"off: sandboxes are stopped when dockerd restarts; this engine is in swarm mode ({swarm}), "
            "which Docker refuses together with live-restore",
            "leave the swarm (`docker swarm leave`) if this engine does not need it, then `make engine`; "
            "in swarm mode live-restore cannot be enabled",
        )
    else:
        report.add(scope, name, WARN, "off: sandboxes are stopped when dockerd restarts", LIVE_RESTORE_FIX)


def _storage_check(report: _Report, scope: str, docker: DockerBackend) -> None:
    """The storage pool of disk workspaces: optional (without it workspaces live in memory)."""
    from ..runtime import storage

    name = "storage pool"
    if not storage.local_engine(docker.spec.docker_host):
        report.add(scope, name, SKIP, "the engine is not on this host: workspaces live in memory")
        return
    status = storage.probe(docker.spec.storage)
    if status.ready:
        report.add(
            scope,
            name,
            OK,
            f"{status.root}: {storage.human_size(status.free)} free of {storage.human_size(status.size)}, "
            f"{status.workspaces} workspace(s)",
        )
    else:
        report.add(
            scope,
            name,
            SKIP,
            f"{status.detail}: workspaces live in memory (at most the memory limit)",
            "make it as root: `agentnest setup` (or `make engine`)",
        )


def _gpu_checks(report: _Report, scope: str, docker: DockerBackend) -> None:
    """GPUs: optional, so OK or SKIP with the fix, never FAIL (see runtime/docker/gpus.py)."""
    try:
        runc = docker.gpu_support("runc")
    except AgentNestError as exc:  # informational: an engine hiccup only hides the answer
        report.add(scope, "gpu", SKIP, f"could not tell: {exc}")
        return
    if runc.available:
        detail = runc.describe() + ("" if runc.verified else "; the engine accepts or refuses at create")
        report.add(scope, "gpu", OK, detail)
    else:
        report.add(scope, "gpu", SKIP, f"no GPU for sandboxes (optional): {runc.reason}", runc.fix)
    runtimes = docker.engine_info().get("Runtimes") or {}
    name = "gpu (gVisor nvproxy)"
    if "runsc" not in runtimes:
        report.add(scope, name, SKIP, "runsc is not registered (optional)")
        return
    gvisor = docker.gpu_support("runsc")
    if gvisor.available:
        report.add(scope, name, OK, gvisor.describe())
    elif not gvisor.nvproxy:
        report.add(scope, name, SKIP, "nvproxy is opt-in and off for runsc (optional)", gvisor.fix)
    else:
        report.add(scope, name, SKIP, f"nvproxy is on, but {gvisor.reason}", gvisor.fix)


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
        with status(f"creating a sandbox on {name}"):
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
            seen = sandbox.exec_json(verify.PROBE, timeout=60)
        except AgentNestError as exc:
            report.add(scope, "probe", FAIL, f"could not run the probe: {exc}")
            return
        if not isinstance(seen, dict):
            report.add(scope, "probe", FAIL, f"unexpected probe output {seen!r:.200}")
            return
        try:
            workspace = read_workspace(sandbox)
        except AgentNestError as exc:
            report.add(scope, "workspace", FAIL, f"could not look at the workspace: {exc}")
            return
        _judge(report, scope, sandbox, seen, gvisor, _engine_pids_limit(backend, sandbox.id), workspace)
    finally:
        sandbox.destroy()


def _judge(
    report: _Report,
    scope: str,
    sandbox: Sandbox,
    seen: dict[str, Any],
    gvisor: bool,
    engine_pids: int | None,
    workspace: Workspace,
) -> None:
    """Compare what the probes saw with the sandbox's configuration (see :mod:`agentnest.verify`)."""
    config = sandbox.config
    network = getattr(getattr(config, "network", None), "mode", None)
    asked = config.limits.workspace_medium
    # What the sandbox got, as its own mount table shows it: never assumed from the config.
    report.add(
        scope,
        "workspace",
        OK if workspace.medium == asked else FAIL,
        workspace.describe(),
        f"a {asked} workspace was asked for; `agentnest setup` makes the storage pool of disk workspaces",
    )
    quota = workspace.quota if asked == "disk" else None
    for finding in verify.judge(
        seen,
        config.limits,
        gvisor=gvisor,
        network=network.value if network is not None else "denied",
        engine_pids=engine_pids,
        workspace_quota=quota,
    ):
        report.add(scope, finding.name, finding.status, finding.detail, finding.hint)


def _create_hint(exc: AgentNestError) -> str:
    if isinstance(exc, ImageNotFoundError):
        return "build the default image: `agentnest image base` (or `make image`)"
    if isinstance(exc, RuntimeNotAvailableError):
        return "install the OCI runtime and register it with the engine (see the message)"
    return "see the message; `agentnest run -- true` reproduces it"


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


def _first_clause(message: str) -> str:
    return message.split(";")[0]


__all__ = ["Check", "handle", "register"]
