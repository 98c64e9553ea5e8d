"""Our own checks of manifests: what a schema validator cannot see.

``kubernetes-validate`` checks structure only: it accepts
``seccompProfile.type: Bogus``, ``memory: lots`` and a container without an
image (research/kubernetes.md §4.1).  Pod Security Admission enforces the
``restricted`` rules only where a namespace is labelled for it, and checks
none of ours (read-only root, no token, no service links, bounded
``emptyDir``).  So every object the backend sends is linted here first:
a port of the PSA ``restricted`` checks plus the AgentNest rules.

Pure: no I/O, no ``kubernetes`` import.  :func:`lint` lists the problems,
:func:`check` raises :class:`~agentnest.errors.ConfigurationError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import ConfigurationError

__all__ = [
    "ALLOWED_VOLUME_TYPES",
    "QUANTITY",
    "check",
    "check_label",
    "label_problems",
    "lint",
    "quantity_value",
    "sanitize_label_value",
]

#: The Kubernetes quantity grammar (apimachinery ``resource.Quantity``):
#: a signed decimal number, then a binary-SI, decimal-SI or exponent suffix.
QUANTITY = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
}  # fmt: skip


def quantity_value(text: object) -> float | None:
    """A quantity's value (``"512Mi"`` -> 536870912.0, ``"500m"`` -> 0.5); None if not one."""
    if not isinstance(text, str) or not QUANTITY.fullmatch(text):
        return None
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIX[suffix]
    return float(text)  # a plain number or an exponent: float() reads both


#: Volume sources PSA ``restricted`` admits (every other one, hostPath first, is refused).
ALLOWED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
#: Sysctls PSA ``baseline`` considers safe (namespaced, per pod).
_SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
#: The resources whose requests must equal their limits (Guaranteed QoS: no overcommit).
_EQUAL_RESOURCES = ("memory", "cpu")
#: Secret values shorter than this are not searched for in pod specs.
_MIN_SECRET = 4


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str):
        return f"label key {key!r:.60} is not a string"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
        return f"label key {key!r:.80}: the prefix must be a DNS subdomain (e.g. 'example.com/team')"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"label key {key!r:.80}: the name must be 1-63 letters, digits, '-', '_' or '.', "
            "starting and ending alphanumeric"
        )
    return None


def _value_problem(key: str, value: object) -> str | None:
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            f"label {key}={value!r:.80}: a value must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending alphanumeric (or empty)"
        )
    return None


def label_problems(labels: object) -> list[str]:
    """What breaks the label grammar in ``labels`` (empty: all good)."""
    if not isinstance(labels, Mapping):
        return [f"labels must be a mapping, not {type(labels).__name__}"]
    out: list[str] = []
    for key, value in labels.items():
        problem = _key_problem(key) or _value_problem(str(key), value)
        if problem:
            out.append(problem)
    return out


def check_label(key: object, value: object, where: str) -> None:
    """Raise ConfigurationError naming ``where`` unless ``key: value`` is a valid label."""
    problem = _key_problem(key) or _value_problem(str(key), value)
    if problem:
        raise ConfigurationError(f"{where}: {problem}")


def sanitize_label_value(text: str) -> str:
    """``text`` squeezed into the label-value grammar (for ids and names we did not choose).

    Invalid characters become ``-``, the ends are trimmed to alphanumerics and
    the result cut to 63 characters; it may be empty.
    """
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)


# -- the checks -------------------------------------------------------------------


