#!/usr/bin/env python
"""fedbench vs pfl-research (Apple's simulator, ``pfl`` on PyPI) on pfl-research's own CIFAR-10 benchmark.

The shape (conf/experiment/peers/pfl_cifar10.yaml): 1,000 IID clients x 50 images, 50 clients per round, one local
epoch of plain SGD at batch 10 (5 steps, lr 0.1), FedAvg, the global model on the 10k test images every 10 rounds;
model ``simple_cnn`` (conf/model/pfl_cnn.yaml). Both simulators get, for each seed:

* the same decoded CIFAR-10 pixels and normalisation: fedbench's data pipeline builds them, pfl-research is handed
  the same tensors (its benchmark normalises by the train set's per-channel mean/std, fedbench by the standard
  CIFAR-10 constants: the same within 0.1 %);
* the same clients (fedbench's IID partition), the same clients in each round (fedbench's sampler, replayed to
  pfl-research as its user sampler), the same initial weights (fedbench's ``seed_everything(seed, "init")`` model,
  copied into pfl-research's ``nn.Sequential``);
* the same number of threads (``--threads``), each side in its own process, A/B alternated (pair i runs fedbench
  first when i is even, pfl-research first when odd).

What differs, by design of each: fedbench shuffles a client's 50 images (pfl-research iterates them in order) and
draws dropout masks keyed by (seed, round, client, step) (pfl-research: torch's global generator). So accuracies
agree within seed noise, not bit for bit: the script prints both per seed and their paired difference.

Timing: per round, local training + aggregation (fedbench's ``time/round``; pfl-research: from the end of one round's
callbacks to the start of the next's) and, apart, each central evaluation; round 1 (warm-up) is left out of the
medians. rounds/s counts training plus evaluation amortised over ``eval_every`` rounds.

    pip install -e ".[peers]"                       # pfl[pytorch]
    python scripts/peers/pfl_cifar10.py --data-root ../shared/data --rounds 20 --seeds 0,1,2 --threads 2
    python scripts/peers/pfl_cifar10.py --data-root ../shared/data --device cuda   # on a GPU (vectorized executor)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def fedbench_overrides(args, seed: int) -> list[str]:
    return [
        "+experiment=peers/pfl_cifar10",
        f"rounds={args.rounds}",
        f"seed={seed}",
        f"eval_every={args.eval_every}",
        f"data_root={args.data_root}",
        "logger=none",
        f"hardware.device={args.device}",
        f"hardware.threads={args.threads}",
        f"hardware.executor={args.executor}",
        f"hardware.precision={args.precision}",
        "checkpoint.every=0",
        "checkpoint.final_model=false",
        *args.override,
    ]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=overrides)


def profiled(args):
    """A torch.profiler context around the timed work when ``--profile N`` asks for its top-N table."""
    import contextlib

    if not args.profile:
        return contextlib.nullcontext()
    import torch.profiler

    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


def print_profile(prof, args, side: str) -> dict:
    """The top ``--profile`` ops by self CPU time, and the share of the convolution and matmul kernels."""
    if prof is None or not args.profile:
        return {}
    rows = prof.key_averages()
    total = sum(r.self_cpu_time_total for r in rows)
    dense = sum(
        r.self_cpu_time_total for r in rows if any(k in r.key for k in ("conv", "mm", "addmm", "linear", "bmm"))
    )
    print(f"== {side}: top {args.profile} ops by self CPU time ({total / 1e6:.2f} s in all)")
    print(rows.table(sort_by="self_cpu_time_total", row_limit=args.profile))
    print(f"== {side}: convolutions and matmuls {dense / total:.0%} of the self CPU time")
    return {"profile_total_s": total / 1e6, "profile_dense_share": dense / total}


def side_fedbench(args, seed: int) -> dict:
    """One fedbench run in this process; its per-round times and accuracies from its metrics.jsonl (with
    ``--profile``: the rounds and evaluations run by hand under the profiler, after the setup)."""
    from fedbench.run import Run

    out = Path(tempfile.mkdtemp(prefix="peers-fedbench-"))
    run = Run(compose(fedbench_overrides(args, seed)), out)
    if args.profile:
        run.setup()
        with profiled(args) as prof:
            for t in range(1, args.rounds + 1):
                run.algorithm.round(t, run.sample_clients(t))
                if t % args.eval_every == 0 or t == args.rounds:
                    run.evaluator(run.algorithm, t)
        return print_profile(prof, args, "fedbench")
    run.execute()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = {r["round"]: r["time/round"] for r in rows if "time/round" in r}
    evals = {r["round"]: r["time/eval"] for r in rows if "time/eval" in r and r["round"] > 0}
    acc = {r["round"]: r["global/acc"] for r in rows if "global/acc" in r}
    return {"train_s": train, "eval_s": evals, "acc": acc, "machine": machine()}


def pfl_model(fm_net, dropout: tuple[float, float]):
    """pfl-research's simple_cnn (benchmarks/model/pytorch/cnn.py) without its NHWC->NCHW transpose (the tensors
    are NCHW already), holding fedbench's initial weights; ``loss``/``metrics`` as its benchmark attaches them."""
    import types

    import torch
    from torch import nn

    body, head = fm_net.body, fm_net.head
    net = nn.Sequential(
        nn.Conv2d(body[0].in_channels, body[0].out_channels, 3),
        nn.ReLU(),
        nn.Conv2d(body[2].in_channels, body[2].out_channels, 3),
        nn.ReLU(),
        nn.MaxPool2d((2, 2)),
        nn.Dropout(dropout[0]),
        nn.Flatten(),
        nn.Linear(head[0].in_features, head[0].out_features),
        nn.ReLU(),
        nn.Dropout(dropout[1]),
        nn.Linear(head[3].in_features, head[3].out_features),
    )
    pairs = [(0, body[0]), (2, body[2]), (7, head[0]), (10, head[3])]
    with torch.no_grad():
        for i, src in pairs:
            net[i].weight.copy_(src.weight)
            net[i].bias.copy_(src.bias)

    def loss(self, inputs, targets, eval=False):
        self.eval() if eval else self.train()
        return nn.functional.cross_entropy(self(inputs), targets.long())

    @torch.no_grad()
    def metrics(self, inputs, targets, eval=True):
        from pfl.metrics import Weighted

        self.eval() if eval else self.train()
        logits = self(inputs)
        correct = (logits.argmax(-1) == targets.long()).float().sum().item()
        lsum = nn.functional.cross_entropy(logits, targets.long(), reduction="sum").item()
        return {"loss": Weighted(lsum, len(inputs)), "accuracy": Weighted(correct, len(inputs))}

    net.loss = types.MethodType(loss, net)
    net.metrics = types.MethodType(metrics, net)
    return net


