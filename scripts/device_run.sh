#!/usr/bin/env bash
# Any fedbench command on a GPU machine without a package index (the device tool's image), with the travel kit and
# the carried data set up as for scripts/gpu_check.sh (scripts/device_env.sh):
#   bash scripts/device_run.sh --out DIR -- fedbench-claims run fedrema --scale medium --seeds 0,1 --runs DIR/claims
# `fedbench`, `fedbench-claims` and `python` mean this machine's Python with fedbench from this checkout (nothing is
# installed); everything printed also goes to DIR/console.txt. Rehearsed on the CPU by tests/test_gpu_check.py.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
if [ "${1:-}" != --out ] || [ -z "${2:-}" ]; then
    echo "usage: bash scripts/device_run.sh --out DIR -- COMMAND [ARGS...]" >&2
    exit 2
fi
OUT=$2
shift 2
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || { echo "device_run.sh: no command after --out $OUT --" >&2; exit 2; }
case "$1" in
    fedbench) set -- "$PY" -m fedbench.cli "${@:2}" ;;
    fedbench-claims) set -- "$PY" -m fedbench.claims "${@:2}" ;;
    python | python3) set -- "$PY" "${@:2}" ;;
esac
mkdir -p "$OUT"
# what comes back is every file under $OUT (8 files, 64 MiB): device_claims.py fits its checkpoints into what is left
export FEDBENCH_DEVICE_OUT="$(cd "$OUT" && pwd)"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled WANDB_SILENT=true PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
    echo "device_run.sh: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])'), $(date -u +%FT%TZ): $*"
    # the versions that decide what runs (2026-11-28: the image's torchvision refused an interpolation by name)
    "$PY" -c 'import numpy, torch, torchvision; print(f"device_run.sh: torch {torch.__version__}, torchvision {torchvision.__version__}, numpy {numpy.__version__}, cuda {torch.cuda.is_available()}")' 
    . scripts/device_env.sh || exit 3
    "$@"
} 2>&1 | "$PY" -u scripts/gpu_report.py "$OUT" | tee -a "$OUT/console.txt"   # machine paths as placeholders
exit "${PIPESTATUS[0]}"
