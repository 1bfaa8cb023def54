#!/usr/bin/env python
"""Where each step's time goes, on the device (issue 50, item 1): for each seed paper's paper-scale setting
(scripts/gpu_check.py PAPER_SETTINGS: ECL, FedKA, FedReMa, FedCOM, CAFeMe Table 1; pfl-research's CIFAR-10 shape),
one process prints and writes under ``--out``:

    device_bench.json   every measurement (rewritten after each one: a killed run keeps what it had)
    report.txt          every line printed

Per setting x arm x numerics variant (a warm-up round, a timed round, its evaluation, then a round whose first
``profile_calls`` step calls run under torch.profiler):
  * sample-gradients/s of the round's local training (the samples of every client-step the executors trained);
  * effective TFLOP/s = FLOPs per sample-gradient x sample-gradients / seconds, the FLOPs counted from the model by
    torch.utils.flop_counter.FlopCounterMode over ONE plain forward + backward of the network at the setting's batch
    (matmuls and convolutions only: elementwise ops, BatchNorm and pooling are not counted; an objective's extra
    passes, e.g. FedKA's or FedReMa's, are not counted either, so theirs is a lower bound), and its fraction of the
    chip's peak matmul rate measured in the same call (bf16, fp32, TF32; and the copy bandwidth);
  * GPU kernel time vs wall time per step call (the profiler's CUDA kernels in the window / the calls in it, against
    the timed round's wall time / its calls): ``busy`` < 0.5 is launch- (host-) bound, > 0.8 kernel-bound; the top
    kernels by time; the executor that trained each job (a vectorized job may fall back to the sequential one);
    peak memory; warnings raised (vmap's "There is a performance drop ..." fallback warning switched on);
  * the same for ONE model at batch K x B in a plain training loop (same network, same precision; no augmentation):
    ``stacked_over_big_batch`` = the round's sample-gradients/s / the big batch's, the vectorized executor's limit.
ECL also times its phase II (once per run: the calibrated model and the experts of all K clients) and the
personalized evaluation after it, apart from the phase-I rounds.

The timed rounds train ``min(E, epochs)`` local epochs (the paper's shapes, fewer of them: the rate per sample is
the paper's, the time is not) and ECL's phase II ``phase2_epochs`` epochs; the JSON records both.

    python scripts/device_bench.py --plan                       # every part's estimated device seconds, nothing run
    bash scripts/gpu_check.sh --bench --out "$OUT" [--budget 330] [--variant NAME:key=value,...]   # on the device
    python scripts/device_bench.py --cpu-smoke --out DIR        # the whole script with tiny sizes on the CPU

``--variant NAME:key=value,...`` (repeatable) adds a numerics variant: those fedbench overrides (e.g. the vectorized
executor's fast-path keys ``hardware.*``) measured on every chosen setting's first arm. ``--budget`` seconds: a
part whose estimate does not fit in what is left is skipped and said so.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent)]
import gpu_check as gc  # noqa: E402  (scripts/: the settings, the run builders and the report)

NUMERICS = {
    "fp32": ["hardware.precision=fp32", "hardware.tf32=false"],
    "tf32": ["hardware.precision=fp32", "hardware.tf32=true"],
    "bf16": ["hardware.precision=bf16"],
}
# Estimated device seconds of one measurement (build, warm-up, timed and profiled round at the capped epochs, the
# big batch) on an H200, from the 2026-11-26 run (docs/results/gpu/2026-11-26-h200: FedKA 2.95 s, FedReMa 0.67 s,
# ECL's phase-I round <= its 13.2 s warm-up round, at the paper's epochs); the report prints planned vs taken.
# (setting, arm, numerics, est. device s) on the GPU; most informative first
GPU_PARTS = [
    ("ecl", "ecl", "fp32", 35),
    ("fedka", "fedavg", "fp32", 14),
    ("fedrema", "fedavg", "fp32", 12),
    ("pfl", None, "fp32", 10),
    ("fedcom", "fedavg", "fp32", 10),
    ("cafeme", "fedavg", "fp32", 12),
    ("fedka", "fedka_0.01", "fp32", 16),
    ("fedrema", "fedrema", "fp32", 14),
    ("fedcom", "fedcom", "fp32", 12),
    ("cafeme", "cafeme", "fp32", 14),
    ("ecl", "ecl", "bf16", 30),
    ("fedka", "fedavg", "tf32", 14),
    ("fedka", "fedavg", "bf16", 14),
    ("fedrema", "fedavg", "tf32", 12),
    ("fedrema", "fedavg", "bf16", 12),
    ("pfl", None, "bf16", 10),
]
SIZES = {
    "gpu": {
        "matmul_n": 8192,
        "copy_mib": 1024,
        "min_s": 0.3,  # each peak measurement repeats until it has run this long
        "epochs": 2,
        "phase2_epochs": 1,
        "profile_calls": 10,
        "big_steps": 20,
        "overrides": [],
        "parts": GPU_PARTS,
        "peak_est_s": 12,
        "start_est_s": 30,  # before this script: the kit, the data unpacked (scripts/device_env.sh), torch and CUDA
        "variant_extra_s": 20,  # assumed capture / compile time per build of a --variant
    },
    "smoke": {
        "matmul_n": 96,
        "copy_mib": 4,
        "min_s": 0.02,
        "epochs": 1,
        "phase2_epochs": 1,
        "profile_calls": 3,
        "big_steps": 2,
        "overrides": [*gc.SMOKE_DATA, "participation=1.0", "batch_size=8", "hardware.executor=vectorized"],
        "extra": {  # a setting's own, after the tiny data
            "ecl": ["model.blocks_per_stage=1", "model.widths=[4,8,16]"],
            "fedrema": ["partition.samples_per_client=30"],
            "fedcom": ["clients=10", "partition.majority=0.95", "dataset.normalize=null"],
            "cafeme": ["partition.num_shards=6"],
        },
        # the GPU's first arms at fp32 (its first six parts), and FedKA's bf16; est. a fifth of the GPU's
        "parts": [(s, a, v, est / 5) for s, a, v, est in GPU_PARTS[:6] + GPU_PARTS[12:13]],
        "peak_est_s": 1,
        "start_est_s": 5,
        "variant_extra_s": 1,
    },
}


class BenchReport(gc.Report):
    json_name = "device_bench.json"


# ---- input -----------------------------------------------------------------------------------------------------------
def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME:key=value,key=value`` -> (NAME, [key=value, ...]); a bad one is a one-line error naming it."""
    name, sep, rest = text.partition(":")
    items = [x.strip() for x in rest.split(",") if x.strip()]
    if not sep or not name.strip() or not items or any("=" not in x or x.startswith("=") for x in items):
        raise SystemExit(f"device_bench: --variant {text!r}: allowed NAME:key=value[,key=value...]")
    if name.strip() in NUMERICS:
        raise SystemExit(f"device_bench: --variant {text!r}: NAME {name!r} is taken ({', '.join(NUMERICS)})")
    return name.strip(), items


