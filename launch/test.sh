#!/usr/bin/env bash
# The test command: set up what is missing, run the single-process tests (tests/gpu skips without CUDA), then
# every MPI suite with each rank running pytest under mpirun -np 2 and -np 4,
# each job under a timeout so a hang fails. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash launch/setup.sh || { echo "setup failed"; exit 1; }
source launch/env.sh
LOGS=$(mktemp -d)
PASSED=0; FAILED=0; BAD_RUNS=0

# count FILE: add the "N passed" / "N failed" / "N error" of a pytest summary in FILE.
count() {
  local line p f e
  line=$(grep -E '(passed|failed|errors?|skipped|no tests ran).* in [0-9.]+s' "$1" 2>/dev/null | tail -1)
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+' || echo 0)
  f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+' || echo 0)
  e=$(grep -oE '[0-9]+ errors?' <<<"$line" | grep -oE '[0-9]+' || echo 0)
  echo "${p:-0} $(( ${f:-0} + ${e:-0} ))"
}

# suite NAME TIMEOUT RESULT_FILE CMD...: run CMD under a timeout, summarise it.
suite() {
  local name=$1 limit=$2 result=$3; shift 3
  local start=$SECONDS rc p f
  timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1; rc=$?
  read -r p f < <(count "$result")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # aborted, timed out or crashed
  [ "$rc" -eq 124 ] && echo "  $name: TIMED OUT after ${limit}s"
  PASSED=$((PASSED + p)); FAILED=$((FAILED + f))
  if [ "$rc" -ne 0 ]; then
    BAD_RUNS=$((BAD_RUNS + 1))
    echo "---- $name (exit $rc), last lines:"; grep -v "^WARNING:tensorflow:\|^WARNING: All log messages" "$LOGS/$name.log" | tail -40
  fi
  printf '%-28s %4d passed, %d failed  (%ds, exit %d)\n' "$name" "$p" "$f" $((SECONDS - start)) "$rc"
}

PYTEST=(python -m pytest -q --color=no -p no:cacheprovider -o addopts= --timeout=600)
suite unit 2400 "$LOGS/unit.log" "${PYTEST[@]}" tests/unit
suite gpu 900 "$LOGS/gpu.log" "${PYTEST[@]}" -rs tests/gpu  # skipped without CUDA
for np in 2 3 4; do
  for s in plain torch tensorflow ddp fsdp; do
    [ "$np" -eq 3 ] && [ "$s" != plain ] && continue  # odd rank counts: the MPI layer's own suite
    [ -n "$(ls tests/mpi/$s/test_*.py 2>/dev/null)" ] || continue
    out="$LOGS/np$np-$s"
    suite "mpi np=$np $s" 900 "$out/1/rank.0/stdout" \
      "${MPIRUN[@]}" -np "$np" --output-filename "$out" "${PYTEST[@]}" "tests/mpi/$s"
  done
done
# The tests that need neither Horovod nor TensorFlow (tests/unit skips the rest, and the DDP and FSDP suites) on
# PyTorch's newest release too, in its own environment (launch/torch-env.sh, made by setup.sh), its python first on every rank's PATH.
NEWEST_PYTHON=$(bash launch/torch-env.sh 2>/dev/null)
NEWEST_TORCH=$("$NEWEST_PYTHON" -c 'import torch; print(torch.__version__)')
PINNED_PATH=$PATH
export PATH="$(dirname "$NEWEST_PYTHON"):$PATH"
suite "unit torch $NEWEST_TORCH" 2400 "$LOGS/unit torch $NEWEST_TORCH.log" "${PYTEST[@]}" tests/unit
for np in 2 4; do
  for s in ddp fsdp; do
    out="$LOGS/np$np-$s-newest"
    suite "mpi np=$np $s torch $NEWEST_TORCH" 900 "$out/1/rank.0/stdout" \
      "${MPIRUN[@]}" -np "$np" --output-filename "$out" "${PYTEST[@]}" "tests/mpi/$s"
  done
done
export PATH=$PINNED_PATH

echo "logs: $LOGS"
echo "$PASSED passed, $FAILED failed"
[ "$BAD_RUNS" -eq 0 ] && [ "$FAILED" -eq 0 ]
