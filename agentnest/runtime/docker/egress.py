"""The egress allowlist on Docker: one filtering proxy and one internal network per sandbox (plumbing).

Topology (docs/egress.md draws it)::

    sandbox ──(internal network, 198.18.x.y/29, no IPv4 on the host bridge)── proxy ── egress network ── out

* The sandbox container joins **only** a per-sandbox ``internal`` bridge
  network created with ``com.docker.network.bridge.inhibit_ipv4``: the
  engine installs no route out of it, and the host bridge has no IPv4
  address, so nothing on the host (a service on ``0.0.0.0`` included) is
  reachable from it.  (A plain internal network leaves the gateway address
  on the host: checked on Docker 20.10, a host service on 0.0.0.0 answers
  there, and through it every other host address too.)
* The proxy container (:mod:`agentnest.egress.proxy`, shipped as source in
  its command line) sits on that network at a fixed address and on the
  egress network (``bridge`` by default).  The sandbox gets
  ``HTTP_PROXY``/``HTTPS_PROXY`` (both cases) pointing at it, and its
  ``/etc/resolv.conf`` names only Docker's embedded resolver, whose
  upstream is set to the proxy's address where nothing answers DNS: no
  name leaves the sandbox.
* The proxy is hardened like a sandbox (UID 65532, read-only root, no
  capabilities, no-new-privileges, AgentNest's seccomp profile, PID and
  memory limits, no log, no IP forwarding) and stops itself at the
  sandbox's deadline.  Its stdout carries one JSON event per connection,
  read here by a thread into an :class:`EgressLog`.

Every setting of the network and of the proxy container, and what the
proxy enforces, is decided in :mod:`.hardening` (pure: :func:`~.hardening.egress_network`,
:func:`~.hardening.proxy_container`, :func:`~.hardening.proxy_config`); this
module creates, attaches, waits for and removes those objects, and reads the
proxy's events.  The subnet is chosen here (a random ``/29`` in
``198.18.0.0/15``, the benchmarking range, retried on overlap) rather than by
the engine, so that the proxy's address is known before either container
exists and both can start at the same time.
"""

from __future__ import annotations

import ipaddress
import random
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ...channel.streams import DockerMuxStream
from ...errors import BackendError, ConfigurationError
from ...policy import NetworkPolicy
from ..egresslog import MAX_LINE, EgressLog, proxy_command
from . import hardening, labels
from .engine import explain, map_docker_errors, raw_socket
from .hardening import PROXY_PORT

if TYPE_CHECKING:
    import docker

#: Where per-sandbox subnets are drawn from: RFC 2544's benchmarking range,
#: which real networks rarely use and the proxy refuses as a destination.
DEFAULT_SUBNETS = "198.18.0.0/15"
#: One sandbox, one proxy, the (address-less) gateway: a /29 holds them.
_PREFIX = 29
#: How many subnets a network creation draws before it gives up.
_DRAWS = 16
#: How long ``create`` waits for the proxy to listen.
READY_TIMEOUT = 30.0
#: ``NO_PROXY`` in the sandbox: its own loopback only.
LOOPBACK_NO_PROXY = "localhost,127.0.0.1,::1"


def read_events(stream: DockerMuxStream, log: EgressLog) -> None:
    """Feed ``log`` from the proxy's stdout until it ends (the reader thread's body)."""
    buffer = bytearray()
    skipping = False
    try:
        while True:
            data = stream.read(65536)
            if not data:
                break
            buffer += data
            while True:
                cut = buffer.find(b"\n")
                if cut < 0:
                    if len(buffer) > MAX_LINE:
                        # A line this long is not an event: drop it up to its end.
                        buffer.clear()
                        skipping = True
                    break
                line = bytes(buffer[:cut])
                del buffer[: cut + 1]
                if skipping:
                    skipping = False
                    log.invalid += 1
                    continue
                if len(line) <= MAX_LINE:
                    log.feed_line(line)
                else:
                    log.invalid += 1
    except OSError:
        pass  # the stream was closed by destroy
    finally:
        log.closed.set()
        log.ready.set()  # wake a waiter: ``closed`` says the proxy ended