def chosen_parts(size: dict, settings: list[str] | None, variants: list[tuple[str, list[str]]]) -> list[tuple]:
    """(setting, arm, variant name, overrides, est. s) in the order they run: each chosen setting's first fp32 part
    (the baselines), then each --variant on those settings' first arms (what a window comes to time), then the rest."""
    parts = [(s, arm, v, NUMERICS[v], est) for s, arm, v, est in size["parts"] if settings is None or s in settings]
    firsts: dict = {}
    for p in parts:
        if p[2] == "fp32":
            firsts.setdefault(p[0], p)
    head = list(firsts.values())
    extra = [(s, arm, name, ov, est + size["variant_extra_s"]) for name, ov in variants for s, arm, _, _, est in head]
    return head + extra + [p for p in parts if p not in head]


# ---- the chip's peak, measured here ----------------------------------------------------------------------------------
def timed(fn, dev: torch.device) -> float:
    """Wall seconds of ``fn()``, the device synchronized after it."""
    tic = time.perf_counter()
    fn()
    gc.sync(dev)
    return time.perf_counter() - tic


def seconds_per_call(fn, dev: torch.device, min_s: float) -> float:
    """Wall seconds of one ``fn()``: once to warm up, then repeated (doubling) until the repeats take ``min_s``."""
    fn()
    gc.sync(dev)
    reps = 1
    while True:
        tic = time.perf_counter()
        for _ in range(reps):
            fn()
        gc.sync(dev)
        took = time.perf_counter() - tic
        if took >= min_s or reps >= 1 << 16:
            return took / reps
        reps *= 2


