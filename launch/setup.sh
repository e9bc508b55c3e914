#!/usr/bin/env bash
# Idempotent setup: Open MPI, .venv (Python 3.11), PyTorch + TensorFlow, and
# Horovod 0.28.1 built from source with PyTorch, TensorFlow, MPI and Gloo.
# The Horovod wheel is cached outside the repo, keyed by the versions it was
# built against, so a fresh clone reuses it in seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVDSKETCH_VENV:-$ROOT/.venv}
PY=${HVDSKETCH_PYTHON:-python3.11}
HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
TF_VERSION=2.18.1
TF_KERAS_VERSION=2.18.0
CACHE=${HVDSKETCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdsketch}
KEY="horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-tf$TF_VERSION-$($PY -c 'import sys; print("py%d.%d" % sys.version_info[:2])')"
WHEELDIR=$CACHE/$KEY
STAMP=$VENV/.hvdsketch-setup-$KEY

step() { STEP="$*"; echo "[setup] $*"; }
trap 'echo "[setup] FAILED at step: ${STEP:-?} (exit $?)" >&2' ERR

SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo

step "Open MPI and the workloads' data (KJV text, WordNet, Fashion-MNIST)"
if ! command -v mpirun >/dev/null || ! command -v tc >/dev/null || ! command -v mpicxx >/dev/null \
   || ! command -v bible >/dev/null || [ ! -f /usr/share/wordnet/data.noun ] \
   || [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev iproute2 \
    bible-kjv wordnet-base dataset-fashion-mnist >/dev/null
fi

step "PyTorch's newest release that installs here, in an environment of its own (no Horovod)"
# launch/torch-env.sh: made once, kept beside the Horovod wheel; launch/test.sh runs the unit tests and
# tests/mpi/ddp there too
bash "$ROOT/launch/torch-env.sh" >/dev/null

if [ -f "$STAMP" ] && [ "$ROOT/setup.cfg" -ot "$STAMP" ] && [ "$0" -ot "$STAMP" ]; then
  echo "[setup] already set up ($KEY)"; exit 0
fi

step "virtual environment $VENV"
[ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's own chatter only: the warnings of what it installs are left alone (horovodrun below, training)
quiet() { PYTHONWARNINGS=ignore "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; return "${PIPESTATUS[0]}"; }

step "PyTorch $TORCH_VERSION, TensorFlow $TF_VERSION, hvdsketch (editable) and its extras lab and test"
# hvdsketch's own dependencies come from setup.cfg (the package's extras), the one list of them;
# pinned here: the frameworks Horovod is built against, cmake to build it, and Horovod's own
# dependencies (its wheel is installed without them below).
quiet $PIP install -q --upgrade pip setuptools wheel
quiet $PIP install -q --no-build-isolation "torch==$TORCH_VERSION" "tensorflow-cpu==$TF_VERSION" \
  "tf-keras==$TF_KERAS_VERSION" "cmake>=3.13,<4" cloudpickle psutil PyYAML packaging -e "$ROOT[lab,test,docs]"

step "Horovod $HOROVOD_VERSION wheel ($KEY)"
if ! ls "$WHEELDIR"/horovod-*.whl >/dev/null 2>&1; then
  BUILD=$(mktemp -d)
  quiet $PIP download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$BUILD"
  tar -xzf "$BUILD"/horovod-$HOROVOD_VERSION.tar.gz -C "$BUILD"
  SRC=$BUILD/horovod-$HOROVOD_VERSION
  # Horovod 0.28.1 pins C++14; PyTorch >= 2.1 headers need C++17 (both files, or Gloo links fail).
  sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/; s/-std=c++14/-std=c++17/g' \
    "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/horovod/torch/CMakeLists.txt"
  echo "[setup] building Horovod (several minutes, once per version key)"
  (cd "$SRC" && PATH="$VENV/bin:$PATH" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 \
     HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1 \
     TF_USE_LEGACY_KERAS=1 MAKEFLAGS="-j$(nproc)" \
     $PIP wheel --no-build-isolation --no-deps -w "$BUILD/dist" . > "$BUILD/build.log" 2>&1) \
     || { tail -40 "$BUILD/build.log" >&2; false; }
  mkdir -p "$WHEELDIR"
  cp "$BUILD"/dist/horovod-*.whl "$WHEELDIR"/
  rm -rf "$BUILD"
fi
# once per version key: a venv stamped for this key has this wheel already (a rerun after an edit
# of setup.cfg or of this script leaves it, and the processes using it, alone)
[ -f "$STAMP" ] || quiet $PIP install -q --no-deps --force-reinstall "$WHEELDIR"/horovod-*.whl

step "horovodrun --check-build"
CHECK=$(TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/horovodrun" --check-build 2>/dev/null)
echo "$CHECK"
for want in TensorFlow PyTorch MPI Gloo; do
  echo "$CHECK" | grep -q "\[X\] $want" || { echo "[setup] Horovod lacks $want" >&2; false; }
done
touch "$STAMP"
echo "[setup] done ($KEY)"
