"""``agentnest kubernetes``: render what the Kubernetes backend would create.

``manifest`` prints the objects one sandbox gets (its Pod, NetworkPolicies,
the egress proxy's objects, its Secret without values), one document each,
so a platform team can review or lint them before anything reaches a
cluster.  ``setup NAMESPACE`` creates (or brings up to date) the namespace's
objects (PSA labels, ResourceQuota, LimitRange, Role, RoleBinding) and checks
the RuntimeClass; with ``--dry-run`` it prints them instead.  ``manifest``
and ``--dry-run`` are pure: no cluster is contacted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..config import parse_size
from ..errors import ConfigurationError
from ._output import Commands, add_command, add_profile_options, env_pair, error, positive_float

_EPILOG = """\
Objects print as YAML documents (`-o yaml`, the default; plain JSON-style
YAML when PyYAML is not installed) or as a stream of JSON objects (`-o json`);
either feeds `kubectl apply --dry-run=server -f -`.  Secrets print without
their values.  Options left out come from --profile, else the defaults.

examples:
  agentnest kubernetes manifest
  agentnest kubernetes manifest --network allowlist --allow-domain pypi.org -o json
  agentnest kubernetes manifest --profile strict --namespace sandboxes --memory 1g
  agentnest kubernetes setup agentnest --dry-run --service-account agentnest
  agentnest kubernetes setup agentnest --context prod --pods 100 --quota-memory 64g
