#!/usr/bin/env python
"""The checks scripts/gpu_check.sh runs on the first GPU (each prints PASS/FAIL lines; exit 1 if any failed).

    python scripts/gpu_check.py env                        # device, memory, TF32/cuDNN flags
    python scripts/gpu_check.py equality --device cuda     # sequential == vectorized (fp64; fp32 with TF32 off)
    python scripts/gpu_check.py cpu-vs-cuda                # the same fp64 run on the CPU and on the GPU
    python scripts/gpu_check.py syncs --device cuda        # host syncs inside a vectorized round's step loop
    python scripts/gpu_check.py memory --device cuda       # peak memory of ResNet-50, 10 clients x batch 128

``--quick`` shrinks every run (the CPU smoke test of the script uses it).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
FAILED: list[str] = []

# (name, overrides): the methods whose client state makes the two executors' bookkeeping differ most
CASES = [
    ("fedavg tiny_cnn (BN)", ["algorithm=fedavg", "model=tiny_cnn"]),
    ("fedavg mlp", ["algorithm=fedavg", "model=mlp"]),
    ("scaffold", ["algorithm=scaffold", "model=tiny_cnn"]),
    (
        "fedrod persistent state",
        ["algorithm=fedrod", "model=tiny_cnn", "algorithm.head_scope=head", "optim.persistent_state=true"],
    ),
    ("ditto", ["algorithm=ditto", "model=tiny_cnn"]),
]


def cfg_of(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=["logger=none", "clients=6", "participation=0.67", "rounds=3", *overrides])


def run(*overrides: str):
    from fedbench.run import Run

    r = Run(cfg_of(*overrides), tempfile.mkdtemp(prefix="fedbench-gpucheck-"))
    summary = r.execute()
    return summary, r


def state_diff(a, b) -> float:
    """max |a - b| over every tensor of two algorithm states (nested dicts/lists of tensors)."""
    if torch.is_tensor(a):
        return (a.detach().double().cpu() - b.detach().double().cpu()).abs().max().item() if a.numel() else 0.0
    if isinstance(a, dict):
        return max((state_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        return max((state_diff(x, y) for x, y in zip(a, b)), default=0.0)
    return 0.0


def verdict(name: str, value: float, allowed: float, extra: str = "", what: str = "max |difference|") -> None:
    ok = value <= allowed
    if not ok:
        FAILED.append(name)
    shown = f"{value:.2e}" if isinstance(value, float) else str(value)
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {what} {shown} (allowed {allowed:g}){extra}", flush=True)


def compare(name: str, a, b, tol: float) -> None:
    (sa, ra), (sb, rb) = a, b
    d_state = state_diff(ra.algorithm.state_dict(), rb.algorithm.state_dict())
    d_metric = max(abs(sa["metrics"][k]["last"] - sb["metrics"][k]["last"]) for k in sa["metrics"])
    verdict(name, d_state, tol, f"; metrics {d_metric:.2e}")


def cmd_env(args) -> None:
    from fedbench.engine import numerics

    print(
        f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA build {torch.version.cuda}, "
        f"cuDNN {torch.backends.cudnn.version()}"
    )
    if not torch.cuda.is_available():
        print(
            f"no CUDA device: torch.cuda.is_available() is False (TF32 flags as torch starts: {numerics.tf32_flags()})"
        )
        return
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
    print(f"TF32 as torch starts: {numerics.tf32_flags()}")
    numerics.configure(False, False, torch.device("cuda"))
    print(
        f"TF32 under hardware.tf32=false (fedbench's default): {numerics.tf32_flags()}; "
        f"cudnn.benchmark={torch.backends.cudnn.benchmark}"
    )
    numerics.configure(True, True, torch.device("cuda"))
    print(
        f"TF32 under hardware.tf32=true: {numerics.tf32_flags()}; hardware.deterministic=true: "
        f"deterministic={torch.are_deterministic_algorithms_enabled()}, cudnn.deterministic="
        f"{torch.backends.cudnn.deterministic}, CUBLAS_WORKSPACE_CONFIG set by setup"
    )


def cmd_equality(args) -> None:
    rounds = ["rounds=1"] if args.quick else []
    cases = CASES[:1] if args.quick else CASES
    for precision, tol in (("fp64", 1e-9), ("fp32", 1e-5)):
        for name, ov in cases:
            base = [
                f"hardware.device={args.device}",
                f"hardware.precision={precision}",
                "hardware.tf32=false",
                *ov,
                *rounds,
            ]
            got = [run(*base, f"hardware.executor={ex}") for ex in ("sequential", "vectorized")]
            compare(f"sequential == vectorized on {args.device}, {precision}, {name}", *got, tol)


def cmd_cpu_vs_cuda(args) -> None:
    base = ["hardware.precision=fp64", "hardware.executor=sequential", "algorithm=fedavg", "model=tiny_cnn"]
    a, b = run(*base, "hardware.device=cpu"), run(*base, "hardware.device=cuda")
    compare("the same fp64 run on the CPU and on CUDA (sequential)", a, b, 1e-9)
    a, b = (
        run(*base, "hardware.device=cpu"),
        run(*base[:1], "hardware.executor=vectorized", *base[2:], "hardware.device=cuda"),
    )
    compare("fp64: CPU sequential vs CUDA vectorized", a, b, 1e-9)


def cmd_syncs(args) -> None:
    """Host reads inside a vectorized round's step loop: fedbench's counter, and on CUDA torch's own sync debug mode."""
    from fedbench.engine.syncs import HostSyncCounter
    from fedbench.run import Run

    ov = [
        "hardware.executor=vectorized",
        f"hardware.device={args.device}",
        "model=tiny_cnn",
        "clients=6",
        "partition.alpha=0.3",
        "dataset.augment={crop_padding: 1, hflip: true}",
    ]
    r = Run(cfg_of(*ov), tempfile.mkdtemp(prefix="fedbench-gpucheck-"))
    r.setup()
    counter, caught, cuda = HostSyncCounter(), [], args.device.startswith("cuda")

    @contextlib.contextmanager
    def loop():  # entered by the executor around every step loop
        with counter, warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
                caught.extend(w for w in seen if "synchroniz" in str(w.message).lower())

    r.executor.loop_mode = loop
    r.algorithm.round(1, torch.arange(6))
    verdict(
        "host reads inside the vectorized step loop (fedbench's counter)",
        counter.count,
        0,
        f" {dict(counter.calls)}",
        what="count",
    )
    if cuda:
        verdict(
            "synchronizing CUDA calls inside the step loop (torch.cuda.set_sync_debug_mode)",
            len(caught),
            0,
            "".join(f"\n      {w.filename}:{w.lineno}: {w.message}" for w in caught[:5]),
            what="count",
        )


