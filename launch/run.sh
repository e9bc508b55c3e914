#!/usr/bin/env bash
# The main job: set up what is missing, then on 2 ranks train the default config (LSTM language
# model on the King James Bible, `auto`: a compressor per tensor, chosen from a cost model after a
# few dense steps) after a short dense run, twice: on localhost's loopback under mpirun, and, where
# launch/cluster.sh can run (root, network namespaces), over 1 Gbit/s links, each rank an emulated
# host of its own. Each pair ends with one line of `hvdsketch compare` (the config's step time and
# bytes against dense), labelled with its network; the last line gives both speed-ups, or says why
# the links did not run and how to see their figure.
# Extra arguments go to every run of `hvdsketch train` (e.g. --epochs 1 --steps-per-epoch 10);
# NP sets the ranks, CONFIG the config, DENSE_STEPS the dense runs' steps (default 20), OUT the
# folder of the runs' records (default runs/main: loopback/ and links/, each dense/ and run/),
# LINKS the links' rate (default 1gbit; none: the loopback only).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash launch/setup.sh
source launch/env.sh
NP=${NP:-2}
CONFIG=${CONFIG:-configs/lstm.yaml}
OUT=${OUT:-runs/main}
LINKS=${LINKS:-1gbit}
ARGS=("$@")

# glibc keeps the memory it frees instead of handing it back and faulting it in again every step
# (man mallopt; docs/cluster.md, "Host memory"): on this machine the LSTM's steps are 10-17% shorter,
# both runs alike. cluster.sh passes both on to its ranks.
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-1000000000} MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-2000000000}

# pair NAME LAUNCHER...: the dense run, then the config's, each `hvdsketch train` under LAUNCHER, into
# $OUT/NAME; prints their comparison labelled with $WHERE, and keeps it in LINE.
pair() {
  local name=$1
  shift
  echo "[main] $WHERE: dense allreduce, ${DENSE_STEPS:-20} steps: the step time to compare with"
  "$@" hvdsketch train --config "$CONFIG" "${ARGS[@]}" --compression none --epochs 1 \
    --steps-per-epoch "${DENSE_STEPS:-20}" --out "$OUT/$name/dense"
  echo "[main] $WHERE: $CONFIG"
  "$@" hvdsketch train --config "$CONFIG" "${ARGS[@]}" --out "$OUT/$name/run"
  LINE=$(hvdsketch compare "$OUT/$name/dense" "$OUT/$name/run")
  LINE=${LINE/ against dense: / against dense on $WHERE: }
  echo "$LINE"
}

# speedup LINE: the "(1.23x faster)" figure of a compare line, as 1.23x.
speedup() { sed -E 's/.*\(([0-9.]+)x faster\).*/\1x/' <<<"$1"; }

# mpirun, not horovodrun: horovodrun checks Horovod's build by loading its TensorFlow extension
# first, which prints TensorFlow's start-up messages into a PyTorch job.
WHERE="the loopback"
pair loopback "${MPIRUN[@]}" -x MALLOC_MMAP_THRESHOLD_ -x MALLOC_TRIM_THRESHOLD_ -np "$NP"
HEAD="${LINE%% against dense*} against dense: $(speedup "$LINE") faster on the loopback"

# The same two runs over shaped links, one emulated host per rank, where cluster.sh can make them.
if [ "$LINKS" = none ]; then
  echo "$HEAD; links not run (LINKS=none): LINKS=1gbit bash launch/run.sh runs them"
  exit 0
fi
WHERE="$(sed -E 's/^([0-9.]+)([kmg])bit$/\1 \u\2bit\/s/' <<<"$LINKS") links"
if ! PROBE=$(launch/cluster.sh --rate "$LINKS" -np "$NP" --launcher none -- true 2>&1); then
  echo "$HEAD; not run on $WHERE (${PROBE##*$'\n'}): bash launch/run.sh as root where network" \
    "namespaces are allowed runs them; results/README.md has such links' figures"
  exit 0
fi
echo "[main] $PROBE"
pair links launch/cluster.sh --rate "$LINKS" -np "$NP" --
echo "$HEAD, $(speedup "$LINE") on $WHERE"
