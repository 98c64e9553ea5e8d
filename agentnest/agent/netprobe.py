"""Runs inside a new pod, before it is handed out: which addresses can its workload reach?

A NetworkPolicy is stored even where the cluster's network plugin ignores it,
so the Kubernetes backend proves isolation from inside instead of trusting the
object (``agentnest.runtime.kubernetes.netcheck`` judges what this prints).

Shipped as source on the command line (``python3 -I -S -c SOURCE TARGETS``):
no import of AgentNest, standard library only, Python >= 3.8.  ``TARGETS`` is
a JSON list of ``[name, kind, host, port]`` with ``kind`` ``tcp`` (a connect)
or ``dns`` (a UDP query and a TCP connect, at once, to the same server).  Two hosts
are resolved here, in the pod: ``@resolv`` (each ``nameserver`` of the pod's
``/etc/resolv.conf``: the cluster DNS) and ``@service`` (the apiserver's
address the kubelet puts in ``KUBERNETES_SERVICE_HOST``/``_PORT``).

With ``--then ARGV...`` after the timeout it then execs ARGV on the same stdio.

Prints one JSON list (one line) of ``[name, host, port, kind, outcome]``: ``connected``,
``answered`` (a DNS reply), ``refused``, ``timeout``, an errno name such as
``ENETUNREACH``, or ``absent`` (an ``@`` host with nothing to resolve to).
All targets are tried at once, with non-blocking sockets and ``poll`` (no
threads: under gVisor with the runtime's default seccomp profile a thread
cannot start, and ``select`` fails); each waits at most the timeout
(argv[2]), so a policy that drops packets costs the timeout once.
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import sys
import time

#: A DNS query for the root's NS records: any reply proves the server was reached.
QUERY_TAIL = b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x01"


def errno_name(code: int) -> str:
    if code == errno.ECONNREFUSED:
        return "refused"
    return errno.errorcode.get(code, "error")


def family_of(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class Probe:
    """One socket: a TCP connect, or a UDP DNS query (``kind`` ``tcp`` or ``udp``)."""

    def __init__(self, kind: str, host: str, port: int) -> None:
        self.kind, self.host, self.port = kind, host, port
        self.outcome: str | None = "absent" if host.startswith("@") else None
        self.sock: socket.socket | None = None
        self.deadline = 0.0

    def start(self, timeout: float) -> None:
        if self.outcome is not None:
            return
        self.deadline = time.monotonic() + timeout
        if self.kind == "udp":
            sock = socket.socket(family_of(self.host), socket.SOCK_DGRAM)
            sock.setblocking(False)
            try:
                sock.connect((self.host, self.port))
                sock.send(os.urandom(2) + QUERY_TAIL)
            except OSError as exc:
                sock.close()
                self.outcome = errno_name(exc.errno or 0)
                return
        else:
            sock = socket.socket(family_of(self.host), socket.SOCK_STREAM)
            sock.setblocking(False)
            code = sock.connect_ex((self.host, self.port))
            if code not in (0, errno.EINPROGRESS, errno.EAGAIN):
                sock.close()
                self.outcome = errno_name(code)
                return
        self.sock = sock

    def ready(self) -> None:
        """The socket polled ready: read its verdict."""
        sock = self.sock
        assert sock is not None
        self.sock = None
        if self.kind == "udp":
            try:
                sock.recv(512)
                self.outcome = "answered"
            except OSError as exc:
                self.outcome = errno_name(exc.errno or 0)
        else:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            self.outcome = "connected" if code == 0 else errno_name(code)
        sock.close()

    def expire(self) -> None:
        sock = self.sock
        assert sock is not None
        self.sock = None
        sock.close()
        self.outcome = "timeout"


def verdict(kind: str, probes: list[Probe]) -> str:
    """One target's outcome: ``tcp`` is its connect's; ``dns`` is its UDP query's
    unless that got no answer and the TCP connect (sent at the same time: a
    policy that drops UDP only is not isolation) got through."""
    if kind != "dns":
        return probes[0].outcome or "timeout"
    udp, tcp = probes
    if udp.outcome == "answered" or tcp.outcome != "connected":
        return udp.outcome or "timeout"
    return "connected"


def expand(name: str, kind: str, host: str, port: int) -> list[tuple[str, str, str, int]]:
    if host == "@resolv":
        servers: list[str] = []
        try:
            with open("/etc/resolv.conf") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 2 and fields[0] == "nameserver":
                        servers.append(fields[1].split("%")[0])
        except OSError:
            pass
        return [(name, kind, s, port) for s in servers[:3]] or [(name, kind, host, port)]
    if host == "@service":
        found = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        try:
            found_port = int(os.environ.get("KUBERNETES_SERVICE_PORT", "443"))
        except ValueError:
            found_port = 443
        return [(name, kind, found, found_port)] if found else [(name, kind, host, port)]
    return [(name, kind, host, port)]


def main() -> None:
    targets = json.loads(sys.argv[1])
    timeout = float(sys.argv[2])
    jobs: list[tuple[str, str, str, int, list[Probe]]] = []
    for item in targets[:32]:
        for name, kind, host, port in expand(str(item[0]), str(item[1]), str(item[2]), int(item[3])):
            kinds = ("udp", "tcp") if kind == "dns" else ("tcp",)
            jobs.append((name, kind, host, port, [Probe(k, host, port) for k in kinds]))
    probes = [p for job in jobs for p in job[4]]
    for probe in probes:
        probe.start(timeout)
    poller = select.poll()
    while True:
        waiting = {p.sock.fileno(): p for p in probes if p.sock is not None}
        if not waiting:
            break
        for fd, p in waiting.items():
            poller.register(fd, select.POLLIN if p.kind == "udp" else select.POLLOUT)
        now = time.monotonic()
        left = max(0.0, min(p.deadline for p in waiting.values()) - now)
        events = poller.poll(left * 1000)
        for fd in waiting:
            poller.unregister(fd)
        ready = {fd for fd, _ in events}
        for fd in ready:
            waiting[fd].ready()
        now = time.monotonic()
        for fd, p in waiting.items():
            if fd not in ready and p.deadline <= now:
                p.expire()
    print(json.dumps([[n, h, port, k, verdict(k, ps)] for n, k, h, port, ps in jobs]), flush=True)
    # ``--then ARGV...``: become that program on the same stdio (the backend's
    # first exec checks the network, then is the bridge to the agent: one exec).
    if len(sys.argv) > 4 and sys.argv[3] == "--then":
        os.execvp(sys.argv[4], sys.argv[4:])  # noqa: S606 - the backend's own argv, no shell


if __name__ == "__main__":
    main()
