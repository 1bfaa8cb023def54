#!/usr/bin/env python
"""Executor benchmark: whole FedAvg rounds, equal-size and uneven clients, and a clients sweep.

Workloads (``--workloads``):
  equal      20 clients x 480 training images (FedReMa's by-s partition, 600/client split 80/20), batch 100, 5 local
             epochs, the FedAvg CIFAR CNN; real CIFAR-10 when the shared data folder is present, synthetic 3x32x32
             otherwise (issue "foundation" item 12).
  dir0.1     the same clients, model and total number of images (600 per client, 80 % train), split by a
  dir0.5     Dirichlet(alpha) label skew: client sizes differ ~10x, so batches and step counts are ragged (the
             vectorized executor pads and masks them; one batched call per local step index). Synthetic 3x32x32.
  pfl_cifar10  pfl-research's CIFAR-10 benchmark (+experiment=peers/pfl_cifar10): 1,000 clients x 50 images, the 50
             sampled each round train 5 steps of batch 10, model pfl_cnn; the global model evaluated every 10 rounds
             (its time amortised: s/round = training + evaluation / 10). --clients/--epochs/--batch-size/--model do
             not apply. Real CIFAR-10 when present, synthetic otherwise. scripts/peers/pfl_cifar10.py runs
             pfl-research itself beside it.
Whole rounds count: local training, aggregation and evaluation (personalized + global test set). Every measurement
runs in its own process (so its peak memory is its own).

Prints seconds/round, sample-gradients/s, peak memory, the vectorized/sequential ratio per workload, and the fraction
of the machine's fp32 matmul bound reached (model FLOPs counted with torch.utils.flop_counter; the peak is measured
in this process: once at the start, and again right before and after every timed round, because a shared VM's
throughput drifts by +-20 % within minutes). ``--clients-sweep 10,20,50,100,200`` adds s/round, sample-gradients/s and
peak memory against the number of clients for both executors, printed and plotted (``--plot``). Same script on a GPU:
``--device cuda`` (``--tf32 off,on`` reports both).

    python scripts/bench.py                                   # both executors, equal clients, on the CPU
    python scripts/bench.py --workloads equal,dir0.1,dir0.5   # and the uneven workloads
    python scripts/bench.py --clients-sweep 10,20,50,100,200 --epochs 1 --rounds 1 --plot bench-clients.png
    python scripts/bench.py --device cuda --tf32 off,on       # on a GPU
    python scripts/bench.py --executors sequential@1,sequential   # one client at a time vs parallel workers
    python scripts/bench.py --calls dir0.1 --clients 100 --batch-size 128 --epochs 10   # batched calls per round only
    python scripts/bench.py --executors sequential --nproc 1,2   # one run over 2 processes (torchrun, gloo) vs 1

``--nproc 1,2``: each measurement also with its clients split over N processes (``torchrun``, fedbench/distributed.py;
gloo on the CPU, every process one thread when N > 1 — torchrun's OMP_NUM_THREADS=1 — against 1 process on all of the
machine's threads); prints the N-process / 1-process time ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PER_CLIENT = 600  # images per client before the 80/20 train/test split, in every workload


def compose_cfg(overrides: list[str]):
    """fedbench's config with these overrides (Hydra imported here, so that importing this module needs only torch:
    scripts/gpu_speed.py reuses its functions)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def matmul_peak(device: torch.device, n: int = 2048, reps: int = 10, trials: int = 3, warmup: int = 3) -> float:
    """Measured fp32 matmul FLOP/s (the machine's practical bound): the best of ``trials`` timings."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    for _ in range(warmup):
        a @ b
    best = 0.0
    for _ in range(trials):
        if device.type == "cuda":
            torch.cuda.synchronize()
        tic = time.perf_counter()
        for _ in range(reps):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - tic))
    return best


def timed(fn, device: torch.device, peak_n: int = 2048) -> tuple[float, float]:
    """(seconds for ``fn()``, the matmul peak measured right before and after it, averaged)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    around = dict(n=peak_n, trials=1, warmup=1)
    before = matmul_peak(device, **around)
    sync()
    tic = time.perf_counter()
    fn()
    sync()
    seconds = time.perf_counter() - tic
    return seconds, (before + matmul_peak(device, **around)) / 2