"""

#: The placeholder value of ``--secret NAME`` (printed redacted either way).
_SECRET_PLACEHOLDER = "agentnest-preview-secret"  # noqa: S105 - a placeholder, not a password


def register(commands: Commands) -> None:
    """Add ``kubernetes`` (``manifest``, ``setup``) to the command line."""
    parser = add_command(
        commands,
        "kubernetes",
        "render the Kubernetes objects of a sandbox or a namespace",
        "Print the Kubernetes objects AgentNest would create, without contacting a cluster.",
        _EPILOG,
    )
    sub = parser.add_subparsers(dest="kubernetes_command", metavar="SUBCOMMAND", title="subcommands")
    manifest = sub.add_parser(
        "manifest",
        help="print the objects one sandbox gets",
        description="Print the Pod, NetworkPolicies, proxy objects and Secret (without values) "
        "of one sandbox.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_output(manifest)
    manifest.add_argument("--namespace", default="agentnest", help="the namespace (default: agentnest)")
    manifest.add_argument("--image", help="image to run (default: the profile's, else the base image)")
    manifest.add_argument("--memory", help="memory limit, e.g. 512m or 2g (default: 512m)")
    manifest.add_argument("--cpus", type=positive_float, help="CPU limit in cores (default: 1.0)")
    manifest.add_argument(
        "--lifetime", type=positive_float, metavar="SECONDS", help="the sandbox's lifetime (default: 300)"
    )
    manifest.add_argument("--network", choices=("denied", "allowlist", "open"), help="network mode")
    manifest.add_argument(
        "--allow-domain",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="a domain the proxy admits (repeatable; implies --network allowlist)",
    )
    manifest.add_argument("--workspace", choices=("memory", "disk"), help="where /workspace lives")
    manifest.add_argument("--workspace-size", help="size of /workspace, e.g. 256m or 10g")
    manifest.add_argument(
        "--storage-class", help="StorageClass of a disk workspace (a generic ephemeral volume)"
    )
    manifest.add_argument(
        "--runtime-class",
        default="gvisor",
        help="RuntimeClass of the pod; 'none' for the cluster default (default: gvisor)",
    )
    manifest.add_argument("--seccomp", default="RuntimeDefault", help="RuntimeDefault or Localhost:<path>")
    manifest.add_argument(
        "--env",
        action="append",
        default=[],
        type=env_pair,
        metavar="NAME=VALUE",
        help="an environment variable",
    )
    manifest.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME",
        help="an environment variable held as a Secret (printed without its value)",
    )
    manifest.add_argument("--owner", default="", help="the owner label (default: none)")
    manifest.add_argument("--tenant", default="", help="the tenant label (default: none)")
    manifest.add_argument("--sandbox-id", help="the sandbox id (default: a random one)")
    add_profile_options(manifest)
    manifest.set_defaults(handler=handle_manifest)

    setup = sub.add_parser(
        "setup",
        help="create or update a sandbox namespace (--dry-run: print its objects)",
        description="The namespace with PSA restricted labels, a ResourceQuota, a LimitRange, "
        "the backend's Role and a RoleBinding.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    setup.add_argument("namespace", metavar="NAMESPACE")
    setup.add_argument("--dry-run", action="store_true", help="print the objects instead of creating them")
    _add_output(setup)
    who = setup.add_mutually_exclusive_group()
    who.add_argument("--service-account", default="agentnest", help="bind the Role to this ServiceAccount")
    who.add_argument("--user", help="bind the Role to this user instead")
    who.add_argument("--group", help="bind the Role to this group instead")
    setup.add_argument("--pods", type=int, default=50, help="the quota's pod count (default: 50)")
    setup.add_argument("--quota-memory", default="32g", help="the quota's memory (default: 32g)")
    setup.add_argument(
        "--quota-cpus", type=positive_float, default=32.0, help="the quota's CPUs (default: 32)"
    )
    setup.add_argument(
        "--pod-security-version", default="latest", help="PSA policy version (default: latest)"
    )
    setup.add_argument(
        "--runtime-class",
        default="gvisor",
        help="the RuntimeClass sandboxes use, checked to exist ('none': skip; default: gvisor)",
    )
    setup.add_argument("--context", help="the kubeconfig context (default: the current one)")
    setup.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    setup.set_defaults(handler=handle_setup)
    parser.set_defaults(handler=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="output format (default: yaml)"
    )


def dump(objects: Sequence[dict[str, Any]], output: str) -> str:
    """The objects as YAML documents or a stream of JSON objects, one each."""
    if output == "json":
        return "".join(json.dumps(obj, indent=2) + "\n" for obj in objects)
    try:
        # Imported by name: PyYAML is optional and has no stubs here.
        yaml: Any = importlib.import_module("yaml")
    except ImportError:
        # JSON is YAML: without PyYAML each document is its JSON form.
        return "".join(f"---\n{json.dumps(obj, indent=2)}\n" for obj in objects)
    return "".join("---\n" + yaml.safe_dump(obj, sort_keys=False, width=10**9) for obj in objects)


def _config(args: argparse.Namespace) -> Any:
    from ..config import ResourceLimits, SandboxConfig
    from ..policy import NetworkPolicy
    from ..secrets import Secret
    from ._output import profile_from_args

    profile = profile_from_args(args)
    given: dict[str, Any] = profile.sandbox_kwargs() if profile is not None else {}
    image = args.image or given.get("image")
    if image is None:
        from ..sandbox import default_image

        image = default_image()
    network = given["security_policy"].network if "security_policy" in given else NetworkPolicy.denied()
    if args.allow_domain:
        if args.network not in (None, "allowlist"):
            raise ConfigurationError(f"--allow-domain goes with --network allowlist, not {args.network}")
        network = NetworkPolicy.allowlist(args.allow_domain)
    elif args.network == "allowlist" and not network.domains and not network.cidrs:
        raise ConfigurationError("--network allowlist needs at least one --allow-domain")
    elif args.network == "denied":
        network = NetworkPolicy.denied()
    elif args.network == "open":
        network = NetworkPolicy.open()
    medium = args.workspace or given.get("workspace") or ("disk" if args.storage_class else "memory")
    size = args.workspace_size or given.get("workspace_size")
    limits = ResourceLimits.build(
        memory=args.memory or given.get("memory") or "512m",
        cpus=args.cpus or given.get("cpus") or 1.0,
        pids=given.get("pids") or 256,
        workspace=None if size is None else parse_size(size, "workspace_size"),
        scratch=given.get("scratch_size"),
        workspace_medium=medium,
    )
    environment: dict[str, Any] = dict(given.get("environment") or {})
    environment.update(dict(args.env))
    for name in args.secret:
        environment[name] = Secret(_SECRET_PLACEHOLDER)
    config = SandboxConfig(
        image=image,
        lifetime=args.lifetime or given.get("timeout") or 300.0,
        environment=environment,
        network=network,
        limits=limits,
        read_only_root=given.get("read_only_root", True),
    )
    if "security_policy" in given:
        reason = given["security_policy"].check_limits(config.limits, config.lifetime)
        if reason:
            raise ConfigurationError(f"the profile's policy refuses these settings: {reason}")
    return config


def handle_manifest(args: argparse.Namespace) -> int:
    """Print the objects of one sandbox; lint problems are warnings on stderr."""
    from ..runtime.kubernetes import KubernetesSpec
    from ..runtime.kubernetes.lint import lint
    from ..runtime.kubernetes.manifests import render

    config = _config(args)
    spec = KubernetesSpec(
        namespace=args.namespace,
        runtime_class_name=None if args.runtime_class == "none" else args.runtime_class,
        workspace_storage_class=args.storage_class,
        seccomp=args.seccomp,
    )
    sandbox_id = args.sandbox_id or os.urandom(6).hex()
    objects = render(
        config,
        spec,
        sandbox_id,
        now=time.time(),
        owner=args.owner,
        tenant=args.tenant,
        secret_values=False,
    )
    for obj in objects:
        for problem in lint(obj, writable_root=not config.read_only_root):
            error(f"warning: {obj['kind']} {obj['metadata']['name']}: {problem}")
    sys.stdout.write(dump(objects, args.output))
    return 0


def handle_setup(args: argparse.Namespace) -> int:
    """Create or update the namespace's objects (``--dry-run``: print them)."""
    from ..runtime.kubernetes.manifests import setup_objects

    if args.user:
        kind, name = "User", args.user
    elif args.group:
        kind, name = "Group", args.group
    else:
        kind, name = "ServiceAccount", args.service_account
    objects = setup_objects(
        args.namespace,
        subject_kind=kind,
        subject_name=name,
        pods=args.pods,
        memory=parse_size(args.quota_memory, "--quota-memory"),
        cpus=args.quota_cpus,
        pod_security_version=args.pod_security_version,
    )
    if args.dry_run:
        sys.stdout.write(dump(objects, args.output))
        return 0
    return _apply_setup(args, objects)


def _apply_setup(args: argparse.Namespace, objects: list[dict[str, Any]]) -> int:
    """Create or update the objects in the cluster of the kubeconfig, then check the RuntimeClass."""
    from ..runtime.kubernetes.api import KubeApi
    from ..runtime.kubernetes.connection import from_kube_config
    from ..runtime.kubernetes.kubeconfig import load
    from ..runtime.kubernetes.rest import KubeRest
    from ..runtime.kubernetes.setup import apply_setup

    cluster = load(args.kubeconfig, args.context)
    rest = KubeRest(from_kube_config(cluster.configuration))
    runtime_class = None if args.runtime_class == "none" else args.runtime_class
    try:
        report = apply_setup(KubeApi(rest, args.namespace), objects, runtime_class=runtime_class)
    finally:
        rest.close()
    for verb, kind, name in report.actions:
        print(f"{verb:9} {kind} {name}")
    if report.runtime_class_problem:
        error(report.runtime_class_problem)
        # Not found is a setup that cannot run sandboxes as configured; unreadable is only a warning.
        return 1 if report.runtime_class_found is False else 0
    if runtime_class is not None:
        print(f"RuntimeClass {runtime_class} exists")
    return 0
