#!/usr/bin/env bash
# A virtual environment with one PyTorch release and hvdsketch's extras lab and test, without Horovod or
# TensorFlow: for the tests that need neither (tests/unit, which skips the rest, and tests/mpi/ddp) on
# another PyTorch than the pinned one that Horovod is built against (launch/setup.sh).
#
#   bash launch/torch-env.sh [VERSION [REQUIREMENT...]]
#
# VERSION defaults to the newest PyTorch that installs here (the machines' pip constraints cap it);
# REQUIREMENTs are added to the install (an old PyTorch wants "numpy<2"). Made once, outside the
# checkout, and reused as the Horovod wheel is: ${HVDSKETCH_CACHE:-~/.cache/hvdsketch}/venv-torchVERSION-pyX.Y,
# stamped with setup.cfg's digest and hvdsketch's version (an edit of either installs again). The
# Linux wheel brings its CUDA libraries (about 3 GB; PyTorch does not import without them, even on a
# CPU). Prints the time it took when it made or updated it (stderr), and the environment's python
# last (stdout).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSION=${1:-2.14.1}
shift || true
PY=${HVDSKETCH_PYTHON:-python3.11}
CACHE=${HVDSKETCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdsketch}
VENV=$CACHE/venv-torch$VERSION-$($PY -c 'import sys; print("py%d.%d" % sys.version_info[:2])')
DIGEST=$({ cat "$ROOT/setup.cfg"; grep __version__ "$ROOT/hvdsketch/__init__.py"; echo "$*"; } | sha256sum | cut -c1-16)
STAMP=$VENV/.hvdsketch-$DIGEST

if [ ! -f "$STAMP" ]; then
  began=$SECONDS
  echo "[setup] PyTorch $VERSION environment $VENV (no Horovod)" >&2
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  # pip's chatter about the machine's extra index folders only
  quiet() {
    PYTHONWARNINGS=ignore "$@" 2>&1 | { grep -v "^WARNING: Location" || true; } >&2; return "${PIPESTATUS[0]}"
  }
  quiet "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
  quiet "$VENV/bin/python" -m pip install -q "torch==$VERSION" "$@" -e "$ROOT[lab,test]"
  "$VENV/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '$VERSION', torch.__version__"
  rm -f "$VENV"/.hvdsketch-*
  touch "$STAMP"
  echo "[setup] PyTorch $VERSION environment ready in $((SECONDS - began)) s" >&2
else
  echo "[setup] PyTorch $VERSION environment $VENV (made before)" >&2
fi
echo "$VENV/bin/python"
