#!/usr/bin/env bash
# Container engines for building and running the benchmark image, without systemd
# and without touching the host's network (no bridge, no iptables).
#
#   scripts/container-engines.sh install            # docker.io podman charliecloud debootstrap uidmap pigz
#   scripts/container-engines.sh start-dockerd DIR  # prints DOCKER_HOST=unix://DIR/docker.sock and PATH=DIR/bin:...
#   scripts/container-engines.sh stop-dockerd DIR   # stops the dockerd whose pid is in DIR/docker.pid
#   scripts/container-engines.sh podman-conf DIR    # prints CONTAINERS_CONF=DIR/containers.conf
#   scripts/container-engines.sh podman-hpc DIR [MPI_DIR]  # NERSC's podman-hpc in DIR, its --mpi module
#                                                   # binding MPI_DIR; prints its variables
#   scripts/container-engines.sh clean-podman-hpc DIR  # unmounts and removes its stores in DIR
#
# start-dockerd, podman-conf and podman-hpc print the variables to export, one NAME=VALUE per line, last,
# so callers can `export $(scripts/container-engines.sh start-dockerd /tmp/d | grep =)`.
# Nothing here assumes a daemon is already running.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# apt-get install those of the packages that are not installed yet (nothing when all are).
install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "container-engines: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
}

install_engines() {
  # pigz: ch-convert compresses the exported image with it when present (2x on 2 cores).
  install_missing docker.io podman charliecloud debootstrap uidmap pigz
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
  # dockerd leaves its network namespace mounted (exec/netns/default).
  unmount_under "$dir"
}

# Unmount what is left under DIR, deepest first, so that `rm -r DIR` works afterwards.
unmount_under() {
  local dir=$1 mount
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r mount; do
    umount "$mount" 2>/dev/null || umount -l "$mount"
  done
}

# podman-hpc's stores under DIR (a migrated image's squashfuse and overlay mounts left by a killed run
# included), its venv and mksquashfs kept for the next call.
clean_podman_hpc() {
  local dir=${1:?clean-podman-hpc DIR}
  [[ -d $dir ]] || return 0
  dir=$(cd "$dir" && pwd)
  unmount_under "$dir"
  rm -rf "$dir/squash" "$dir/storage" "$dir/run" "$dir/config"
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
# No network unless a run asks for one: every command of ours says --network, but podman-hpc's migrate
# runs its mksquashfs container without (podman_hpc 1.2.2 migrate2scratch.py), which would make a bridge.
netns = "none"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  echo "CONTAINERS_CONF=$dir/containers.conf"
}

