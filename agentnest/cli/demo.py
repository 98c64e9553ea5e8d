"""``agentnest demo``: a guided tour of what a sandbox allows and what it blocks."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from ..errors import ExecutionTimeoutError, SandboxDestroyedError
from ._output import Commands, add_command, human_bytes, mark, positive_float
from ._workspace import Workspace, read_workspace

if TYPE_CHECKING:
    from ..sandbox import Sandbox

_EPILOG = """\
Each step runs something real in the sandbox, shows its output, and prints
a ✓ line for what it proved (✗ if it did not hold).  Nothing leaves this
machine: the network step only tries a documentation address (192.0.2.1),
which fails at once because the sandbox has no route anywhere.
Exit code 0 when every check held, 1 otherwise.

examples:
  agentnest demo
  agentnest demo --backend gvisor
"""

STEPS = 7

#: Lists the interfaces and tries one TCP connection to TEST-NET-1 (RFC 5737),
#: an address reserved for documentation: even with a network it leads nowhere.
_NETWORK_PROBE = """\
import errno, json, socket
ifaces = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:] if ":" in l]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(3)
try:
    s.connect(("192.0.2.1", 53))
    outcome, unreachable = "connected", False
except OSError as e:
    outcome = e.strerror or type(e).__name__
    unreachable = e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH)
