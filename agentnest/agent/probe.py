"""Runs inside a new sandbox before it is handed out: what can its workload see of its confinement?

``agentnest.verify.judge`` compares what this prints with the configuration (``Sandbox(...,
verify=True)`` and ``agentnest doctor``); the judge treats every field as untrusted.  Shipped as
source on the command line (``python3 -I -S -c SOURCE``): no import of AgentNest, standard
library only, Python >= 3.8.  Prints one JSON object: ``/proc/self/status``, whether the root
accepts a write and its mount options, the network interfaces and whether a default route
exists, the cgroup memory and PID limits (v1 and v2 paths), ``MemTotal``, the workspace's size
and the kernel release.
"""

from __future__ import annotations  # annotations stay strings: no typing import on the create path

import json
import os


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def main() -> None:
    status: dict[str, str] = {}
    for line in (read("/proc/self/status") or "").splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    try:
        open("/agentnest-verify-probe", "w").close()
        os.unlink("/agentnest-verify-probe")
        root_write = "succeeded"
    except OSError as e:
        root_write = e.strerror or str(e)
    root_options = ""
    for line in (read("/proc/self/mounts") or "").splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] == "/":
            root_options = fields[3]
    dev = (read("/proc/net/dev") or "").splitlines()[2:]
    routes = read("/proc/net/route")
    meminfo = dict(line.split(":", 1) for line in (read("/proc/meminfo") or "").splitlines() if ":" in line)
    vfs = os.statvfs(os.environ.get("AGENTNEST_WORKSPACE", "/workspace"))
    default_route = None
    if routes is not None:
        default_route = any(r.split()[1] == "00000000" for r in routes.splitlines()[1:] if len(r.split()) > 1)
    memory = ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max")
    pids = ("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")
    report = {
        "status": status,
        "root_write": root_write,
        "root_options": root_options,
        "interfaces": [line.split(":")[0].strip() for line in dev if ":" in line],
        "default_route": default_route,
        "memory": {p: read(p) for p in memory},
        "pids": {p: read(p) for p in pids},
        "mem_total_kib": meminfo.get("MemTotal", "").strip().split(" ")[0],
        "workspace_bytes": vfs.f_blocks * vfs.f_frsize,
        "kernel": os.uname().release,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
