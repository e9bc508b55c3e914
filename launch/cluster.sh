#!/usr/bin/env bash
# Run a command as N MPI ranks on an emulated cluster with a slow network.
#
#   launch/cluster.sh [--rate 1gbit|none] [-np N] [--burst 256kb] [--latency 50ms] [--mtu BYTES] -- COMMAND...
#   e.g. launch/cluster.sh --rate 1gbit -np 4 -- python -m hvdsketch.lab.cli bench collectives
#
# The ranks run in a fresh network namespace whose only interface is a
# loopback shaped by a token-bucket filter (tc qdisc tbf; netem does not work
# here), and Open MPI is forced onto TCP over that loopback (no shared memory),
# so every byte between ranks crosses the shaped link. All ranks share that one
# link, like hosts on one switch port: N ranks moving data at once share RATE.
# The namespace is removed on exit, on failure and on INT/TERM; the exit status
# is the command's. Needs root (ip netns, tc). Plain mpirun on localhost stays
# the default everywhere else.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  sed -n '4,5p' "$0" | sed 's/^#  *//' >&2
  exit 2
}

RATE=1gbit NP=2 BURST=256kb LATENCY=50ms MTU=
while [ $# -gt 0 ]; do
  case $1 in
    --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
    -np | --np) NP=${2:?-np needs a value}; shift 2 ;;
    --burst) BURST=${2:?--burst needs a value}; shift 2 ;;
    --latency) LATENCY=${2:?--latency needs a value}; shift 2 ;;
    --mtu) MTU=${2:?--mtu needs a value}; shift 2 ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) echo "cluster.sh: unknown option $1" >&2; usage ;;
  esac
done
[ $# -gt 0 ] || { echo "cluster.sh: no command given after --" >&2; usage; }
[[ $NP =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: -np must be a positive integer, got '$NP'" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "cluster.sh: needs root for ip netns and tc" >&2; exit 2; }

# A process that already initialised MPI (e.g. a pytest run that imported mpi4py) exports its
# job's launch variables; mpirun would take them as its own job's and fail.
while read -r name; do unset "$name"; done < <(env | grep -oE \
  '^(PMIX_[A-Z0-9_]*|ORTE_[A-Z0-9_]*|OMPI_APP_CTX_[A-Z_]*|OMPI_COMM_WORLD_[A-Z_]*|OMPI_MCA_(ess|orte_|pmix)[a-z_]*)=' | tr -d =)
# shellcheck disable=SC1091
source launch/env.sh
NS="hvdsketch-$$"
CHILD=
cleanup() {
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD" 2>/dev/null
  local left
  left=$(ip netns pids "$NS" 2>/dev/null)  # ranks mpirun did not wait for
  [ -z "$left" ] || kill -KILL $left 2>/dev/null
  ip netns del "$NS" 2>/dev/null
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$NS" || exit 1
ip -n "$NS" link set lo up || exit 1
[ -z "$MTU" ] || ip -n "$NS" link set lo mtu "$MTU" || exit 1
if [ "$RATE" != none ]; then
  ip netns exec "$NS" tc qdisc add dev lo root tbf rate "$RATE" burst "$BURST" latency "$LATENCY" || {
    echo "cluster.sh: tc rejected rate '$RATE' burst '$BURST' latency '$LATENCY' (e.g. --rate 1gbit, 100mbit)" >&2
    exit 2
  }
fi
echo "cluster.sh: $NP ranks in netns $NS, loopback $(ip netns exec "$NS" tc qdisc show dev lo | head -1)," \
  "mtu $(ip -n "$NS" -o link show lo | grep -o 'mtu [0-9]*' | cut -d' ' -f2), Open MPI over TCP" >&2

# In its own session, so a signal reaches mpirun once, from cleanup: a second one makes it
# exit at once and leave its ranks running.
# mpi_yield_when_idle: the shaped packets leave the queue in a kernel softirq thread that
# needs a CPU; ranks spinning on every core would delay each small message by ticks of 4 ms.
export HVDSKETCH_CLUSTER_RATE=$RATE  # benchmarks record the network they ran on
setsid ip netns exec "$NS" "${MPIRUN[@]}" -x HVDSKETCH_CLUSTER_RATE -np "$NP" --mca pml ob1 --mca btl self,tcp \
  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --mca mpi_yield_when_idle 1 "$@" &
CHILD=$!
wait "$CHILD"
RC=$?
CHILD=
exit "$RC"
