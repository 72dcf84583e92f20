#!/usr/bin/env bash
# A real Slurm 22.05 cluster of two nodes (CB_NODES=4: four, up to 240) on one machine, for the tests.
#
#   tests/slurm/cluster.sh install          apt packages (idempotent)
#   tests/slurm/cluster.sh start DIR        network, munge, MariaDB, slurmdbd, slurmctld, N x slurmd
#                                           (CB_NODE_DOCKERD=D: and a dockerd on each node, answering at D as the
#                                           login node's does: scripts/container-engines.sh start-dockerd D;
#                                           CB_NODE_SYSFS=1: and a /sys of each node's own network namespace)
#   tests/slurm/cluster.sh stop DIR         everything it started, by PID; namespaces removed
#   tests/slurm/cluster.sh clear-stale      remove the namespaces a killed cluster left with no process in them
#                                           (start does it first); refuse if one has a process: a cluster running
#   tests/slurm/cluster.sh exec DIR CMD...  run a client command (sbatch, snakemake) on the controller host
#   tests/slurm/cluster.sh slow-node DIR NODE PERCENT   cap everything NODE's slurmd runs at PERCENT of a CPU
#   tests/slurm/cluster.sh slow-link DIR NODE NODE RATE [IFACE]   cap what the two send each other on
#                                           fast0, or IFACE (fast1: the second rail), with htb
#   tests/slurm/cluster.sh heal DIR         undo slow-node and slow-link
#   tests/slurm/cluster.sh restart-controller DIR   stop slurmctld (SIGTERM, by PID) and start it again on its
#                                           saved state, as an admin's restart does; running jobs go on
#
# Each host is a network namespace of its own (cbctl, cbn1, cbn2, ...) with its own
# hostname (UTS namespace), so records see distinct hosts and distinct
# interfaces. Three networks connect the nodes, as on a cluster with two fabrics, the first of two rails:
#   fast0 (10.77.1.0/24)  stands for InfiniBand's first rail: unshaped
#   fast1 (10.77.3.0/24)  stands for its second rail: unshaped (tests/slurm/fleet.yaml's rails)
#   slow0 (10.77.2.0/24)  stands for Ethernet: rate-limited with tc; also carries Slurm's own traffic
# All traffic stays inside these namespaces. slurm.conf goes to /etc/slurm
# (the job-step plugin drops SLURM_CONF inside jobs); what was there is restored on stop.
set -euo pipefail

SLOW_RATE=${CB_SLOW_RATE:-1gbit}
CLUSTER=cbtest
# The node count is the one the cluster in DIR was started with (stop, exec and the rest read it).
nodes_of() { local count=${CB_NODES:-2}; [ -s "${1:-/nonexistent}/nodes" ] && count=$(cat "$1/nodes"); seq -f 'n%g' "$count"; }
NODES=()
NS_CTL=cbctl
# Every slurmd sees its own spool at this one path, and its own /dev/shm, as a real node
# would (a mount namespace each): Slurm's PMIx plugin builds its socket paths from
# SlurmdSpoolDir without expanding %n, and ch-run --join keeps its state in /dev/shm.
SPOOL=/var/spool/containerbench-slurmd
# And its own podman store, as each node of a site has (containers-storage.conf(5): root's graphroot
# and runroot, and podman's tmpdir): an image loaded where the workflow plans is not on the nodes.
# The clone's filesystem stays shared, as /home is at a site.
NODE_LOCAL=(/var/lib/containers /run/containers /run/libpod)
# And, with CB_NODE_DOCKERD, a dockerd of its own, as each node of a site has: the login node's dockerd directory
# (its socket, which DOCKER_HOST names and jobs inherit, its data and exec roots) is the node's own at the same path.
NODE_DOCKERD=${CB_NODE_DOCKERD:-}
ENGINES=$(cd "$(dirname "$0")/../.." && pwd)/scripts/container-engines.sh
# With CB_NODE_SYSFS=1, a sysfs mounted in each node's namespaces, its cgroup mounts moved onto it: /sys/class/net
# then lists the node's own interfaces, as a node's does; UCX (MPICH's) finds its devices only there, and a
# container's /sys is the node's ("network device 'fast0' is not available" without it). The suite's tests keep
# the host's /sys, which their pre-flight and fleet checks were measured with.
NODE_SYSFS=${CB_NODE_SYSFS:-}

