"""Where the cluster is and who we are to it: kubeconfig, contexts, in-cluster config.

The official client's loaders do the reading (contexts, exec plugins such as
EKS's and GKE's, the in-cluster token that is re-read every minute, proxies,
``tls_server_name``); this module only chooses among them and turns what goes
wrong into errors of the one tree that say how to fix it.  The ``kubernetes``
package is imported here, on first use, never by ``import agentnest``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError, MissingDependencyError, RuntimeNotAvailableError

if TYPE_CHECKING:
    from kubernetes.client import Configuration

__all__ = ["ClusterConfig", "load"]

#: Where a pod finds its service account (the in-cluster config).
_IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 - a path
#: A kubeconfig is a few KiB; anything past this is not one.
_MAX_KUBECONFIG = 16 << 20


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A loaded client configuration and where it came from (for messages)."""

    configuration: Configuration
    source: str
    """``kubeconfig <paths> (context <name>)`` or ``in-cluster``."""
    context: str | None
    namespace: str | None
    """The context's namespace, if it names one."""

    @property
    def host(self) -> str:
        return str(self.configuration.host)


def _client() -> Any:
    import importlib.util

    spec = importlib.util.find_spec("kubernetes")
    if spec is not None and spec.submodule_search_locations is None:
        # A script named kubernetes.py (0.3.0's own example is one) puts its
        # directory first on sys.path: importing "kubernetes" would run it.
        raise MissingDependencyError(
            f"{spec.origin} shadows the kubernetes package that the Kubernetes backend needs; "
            "rename that file, or run it from elsewhere with runpy (see docs/kubernetes.md)"
        )
    try:
        import kubernetes.client
        import kubernetes.config
    except ImportError as exc:  # pragma: no cover - the extra is a test dependency
        raise MissingDependencyError(
            "the Kubernetes backend needs the 'kubernetes' package: pip install 'agentnest[kubernetes]'"
        ) from exc
    return kubernetes


def _paths(kubeconfig: str | os.PathLike[str] | None) -> list[Path]:
    if kubeconfig is not None:
        raw = os.fspath(kubeconfig)
    else:
        raw = os.environ.get("KUBECONFIG", "") or "~/.kube/config"
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def load(
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    *,
    in_cluster: bool | None = None,
) -> ClusterConfig:
    """Load the client configuration.

    ``kubeconfig``: a path or an ``os.pathsep``-separated list of paths
    (default ``$KUBECONFIG``, then ``~/.kube/config``), merged as kubectl
    merges them.  ``context``: a context of it (default: its current one).
    ``in_cluster``: ``True`` uses the pod's service account; ``None`` uses it
    only when there is no kubeconfig and the process runs in a pod.

    Raises:
        ConfigurationError: the kubeconfig is malformed, or has no such context
            (the message lists the ones it has).
        RuntimeNotAvailableError: there is no kubeconfig at all and this is not
            a pod.
    """
    k8s = _client()
    paths = _paths(kubeconfig)
    existing = [p for p in paths if p.is_file()]
    if in_cluster or (in_cluster is None and not existing and _in_a_pod()):
        if context is not None:
            raise ConfigurationError(
                f"context={context!r} was given, but the in-cluster configuration has no contexts; "
                "pass a kubeconfig, or drop the context"
            )
        configuration = k8s.client.Configuration()
        try:
            k8s.config.load_incluster_config(client_configuration=configuration)
        except k8s.config.ConfigException as exc:
            raise RuntimeNotAvailableError(
                f"the in-cluster Kubernetes configuration could not be loaded: {exc}; "
                "run in a pod with a service account token, or pass a kubeconfig"
            ) from exc
        return ClusterConfig(configuration, "in-cluster", None, _pod_namespace())
    if not existing:
        named = ", ".join(str(p) for p in paths) or "(none)"
        raise RuntimeNotAvailableError(
            f"the Kubernetes backend needs a cluster, and no kubeconfig was found (looked at {named}); "
            "point KUBECONFIG or "
            "KubernetesSpec(kubeconfig=...) at one, e.g. the file `kind get kubeconfig` or "
            "`k3s kubectl config view --raw` prints"
        )
    missing = [p for p in paths if not p.is_file()]
    if kubeconfig is not None and missing:
        raise ConfigurationError(
            f"kubeconfig {', '.join(map(str, missing))} does not exist; pass the path of a kubeconfig file"
        )
    contexts, current, used = _contexts(existing)
    joined = os.pathsep.join(str(p) for p in used)
    if not used:
        raise ConfigurationError(
            f"kubeconfig {os.pathsep.join(map(str, existing))} is empty; "
            "point it at the file your cluster gave you"
        )
    name = context if context is not None else current
    chosen = next((c for c in contexts if c.get("name") == name), None)
    if chosen is None:
        have = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
        if context is None:
            raise ConfigurationError(
                f"kubeconfig {joined} has no current context; pick one with context=... (it has: {have}) "
                "or run `kubectl config use-context NAME`"
            )
        raise ConfigurationError(
            f"kubeconfig {joined} has no context {context!r} (it has: {have}); pass one of those as context="
        )
    configuration = k8s.client.Configuration()
    try:
        k8s.config.load_kube_config(
            config_file=joined, context=name, client_configuration=configuration, persist_config=False
        )
    except (k8s.config.ConfigException, ValueError, TypeError, KeyError, OSError) as exc:
        raise ConfigurationError(f"kubeconfig {joined}, context {name!r}: {exc}; fix the file") from exc
    namespace = (chosen.get("context") or {}).get("namespace")
    return ClusterConfig(
        configuration,
        f"kubeconfig {joined} (context {name})",
        str(name),
        namespace if isinstance(namespace, str) else None,
    )


