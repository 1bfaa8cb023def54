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

Exit code: 0 if every check passed, 1 if one failed, 3 without a usable GPU (not in --cpu-smoke mode).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
from device_pack import pack_finished  # noqa: E402  (claims.tar.gz: one definition, with device_claims.py)

# Assumed cost of one vectorized client-step on an H100 (ms, at the workload's batch) and of building a run (s): only
# for the plan printed at the start; the report prints planned vs taken per section so the next plan can use the truth.
ASSUMED_MS = {"mlp": 0.3, "tiny_cnn": 0.5, "cnn": 1.0, "tcnn": 2.0, "alexnet": 2.0, "resnet32": 8.0, "resnet50": 40.0}
ASSUMED_SETUP_S = 2.0

# The seed papers' paper-scale settings (the claims files' paper scale), ONE definition for section 4 here and for
# scripts/device_bench.py: key -> (label, claims file (None: ``experiment`` is a plain Hydra experiment), experiment,
# arms (the values of the experiment's sweep that name a method; None: the experiment as it is)).
PAPER_SETTINGS = {
    "fedka": ("FedKA Table 1, CIFAR-10, t-CNN", "fedka", "table1", ("fedavg", "fedka_0.01")),
    "fedrema": ("FedReMa Table 1, CIFAR-10, AlexNet", "fedrema", "table1", ("fedavg", "fedrema")),
    "ecl": ("ECL Table 1, CIFAR-10-LT, ResNet-32", "ecl", "table1", ("ecl",)),
    "fedcom": ("FedCOM Table 1, MNIST, LeNet", "fedcom", "table1", ("fedavg", "fedcom")),
    "cafeme": ("CAFeMe Table 1, RMNIST shards", "cafeme", "table1", ("fedavg", "cafeme")),
    "pfl": ("pfl-research CIFAR-10 benchmark shape", None, "peers/pfl_cifar10", (None,)),
}
# Tiny synthetic data in place of a setting's own (--cpu-smoke; the settings without the data on a GPU)
SMOKE_DATA = [
    "dataset=synthetic",
    "dataset.shape=[3,32,32]",
    "dataset.train_per_class=12",
    "dataset.test_per_class=3",
    "clients=3",
    "partition.min_size=2",
    "lr=0.01",  # on 36 synthetic images some settings blow up (ECL's loss reaches 5e3 in round 2); speed
    "divergence.factor=null",  # does not depend on it: stop only on non-finite values
]

