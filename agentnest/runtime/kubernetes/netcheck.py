"""Fail closed: prove from inside a new pod that its network holds, before it is handed out.

A NetworkPolicy is stored whether or not the cluster's network plugin
enforces it (kubenet, flannel and some managed defaults do not), so the
object proves nothing.  After the pod runs, the backend execs
``agent/netprobe.py`` in it, as the sandbox's user, and this module judges
what it saw: the apiserver, the cloud metadata address, the cluster DNS and a
direct internet address must all be unreachable.  Anything else — a
connection, a DNS answer, a reset from a remote host, an outcome we do not
know, a probe that did not finish or sent something malformed — deletes the
pod and raises :class:`~agentnest.errors.VerificationError`.

What counts as blocked: a timeout (a policy that drops), ``ENETUNREACH`` /
``EHOSTUNREACH`` (no route, or a policy that rejects with ICMP), ``EPERM`` /
``EACCES`` (a local firewall), and a reset on a *loopback* address (the pod's
own loopback: nothing listens there).  A reset from any other address means the
packet got out, so it counts as reachable.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...errors import ConfigurationError, VerificationError
from ..launch import script_command

__all__ = ["DEFAULT_PROBES", "Outcome", "judge", "parse_addresses", "probe_argv", "targets"]

#: Where the check looks unless ``KubernetesSpec.network_probes`` says otherwise.
DEFAULT_PROBES: Mapping[str, str] = {
    # The address the kubelet gives every pod (KUBERNETES_SERVICE_HOST/_PORT).
    "apiserver": "@service:443",
    # Cloud metadata (credentials of the node's identity on most clouds).
    "metadata": "169.254.169.254:80",
    # The pod's nameservers: the cluster DNS (names must not leave the sandbox).
    "dns": "@resolv:53",
    # A direct internet address (an anycast resolver's HTTPS port).
    "internet": "1.1.1.1:443",
}
#: The in-pod host names netprobe resolves itself.
_SPECIAL = ("@service", "@resolv")
#: Outcomes that show the target was not reached.
_BLOCKED = frozenset(
    {
        "timeout",
        "ENETUNREACH",
        "EHOSTUNREACH",
        "ENETDOWN",
        "EHOSTDOWN",
        "EPERM",
        "EACCES",
        "EADDRNOTAVAIL",
        "EAFNOSUPPORT",
    }
)
#: What one probe may print at most (32 targets, three nameservers each).
MAX_OUTPUT = 64 * 1024


def parse_addresses(name: str, value: object) -> list[tuple[str, int]]:
    """``"10.0.0.1:443, [fd00::1]:53"`` -> ``[("10.0.0.1", 443), ("fd00::1", 53)]``.

    Raises:
        ConfigurationError: not ``IP:PORT`` (or ``@service`` / ``@resolv`` with a port).
    """
    fix = f"network_probes[{name!r}]={value!r:.80} must be IP:PORT ([IPv6]:PORT), several comma-separated"
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(fix)
    out: list[tuple[str, int]] = []
    for item in value.split(","):
        host, sep, port_text = item.strip().rpartition(":")
        if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigurationError(f"{fix}; {item.strip()!r:.60} has no valid port")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if host not in _SPECIAL:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                # The pod has no DNS to resolve a name with, by design.
                raise ConfigurationError(f"{fix}; {host!r:.60} is not an IP address") from None
        out.append((host, int(port_text)))
    if len(out) > 8:
        raise ConfigurationError(f"{fix}; at most 8 addresses per name")
    return out


def targets(probes: Mapping[str, str], server_url: str | None = None) -> list[list[Any]]:
    """The ``[name, kind, host, port]`` list netprobe takes: the defaults, then ``probes``.

    ``server_url`` is the apiserver as the backend reaches it; its address is
    checked too when it is an IP that is not loopback (a pod's loopback is its
    own) and ``probes`` does not set ``apiserver``.
    """
    merged = {**DEFAULT_PROBES, **probes}
    out: list[list[Any]] = []
    for name, value in merged.items():
        kind = "dns" if name == "dns" else "tcp"
        out.extend([name, kind, host, port] for host, port in parse_addresses(name, value))
    if server_url and "apiserver" not in probes:
        parts = urlsplit(server_url)
        try:
            address = ipaddress.ip_address(parts.hostname or "")
        except ValueError:
            address = None  # a name: the pod's @service address covers the apiserver
        if address is not None and not address.is_loopback:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            out.append(["apiserver", "tcp", str(address), port])
    return out


def probe_argv(
    python: str, wanted: Sequence[Sequence[Any]], timeout: float, then: Sequence[str] = ()
) -> list[str]:
    """The command that runs netprobe in the pod (its source in the argv: nothing to install).

    ``then``: a command netprobe becomes once it printed its line (the bridge).
    """
    extra = ["--then", *then] if then else []
    return script_command(python, "netprobe", json.dumps(list(wanted)), repr(float(timeout)), *extra)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one probe saw."""

    name: str
    host: str
    port: int
    kind: str
    outcome: str

    @property
    def reached(self) -> bool:
        if self.outcome in _BLOCKED:
            return False
        if self.outcome == "refused":
            try:
                return not ipaddress.ip_address(self.host).is_loopback
            except ValueError:
                return True
        # connected, answered, or anything we do not know: fail closed
        return self.outcome != "absent"

    def __str__(self) -> str:
        where = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name} {where}:{self.port}/{self.kind} ({self.outcome})"


def judge(output: bytes, wanted: Sequence[Sequence[Any]]) -> list[Outcome]:
    """Parse netprobe's output (untrusted) and return what it saw.

    Raises:
        VerificationError: the output is not what netprobe prints, a target
            is missing from it, any target was reached, or no apiserver
            address could be checked.
    """
    try:
        rows = json.loads(output[:MAX_OUTPUT].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise VerificationError(f"the in-pod network check printed no JSON: {output[:200]!r}") from None
    if not isinstance(rows, list) or len(rows) > 4 * len(wanted):
        raise VerificationError("the in-pod network check printed something other than its list of results")
    seen: list[Outcome] = []
    for row in rows:
        if (
            not isinstance(row, list)
            or len(row) != 5
            or not all(isinstance(v, str) for v in (row[0], row[1], row[3], row[4]))
            or isinstance(row[2], bool)
            or not isinstance(row[2], int)
        ):
            raise VerificationError(f"the in-pod network check printed a malformed result: {row!r:.200}")
        seen.append(Outcome(row[0][:40], row[1][:64], row[2], row[3][:8], row[4][:40]))
    names = {str(w[0]) for w in wanted}
    missing = sorted(names - {o.name for o in seen})
    if missing:
        raise VerificationError(f"the in-pod network check did not report {', '.join(missing)}")
    problems = [str(o) for o in seen if o.reached]
    if not any(o.name == "apiserver" and o.outcome != "absent" for o in seen):
        problems.append(
            "apiserver: no address to check (KUBERNETES_SERVICE_HOST is unset in the pod); "
            "set KubernetesSpec(network_probes={'apiserver': 'IP:PORT'})"
        )
    if problems:
        raise VerificationError(
            f"the pod reached what its NetworkPolicy denies: {'; '.join(problems)}. The cluster's "
            "network plugin does not enforce NetworkPolicies (kubenet and flannel do not; Calico and "
            "Cilium do): install one that does, or run sandboxes on the docker/gvisor backend. "
            "The pod and its objects were deleted",
            seen,
        )
    return seen