def peaks(dev: torch.device, size: dict) -> dict:
    """Matmul TFLOP/s (bf16, fp32 with TF32 off, fp32 with TF32 on: 2 n^3 per n x n product) and the device copy
    bandwidth (GB/s counting the bytes read and written)."""
    from fedbench.engine import numerics

    n, out = size["matmul_n"], {}
    for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp32", torch.float32, False), ("tf32", None, True)):
        numerics.configure(tf32, False, dev)
        a = torch.randn(n, n, device=dev, dtype=dtype or torch.float32)
        b = torch.randn(n, n, device=dev, dtype=dtype or torch.float32)
        s = seconds_per_call(lambda a=a, b=b: a @ b, dev, size["min_s"])
        out[f"{name}_matmul_tflops"] = 2 * n**3 / s / 1e12
    numerics.configure(False, False, dev)
    x = torch.empty(size["copy_mib"] * 2**20 // 4, device=dev)
    y = torch.empty_like(x)
    s = seconds_per_call(lambda: y.copy_(x), dev, size["min_s"])
    out["copy_gb_per_s"] = 2 * x.numel() * 4 / s / 1e9
    out["matmul_n"], out["copy_mib"] = n, size["copy_mib"]
    return out


# ---- FLOPs -----------------------------------------------------------------------------------------------------------
def step_flops(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, autocast=contextlib.nullcontext) -> int:
    """FLOPs of one plain training step's forward and backward (cross-entropy) of ``net`` on the batch ``x``,
    counted by torch.utils.flop_counter.FlopCounterMode (matmuls and convolutions; 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        with autocast():
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
    net.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


# ---- instrumentation -------------------------------------------------------------------------------------------------
class Jobs:
    """While active, every executor ``train`` call is recorded: the executor that trained it (a vectorized job that
    falls back to the sequential executor counts as sequential), clients, client-steps, samples and step calls (one
    per step index when vectorized, one per client-step when sequential). Wraps the executor classes' ``train``."""

    def __init__(self):
        self.rows: list[dict] = []
        self._depth: list[dict] = []

    @contextlib.contextmanager
    def active(self):
        from fedbench.engine.executor import SequentialExecutor, VectorizedExecutor

        originals = {cls: cls.train for cls in (SequentialExecutor, VectorizedExecutor)}
        jobs = self

        def wrap(cls):
            orig = originals[cls]

            def train(ex, job, *a, **kw):
                sched = ex._steps_to_train(job)
                row = {
                    "executor": cls.name,
                    "clients": len(sched),
                    "client_steps": sum(len(s) for s in sched),
                    "samples": sum(len(b) for s in sched for b in s),
                    "calls": max((len(s) for s in sched), default=0)
                    if cls is VectorizedExecutor
                    else sum(len(s) for s in sched),
                }
                jobs._depth.append(row)
                try:
                    return orig(ex, job, *a, **kw)
                finally:
                    jobs._depth.pop()
                    if not row.get("fell_back"):
                        jobs.rows.append(row)
                    if jobs._depth:  # a vectorized job handed to the sequential executor
                        jobs._depth[-1]["fell_back"] = True

            return train

        for cls in originals:
            cls.train = wrap(cls)
        try:
            yield self
        finally:
            for cls, f in originals.items():
                cls.train = f

    def take(self) -> dict:
        """The totals since the last take, per executor."""
        rows, self.rows = self.rows, []
        out = {"jobs": len(rows), "by_executor": dict(Counter(r["executor"] for r in rows))}
        for k in ("clients", "client_steps", "samples", "calls"):
            out[k] = sum(r[k] for r in rows)
        return out


class Window:
    """torch.profiler over the first ``calls`` step calls of local training (an executor's ``on_steps`` hook: its
    first call of a job starts the window, the ``calls``-th step call stops it); synchronized at both ends."""

    def __init__(self, ex, dev: torch.device, calls: int):
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        self.prof, self.dev, self.want, self.ex = profile(activities=acts), dev, calls, ex
        self.calls, self.state, self.wall, self.prev = 0, "idle", 0.0, ex.on_steps

    def __call__(self, done: int, planned: int) -> None:
        if self.prev is not None:
            self.prev(done, planned)
        if self.state == "idle" and done == 0:
            gc.sync(self.dev)
            self.prof.start()
            self.state, self.tic = "on", time.perf_counter()
        elif self.state == "on" and done > 0:
            self.calls += 1
            if self.calls >= self.want:
                self.stop()

    def stop(self) -> None:
        if self.state == "on":
            gc.sync(self.dev)
            self.wall = time.perf_counter() - self.tic
            self.prof.stop()
            self.state = "done"

    def __enter__(self):
        self.ex.on_steps = self
        return self

    def __exit__(self, *exc):
        self.stop()
        self.ex.on_steps = self.prev


# aten ops that make views or allocate and launch no kernel: left out of the CPU's count of ops that compute (a
# GPU's count is its kernels)
VIEW_OPS = {
    "aten::" + n
    for n in (
        "view as_strided slice select reshape permute expand unsqueeze squeeze t transpose alias detach _unsafe_view"
        " empty empty_strided empty_like lift_fresh unflatten flatten split chunk narrow unbind movedim _reshape_alias"
        " view_as expand_as resolve_conj resolve_neg result_type to _to_copy contiguous"
    ).split()
}


def profile_summary(prof, calls: int, wall_s: float, dev: torch.device, top: int = 8) -> dict:
    """Per step call: GPU kernel time (CUDA activity events) or, on the CPU, the aten ops' self time; kernels (or
    aten ops) launched; the top ``top`` kernels / ops by time."""
    from torch.autograd import DeviceType

    calls = max(1, calls)
    events = list(prof.events())
    if dev.type == "cuda":
        kern = [e for e in events if e.device_type == DeviceType.CUDA]
        times: Counter = Counter()
        counts: Counter = Counter()
        for e in kern:
            times[e.name] += e.time_range.elapsed_us()
            counts[e.name] += 1
        what = "CUDA kernels"
        compute = sum(counts.values())
    else:
        ops = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
        times, counts = Counter(), Counter()
        for e in ops:
            times[e.name] += e.self_cpu_time_total
            counts[e.name] += 1
        what = "aten ops (CPU self time)"
        compute = sum(c for k, c in counts.items() if k not in VIEW_OPS)
    busy_us = sum(times.values())
    return {
        "what": what,
        "calls": calls,
        "window_wall_s": wall_s,
        "kernel_s_per_call": busy_us / 1e6 / calls,
        "kernels_per_call": sum(counts.values()) / calls,
        "compute_ops_per_call": compute / calls,  # on the CPU: the aten ops less VIEW_OPS; on a GPU: the kernels
        "top": [
            {"name": k[:120], "share": v / max(busy_us, 1e-9), "per_call": counts[k] / calls}
            for k, v in times.most_common(top)
        ],
    }


def bound(busy: float, dev: torch.device) -> str:
    if dev.type != "cuda":
        return "n/a on the CPU"
    return "launch-bound" if busy < 0.5 else "kernel-bound" if busy > 0.8 else "mixed"


# ---- one setting -----------------------------------------------------------------------------------------------------
def measure(dev: torch.device, size: dict, setting: str, arm, variant: list[str], data: str | None) -> dict:
    args = gc.setting_args(setting, arm, data)
    paper = gc.compose(args)
    size_ov = applicable(paper, size["overrides"]) + size.get("extra", {}).get(setting, [])
    E = int(paper.local_epochs)
    ov = [*args, "logger=none", f"hardware.device={dev}", f"local_epochs={min(E, size['epochs'])}"]
    if setting == "ecl":
        ov.append(f"algorithm.phase2_epochs={size['phase2_epochs']}")
    jobs = Jobs()
    if hasattr(torch._C._functorch, "_set_vmap_fallback_warning_enabled"):
        torch._C._functorch._set_vmap_fallback_warning_enabled(True)
    with jobs.active(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = gc.built([*ov, *size_ov, *variant])
        algo, ex = r.algorithm, r.executor
        out = {
            "overrides": [*ov, *size_ov, *variant],
            "executor": ex.name,
            "precision": ex.precision,
            "paper_local_epochs": E,
            "local_epochs": min(E, size["epochs"]),
            "batch_size": int(r.cfg.batch_size),
            "rounds": int(paper.rounds),
            "eval_every": int(paper.eval_every),
        }
        tic = time.perf_counter()
        algo.round(1, r.sample_clients(1))
        r.evaluator(algo, 1)
        gc.sync(dev)
        out["warmup_s"] = time.perf_counter() - tic
        jobs.take()
        clients = r.sample_clients(2)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        train_s = timed(lambda: algo.round(2, clients), dev)
        done = jobs.take()
        out["eval_s"] = timed(lambda: r.evaluator(algo, 2), dev)
        out["peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
        with Window(ex, dev, size["profile_calls"]) as w:
            algo.round(3, r.sample_clients(3))
        jobs.take()
        prof = profile_summary(w.prof, w.calls, w.wall, dev)
        K, B = len(clients), int(r.cfg.batch_size)
        # the same count from the data (every client's training samples, each local epoch): equal to the executors'
        # count for a method that trains each client's data once per epoch (no drop_last, no extra passes)
        out["samples_from_data"] = out["local_epochs"] * sum(len(r.data.train_idx[int(k)]) for k in clients)
        net = copy.deepcopy(algo.fm._net).to(device=dev, dtype=r.data.x.dtype)
        xb, yb = big_batch_data(r, K * B)
        flops_b = step_flops(net, xb[:B], yb[:B], lambda: ex.autocast(dev))
        per_call = train_s / max(1, done["calls"])
        out.update(
            clients_per_round=K,
            jobs=done,
            train_s=train_s,
            sample_grads=done["samples"],
            sample_grads_per_s=done["samples"] / train_s,
            flops_per_sample=flops_b / B,
            wall_s_per_call=per_call,
            profile=prof,
            busy=prof["kernel_s_per_call"] / per_call,
        )
        out["effective_tflops"] = out["flops_per_sample"] * out["sample_grads"] / train_s / 1e12
        out["bound"] = bound(out["busy"], dev)
        out["big_batch"] = big_batch(net, xb, yb, ex, dev, size)
        out["stacked_over_big_batch"] = out["sample_grads_per_s"] / out["big_batch"]["sample_grads_per_s"]
        if setting == "ecl":
            out["phase2"] = ecl_phase2(r, jobs, dev)
    out["warnings"] = [{"message": m[:300], "count": c} for m, c in Counter(str(w.message) for w in caught).items()]
    return out


def applicable(cfg, overrides: list[str]) -> list[str]:
    """The size's overrides of keys the setting's config has (the tiny data's ``partition.min_size`` exists for a
    Dirichlet partition only), and all those under a config group the overrides replace (``dataset=...``)."""
    from omegaconf import OmegaConf

    missing = object()
    keys = [o.split("=")[0] for o in overrides]
    groups = {k for k in keys if "." not in k}
    return [
        o
        for o, k in zip(overrides, keys)
        if k in groups or k.split(".")[0] in groups or OmegaConf.select(cfg, k, default=missing) is not missing
    ]


def big_batch_data(r, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` training samples of the run's data (repeated if it has fewer)."""
    idx = torch.arange(n, device=r.data.x.device) % r.data.x.shape[0]
    return r.data.x[idx], r.data.y[idx]


def big_batch(net, x, y, ex, dev: torch.device, size: dict) -> dict:
    """One model, batch ``len(x)``, a plain loop (forward, cross-entropy, backward, SGD step; the executor's
    autocast): rate, FLOPs, kernel vs wall time per step, peak memory."""
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        with ex.autocast(dev):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    flops = step_flops(net, x, y, lambda: ex.autocast(dev))
    for _ in range(2):
        step()
    gc.sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    steps = size["big_steps"]
    tic = time.perf_counter()
    for _ in range(steps):
        step()
    gc.sync(dev)
    secs = time.perf_counter() - tic
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    calls = min(steps, 5)
    with profile(activities=acts) as prof:
        tic = time.perf_counter()
        for _ in range(calls):
            step()
        gc.sync(dev)
        wall = time.perf_counter() - tic
    summ = profile_summary(prof, calls, wall, dev)
    busy = summ["kernel_s_per_call"] / (secs / steps)
    return {
        "batch": len(x),
        "steps": steps,
        "seconds": secs,
        "flops_per_step": flops,
        "sample_grads_per_s": len(x) * steps / secs,
        "effective_tflops": flops * steps / secs / 1e12,
        "wall_s_per_call": secs / steps,
        "busy": busy,
        "bound": bound(busy, dev),
        "profile": summ,
        "peak_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
    }


def ecl_phase2(r, jobs: Jobs, dev: torch.device) -> dict:
    """ECL's phase II (once per run, after the last round) on the phase-I model: time, the jobs and who trained
    them; then the personalized evaluation (every client's mixture)."""
    algo = r.algorithm
    w, bn = algo.global_model()
    secs = timed(lambda: algo.personalize(3, w, bn), dev)
    done = jobs.take()
    return {
        "seconds": secs,
        "phase2_epochs": int(algo.phase2_epochs),
        "jobs": done,
        "sample_grads_per_s": done["samples"] / secs,
        "eval_s": timed(lambda: r.evaluator(algo, 3), dev),
        "note": "the first phase-II call: its shapes' warm-up (cuDNN benchmark) included",
    }


# ---- main ------------------------------------------------------------------------------------------------------------
def line(label: str, m: dict, peak: dict) -> str:
    bb = m["big_batch"]
    frac = {k: m["effective_tflops"] / peak[f"{k}_matmul_tflops"] for k in ("fp32", "tf32", "bf16")} if peak else {}
    fr = ", ".join(f"{v:.2%} of {k}" for k, v in frac.items())
    s = (
        f"{label}: {m['sample_grads_per_s']:.0f} sample-gradients/s ({m['executor']}: {m['jobs']['by_executor']}, "
        f"{m['jobs']['calls']} step calls, {m['wall_s_per_call'] * 1e3:.2f} ms wall / "
        f"{m['profile']['kernel_s_per_call'] * 1e3:.2f} ms {m['profile']['what']} per call, "
        f"{m['profile']['kernels_per_call']:.0f} per call ({m['profile']['compute_ops_per_call']:.0f} computing): "
        f"busy {m['busy']:.2f}, {m['bound']}); "
        f"{m['flops_per_sample'] / 1e6:.1f} MFLOP/sample -> {m['effective_tflops']:.2f} TFLOP/s {fr}; "
        f"eval {m['eval_s']:.2f} s; peak {m['peak_gib'] or 0:.2f} GiB\n"
        f"    one model at batch {bb['batch']}: {bb['sample_grads_per_s']:.0f} sample-gradients/s, "
        f"{bb['effective_tflops']:.2f} TFLOP/s, {bb['profile']['compute_ops_per_call']:.0f} computing ops or kernels "
        f"per step, busy {bb['busy']:.2f} ({bb['bound']}); "
        f"stacked / one big batch = {m['stacked_over_big_batch']:.3f}\n"
        f"    top: " + "; ".join(f"{t['name'][:60]} {t['share']:.0%}" for t in m["profile"]["top"][:4])
    )
    if "phase2" in m:
        p2 = m["phase2"]
        s += (
            f"\n    ECL phase II ({p2['phase2_epochs']} epoch(s), once per run): {p2['seconds']:.2f} s, "
            f"{p2['jobs']['samples']} samples in {p2['jobs']['jobs']} jobs {p2['jobs']['by_executor']}, "
            f"{p2['sample_grads_per_s']:.0f}/s; personalized evaluation {p2['eval_s']:.2f} s"
        )
    if m["warnings"]:
        s += f"\n    warnings: {len(m['warnings'])} kinds, e.g. {m['warnings'][0]['message'][:160]!r}"
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(f"device_bench_{time.strftime('%Y%m%d-%H%M%S')}"))
    ap.add_argument(
        "--budget", type=float, default=330.0, help="seconds for everything; a part that won't fit: skipped"
    )
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: rehearses this script")
    ap.add_argument("--plan", action="store_true", help="print every part's estimated seconds, run nothing")
    ap.add_argument("--settings", default=None, help=f"comma-separated subset of {','.join(gc.PAPER_SETTINGS)}")
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,... (repeatable)")
    ap.add_argument("--data", default=os.environ.get("FEDBENCH_DATA"), help="folder with cifar10/ and MNIST/")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    settings = None
    if args.settings:
        settings = [s.strip() for s in args.settings.split(",") if s.strip()]
        bad = [s for s in settings if s not in gc.PAPER_SETTINGS]
        if bad:
            raise SystemExit(
                f"device_bench: --settings {args.settings!r}: {bad[0]!r} is none of {list(gc.PAPER_SETTINGS)}"
            )
    if args.budget <= 0:
        raise SystemExit(f"device_bench: --budget {args.budget}: allowed a number of seconds > 0")
    size = SIZES["smoke" if args.cpu_smoke else "gpu"]
    parts = chosen_parts(size, settings, variants)
    rep = BenchReport(None if args.plan else args.out, args.budget)
    rep.say(
        f"fedbench device_bench {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, budget {args.budget:.0f} s"
        + (" (--cpu-smoke: tiny sizes, the numbers say nothing about a GPU)" if args.cpu_smoke else "")
    )
    rep.say("plan (est. device seconds; planned vs taken is reported per part):")
    rep.say(
        f"  peaks: matmul bf16/fp32/TF32 at n={size['matmul_n']}, copy {size['copy_mib']} MiB: {size['peak_est_s']} s"
    )
    for s, arm, v, _, est in parts:
        rep.say(f"  {gc.PAPER_SETTINGS[s][0]} [{arm or 'as is'}] {v}: {est} s")
    total = size["peak_est_s"] + sum(p[-1] for p in parts)
    rep.say(f"  total: est. {total:.0f} s of the budget {args.budget:.0f} s")
    rep.say(f"  the device command: + ~{size['start_est_s']} s before this script starts (kit, data, torch, CUDA)")
    rep.put("plan", "parts", [[s, arm, v, est] for s, arm, v, _, est in parts])
    rep.put("plan", "total_est_s", total)
    if args.plan:
        return 0
    if args.cpu_smoke:
        dev = torch.device("cpu")
    elif not torch.cuda.is_available():
        rep.check("a CUDA device", False, f"torch {torch.__version__}, CUDA build {torch.version.cuda}")
        return 3
    else:
        dev = torch.device("cuda")
    data = args.data if args.data and Path(args.data, "cifar10").is_dir() else None
    if data is None and not args.cpu_smoke:
        size = {**size, "overrides": [*size["overrides"], "dataset=synthetic", "dataset.shape=[3,32,32]"]}
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    rep.say(f"device {name}, torch {torch.__version__}; data: {data}")
    rep.put("env", "torch", torch.__version__)
    rep.put("env", "device", name)
    peak = {}
    with rep.section("peaks", "matmul bf16 / fp32 / TF32, copy bandwidth", size["peak_est_s"]):
        peak = peaks(dev, size)
        rep.put("peaks", "measured", peak)
        rep.say(", ".join(f"{k} {v:.4g}" for k, v in peak.items()))
    for s, arm, v, ov, est in parts:
        title = f"{gc.PAPER_SETTINGS[s][0]} [{arm or 'as is'}] {v}"
        if rep.left() < est:
            rep.say(f"\n== {title}: SKIPPED, {rep.left():.0f} s left for an est. {est} s")
            rep.put("skipped", title, {"left_s": round(rep.left(), 1), "est_s": est})
            continue
        with rep.section(title, " ".join(ov), est):
            m = measure(dev, size, s, arm, ov, data)
            if dev.type == "cuda":  # the run's memory, gone with measure's frame, back to the device
                torch.cuda.empty_cache()
            if peak:
                m["fraction_of_peak"] = {
                    **{k: m["effective_tflops"] / peak[f"{k}_matmul_tflops"] for k in ("fp32", "tf32", "bf16")},
                    "big_batch_fp32": m["big_batch"]["effective_tflops"] / peak["fp32_matmul_tflops"],
                }
            rep.put("settings", title, m)
            rep.say(line(title, m, peak))
    failed = rep.data["failed"]
    rep.say(f"\n{len(failed)} part(s) failed; {rep.elapsed():.0f} s; files in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