die() { echo "cluster.sh: $*" >&2; exit 1; }
in_ns() { local ns=$1; shift; nsenter --net=/run/netns/"$ns" "$@"; }

install_packages() {
  local missing=()
  for pair in slurmctld:slurm-wlm slurmd:slurmd slurmdbd:slurmdbd munged:munge mariadbd:mariadb-server \
              mpirun:openmpi-bin ip:iproute2 tc:iproute2; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; run as root to install them"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${missing[@]}" >/dev/null
}

make_network() {
  for ns in "$NS_CTL" "${NODES[@]/#/cb}"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
  done
  # Each node's interfaces, with the bridge and subnet of each: fast0 and fast1 are two rails of the unshaped
  # network (a fleet's link jobs measure each alone: tests/slurm/fleet.yaml), slow0 the shaped one.
  local nets="fast0:brfast:1 fast1:brfast1:3 slow0:brslow:2" net iface bridge subnet
  for net in $nets; do
    IFS=: read -r iface bridge subnet <<< "$net"
    ip -n "$NS_CTL" link add "$bridge" type bridge
    ip -n "$NS_CTL" addr add "10.77.$subnet.1/24" dev "$bridge"
    ip -n "$NS_CTL" link set "$bridge" up
  done
  local i=0
  for node in "${NODES[@]}"; do
    i=$((i + 1))
    for net in $nets; do
      IFS=: read -r iface bridge subnet <<< "$net"
      ip link add "$iface" netns "cb$node" type veth peer name "${iface%0}$node" netns "$NS_CTL"
      ip -n "$NS_CTL" link set "${iface%0}$node" master "$bridge" up
      ip -n "cb$node" addr add "10.77.$subnet.$((10 + i))/24" dev "$iface"
      ip -n "cb$node" link set "$iface" up
    done
    # Both directions of the slow network are shaped: the node side and the bridge port.
    ip netns exec "cb$node" tc qdisc add dev slow0 root tbf rate "$SLOW_RATE" burst 64kb latency 20ms
    ip netns exec "$NS_CTL" tc qdisc add dev "slow$node" root tbf rate "$SLOW_RATE" burst 64kb latency 20ms
  done
}

write_configs() {
  local dir=$1 cpus memory
  cpus=$(nproc)
  memory=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) / 4 ))
  mkdir -p /etc/slurm "$dir"/{state,log,spool,tmp}
  for file in slurm.conf slurmdbd.conf gres.conf; do
    [ -e "/etc/slurm/$file" ] && [ ! -e "$dir/saved-$file" ] && cp -p "/etc/slurm/$file" "$dir/saved-$file"
  done
  cat > /etc/slurm/slurm.conf <<EOF
# written by containerbench tests/slurm/cluster.sh for $dir
ClusterName=$CLUSTER
SlurmctldHost=ctl(10.77.2.1)
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
StateSaveLocation=$dir/state
SlurmdSpoolDir=$SPOOL
TmpFS=$dir/tmp/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# GPUs as a GPU site declares them, with socket affinity (gres.conf Cores=), so that sinfo's %G
# reads gpu:h100:4(S:0-1) as at such a site; no job here asks for one (ttys stand in for the devices).
# Two sockets of one core each: config_overrides keeps slurmd to this, not to the VM's one socket.
GresTypes=gpu
SlurmdParameters=config_overrides
$(i=0; for node in "${NODES[@]}"; do i=$((i + 1))
  echo "NodeName=$node NodeHostname=$node NodeAddr=10.77.2.$((10 + i)) CPUs=$cpus Sockets=$cpus CoresPerSocket=1" \
       "ThreadsPerCore=1 RealMemory=$memory Gres=gpu:h100:$((2 * cpus)) State=UNKNOWN"; done)
