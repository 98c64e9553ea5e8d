"""``agentnest prune``: remove what expired (or orphaned) sandboxes left on the engine."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from ._output import Commands, add_command, error, status, table

if TYPE_CHECKING:
    from ..runtime.docker.prune import PruneReport

_EPILOG = """\
Only resources labelled agentnest.managed=true are considered: containers
(running or stopped, removed with their anonymous volumes), then networks,
then volumes; then disk workspaces in the storage pool whose sandbox has no
container left (their blocks go back to the host).  By default a resource goes once its deadline label has
passed; --orphans adds those whose owner process on this host has exited;
--all takes every AgentNest resource, running sandboxes included.
With --kubernetes, the cluster of your kubeconfig instead: in each --namespace
(default: every namespace `agentnest kubernetes setup` labelled, else
agentnest), the Pods, Secrets and NetworkPolicies labelled
app.kubernetes.io/managed-by=agentnest whose deadline passed, whose pod ended,
or whose pod is gone; --orphans adds pods whose creating process on this host
has exited (--all: every one).
Exit code 1 if anything could not be removed.

examples:
  agentnest prune --dry-run          # show what would go
  agentnest prune                    # remove what has expired
  agentnest prune --orphans          # ... and what crashed processes left
  agentnest prune --all --sandbox ID # one sandbox, whatever its state (a paused one, say)
  agentnest prune --kubernetes --namespace agents --namespace team-b
"""


def register(commands: Commands) -> None:
    """Add ``prune`` to the command line."""
    parser = add_command(
        commands,
        "prune",
        "remove expired AgentNest containers, networks and volumes",
        "Remove the engine resources of sandboxes past their deadline.",
        _EPILOG,
    )
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    parser.add_argument(
        "--orphans", action="store_true", help="also remove resources whose owner process is gone"
    )
    parser.add_argument(
        "--all",
        dest="everything",
        action="store_true",
        help="remove every AgentNest resource, even running ones",
    )
    parser.add_argument(
        "--sandbox", metavar="ID", help="only the resources of this sandbox (its id, as Sandbox.id)"
    )
    parser.add_argument(
        "--kubernetes", action="store_true", help="prune the namespaces of a Kubernetes cluster instead"
    )
    parser.add_argument(
        "--namespace",
        action="append",
        metavar="NS",
        help="with --kubernetes: a namespace to prune (repeatable; default: every one AgentNest set up)",
    )
    parser.add_argument("--context", help="with --kubernetes: the kubeconfig context")
    parser.add_argument("--kubeconfig", help="with --kubernetes: the kubeconfig file")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Prune and print a table of what went (or would go)."""
    if args.kubernetes:
        return _kubernetes(args)
    if args.namespace or args.context or args.kubeconfig:
        from ..errors import ConfigurationError

        raise ConfigurationError("--namespace, --context and --kubeconfig go with --kubernetes")
    from ..errors import ConfigurationError
    from ..runtime.docker import DockerBackend
    from ..runtime.docker.prune import prune
    from ..runtime.registry import get_backend

    backend = get_backend("docker")
    if not isinstance(backend, DockerBackend):  # pragma: no cover - "docker" is built in
        raise ConfigurationError("the docker backend is not a Docker engine backend")
    now = time.time()
    with status("looking for expired sandboxes" if args.dry_run else "pruning"):
        report = prune(
            backend.api,
            now=now,
            dry_run=args.dry_run,
            orphans=args.orphans,
            everything=args.everything,
            sandbox=args.sandbox,
            pool=backend.storage_pool(),
        )
    print(render(report, now))
    for message in report.errors:
        error(message)
    return 0 if report.ok else 1


def render(report: PruneReport, now: float) -> str:
    """The table of resources and a one-line summary."""
    resources = report.resources
    if not resources:
        return "nothing to prune"
    rows = [
        [r.kind, r.name, r.sandbox or "-", r.reason, _deadline(r.deadline, now), r.owner or "-"]
        for r in resources
    ]
    counts = (
        f"{_plural(len(report.containers), 'container')}, {_plural(len(report.networks), 'network')}, "
        f"{_plural(len(report.volumes), 'volume')}"
    )
    if report.workspaces:
        counts += f", {_plural(len(report.workspaces), 'workspace')}"
    summary = (
        f"would remove {counts} (dry run: nothing was removed)" if report.dry_run else f"removed {counts}"
    )
    return f"{table(['KIND', 'NAME', 'SANDBOX', 'REASON', 'DEADLINE', 'OWNER'], rows)}\n{summary}"


def _deadline(deadline: float | None, now: float) -> str:
    if deadline is None:
        return "-"
    delta = deadline - now
    span = _span(abs(delta))
    return f"{span} ago" if delta < 0 else f"in {span}"


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _managed_namespaces(api: Any) -> list[str]:
    """Every namespace ``agentnest kubernetes setup`` labelled; ``agentnest`` if none or not allowed."""
    from ..errors import BackendError
    from ..runtime.kubernetes.prune import managed_namespaces

    try:
        found = managed_namespaces(api)
    except BackendError as exc:
        # Listing namespaces is cluster-wide: a namespaced user may not; say so, prune the default.
        hint = "name others with --namespace"
        error(f"warning: cannot list namespaces ({exc}); pruning 'agentnest' only ({hint})")
        return ["agentnest"]
    return found or ["agentnest"]


def _kubernetes(args: argparse.Namespace) -> int:
    from ..runtime.kubernetes.api import KubeApi
    from ..runtime.kubernetes.connection import from_kube_config
    from ..runtime.kubernetes.kubeconfig import load
    from ..runtime.kubernetes.prune import prune as prune_cluster
    from ..runtime.kubernetes.rest import KubeRest
    from ..runtime.kubernetes.spec import check_dns_label

    namespaces = list(dict.fromkeys(args.namespace or []))
    for ns in namespaces:
        check_dns_label(ns, "--namespace", "name a namespace AgentNest creates sandboxes in")
    if args.sandbox:
        from ..errors import ConfigurationError

        raise ConfigurationError("--sandbox is not supported with --kubernetes; delete its pod with kubectl")
    cluster = load(args.kubeconfig, args.context)
    rest = KubeRest(from_kube_config(cluster.configuration))
    now = time.time()
    try:
        if not namespaces:
            namespaces = _managed_namespaces(KubeApi(rest, "agentnest"))
        with status("looking for expired sandboxes" if args.dry_run else "pruning"):
            result = prune_cluster(
                [KubeApi(rest, ns) for ns in namespaces],
                now=now,
                dry_run=args.dry_run,
                everything=args.everything,
                orphans=args.orphans,
            )
    finally:
        rest.close()
    if not result.removed:
        print("nothing to prune")
    else:
        rows = [
            [r.kind, f"{r.namespace}/{r.name}", r.sandbox or "-", r.reason, _deadline(r.deadline, now)]
            for r in result.removed
        ]
        done = "would remove" if result.dry_run else "removed"
        tail = " (dry run: nothing was removed)" if result.dry_run else ""
        print(
            f"{table(['KIND', 'NAME', 'SANDBOX', 'REASON', 'DEADLINE'], rows)}\n{done} "
            f"{_plural(len(result.removed), 'object')}{tail}"
        )
    for message in result.errors:
        error(message)
    return 0 if result.ok else 1
