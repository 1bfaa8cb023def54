#!/usr/bin/env python
"""fedbench vs PFLlib (TsingZ0/PFLlib, FedReMa's code base) on the equal 20 x 480 CNN workload of scripts/bench.py.

The workload: 20 clients x 480 CIFAR-10 training images (fedbench's ``dominant_groups`` partition, 600 per client split
80/20), FedAvg, 5 local epochs of plain SGD (lr 0.01, no momentum: PFLlib's ``clientAVG``) at batch 100, the last
incomplete batch dropped (PFLlib's DataLoader; ``drop_last=true`` in fedbench: 4 steps per epoch in both), the FedAvg
CIFAR CNN (``model=cnn`` = PFLlib's ``FedAvgCNN(in_features=3, dim=1600)``). Both sides get, per round:

* the same decoded, normalised pixels of the same clients: fedbench's data pipeline builds them and writes them as
  PFLlib's per-client ``dataset/<name>/train/<id>.npz`` files, which PFLlib's own ``read_client_data`` loads (each
  ``client.train()`` reloads them and makes its DataLoader, as PFLlib does every round);
* the same initial weights (fedbench's, copied into ``FedAvgCNN``), the same threads, each side in its own process,
  A/B alternated (pair i: fedbench first when i is even).

Timed per round: every client's local training plus the FedAvg average (fedbench: ``algorithm.round``; PFLlib: its
clients' ``set_parameters`` + ``train()`` and the sample-weighted average of ``serveravg.aggregate_parameters``);
evaluation is left out (PFLlib evaluates per client with sklearn's AUC; not the comparison here). Round 1 is warm-up.
Prints s/round, sample-gradients/s and the ratio, and both global models' accuracy on the 10k test images after the
last round (the same plain evaluation for both: they must agree within seed noise).

PFLlib is not on PyPI: point ``--pfllib`` at a checkout (``git clone https://github.com/TsingZ0/PFLlib``); its
``system/`` folder is imported as is (it needs ``scikit-learn``, which fedbench's test extra has).

    python scripts/peers/pfllib_equal.py --pfllib ../PFLlib --data-root ../shared/data --rounds 4 --pairs 2
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[2]
CLIENTS, EPOCHS, BATCH, LR = 20, 5, 100, 0.01


def build(data_root: str, seed: int):
    """fedbench's run of the workload, set up (data, partition, model, FedAvg), and its config."""
    sys.path.insert(0, str(REPO / "scripts"))
    from bench import compose_cfg, workload_overrides

    from fedbench.run import Run

    overrides = [
        f"clients={CLIENTS}",
        "model=cnn",
        f"local_epochs={EPOCHS}",
        f"batch_size={BATCH}",
        f"lr={LR}",
        "optim.momentum=0.0",
        "drop_last=true",  # PFLlib's DataLoader drops the last incomplete batch: 4 steps of 100 per epoch in both
        "algorithm=fedavg",
        "logger=none",
        "hardware.device=cpu",
        f"seed={seed}",
        *workload_overrides("equal", CLIENTS, data_root),
    ]
    cfg = compose_cfg(overrides)
    run = Run(cfg, tempfile.mkdtemp(prefix="fedbench-pfllib-"))
    run.setup()
    return run


def accuracy(net, data) -> float:
    idx = torch.as_tensor(data.global_test_idx)
    net.eval()
    with torch.no_grad():
        right = sum(
            (net(data.x[i].contiguous()).argmax(1) == data.y[i]).sum().item() for i in idx.split(500)
        )  # fmt: skip
    return right / len(idx)


def side_fedbench(args) -> dict:
    run = build(args.data_root, args.seed)
    algo = run.algorithm
    ids = torch.arange(run.data.num_clients)
    times = []
    for t in range(args.rounds):
        tic = time.perf_counter()
        algo.round(t, ids)
        times.append(time.perf_counter() - tic)
    net = copy.deepcopy(run.fm.net).to(memory_format=torch.contiguous_format)
    params, buffers = algo.global_model()
    net.load_state_dict({**params, **buffers})
    return {"s": times, "acc": accuracy(net, run.data)}


