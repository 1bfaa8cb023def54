#!/usr/bin/env bash
# One command for the first GPU (issue 21 item 7). Writes ONE report file (default gpu_check_<time>.txt):
#   1. device, memory, TF32 and cuDNN flags;
#   2. sequential == vectorized on CUDA, fp64 and fp32 with TF32 off: fedavg (BN model and MLP), scaffold, fedrod with
#      persistent optimizer state, ditto;
#   3. the same fp64 run on the CPU and on CUDA;
#   4. host syncs inside a vectorized round's step loop (fedbench's counter and torch.cuda.set_sync_debug_mode);
#   5. scripts/bench.py --device cuda: fp32 with TF32 off and on, bf16, channels_last on/off (plain-loop reference),
#      the uneven workloads (Dirichlet 0.1 and 0.5), and the clients sweep 10..200 (plotted);
#   6. peak GPU memory of model=resnet50 clients=10 batch_size=128 (torchvision and CIFAR stems, with and without
#      hardware.max_memory=0.9).
# Without a GPU, sections 2-6 are skipped with one line each.
#   bash scripts/gpu_check.sh [REPORT]          (make gpu-check)
#   bash scripts/gpu_check.sh REPORT --cpu-smoke   (tiny versions of 2, 4, 5, 6 on the CPU: tests the script itself)
set -u
cd "$(dirname "$0")/.."
REPORT=${1:-gpu_check_$(date +%Y%m%d-%H%M%S).txt}
MODE=${2:-}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
DATA=${FEDBENCH_DATA:-../shared/data}
FAILS=0
: > "$REPORT"
say() { echo "$@" | tee -a "$REPORT"; }
step() {   # step TITLE COMMAND...: run, copy its output into the report, count a failure
    say ""; say "== $1"; shift
    "$@" 2>&1 | tee -a "$REPORT"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then FAILS=$((FAILS + 1)); say "-- exit code $rc"; fi
}
say "fedbench gpu_check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD 2>/dev/null), host $(hostname)"
step "1. device and numerics flags" "$PY" scripts/gpu_check.py env
if [ "$MODE" = "--cpu-smoke" ]; then
    DEV=cpu; QUICK=--quick
    say "(--cpu-smoke: tiny CPU versions of the checks; the numbers below say nothing about a GPU)"
elif "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    DEV=cuda; QUICK=
else
    say ""; say "no GPU on this machine (torch.cuda.is_available() is False): skipping the CUDA checks (sections 2-6)"
    say "report: $REPORT"
    exit 0
fi
step "2. sequential == vectorized on $DEV (fp64; fp32 with TF32 off)" "$PY" scripts/gpu_check.py equality --device "$DEV" $QUICK
if [ "$DEV" = cuda ]; then
    step "3. the same run on the CPU and on CUDA (fp64)" "$PY" scripts/gpu_check.py cpu-vs-cuda
else
    say ""; say "== 3. skipped: no GPU"
fi
step "4. host syncs inside the step loop" "$PY" scripts/gpu_check.py syncs --device "$DEV"
if [ -n "$QUICK" ]; then
    step "5. benchmark (smoke)" "$PY" scripts/bench.py --device "$DEV" --synthetic --rounds 1 --epochs 1 --clients 3 \
        --no-clean --model mlp --shape 1,8,8 --test-per-class 20 --batch-size 16 --workloads dir0.5
else
    step "5a. benchmark fp32, TF32 off and on, equal and uneven workloads" "$PY" scripts/bench.py --device cuda \
        --tf32 off,on --workloads equal,dir0.1,dir0.5 --channels-last false
    step "5b. benchmark bf16" "$PY" scripts/bench.py --device cuda --precision bf16 --channels-last false
    step "5c. benchmark channels_last (the plain-loop reference uses it; fedbench's executors do not on a GPU)" \
        "$PY" scripts/bench.py --device cuda --channels-last true
    step "5d. clients sweep" "$PY" scripts/bench.py --device cuda --no-clean --workloads equal \
        --clients-sweep 10,20,50,100,200 --plot "${REPORT%.txt}_clients.png" --json "${REPORT%.txt}_bench.json"
fi
step "6. peak memory, ResNet-50, 10 clients x batch 128" "$PY" scripts/gpu_check.py memory --device "$DEV" $QUICK \
    $( [ -d "$DATA/cifar10" ] && echo --data "$DATA" )
say ""; say "$FAILS section(s) failed; report: $REPORT"
[ "$FAILS" -eq 0 ]
