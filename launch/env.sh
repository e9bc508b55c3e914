# Sourced by the launch scripts: the venv and the environment every rank needs.
# PYTHONPATH puts this checkout's hvdsketch first, whichever checkout the venv's editable install names.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091
source "${HVDSKETCH_VENV:-$ROOT/.venv}/bin/activate"
export TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=3 PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun --bind-to none -x TF_USE_LEGACY_KERAS -x TF_CPP_MIN_LOG_LEVEL -x PYTHONUNBUFFERED -x PYTHONPATH -x PATH)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