def _contexts(paths: list[Path]) -> tuple[list[dict[str, Any]], str | None, list[Path]]:
    """The contexts of the merged kubeconfig files and the current one, merged as kubectl does.

    The first file to name a context (or a current context) wins.  Read here
    rather than through the client's loader so that a file with no current
    context still lists what it has.
    """
    yaml: Any = importlib.import_module("yaml")  # a dependency of the kubernetes client

    contexts: dict[str, dict[str, Any]] = {}
    current: str | None = None
    used: list[Path] = []
    for path in paths:
        try:
            with path.open("rb") as f:
                raw = f.read(_MAX_KUBECONFIG + 1)
        except OSError as exc:
            raise ConfigurationError(f"kubeconfig {path} cannot be read: {exc.strerror}") from exc
        if len(raw) > _MAX_KUBECONFIG:
            raise ConfigurationError(
                f"kubeconfig {path} is over {_MAX_KUBECONFIG >> 20} MiB; is it a kubeconfig?"
            )
        try:
            doc = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"kubeconfig {path} is not valid YAML: {exc}") from exc
        if doc is None:
            continue  # an empty file in the list: kubectl skips it, the client's loader would not
        used.append(path)
        if not isinstance(doc, dict):
            raise ConfigurationError(
                f"kubeconfig {path} is not a kubeconfig (a YAML mapping with 'contexts')"
            )
        items = doc.get("contexts") or []
        if not isinstance(items, list):
            raise ConfigurationError(f"kubeconfig {path} is not valid: 'contexts' is not a list")
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                contexts.setdefault(item["name"], item)
        named = doc.get("current-context")
        if current is None and isinstance(named, str) and named:
            current = named
    return list(contexts.values()), current, used


def _in_a_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.isfile(_IN_CLUSTER_TOKEN)


def _pod_namespace() -> str | None:
    try:
        text = Path(_IN_CLUSTER_TOKEN).with_name("namespace").read_text("utf-8").strip()
    except OSError:
        return None
    return text or None