def draw_subnets(pool: ipaddress.IPv4Network) -> Iterator[ipaddress.IPv4Network]:
    """Random ``/29`` subnets of ``pool`` (a ``/29`` or larger), a fresh one each, a bounded number.

    For a network created on a subnet chosen here: try one, and on an
    overlap with an existing network take the next.
    """
    count = 2 ** (_PREFIX - pool.prefixlen)
    size = 2 ** (32 - _PREFIX)
    rng = random.SystemRandom()
    for _ in range(_DRAWS):
        yield ipaddress.IPv4Network((int(pool.network_address) + rng.randrange(count) * size, _PREFIX))


# -- topology ----------------------------------------------------------------------


class EgressTopology:
    """The internal network and the proxy container of one sandbox.

    Create it, :meth:`create_network`, then (possibly in another thread,
    while the sandbox container starts) :meth:`start_proxy`, and
    :meth:`wait_ready`.  :meth:`remove_proxy` and :meth:`remove_network`
    undo it; both are idempotent.
    """

    def __init__(
        self,
        api: docker.APIClient,
        *,
        sandbox_id: str,
        backend: str,
        created: float,
        deadline: float,
        policy: NetworkPolicy,
        hosts: Mapping[str, str],
        image: str,
        python: str,
        oci_runtime: str,
        egress_network: str,
        subnets: str,
        arch: str,
        extra_labels: Mapping[str, str],
    ) -> None:
        self.api = api
        self.sandbox_id = sandbox_id
        self.policy = policy
        self.hosts = dict(hosts)
        self.image = image
        self.python = python
        self.oci_runtime = oci_runtime
        self.egress_network = egress_network
        self.subnets = subnets
        self.arch = arch
        self.deadline = deadline
        self.network_name = f"agentnest-{sandbox_id}-net"
        self.proxy_name = f"agentnest-{sandbox_id}-proxy"
        self.labels = labels.for_sandbox(sandbox_id, backend, created, deadline, role="proxy")
        self.labels.update(extra_labels)
        self.network_labels = dict(self.labels)
        self.network_labels[labels.ROLE] = "egress-network"
        self.network_id: str | None = None
        self.proxy_id: str | None = None
        self.subnet: ipaddress.IPv4Network | None = None
        self.log = EgressLog(sandbox_id)
        self._stream: DockerMuxStream | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- addresses -------------------------------------------------------------------

    @property
    def proxy_ip(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 2)

    @property
    def sandbox_ip(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 3)

    @property
    def proxy_url(self) -> str:
        return f"http://{self.proxy_ip}:{PROXY_PORT}"

    def sandbox_environment(self) -> dict[str, str]:
        """Variables that send HTTP(S) clients to the proxy (both spellings)."""
        url = self.proxy_url
        env = {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        # Only the sandbox's own loopback bypasses the proxy (as in 0.3.0): a
        # service the code started inside the sandbox stays reachable, and the
        # proxy would refuse loopback anyway.  Nothing else has a route out.
        env.update(dict.fromkeys(("NO_PROXY", "no_proxy"), LOOPBACK_NO_PROXY))
        return env

    # -- network ---------------------------------------------------------------------

    def create_network(self) -> None:
        """Create the sandbox's internal network on a free random /29."""
        import docker.errors

        pool = ipaddress.ip_network(self.subnets)
        if not isinstance(pool, ipaddress.IPv4Network) or pool.prefixlen > _PREFIX:
            raise ConfigurationError(
                f"egress_subnets={self.subnets!r} must be an IPv4 range of /{_PREFIX} or larger"
            )
        last_error = ""
        for subnet in draw_subnets(pool):
            gateway = str(subnet.network_address + 1)
            try:
                with map_docker_errors("creating the sandbox's egress network"):
                    settings = hardening.egress_network(str(subnet), gateway, self.network_labels)
                    created = self.api.create_network(self.network_name, **settings)
            except BackendError as exc:
                last_error = str(exc)
                if "overlap" in last_error.lower():
                    continue  # another network holds this subnet: draw again
                raise
            except docker.errors.APIError as exc:  # pragma: no cover - mapped above
                raise BackendError(str(exc)) from None
            self.network_id = str(created["Id"])
            self.subnet = subnet
            return
        raise BackendError(
            f"no free /{_PREFIX} left for the egress network in {self.subnets} ({last_error}); "
            "remove unused networks (`agentnest prune`) or set DockerSpec(egress_subnets=...)"
        )

    # -- proxy -----------------------------------------------------------------------

    def proxy_config(self) -> dict[str, Any]:
        """What the proxy enforces (:func:`.hardening.proxy_config`)."""
        assert self.subnet is not None
        return hardening.proxy_config(
            self.policy,
            proxy_ip=self.proxy_ip,
            subnet=str(self.subnet),
            hosts=self.hosts,
            deadline=self.deadline,
        )

    def start_proxy(self) -> None:
        """Create, attach to and start the proxy container (not waiting for it to listen)."""
        api = self.api
        plan = hardening.proxy_container(
            name=self.proxy_name,
            image=self.image,
            command=proxy_command(self.python, self.proxy_config()),
            labels=self.labels,
            network=self.network_name,
            proxy_ip=self.proxy_ip,
            oci_runtime=self.oci_runtime,
            arch=self.arch,
        )
        host_config = api.create_host_config(**plan.host_config)
        with map_docker_errors("creating the egress proxy container", self.image):
            cid = api.create_container(**plan.create, host_config=host_config)["Id"]
        with self._lock:
            self.proxy_id = str(cid)
        with map_docker_errors("connecting the egress proxy to its egress network"):
            api.connect_container_to_network(cid, self.egress_network)
        with map_docker_errors("starting the egress proxy", self.image):
            wrapper = api.attach_socket(cid, params={"stdout": 1, "stderr": 1, "stream": 1})
            self._stream = DockerMuxStream(raw_socket(wrapper), owner=wrapper)
            self._reader = threading.Thread(
                target=read_events,
                args=(self._stream, self.log),
                name=f"agentnest-egress-{self.sandbox_id}",
                daemon=True,
            )
            self._reader.start()
            api.start(cid)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Block until the proxy listens.

        Raises:
            BackendError: it exited or did not start listening in time.
        """
        if not self.log.ready.wait(timeout) or self.log.listen is None:
            tail = self._stream.diagnostics()[-500:] if self._stream is not None else ""
            state = "exited" if self.log.closed.is_set() else f"did not listen within {timeout:.0f} s"
            raise BackendError(
                f"the egress proxy of sandbox {self.sandbox_id} {state}; it needs python3 >= 3.8 in "
                f"{self.image!r} (DockerSpec(proxy_image=...)). Its stderr: {tail or '(empty)'}"
            )

    # -- teardown --------------------------------------------------------------------

    def remove_proxy(self) -> None:
        with self._lock:
            cid, self.proxy_id = self.proxy_id, None
        if cid is not None:
            _remove_container(self.api, cid)
        if self._stream is not None:
            self._stream.close()
        if self._reader is not None:
            self._reader.join(5)

    def remove_network(self) -> None:
        import docker.errors

        nid, self.network_id = self.network_id, None
        if nid is None:
            return
        with map_docker_errors("removing the sandbox's egress network"):
            for attempt in range(20):
                try:
                    self.api.remove_network(nid)
                    return
                except docker.errors.NotFound:
                    return
                except docker.errors.APIError as exc:
                    # An endpoint still being released by a container removal.
                    if "active endpoints" not in explain(exc) or attempt == 19:
                        raise
                    time.sleep(0.05)


def _remove_container(api: Any, cid: str) -> None:
    import docker.errors

    with map_docker_errors("removing the egress proxy container"):
        try:
            api.remove_container(cid, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # removal already in progress
                raise


__all__ = ["DEFAULT_SUBNETS", "PROXY_PORT", "EgressLog", "EgressTopology", "draw_subnets", "proxy_command"]