def side_pfl(args, seed: int) -> dict:
    """pfl-research on the same data, clients, sampling and initial model (module docstring)."""
    import numpy as np
    import torch
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNEvalHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    from fedbench.run import Run

    cfg = compose(fedbench_overrides(args, seed))
    run = Run(cfg, tempfile.mkdtemp(prefix="peers-pfl-"))
    run.setup()  # fedbench's data, partition and initial model: pfl-research gets the very same
    data, dev = run.data, run.device
    torch.manual_seed(seed)
    np.random.seed(seed)
    net = pfl_model(run.fm.net, tuple(cfg.model.dropout)).to(dev)
    users = {k: [data.x[data.tensor(idx)], data.y[data.tensor(idx)]] for k, idx in enumerate(data.train_idx)}
    order = iter([int(k) for t in range(1, args.rounds + 1) for k in run.sample_clients(t)])
    train_set = FederatedDataset.from_slices(users, lambda: next(order))
    gidx = data.tensor(data.global_test_idx)
    central = Dataset(raw_data=[data.x[gidx], data.y[gidx]])
    params = [p for p in net.parameters() if p.requires_grad]
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(params, 1.0),
        amp_dtype=torch.bfloat16 if args.precision == "bf16" else None,  # the same autocast as fedbench's bf16
    )
    backend = SimulatedBackend(training_data=train_set, val_data=None, postprocessors=[WeightByUser()])
    marks: dict = {"end": {}, "start": {}}
    evals: dict = {}
    acc: dict = {}

    class Start(TrainingProcessCallback):  # first: the round's training has just ended
        def on_train_begin(self, *, model):
            marks["end"][-1] = time.perf_counter()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            marks["start"][central_iteration] = time.perf_counter()
            return False, Metrics()

    class Evaluate(CentralEvaluationCallback):  # after rounds eval_every, 2 eval_every, ... and the last (fedbench's)
        def on_train_begin(self, *, model):  # (round 0's accuracy is not compared)
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            t = central_iteration + 1
            if t % args.eval_every and t != args.rounds:
                return False, Metrics()
            tic = time.perf_counter()
            stop, m = self._eval(model)
            evals[t] = time.perf_counter() - tic
            acc[t] = next(float(v.overall_value) for k, v in m if "accuracy" in str(k))
            return stop, m

    class End(TrainingProcessCallback):  # last: the next round's clock starts
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            marks["end"][central_iteration] = time.perf_counter()
            return False, Metrics()

    with profiled(args) as prof:
        evaluate = Evaluate(central, model_eval_params=NNEvalHyperParams(local_batch_size=10000), frequency=1)
        run_pfl(args, cfg, backend, model, [Start(), evaluate, End()])
    if args.profile:
        return print_profile(prof, args, "pfl-research")
    train = {i + 1: marks["start"][i] - marks["end"][i - 1] for i in range(args.rounds)}
    return {"train_s": train, "eval_s": evals, "acc": acc, "machine": machine()}


