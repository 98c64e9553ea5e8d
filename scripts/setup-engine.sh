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
# Also "experimental" (Docker's checkpoint API) and "live-restore" (sandboxes keep
# running while dockerd restarts).  scripts/engine_config.py keeps every other
# setting and refuses, without touching it, a daemon.json that is not valid JSON.
# dockerd refuses live-restore on a swarm node, and a directive given both as a
# flag and in the file: neither case gets it written.
daemon_json=/etc/docker/daemon.json
# The engine `docker` talks to: its pidfile, not `pidof dockerd`, which also lists
# other engines on this host (test engines with their own --pidfile and socket).
engine_pid() {
  local pid
  if pid=$(cat /var/run/docker.pid 2>/dev/null) && [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    echo "$pid"
  elif pid=$(pidof dockerd) && [[ "$pid" != *" "* ]]; then
    echo "$pid"
  else
    echo "engine: cannot tell which dockerd is the engine (no /var/run/docker.pid; dockerd pids: ${pid:-none})" >&2
    return 1
  fi
}
config_args=(--file "$daemon_json" --runsc "$(command -v runsc || echo /usr/bin/runsc)")
if docker info >/dev/null 2>&1; then
  swarm_state=$(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null || true)
  [[ -z "$swarm_state" || "$swarm_state" == inactive ]] || config_args+=(--swarm)
  dockerd_pid=$(engine_pid 2>/dev/null || true)
  if [[ -n "$dockerd_pid" ]] && tr '\0' '\n' <"/proc/$dockerd_pid/cmdline" | grep -q '^--live-restore'; then
    config_args+=(--live-restore-flag)
  fi
elif [[ -e /var/lib/docker/swarm/docker-state.json ]]; then
  config_args+=(--swarm)  # an engine that is down but was a swarm node
fi
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! merged=$(python3 "$script_dir/engine_config.py" "${config_args[@]}"); then
  echo "engine: stopped: $daemon_json was not changed and dockerd was not touched" >&2
  exit 1
fi
[[ "$merged" == *"changed=yes"* ]] && touch /tmp/agentnest-daemon-changed
live_restore_wanted=false
[[ "$merged" == *"live-restore=on"* ]] && live_restore_wanted=true

runtimes_registered() {
  local have
  have=$(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null) || return 1
  [[ " $have " == *" runsc "* && " $have " == *" runsc-host "* ]]
}
live_restore_on() {
  [[ "$(docker info --format '{{.LiveRestoreEnabled}}' 2>/dev/null)" == true ]]
}

if docker info >/dev/null 2>&1; then
  if [[ -e /tmp/agentnest-daemon-changed ]] || ! runtimes_registered \
    || { $live_restore_wanted && ! live_restore_on; }; then
    # Reload the runtime list and live-restore without stopping running containers
    # (both are reloadable).  The reload is asynchronous: wait until the engine lists
    # the runtimes (live-restore is waited for below).  (After a reload
    # the engine's view of the default bridge no longer names its gateway in
    # IPAM.Config; docker0 keeps its address, and the tests read it from there.)
    kill -HUP "$(engine_pid)"
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
      pid=$(engine_pid)
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
# live-restore: what the engine reports once the reload (or start) has applied the file.
if $live_restore_wanted; then
  for _ in $(seq 1 30); do
    live_restore_on && break
    sleep 0.5
  done
  if ! live_restore_on; then
    echo "engine: warning: $daemon_json sets \"live-restore\": true but the engine still reports" \
      "LiveRestoreEnabled=false after 15s: sandboxes will not survive a restart of dockerd." \
      "dockerd logs why it refused the reload (journalctl -u docker, or /var/log/agentnest-dockerd.log);" \
      "\`agentnest doctor\` shows the state" >&2
  fi
fi
runtimes_registered || { echo "engine: runsc is not registered with Docker (see /etc/docker/daemon.json)" >&2; exit 1; }
echo "engine: ready ($(docker info --format '{{.ServerVersion}}'), runtimes: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}')," \
  "live-restore: $(docker info --format '{{.LiveRestoreEnabled}}'))"
