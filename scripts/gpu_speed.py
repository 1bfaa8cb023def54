"""Sections 4-5 of the first-GPU check (scripts/gpu_check.py): the time a round takes on the device — the seed papers'
paper-scale settings (``PAPER_SETTINGS``, one definition that scripts/device_bench.py reads too; a warm-up round, one
timed round, a paper-scale run extrapolated from it) and the clients sweep (vectorized s/round for a growing number
of clients; one run in 1 vs 2 processes)."""

from __future__ import annotations

import math
import time

import torch
from gpu_report import Report
from gpu_runs import built, compose, sync

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
    numerics = [  # on the CPU (--cpu-smoke, the only CPU mode) TF32 and bf16 rehearse the code, not the device
        ("fp32", ["hardware.precision=fp32", "hardware.tf32=false"]),
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
