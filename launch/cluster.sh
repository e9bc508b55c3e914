#!/usr/bin/env bash
# Run a command as N MPI ranks on an emulated cluster with a slow network.
#
#   launch/cluster.sh [--rate 1gbit|none] [-np N] [--links per-rank|shared] [--launcher mpirun|horovodrun|none] [--pin cores|none] [--burst 256kb] [--latency 5ms] [--mtu BYTES] -- COMMAND...
#   e.g. launch/cluster.sh --rate 1gbit -np 4 -- python -m hvdsketch.lab.cli bench collectives
#
# --links per-rank (the default): hosts on a switch. Every rank is a host r<i> with its own
# network namespace (hvdsketch-PID-r<i>) whose only interface besides the loopback is eth0,
# 10.77.0.<i+1>/24, one end of a veth pair whose other end is a port of a bridge in a namespace
# of its own (hvdsketch-PID-sw). Both directions of every such link are shaped by a
# token-bucket filter (tc qdisc tbf on the egress of each end; netem does not work here), so
# each rank uploads at RATE and downloads at RATE whatever the others do, and a ring allreduce
# of S bytes takes about 2 (N-1)/N S / RATE. The launcher runs on a host "head" (10.77.0.254,
# in the bridge's namespace, on an unshaped port) and reaches the ranks through
# launch/cluster-bin/ssh, an "ssh" that runs its command in the named host's namespace (with
# that hostname): it is first on PATH and is Open MPI's rsh agent, so mpirun starts one orted
# per host, horovodrun (MPI or --gloo) works as on a real cluster, and the ranks see
# MASTER_ADDR=10.77.0.1 (rank 0) and GLOO_SOCKET_IFNAME=eth0 for PyTorch's gloo. Every host
# is a node of its own (local rank 0, local size 1), so OMP_NUM_THREADS (unless set) gives each
# rank its share of this machine's cores, as ranks sharing one node took before.
# --pin cores (the default): every process on host r<i> (its orted, its rank and all their
# threads) runs on core i mod the machine's cores, as a host's processes run on its own CPUs.
# Unpinned, the ranks' threads (each rank's Horovod background thread polls) migrate between the
# cores, and a whole run fell into a slow mode or not: Fashion-MNIST at 4 ranks and 1 Gbit/s,
# Horovod dense, median step 75-100 ms in 5 runs unpinned against 49-55 ms in 5 runs pinned,
# interleaved (results/bench-train/pinning.md). --pin none leaves placement to the kernel.
# HVDSKETCH_CLUSTER_HOSTS holds "r0:1,r1:1,...". /etc/netns/hvdsketch-PID-*/hosts names the
# hosts inside the namespaces (ip netns exec mounts it over /etc/hosts).
#
# What the links carry (tests/cluster_probe.py; tests/unit/test_cluster.py checks it at
# 200mbit): tbf counts whole Ethernet frames, so TCP moves RATE x 1448/1514 (0.956) at MTU
# 1500, on one link alone and on all at once; Open MPI's ring allreduce (--mca
# coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4) takes its model time
# at 2 and 4 ranks, so 4 ranks take 1.5x the time of 2 (3x on one shared link). Three effects
# are the MPI library's on such links, not the links' (5 MB, 200mbit):
# - at 2 ranks both ring neighbours are one peer, and over one TCP connection per peer the
#   rendezvous handshakes wait behind the bulk data: back-to-back exchanges run at about 2/3
#   of RATE (ring allreduce 1.45x its model); --mca btl_tcp_links 2 avoids it;
# - behind a deep queue (--latency 50ms) a rank's handshakes wait for its own queued upload to
#   another peer: 4 ranks take 1.1-1.25x the model, and MPI sends from every rank at once reach
#   80-90% of RATE; the per-rank default, 5 ms (a switch port's buffer), gives 1.0x and the full rate;
# - Open MPI's default allreduce algorithm at 4 ranks takes 1.7-2x the ring's model.
#
# --links shared: all ranks in one namespace (hvdsketch-PID) whose only interface is a
# loopback shaped by tbf. All ranks share that one link: N ranks moving data at once share RATE.
#
# --launcher mpirun (the default): COMMAND runs as the N ranks of an Open MPI job over TCP (no
# shared memory), so every byte between ranks crosses a shaped link. --launcher horovodrun:
# COMMAND is the rest of a horovodrun command line (options such as --gloo, then the program),
# started as horovodrun -np N -H HOSTS --network-interface eth0; per-rank links only.
# --launcher none: COMMAND runs once, on head (per-rank) or in the namespace (shared), to
# launch whatever it likes on HVDSKETCH_CLUSTER_HOSTS.
#
# Every namespace, link and /etc/netns entry is removed on exit, on failure and on INT/TERM,
# with any process left in them; the exit status is the command's. Needs root (ip netns, tc,
# unshare). Plain mpirun on localhost stays the default everywhere else.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  sed -n '4,5p' "$0" | sed 's/^#  *//' >&2
  exit 2
}