def _quantity_problem(where: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f"{where}={value!r:.60} is not a quantity"
    text = str(value)
    if not QUANTITY.match(text):
        return f"{where}={text!r:.60} is not a Kubernetes quantity (like '512Mi', '1', '500m')"
    if text.startswith("-"):
        return f"{where}={text!r:.60} is negative"
    return None


def _seccomp_problem(where: str, profile: object) -> str | None:
    if not isinstance(profile, Mapping):
        return None
    kind = profile.get("type")
    if kind == "RuntimeDefault":
        return None
    if kind == "Localhost":
        if not profile.get("localhostProfile"):
            return f"{where}.seccompProfile: type Localhost needs a localhostProfile"
        return None
    return f"{where}.seccompProfile.type={kind!r:.40} is not allowed; use RuntimeDefault or Localhost"


def _lint_container(
    where: str, c: Mapping[str, Any], pod_nonroot: bool, pod_seccomp: bool, writable_root: bool
) -> list[str]:
    out: list[str] = []
    sc: Mapping[str, Any] = c.get("securityContext") or {}
    # PSA restricted: no privileged containers, no escalation (setuid binaries, file caps).
    if sc.get("privileged") is True:
        out.append(f"{where}: privileged must not be true")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}: allowPrivilegeEscalation must be false")
    caps: Mapping[str, Any] = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or ()):
        out.append(f"{where}: capabilities.drop must include ALL")
    added = [cap for cap in caps.get("add") or () if cap != "NET_BIND_SERVICE"]
    if added:
        out.append(f"{where}: capabilities.add may hold only NET_BIND_SERVICE, not {added}")
    if sc.get("runAsNonRoot") is False or (not pod_nonroot and sc.get("runAsNonRoot") is not True):
        out.append(f"{where}: runAsNonRoot must be true (on the pod or the container)")
    if sc.get("runAsUser") == 0:
        out.append(f"{where}: runAsUser must not be 0")
    if "seccompProfile" in sc:
        problem = _seccomp_problem(f"{where}.securityContext", sc["seccompProfile"])
        if problem:
            out.append(problem)
    elif not pod_seccomp:
        out.append(f"{where}: no seccompProfile on the pod or the container")
    if sc.get("procMount") not in (None, "Default"):
        out.append(f"{where}: procMount must be Default")
    apparmor = sc.get("appArmorProfile") or {}
    if isinstance(apparmor, Mapping) and apparmor.get("type") == "Unconfined":
        out.append(f"{where}: appArmorProfile must not be Unconfined")
    selinux = (sc.get("seLinuxOptions") or {}).get("type")
    if selinux is not None and selinux not in _SELINUX_TYPES:
        out.append(f"{where}: seLinuxOptions.type {selinux!r} is not allowed")
    for port in c.get("ports") or ():
        if port.get("hostPort"):
            out.append(f"{where}: hostPort {port['hostPort']} is not allowed")
    # AgentNest: the image stays read-only (PSA does not require it), unless
    # the sandbox asked for a writable root (read_only_root=False).
    if not writable_root and sc.get("readOnlyRootFilesystem") is not True:
        out.append(f"{where}: readOnlyRootFilesystem must be true")
    resources: Mapping[str, Any] = c.get("resources") or {}
    limits: Mapping[str, Any] = resources.get("limits") or {}
    requests: Mapping[str, Any] = resources.get("requests") or {}
    for kind, values in (("limits", limits), ("requests", requests)):
        for name, value in values.items():
            problem = _quantity_problem(f"{where}.resources.{kind}.{name}", value)
            if problem:
                out.append(problem)
    # Guaranteed QoS: what a sandbox gets is what it was promised, never overcommitted.
    for name in _EQUAL_RESOURCES:
        if name not in limits:
            out.append(f"{where}: resources.limits.{name} is missing")
        elif requests.get(name) != limits[name]:
            out.append(f"{where}: resources.requests.{name} must equal limits.{name} ({limits[name]!r})")
    # Secrets reach a pod only as named keys (secretKeyRef), never a whole Secret
    # (envFrom), whose later keys would appear in the sandbox unasked.
    if c.get("envFrom"):
        out.append(f"{where}: envFrom is not allowed; use env with valueFrom.secretKeyRef")
    for env in c.get("env") or ():
        source = env.get("valueFrom")
        if source is not None and set(source) - {"secretKeyRef", "fieldRef"}:
            out.append(f"{where}: env {env.get('name')!r} may come only from secretKeyRef or fieldRef")
    return out


def _lint_volume(where: str, volume: Mapping[str, Any]) -> list[str]:
    kinds = [k for k in volume if k != "name"]
    out = [f"{where}: volume type {k!r} is not allowed" for k in kinds if k not in ALLOWED_VOLUME_TYPES]
    empty = volume.get("emptyDir")
    if isinstance(empty, Mapping):
        # An unbounded emptyDir fills the node's disk, or the pod's memory as tmpfs.
        if "sizeLimit" not in empty:
            out.append(f"{where}: emptyDir needs a sizeLimit")
        else:
            problem = _quantity_problem(f"{where}.emptyDir.sizeLimit", empty["sizeLimit"])
            if problem:
                out.append(problem)
    ephemeral = volume.get("ephemeral")
    if isinstance(ephemeral, Mapping):
        spec = (ephemeral.get("volumeClaimTemplate") or {}).get("spec") or {}
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
        if storage is None:
            out.append(f"{where}: ephemeral volume needs resources.requests.storage")
        else:
            problem = _quantity_problem(f"{where}.ephemeral...storage", storage)
            if problem:
                out.append(problem)
    return out


def _written_strings(spec: Mapping[str, Any]) -> list[str]:
    """The strings of a pod spec a program reads: commands, arguments, env values."""
    out: list[str] = []
    for kind in _CONTAINER_KINDS:
        for c in spec.get(kind) or ():
            out += [str(a) for a in [*(c.get("command") or ()), *(c.get("args") or ())]]
            out += [str(e["value"]) for e in c.get("env") or () if "value" in e]
    return out


