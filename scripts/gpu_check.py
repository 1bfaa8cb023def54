#!/usr/bin/env python
"""The first-GPU check: ONE process (CUDA initialised once; only the memory measurements and the claim runs get their
own), every result printed as it comes and written under ``--out`` (the device tool brings back only ``$OUT``):

    report.txt     every line below, PASS/FAIL per check, planned vs taken time per section
    bench.json     every measurement (rewritten after each one, so a killed run keeps what it had)
    clients.png    the clients sweep
    claims.tar.gz  the paper-scale claim runs that finished (config, summary, metrics; no checkpoints), readable here
                   with ``tar xzf claims.tar.gz -C outputs && fedbench-claims report <paper> --scale paper``

Sections, each with bounded work (``SIZES``) and printed before it starts with its planned work and estimated time:
  1 env          python/torch/CUDA/cuDNN, the device, the TF32 / cuDNN flags fedbench sets (reading them must not raise)
  2 equality     sequential == vectorized on the device (fp64; fp32 judged against the fp64 answer,
                 fedbench/engine/agreement.py) for FedAvg with BatchNorm, SCAFFOLD, FedRoD with persistent optimizer
                 state and Ditto; the same fp64 run on the CPU and on the device
  3 syncs        no host sync inside a vectorized round's step loop: torch.cuda.set_sync_debug_mode("error") around the
                 loop, and fedbench's counter (fedbench/engine/syncs.py)
  4 settings     s/round and sample-gradients/s of the seed papers' settings (FedReMa Table 1 CIFAR-10 AlexNet, FedKA
                 Table 1 t-CNN, ECL Table 1 ResNet-32; the claims files' paper scale) at fp32 with TF32 off and on and
                 bf16 autocast; a warm-up round, then one timed round; a paper-scale run's time extrapolated from it
  5 clients      vectorized s/round for 10/50/100/200 clients (equal workload, E = 1): PASS if 100 clients cost at
                 most 2x what 10 do (the goal), with the sequential executor at 10 clients for scale; then one run of
                 50 clients in 1 and in 2 processes sharing the GPU (torchrun, docs/distributed.md): the time ratio
  6 memory       ResNet-50 (CIFAR stem), 10 clients x batch 128: peak memory unbudgeted, with a hardware.max_memory
                 that forces >= 2 chunks (PASS: >= 2 chunks and the peak within the budget), and a client count sized to
                 overflow the device (PASS: the out-of-memory halving finishes the round); one process each
  7 claims       with the time left of ``--budget``: the claim runs whose estimated time (from section 4) fits, most
                 informative first (FedKA Table 1 FedAvg vs FedKA, then FedReMa Table 1 CIFAR-10 FedAvg vs FedReMa),
                 a pair of arms per seed; a run that would not finish is not started

    bash scripts/gpu_check.sh --out DIR [--budget 540]     # on the GPU machine (installs the travel kit first)
    bash scripts/gpu_check.sh --out DIR --cpu-smoke         # the same code on the CPU with tiny sizes (rehearsal)

This file is the command: each mode's sizes, the plan printed first, and the sections in order within the budget. The
sections live beside it: gpu_correctness.py (1-3), gpu_speed.py (4-5), gpu_memory.py (6), gpu_claims.py (7); the
report in gpu_report.py, the run builders in gpu_runs.py.

Exit code: 0 if every check passed, 1 if one failed, 3 without a usable GPU (not in --cpu-smoke mode).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
# noqa E402: after the path; F401: re-exported, gpu_check's public names (scripts/device_bench.py reads them as gc.*)
from gpu_claims import claims  # noqa: E402
from gpu_correctness import env, equality, syncs  # noqa: E402
from gpu_memory import memory  # noqa: E402
from gpu_report import Report  # noqa: E402
from gpu_runs import built, compose, sync  # noqa: E402, F401
from gpu_speed import (  # noqa: E402, F401
    PAPER_SETTINGS,
    SMOKE_DATA,
    clients_sweep,
    measure_job,
    paper_job,
    paper_run_seconds,
    setting_args,
    settings,
)

# Assumed cost of one vectorized client-step on an H100 (ms, at the workload's batch) and of building a run (s): only
# for the plan printed at the start; the report prints planned vs taken per section so the next plan can use the truth.
ASSUMED_MS = {"mlp": 0.3, "tiny_cnn": 0.5, "cnn": 1.0, "tcnn": 2.0, "alexnet": 2.0, "resnet32": 8.0, "resnet50": 40.0}
ASSUMED_SETUP_S = 2.0

SIZES = {
    "gpu": {
        "eq_rounds": 2,
        "eq_cases": 4,
        # (PAPER_SETTINGS key, all numerics: the first arm also with TF32 and bf16; est. s per build = 2 rounds x
        # batched calls per round (E x the longest client's steps) x an assumed ms per call + evaluation)
        "settings": [
            ("fedka", True, 2 * 10 * 120 * 3e-3 + 4),
            ("fedrema", True, 2 * 5 * 5 * 4e-3 + 4),
            ("ecl", False, 2 * 10 * 100 * 15e-3 + 6),
        ],
        "setting_overrides": [],
        "sweep": [10, 50, 100, 200],
        "sweep_model": ("cnn", "3,32,32", 100, 480),  # model, synthetic shape, batch, training images per client
        "memory": {"model": "resnet50", "clients": 10, "batch": 128, "per_client": 256, "oom_case": True},
        "claims_scale": "paper",
        "claims": [("fedka", "table1", ["fedavg", "fedka_0.01"]), ("fedrema", "table1", ["fedavg", "fedrema"])],
    },
    "smoke": {
        "eq_rounds": 1,
        "eq_cases": 2,
        "settings": [("fedka", True, 3.0), ("ecl", False, 5.0)],
        "setting_arms": 1,  # the first arm of each
        "setting_overrides": [  # SMOKE_DATA: tiny synthetic data
            *SMOKE_DATA,
            "local_epochs=1",
        ],
        "sweep": [2, 4],
        "sweep_model": ("mlp", "1,8,8", 16, 32),
        "memory": {"model": "tiny_cnn", "clients": 4, "batch": 8, "per_client": 16, "oom_case": False},
        "claims_scale": "smoke",
        "claims": [("fedka", "table1", ["fedavg", "fedka_0.01"])],
        "claims_seeds": 1,  # one pair of arms: the launch, the archive and the read-back, not the statistics
    },
}


# ---- main -------------------------------------------------------------------------------------------------------
def plan_line(steps: int, model: str, runs: int, startup_s: float = 0.0) -> tuple[str, float]:
    """``startup_s``: per run in a process of its own (Python, torch and CUDA start again)."""
    est = steps * ASSUMED_MS.get(model, 5.0) / 1000 + runs * (ASSUMED_SETUP_S + startup_s)
    return f"{runs} runs, ~{steps} client-steps ({model})", est


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(f"gpu_check_{time.strftime('%Y%m%d-%H%M%S')}"))
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for everything (claims use what is left)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: rehearses this script")
    ap.add_argument("--sections", default="1,2,3,4,5,6,7", help="which sections to run, e.g. 7 (claims only)")
    ap.add_argument("--data", default=os.environ.get("FEDBENCH_DATA"), help="folder with cifar10/ and MNIST/")
    ap.add_argument("--plan", action="store_true", help="print the planned work and its estimated time, run nothing")
    ap.add_argument("--oom-clients", type=int, default=None, help="section 6: only the out-of-memory case, N clients")
    args = ap.parse_args()
    rep = Report(None if args.plan else args.out, args.budget)
    rep.say(
        f"fedbench gpu_check {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, budget {args.budget:.0f} s, "
        f"out {args.out}{' (--cpu-smoke: tiny sizes, the numbers say nothing about a GPU)' if args.cpu_smoke else ''}"
    )
    if args.cpu_smoke:
        dev, size = torch.device("cpu"), SIZES["smoke"]
    elif args.plan:
        dev, size = torch.device("cuda"), SIZES["gpu"]
    else:
        try:
            torch.cuda.init()
            ok = torch.cuda.is_available()
        except Exception as e:  # noqa: BLE001
            ok, why = False, f"{type(e).__name__}: {e}"
        else:
            why = "torch.cuda.is_available() is False"
        if not ok:
            rep.check("a CUDA device", False, f"{why} (torch {torch.__version__}, CUDA build {torch.version.cuda})")
            return 3
        dev, size = torch.device("cuda"), SIZES["gpu"]
    data = args.data if args.data and Path(args.data, "cifar10").is_dir() else None
    rep.say(f"data: {data or 'none (synthetic settings; no claim runs at paper scale)'}")
    if data is None and not args.cpu_smoke:
        size = {**size, "setting_overrides": ["dataset=synthetic", "dataset.shape=[3,32,32]"], "claims": []}

    mem, cl, sm = size["memory"], size["sweep"], size["sweep_model"]
    eq_runs = size["eq_cases"] * 4 + (3 if dev.type == "cuda" else 0)
    n_set = [(len(PAPER_SETTINGS[k][3][: size.get("setting_arms")]) + 2 * a, est) for k, a, est in size["settings"]]
    sections = [
        ("1. env and numerics flags", "flags only", 1.0),
        (
            "2. sequential == vectorized; CPU fp64 == device fp64",
            *plan_line(eq_runs * size["eq_rounds"] * 4 * 6, "tiny_cnn", eq_runs),
        ),
        ("3. host syncs in the step loop", *plan_line(6 * 10, "tiny_cnn", 1)),
        (
            "4. the seed papers' settings: fp32, TF32, bf16",
            f"{sum(n for n, _ in n_set)} builds x (1 warm-up + 1 timed round) at the paper's local budget",
            sum(n * e for n, e in n_set),
        ),
        (
            "5. clients sweep; 1 vs 2 processes",
            *plan_line(2 * -(-sm[3] // sm[2]) * (sum(cl) + cl[0] + 3 * cl[1]), sm[0], len(cl) + 4, startup_s=5),
        ),
        (
            "6. memory (own processes)",
            *plan_line(2 * 2 * mem["clients"] * (3 if mem["oom_case"] else 2), mem["model"], 3, startup_s=10),
        ),
    ]
    rep.say(
        "plan (estimates assume "
        + ", ".join(f"{k} {v} ms" for k, v in ASSUMED_MS.items())
        + f" per vectorized client-step and {ASSUMED_SETUP_S} s per run build):"
    )
    for title, planned, est in sections:
        rep.say(f"  {title}: {planned}; est. {est:.0f} s")
    rep.say(f"  total before claims: est. {sum(e for *_, e in sections):.0f} s; then 7. claims with the time left")
    if args.plan:
        return 0
    estimates: dict = {}
    steps = [
        lambda: env(rep, dev),
        lambda: equality(rep, dev, size),
        lambda: syncs(rep, dev),
        lambda: settings(rep, dev, size, data, estimates),
        lambda: clients_sweep(rep, dev, size),
        lambda: memory(rep, dev, size, args.oom_clients),
    ]
    chosen = {int(x) for x in args.sections.split(",")}
    for i, ((title, planned, est), step) in enumerate(zip(sections, steps), 1):
        if i not in chosen:
            continue
        if rep.left() < est:
            rep.say(f"\n== {title}: SKIPPED, {rep.left():.0f} s left for an est. {est:.0f} s")
            continue
        with rep.section(title, planned, est):
            step()
    if 7 in chosen:
        with (
            tempfile.TemporaryDirectory() as work,
            rep.section("7. claims with the time left", f"{rep.left():.0f} s left", max(0.0, rep.left())),
        ):
            claims(rep, dev, size, data, estimates, Path(work))
    failed = rep.data["failed"]
    rep.say("")
    rep.say(
        f"{len(failed)} check(s) failed{': ' + '; '.join(failed) if failed else ''}; {rep.elapsed():.0f} s; "
        f"files in {args.out}: {', '.join(sorted(p.name for p in args.out.iterdir()))}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