PartitionName=cpu Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=120 State=UP OverSubscribe=NO
EOF
  cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=ctl
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=containerbench
StorageLoc=slurm_acct_db
PidFile=$dir/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
  # Two GPUs per socket, each pair bound to its socket's core. Slurm counts a GPU by its device file and
  # its own tests stand ttys in for them (SchedMD/slurm testsuite/expect/test7.17_configs/*/gres.conf);
  # a count without a File is reported as 0 and the node set INVAL.
  for ((core = 0; core < cpus; core++)); do
    echo "Name=gpu Type=h100 File=/dev/tty[$((2 * core))-$((2 * core + 1))] Cores=$core"
  done > /etc/slurm/gres.conf
  for node in "${NODES[@]}"; do mkdir -p "$dir/spool/$node" "$dir/tmp/$node"; done
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local seconds=$1 what=$2; shift 2
  for _ in $(seq $((seconds * 4))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  die "$what did not come up within ${seconds}s"
}

start_database() {
  local dir=$1
  # As root: the state directory may sit where the mysql user cannot reach (pytest's are 0700).
  mkdir -p "$dir/mysql" "$dir/mysql-run"
  mariadb-install-db --user=root --datadir="$dir/mysql" --auth-root-authentication-method=normal >/dev/null
  in_ns "$NS_CTL" setsid mariadbd --user=root --datadir="$dir/mysql" --socket="$dir/mysql-run/mysql.sock" \
    --pid-file="$dir/mysql-run/mysqld.pid" --bind-address=127.0.0.1 --port=3306 --skip-name-resolve \
    --log-error="$dir/log/mariadb.log" </dev/null >/dev/null 2>&1 &
  wait_for 60 MariaDB mariadb --socket="$dir/mysql-run/mysql.sock" -e "select 1"
  mariadb --socket="$dir/mysql-run/mysql.sock" <<'EOF'
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'containerbench';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
}

# The namespaces of a cluster whose run was killed before its stop (a session ended, a test timed out) outlive it:
# with no process left in them they are removed, since `ip netns add` of a node's name would fail on them; one with
# a process in it is a cluster still running, and is refused, never stopped, since it is not this one to stop.
STARTING=/run/containerbench-cluster-starting  # the PID of a start under way: its namespaces are empty a while
clear_stale_namespaces() {
  local ns live=() stale=() starter
  starter=$(cat "$STARTING" 2>/dev/null || true)
  if [ -n "$starter" ] && kill -0 "$starter" 2>/dev/null; then
    die "a test cluster is starting (cluster.sh start, pid $starter); stop it first"
  fi
  for ns in $(ip netns list | awk '$1 ~ /^cb(ctl|n[0-9]+)$/ {print $1}'); do
    if [ -n "$(ip netns pids "$ns" 2>/dev/null)" ]; then live+=("$ns"); else stale+=("$ns"); fi
  done
  [ "${#live[@]}" -eq 0 ] || die "a test cluster is already running (namespaces ${live[*]} have processes); stop it first"
  for ns in "${stale[@]}"; do
    ip netns del "$ns"
    echo "cluster.sh: removed namespace $ns, left with no process in it by a cluster that was not stopped" >&2
  done
}