RATE=1gbit NP=2 BURST=256kb LATENCY= MTU= LINKS=per-rank LAUNCHER=mpirun PIN=cores
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
    -np | --np) NP=${2:?-np needs a value}; shift 2 ;;
    --burst) BURST=${2:?--burst needs a value}; shift 2 ;;
    --latency) LATENCY=${2:?--latency needs a value}; shift 2 ;;
    --mtu) MTU=${2:?--mtu needs a value}; shift 2 ;;
    --links) LINKS=${2:?--links needs a value}; shift 2 ;;
    --launcher) LAUNCHER=${2:?--launcher needs a value}; shift 2 ;;
    --pin) PIN=${2:?--pin needs a value}; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "cluster.sh: unknown option $1" >&2; usage ;;
  esac
done
[ $# -gt 0 ] || { echo "cluster.sh: no command given after --" >&2; usage; }
[[ $NP =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: -np must be a positive integer, got '$NP'" >&2; exit 2; }
# The queue a link may hold: a switch port's few milliseconds on per-rank links; the shared loopback's
# 64 KB frames need a deeper one.
[ -n "$LATENCY" ] || { [ "$LINKS" = shared ] && LATENCY=50ms || LATENCY=5ms; }
case $LINKS in
  per-rank) [ "$NP" -le 253 ] || { echo "cluster.sh: --links per-rank takes at most 253 ranks, got $NP" >&2; exit 2; } ;;
  shared) ;;
  *) echo "cluster.sh: --links must be per-rank or shared, got '$LINKS'" >&2; exit 2 ;;
esac
case $LAUNCHER in
  mpirun | none) ;;
  horovodrun) [ "$LINKS" = per-rank ] || { echo "cluster.sh: --launcher horovodrun needs --links per-rank" >&2; exit 2; } ;;
  *) echo "cluster.sh: --launcher must be mpirun, horovodrun or none, got '$LAUNCHER'" >&2; exit 2 ;;
esac
case $PIN in
  cores | none) export HVDSKETCH_CLUSTER_PIN=$PIN ;;
  *) echo "cluster.sh: --pin must be cores or none, got '$PIN'" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "cluster.sh: needs root for ip netns and tc" >&2; exit 2; }

# A process that already initialised MPI (e.g. a pytest run that imported mpi4py) exports its
# job's launch variables; mpirun would take them as its own job's and fail.
while read -r name; do unset "$name"; done < <(env | grep -oE \
  '^(PMIX_[A-Z0-9_]*|ORTE_[A-Z0-9_]*|OMPI_APP_CTX_[A-Z_]*|OMPI_COMM_WORLD_[A-Z_]*|OMPI_MCA_(ess|orte_|pmix)[a-z_]*)=' | tr -d =)