def _lint_pod_spec(spec: Mapping[str, Any], secrets: Iterable[str], writable_root: bool) -> list[str]:
    out: list[str] = []
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(name) is True:
            out.append(f"pod: {name} must not be true")
    # AgentNest: no API credentials and no neighbours' addresses inside a sandbox.
    if spec.get("automountServiceAccountToken") is not False:
        out.append("pod: automountServiceAccountToken must be false")
    if spec.get("enableServiceLinks") is not False:
        out.append("pod: enableServiceLinks must be false")
    if spec.get("restartPolicy") != "Never":
        out.append("pod: restartPolicy must be Never (a sandbox is not restarted behind our back)")
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, bool) or not isinstance(deadline, int) or deadline <= 0:
        out.append("pod: activeDeadlineSeconds must be set (the hard outer bound of its lifetime)")
    psc: Mapping[str, Any] = spec.get("securityContext") or {}
    pod_nonroot = psc.get("runAsNonRoot") is True
    if psc.get("runAsUser") == 0:
        out.append("pod: securityContext.runAsUser must not be 0")
    pod_seccomp = "seccompProfile" in psc
    if pod_seccomp:
        problem = _seccomp_problem("pod.securityContext", psc["seccompProfile"])
        if problem:
            out.append(problem)
    for sysctl in psc.get("sysctls") or ():
        if sysctl.get("name") not in _SAFE_SYSCTLS:
            out.append(f"pod: sysctl {sysctl.get('name')!r} is not allowed")
    containers = 0
    for kind in _CONTAINER_KINDS:
        for i, c in enumerate(spec.get(kind) or ()):
            containers += 1
            where = f"{kind}[{i}] {c.get('name')!r}"
            out += _lint_container(where, c, pod_nonroot, pod_seccomp, writable_root)
    if not containers:
        out.append("pod: no containers")
    for i, volume in enumerate(spec.get("volumes") or ()):
        out += _lint_volume(f"volumes[{i}] {volume.get('name')!r}", volume)
    # A secret's value must never be written into the pod spec, where anyone
    # who may read pods (and the audit log) sees it.  Values shorter than
    # _MIN_SECRET would match by chance everywhere; they are not looked for.
    written = _written_strings(spec)
    for value in secrets:
        if len(value) >= _MIN_SECRET and any(value in text for text in written):
            out.append("pod: a secret value appears in the pod spec; pass it by secretKeyRef")
            break
    return out


def _lint_quantities(where: str, values: object) -> list[str]:
    if not isinstance(values, Mapping):
        return []
    return [p for k, v in values.items() if (p := _quantity_problem(f"{where}.{k}", v))]


def lint(obj: Mapping[str, Any], secrets: Iterable[str] = (), *, writable_root: bool = False) -> list[str]:
    """The problems of one manifest (an empty list: clean).

    Pods get the PSA ``restricted`` checks and the AgentNest rules; every
    object gets the label grammar; quotas and limit ranges get the quantity
    grammar.  ``secrets`` are values that must not appear in a pod spec.
    ``writable_root`` drops the one AgentNest rule a sandbox may opt out of
    (``read_only_root=False``): a read-only root filesystem.
    """
    out: list[str] = []
    metadata: Mapping[str, Any] = obj.get("metadata") or {}
    out += label_problems(metadata.get("labels") or {})
    for key in metadata.get("annotations") or {}:
        problem = _key_problem(key)
        if problem:
            out.append(problem.replace("label key", "annotation key"))
    kind = obj.get("kind")
    if kind == "Pod":
        out += _lint_pod_spec(obj.get("spec") or {}, secrets, writable_root)
    elif kind == "ResourceQuota":
        out += _lint_quantities("hard", (obj.get("spec") or {}).get("hard"))
    elif kind == "LimitRange":
        for i, item in enumerate((obj.get("spec") or {}).get("limits") or ()):
            for field in ("default", "defaultRequest", "max", "min"):
                out += _lint_quantities(f"limits[{i}].{field}", item.get(field))
    elif kind == "NetworkPolicy":
        spec = obj.get("spec") or {}
        types = spec.get("policyTypes") or ()
        # Without an explicit Egress type a policy with no egress rules restricts nothing outbound.
        if "Egress" not in types or "Ingress" not in types:
            out.append("NetworkPolicy: policyTypes must list Ingress and Egress")
    return out


def check(obj: Mapping[str, Any], secrets: Iterable[str] = (), *, writable_root: bool = False) -> None:
    """Raise ConfigurationError listing every problem :func:`lint` finds in ``obj``."""
    problems = lint(obj, secrets, writable_root=writable_root)
    if problems:
        name = (obj.get("metadata") or {}).get("name", "?")
        raise ConfigurationError(f"{obj.get('kind')} {name} breaks the sandbox rules: " + "; ".join(problems))
