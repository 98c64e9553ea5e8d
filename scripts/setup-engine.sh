#!/usr/bin/env bash
# Install and start what AgentNest's tests and demo need on Debian, as root.
# Idempotent: every step checks before it acts.
set -euo pipefail

need_pkgs=()
for pair in docker.io:dockerd runsc:runsc bubblewrap:bwrap debootstrap:debootstrap tini:docker-init \
    btrfs-progs:mkfs.btrfs; do
  pkg=${pair%%:*}; bin=${pair##*:}
  command -v "$bin" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if ((${#need_pkgs[@]})); then
  echo "engine: installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# Register gVisor with Docker.  This kernel's gVisor netstack refuses to start
# with networking from the root namespace, so `runsc` runs with its network
# off (AgentNest's default: network denied).  --oci-seccomp makes gVisor apply
# the container's seccomp profile inside the sandbox too (it ignores it otherwise).
python3 - <<'PY'
import json, os, shutil
path = "/etc/docker/daemon.json"
try:
    with open(path) as f:
        cfg = json.load(f)
except FileNotFoundError:
    cfg = {}
runsc = shutil.which("runsc") or "/usr/bin/runsc"
want = {
    "runsc": {"path": runsc, "runtimeArgs": ["--network=none", "--oci-seccomp"]},
    "runsc-host": {"path": runsc, "runtimeArgs": ["--network=host", "--oci-seccomp"]},
}
runtimes = cfg.setdefault("runtimes", {})
changed = False
for name, spec in want.items():
    if runtimes.get(name) != spec:
        runtimes[name] = spec
        changed = True
# Docker's checkpoint API (gVisor pause to disk, live fork) is experimental in 20.10.
if cfg.get("experimental") is not True:
    cfg["experimental"] = True
    changed = True
if changed:
    os.makedirs("/etc/docker", exist_ok=True)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    print("engine: registered runsc in", path)
    open("/tmp/agentnest-daemon-changed", "w").close()
PY

runtimes_registered() {
  local have
  have=$(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null) || return 1
  [[ " $have " == *" runsc "* && " $have " == *" runsc-host "* ]]
}

if docker info >/dev/null 2>&1; then
  if [[ -e /tmp/agentnest-daemon-changed ]] || ! runtimes_registered; then
    # Reload the runtime list without stopping running containers.  The reload
    # is asynchronous: wait until the engine lists the runtimes.  (After a reload
    # the engine's view of the default bridge no longer names its gateway in
    # IPAM.Config; docker0 keeps its address, and the tests read it from there.)
    kill -HUP "$(pidof dockerd)"
    for _ in $(seq 1 60); do
      runtimes_registered && { rm -f /tmp/agentnest-daemon-changed; break; }
      sleep 0.5
    done
  fi
else
  rm -f /tmp/agentnest-daemon-changed
  if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
    systemctl start docker
  else
    echo "engine: starting dockerd"
    setsid dockerd >/var/log/agentnest-dockerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
fi
docker info >/dev/null 2>&1 || { echo "engine: dockerd did not come up; see /var/log/agentnest-dockerd.log" >&2; exit 1; }

# "experimental" is not reloaded by SIGHUP (moby/moby#36632): it takes a restart,
# which stops every container.  Restart only an engine with none running.
if [[ "$(docker info --format '{{.ExperimentalBuild}}')" != "true" ]]; then
  if [[ -z "$(docker ps -q)" ]]; then
    echo "engine: restarting dockerd for experimental mode (checkpoints)"
    if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
      systemctl restart docker
    else
      pid=$(pidof dockerd)
      kill -TERM "$pid"
      for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      setsid dockerd >/var/log/agentnest-dockerd.log 2>&1 < /dev/null &
    fi
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      sleep 0.5
    done
  else
    echo "engine: restart dockerd to enable experimental mode (gVisor pause to disk, live fork);" \
      "not restarting it now: containers are running" >&2
  fi
fi
runtimes_registered || { echo "engine: runsc is not registered with Docker (see /etc/docker/daemon.json)" >&2; exit 1; }
echo "engine: ready ($(docker info --format '{{.ServerVersion}}'), runtimes: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}'))"
