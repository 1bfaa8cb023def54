#!/usr/bin/env bash
# The first-GPU command (README "On a GPU"): installs the travel kit, unpacks the data, then runs ONE Python process,
# scripts/gpu_check.py (its docstring lists the sections), which prints every line as it comes and writes report.txt,
# bench.json, clients.png and claims.tar.gz under --out. This script adds console.txt (everything printed).
#   bash scripts/gpu_check.sh --out DIR [--budget SECONDS]   # on a GPU machine; on the device tool: --out "$OUT"
#   bash scripts/gpu_check.sh --out DIR --cpu-smoke          # the same code with tiny sizes on the CPU (rehearsal)
#   bash scripts/gpu_check.sh --bench --out DIR [...]        # scripts/device_bench.py instead (where the time goes)
# The GPU image has torch but not hydra-core / omegaconf / antlr4 and no package index: their wheels come in .whl/
# (bash scripts/device_prep.sh, carried with the working tree); the data in .device-data/ (or $FEDBENCH_DATA).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
SCRIPT=scripts/gpu_check.py
if [ "${1:-}" = --bench ]; then SCRIPT=scripts/device_bench.py; shift; fi
OUT=$(basename "$SCRIPT" .py)_$(date +%Y%m%d-%H%M%S)
prev=
for a in "$@"; do [ "$prev" = --out ] && OUT=$a; prev=$a; done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled WANDB_SILENT=true PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # fedbench from this checkout; nothing is installed
{
    echo "gpu_check.sh: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])'), $(date -u +%FT%TZ)"
    . scripts/device_env.sh || exit 3
    "$PY" "$SCRIPT" "$@"
} 2>&1 | "$PY" -u scripts/gpu_report.py "$OUT" | tee -a "$OUT/console.txt"   # machine paths as placeholders
exit "${PIPESTATUS[0]}"