def flops_per_sample(net, shape, device, train: bool) -> float:
    x = torch.randn(100, *shape, device=device)
    y = torch.randint(0, 10, (100,), device=device)
    with FlopCounterMode(display=False) as fc:
        if train:
            torch.nn.functional.cross_entropy(net(x), y).backward()
        else:
            with torch.no_grad():
                net(x)
    net.zero_grad(set_to_none=True)
    return fc.get_total_flops() / 100


def workload_overrides(
    name: str, clients: int, data_root: str | None, shape: str = "3,32,32", test_per_class: int = 1000
) -> list[str]:
    """Config overrides of a workload (module docstring)."""
    synthetic = ["dataset=synthetic", f"dataset.shape=[{shape}]", f"dataset.test_per_class={test_per_class}"]
    if name == "equal":
        part = ["partition=dominant_groups", f"partition.samples_per_client={PER_CLIENT}"]
        if data_root and clients * PER_CLIENT <= 50000:
            return part + ["dataset=cifar10", f"dataset.root={data_root}"]
        return part + synthetic + [f"dataset.train_per_class={math.ceil(clients * PER_CLIENT / 10)}"]
    if name.startswith("dir"):
        return (
            ["partition=dirichlet", f"partition.alpha={float(name[3:])}", "partition.min_size=10"]
            + synthetic
            + [f"dataset.train_per_class={math.ceil(clients * PER_CLIENT / 10)}"]
        )
    raise SystemExit(f"bench.py: unknown workload {name!r} (equal, dir<alpha> e.g. dir0.1)")