print(json.dumps({"interfaces": ifaces, "outcome": outcome, "unreachable": unreachable}))
"""

_ROOT_OPTIONS = "print([l.split()[3] for l in open('/proc/self/mounts') if l.split()[1] == '/'][-1])"


def register(commands: Commands) -> None:
    """Add ``demo`` to the command line."""
    parser = add_command(
        commands,
        "demo",
        "a step-by-step tour of a sandbox's isolation",
        "Create a sandbox and show, step by step, what it isolates: user, filesystem, network, "
        "files, timeouts and clean-up.",
        _EPILOG,
    )
    parser.add_argument(
        "--backend", default="docker", help="docker (runc), gvisor (runsc), ... (default: docker)"
    )
    parser.add_argument("--image", help="image to use (default: the AgentNest base image)")
    parser.add_argument(
        "--lifetime",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
        help="sandbox lifetime (default: 120)",
    )
    parser.set_defaults(handler=handle)


class _Tour:
    """Numbered headings, indented output and ✓/✗ lines; counts failures."""

    def __init__(self) -> None:
        self.number = 0
        self.failures = 0

    def step(self, title: str) -> None:
        self.number += 1
        print(f"\n[{self.number}/{STEPS}] {title}", flush=True)

    def info(self, text: str) -> None:
        for line in text.rstrip("\n").splitlines() or [""]:
            print(f"    {line}")

    def command(self, shown: str, output: str) -> None:
        print(f"    $ {shown}")
        for line in output.rstrip("\n").splitlines():
            print(f"    {line}")

    def check(self, ok: bool, proof: str, failure: str) -> bool:
        print(f"  {mark(ok)} {proof if ok else failure}", flush=True)
        if not ok:
            self.failures += 1
        return ok


def handle(args: argparse.Namespace) -> int:
    """Walk through the tour; 0 when every check held."""
    from ..sandbox import Sandbox

    tour = _Tour()
    print(f"AgentNest demo: a tour of one sandbox (backend {args.backend})")
    tour.step("Create a sandbox")
    started = time.monotonic()
    sandbox = Sandbox(args.image, args.lifetime, backend=args.backend)
    try:
        limits = sandbox.config.limits
        tour.info(f"id        {sandbox.id}")
        tour.info(f"image     {sandbox.config.image}")
        tour.info(f"backend   {args.backend}")
        tour.info(
            f"limits    memory {human_bytes(limits.memory)}, {limits.cpus:g} CPU, {limits.pids} processes, "
            f"{sandbox.config.workdir} {human_bytes(limits.workspace)}"
        )
        # What the sandbox got, read from it and from the backend: never assumed from the config.
        workspace = read_workspace(sandbox)
        tour.info(f"workspace {workspace.describe()}")
        tour.check(
            True,
            f"created in {time.monotonic() - started:.1f}s; it stops itself in {args.lifetime:g}s "
            "even if this process dies",
            "",
        )
        _who(tour, sandbox)
        _read_only(tour, sandbox)
        _network(tour, sandbox)
        _files(tour, sandbox, workspace)
        _timeout(tour, sandbox)
        tour.step("Destroy it")
        sandbox.destroy()
        _destroyed(tour, sandbox)
    finally:
        sandbox.destroy()
    print()
    if tour.failures:
        print(f"{mark(False)} {tour.failures} check(s) did not hold; run `agentnest doctor` for details")
        return 1
    print(f"{mark(True)} all {STEPS} steps passed")
    return 0


def _who(tour: _Tour, sandbox: Sandbox) -> None:
    tour.step("Who runs the code?")
    result = sandbox.exec(["id"])
    tour.command("id", result.output)
    tour.check(
        result.ok and result.stdout.startswith("uid=65532"),
        "commands run as the unprivileged user 65532, never root",
        "the command did not run as uid 65532",
    )


def _read_only(tour: _Tour, sandbox: Sandbox) -> None:
    tour.step("The system files cannot be changed")
    script = "echo tampered > /etc/agentnest-demo"
    result = sandbox.exec(["/bin/sh", "-c", script])
    tour.command(script, result.output or f"(exit code {result.exit_code})")
    options = sandbox.exec(["python3", "-c", _ROOT_OPTIONS]).stdout.strip()
    tour.info(f"/ is mounted {options.split(',')[0] or '(unknown)'} (its first option in /proc/self/mounts)")
    tour.check(
        result.exit_code != 0 and "ro" in options.split(","),
        "the write failed and / is mounted read-only: only /workspace and /tmp are writable",
        "the root filesystem is writable",
    )


def _network(tour: _Tour, sandbox: Sandbox) -> None:
    tour.step("There is no network")
    report: Any = sandbox.exec_json(_NETWORK_PROBE, timeout=30)
    interfaces = report.get("interfaces") if isinstance(report, dict) else None
    outcome = report.get("outcome") if isinstance(report, dict) else None
    tour.command("python3 -c '... list /proc/net/dev; connect to 192.0.2.1:53 ...'", "")
    tour.info(f"interfaces: {', '.join(interfaces or []) or '(none)'}")
    tour.info(f"connect to 192.0.2.1:53: {outcome}")
    tour.check(
        interfaces == ["lo"] and bool(report.get("unreachable")),
        f"only loopback exists, and a connection fails at once ({outcome}): there is no route out",
        f"the sandbox has a way out (interfaces {interfaces}, connect: {outcome})",
    )


def _files(tour: _Tour, sandbox: Sandbox, workspace: Workspace) -> None:
    tour.step(f"Files live in {workspace.path}")
    sandbox.write_file("notes/hello.txt", "written by the host\n")
    script = "echo 'appended inside the sandbox' >> notes/hello.txt && cat notes/hello.txt"
    result = sandbox.exec(["/bin/sh", "-c", script])
    tour.command(script, result.output)
    text = sandbox.read_file("notes/hello.txt")
    tour.check(
        result.ok and text == "written by the host\nappended inside the sandbox\n",
        f"the host wrote, the sandbox appended, the host read it back ({workspace.describe()})",
        f"the file round trip failed: {text!r}",
    )


def _timeout(tour: _Tour, sandbox: Sandbox) -> None:
    tour.step("A runaway command is stopped, the sandbox is not")
    script = "echo started; sleep 30; echo never"
    print(f"    $ {script}    (timeout=1)", flush=True)
    started = time.monotonic()
    try:
        sandbox.exec(["/bin/sh", "-c", script], timeout=1)
    except ExecutionTimeoutError as exc:
        elapsed = time.monotonic() - started
        partial = exc.result.stdout if exc.result is not None else ""
        tour.info(f"ExecutionTimeoutError after {elapsed:.1f}s: {exc}")
        tour.info(f"partial output: {partial!r}")
        tour.check(
            "started" in partial and "never" not in partial and elapsed < 15,
            "killed after 1 s with its whole process tree; the output so far was kept",
            f"unexpected partial output {partial!r} after {elapsed:.1f}s",
        )
    else:
        tour.check(False, "", "the command was not stopped by its timeout")
    result = sandbox.exec(["cat", "notes/hello.txt"], timeout=10)
    tour.command("cat notes/hello.txt", result.output)
    tour.check(
        result.ok and "written by the host" in result.stdout,
        "the sandbox still answers and its files are intact",
        "the sandbox did not survive the timeout",
    )


def _destroyed(tour: _Tour, sandbox: Sandbox) -> None:
    try:
        sandbox.exec(["true"])
        refused = False
    except SandboxDestroyedError:
        refused = True
    leftovers = _leftover_containers(sandbox)
    if leftovers is not None:
        tour.info(f"containers left on the engine for sandbox {sandbox.id}: {leftovers}")
    tour.check(
        sandbox.destroyed and refused and not leftovers,
        "the container and everything in it are gone; the sandbox refuses further commands",
        "the sandbox is still there",
    )


def _leftover_containers(sandbox: Sandbox) -> int | None:
    """How many engine containers still carry the sandbox's label (None: not a Docker backend)."""
    from ..runtime.docker import DockerBackend, labels, map_docker_errors

    backend = sandbox.backend
    if not isinstance(backend, DockerBackend):
        return None
    with map_docker_errors("listing containers"):
        found = backend.api.containers(all=True, filters={"label": [f"{labels.SANDBOX}={sandbox.id}"]})
    return len(found)


__all__ = ["handle", "register"]
