"""Fail-closed start: check from inside a sandbox that its policy really holds.

``Sandbox(..., verify=True)`` and ``agentnest doctor`` run :data:`PROBE` in the
sandbox and :func:`judge` what it saw against the configuration: the user,
capabilities, no-new-privileges, seccomp, a read-only root, the network (only
loopback, or only the route to the egress proxy), and the memory, process and
workspace limits.  A sandbox with a failed check is destroyed, never handed out.

Some facts cannot be seen from inside gVisor (it serves system calls itself
and hides cgroups); those checks are ``skip``, not ``ok``, and say why.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .config import ResourceLimits

OK = "ok"
FAIL = "fail"
SKIP = "skip"
"""Not checkable here (e.g. not visible inside gVisor); does not fail verification."""

#: Runs inside the sandbox and reports what the workload can see, as JSON (``agent/probe.py``).
PROBE = resources.files("agentnest.agent").joinpath("probe.py").read_text("utf-8")


@dataclass(frozen=True, slots=True)
class Finding:
    """The outcome of one check."""

    name: str
    status: str
    """``ok``, ``fail`` or ``skip``."""
    detail: str
    hint: str = ""
    """How to fix a failure."""


def human_bytes(size: float) -> str:
    """``536870912`` -> ``512.0 MiB``."""
    if abs(size) < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB"):
        size /= 1024
        if abs(size) < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} GiB"


def judge(
    seen: Mapping[str, Any],
    limits: ResourceLimits,
    *,
    gvisor: bool,
    network: str = "denied",
    uid: int = 65532,
    read_only: bool = True,
    engine_pids: int | None = None,
    workspace_quota: int | None = None,
) -> list[Finding]:
    """Compare what :data:`PROBE` saw with the configuration; one finding per check.

    ``network`` is the sandbox's network mode (``denied``, ``allowlist``, ``open``).
    ``workspace_quota`` is a disk workspace's quota as the host reads it
    (``RuntimeBackend.workspace_quota``): inside, ``statfs`` shows the whole pool.
    """
    found: list[Finding] = []

    def add(name: str, status: str, detail: str, hint: str = "") -> None:
        found.append(Finding(name, status, detail, hint if status != OK else ""))

    status: dict[str, str] = {str(k): str(v) for k, v in (seen.get("status") or {}).items()}
    kernel = str(seen.get("kernel", "?"))
    gvisor_note = f"gVisor (kernel {kernel}) serves the workload's system calls itself"

    uids = status.get("Uid", "?").split()
    uid0 = uids[0] if uids else "?"
    add(
        "non-root user",
        OK if uid0 == str(uid) and uid != 0 else FAIL,
        f"uid {uid0}",
        f"the sandbox runs as uid {uid0}, not {uid}; check SandboxConfig.user",
    )

    caps = {k: v for k, v in status.items() if k.startswith("Cap")}
    zero = "CapEff" in caps and all(_is_hex(v) and int(v, 16) == 0 for v in caps.values())
    add(
        "no capabilities",
        OK if zero else FAIL,
        f"CapEff={caps.get('CapEff', '?')} ({len(caps)} capability sets, all zero)" if zero else f"{caps}",
        "the container kept capabilities; it must be created with cap_drop=['ALL']",
    )

    nnp = status.get("NoNewPrivs")
    if nnp == "1":
        add("no-new-privileges", OK, "NoNewPrivs: 1")
    elif nnp is None and gvisor:
        add("no-new-privileges", SKIP, "not reported inside gVisor (the engine passes it to runsc)")
    else:
        add(
            "no-new-privileges",
            FAIL,
            f"NoNewPrivs: {nnp}",
            "create the container with no-new-privileges:true",
        )

    seccomp = status.get("Seccomp")
    if seccomp == "2":
        add("seccomp filter", OK, "Seccomp: 2 (filter mode)")
    elif gvisor:
        add(
            "seccomp filter",
            SKIP,
            f"Seccomp: {seccomp}; {gvisor_note}; the OCI seccomp profile is not applied inside it",
        )
    else:
        add(
            "seccomp filter",
            FAIL,
            f"Seccomp: {seccomp}",
            "create the container with AgentNest's seccomp profile",
        )

    root_options = str(seen.get("root_options", ""))
    root_write = str(seen.get("root_write", "?"))
    is_read_only = "ro" in root_options.split(",") and root_write != "succeeded"
    add(
        "read-only root",
        (OK if is_read_only else FAIL) if read_only else SKIP,
        ("" if read_only else "a writable root was asked for; ")
        + f"/ mounted {root_options.split(',')[0] or '?'}; writing /agentnest-verify-probe: {root_write}",
        "create the container with read_only=True",
    )

    interfaces = [str(i) for i in seen.get("interfaces") or []]
    shown = f"interfaces: {', '.join(interfaces) or 'none'}"
    if network == "denied":
        add(
            "no network",
            OK if interfaces == ["lo"] else FAIL,
            shown,
            "the sandbox has a network interface besides loopback; use network_mode=none",
        )
    elif network == "allowlist":
        route = seen.get("default_route")
        if route is None and gvisor:
            add("only the proxy", SKIP, f"{shown}; no routing table visible inside gVisor")
        else:
            add(
                "only the proxy",
                OK if route is False else FAIL,
                f"{shown}; default route: {'yes' if route else 'none'}",
                "the sandbox's network has a route out; it must sit on an internal network with the proxy",
            )
    else:
        add("network", SKIP, f"{shown}; open networking was asked for")

    _limit(
        add,
        "memory limit",
        limits.memory,
        seen.get("memory") or {},
        human_bytes,
        gvisor,
        fallback=_mem_total(seen),
    )
    _limit(add, "process limit", limits.pids, seen.get("pids") or {}, str, gvisor, engine_value=engine_pids)

    size = seen.get("workspace_bytes")
    if limits.workspace_medium == "disk":
        bounded = workspace_quota is not None and 0 < workspace_quota <= limits.workspace
        shown = human_bytes(workspace_quota) if workspace_quota is not None else "no quota found"
        add(
            "workspace size",
            OK if bounded else FAIL,
            f"/workspace: the storage pool's quota, {shown} (limit {human_bytes(limits.workspace)}), "
            "read on the host",
            "the workspace must be a subvolume with a qgroup limit (`agentnest setup`, `agentnest doctor`)",
        )
        return found
    bounded = isinstance(size, int) and 0 < size <= limits.workspace
    add(
        "workspace size",
        OK if bounded else FAIL,
        f"/workspace holds at most {human_bytes(size) if isinstance(size, int) else size} "
        f"(limit {human_bytes(limits.workspace)})",
        "/workspace must be a size-limited tmpfs",
    )
    return found


def _limit(
    add: Callable[..., None],
    name: str,
    expected: int,
    files: Mapping[str, Any],
    show: Callable[[int], str],
    gvisor: bool,
    *,
    fallback: int | None = None,
    engine_value: int | None = None,
) -> None:
    """A cgroup limit as seen from inside, v1 or v2 file, with a gVisor fallback."""
    for path, raw in files.items():
        if raw is None:
            continue
        value = str(raw).strip()
        if value.isdigit() and int(value) == expected:
            add(name, OK, f"{show(expected)} ({path})")
        else:
            add(
                name,
                FAIL,
                f"{path} says {value!r}, expected {show(expected)}",
                "the engine did not apply the limit; check the container's HostConfig",
            )
        return
    if fallback is not None and fallback == expected:
        add(name, OK, f"{show(expected)} (MemTotal: gVisor sizes its kernel to the limit)")
    elif gvisor:
        set_on = f"; the engine has {engine_value} set on the container" if engine_value is not None else ""
        add(name, SKIP, f"no cgroup files visible inside gVisor{set_on}")
    else:
        add(
            name,
            FAIL,
            "no cgroup limit file is visible inside the sandbox",
            "the engine did not apply the limit, or cgroups are hidden",
        )


def _mem_total(seen: Mapping[str, Any]) -> int | None:
    raw = str(seen.get("mem_total_kib", ""))
    return int(raw) * 1024 if raw.isdigit() else None


def _is_hex(value: str) -> bool:
    try:
        int(value, 16)
    except ValueError:
        return False
    return True


__all__ = ["FAIL", "OK", "PROBE", "SKIP", "Finding", "judge"]