def cmd_memory(args) -> None:
    """Peak GPU memory of a FedAvg round of ResNet-50 (torchvision stem and CIFAR stem), 10 clients x batch 128,
    vectorized; with and without hardware.max_memory=0.9 (chunks)."""
    from fedbench.run import Run

    per_class = (10, 2) if args.quick else (1000, 100)  # --quick: 100 images in all (a smoke test of this code)
    data = (
        [f"dataset.root={args.data}", "dataset=cifar10"]
        if args.data and not args.quick
        else [
            "dataset=synthetic",
            "dataset.shape=[3,32,32]",
            f"dataset.train_per_class={per_class[0]}",
            f"dataset.test_per_class={per_class[1]}",
        ]
    )
    model = (
        ["model=tiny_cnn", "clients=2", "batch_size=8"]
        if args.quick
        else ["model=resnet50", "clients=10", "batch_size=128"]
    )
    for stem in ([] if args.quick else ["false", "true"]) or [None]:
        for budget in ("null", "0.9"):
            ov = [
                *data,
                *model,
                "partition=iid",
                "local_epochs=1",
                "rounds=1",
                "participation=1.0",
                "hardware.executor=vectorized",
                f"hardware.device={args.device}",
                f"hardware.max_memory={budget}",
                *([f"model.cifar_stem={stem}"] if stem else []),
            ]
            r = Run(cfg_of(*ov), tempfile.mkdtemp(prefix="fedbench-gpucheck-"))
            r.setup()
            cuda = r.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(r.device)
            r.algorithm.round(1, torch.arange(r.data.num_clients))
            peak = torch.cuda.max_memory_allocated(r.device) / 2**30 if cuda else float("nan")
            print(
                f"{' '.join(model)} cifar_stem={stem} max_memory={budget}: peak allocated {peak:.1f} GiB"
                f"{'' if cuda else ' (CPU: not measured)'}",
                flush=True,
            )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["env", "equality", "cpu-vs-cuda", "syncs", "memory"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data", default=None, help="folder with cifar10/ (memory check); synthetic otherwise")
    args = ap.parse_args()
    {
        "env": cmd_env,
        "equality": cmd_equality,
        "cpu-vs-cuda": cmd_cpu_vs_cuda,
        "syncs": cmd_syncs,
        "memory": cmd_memory,
    }[args.check](args)
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {'; '.join(FAILED)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
