#!/usr/bin/env bash
# The main job: set up what is missing, then on 2 ranks under mpirun on localhost train the
# default config (LSTM language model on the King James Bible, `auto`: a compressor per tensor,
# chosen from a cost model after a few dense steps) after a short dense run, and end with one
# line: the config's step time and bytes against dense (`hvdsketch compare`).
# Extra arguments go to both runs of `hvdsketch train` (e.g. --epochs 1 --steps-per-epoch 10);
# NP sets the ranks, CONFIG the config, DENSE_STEPS the dense run's steps (default 20), OUT the
# folder of the two runs' records (default runs/main).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash launch/setup.sh
source launch/env.sh
NP=${NP:-2}
CONFIG=${CONFIG:-configs/lstm.yaml}
OUT=${OUT:-runs/main}

# glibc keeps the memory it frees instead of handing it back and faulting it in again every step
# (man mallopt; README, "Host memory"): on this machine the LSTM's steps are 10-17% shorter, both runs alike.
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-1000000000} MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-2000000000}
# mpirun, not horovodrun: horovodrun checks Horovod's build by loading its TensorFlow extension
# first, which prints TensorFlow's start-up messages into a PyTorch job.
train() { "${MPIRUN[@]}" -x MALLOC_MMAP_THRESHOLD_ -x MALLOC_TRIM_THRESHOLD_ -np "$NP" hvdsketch train --config "$CONFIG" "$@"; }

echo "[main] dense allreduce, ${DENSE_STEPS:-20} steps: the step time to compare with"
train "$@" --compression none --epochs 1 --steps-per-epoch "${DENSE_STEPS:-20}" --out "$OUT/dense"
echo "[main] $CONFIG"
train "$@" --out "$OUT/run"
hvdsketch compare "$OUT/dense" "$OUT/run"
