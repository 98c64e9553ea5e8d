"""``KubernetesBackend``: one locked-down Pod per sandbox, its agent reached through exec.

create: the objects :func:`.manifests.render` builds (NetworkPolicy first,
then the Secret, then the Pod), each written with Strict field validation;
the Pod read back and its hardening compared as sent (a field a feature gate
drops is a refusal, never a silently weaker sandbox); the Secret and policy
made the Pod's (``ownerReferences``) so deleting the Pod collects them; then
a bounded wait for the pod to run, with the cluster's own reason when it does
not (:mod:`.reasons`); then, from inside the pod, proof that the apiserver,
the metadata address, the cluster DNS and the internet are out of reach
(:mod:`.netcheck`: a stored NetworkPolicy proves nothing where the network
plugin ignores it).  The sandbox is handed out only once the agent answered
through the exec channel, not when the pod is "Running".

open_channel: an exec of ``agent/bridge.py`` (the pod's main process is the
keeper with its agent listening on a unix socket in an ``emptyDir``), so
nothing of the agent stream goes through ``attach`` into the node's container
log, and a dropped stream loses no command or session: the next exec reaches
the same agent.

What runs where was verified against the cluster double in
tests/doubles/kube only (no cluster can run where AgentNest is built);
docs/kubernetes.md says what that covers.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Collection
from typing import Any

from ...channel.streams import ByteStream
from ...config import SandboxConfig
from ...errors import (
    AgentNestError,
    BackendError,
    ConfigurationError,
    ExecutionTimeoutError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
    UnsupportedCapabilityError,
    VerificationError,
)
from ...policy import NetworkMode
from ..base import Capability, RuntimeBackend, SandboxHandle
from ..bootstrap import PODINFO_DEADLINE
from ..bootstrap import command as bootstrap_command
from ..egresslog import EgressLog
from ..launch import bridge_command, script_command
from ..owner import owner
from . import manifests, netcheck
from .egress import ProxyLogFollower
from .lint import check
from .netcheck import Outcome
from .spec import KubernetesSpec

__all__ = ["KubernetesBackend"]

#: How long a pod may take to run (an image pull on a cold node can take minutes).
START_TIMEOUT = 300.0
#: How long the agent may take to listen once the pod runs.
AGENT_TIMEOUT = 60.0

#: How long the first exec into a new pod may wait for its upgrade before it is sent again.
FIRST_EXEC_TIMEOUT = 10.0
#: How long the egress proxy may take to listen once its pod runs.
PROXY_READY_TIMEOUT = 30.0

#: How long extend() waits for the kubelet to copy the new deadline into the pod.
EXTEND_TIMEOUT = 90.0

#: Handlers (and, only where the RuntimeClass cannot be read, class names) -> OCI runtime.
_KNOWN_RUNTIMES = {"gvisor": "runsc", "runsc": "runsc", "kata": "kata-runtime", "kata-qemu": "kata-runtime"}


class KubernetesBackend(RuntimeBackend):
    """Sandboxes as Pods of one namespace of a cluster.

    ``KubernetesBackend(KubernetesSpec(namespace="agents", context="prod"))``;
    0.3.0's ``namespace=``, ``context=`` and ``runtime_class_name=`` keywords
    are accepted too.
    """

    name = "kubernetes"

    def __init__(
        self,
        spec: KubernetesSpec | None = None,
        *,
        namespace: str | None = None,
        context: str | None = None,
        runtime_class_name: str | object | None = ...,
        kubeconfig: str | None = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        spec = spec or KubernetesSpec()
        changes: dict[str, Any] = {}
        if namespace is not None:
            changes["namespace"] = namespace
        if context is not None:
            changes["context"] = context
        if kubeconfig is not None:
            changes["kubeconfig"] = kubeconfig
        if runtime_class_name is not ...:
            changes["runtime_class_name"] = runtime_class_name
        if changes:
            import dataclasses

            spec = dataclasses.replace(spec, **changes)
        self.spec = spec
        self.start_timeout = start_timeout
        self._api: Any = None
        self._connection: Any = None
        self._lock = threading.Lock()
        self._handlers: dict[str, str] = {}  # RuntimeClass name -> its handler, once read

    # -- plumbing -----------------------------------------------------------------

    def _cluster(self) -> tuple[Any, Any]:
        """The control-plane client and the exec connection, made on first use."""
        with self._lock:
            if self._api is None:
                from .api import KubeApi
                from .connection import from_kube_config
                from .kubeconfig import load
                from .rest import KubeRest

                cluster = load(self.spec.kubeconfig, self.spec.context)
                connection = from_kube_config(cluster.configuration)
                self._api = KubeApi(KubeRest(connection), self.spec.namespace)
                self._connection = connection
            return self._api, self._connection

    def ping(self) -> None:
        """The apiserver answers and this identity may read its namespace's quotas."""
        api, _ = self._cluster()
        api.find("ResourceQuota")

    def reclaim(self, owners: Collection[str]) -> int:
        """Delete the Pods (with their Secrets and NetworkPolicies) of ``owners``, the manager
        servers that stopped answering, in this backend's namespace; the number of Pods.

        Raises:
            BackendError: nothing could be deleted (the first error says why).
        """
        from .prune import prune

        if not owners:
            return 0
        api, _ = self._cluster()
        result = prune([api], now=time.time(), owners=frozenset(owners))
        pods = sum(1 for item in result.removed if item.kind == "Pod")
        if result.errors and not result.removed:
            raise BackendError(f"reclaiming the sandboxes of {sorted(owners)}: {result.errors[0]}")
        return pods

    def capacity(self) -> tuple[int | None, float | None]:
        """What the namespace's ResourceQuotas leave: the tightest ``hard - used`` of memory and CPU
        (limits, else requests), read now.  None for what no quota bounds."""
        from .lint import quantity_value

        api, _ = self._cluster()
        memory: float | None = None
        cpus: float | None = None
        for quota in api.find("ResourceQuota"):
            status = quota.get("status") or {}
            hard, used = status.get("hard") or {}, status.get("used") or {}
            for keys, resource in (
                (("limits.memory", "requests.memory", "memory"), "memory"),
                (("limits.cpu", "requests.cpu", "cpu"), "cpu"),
            ):
                for key in keys:
                    total = quantity_value(hard.get(key))
                    if total is None:
                        continue
                    left = max(0.0, total - (quantity_value(used.get(key)) or 0.0))
                    if resource == "memory":
                        memory = left if memory is None else min(memory, left)
                    else:
                        cpus = left if cpus is None else min(cpus, left)
                    break
        return (None if memory is None else int(memory)), cpus

    def capabilities(self) -> frozenset[Capability]:
        return frozenset(
            {
                # A NetworkPolicy with no rule isolates the pod (where the CNI
                # enforces policies: docs/kubernetes.md says how to check).
                Capability.NETWORK_DENIED,
                Capability.RESOURCE_LIMITS,
                Capability.READ_ONLY_ROOT,
                # activeDeadlineSeconds, enforced by the kubelet, and the keeper.
                Capability.DEADLINE,
                # The annotation, copied by the kubelet for the keeper (within max_lifetime).
                Capability.EXTEND,
                # A filtering proxy pod per sandbox (where the CNI enforces policies).
                Capability.EGRESS_DOMAINS,
                # Both move the workspace through the agent channel.
                Capability.FORK,
                Capability.SNAPSHOT,
                # nvidia.com/gpu limits, scheduled by the NVIDIA device plugin;
                # gpu_runtime_class_name is checked in create.
                Capability.GPU,
            }
        )

    @property
    def oci_runtime(self) -> str | None:
        """The OCI runtime of sandbox pods, from their RuntimeClass's ``handler``.

        Read from the cluster (a class named ``gvisor`` whose handler is
        ``runc`` is runc: the policy's ``required_runtime`` must not be met by a
        name); only when the class cannot be read (no right to, or no cluster)
        is the name itself taken for the handler.  ``None``: the cluster's
        default runtime, or a class that does not exist.
        """
        return self._oci_runtime_of(self.spec.runtime_class_name)

    def _oci_runtime_of(self, name: str | None) -> str | None:
        """The OCI runtime of the RuntimeClass ``name`` (see :attr:`oci_runtime`)."""
        if not name:
            return None
        if name not in self._handlers:
            handler: str | None
            try:
                api, _ = self._cluster()
                found = api.get("RuntimeClass", name)
            except AgentNestError:
                handler = _KNOWN_RUNTIMES.get(name)
            else:
                handler = str(found.get("handler") or "") if found is not None else ""
            self._handlers[name] = handler or ""
        handler = self._handlers[name]
        if not handler:
            return None
        if handler.startswith("kata"):
            return "kata-runtime"
        if handler.startswith("runsc"):
            return "runsc"  # e.g. a handler "runsc-nvproxy" for GPU pods, as "kata-*" above
        return _KNOWN_RUNTIMES.get(handler, handler)

    def _check_gpu_runtime_class(self, config: SandboxConfig) -> None:
        """Refuse a GPU pod whose RuntimeClass runs another OCI runtime than the policy was checked against.

        The guard checks a policy's ``required_runtime`` against
        :attr:`oci_runtime` (``runtime_class_name``'s handler); a GPU pod in
        ``gpu_runtime_class_name`` must not slip out of it (fail closed).
        """
        name = self.spec.pod_runtime_class(config.limits.gpus)
        if name == self.spec.runtime_class_name:
            return
        seen, gpu = self.oci_runtime, self._oci_runtime_of(name)
        if seen is not None and gpu != seen:
            found = repr(gpu) if gpu else "no OCI runtime it can name (no such RuntimeClass?)"
            raise UnsupportedCapabilityError(
                f"gpu_runtime_class_name={name!r} runs {found}, "
                f"but sandboxes here are checked against runtime_class_name={self.spec.runtime_class_name!r} "
                f"({seen!r}); use a GPU RuntimeClass with the same runtime (for gVisor: a handler running "
                "runsc with --nvproxy=true), or set runtime_class_name to the GPU class on a backend for "
                "GPU work; no pod was created"
            )

    # -- lifecycle ----------------------------------------------------------------

    def create(self, config: SandboxConfig) -> SandboxHandle:
        if config.network.mode is NetworkMode.OPEN:
            raise UnsupportedCapabilityError(
                "the kubernetes backend gives sandboxes no open network: use NetworkPolicy.allowlist(...) "
                "(egress through a filtering proxy pod) or denied; no pod was created"
            )
        allowlist = config.network.mode is NetworkMode.ALLOWLIST
        api, _ = self._cluster()
        if config.limits.gpus:
            self._check_gpu_runtime_class(config)
        sandbox_id = os.urandom(6).hex()
        now = time.time()
        objects = manifests.render(config, self.spec, sandbox_id, now=now)
        for obj in objects:
            # Our own rules first: never send a pod weaker than we mean.
            check(obj, writable_root=not config.read_only_root)
            if obj["kind"] == "Pod":
                # Who to ask whether the sandbox is orphaned (prune --orphans).
                obj["metadata"]["annotations"][manifests.OWNER_PROCESS] = owner()
        created: list[tuple[str, str]] = []
        pod_name = manifests.pod_name(sandbox_id)
        egress: _Egress | None = None
        try:
            stored_pod: dict[str, Any] | None = None
            for obj in objects:
                name = str(obj["metadata"]["name"])
                if allowlist and obj["kind"] == "Pod" and name == pod_name:
                    # The sandbox reaches its proxy by the address the proxy pod got.
                    egress = self._start_egress(api, sandbox_id, created)
                    manifests.point_at_proxy(obj, egress.proxy_ip)
                stored = api.create(obj)
                created.append((str(obj["kind"]), str(stored["metadata"]["name"])))
                if obj["kind"] == "Pod":
                    self._check_stored(obj, stored)
                    if name == pod_name:
                        stored_pod = stored
            assert stored_pod is not None
            uid = str(stored_pod["metadata"]["uid"])
            for kind, name in created:
                if (kind, name) != ("Pod", pod_name):
                    api.patch(kind, name, {"metadata": {"ownerReferences": _owner(pod_name, uid)}})
            api.wait_running(pod_name, self.start_timeout)
            if egress is not None:
                egress.wait_ready()
            checked, stream = self._check_network(pod_name)
        except BaseException:
            if egress is not None:
                egress.follower.stop()
            self._remove(api, created)
            raise
        info: dict[str, Any] = {
            "namespace": self.spec.namespace,
            "pod": pod_name,
            "objects": created,
            # The agent runs already, listening: the first connection
            # sends a reconnect frame (ids from 1), not the bundle.  The
            # sandbox is handed out once it answered (Sandbox's connect).
            "reconnect_ids": 1,
            "first": True,
            # The network check's exec, now the bridge: the first channel.
            "stream": stream,
            # After a lost stream, a new exec reaches the same agent: the
            # Sandbox reconnects with the ids after its last (sessions and
            # commands live on).
            "reattach": True,
            # What the in-pod network check saw (all blocked, or no hand-out).
            "network_check": [str(o) for o in checked],
            # The latest deadline extend() may set: activeDeadlineSeconds
            # (counted by the kubelet from a later start) less the keeper's grace.
            "hard_stop": now + manifests.hard_stop_seconds(config, self.spec) - manifests.DEADLINE_GRACE,
        }
        if egress is not None:
            # Sandbox.network_log() reads it; it stays readable after destroy.
            info["egress"] = egress.log
            info["egress_follower"] = egress.follower
            info["proxy_pod"] = egress.pod
        return SandboxHandle(id=sandbox_id, backend=self.name, deadline=now + config.lifetime, info=info)

    def _start_egress(self, api: Any, sandbox_id: str, created: list[tuple[str, str]]) -> _Egress:
        """Wait for the (already created) proxy pod to run; follow its log for events."""
        import ipaddress

        name = manifests.proxy_pod_name(sandbox_id)
        if ("Pod", name) not in created:  # pragma: no cover - render's order
            raise BackendError(f"the egress proxy pod {name} was not created before its sandbox")
        proxy = api.wait_running(name, self.start_timeout)
        raw = str((proxy.get("status") or {}).get("podIP") or "")
        try:
            address = str(ipaddress.ip_address(raw))
        except ValueError:
            raise BackendError(
                f"the egress proxy pod {name} runs but the cluster gives it no usable address "
                f"(status.podIP={raw[:60]!r}); the sandbox was not created"
            ) from None
        log = EgressLog(sandbox_id)
        follower = ProxyLogFollower(api, name, log)
        follower.start()
        return _Egress(name, address, log, follower)

    def _check_network(self, pod_name: str) -> tuple[list[Outcome], ByteStream]:
        """Prove from inside the pod that its network is denied (:mod:`.netcheck`); fail closed.

        One exec does both jobs: netprobe prints its line, then becomes the
        bridge to the agent (``--then``), whose stream is the sandbox's
        first channel (an exec costs a round trip and an interpreter start).
        """
        from .connection import ExecTarget
        from .wsexec import ExecStream

        _, connection = self._cluster()
        wanted = netcheck.targets(self.spec.network_probes, connection.host)
        timeout = self.spec.network_probe_timeout
        target = ExecTarget(connection, self.spec.namespace, pod_name, "sandbox")
        bridge = bridge_command(self.spec.python, manifests.AGENT_SOCKET, wait=AGENT_TIMEOUT)
        argv = netcheck.probe_argv(self.spec.python, wanted, timeout, then=bridge)
        # The first exec into a new pod, once more if its upgrade goes
        # unanswered: an apiserver restarting behind a load balancer drops
        # upgrades so.  Seen with the cluster double on gVisor too (1 first
        # exec in tens, under the load of a pod's start; docs/benchmarks.md):
        # most likely the client's own TLS race, since fixed, that lost the
        # upgrade request when the receive thread read the server's session
        # tickets as it was written (wsexec._SerialTLSSocket).  Safe to
        # repeat: nothing ran, or a probe and an idle bridge that end with
        # their dropped stream.
        try:
            stream = ExecStream.open(target, argv, open_timeout=FIRST_EXEC_TIMEOUT)
        except RuntimeNotAvailableError as exc:
            if "did not answer the exec in time" not in str(exc):
                raise
            stream = ExecStream.open(target, argv)
        try:
            # Every probe at once: the probe timeout, plus an interpreter's start.
            line = stream.read_line(netcheck.MAX_OUTPUT, timeout + 30)
            seen = netcheck.judge(line, wanted)
        except ExecutionTimeoutError:
            stream.close()
            raise VerificationError(
                f"pod {pod_name}: the in-pod network check did not finish; the pod was deleted"
            ) from None
        except VerificationError:
            stream.close()
            raise
        except AgentNestError as exc:
            stream.close()
            raise VerificationError(
                f"pod {pod_name}: the in-pod network check failed ({exc}); the image needs "
                f"{self.spec.python} (KubernetesSpec(python=...)); the pod was deleted"
            ) from None
        return seen, stream

    @staticmethod
    def _check_stored(sent: dict[str, Any], stored: dict[str, Any]) -> None:
        from .api import hardening_drift

        drift = hardening_drift(sent, stored)
        if drift:
            raise BackendError(
                f"the cluster stored pod {sent['metadata']['name']} without {', '.join(drift)} as sent "
                "(a disabled feature gate drops fields silently: hostUsers needs UserNamespacesSupport); "
                "refusing a weaker sandbox. Set KubernetesSpec(host_users=True) if the cluster cannot "
                "run user namespaces"
            )

    def extend(self, handle: SandboxHandle, deadline: float) -> None:
        """Move the deadline annotation, then wait for the pod's keeper to see it.

        ``activeDeadlineSeconds`` cannot grow, so the pod was created with
        room for this (``KubernetesSpec.max_lifetime``); past that, a refusal.
        The kubelet copies the annotation into the pod's downwardAPI volume;
        ``agent/deadline_wait.py`` waits for the copy and signals the keeper.
        """
        from .connection import ExecTarget
        from .wsexec import run

        hard_stop = float(handle.info.get("hard_stop") or handle.deadline)
        if deadline > hard_stop + 1:
            raise ConfigurationError(
                f"sandbox {handle.id}: its pod's hard stop (activeDeadlineSeconds) is "
                f"{max(0.0, hard_stop - time.time()):.0f}s from now and can only shrink, so its deadline "
                "cannot move past it; create sandboxes with KubernetesSpec(max_lifetime=SECONDS) "
                "to extend them up to that"
            )
        api, connection = self._cluster()
        value = str(math.ceil(deadline))
        moved = {"metadata": {"annotations": {manifests.DEADLINE: value}}}
        proxy = handle.info.get("proxy_pod")
        if proxy:
            # First the proxy: it reads its copy again at its old deadline.
            api.patch("Pod", proxy, moved)
        api.patch("Pod", handle.info["pod"], moved)
        target = ExecTarget(connection, handle.info["namespace"], handle.info["pod"], "sandbox")
        argv = script_command(self.spec.python, "deadline_wait", PODINFO_DEADLINE, value, str(EXTEND_TIMEOUT))
        code, out, _ = run(target, argv, timeout=EXTEND_TIMEOUT + 30, max_output=256)
        if code != 0:
            raise BackendError(
                f"sandbox {handle.id}: the kubelet did not show the pod its new deadline within "
                f"{EXTEND_TIMEOUT:g}s (it still reads {out.strip()[:40].decode('ascii', 'replace')!r}); the "
                "annotation is moved and the keeper reads it again at the old deadline, but if the kubelet "
                "is slower than that the sandbox stops then"
            )
        handle.deadline = deadline

    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        """A stream to the pod's listening agent, or to a new one.

        While ``handle.info["reconnect_ids"]`` is set (the first connection,
        and a reattach after a lost stream: see ``reattach`` below), the
        stream is an exec of the bridge to the agent of the pod's main
        process, which takes a ``reconnect`` frame.  Otherwise the caller
        sends a bundle: the stream is an exec of a new agent reading it from
        stdin, as on Docker (its commands end with that stream).
        """
        from .connection import ExecTarget
        from .wsexec import ExecStream

        first = bool(handle.info.pop("first", False))
        ready = handle.info.pop("stream", None)
        if ready is not None:
            stream_ready: ByteStream = ready
            return stream_ready
        if not first and not self.is_running(handle):
            raise SandboxDestroyedError(
                f"sandbox {handle.id}: {self.exit_reason(handle) or 'its pod is gone'}"
            )
        _, connection = self._cluster()
        target = ExecTarget(connection, handle.info["namespace"], handle.info["pod"], "sandbox")
        if "reconnect_ids" in handle.info:
            # The first connection waits for a new pod's agent to listen.
            argv = bridge_command(
                self.spec.python, manifests.AGENT_SOCKET, wait=AGENT_TIMEOUT if first else 0.0
            )
        else:
            argv = bootstrap_command("agent", self.spec.python)
        stream: ByteStream = ExecStream.open(target, argv)
        return stream

    def destroy(self, handle: SandboxHandle) -> None:
        unused = handle.info.pop("stream", None)  # a first channel nobody opened
        if unused is not None:
            unused.close()
        follower = handle.info.pop("egress_follower", None)
        if follower is not None:
            follower.stop()
        api, _ = self._cluster()
        objects = handle.info.get("objects") or [("Pod", handle.info.get("pod"))]
        self._remove(api, objects)

    @staticmethod
    def _remove(api: Any, objects: list[tuple[str, str]]) -> None:
        """Delete the pod first (it owns the rest), then what it may not own yet; idempotent."""
        errors: list[BaseException] = []
        for kind, name in sorted(objects, key=lambda o: o[0] != "Pod"):
            try:
                api.delete(kind, name)
            except AgentNestError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def is_running(self, handle: SandboxHandle) -> bool:
        from .api import pod_running

        api, _ = self._cluster()
        try:
            pod = api.get("Pod", handle.info["pod"])
        except AgentNestError:
            return False
        return pod is not None and pod_running(pod)

    def exit_reason(self, handle: SandboxHandle) -> str | None:
        from .reasons import pod_verdict

        api, _ = self._cluster()
        try:
            pod = api.get("Pod", handle.info["pod"])
        except AgentNestError as exc:
            return str(exc)
        if pod is None:
            return "its pod was deleted"
        verdict = pod_verdict(pod)
        return str(verdict.error) if verdict.error is not None else None

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                self._api.rest.close()
                self._api = None


class _Egress:
    """The egress proxy pod of one sandbox being created: its address and its event log."""

    def __init__(self, pod: str, proxy_ip: str, log: EgressLog, follower: ProxyLogFollower) -> None:
        self.pod = pod
        self.proxy_ip = proxy_ip
        self.log = log
        self.follower = follower

    def wait_ready(self, timeout: float | None = None) -> None:
        timeout = PROXY_READY_TIMEOUT if timeout is None else timeout
        if not self.log.ready.wait(timeout) or self.log.listen is None:
            state = "stopped" if self.log.closed.is_set() else f"did not listen within {timeout:.0f} s"
            why = f" (reading its log: {self.follower.last_error})" if self.follower.last_error else ""
            raise BackendError(
                f"the egress proxy pod {self.pod} {state}{why}; it needs python3 >= 3.8 in its image "
                f"(KubernetesSpec(proxy_image=...)); see `kubectl logs {self.pod}`; no sandbox was created"
            )


def _owner(pod_name: str, uid: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod_name,
            "uid": uid,
            # Deleting the pod collects the object; nothing blocks the pod's deletion.
            "blockOwnerDeletion": False,
            "controller": False,
        }
    ]
