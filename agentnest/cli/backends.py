"""``agentnest backends``: the backends this installation knows, and whether each can run."""

from __future__ import annotations

import argparse

from ..errors import AgentNestError
from ._output import Commands, add_command, print_table

_EPILOG = """\
Built-in backends are Docker with an OCI runtime: docker (runc), gvisor
(runsc) and kata (kata-runtime); each is usable once its runtime is
registered with the engine.  Plug-ins come from the `agentnest.backends`
entry-point group.

examples:
  agentnest backends
  agentnest run --backend gvisor -- uname -a   # use one of them
"""


def register(commands: Commands) -> None:
    """Add ``backends`` to the command line."""
    parser = add_command(
        commands,
        "backends",
        "list the available backends",
        "List every backend name and, for Docker-based ones, whether the engine has their OCI runtime.",
        _EPILOG,
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Print one row per backend."""
    from ..runtime.docker import DockerBackend
    from ..runtime.registry import BUILTIN, available_backends, get_backend

    rows: list[list[str]] = []
    for name in available_backends():
        kind = "built-in" if name in BUILTIN else "plug-in"
        try:
            backend = get_backend(name)
        except Exception as exc:  # a broken plug-in must not hide the others
            rows.append([name, kind, "-", f"cannot load: {str(exc)[:120]}"])
            continue
        if not isinstance(backend, DockerBackend):
            rows.append([name, kind, "-", f"{type(backend).__module__}.{type(backend).__qualname__}"])
            continue
        runtime = backend.spec.oci_runtime
        try:
            runtimes = backend.engine_info().get("Runtimes") or {}
        except AgentNestError:
            status = "engine not reachable"
        else:
            status = "ready" if runtime in runtimes else "runtime not registered with the engine"
        rows.append([name + (" (default)" if name == "docker" else ""), kind, runtime, status])
    print_table(["BACKEND", "KIND", "OCI RUNTIME", "STATUS"], rows)
    return 0