start() {
  local dir=$1
  clear_stale_namespaces
  echo $$ > "$STARTING"
  trap 'rm -f "$STARTING"' EXIT
  if [ -n "$NODE_DOCKERD" ]; then  # before anything starts, so a refusal leaves nothing to stop
    case $NODE_DOCKERD in /*) ;; *) die "CB_NODE_DOCKERD=$NODE_DOCKERD: not an absolute path" ;; esac
    [ -S "$NODE_DOCKERD/docker.sock" ] || die "CB_NODE_DOCKERD=$NODE_DOCKERD: no docker.sock there (start-dockerd first)"
  fi
  mkdir -p "$dir"
  [ "${#NODES[@]}" -le 240 ] || die "CB_NODES=${#NODES[@]}: at most 240 (node i at 10.77.x.(10 + i))"
  echo "${#NODES[@]}" > "$dir/nodes"
  install_packages
  make_network
  write_configs "$dir"
  if ! pgrep -x munged >/dev/null; then
    install -d -o munge -g munge /run/munge
    runuser -u munge -- /usr/sbin/munged
    cp /run/munge/munged.pid "$dir/munged.pid"  # ours to stop
  fi
  start_database "$dir"
  in_ns "$NS_CTL" unshare --uts sh -c 'hostname ctl && exec slurmdbd'
  wait_for 60 slurmdbd in_ns "$NS_CTL" sacctmgr -n list cluster
  in_ns "$NS_CTL" sacctmgr -i add cluster "$CLUSTER" >/dev/null
  # An account, as sites have, for the executor plugin's slurm_account.
  in_ns "$NS_CTL" sacctmgr -i add account cbtest-account Cluster="$CLUSTER" >/dev/null
  in_ns "$NS_CTL" sacctmgr -i add user root Account=cbtest-account Cluster="$CLUSTER" >/dev/null
  in_ns "$NS_CTL" unshare --uts sh -c 'hostname ctl && exec slurmctld -i'
  mkdir -p "$SPOOL" "${NODE_LOCAL[@]}"
  local paths=("${NODE_LOCAL[@]}")
  [ -n "$NODE_DOCKERD" ] && paths+=("$NODE_DOCKERD")
  for node in "${NODES[@]}"; do
    local own="" path docker="" sysfs=""
    if [ -n "$NODE_SYSFS" ]; then
      mkdir -p "$dir/node-local/cgroup-$node"
      sysfs="mount --rbind /sys/fs/cgroup '$dir/node-local/cgroup-$node' && mount -t sysfs sysfs /sys \
             && mount --move '$dir/node-local/cgroup-$node' /sys/fs/cgroup && "
    fi
    for path in "${paths[@]}"; do
      mkdir -p "$dir/node-local/$node$path"
      own+="mount --bind '$dir/node-local/$node$path' '$path' && "
    done
    if [ -n "$NODE_DOCKERD" ]; then
      # Started by the node's shell before slurmd, in the node's namespaces, as the login node's was (start-dockerd:
      # its flags, its client on PATH, waiting until it answers); its pid copied where stop finds it.
      docker="'$ENGINES' start-dockerd '$NODE_DOCKERD' >'$dir/log/dockerd-$node.log' 2>&1 \
              && cp '$NODE_DOCKERD/docker.pid' '$dir/dockerd-$node.pid' && "
    fi
    nsenter --net=/run/netns/"cb$node" unshare --uts --mount --propagation private \
      sh -c "mount --bind '$dir/spool/$node' '$SPOOL' && mount -t tmpfs -o mode=1777 shm /dev/shm \
             && $own $sysfs hostname $node && $docker exec slurmd -N $node" \
      || die "node $node did not start${docker:+ (the output of its dockerd: $dir/log/dockerd-$node.log)}"
  done
  wait_for 60 "${#NODES[@]} idle nodes" sh -c "nsenter --net=/run/netns/$NS_CTL sinfo -h -t idle -o %D | grep -qx ${#NODES[@]}"
  echo "cluster.sh: $CLUSTER up: nodes ${NODES[*]}, fast0 10.77.1.0/24, fast1 10.77.3.0/24, slow0 10.77.2.0/24 ($SLOW_RATE)" >&2
}

stop_pidfile() {
  local file=$1
  [ -s "$file" ] || return 0
  local pid; pid=$(cat "$file")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

# A CPU quota on a node's slurmd: the jobs it starts inherit its cgroup (no cgroup plugin here).
slow_node() {
  local dir=$1 node=$2 percent=$3 group pid home
  pid=$(cat "$dir/slurmd-$node.pid") || die "no slurmd of $node in $dir"
  if [ -e /sys/fs/cgroup/cgroup.controllers ]; then  # cgroup v2
    group=/sys/fs/cgroup/cbtest-$node
    home=/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$pid/cgroup")
    echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    mkdir -p "$group" && echo "$((percent * 1000)) 100000" > "$group/cpu.max"
  else
    group=/sys/fs/cgroup/cpu/cbtest-$node
    home=/sys/fs/cgroup/cpu$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' "/proc/$pid/cgroup")
    mkdir -p "$group" && echo 100000 > "$group/cpu.cfs_period_us" && echo $((percent * 1000)) > "$group/cpu.cfs_quota_us"
  fi
  echo "$pid" > "$group/cgroup.procs"
  # Where slurmd came from, for heal to put it (and what it started since) back.
  echo "$group $home" >> "$dir/slowed-groups"
}

# A rate limit on one rail of the fast network (a bad cable or port of the "InfiniBand"), on both nodes,
# only for what they send each other on it (htb: unclassified traffic goes out directly, unshaped; this
# machine's kernel has no netem). fast0 and fast1 have no qdisc of their own to keep (slow0 has the tbf).
slow_link() {
  local dir=$1 a=$2 b=$3 rate=$4 iface=${5:-fast0} from to subnet
  case "$iface" in fast0) subnet=1 ;; fast1) subnet=3 ;; *) die "slow-link: IFACE $iface: allowed fast0, fast1" ;; esac
  for from in "$a" "$b"; do
    to=$([ "$from" = "$a" ] && echo "$b" || echo "$a")
    in_ns "cb$from" tc qdisc replace dev "$iface" root handle 1: htb default 0
    in_ns "cb$from" tc class replace dev "$iface" parent 1: classid 1:20 htb rate "$rate" ceil "$rate"
    in_ns "cb$from" tc filter add dev "$iface" protocol ip parent 1: prio 1 u32 \
      match ip dst "10.77.$subnet.$((10 + ${to#n}))/32" flowid 1:20
    echo "$from $iface" >> "$dir/slowed-links"
  done
}

heal() {
  local dir=$1 group node
  if [ -s "$dir/slowed-groups" ]; then
    while read -r group home; do
      # Back to the group each came from, then the group goes.
      for pid in $(cat "$group/cgroup.procs" 2>/dev/null); do
        echo "$pid" > "${home:-$(dirname "$group")}/cgroup.procs" 2>/dev/null || true
      done
      rmdir "$group" 2>/dev/null || true
    done < "$dir/slowed-groups"
    rm -f "$dir/slowed-groups"
  fi
  if [ -s "$dir/slowed-links" ]; then
    sort -u "$dir/slowed-links" | while read -r node iface; do
      in_ns "cb$node" tc qdisc del dev "${iface:-fast0}" root 2>/dev/null || true
    done
    rm -f "$dir/slowed-links"
  fi
}

restart_controller() {
  local dir=$1
  stop_pidfile "$dir/slurmctld.pid"
  in_ns "$NS_CTL" unshare --uts sh -c 'hostname ctl && exec slurmctld'
  wait_for 60 slurmctld in_ns "$NS_CTL" scontrol ping
}

stop() {
  local dir=$1
  # The daemons first: a slowed group is removed only once nothing is left in it.
  for node in "${NODES[@]}"; do stop_pidfile "$dir/slurmd-$node.pid"; stop_pidfile "$dir/dockerd-$node.pid"; done
  stop_pidfile "$dir/slurmctld.pid"
  stop_pidfile "$dir/slurmdbd.pid"
  stop_pidfile "$dir/mysql-run/mysqld.pid"
  stop_pidfile "$dir/munged.pid"
  for ns in "$NS_CTL" "${NODES[@]/#/cb}"; do
    # A rank that outlived its job must not keep a namespace alive.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  heal "$dir"
  for file in slurm.conf slurmdbd.conf gres.conf; do
    if [ -e "$dir/saved-$file" ]; then mv "$dir/saved-$file" "/etc/slurm/$file"; else rm -f "/etc/slurm/$file"; fi
  done
  rm -f "$dir/nodes"
  # The nodes' image stores (gigabytes each): their mounts went with the nodes' namespaces.
  rm -rf "$dir/node-local"
}

[ -n "${2:-}" ] && mapfile -t NODES < <(nodes_of "$2")

case "${1:-}" in
  install) install_packages ;;
  slow-node) slow_node "$2" "${3:?usage: cluster.sh slow-node DIR NODE PERCENT}" "${4:?PERCENT}" ;;
  slow-link) slow_link "$2" "${3:?usage: cluster.sh slow-link DIR NODE NODE RATE [IFACE]}" "${4:?NODE}" "${5:?RATE}" \
                       "${6:-fast0}" ;;
  heal) heal "${2:?usage: cluster.sh heal DIR}" ;;
  restart-controller) restart_controller "${2:?usage: cluster.sh restart-controller DIR}" ;;
  start) start "${2:?usage: cluster.sh start DIR}" ;;
  stop) stop "${2:?usage: cluster.sh stop DIR}" ;;
  clear-stale) clear_stale_namespaces ;;
  exec) shift 2; exec nsenter --net=/run/netns/$NS_CTL "$@" ;;
  *) die "usage: cluster.sh install | start DIR | stop DIR | clear-stale | exec DIR CMD..." ;;
esac