def run_pfl(args, cfg, backend, model, callbacks) -> None:
    """pfl-research's FedAvg as its benchmark calls it (benchmarks/image_classification/pytorch/train.py)."""
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=args.rounds,
            evaluation_frequency=args.eval_every,
            train_cohort_size=round(float(cfg.participation) * int(cfg.clients)),
            val_cohort_size=0,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=float(cfg.lr),
            local_num_epochs=int(cfg.local_epochs),
            local_batch_size=int(cfg.batch_size),
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=10000),
        callbacks=callbacks,
    )


def machine() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    from fedbench.provenance import machine as cpu

    return cpu()


def summarize(res: dict, eval_every: int) -> dict:
    train = [s for t, s in res["train_s"].items() if int(t) > 1]  # round 1 warms up
    ev = list(res["eval_s"].values())
    tr = statistics.median(train)
    e = statistics.median(ev) if ev else 0.0
    return {"train_s": tr, "eval_s": e, "rounds_per_s": 1.0 / (tr + e / eval_every)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", dest="data_root", default=os.environ.get("FEDBENCH_DATA", "../shared/data"))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--eval-every", dest="eval_every", type=int, default=10)
    ap.add_argument("--seeds", default="0,1,2", help="one A/B pair per seed (same seed = same clients and init)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--executor", default="auto", help="fedbench's hardware.executor")
    ap.add_argument(
        "--precision", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast in both (pfl-research: amp_dtype)"
    )
    ap.add_argument("--profile", type=int, default=0, help="print each side's top-N ops (torch.profiler), no timings")
    ap.add_argument("--json", default=None, help="write both sides' raw timings and accuracies here")
    ap.add_argument("--override", action="append", default=[], help="an extra fedbench override (repeatable)")
    ap.add_argument("--side", choices=["fedbench", "pfl"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:  # one side of one pair, in its own process
        import torch

        torch.set_num_threads(args.threads)
        res = (side_fedbench if args.side == "fedbench" else side_pfl)(args, args.seed)
        Path(args.result).write_text(json.dumps(res))
        return 0
    try:
        import pfl  # noqa: F401
    except ImportError:
        print('pfl_cifar10.py: pfl-research is not installed: pip install -e ".[peers]"', file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",")]
    got: dict = {"fedbench": {}, "pfl": {}}
    for i, seed in enumerate(seeds):
        for side in ("fedbench", "pfl") if i % 2 == 0 else ("pfl", "fedbench"):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                path = f.name
            cmd = [sys.executable, __file__, "--side", side, "--seed", str(seed), "--result", path]
            for k in ("data_root", "rounds", "eval_every", "threads", "device", "executor", "precision", "profile"):
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            cmd += [f"--override={o}" for o in args.override]
            subprocess.run(cmd, check=True, env={**os.environ, "WANDB_MODE": "disabled"})
            got[side][seed] = json.loads(Path(path).read_text())
            os.unlink(path)
            if args.profile:
                continue
            s = summarize(got[side][seed], args.eval_every)
            print(
                f"seed {seed} {side:>8}: train {s['train_s']:.3f} s/round, eval {s['eval_s']:.2f} s, "
                f"{s['rounds_per_s']:.3f} rounds/s, accuracy after round {args.rounds}: "
                f"{got[side][seed]['acc'][str(args.rounds)]:.4f}",
                flush=True,
            )
    if not args.profile:
        report(got, seeds, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": got}, indent=1))
    return 0


def report(got: dict, seeds: list[int], args) -> None:
    f = [summarize(got["fedbench"][s], args.eval_every) for s in seeds]
    p = [summarize(got["pfl"][s], args.eval_every) for s in seeds]
    print(
        f"\nmachine: {got['fedbench'][seeds[0]]['machine']}, {args.threads} threads, device {args.device}, "
        f"fedbench executor {args.executor}, precision {args.precision}; {args.rounds} rounds, seeds {seeds}"
    )
    for key, what in (("train_s", "training s/round"), ("eval_s", "s per evaluation"), ("rounds_per_s", "rounds/s")):
        fm, pm = statistics.median(x[key] for x in f), statistics.median(x[key] for x in p)
        ratio = pm / fm if key != "rounds_per_s" else fm / pm
        print(f"{what:>18}: fedbench {fm:.3f}   pfl-research {pm:.3f}   fedbench faster by x{ratio:.2f}")
    r = str(args.rounds)
    diffs = [got["fedbench"][s]["acc"][r] - got["pfl"][s]["acc"][r] for s in seeds]
    sd = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
    print(
        f"accuracy after {args.rounds} rounds: fedbench "
        + " ".join(f"{got['fedbench'][s]['acc'][r]:.4f}" for s in seeds)
        + " | pfl-research "
        + " ".join(f"{got['pfl'][s]['acc'][r]:.4f}" for s in seeds)
        + f" | paired difference {statistics.mean(diffs):+.4f} (sd {sd:.4f})"
    )


if __name__ == "__main__":
    sys.exit(main())
