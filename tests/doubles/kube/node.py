"""A node for the cluster double: each admitted Pod runs as a container on the local Docker engine.

The kubelet's part, as far as AgentNest's pods need it: the pod's security
context becomes the container's (user and group, read-only root, capabilities
dropped, ``no-new-privileges``, the runtime's default seccomp profile or a
node-local one), its resources the container's limits, its memory-backed
``emptyDir`` volumes tmpfs mounts with their ``sizeLimit``, its ``secretKeyRef``
environment the Secret's values, its ``runtimeClassName`` the engine's OCI
runtime through the RuntimeClass's handler (``runsc`` for gVisor).  A pod that
a NetworkPolicy isolates in both directions with no rule gets no network, as a
policy-enforcing CNI would give it; pods that policies let talk to each other
(a sandbox and its egress proxy) share a private link network with no route
out (:func:`pod_network`), and a pod whose policy allows ``ipBlock``
destinations also joins the engine's bridge.  The double does not enforce an
``ipBlock``'s ``except`` list (the egress proxy refuses private addresses
itself).  Pods get an address (``status.podIP``), an ``/etc/hosts`` with
their ``hostAliases`` and an ``/etc/resolv.conf`` naming a cluster DNS
address where nothing answers.  The exec endpoint runs ``docker exec``, the
log endpoint ``docker logs``.

Failures come back the way a kubelet reports them: an image the engine does
not have is ``ErrImagePull`` then ``ImagePullBackOff`` (nothing is pulled: the
machines this runs on reach no registry), a handler the engine does not know is
a ``FailedCreatePodSandBox`` event, a missing Secret a
``CreateContainerConfigError``; the main process ending makes the pod
``Succeeded`` or ``Failed`` (``OOMKilled`` when the kernel killed it), and
``activeDeadlineSeconds`` kills it with reason ``DeadlineExceeded``.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentnest.runtime.docker.egress import DEFAULT_SUBNETS, draw_subnets

from .cluster import ClusterState, Node, parse_quantity

__all__ = ["DockerNode", "PodNetwork", "pod_network"]

#: The label on every container and network of the double, for cleaning up.
LABEL = "agentnest.kubedouble"
#: Where link networks are drawn from: RFC 2544's benchmarking range (as the
#: Docker backend's egress networks; a clash is drawn again).
LINK_SUBNETS = ipaddress.IPv4Network(DEFAULT_SUBNETS)
#: The cluster DNS address written into pods' resolv.conf (dnsPolicy
#: ClusterFirst); nothing answers there, as no DNS runs in the double.
CLUSTER_DNS = "10.96.0.10"


@dataclass(frozen=True)
class PodNetwork:
    """What the NetworkPolicies selecting a pod let it reach, as the double wires it."""

    #: No policy selects the pod for egress and ingress both with no rule: False.
    isolated: bool
    #: Link networks (by name) it shares with the pods its policies name.
    links: tuple[str, ...]
    #: Whether it may reach addresses outside the cluster (an ipBlock, or no egress policy).
    outside: bool


def _selects(policy: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    wanted = ((policy.get("spec") or {}).get("podSelector") or {}).get("matchLabels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def link_name(namespace: str, selector: Mapping[str, Any]) -> str:
    """The link network of the pods ``selector`` (``matchLabels``) picks in ``namespace``."""
    labels = sorted(((selector or {}).get("matchLabels") or {}).items())
    digest = hashlib.sha256(repr((namespace, labels)).encode()).hexdigest()[:12]
    return f"kubedouble-link-{digest}"


def pod_network(policies: Iterable[Mapping[str, Any]], pod: Mapping[str, Any]) -> PodNetwork:
    """How the double connects ``pod``, from the NetworkPolicies of its namespace.

    Only the shapes AgentNest writes are understood: ``podSelector`` peers in
    the same namespace (a link network named after the selector, which the
    pod on the other end joins through its own policy's ``podSelector``),
    ``ipBlock`` peers (the bridge), ``namespaceSelector`` peers (ignored: the
    double runs nothing in other namespaces).
    """
    meta = pod.get("metadata") or {}
    ns, labels = str(meta.get("namespace")), meta.get("labels") or {}
    ingress = egress = allowed_in = allowed_out = False
    outside = False
    links: list[str] = []
    for policy in policies:
        if not _selects(policy, labels):
            continue
        spec = policy.get("spec") or {}
        types = spec.get("policyTypes") or ["Ingress"]
        if "Ingress" in types:
            ingress = True
            for rule in spec.get("ingress") or []:
                allowed_in = True
                for peer in rule.get("from") or []:
                    if "podSelector" in peer and "namespaceSelector" not in peer:
                        links.append(link_name(ns, spec.get("podSelector") or {}))
        if "Egress" in types:
            egress = True
            for rule in spec.get("egress") or []:
                allowed_out = True
                peers = rule.get("to") or []
                if not peers:
                    outside = True  # a rule with no peers allows every destination
                for peer in peers:
                    if "ipBlock" in peer:
                        outside = True
                    elif "podSelector" in peer and "namespaceSelector" not in peer:
                        links.append(link_name(ns, peer["podSelector"]))
    if not egress:
        outside = True
    isolated = ingress and egress and not allowed_in and not allowed_out
    return PodNetwork(isolated, tuple(dict.fromkeys(links)), outside and not isolated)


class DockerNode(Node):
    """Runs pods as containers of the local engine.

    Args:
        client: a ``docker.DockerClient`` (default: from the environment).
        seccomp_root: where ``Localhost`` seccomp profiles live (the kubelet's
            ``/var/lib/kubelet/seccomp``).
        pod_pids_limit: the node's ``podPidsLimit`` (there is no pod field).
        images: image name -> the local image the node runs for it (a node's
            registry mirror, or images pre-loaded under another name).
        enforce_network_policies: ``False`` plays a network plugin that
            stores NetworkPolicies and ignores them (kubenet, flannel): every
            pod then shares the node's network (``host``; gVisor's
            ``runsc-host``), so it reaches the apiserver on loopback.
    """

    def __init__(
        self,
        client: Any = None,
        *,
        seccomp_root: Path | None = None,
        pod_pids_limit: int = 1024,
        images: Mapping[str, str] | None = None,
        enforce_network_policies: bool = True,
    ) -> None:
        if client is None:
            import docker

            client = docker.from_env()
        self.client = client
        self.seccomp_root = seccomp_root
        self.pod_pids_limit = pod_pids_limit
        self.images = dict(images or {})
        self.enforce_network_policies = enforce_network_policies
        self._podinfo_tmp = tempfile.TemporaryDirectory(prefix="agentnest-kubenode-")
        self._podinfo_root = Path(self._podinfo_tmp.name)
        self._containers: dict[str, str] = {}  # pod uid -> container id
        self._links: dict[str, list[str]] = {}  # pod uid -> its link networks
        self._lock = threading.Lock()
        self._runtimes: set[str] | None = None
        # This node's own label value: close() removes only what this node made, so two
        # nodes (two test workers, two runs) on one engine never remove each other's pods.
        self.instance = uuid.uuid4().hex[:12]

    def _known_runtimes(self) -> set[str]:
        if self._runtimes is None:
            self._runtimes = set((self.client.info().get("Runtimes") or {}).keys())
        return self._runtimes

    def start(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        # The kubelet works beside the apiserver: never on its loop.
        threading.Thread(target=self._run, args=(cluster, pod), daemon=True, name="kubedouble-node").start()

    def _run(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        import docker.errors

        meta, spec = pod["metadata"], pod["spec"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        container = spec["containers"][0]
        cluster.add_event(ns, name, "Normal", "Scheduled", f"Successfully assigned {ns}/{name} to kubedouble")
        handler = "runc"
        rc_name = spec.get("runtimeClassName")
        if rc_name:
            rc = cluster.get("runtimeclasses", None, rc_name) or {}
            handler = str(rc.get("handler") or "runc")
        if handler not in self._known_runtimes():
            cluster.add_event(
                ns,
                name,
                "Warning",
                "FailedCreatePodSandBox",
                "Failed to create pod sandbox: rpc error: code = Unknown desc = "
                f'failed to get sandbox runtime: no runtime for "{handler}" is configured',
            )
            return
        image = container.get("image", "")
        local = self.images.get(image, image)
        try:
            self.client.images.get(local)
        except docker.errors.ImageNotFound:
            message = f'Failed to pull image "{image}": rpc error: code = NotFound desc = not found'
            cluster.add_event(ns, name, "Warning", "Failed", message)
            cluster.set_pod_status(ns, name, phase="Pending", waiting=("ErrImagePull", message))
            cluster.add_event(ns, name, "Normal", "BackOff", f'Back-off pulling image "{image}"')
            cluster.set_pod_status(
                ns, name, phase="Pending", waiting=("ImagePullBackOff", f'Back-off pulling image "{image}"')
            )
            return
        try:
            kwargs = self._container_args(cluster, pod, handler)
        except _ConfigError as exc:
            cluster.add_event(ns, name, "Warning", "Failed", f"Error: {exc}")
            cluster.set_pod_status(
                ns, name, phase="Pending", waiting=("CreateContainerConfigError", str(exc))
            )
            return
        extra_networks = kwargs.pop("_extra_networks", [])
        links = kwargs.pop("_links", [])
        try:
            for link in links:
                self._ensure_link(link)
            with self._lock:
                self._links[uid] = list(links)
            created = self.client.containers.create(local, **kwargs)
            with self._lock:
                self._containers[uid] = created.id
            for extra in extra_networks:
                self.client.networks.get(extra).connect(created)
            if cluster.get("pods", ns, name) is None:  # deleted meanwhile
                self._remove(uid)
                return
            created.start()
            created.reload()
        except docker.errors.APIError as exc:
            cluster.add_event(ns, name, "Warning", "Failed", f"Error: {exc.explanation}")
            cluster.set_pod_status(
                ns, name, phase="Pending", waiting=("CreateContainerError", str(exc.explanation))
            )
            return
        cluster.add_event(ns, name, "Normal", "Started", f"Started container {container['name']}")
        cluster.set_pod_status(ns, name, phase="Running", running=True, pod_ip=self._address(created, links))
        deadline = spec.get("activeDeadlineSeconds")
        started = time.monotonic()
        while True:
            current = cluster.get("pods", ns, name)
            if current is None or current["metadata"]["uid"] != uid:
                return
            limit = current["spec"].get("activeDeadlineSeconds", deadline)
            wait = 1.0 if limit is None else max(0.0, min(1.0, started + float(limit) - time.monotonic()))
            try:
                result = created.wait(timeout=max(wait, 0.05))
            except Exception:  # requests' ReadTimeout: still running
                result = None
            if result is not None:
                try:
                    created.reload()
                except docker.errors.NotFound:
                    return  # removed: the pod was deleted meanwhile
                oom = bool(created.attrs.get("State", {}).get("OOMKilled"))
                code = int(result.get("StatusCode", -1))
                why = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
                cluster.set_pod_status(
                    ns, name, phase="Succeeded" if code == 0 and not oom else "Failed", terminated=(why, code)
                )
                return
            if limit is not None and time.monotonic() >= started + float(limit):
                self._remove(uid)
                cluster.set_pod_status(
                    ns,
                    name,
                    phase="Failed",
                    reason="DeadlineExceeded",
                    message="Pod was active on the node longer than the specified deadline",
                    terminated=("DeadlineExceeded", 137),
                )
                return

    def _container_args(self, cluster: ClusterState, pod: dict[str, Any], handler: str) -> dict[str, Any]:
        meta, spec = pod["metadata"], pod["spec"]
        ns = meta["namespace"]
        container = spec["containers"][0]
        pod_sc = spec.get("securityContext") or {}
        sc = container.get("securityContext") or {}
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        caps = sc.get("capabilities") or {}
        security_opt: list[str] = []
        if sc.get("allowPrivilegeEscalation") is False:
            security_opt.append("no-new-privileges")
        seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
        if seccomp.get("type") == "Localhost":
            root = self.seccomp_root
            profile = (root / seccomp.get("localhostProfile", "")) if root else None
            if profile is None or not profile.is_file():
                raise _ConfigError(
                    f"cannot load seccomp profile {seccomp.get('localhostProfile')!r}: not found"
                )
            security_opt.append(f"seccomp={profile.read_text()}")
        elif seccomp.get("type") == "Unconfined":
            security_opt.append("seccomp=unconfined")
        env: dict[str, str] = {}
        if cluster.apiserver is not None:
            # The kubelet sets these in every container, whatever enableServiceLinks says.
            env["KUBERNETES_SERVICE_HOST"], port = cluster.apiserver[0], cluster.apiserver[1]
            env["KUBERNETES_SERVICE_PORT"] = str(port)
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            ref = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
            secret = cluster.get("secrets", ns, ref.get("name", ""))
            if secret is None:
                raise _ConfigError(f'secret "{ref.get("name")}" not found')
            if ref.get("key") in (secret.get("stringData") or {}):
                env[item["name"]] = str(secret["stringData"][ref["key"]])
            elif ref.get("key") in (secret.get("data") or {}):
                env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
            else:
                raise _ConfigError(f"couldn't find key {ref.get('key')} in Secret {ns}/{ref.get('name')}")
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        tmpfs: dict[str, str] = {}
        binds: dict[str, dict[str, str]] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"]) or {}
            size: object = None
            if "emptyDir" in volume:
                size = (volume["emptyDir"] or {}).get("sizeLimit")
            elif "downwardAPI" in volume:
                # The kubelet's copy of the pod's fields: a read-only, root-owned
                # directory it rewrites when the pod changes (see updated()).
                host_dir = self._podinfo_dir(meta["uid"], mount["name"])
                self._write_podinfo(host_dir, volume["downwardAPI"], pod)
                binds[str(host_dir)] = {"bind": mount["mountPath"], "mode": "ro"}
                continue
            elif "ephemeral" in volume:
                template = (volume["ephemeral"].get("volumeClaimTemplate") or {}).get("spec") or {}
                size = ((template.get("resources") or {}).get("requests") or {}).get("storage")
            else:
                raise _ConfigError(f"the double cannot mount volume {mount['name']!r} ({', '.join(volume)})")
            # The kubelet makes an emptyDir 0777 (group fsGroup) and executable.
            # Docker copies the mode of the image's directory onto a tmpfs (a
            # 0755 /workspace stays 0755), so the double hands the directory to
            # the pod's user instead: writable for it, as on a node.
            options = ["exec", "nosuid", "nodev", "mode=0777"]
            if uid is not None:
                options.append(f"uid={uid}")
            group = pod_sc.get("fsGroup", gid)
            if group is not None:
                options.append(f"gid={group}")
            if size is not None:
                options.append(f"size={int(parse_quantity(size))}")
            tmpfs[mount["mountPath"]] = ",".join(options)
        limits = (container.get("resources") or {}).get("limits") or {}
        kwargs: dict[str, Any] = {
            "name": f"kubedouble-{ns}-{meta['name']}"[:120],
            "command": list(container.get("command") or []) + list(container.get("args") or []),
            "labels": {
                LABEL: self.instance,
                f"{LABEL}.pod": f"{ns}/{meta['name']}",
                f"{LABEL}.uid": meta["uid"],
            },
            "hostname": meta["name"][:63],
            "read_only": bool(sc.get("readOnlyRootFilesystem")),
            "cap_drop": list(caps.get("drop") or []),
            "cap_add": list(caps.get("add") or []),
            "security_opt": security_opt,
            "environment": env,
            "tmpfs": tmpfs,
            "volumes": binds,
            "working_dir": container.get("workingDir") or None,
            "runtime": handler,
            "network_mode": "bridge",
            "pids_limit": self.pod_pids_limit,
            "stdin_open": False,
            "tty": False,
            "detach": True,
        }
        aliases = {
            str(host): str(entry.get("ip"))
            for entry in spec.get("hostAliases") or []
            for host in entry.get("hostnames") or []
        }
        if aliases:
            kwargs["extra_hosts"] = aliases  # the kubelet writes them into /etc/hosts
        network = pod_network(cluster.list("networkpolicies", ns), pod)
        if not self.enforce_network_policies:
            kwargs["network_mode"] = "host"
            if handler == "runsc" and "runsc-host" in self._known_runtimes():
                kwargs["runtime"] = "runsc-host"  # gVisor's own stack would hide the node's loopback
        elif network.isolated:
            kwargs["network_mode"] = "none"
        elif network.links:
            names = [*network.links, *(["bridge"] if network.outside else [])]
            kwargs["network_mode"] = names[0]
            kwargs["_extra_networks"] = names[1:]
            kwargs["_links"] = list(network.links)
            if handler == "runsc" and "runsc-host" in self._known_runtimes():
                # runsc here is registered with --network=none; runsc-host
                # runs gVisor's netstack on the container's own interfaces.
                kwargs["runtime"] = "runsc-host"
            # ClusterFirst: the kubelet's resolv.conf names the cluster DNS.
            resolv = self._podinfo_dir(meta["uid"], "..resolv") / "resolv.conf"
            resolv.write_text(
                f"nameserver {CLUSTER_DNS}\nsearch {ns}.svc.cluster.local svc.cluster.local cluster.local\n"
                "options ndots:5\n"
            )
            resolv.chmod(0o644)
            binds[str(resolv)] = {"bind": "/etc/resolv.conf", "mode": "ro"}
        if uid is not None:
            kwargs["user"] = f"{uid}:{gid}" if gid is not None else str(uid)
        fs_group = pod_sc.get("fsGroup")
        if fs_group is not None:
            kwargs["group_add"] = [str(fs_group)]
        if "memory" in limits:
            memory = int(parse_quantity(limits["memory"]))
            kwargs["mem_limit"] = memory
            kwargs["memswap_limit"] = memory
        if "cpu" in limits:
            kwargs["nano_cpus"] = int(parse_quantity(limits["cpu"]) * 1e9)
        return kwargs

    def exec_argv(self, pod: dict[str, Any], container: str, argv: list[str]) -> list[str] | None:
        with self._lock:
            cid = self._containers.get(pod["metadata"]["uid"])
        if cid is None:
            return None
        return ["docker", "exec", "-i", cid, *argv]

    def log_argv(
        self, pod: dict[str, Any], container: str, *, follow: bool, timestamps: bool, since: str | None
    ) -> list[str] | None:
        with self._lock:
            cid = self._containers.get(pod["metadata"]["uid"])
        if cid is None:
            return None
        argv = ["docker", "logs"]
        if follow:
            argv.append("--follow")
        if timestamps:
            argv.append("--timestamps")
        if since:
            argv += ["--since", since]
        return [*argv, cid]

    def stop(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        # Off the apiserver's loop, as a kubelet works: removing a gVisor
        # container takes seconds, and an exec upgrade waiting on the loop
        # meanwhile would go unanswered.
        threading.Thread(
            target=self._remove, args=(pod["metadata"]["uid"],), daemon=True, name="kubedouble-stop"
        ).start()

    # -- link networks ------------------------------------------------------------------

    def _ensure_link(self, name: str) -> None:
        """Create link network ``name`` unless it exists: internal, no address on the host's side."""
        import docker.errors
        from docker.types import IPAMConfig, IPAMPool

        try:
            self.client.networks.get(name)
            return
        except docker.errors.NotFound:
            pass
        last = ""
        for subnet in draw_subnets(LINK_SUBNETS):
            try:
                self.client.networks.create(
                    name,
                    driver="bridge",
                    internal=True,  # no route out
                    # No IPv4 on the host's side: the node (and its loopback services) unreachable.
                    options={"com.docker.network.bridge.inhibit_ipv4": "true"},
                    ipam=IPAMConfig(
                        pool_configs=[IPAMPool(subnet=str(subnet), gateway=str(subnet.network_address + 1))]
                    ),
                    labels={LABEL: self.instance},
                    check_duplicate=True,
                )
                return
            except docker.errors.APIError as exc:
                last = str(exc.explanation)
                if "overlap" in last.lower():
                    continue
                if "already exists" in last.lower():
                    return  # another pod of the link made it first
                raise
        raise docker.errors.APIError(f"no free /29 for link network {name}: {last}")

    @staticmethod
    def _address(container: Any, links: list[str]) -> str | None:
        networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        for name in [*links, "bridge"]:
            address = (networks.get(name) or {}).get("IPAddress")
            if address:
                return str(address)
        return None

    def _drop_links(self, uid: str) -> None:
        import docker.errors

        with self._lock:
            links = self._links.pop(uid, [])
        for link in links:
            for _ in range(20):
                try:
                    self.client.networks.get(link).remove()
                except docker.errors.NotFound:
                    break
                except docker.errors.APIError as exc:
                    if "active endpoints" not in str(exc.explanation):
                        raise
                    # Another pod of the link still runs (it removes the
                    # network), or the engine still releases an endpoint.
                    time.sleep(0.05)
                    continue
                break

    # -- downwardAPI volumes ------------------------------------------------------------

    def _podinfo_dir(self, uid: str, volume: str) -> Path:
        path = self._podinfo_root / uid / volume
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def _write_podinfo(directory: Path, source: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
        """As the kubelet's atomic writer: files in a new timestamped directory, ``..data``
        swapped to it by a rename, and each visible name a link through ``..data``."""
        meta = pod.get("metadata") or {}
        mode = int(source.get("defaultMode", 0o644))
        fresh = Path(tempfile.mkdtemp(prefix="..", dir=directory))
        fresh.chmod(0o755)
        names = []
        for item in source.get("items") or []:
            field_path = str((item.get("fieldRef") or {}).get("fieldPath", ""))
            target = fresh / str(item["path"])
            target.write_text(_field_value(meta, field_path))
            target.chmod(int(item.get("mode", mode)))
            names.append(str(item["path"]))
        old = directory / "..data"
        previous = old.resolve() if old.is_symlink() else None
        scratch = directory / "..data_tmp"
        scratch.unlink(missing_ok=True)
        scratch.symlink_to(fresh.name)
        scratch.replace(old)  # the one atomic step: readers see the old set or the new
        for name in names:
            link = directory / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        if previous is not None and previous != fresh:
            shutil.rmtree(previous, ignore_errors=True)

    def updated(self, cluster: ClusterState, pod: dict[str, Any]) -> None:
        spec = pod.get("spec") or {}
        for volume in spec.get("volumes") or []:
            if "downwardAPI" in volume:
                directory = self._podinfo_root / pod["metadata"]["uid"] / volume["name"]
                if directory.is_dir():
                    self._write_podinfo(directory, volume["downwardAPI"], pod)

    def _remove(self, uid: str) -> None:
        import docker.errors

        with self._lock:
            cid = self._containers.pop(uid, None)
        shutil.rmtree(self._podinfo_root / uid, ignore_errors=True)
        if cid is not None:
            try:
                self.client.containers.get(cid).remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if "already in progress" not in str(exc):
                    raise
        self._drop_links(uid)

    @property
    def selector(self) -> str:
        """The label filter that finds exactly what this node made."""
        return f"{LABEL}={self.instance}"

    def close(self) -> None:
        try:
            # ignore_removed: a pod's container may go meanwhile (stop() works in the background).
            for c in self.client.containers.list(
                all=True, filters={"label": self.selector}, ignore_removed=True
            ):
                try:
                    c.remove(force=True)
                except Exception:  # best effort: the test's own cleanup
                    continue
            for n in self.client.networks.list(filters={"label": self.selector}):
                try:
                    n.remove()
                except Exception:  # best effort: the test's own cleanup
                    continue
        finally:
            with self._lock:
                self._containers.clear()
                self._links.clear()
            self._podinfo_tmp.cleanup()


def _field_value(meta: Mapping[str, Any], field_path: str) -> str:
    """A downwardAPI ``fieldRef`` of the metadata: name, namespace, uid, or one label/annotation."""
    for key in ("labels", "annotations"):
        prefix = f"metadata.{key}['"
        if field_path.startswith(prefix) and field_path.endswith("']"):
            return str((meta.get(key) or {}).get(field_path[len(prefix) : -2], ""))
    if field_path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return str(meta.get(field_path.split(".", 1)[1], ""))
    raise _ConfigError(f"the double cannot project fieldPath {field_path!r}")


class _ConfigError(Exception):
    """What the kubelet reports as CreateContainerConfigError."""
