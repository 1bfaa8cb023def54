#!/usr/bin/env python
"""Executor benchmark: whole FedAvg rounds on a 20-client CIFAR-sized workload.

Workload (issue "foundation" item 12): 20 clients x 480 training images (FedReMa's by-s partition,
600/client split 80/20), batch 100, 5 local epochs, the FedAvg CIFAR CNN; real CIFAR-10 when
the shared data folder is present, synthetic 3x32x32 otherwise. Whole rounds count: local
training, aggregation and evaluation (personalized + global test set).

Prints seconds/round, sample-gradients/s, the vectorized/sequential ratio, and the fraction of the
machine's fp32 matmul bound reached (model FLOPs counted with torch.utils.flop_counter; the peak is
measured in this process: once at the start, and again right before and after every timed round, because a
shared VM's throughput drifts by +-20 % within minutes). Same script on a GPU: ``--device cuda``.

    python scripts/bench.py                 # both executors on the CPU
    python scripts/bench.py --device cuda   # on a GPU
    python scripts/bench.py --executors sequential@1,sequential   # one client at a time vs parallel workers
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


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
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - tic))
    return best


def timed(fn, device: torch.device) -> tuple[float, float]:
    """(seconds for ``fn()``, the matmul peak measured right before and after it, averaged)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    around = dict(trials=1, warmup=1)
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


def bench(executor: str, args, data_root: Path | None) -> dict:
    from fedbench.run import Run

    executor, _, workers = executor.partition("@")   # e.g. sequential@1: one client at a time
    overrides = ["logger=none", f"hardware.device={args.device}", f"hardware.executor={executor}",
                 f"hardware.workers={workers or 'auto'}", f"hardware.precision={args.precision}",
                 "partition=dominant_groups", "partition.samples_per_client=600", f"clients={args.clients}", "model=cnn",
                 f"local_epochs={args.epochs}", "batch_size=100", "lr=0.01", f"hardware.channels_last={args.channels_last}"]
    if data_root:
        overrides += ["dataset=cifar10", f"dataset.root={data_root}"]
    else:
        overrides += ["dataset=synthetic", "dataset.shape=[3,32,32]", "dataset.train_per_class=6000", "dataset.test_per_class=1000"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    run = Run(cfg, tempfile.mkdtemp(prefix="fedbench-bench-"))
    run.setup()
    algo, dev = run.algorithm, run.device
    clients = torch.arange(run.data.num_clients)
    algo.round(0, clients)  # warm-up
    run.evaluator(algo, 0)
    rounds = [timed(lambda: (algo.round(t, clients), run.evaluator(algo, t)), dev) for t in range(1, args.rounds + 1)]
    times = [s for s, _ in rounds]
    n_train = sum(len(run.data.train_idx[k]) for k in range(run.data.num_clients))
    clean = clean_loop(run, args) if args.clean and dev.type == "cpu" else None
    n_eval = sum(len(run.data.test_idx[k]) for k in range(run.data.num_clients)) + len(run.data.global_test_idx)
    net = run.fm.net
    shape = run.data.input_shape
    work = (n_train * args.epochs * flops_per_sample(net, shape, dev, True) + n_eval * flops_per_sample(net, shape, dev, False))
    s = min(times)
    train_flops = n_train * args.epochs * flops_per_sample(net, shape, dev, True)
    return {"s_per_round": s, "median_s": sorted(times)[len(times) // 2], "samples_per_s": n_train * args.epochs / s,
            "flops_per_round": work, "flops_per_s": work / s, "fractions": sorted(work / t / p for t, p in rounds),
            "clean_s": None if clean is None else min(t for t, _ in clean),
            "clean_fractions": None if clean is None else sorted(train_flops / t / p for t, p in clean)}


def clean_loop(run, args) -> list[tuple[float, float]]:
    """Reference: the same clients' local training as a plain loop (nn.Module + torch.optim.SGD, model and inputs
    in channels_last unless --channels-last false, the same batches), training only — what a hand-written
    sequential loop reaches on this machine. Two timings, each with the peak measured around it."""
    from fedbench.engine.schedule import make_schedule

    data = run.data
    ids = list(range(data.num_clients))
    sched = make_schedule([data.train_idx[k] for k in ids], ids, 100, 0, "train", 1, epochs=args.epochs)
    net = copy.deepcopy(run.fm.net)
    fmt = torch.channels_last if args.channels_last == "true" else torch.contiguous_format
    net = net.to(memory_format=fmt)

    def train_all():
        for m in ids:
            net.load_state_dict({**run.initial_params, **run.initial_buffers})
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            for idx in sched[m]:
                x = data.x.index_select(0, idx).contiguous(memory_format=fmt)
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(net(x), data.y.index_select(0, idx)).backward()
                opt.step()

    return [timed(train_all, run.device) for _ in range(2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--executors", default="sequential,vectorized")
    ap.add_argument("--channels-last", dest="channels_last", default="true", choices=["true", "false"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: autocast (the fraction is still of the fp32 matmul bound)")
    ap.add_argument("--synthetic", action="store_true", help="ignore the shared data folder")
    ap.add_argument("--no-clean", dest="clean", action="store_false", help="skip the plain-loop reference")
    args = ap.parse_args()
    data = None
    if not args.synthetic:
        for p in ([Path(os.environ["FEDBENCH_DATA"])] if os.environ.get("FEDBENCH_DATA") else []) + [REPO.parent / "shared" / "data"]:
            if (p / "cifar10").exists():
                data = p
                break
    device = torch.device(args.device)
    peak = matmul_peak(device)
    print(f"device={device} threads={torch.get_num_threads()} precision={args.precision} "
          f"data={'CIFAR-10 ' + str(data) if data else 'synthetic'}")
    print(f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    res = {}
    for ex in args.executors.split(","):
        r = bench(ex, args, data)
        res[ex] = r
        print(f"{ex:>12}: {r['s_per_round']:.2f} s/round (median {r['median_s']:.2f}), "
              f"{r['samples_per_s']:.0f} sample-gradients/s, {r['flops_per_s'] / 1e9:.1f} GFLOP/s, "
              f"fraction of FLOP bound {r['flops_per_s'] / peak:.2f}")
        f = r["fractions"]
        print(f"{'':>12}  per round, against the peak measured right before and after it: median "
              f"{f[len(f) // 2]:.2f} (range {f[0]:.2f}–{f[-1]:.2f})")
        if r["clean_s"]:
            c = r["clean_fractions"]
            print(f"{'':>12}  reference plain loop (training only): {r['clean_s']:.2f} s, "
                  f"fraction of FLOP bound against the peak around it {c[-1]:.2f} (range {c[0]:.2f}–{c[-1]:.2f})")
    if "sequential" in res and "sequential@1" in res:
        print(f"sequential@1/sequential (parallel client workers) time ratio: "
              f"{res['sequential@1']['s_per_round'] / res['sequential']['s_per_round']:.2f}")
    if "sequential" in res and "vectorized" in res:
        print(f"vectorized/sequential time ratio: {res['vectorized']['s_per_round'] / res['sequential']['s_per_round']:.2f}")


if __name__ == "__main__":
    main()
