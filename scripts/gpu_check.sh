#!/usr/bin/env bash
# The first-GPU command (README "On a GPU"): installs the travel kit, unpacks the data, then runs ONE Python process,
# scripts/gpu_check.py (its docstring lists the sections), which prints every line as it comes and writes report.txt,
# bench.json, clients.png and claims.tar.gz under --out. This script adds console.txt (everything printed).
#   bash scripts/gpu_check.sh --out DIR [--budget SECONDS]   # on a GPU machine; on the device tool: --out "$OUT"
#   bash scripts/gpu_check.sh --out DIR --cpu-smoke          # the same code with tiny sizes on the CPU (rehearsal)
# The GPU image has torch but not hydra-core / omegaconf / antlr4 and no package index: their wheels come in .whl/
# (bash scripts/device_prep.sh, carried with the working tree); the data in .device-data/ (or $FEDBENCH_DATA).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=gpu_check_$(date +%Y%m%d-%H%M%S)
prev=
for a in "$@"; do [ "$prev" = --out ] && OUT=$a; prev=$a; done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled WANDB_SILENT=true PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # fedbench from this checkout; nothing is installed
{
    echo "gpu_check.sh: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])'), $(date -u +%FT%TZ)"
    if ! "$PY" -c "import hydra, omegaconf" 2>/dev/null; then   # the travel kit: pure-Python wheels, unzipped
        WHL=${FEDBENCH_KIT:-.whl}
        ls "$WHL"/*.whl >/dev/null 2>&1 || { echo "gpu_check.sh: hydra is missing and $WHL/ has no wheels (run bash scripts/device_prep.sh where pip works)"; exit 3; }
        KIT=$(mktemp -d); trap 'rm -rf "$KIT" "${UNPACKED:-}"' EXIT
        for w in "$WHL"/*.whl; do "$PY" -m zipfile -e "$w" "$KIT" || exit 3; done
        export PYTHONPATH="$PYTHONPATH:$KIT"
        echo "gpu_check.sh: the travel kit from $WHL/: $(cd "$WHL" && ls *.whl | tr '\n' ' ')"
    fi
    if [ -z "${FEDBENCH_DATA:-}" ] && [ -f .device-data/cifar10.tar.gz ]; then   # the data carried with the tree
        FEDBENCH_DATA=$(mktemp -d); UNPACKED=$FEDBENCH_DATA; trap 'rm -rf "${KIT:-}" "$UNPACKED"' EXIT
        tar xzf .device-data/cifar10.tar.gz -C "$FEDBENCH_DATA" || exit 3
        mkdir -p "$FEDBENCH_DATA/MNIST/raw"
        for f in .device-data/MNIST/raw/*.gz; do [ -f "$f" ] && gunzip -c "$f" > "$FEDBENCH_DATA/MNIST/raw/$(basename "${f%.gz}")"; done
        export FEDBENCH_DATA
        echo "gpu_check.sh: data unpacked from .device-data/ into $FEDBENCH_DATA ($(find "$FEDBENCH_DATA" -type f | wc -l) files)"
    elif [ -z "${FEDBENCH_DATA:-}" ] && [ -d ../shared/data/cifar10 ]; then
        export FEDBENCH_DATA=$(cd ../shared/data && pwd)
    fi
    "$PY" scripts/gpu_check.py "$@"
} 2>&1 | tee -a "$OUT/console.txt"
exit "${PIPESTATUS[0]}"