# NERSC's podman-hpc (PyPI, envs/podman-hpc.lock.txt) in its own venv under DIR, with what it needs beside
# it (podman_hpc 1.2.2's source): squashfuse and fuse-overlayfs for a migrated image's root, inotifywait for its
# fuse-overlayfs-wrap to unmount it, its OCI hook registered (configure_hooks), and a static mksquashfs 4.6 or
# later, which migrate runs inside the image (migrate2scratch.py: -xattrs-exclude, bound at /mksq). Debian 12
# has 4.5.1, so 4.6 is built from Debian trixie's source. Prints what a run needs: the tool on PATH (DIR/bin: its
# two commands and that mksquashfs, not its venv's python), USER (siteconfig.py reads it where getlogin fails), and its stores and modules, by its
# PODMANHPC_* variables and SQUASH_DIR (siteconfig.py). DIR/squash is the migrate store the nodes read.
# Its modules are the package's (DIR/etc, copied from etc/podman_hpc), with the site's MPICH as a site sets it: the
# mpich module (`--mpi`, the native MPI model) binds /usr/lib/shifter/mpich-2.2, NERSC's, at /opt/udiImage/modules/mpich
# (modules.d/mpich.yaml); with MPI_DIR (build/host-mpi/lib: scripts/host-mpi-tree.sh) it binds that directory instead.
# A source that is missing is skipped (hook_tool.py resolve_src_and_dest: iglob), as Cray's /dev/cxi* are here.
podman_hpc() {
  local dir=${1:?podman-hpc DIR} mpi_dir=${2:-}
  install_missing podman uidmap squashfuse fuse-overlayfs inotify-tools liblz4-dev zlib1g-dev gcc make python3-venv
  mkdir -p "$dir/bin" "$dir/squash" "$dir/storage" "$dir/run" "$dir/config"
  dir=$(cd "$dir" && pwd)
  if ((${#dir} + 4 > 50)); then  # podman: "the specified runroot is longer than 50 characters"
    echo "container-engines: podman-hpc $dir: its run root $dir/run is longer than podman's 50 characters;" \
      "choose a shorter DIR" >&2
    return 2
  fi
  local lock
  lock=$(cd "$(dirname "$0")/.." && pwd)/envs/podman-hpc.lock.txt
  if [[ ! -x $dir/venv/bin/podman-hpc ]]; then
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/pip" install -q --no-deps -r "$lock" >&2
  fi
  "$dir/venv/bin/python" -m podman_hpc.configure_hooks -f >/dev/null
  ln -sfn "$dir/venv/bin/podman-hpc" "$dir/bin/podman-hpc"
  ln -sfn "$dir/venv/bin/fuse-overlayfs-wrap" "$dir/bin/fuse-overlayfs-wrap"
  rm -rf "$dir/etc" && cp -r "$dir/venv/etc/podman_hpc" "$dir/etc"
  if [[ -n $mpi_dir ]]; then
    mpi_dir=$(cd "$mpi_dir" && pwd)
    # The image's MPI is opened by the MPICH ABI's name (MPI4PY_LIBMPI); podman-hpc reads a bind as SRC:DEST.
    [[ -e $mpi_dir/libmpi.so.12 ]] || { echo "container-engines: podman-hpc MPI_DIR $mpi_dir holds no libmpi.so.12" \
      "(the MPICH ABI's name); allowed: a directory that does (scripts/host-mpi-tree.sh makes one)" >&2; return 2; }
    [[ $mpi_dir != *[:\|\&]* ]] || { echo "container-engines: podman-hpc MPI_DIR $mpi_dir: a path without ':', '|'" \
      "or '&' is allowed (a module's bind is SRC:DEST)" >&2; return 2; }
    grep -q '^  - /usr/lib/shifter/mpich-2.2:/opt/udiImage/modules/mpich$' "$dir/etc/modules.d/mpich.yaml" \
      || { echo "container-engines: podman-hpc's mpich.yaml has no bind of /usr/lib/shifter/mpich-2.2" >&2; return 2; }
    sed -i "s|^  - /usr/lib/shifter/mpich-2.2:|  - $mpi_dir:|" "$dir/etc/modules.d/mpich.yaml"
  fi
  local mksquashfs=$dir/bin/mksquashfs.static
  if ! "$mksquashfs" -version 2>/dev/null | grep -Eq '^mksquashfs version (4\.([6-9]|[1-9][0-9])|[5-9])'; then
    build_static_mksquashfs "$dir/mksquashfs-build" "$mksquashfs"
  fi
  echo "PATH=$dir/bin:$PATH"
  echo "USER=$(id -un)"
  echo "SQUASH_DIR=$dir/squash"
  echo "PODMANHPC_GRAPH_ROOT=$dir/storage"
  echo "PODMANHPC_RUN_ROOT=$dir/run"
  echo "PODMANHPC_CONFIG_HOME=$dir/config"
  echo "PODMANHPC_MKSQUASHFS_BIN=$mksquashfs"
  echo "PODMANHPC_MODULES_DIR=$dir/etc/modules.d"
}

build_static_mksquashfs() {
  local work=${1:?} out=${2:?}
  rm -rf "$work" && mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/parts" "$work/cache"
  echo "deb-src http://deb.debian.org/debian trixie main" >"$work/sources.list"
  local apt=(apt-get -qq -o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/parts"
             -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "Dir::Cache::Archives=$work/archives")
  "${apt[@]}" update >&2
  (cd "$work" && "${apt[@]}" source --download-only squashfs-tools >&2)
  tar -xf "$work"/squashfs-tools_*.orig.tar.* -C "$work"
  make -s -C "$work"/squashfs-tools-*/squashfs-tools mksquashfs GZIP_SUPPORT=1 LZ4_SUPPORT=1 XZ_SUPPORT=0 \
    LZO_SUPPORT=0 ZSTD_SUPPORT=0 EXTRA_LDFLAGS=-static >&2
  install -m 0755 "$work"/squashfs-tools-*/squashfs-tools/mksquashfs "$out"
  rm -rf "$work"
}

case "${1:-}" in
  install) install_engines ;;
  start-dockerd) start_dockerd "${2:-}" ;;
  stop-dockerd) stop_dockerd "${2:-}" ;;
  podman-conf) podman_conf "${2:-}" ;;
  podman-hpc) podman_hpc "${2:-}" "${3:-}" ;;
  clean-podman-hpc) clean_podman_hpc "${2:-}" ;;
  *) usage ;;
esac