def side_pfllib(args) -> dict:
    import numpy as np

    run = build(args.data_root, args.seed)
    data = run.data
    work = Path(tempfile.mkdtemp(prefix="pfllib-"))
    (work / "dataset" / "fedbench" / "train").mkdir(parents=True)
    for k in range(data.num_clients):  # PFLlib's format: {'data': {'x': ..., 'y': ...}} per client
        i = torch.as_tensor(data.train_idx[k])
        d = {"x": data.x[i].contiguous().numpy(), "y": data.y[i].numpy()}
        with open(work / "dataset" / "fedbench" / "train" / f"{k}.npz", "wb") as f:
            np.savez_compressed(f, data=d)
    (work / "system").mkdir()
    os.chdir(work / "system")  # PFLlib reads ../dataset/<name>/train/<id>.npz
    sys.path.insert(0, str(Path(args.pfllib).resolve() / "system"))
    from flcore.clients.clientavg import clientAVG
    from flcore.trainmodel.models import FedAvgCNN

    model = FedAvgCNN(in_features=3, num_classes=10, dim=1600)
    theirs = list(model.state_dict())  # the same layers in the same order as fedbench's cnn
    model.load_state_dict(dict(zip(theirs, (v.clone() for v in run.fm.net.state_dict().values()), strict=True)))
    pargs = SimpleNamespace(
        model=model,
        algorithm="FedAvg",
        dataset="fedbench",
        device="cpu",
        save_folder_name="items",
        num_classes=10,
        batch_size=BATCH,
        local_learning_rate=LR,
        local_epochs=EPOCHS,
        few_shot=0,
        learning_rate_decay_gamma=0.99,
        learning_rate_decay=False,
    )
    sizes = [len(data.train_idx[k]) for k in range(data.num_clients)]
    clients = [clientAVG(pargs, k, n, 0, train_slow=False, send_slow=False) for k, n in enumerate(sizes)]
    torch.manual_seed(args.seed)
    glob, times = copy.deepcopy(model), []
    for _ in range(args.rounds):
        tic = time.perf_counter()
        for c in clients:  # serveravg: send_models, then each selected client trains
            c.set_parameters(glob)
            c.train()
        for p in glob.parameters():  # serverbase.aggregate_parameters: the sample-weighted average
            p.data.zero_()
        for c, n in zip(clients, sizes):
            for p, q in zip(glob.parameters(), c.model.parameters()):
                p.data += q.data.clone() * (n / sum(sizes))
        times.append(time.perf_counter() - tic)
    return {"s": times, "acc": accuracy(glob, data), "samples": sum(n // BATCH * BATCH for n in sizes) * EPOCHS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pfllib", required=True, help="a PFLlib checkout (its system/ folder is imported)")
    ap.add_argument("--data-root", default=os.environ.get("FEDBENCH_DATA", "../shared/data"))
    ap.add_argument("--rounds", type=int, default=4, help="rounds per side (the first is warm-up)")
    ap.add_argument("--pairs", type=int, default=2, help="A/B pairs (pair i: fedbench first when i is even)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--side", choices=["fedbench", "pfllib"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not (Path(args.pfllib) / "system" / "flcore" / "clients" / "clientavg.py").is_file():
        print(f"pfllib_equal.py: --pfllib {args.pfllib!r} — not a PFLlib checkout (no system/flcore)", file=sys.stderr)
        return 2
    if args.rounds < 2:
        print(f"pfllib_equal.py: --rounds {args.rounds} — at least 2 (round 1 is warm-up)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    if args.side:
        print(json.dumps((side_fedbench if args.side == "fedbench" else side_pfllib)(args)))
        return 0
    got: dict[str, list] = {"fedbench": [], "pfllib": []}
    for i in range(args.pairs):
        for side in ("fedbench", "pfllib") if i % 2 == 0 else ("pfllib", "fedbench"):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--side", side]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "WANDB_MODE": "disabled"}
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            res = json.loads(out.strip().splitlines()[-1])
            got[side].append(res)
            med = statistics.median(res["s"][1:])
            print(
                f"pair {i} {side:>8}: {med:.2f} s/round (median of rounds 2-{args.rounds}), accuracy {res['acc']:.4f}"
            )
    med = {s: statistics.median(t for r in got[s] for t in r["s"][1:]) for s in got}
    n = got["pfllib"][0]["samples"]  # sample-gradients per round, the same in both (full batches only)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"machine: {cpu} ({os.cpu_count()} cores), {args.threads} threads, torch {torch.__version__}")
    for s in med:
        print(f"  {s:>8}: {med[s]:.2f} s/round, {n / med[s]:.0f} sample-gradients/s")
    print(f"  fedbench faster by x{med['pfllib'] / med['fedbench']:.2f} per round (= per sample-gradient)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": got, "median_s": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