def measure(spec: dict) -> dict:
    """One (workload, executor, clients, tf32) measurement, in this process (``--worker``)."""
    from fedbench.run import Run

    executor, _, workers = spec["executor"].partition("@")  # e.g. sequential@1: one client at a time
    sampled = spec["workload"] == "pfl_cifar10"  # a fraction of the clients per round, evaluation every eval_every
    if sampled:
        shape = ["+experiment=peers/pfl_cifar10"] + (
            [f"data_root={spec['data']}"]
            if spec["data"]
            else [
                "dataset=synthetic",
                "dataset.shape=[3,32,32]",
                "dataset.train_per_class=5000",
                f"dataset.test_per_class={spec['test_per_class']}",
            ]  # fmt: skip
        )
    else:
        shape = [
            f"clients={spec['clients']}",
            f"model={spec['model']}",
            f"local_epochs={spec['epochs']}",
            f"batch_size={spec['batch_size']}",
            "lr=0.01",
            *workload_overrides(spec["workload"], spec["clients"], spec["data"], spec["shape"], spec["test_per_class"]),
        ]
    overrides = [
        "logger=none",
        f"hardware.device={spec['device']}",
        f"hardware.executor={executor}",
        f"hardware.workers={workers or 'auto'}",
        f"hardware.precision={spec['precision']}",
        f"hardware.tf32={str(spec['tf32']).lower()}",
        f"hardware.max_memory={spec.get('max_memory') or 'null'}",
        f"hardware.channels_last={spec['channels_last']}",
        *shape,
    ]
    cfg = compose_cfg(overrides)
    run = Run(cfg, tempfile.mkdtemp(prefix="fedbench-bench-"))
    if spec.get("nproc", 1) > 1:  # started by torchrun (in_worker): the run's clients split over its processes
        from fedbench import distributed

        run.world = distributed.join(cfg.hardware)
    run.setup()
    algo, dev = run.algorithm, run.device
    every = int(cfg.eval_every) if sampled else 1

    def clients(t: int) -> torch.Tensor:
        return run.sample_clients(t) if sampled else torch.arange(run.data.num_clients)

    algo.round(0, clients(0))  # warm-up
    run.evaluator(algo, 0)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if sampled:  # training rounds and evaluations timed apart; an evaluation counts 1/eval_every per round
        train = [timed(lambda: algo.round(t, clients(t)), dev, spec["peak_n"]) for t in range(1, spec["rounds"] + 1)]
        ev = min(timed(lambda: run.evaluator(algo, t), dev, spec["peak_n"])[0] for t in range(2))
        rounds = [(s + ev / every, p) for s, p in train]
    else:
        rounds = [
            timed(lambda: (algo.round(t, clients(t)), run.evaluator(algo, t)), dev, spec["peak_n"])
            for t in range(1, spec["rounds"] + 1)
        ]
    peak = (
        torch.cuda.max_memory_allocated(dev)
        if dev.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    times = [s for s, _ in rounds]
    epochs, batch = int(cfg.local_epochs), int(cfg.batch_size)
    sizes = [len(run.data.train_idx[int(k)]) for k in clients(1)]
    n_train = sum(sizes)
    steps = [epochs * math.ceil(n / batch) for n in sizes]
    clean = clean_loop(run, spec) if spec["clean"] and not sampled and spec.get("nproc", 1) == 1 else None
    n_eval = (  # the test samples one evaluation scores: the clients' own splits and the global test set, as configured
        sum(len(run.data.test_idx[k]) for k in range(run.data.num_clients)) * bool(cfg.eval.personalized)
        + len(run.data.global_test_idx) * bool(cfg.eval.global_model)
    )
    net, shape = run.fm.net, run.data.input_shape
    train_flops = n_train * epochs * flops_per_sample(net, shape, dev, True)
    work = train_flops + n_eval * flops_per_sample(net, shape, dev, False) / every
    s = min(times)
    if not run.world.leader:
        return None  # rank 0 reports
    return {
        **spec,
        "clients": len(sizes),
        "s_per_round": s,
        "median_s": sorted(times)[len(times) // 2],
        "samples_per_s": n_train * epochs / s,
        "flops_per_s": work / s,
        "fractions": sorted(work / t / p for t, p in rounds),
        "peak_bytes": int(peak),
        "client_steps": sum(steps),
        "longest": max(steps),
        "sizes": [min(sizes), max(sizes)],
        "clean_s": None if clean is None else min(t for t, _ in clean),
        "clean_fractions": None if clean is None else sorted(train_flops / t / p for t, p in clean),
    }


def clean_loop(run, spec) -> list[tuple[float, float]]:
    """Reference: the same clients' local training as a plain loop (nn.Module + torch.optim.SGD, model and inputs
    in channels_last unless --channels-last false, the same batches), training only — what a hand-written
    sequential loop reaches on this machine. Two timings, each with the peak measured around it."""
    from fedbench.engine.schedule import make_schedule

    data = run.data
    ids = list(range(data.num_clients))
    sched = make_schedule(
        [data.train_idx[k] for k in ids], ids, spec["batch_size"], 0, "train", 1, epochs=spec["epochs"]
    )
    net = copy.deepcopy(run.fm.net)
    fmt = torch.channels_last if spec["channels_last"] == "true" else torch.contiguous_format
    net = net.to(memory_format=fmt)
    dev = data.x.device

    def train_all():
        for m in ids:
            net.load_state_dict({**run.initial_params, **run.initial_buffers})
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            for idx in sched[m]:
                idx = idx.to(dev)
                x = data.x.index_select(0, idx).contiguous(memory_format=fmt)
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(net(x), data.y.index_select(0, idx)).backward()
                opt.step()

    return [timed(train_all, run.device, spec["peak_n"]) for _ in range(2)]


def count_calls(args) -> None:
    """Batched calls per round of the vectorized executor on a workload's real partition and schedule (no training):
    one per local step index, against the per-size grouping it replaced (one call per distinct batch size per step).
    Dirichlet workloads split the whole CIFAR-10 training set (its labels, or synthetic ones with CIFAR-10's class
    counts when the data folder is absent)."""
    from fedbench import seeding
    from fedbench.data.partitions import make_partition
    from fedbench.engine.schedule import make_schedule

    data = None if args.synthetic else find_data()
    ov = workload_overrides(args.calls, args.clients, data)
    if args.calls.startswith("dir"):  # the whole training set, as a paper's Dirichlet split
        ov = [o for o in ov if not o.startswith("dataset")] + (
            ["dataset=cifar10", f"dataset.root={data}"]
            if data
            else [
                "dataset=synthetic",
                "dataset.shape=[3,32,32]",
                "dataset.train_per_class=5000",
                "dataset.test_per_class=1000",
            ]
        )
    cfg = compose_cfg([f"clients={args.clients}", *ov])
    from fedbench.data.datasets import load_dataset

    ds = load_dataset(cfg.dataset, cache_dir=cfg.cache_dir)
    part = make_partition(
        cfg.partition,
        ds.y.numpy(),
        ds.n_train,
        ds.num_classes,
        args.clients,
        seeding.rng(int(cfg.partition.seed), "partition"),
    )
    sched = make_schedule(part.train, list(range(args.clients)), args.batch_size, 0, "train", 1, epochs=args.epochs)
    steps = [len(s) for s in sched]
    grouped = sum(len({len(s[t]) for s in sched if t < len(s)}) for t in range(max(steps)))
    print(
        f"{args.calls}, {args.clients} clients ({min(map(len, part.train))}–{max(map(len, part.train))} training "
        f"images each), B={args.batch_size}, E={args.epochs}: {sum(steps)} client-steps per round; vectorized calls "
        f"per round: {max(steps)} (one per local step index; the per-size grouping made {grouped})"
    )


def find_data() -> str | None:
    for p in ([Path(os.environ["FEDBENCH_DATA"])] if os.environ.get("FEDBENCH_DATA") else []) + [
        REPO.parent / "shared" / "data"
    ]:
        if (p / "cifar10").exists():
            return str(p.resolve())
    return None


def in_worker(spec: dict) -> dict:
    """``measure(spec)`` in a fresh process (its peak memory is its own), or ``spec["nproc"]`` processes (torchrun)."""
    n = spec.get("nproc", 1)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]  # a free port
    launch = [sys.executable] if n == 1 else launch
    p = subprocess.run([*launch, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(
            f"bench.py: the measurement {spec['workload']}/{spec['executor']}/{spec['clients']} clients "
            f"failed:\n{p.stderr[-3000:]}"
        )
    return json.loads(p.stdout.strip().splitlines()[-1])


def label(r: dict, tf32s: list) -> str:
    procs = f" x{r['nproc']} processes" if r.get("nproc", 1) > 1 else ""
    return r["executor"] + procs + (f" tf32={'on' if r['tf32'] else 'off'}" if len(tf32s) > 1 else "")


def report(r: dict, peak: float, name: str) -> None:
    print(
        f"{name:>22}: {r['s_per_round']:.2f} s/round (median {r['median_s']:.2f}), "
        f"{r['samples_per_s']:.0f} sample-gradients/s, {r['flops_per_s'] / 1e9:.1f} GFLOP/s, "
        f"fraction of FLOP bound {r['flops_per_s'] / peak:.2f}, peak memory {r['peak_bytes'] / 2**20:.0f} MiB"
    )
    f = r["fractions"]
    print(
        f"{'':>22}  per round, against the peak measured right before and after it: median "
        f"{f[len(f) // 2]:.2f} (range {f[0]:.2f}–{f[-1]:.2f})"
    )
    if r["clean_s"]:
        c = r["clean_fractions"]
        print(
            f"{'':>22}  reference plain loop (training only): {r['clean_s']:.2f} s, "
            f"fraction of FLOP bound against the peak around it {c[-1]:.2f} (range {c[0]:.2f}–{c[-1]:.2f})"
        )


def sweep(args, base: dict, executors: list[str]) -> list[dict]:
    """s/round, sample-gradients/s and peak memory against the number of clients, for every executor."""
    out = []
    for n in [int(c) for c in args.clients_sweep.split(",")]:
        for ex in executors:
            out.append(
                in_worker(
                    {
                        **base,
                        "executor": ex,
                        "clients": n,
                        "workload": args.sweep_workload,
                        "clean": False,
                        "data": None,
                    }
                )
            )  # synthetic at every size (CIFAR-10 has 50k images)
    print(
        f"clients sweep (workload {args.sweep_workload}, synthetic {args.shape}, {args.epochs} local epochs, "
        f"batch {args.batch_size}, "
        f"{args.rounds} timed round(s) each; peak memory: "
        f"{'allocated on the GPU' if args.device.startswith('cuda') else 'process RSS'}):"
    )
    print(f"{'clients':>8} {'executor':>14} {'s/round':>9} {'sample-grad/s':>14} {'peak MiB':>9} {'calls/round':>12}")
    for r in out:
        calls = r["longest"] if r["executor"] == "vectorized" else r["client_steps"]
        print(
            f"{r['clients']:>8} {r['executor']:>14} {r['s_per_round']:>9.2f} {r['samples_per_s']:>14.0f} "
            f"{r['peak_bytes'] / 2**20:>9.0f} {calls:>12}"
        )
    if args.plot:
        plot(out, executors, Path(args.plot), f"{args.sweep_workload} workload, {args.device}")
        print(f"plot: {args.plot}")
    return out


def plot(rows: list[dict], executors: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, key, name, scale in zip(
        axes,
        ("s_per_round", "samples_per_s", "peak_bytes"),
        ("seconds per round", "sample-gradients / s", "peak memory (MiB)"),
        (1, 1, 2**-20),
    ):
        for ex in executors:
            pts = [(r["clients"], r[key] * scale) for r in rows if r["executor"] == ex]
            ax.plot(*zip(*pts), marker="o", label=ex)
        ax.set_xscale("log")
        ax.set_xlabel("clients")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--executors", default="sequential,vectorized")
    ap.add_argument(
        "--workloads", default="equal", help="comma-separated: equal, dir0.1, dir0.5 (Dirichlet alpha), pfl_cifar10"
    )
    ap.add_argument("--clients-sweep", dest="clients_sweep", default=None, help="e.g. 10,20,50,100,200")
    ap.add_argument("--sweep-workload", dest="sweep_workload", default="equal")
    ap.add_argument("--plot", default=None, help="where to draw the clients sweep (PNG)")
    ap.add_argument("--json", default=None, help="write every measurement to this file")
    ap.add_argument("--channels-last", dest="channels_last", default="true", choices=["true", "false"])
    ap.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "bf16"],
        help="bf16: autocast (the fraction is still of the fp32 matmul bound)",
    )
    ap.add_argument("--tf32", default="off", help="off, on, or off,on (both); GPU only")
    ap.add_argument("--synthetic", action="store_true", help="ignore the shared data folder")
    ap.add_argument("--no-clean", dest="clean", action="store_false", help="skip the plain-loop reference")
    ap.add_argument("--batch-size", dest="batch_size", type=int, default=100)
    ap.add_argument("--model", default="cnn", help="conf/model option (the FedAvg CIFAR CNN by default)")
    ap.add_argument("--shape", default="3,32,32", help="synthetic image shape")
    ap.add_argument(
        "--test-per-class", dest="test_per_class", type=int, default=1000, help="synthetic test images per class"
    )
    ap.add_argument(
        "--calls",
        default=None,
        help="only count the vectorized executor's batched calls per round on this workload (e.g. dir0.1), no training",
    )
    ap.add_argument(
        "--max-memory",
        dest="max_memory",
        default=None,
        help="hardware.max_memory for the vectorized executor (bytes or a fraction; default: no budget)",
    )
    ap.add_argument(
        "--peak-size",
        dest="peak_n",
        type=int,
        default=2048,
        help="n of the n x n fp32 matmuls that measure the machine's peak (smaller: cheaper, lower peak)",
    )
    ap.add_argument("--nproc", default="1", help="e.g. 1,2: also split each run over N processes (torchrun, gloo)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        r = measure(json.loads(args.worker))
        if r is not None:
            print(json.dumps(r))
        return
    if args.calls:
        count_calls(args)
        return
    data = None if args.synthetic else find_data()
    device = torch.device(args.device)
    tf32s = [t == "on" for t in args.tf32.split(",")]
    peak = matmul_peak(device, n=args.peak_n)
    print(
        f"device={device}{' ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else ''} "
        f"threads={torch.get_num_threads()} precision={args.precision} channels_last={args.channels_last} "
        f"tf32={args.tf32} data={'CIFAR-10 ' + data if data else 'synthetic'} (uneven workloads: synthetic)"
    )
    print(f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    base = {
        "device": args.device,
        "rounds": args.rounds,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "model": args.model,
        "shape": args.shape,
        "test_per_class": args.test_per_class,
        "precision": args.precision,
        "max_memory": args.max_memory,
        "peak_n": args.peak_n,
        "channels_last": args.channels_last,
        "data": data,
        "clean": args.clean,
    }
    executors = args.executors.split(",")
    nprocs = [int(n) for n in args.nproc.split(",")]
    res = []
    for workload in args.workloads.split(","):
        got = {}
        for tf32 in tf32s:
            for ex in executors:
                for n in nprocs:
                    spec = {**base, "executor": ex, "tf32": tf32, "clients": args.clients, "workload": workload}
                    r = in_worker({**spec, "nproc": n})
                    got[label(r, tf32s)] = r
                    res.append(r)
                    report(r, peak, f"{workload} {label(r, tf32s)}")
                for n in nprocs[1:]:
                    one, many = got[label({**r, "nproc": nprocs[0]}, tf32s)], got[label({**r, "nproc": n}, tf32s)]
                    print(
                        f"{workload}: {ex} {n} processes / {nprocs[0]} time ratio: "
                        f"{many['s_per_round'] / one['s_per_round']:.2f} (speed-up "
                        f"{one['s_per_round'] / many['s_per_round']:.2f}x)"
                    )
        any_r = next(iter(got.values()))
        print(
            f"{'':>22}  {workload}: client sizes {any_r['sizes'][0]}–{any_r['sizes'][1]}, {any_r['client_steps']} "
            f"client-steps/round; vectorized calls/round {any_r['longest']} (one per local step index)"
        )
        for tf in tf32s:
            suffix = f" tf32={'on' if tf else 'off'}" if len(tf32s) > 1 else ""
            if f"sequential{suffix}" in got and f"sequential@1{suffix}" in got:
                print(
                    f"{workload}: sequential@1/sequential (parallel client workers) time ratio{suffix}: "
                    f"{got[f'sequential@1{suffix}']['s_per_round'] / got[f'sequential{suffix}']['s_per_round']:.2f}"
                )
            if f"sequential{suffix}" in got and f"vectorized{suffix}" in got:
                print(
                    f"{workload}: vectorized/sequential time ratio{suffix}: "
                    f"{got[f'vectorized{suffix}']['s_per_round'] / got[f'sequential{suffix}']['s_per_round']:.2f}"
                )
    if args.clients_sweep:
        res += sweep(args, {**base, "tf32": tf32s[0]}, executors)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
