#!/usr/bin/env bash
# The main job: set up what is missing, then train the default config (LSTM language model on
# the King James Bible, sparse-sketch compression) on 2 ranks under horovodrun on localhost.
# Extra arguments go to `hvdsketch train`, e.g. --compression none --epochs 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash launch/setup.sh
source launch/env.sh
NP=${NP:-2}
exec horovodrun -np "$NP" -H "localhost:$NP" hvdsketch train --config "${CONFIG:-configs/lstm.yaml}" "$@"