# shellcheck disable=SC1091
source launch/env.sh
NS="hvdsketch-$$"
NAMESPACES=()  # every namespace made so far, for cleanup
MADE_ETC_NETNS=
CHILD=
cleanup() {
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD" 2>/dev/null
  local ns left
  for ns in "${NAMESPACES[@]}"; do  # ranks and daemons the launcher did not wait for
    left=$(ip netns pids "$ns" 2>/dev/null)
    [ -z "$left" ] || kill -KILL $left 2>/dev/null
  done
  for ns in "${NAMESPACES[@]}"; do
    ip netns del "$ns" 2>/dev/null  # takes its ends of the veth pairs, and so the pairs, along
    rm -rf "/etc/netns/$ns"
  done
  [ -z "$MADE_ETC_NETNS" ] || rmdir /etc/netns 2>/dev/null  # unless another run still uses it
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

new_ns() {
  NAMESPACES+=("$1")
  ip netns add "$1" && ip -n "$1" link set lo up
}

# shape NS DEV: the token-bucket filter on DEV's egress in NS.
shape() {
  [ "$RATE" != none ] || return 0
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst "$BURST" latency "$LATENCY" || {
    echo "cluster.sh: tc rejected rate '$RATE' burst '$BURST' latency '$LATENCY' (e.g. --rate 1gbit, 100mbit)" >&2
    exit 2
  }
}

# mtu NS DEV...: the --mtu, if given, on each DEV in NS.
mtu() {
  local ns=$1 dev
  shift
  [ -z "$MTU" ] && return 0
  for dev; do ip -n "$ns" link set "$dev" mtu "$MTU" || exit 1; done
}

export HVDSKETCH_CLUSTER_RATE=$RATE HVDSKETCH_CLUSTER_LINKS=$LINKS  # benchmarks record the network they ran on
# mpi_yield_when_idle: the shaped packets leave the queue in a kernel softirq thread that
# needs a CPU; ranks spinning on every core would delay each small message by ticks of 4 ms.
TCP=(--mca pml ob1 --mca btl self,tcp --mca mpi_yield_when_idle 1)

if [ "$LINKS" = shared ]; then
  new_ns "$NS" || exit 1
  mtu "$NS" lo
  shape "$NS" lo
  echo "cluster.sh: $NP ranks in netns $NS, loopback $(ip netns exec "$NS" tc qdisc show dev lo | head -1)," \
    "mtu $(ip -n "$NS" -o link show lo | grep -o 'mtu [0-9]*' | cut -d' ' -f2), Open MPI over TCP" >&2
  export HVDSKETCH_CLUSTER_HOSTS="localhost:$NP"
  RUN=(ip netns exec "$NS")
  MPI=("${MPIRUN[@]}" -x HVDSKETCH_CLUSTER_RATE -x HVDSKETCH_CLUSTER_LINKS -np "$NP" "${TCP[@]}"
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
else
  SW="$NS-sw" NET=10.77.0
  [ -d /etc/netns ] || MADE_ETC_NETNS=1
  HOSTS="127.0.0.1 localhost"$'\n'"$NET.254 head"
  for ((i = 0; i < NP; i++)); do HOSTS+=$'\n'"$NET.$((i + 1)) r$i"; done
  new_ns "$SW" || exit 1
  mkdir -p "/etc/netns/$SW" && echo "$HOSTS" > "/etc/netns/$SW/hosts" || exit 1
  # The switch: a bridge, and the head's own port (eth0, unshaped), both in $SW.
  ip -n "$SW" link add br0 type bridge || exit 1
  ip -n "$SW" link add eth0 type veth peer name head || exit 1
  ip -n "$SW" link set head master br0 || exit 1
  mtu "$SW" br0 head eth0
  ip -n "$SW" addr add "$NET.254/24" dev eth0 || exit 1
  for dev in br0 head eth0; do ip -n "$SW" link set "$dev" up || exit 1; done
  for ((i = 0; i < NP; i++)); do
    R="$NS-r$i"
    new_ns "$R" || exit 1
    mkdir -p "/etc/netns/$R" && echo "$HOSTS" > "/etc/netns/$R/hosts" || exit 1
    # r<i> is the switch's port to rank i, eth0 the rank's own interface.
    ip -n "$SW" link add "r$i" type veth peer name eth0 netns "$R" || exit 1
    ip -n "$SW" link set "r$i" master br0 || exit 1
    mtu "$SW" "r$i"
    mtu "$R" eth0
    ip -n "$R" addr add "$NET.$((i + 1))/24" dev eth0 || exit 1
    ip -n "$SW" link set "r$i" up && ip -n "$R" link set eth0 up || exit 1
    shape "$R" eth0  # the rank's upload
    shape "$SW" "r$i"  # its download
  done
  echo "cluster.sh: $NP ranks, each in its own netns ($NS-r0 .. $NS-r$((NP - 1)))" \
    "with its own link to a bridge in $SW, upload and download each" \
    "$(ip netns exec "$NS-r0" tc qdisc show dev eth0 | grep -o 'rate.*' || echo unshaped)," \
    "mtu $(ip -n "$NS-r0" -o link show eth0 | grep -o 'mtu [0-9]*' | cut -d' ' -f2), Open MPI over TCP" >&2
  HOSTS_SLOTS=$(for ((i = 0; i < NP; i++)); do printf 'r%d:1,' "$i"; done)
  export HVDSKETCH_CLUSTER_HOSTS=${HOSTS_SLOTS%,} HVDSKETCH_CLUSTER_NS=$NS
  export PATH="$PWD/launch/cluster-bin:$PATH" OMPI_MCA_plm_rsh_agent="$PWD/launch/cluster-bin/ssh"
  export OMPI_MCA_plm_rsh_no_tree_spawn=1 OMPI_MCA_oob_tcp_if_include=$NET.0/24
  export MASTER_ADDR=$NET.1 GLOO_SOCKET_IFNAME=eth0
  # Each host is its own node (local size 1), so the ranks would each take every core of this
  # one machine; they share its cores as ranks on one node do (cores / N threads each).
  CORES=$(nproc)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((CORES > NP ? CORES / NP : 1))}
  # The launcher on head, with that hostname.
  # shellcheck disable=SC2016
  RUN=(ip netns exec "$SW" unshare --uts bash -c 'hostname head && exec "$@"' head)
  MPI=("${MPIRUN[@]}" -x HVDSKETCH_CLUSTER_RATE -x HVDSKETCH_CLUSTER_LINKS -x MASTER_ADDR -x GLOO_SOCKET_IFNAME
    -x OMP_NUM_THREADS -np "$NP" --host "$HVDSKETCH_CLUSTER_HOSTS" "${TCP[@]}" --mca btl_tcp_if_include "$NET.0/24")
fi

# glibc's allocator tunables (README, "Host memory"), where the caller set them, reach every rank.
while read -r name; do MPI+=(-x "$name"); done < <(env | grep -oE '^MALLOC_[A-Z_]+=' | tr -d =)

case $LAUNCHER in
  mpirun) COMMAND=("${MPI[@]}" "$@") ;;
  horovodrun) COMMAND=(horovodrun -np "$NP" -H "$HVDSKETCH_CLUSTER_HOSTS" --network-interface eth0 "$@") ;;
  none) COMMAND=("$@") ;;
esac
# In its own session, so a signal reaches the launcher once, from cleanup: a second one makes
# mpirun exit at once and leave its ranks running.
setsid "${RUN[@]}" "${COMMAND[@]}" &
CHILD=$!
wait "$CHILD"
RC=$?
CHILD=
exit "$RC"