SIZES = {
    "gpu": {
        "eq_rounds": 2,
        "eq_cases": 4,
        # (label, paper, experiment, arms; the first arm also with TF32 and bf16 if `all numerics`; est. s per build =
        # 2 rounds x batched calls per round (E x the longest client's steps) x an assumed ms per call + evaluation)
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

EQ_CASES = [  # the methods whose client state makes the executors' bookkeeping differ most
    ("fedavg tiny_cnn (BatchNorm)", ["algorithm=fedavg", "model=tiny_cnn"]),
    ("scaffold", ["algorithm=scaffold", "model=tiny_cnn"]),
    (
        "fedrod, persistent optimizer state",
        ["algorithm=fedrod", "model=tiny_cnn", "algorithm.head_scope=head", "optim.persistent_state=true"],
    ),
    ("ditto", ["algorithm=ditto", "model=tiny_cnn"]),
]
# lr 0.01: at digits' default 0.05 about 4 % of input draws put one fp32 run (either executor) on the other side of a
# max-pool/ReLU near-tie, ~1e-2 away; at 0.01 no such draw in 30 (fedbench/engine/agreement.py's measurements)
EQ_BASE = ["logger=none", "clients=6", "participation=0.67", "lr=0.01"]
# fp32 vs the fp64 answer: vectorized within 10x the sequential one's distance (the tests use 3 on one known draw;
# over random draws 5 % exceed 7.8, and a bug is orders of magnitude away): one GPU window has no room for a rerun
FP32_FACTOR = 10.0


class Report:
    """Lines to the console and report.txt as they come; measurements to bench.json after each one."""

    json_name = "bench.json"

    def __init__(self, out: Path, budget: float):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.txt = (out / "report.txt").open("a", buffering=1)
        self.data: dict = {"sections": {}, "failed": []}
        self.t0, self.budget = time.monotonic(), budget

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.txt.write(line + "\n")

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        if not ok:
            self.data["failed"].append(name)
        self.say(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}")
        self.save()
        return ok

    def put(self, section: str, key: str, value) -> None:
        self.data["sections"].setdefault(section, {})[key] = value
        self.save()

    def save(self) -> None:
        tmp = self.out / f"{self.json_name}.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.out / self.json_name)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed()

    @contextlib.contextmanager
    def section(self, title: str, planned: str, est_s: float):
        """A section: its plan first; an exception is a FAIL with its traceback's tail, and the next section runs."""
        self.say("")
        self.say(f"== {title}  [planned: {planned}; est. {est_s:.0f} s; {self.elapsed():.0f} s elapsed]")
        tic = time.monotonic()
        try:
            yield
        except Exception as e:  # noqa: BLE001  (a section's failure is reported, the others still run)
            tail = "".join(traceback.format_exception(e)[-6:]).rstrip()
            self.check(f"{title}: completed", False, f"{type(e).__name__}: {e}\n{tail}")
        took = time.monotonic() - tic
        self.say(f"-- {title}: took {took:.1f} s (est. {est_s:.0f} s)")
        self.put("time", title, {"est_s": round(est_s, 1), "took_s": round(took, 1)})


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose

    from fedbench.claims.spec import hydra_context

    with hydra_context():
        return hydra_compose("config", overrides=overrides)


def make_run(overrides: list[str]):
    from fedbench.run import Run

    return Run(compose(overrides), tempfile.mkdtemp(prefix="fedbench-gpucheck-"))


def built(overrides: list[str]):
    """A run set up for rounds driven here (not by Run.execute): its components and its loggers (an algorithm may
    publish a picture, as ECL does)."""
    from fedbench.loggers import build_loggers

    r = make_run(overrides)
    r.setup()
    r.loggers = build_loggers(r.cfg, r.run_dir, "gpu_check")
    return r


# ---- 1. env ---------------------------------------------------------------------------------------------------
def env(rep: Report, dev: torch.device) -> None:
    from importlib import metadata

    from fedbench.engine import numerics

    versions = {n: metadata.version(n) for n in ("torch", "hydra-core", "omegaconf", "numpy")}
    rep.say(f"python {sys.version.split()[0]}; {', '.join(f'{k} {v}' for k, v in versions.items())}")
    rep.say(f"CUDA build {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, fedbench from {REPO}")
    info = {"python": sys.version.split()[0], **versions, "cuda": torch.version.cuda}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        info.update(gpu=p.name, memory_gib=round(p.total_memory / 2**30, 1), cc=f"{p.major}.{p.minor}")
        rep.say(f"{dev}: {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
    rep.put("env", "versions", info)
    for tf32, det in ((False, False), (True, False), (False, True)):
        numerics.configure(tf32, det, dev)
        flags = numerics.tf32_flags()  # must not raise under either setting (torch >= 2.9's TF32 API)
        bench = torch.backends.cudnn.benchmark
        rep.say(f"hardware.tf32={tf32} deterministic={det}: {flags}, cudnn.benchmark={bench}")
        rep.put("env", f"flags tf32={tf32} deterministic={det}", {**flags, "cudnn.benchmark": bench})
        if dev.type == "cuda":
            rep.check(f"cudnn.benchmark follows hardware.deterministic={det}", bench == (not det))
    numerics.configure(False, False, dev)
    torch.use_deterministic_algorithms(False)


# ---- 2. equality ------------------------------------------------------------------------------------------------
def fast_paths(rep: Report, dev: torch.device) -> None:
    """The vectorized step's fast paths (hardware.cuda_graphs, hardware.compile; docs/fast_paths.md) against the eager
    step: CUDA-graph replay and the compiled step, fp64 and fp32, on the GPU; off it, the graphs' code path without
    the capture call, fp64 only (compiling takes minutes on a CPU)."""
    from fedbench.engine.fastcheck import device_check

    cuda = dev.type == "cuda"
    got = device_check(str(dev), compile=cuda, precisions=("fp64", "fp32") if cuda else ("fp64",))
    for case, r in got["cases"].items():
        rep.put("fast_paths", case, r)
        detail = r.get("error") or ", ".join(f"{k} {v:.2g}" for k, v in r.items() if isinstance(v, float))
        rep.check(f"fast path == eager step on {dev}: {case}", r["ok"], detail)


def equality(rep: Report, dev: torch.device, size: dict) -> None:
    from fedbench.engine.agreement import fp32_agreement, max_diff

    rounds = f"rounds={size['eq_rounds']}"

    def state(*ov):
        r = make_run([*EQ_BASE, rounds, *ov])
        summary = r.execute()
        return r.algorithm.state_dict(), summary

    for name, ov in EQ_CASES[: size["eq_cases"]]:
        runs = {
            (p, ex): state(
                *ov,
                f"hardware.device={dev}",
                f"hardware.precision={p}",
                "hardware.tf32=false",
                f"hardware.executor={ex}",
            )
            for p in ("fp64", "fp32")
            for ex in ("sequential", "vectorized")
        }
        ref = runs["fp64", "sequential"][0]
        scale = max_diff(ref, _zeros_like(ref))
        d64 = max_diff(ref, runs["fp64", "vectorized"][0])
        rep.put("equality", f"{name} fp64", d64)
        rep.check(
            f"sequential == vectorized on {dev}, fp64, {name}",
            d64 <= 1e-9 * max(1.0, scale),
            f"max |difference| {d64:.2e} (allowed 1e-9 x state scale {scale:.2g})",
        )
        ok, text = fp32_agreement(runs["fp32", "sequential"][0], runs["fp32", "vectorized"][0], ref, FP32_FACTOR)
        rep.put("equality", f"{name} fp32", text)
        rep.check(f"sequential == vectorized on {dev}, fp32 (TF32 off) against the fp64 answer, {name}", ok, text)
    fast_paths(rep, dev)
    if dev.type != "cuda":
        rep.say("(the same run on the CPU and on CUDA: skipped, no GPU here)")
        return
    base = [*EQ_BASE, rounds, *EQ_CASES[0][1], "hardware.precision=fp64"]
    cpu = state(*base, "hardware.device=cpu", "hardware.executor=sequential")[0]
    scale = max_diff(cpu, _zeros_like(cpu))
    for ex in ("sequential", "vectorized"):
        d = max_diff(cpu, state(*base, f"hardware.device={dev}", f"hardware.executor={ex}")[0])
        rep.put("equality", f"cpu fp64 vs {dev} {ex}", d)
        rep.check(
            f"fp64: CPU sequential == {dev} {ex}",
            d <= 1e-9 * max(1.0, scale),
            f"max |difference| {d:.2e} (allowed 1e-9 x state scale {scale:.2g})",
        )


def _zeros_like(state):
    if torch.is_tensor(state):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: _zeros_like(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_zeros_like(v) for v in state)
    return state


# ---- 3. syncs ---------------------------------------------------------------------------------------------------
def syncs(rep: Report, dev: torch.device) -> None:
    from fedbench.engine.syncs import HostSyncCounter

    r = built(
        [
            *EQ_BASE,
            "hardware.executor=vectorized",
            f"hardware.device={dev}",
            "model=tiny_cnn",
            "partition.alpha=0.3",
            "dataset.augment={crop_padding: 1, hflip: true}",
        ]
    )
    counter, cuda = HostSyncCounter(), dev.type == "cuda"

    @contextlib.contextmanager
    def loop():  # entered by the executor around every step loop
        with counter:
            if cuda:
                torch.cuda.set_sync_debug_mode("error")  # a synchronizing call raises, naming itself
            try:
                yield
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)

    r.executor.loop_mode = loop
    try:
        r.algorithm.round(1, torch.arange(r.data.num_clients))
        raised = None
    except RuntimeError as e:
        raised = str(e).splitlines()[0]
    rep.put("syncs", "counter", dict(counter.calls))
    rep.check(
        "host reads inside the vectorized step loop (fedbench's counter)",
        counter.count == 0,
        f"count {counter.count} {dict(counter.calls)}",
    )
    if cuda:
        rep.check(
            "no synchronizing CUDA call inside the step loop (set_sync_debug_mode('error'))",
            raised is None,
            raised or "none raised",
        )
    elif raised:
        raise RuntimeError(raised)
    reads = HostSyncCounter()
    with reads:
        r.evaluator(r.algorithm, 1)
    rep.put("syncs", "evaluation host reads", dict(reads.calls))
    rep.say(f"host reads in one evaluation of {r.data.num_clients} clients: {reads.count} {dict(reads.calls)}")


# ---- 4. the papers' settings ------------------------------------------------------------------------------------
def paper_job(paper: str, exp_name: str, scale: str, arm: str | None, seed: int | None = None):
    """(experiment, job) of a claims file's experiment at a scale: the job whose swept values name ``arm`` (any arm
    when None) and ``seed`` (the scale's first when None)."""
    from fedbench.claims.spec import load

    exp = load(paper).experiments[exp_name][scale]
    jobs, _ = exp.jobs()
    seed = exp.scale.seeds[0] if seed is None else seed
    for job in jobs:
        if int(job["seed"]) == seed and (arm is None or arm in {str(job.get(k.lstrip("+~"))) for k in exp.sweep}):
            return exp, job
    raise LookupError(f"{paper} {exp_name} {scale}: no job with arm {arm} and seed {seed}")


def setting_args(setting: str, arm: str | None, data: str | None = None) -> list[str]:
    """The fedbench overrides of a PAPER_SETTINGS entry's arm at paper scale (its first seed), with ``data``."""
    _, paper, exp_name, _ = PAPER_SETTINGS[setting]
    if paper is None:
        args = [f"+experiment={exp_name}"]
    else:
        exp, job = paper_job(paper, exp_name, "paper", arm)
        args = list(exp.job_args(job))
    return args + ([f"data_root={data}"] if data else [])


def time_rounds(r, dev: torch.device) -> dict:
    """A warm-up round (cuDNN benchmarks its shapes), then one timed round: training and evaluation apart."""
    algo, clients = r.algorithm, r.sample_clients(1)
    tic = time.perf_counter()
    algo.round(1, clients)
    r.evaluator(algo, 1)
    sync(dev)
    warm = time.perf_counter() - tic
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    tic = time.perf_counter()
    algo.round(2, r.sample_clients(2))
    sync(dev)
    train = time.perf_counter() - tic
    tic = time.perf_counter()
    r.evaluator(algo, 2)
    sync(dev)
    evaluation = time.perf_counter() - tic
    E = int(r.cfg.local_epochs)
    samples = E * sum(len(r.data.train_idx[int(k)]) for k in clients)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
    return {
        "warmup_s": warm,
        "train_s": train,
        "eval_s": evaluation,
        "sample_grads": samples,
        "sample_grads_per_s": samples / train,
        "peak_gib": peak,
    }


def paper_run_seconds(cfg, m: dict) -> float:
    """A whole run of this config from one timed round: training every round, evaluation every eval_every."""
    rounds, every = int(cfg.rounds), max(1, int(cfg.eval_every))
    return rounds * m["train_s"] + math.ceil(rounds / every) * m["eval_s"]


def measure_job(dev: torch.device, exp, job: dict, data: str | None, extra: list[str] = ()) -> dict:
    """Two rounds of a claims experiment's job (time_rounds), and the time a whole run of it would take. The run is
    built with its own number of rounds, so that the timed round 2 is an ordinary one: built with ``rounds=2`` it
    was the last, where ECL's phase II (once per run: all K clients' calibrated models and experts,
    algorithms/oneshot.py) and its personalized evaluation ran inside the timed round — the 2026-11-26 H200 run's
    37 s "round" and 310-min paper run (docs/gpu.md)."""
    args = [*exp.job_args(job), *([f"data_root={data}"] if data else [])]
    r = built([*args, "logger=none", f"hardware.device={dev}", *extra])
    m = time_rounds(r, dev)
    full = compose(args)
    m.update(paper_run_s=paper_run_seconds(full, m), rounds=int(full.rounds))
    del r
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return m


def settings(rep: Report, dev: torch.device, size: dict, data: str | None, estimates: dict) -> None:
    numerics = [("fp32", ["hardware.precision=fp32", "hardware.tf32=false"])]
    if dev.type == "cuda" or size is SIZES["smoke"]:
        numerics += [
            ("fp32+TF32", ["hardware.precision=fp32", "hardware.tf32=true"]),
            ("bf16", ["hardware.precision=bf16"]),
        ]
    for setting, all_numerics, _ in size["settings"]:
        label, paper, exp_name, arms = PAPER_SETTINGS[setting]
        for i, arm in enumerate(arms[: size.get("setting_arms")]):
            for name, nov in numerics if i == 0 and all_numerics else numerics[:1]:
                key = f"{label} [{arm or 'first arm'}] {name}"
                try:
                    exp, job = paper_job(paper, exp_name, "paper", arm)
                    m = measure_job(dev, exp, job, data, [*nov, *size["setting_overrides"]])
                except Exception as e:  # noqa: BLE001  (one setting's failure; the others are still measured)
                    rep.check(f"{key}: measured", False, f"{type(e).__name__}: {str(e).splitlines()[0]}")
                    continue
                rep.put("settings", key, m)
                rep.say(
                    f"{key}: {m['train_s']:.2f} s training + {m['eval_s']:.2f} s evaluation per round "
                    f"(warm-up round {m['warmup_s']:.1f} s), {m['sample_grads_per_s']:.0f} sample-gradients/s, "
                    f"peak {m['peak_gib']:.1f} GiB; a paper-scale run ({m['rounds']} rounds): "
                    f"~{m['paper_run_s'] / 60:.1f} min"
                )
                if name == "fp32" and not size["setting_overrides"]:  # the claim runs' own numerics and data
                    estimates[(paper, exp_name, arm)] = m


# ---- 5. clients sweep -------------------------------------------------------------------------------------------
def clients_sweep(rep: Report, dev: torch.device, size: dict) -> None:
    import bench

    model, shape, batch, per = size["sweep_model"]
    rows = []
    plan = [(n, "vectorized") for n in size["sweep"]] + [(size["sweep"][0], "sequential")]
    for n, ex in plan:
        ov = [
            "logger=none",
            f"hardware.device={dev}",
            f"hardware.executor={ex}",
            f"clients={n}",
            f"model={model}",
            "local_epochs=1",
            f"batch_size={batch}",
            "lr=0.01",
            "eval.global_model=false",
            "partition=iid",  # equal clients: `per` training images each (80 % of their share; 20 % their test split)
            "dataset=synthetic",
            f"dataset.shape=[{shape}]",
            f"dataset.train_per_class={math.ceil(n * per / 0.8 / 10)}",
            "dataset.test_per_class=2",
        ]
        r = built(ov)
        m = time_rounds(r, dev)
        row = {
            "clients": n,
            "executor": ex,
            "s_per_round": m["train_s"],
            "samples_per_s": m["sample_grads_per_s"],
            "peak_bytes": 0 if math.isnan(m["peak_gib"]) else m["peak_gib"] * 2**30,
        }
        rows.append(row)
        rep.put("clients", f"{n} {ex}", m)
        rep.say(
            f"{n:>4} clients {ex:>10}: {m['train_s']:.3f} s/round training, {m['sample_grads_per_s']:.0f} "
            f"sample-gradients/s, peak {m['peak_gib']:.2f} GiB"
        )
        del r
    vec = {r["clients"]: r["s_per_round"] for r in rows if r["executor"] == "vectorized"}
    lo, hi = size["sweep"][0], 100 if 100 in vec else size["sweep"][-1]
    ratio = vec[hi] / vec[lo]
    rep.put("clients", "ratio", {"clients": [lo, hi], "ratio": ratio})
    what = f"goal: {hi} clients per round at <= 2x the cost of {lo} (vectorized, training)"
    detail = f"ratio {ratio:.2f} ({vec[hi]:.3f} s vs {vec[lo]:.3f} s)"
    if dev.type == "cuda":
        rep.check(what, ratio <= 2.0, detail)
    else:  # milliseconds of tiny CPU rounds: noise, not a verdict
        rep.say(f"(not judged on the CPU) {what}: {detail}")
    bench.plot(rows, ["vectorized", "sequential"], rep.out / "clients.png", f"clients sweep, {model}, {dev}")
    processes(rep, dev, size)


def processes(rep: Report, dev: torch.device, size: dict) -> None:
    """One run split over 2 processes on this one device (torchrun; they share the GPU, so gloo: docs/distributed.md)
    against 1 process: bench.py's equal workload at the sweep's second size, vectorized, whole rounds (training and
    evaluation). Reported, not judged: the README asks for this row (issue 33)."""
    import bench

    model, shape, batch, _ = size["sweep_model"]
    n = size["sweep"][1]
    spec = {
        **dict(device=str(dev), rounds=2, epochs=1, batch_size=batch, model=model, shape=shape, test_per_class=2),
        **dict(precision="fp32", max_memory=None, peak_n=256, channels_last="false", data=None, clean=False),
        **dict(executor="vectorized", tf32=False, clients=n, workload="equal"),
    }
    got = {}
    for nproc in (1, 2):
        try:
            r = bench.in_worker({**spec, "nproc": nproc})
        except SystemExit as e:  # bench's one line naming the failed measurement
            rep.check(f"one run over {nproc} process(es) on {dev}", False, str(e)[-2000:])
            return
        got[nproc] = r["s_per_round"]
        rep.say(f"{n} clients vectorized, {nproc} process(es) on {dev}: {r['s_per_round']:.3f} s/round (whole rounds)")
    ratio = got[2] / got[1]
    rep.put("clients", "processes", {"clients": n, "model": model, "s_per_round": got, "ratio": ratio})
    rep.say(f"(not judged) one run over 2 processes on one {dev.type} device / 1 process: time ratio {ratio:.2f}")


# ---- 6. memory (one process per measurement) --------------------------------------------------------------------
def memory_worker(spec: dict) -> dict:
    """One ResNet-50 round in this process: ``budget`` 'none' | 'two_chunks' | 'overflow'."""
    from fedbench.engine.executor import LocalJob, VectorizedExecutor

    dev = torch.device(spec["device"])
    m = spec["memory"]
    clients = m["clients"]
    if spec["budget"] == "overflow":  # sized from a probe so that all clients at once need ~1.5x the device
        clients = spec["overflow_clients"]
    ov = [
        "logger=none",
        f"hardware.device={dev}",
        "hardware.executor=vectorized",
        f"model={m['model']}",
        f"clients={clients}",
        f"batch_size={m['batch']}",
        "local_epochs=1",
        "rounds=1",
        "participation=1.0",
        "partition=iid",
        "dataset=synthetic",
        "dataset.shape=[3,32,32]",
        f"dataset.train_per_class={math.ceil(clients * m['per_client'] / 10)}",
        "dataset.test_per_class=2",
        "eval.personalized=false",
    ] + (["model.cifar_stem=true"] if m["model"] == "resnet50" else [])
    r = built(ov)
    ex = r.executor
    assert isinstance(ex, VectorizedExecutor)
    entered, jobs = [0], []
    orig_train = ex.train

    def train(job: LocalJob):
        jobs.append(job)
        if spec["budget"] == "two_chunks":  # a budget that holds about half of the clients' working memory
            ex.max_memory = None
            per = ex.client_step_bytes(job)
            ex.max_memory = ex.bytes_in_use(job) + per * math.ceil(len(job.schedule) / 2)
            out = {"per_client_step": per, "budget": ex.max_memory}
            spec.setdefault("found", {}).update(out)
        return orig_train(job)

    @contextlib.contextmanager
    def loop():
        entered[0] += 1
        yield

    ex.train, ex.loop_mode = train, loop
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r.algorithm.round(1, torch.arange(r.data.num_clients))
    sync(dev)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    per = ex.client_step_bytes(jobs[0]) if jobs else 0
    return {
        "clients": clients,
        "calls": entered[0],
        "peak_bytes": peak,
        "per_client_step": per,
        **spec.get("found", {}),
    }


def memory(rep: Report, dev: torch.device, size: dict, oom_clients: int | None = None) -> None:
    def worker(budget: str, **extra) -> dict:
        spec = {"device": str(dev), "memory": size["memory"], "budget": budget, **extra}
        p = subprocess.run(
            [sys.executable, __file__, "--memory-worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=max(30, rep.left()),
        )
        if p.returncode:
            raise RuntimeError(f"memory worker ({budget}) exit {p.returncode}: {p.stderr[-1500:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])

    m = size["memory"]
    what = f"{m['model']} {m['clients']} clients x batch {m['batch']}"
    if oom_clients and dev.type == "cuda":  # --oom-clients N: the out-of-memory case alone, N clients
        return overflow(rep, m, worker, oom_clients)
    a = worker("none")
    rep.put("memory", "unbudgeted", a)
    rep.say(
        f"{what}, no budget: peak {a['peak_bytes'] / 2**30:.1f} GiB in {a['calls']} call(s); probe: "
        f"{a['per_client_step'] / 2**30:.2f} GiB per client-step"
    )
    b = worker("two_chunks")
    rep.put("memory", "two_chunks", b)
    rep.check(
        f"{what}: a budget for half the clients trains them in >= 2 chunks",
        b["calls"] >= 2,
        f"{b['calls']} calls, budget {b.get('budget', 0) / 2**30:.2f} GiB",
    )
    if dev.type == "cuda":
        rep.check(
            f"{what}: the peak stays within the budget",
            b["peak_bytes"] <= b["budget"],
            f"peak {b['peak_bytes'] / 2**30:.2f} GiB, budget {b['budget'] / 2**30:.2f} GiB",
        )
    if not m["oom_case"] or dev.type != "cuda":
        rep.say("(the out-of-memory halving: GPU only)")
        return
    # The probe over-counts a client's marginal memory on a GPU (first H200 run: probe 10.4 GiB per ResNet-50
    # client-step; the peak grew 2.9 GiB per client from 10 to 21 clients, and 21 clients fitted in 126 GiB), so
    # 3x the device by the probe is what makes ~1.5x in fact.
    total = torch.cuda.get_device_properties(dev).total_memory
    overflow(rep, m, worker, max(m["clients"] + 1, math.ceil(3 * total / max(1, a["per_client_step"]))))


def overflow(rep: Report, m: dict, worker, n: int) -> None:
    c = worker("overflow", overflow_clients=n)
    rep.put("memory", "overflow", c)
    rep.check(
        f"{m['model']} {n} clients (more than the device holds): the out-of-memory halving finishes the round",
        c["calls"] >= 2,
        f"{c['calls']} calls, peak {c['peak_bytes'] / 2**30:.1f} GiB",
    )


# ---- 7. claims with the time left -------------------------------------------------------------------------------
def claims(rep: Report, dev: torch.device, size: dict, data: str | None, estimates: dict, work: Path) -> None:
    from fedbench.claims.results import LAUNCHES, RunSet, sweep_dir
    from fedbench.claims.runner import commit, machine
    from fedbench.claims.spec import load

    scale = size["claims_scale"]
    root = work / "claims"
    archive = rep.out / "claims.tar.gz"
    margin = 20.0  # seconds kept for the archive and the report
    done = []
    for paper, exp_name, arms in size["claims"]:
        pc = load(paper)
        seeds = pc.experiments[exp_name][scale].scale.seeds[: size.get("claims_seeds")]
        for seed in seeds:
            pair = [paper_job(paper, exp_name, scale, arm, seed) for arm in arms]
            est = 0.0
            for arm, (exp, job) in zip(arms, pair):  # from section 4, else measured now (2 rounds)
                if (paper, exp_name, arm) not in estimates:
                    estimates[paper, exp_name, arm] = m = measure_job(dev, exp, job, data)
                    rep.put("claims", f"{paper} {exp_name} {arm} probe", m)
                est += 1.3 * estimates[paper, exp_name, arm]["paper_run_s"] + 15
            if est > rep.left() - margin:
                rep.say(
                    f"{paper} {exp_name} seed {seed} ({' vs '.join(arms)}): est. {est / 60:.1f} min, "
                    f"{max(0, rep.left() - margin) / 60:.1f} min left: not started"
                )
                break
            for arm, (exp, job) in zip(arms, pair):
                sweep = sweep_dir(root, scale, paper)
                sweep.mkdir(parents=True, exist_ok=True)
                args = ["-m", *exp.job_args(job), "logger=none", f"hydra.sweep.dir={sweep}"]
                args += [f"data_root={data}"] if data else []
                tic, started = time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
                try:
                    code = subprocess.run(
                        [sys.executable, "-m", "fedbench.cli", *args],
                        timeout=rep.left() - margin,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    ).returncode
                except subprocess.TimeoutExpired:
                    code = "timeout"
                seconds = time.perf_counter() - tic
                with (sweep / LAUNCHES).open("a") as f:
                    f.write(
                        json.dumps(
                            {
                                "experiment": exp_name,
                                "scale": scale,
                                "started": started,
                                "seconds": round(seconds, 1),
                                "exit": code,
                                "runs": 1,
                                "command": "fedbench " + " ".join(args),
                                "invoked": "scripts/gpu_check.py",
                                "commit": commit(),
                                "machine": machine(),
                            }
                        )
                        + "\n"
                    )
                rep.put("claims", f"{paper} {exp_name} {arm} seed {seed}", {"seconds": seconds, "exit": code})
                rep.say(f"{paper} {exp_name} {arm} seed {seed}: exit {code} after {seconds:.0f} s")
                if code == 0:
                    done.append((paper, exp_name))
                pack_finished(root, archive)
    if not done:
        rep.say("no claim run finished")
        return
    with tempfile.TemporaryDirectory() as back:  # read the archive back as fedbench-claims will here
        with tarfile.open(archive) as tar:
            tar.extractall(back, filter="data")
        for paper, exp_name in dict.fromkeys(done):
            pc = load(paper)
            runs = RunSet(pc, scale, Path(back) / "claims").runs(pc.experiments[exp_name][scale])
            n = sum(r.status == "complete" for r in runs)
            rep.check(
                f"{pc.paper} {exp_name}: the archive reads back with fedbench-claims",
                n > 0,
                f"{n} of {len(runs)} runs complete",
            )


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
    ap.add_argument("--memory-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_worker:
        print(json.dumps(memory_worker(json.loads(args.memory_worker))))
        return 0
    rep = Report(args.out, args.budget)
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
