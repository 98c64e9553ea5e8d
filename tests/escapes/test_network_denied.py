"""Networking with the default policy (denied): every protocol, the metadata
address, the host's gateway, the host's loopback and abstract sockets.

The sandbox has no interface but its own loopback and no route, so the
kernel refuses every outbound attempt before a packet exists: these tests
send nothing off the machine.  The host side only listens on its own
loopback and in its own abstract socket namespace, to prove that nothing
arrives there.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import os
import socket
import struct
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from agentnest import Sandbox

from .probes import expected, run_json

pytestmark = pytest.mark.attempt("network")

#: Tries each [family, type, protocol, host, port] as a connect (stream) or a
#: sendto (datagram); reports [errno or "sent"/"connected", seconds].
REACH = r"""
import json, socket, sys, time
out = []
for family, kind, proto, host, port in json.loads(sys.argv[1]):
    start = time.monotonic()
    try:
        s = socket.socket(family, kind, proto)
    except OSError as exc:
        out.append([["socket", exc.errno], 0])
        continue
    s.settimeout(5)
    try:
        if kind == socket.SOCK_STREAM:
            s.connect((host, port)) if family != socket.AF_UNIX else s.connect(host)
            outcome = "connected"
        else:
            s.sendto(b"agentnest-escape-probe", (host, port))
            outcome = "sent"
    except OSError as exc:
        outcome = exc.errno
    finally:
        s.close()
    out.append([outcome, time.monotonic() - start])
