#!/usr/bin/env bash
# Container engines for building and running the benchmark image, without systemd
# and without touching the host's network (no bridge, no iptables).
#
#   scripts/container-engines.sh install            # docker.io podman charliecloud debootstrap uidmap pigz
#   scripts/container-engines.sh start-dockerd DIR  # prints DOCKER_HOST=unix://DIR/docker.sock and PATH=DIR/bin:...
#   scripts/container-engines.sh stop-dockerd DIR   # stops the dockerd whose pid is in DIR/docker.pid
#   scripts/container-engines.sh podman-conf DIR    # prints CONTAINERS_CONF=DIR/containers.conf
#
# start-dockerd and podman-conf print the variables to export, one NAME=VALUE per line, last,
# so callers can `export $(scripts/container-engines.sh start-dockerd /tmp/d | grep =)`.
# Nothing here assumes a daemon is already running.
set -euo pipefail

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

install_engines() {
  # pigz: ch-convert compresses the exported image with it when present (2x on 2 cores).
  local packages=(docker.io podman charliecloud debootstrap uidmap pigz) missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "container-engines: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
}

start_dockerd() {
  local dir=${1:?start-dockerd DIR}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local sock=$dir/docker.sock pidfile=$dir/docker.pid
  export DOCKER_HOST=unix://$sock
  # The client from the daemon's own package (docker.io), first on PATH: another docker
  # client on the host (e.g. Docker CE's in /usr/local/bin) may be too new to talk to
  # this daemon (Docker 29 clients need API 1.44; Debian 12's dockerd 20.10 speaks 1.41).
  mkdir -p "$dir/bin"
  ln -sfn "$(dpkg -L docker.io | grep -m1 '/bin/docker$')" "$dir/bin/docker"
  export PATH=$dir/bin:$PATH
  if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && timeout 10 docker info >/dev/null 2>&1; then
    print_docker_env; return 0   # already ours and answering
  fi
  rm -f "$pidfile"
  # No bridge and no iptables: containers use --network host|none, and the host's
  # firewall and forwarding stay as they are. setsid: the daemon outlives this shell.
  setsid /usr/sbin/dockerd --data-root "$dir/data" --exec-root "$dir/exec" -H "unix://$sock" \
    --pidfile "$pidfile" --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
    </dev/null >"$dir/dockerd.log" 2>&1 &
  local starter=$!
  # Up to 2 minutes: a first start on a busy machine sets up its storage and containerd.
  for _ in $(seq 1 240); do
    if timeout 10 docker info >/dev/null 2>&1; then print_docker_env; return 0; fi
    if ! kill -0 "$starter" 2>/dev/null; then break; fi
    sleep 0.5
  done
  echo "container-engines: dockerd did not answer on $sock ($(docker version --format 'client {{.Client.Version}}' 2>&1 | tail -1)); last log lines:" >&2
  tail -n 20 "$dir/dockerd.log" >&2
  # Leave no daemon behind a failed start: it may not have written its pid file yet,
  # so kill the one this call started, then let stop-dockerd unmount what it left.
  kill -KILL "$starter" 2>/dev/null || true
  stop_dockerd "$dir"
  return 1
}

print_docker_env() {
  echo "DOCKER_HOST=$DOCKER_HOST"
  echo "PATH=$PATH"
}

stop_dockerd() {
  local dir=${1:?stop-dockerd DIR} pid mount
  [[ -d $dir ]] || { echo "container-engines: no $dir, nothing to stop" >&2; return 0; }
  dir=$(cd "$dir" && pwd)
  local pidfile=$dir/docker.pid
  if [[ -s $pidfile ]]; then
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "container-engines: dockerd $pid ignored SIGTERM for 30 s, sending SIGKILL" >&2
        kill -KILL "$pid"
      fi
    fi
    rm -f "$pidfile"
  fi
  # dockerd leaves its network namespace mounted (exec/netns/default); unmount what
  # is left under DIR, deepest first, so that `rm -r DIR` works afterwards.
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r mount; do
    umount "$mount" 2>/dev/null || umount -l "$mount"
  done
}

podman_conf() {
  local dir=${1:?podman-conf DIR}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  # runc: crun refuses this host's hybrid cgroups. cgroupfs: no systemd here.
  # Ulimits within the host's hard limits (podman's defaults exceed them).
  local nofile nproc
  nofile=$(ulimit -Hn); [[ $nofile == unlimited ]] && nofile=1048576
  nproc=$(ulimit -Hu);  [[ $nproc == unlimited ]] && nproc=32768
  ((nofile > 20000)) && nofile=20000
  ((nproc > 32768)) && nproc=32768
  cat >"$dir/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  echo "CONTAINERS_CONF=$dir/containers.conf"
}

case "${1:-}" in
  install) install_engines ;;
  start-dockerd) start_dockerd "${2:-}" ;;
  stop-dockerd) stop_dockerd "${2:-}" ;;
  podman-conf) podman_conf "${2:-}" ;;
  *) usage ;;
esac