print(json.dumps(out))
"""

TCP, UDP = (socket.AF_INET, socket.SOCK_STREAM, 0), (socket.AF_INET, socket.SOCK_DGRAM, 0)
TCP6, UDP6 = (socket.AF_INET6, socket.SOCK_STREAM, 0), (socket.AF_INET6, socket.SOCK_DGRAM, 0)
#: No route: runc says ENETUNREACH (EADDRNOTAVAIL for IPv6, which loopback
#: alone cannot source); gVisor's netstack says EHOSTUNREACH.
UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}


def reach(sb: Sandbox, targets: list[tuple[Any, ...]]) -> list[list[Any]]:
    found: list[list[Any]] = run_json(sb, REACH, json.dumps(targets))
    return found


def assert_refused_locally(found: list[list[Any]], accepted: set[int]) -> None:
    for outcome, seconds in found:
        assert outcome in accepted
        assert seconds < 1, "refused only after a wait: something was sent"


def test_cloud_metadata_address_is_unreachable(shared_sandbox: Sandbox) -> None:
    targets = [
        (*TCP, "169.254.169.254", 80),
        (*UDP, "169.254.169.254", 53),
        (*TCP6, "fd00:ec2::254", 80),  # AWS's IPv6 metadata address
        (*TCP6, "::ffff:169.254.169.254", 80),
    ]
    assert_refused_locally(reach(shared_sandbox, targets), UNREACHABLE)


def interface_addresses(name: str) -> list[tuple[str, str]]:
    """``(source, address)`` for each IPv4 address of the host's interface ``name``."""
    found: list[tuple[str, str]] = []
    try:  # iproute2 lists every address, secondary ones too
        out = subprocess.run(
            ["ip", "-j", "-4", "addr", "show", "dev", name], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        for link in json.loads(out.stdout):
            found += [
                (f"`ip addr show {name}`", a["local"]) for a in link.get("addr_info", []) if "local" in a
            ]
    # SIOCGIFADDR: the primary address, on a host without iproute2.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            # struct ifreq: a 16-byte name, then a sockaddr_in whose address is at byte 20.
            ifreq = fcntl.ioctl(s, 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            pass
        else:
            found.append((f"SIOCGIFADDR {name}", socket.inet_ntoa(ifreq[20:24])))
    return found


def is_host_address(address: str) -> bool:
    """Whether ``address`` is one of this host's own (binding to it succeeds only then)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def host_bridge_address(docker_client: Any) -> str:
    """The host's own IPv4 address on the engine's default bridge (docker0).

    The bridge network's IPAM config names it as ``Gateway``, but the engine
    leaves that out after a reload (SIGHUP, which scripts/setup-engine.sh sends
    when it changes daemon.json) unless daemon.json sets ``bip``; the bridge
    interface keeps the address, so it is read from there next.  A candidate
    counts only if it is in the bridge's subnet and an address of this host:
    a wrong guess fails here instead of making the test pass without a target.
    """
    import docker.errors

    try:
        attrs = docker_client.networks.get("bridge").attrs
    except docker.errors.NotFound:
        pytest.skip(
            "the engine has no default bridge network (dockerd --bridge=none): no host address on one"
        )
    configs = (attrs.get("IPAM") or {}).get("Config") or []
    subnets = [ipaddress.ip_network(c["Subnet"]) for c in configs if ":" not in c.get("Subnet", ":")]
    name = (attrs.get("Options") or {}).get("com.docker.network.bridge.name", "docker0")
    candidates = [
        ("the bridge network's IPAM.Config Gateway", c["Gateway"]) for c in configs if c.get("Gateway")
    ]
    candidates += interface_addresses(name)
    tried = []
    for source, address in candidates:
        inside = any(ipaddress.ip_address(address) in subnet for subnet in subnets)
        if inside and is_host_address(address):
            return str(address)
        tried.append(
            f"{source} gave {address}, " + ("not an address of this host" if inside else "outside the subnet")
        )
    pytest.fail(
        f"no host address on the default bridge {name!r} (subnets {[str(n) for n in subnets]}): "
        + ("; ".join(tried) or "IPAM.Config has no Gateway and the interface has no IPv4 address")
    )


def test_host_gateway_is_unreachable(shared_sandbox: Sandbox, docker_client: Any) -> None:
    gateway = host_bridge_address(docker_client)  # docker0: the host's own address on the bridge
    targets = [(*TCP, gateway, 2375), (*TCP, gateway, 22), (*UDP, gateway, 53)]
    assert_refused_locally(reach(shared_sandbox, targets), UNREACHABLE)


def test_broadcast_and_multicast_cannot_leave(shared_sandbox: Sandbox) -> None:
    targets = [(*UDP, "255.255.255.255", 67), (*UDP, "224.0.0.251", 5353), (*UDP6, "ff02::1", 546)]
    found = reach(shared_sandbox, targets)
    # Broadcast without SO_BROADCAST is EACCES; the rest have no route.
    assert_refused_locally(found, UNREACHABLE | {errno.EACCES})


@pytest.fixture
def host_listeners() -> Iterator[dict[str, socket.socket]]:
    """A TCP and a UDP socket on the host's loopback and an abstract Unix socket."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(8)
        udp.bind(("127.0.0.1", 0))
        unix.bind(f"\0agentnest-escape-{os.urandom(4).hex()}")
        unix.listen(8)
        for s in (tcp, udp, unix):
            s.setblocking(False)
        yield {"tcp": tcp, "udp": udp, "unix": unix}
    finally:
        for s in (tcp, udp, unix):
            s.close()


def assert_nothing_arrived(listeners: dict[str, socket.socket]) -> None:
    for name in ("tcp", "unix"):
        with pytest.raises(BlockingIOError):
            listeners[name].accept()
    with pytest.raises(BlockingIOError):
        listeners["udp"].recv(64)


def test_host_loopback_services_are_unreachable(
    shared_sandbox: Sandbox, host_listeners: dict[str, socket.socket]
) -> None:
    tcp_port = host_listeners["tcp"].getsockname()[1]
    udp_port = host_listeners["udp"].getsockname()[1]
    found = reach(shared_sandbox, [(*TCP, "127.0.0.1", tcp_port), (*UDP, "127.0.0.1", udp_port)])
    # The sandbox's 127.0.0.1 is its own: nothing listens there.
    assert found[0][0] == errno.ECONNREFUSED
    assert found[1][0] == "sent"  # a datagram to its own loopback, where it is dropped
    assert_nothing_arrived(host_listeners)


def test_host_abstract_unix_sockets_are_unreachable(
    shared_sandbox: Sandbox, host_listeners: dict[str, socket.socket]
) -> None:
    # Abstract names belong to the network namespace (the containerd-shim escape
    # of CVE-2020-15257 used one).
    name = host_listeners["unix"].getsockname()
    assert isinstance(name, bytes) and name.startswith(b"\0")
    found = reach(shared_sandbox, [(socket.AF_UNIX, socket.SOCK_STREAM, 0, "\0" + name[1:].decode(), 0)])
    assert found[0][0] == errno.ECONNREFUSED
    assert_nothing_arrived(host_listeners)


def test_raw_and_packet_sockets_are_refused(shared_sandbox: Sandbox) -> None:
    targets = [
        (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "169.254.169.254", 0),
        (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW, "169.254.169.254", 0),
        (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6, "fd00:ec2::254", 0),
        (socket.AF_PACKET, socket.SOCK_RAW, 0x0300, "lo", 0),  # ETH_P_ALL
    ]
    found = reach(shared_sandbox, targets)
    assert [outcome for outcome, _ in found] == [["socket", errno.EPERM]] * 4


def test_icmp_echo_cannot_leave(shared_sandbox: Sandbox, backend_name: str) -> None:
    # An unprivileged ICMP socket, where the kernel allows one, still has no route.
    echo = b"\x08\x00\xf7\xff\x00\x00\x00\x00"
    code = f"""
import json, socket
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    s.sendto({echo!r}, ("169.254.169.254", 0)); out = "sent"
except OSError as exc:
    out = exc.errno
print(json.dumps(out))
"""
    assert run_json(shared_sandbox, code) in UNREACHABLE | {errno.EACCES}


def test_vsock_to_the_hypervisor_is_refused(shared_sandbox: Sandbox) -> None:
    # vsock is not network-namespaced: on a VM host it would reach the
    # hypervisor past network=none.  Only socket(2) is tried; nothing connects.
    code = r"""
import json, socket
try:
    socket.socket(40, socket.SOCK_STREAM).close(); out = "created"
except OSError as exc:
    out = exc.errno
print(json.dumps(out))
"""
    assert run_json(shared_sandbox, code) == errno.EPERM


RECONFIGURE = r"""
import fcntl, json, socket, struct
out = {}
nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
nl.bind((0, 0))
# RTM_NEWADDR 10.9.9.9 on lo; RTM_NEWROUTE default via 127.0.0.1 (NLM_F_REQUEST|ACK|CREATE|EXCL)
addr = struct.pack("BBBBI", 2, 8, 0, 0, 1) + struct.pack("HH4s", 8, 2, socket.inet_aton("10.9.9.9"))
gateway = struct.pack("HH4s", 8, 5, socket.inet_aton("127.0.0.1"))
route = struct.pack("BBBBBBBBI", 2, 0, 0, 0, 254, 3, 0, 1, 0) + gateway
for name, kind, body in (("new_address", 20, addr), ("new_route", 24, route)):
    nl.send(struct.pack("IHHII", 16 + len(body), kind, 0x1 | 0x4 | 0x400 | 0x200, 1, 0) + body)
    out[name] = struct.unpack_from("IHHIIi", nl.recv(4096))[5]      # nlmsgerr.error
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    fcntl.ioctl(udp, 0x8914, struct.pack("16sH22x", b"lo", 0)); out["lo_down"] = "done"   # SIOCSIFFLAGS
except OSError as exc:
    out["lo_down"] = exc.errno
print(json.dumps(out))
"""


def test_network_cannot_be_reconfigured(shared_sandbox: Sandbox, backend_name: str) -> None:
    found = run_json(shared_sandbox, RECONFIGURE)
    # No CAP_NET_ADMIN: runc's kernel says -EPERM; gVisor's netstack -EACCES, and
    # it has no SIOCSIFFLAGS at all (ENOTTY).
    refused = expected(backend_name, {-errno.EPERM}, {-errno.EACCES, -errno.EPERM})
    assert found["new_address"] in refused
    assert found["new_route"] in refused
    assert found["lo_down"] in expected(backend_name, {errno.EPERM}, {errno.EPERM, errno.ENOTTY})
    assert shared_sandbox.exec_python("import socket; print(socket.if_nameindex())").stdout == "[(1, 'lo')]\n"


def test_name_resolution_fails_without_sending(shared_sandbox: Sandbox) -> None:
    code = r"""
import json, socket, time
start = time.monotonic()
try:
    socket.getaddrinfo("metadata.google.internal", 80); out = "resolved"
except socket.gaierror as exc:
    out = exc.errno
print(json.dumps([out, time.monotonic() - start]))
"""
    outcome, seconds = run_json(shared_sandbox, code)
    assert outcome in (socket.EAI_AGAIN, socket.EAI_NONAME, socket.EAI_FAIL)
    assert seconds < 2


def test_other_ip_protocols_cannot_leave(shared_sandbox: Sandbox, backend_name: str) -> None:
    targets = [
        (socket.AF_INET, socket.SOCK_DGRAM, 136, "169.254.169.254", 53),  # UDP-Lite
        (socket.AF_INET, socket.SOCK_STREAM, 262, "169.254.169.254", 80),  # MPTCP
        (*UDP6, "2001:db8::1", 53),
    ]
    found = reach(shared_sandbox, targets)
    for (outcome, seconds), target in zip(found, targets, strict=True):
        # runc has both protocols (no route); gVisor does not implement them.
        if isinstance(outcome, list):
            assert backend_name == "gvisor", target
            assert outcome[1] in (errno.EPROTONOSUPPORT, errno.EINVAL), target
        else:
            assert outcome in UNREACHABLE, target
            assert seconds < 1
