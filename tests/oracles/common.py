"""Reference oracles: whole fedbench rounds against a plain PyTorch federation written from the paper.

An oracle is what a researcher would write by hand: one ``nn.Module`` per client (a deep copy of the
registry's model, built with fedbench's seed so the init is the same), ``torch.optim.SGD``/``Adam``, a
``zero_grad / backward / step`` loop, the aggregation written out as a sum. From fedbench it takes ONLY
the data, the partition, the model constructor and the order of randomness (client sample and mini-batch
schedule) — never the engine (functional model, stacks, executors, functional optimizers, aggregation,
evaluator). Every oracle is compared with fedbench's run under BOTH executors after a few rounds: fp64
parameters to ``TOL``, the logged metrics equal.

Shared pieces here: the federation's data (:class:`Federation`), the local solver (:func:`local_sgd`),
evaluation as fedbench reports it (:func:`evaluate`), the n_k-weighted average (:func:`weighted_average`)
and the comparisons.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_cfg

from fedbench import seeding
from fedbench.data.datasets import load_dataset
from fedbench.data.partitions import make_partition
from fedbench.engine.schedule import make_schedule
from fedbench.models import build_model

TOL = 1e-12  # fp64 max |Δ| between fedbench and an oracle
EXECUTORS = ("sequential", "vectorized")
# |Δ| allowed on the logged train losses (both executors sum a client's step losses in float64; see
# test_fedavg.py::test_sequential_executor_logs_the_fp64_training_loss)
LOSS_TOL = {"vectorized": TOL, "sequential": TOL}
# every oracle: fp64, 5 digits clients of uneven sizes (Dirichlet 0.5: 188, 291, 206, 230, 233 samples),
# 3 rounds, batch size 16 (ragged last batches), one local epoch
BASE = ("hardware.precision=fp64", "clients=5", "rounds=3", "batch_size=16", "local_epochs=1")


def config(*overrides: str, executor: str = "sequential"):
    return make_cfg(*BASE, *overrides, f"hardware.executor={executor}")


def fixtures(name: str, oracle, overrides: tuple):
    """The module fixtures of an oracle test: ``expected`` (the oracle's result, computed once) and ``runs``
    (fedbench's runs of the same config, one per executor). Use: ``expected, runs = fixtures(...)``."""

    @pytest.fixture(scope="module")
    def expected():
        return oracle()

    @pytest.fixture(scope="module")
    def runs(tmp_path_factory):
        return Runs(tmp_path_factory.mktemp(name), *overrides)

    return expected, runs


def fedbench_run(tmp_path, *overrides: str, executor: str):
    """fedbench's own run of the same config (the thing under test); returns the finished ``Run``."""
    from fedbench.run import Run

    run = Run(config(*overrides, executor=executor), tmp_path / executor)
    run.execute()
    return run


class Runs:
    """fedbench's runs of one config, one per executor, made on first use (a module fixture shares them)."""

    def __init__(self, tmp_path, *overrides: str):
        self.tmp_path, self.overrides, self.done = tmp_path, overrides, {}

    def __call__(self, executor: str):
        if executor not in self.done:
            self.done[executor] = fedbench_run(self.tmp_path, *self.overrides, executor=executor)
        return self.done[executor]


class Federation:
    """Data, partition, model init and randomness of a config, built without fedbench's engine."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.seed = int(cfg.seed)
        ds = load_dataset(cfg.dataset, cache_dir=cfg.cache_dir)
        self.K = int(cfg.clients)
        part = make_partition(
            cfg.partition,
            ds.y.numpy(),
            ds.n_train,
            ds.num_classes,
            self.K,  # as fedbench: the
            seeding.rng(int(cfg.partition.seed), "partition"),
            attrs=ds.attrs,
        )  # split's own seed
        self.x, self.y = ds.x.to(torch.float64), ds.y
        self.train = [torch.as_tensor(i, dtype=torch.long) for i in part.train]
        self.test = [torch.as_tensor(i, dtype=torch.long) for i in part.test]
        self.global_test = torch.arange(ds.n_train, len(ds.y))
        self.n = [len(i) for i in part.train]  # n_k
        seeding.seed_everything(self.seed, "init")  # fedbench's init seed
        self.model = build_model(cfg.model, tuple(ds.x.shape[1:]), ds.num_classes).to(torch.float64)
        self.rounds = int(cfg.rounds)

    def new_model(self, state: dict | None = None) -> torch.nn.Module:
        """A fresh copy of the initial model, loaded with ``state`` (a state_dict) if given."""
        m = copy.deepcopy(self.model)
        if state is not None:
            m.load_state_dict(state)
        return m

    def initial_state(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def participants(self, t: int) -> list[int]:
        """S_t: max(1, round(C·K)) clients uniformly without replacement (fedbench's draw for round t)."""
        m = max(1, int(round(float(self.cfg.participation) * self.K)))
        if m >= self.K:
            return list(range(self.K))
        return sorted(int(k) for k in seeding.rng(self.seed, "sample", t).choice(self.K, m, replace=False))

    def batches(
        self, clients: list[int], purpose: str, t: int, *, epochs: int | None = None, steps: int | None = None
    ) -> list[list[torch.Tensor]]:
        """Per client, its mini-batches' sample indices in fedbench's order (default: ``local_epochs`` epochs)."""
        if epochs is None and steps is None:
            epochs = int(self.cfg.local_epochs)
        return make_schedule(
            [self.train[k].numpy() for k in clients],
            clients,
            int(self.cfg.batch_size),
            self.seed,
            purpose,
            t,
            epochs=epochs,
            steps=steps,
            drop_last=bool(self.cfg.drop_last),
        )

    def lr(self, t: int) -> float:
        """The local lr of round t: ``lr``, or ``lr_decay_to`` after round ``lr_decay_round`` (step decay)."""
        o = self.cfg.optim
        return float(o.lr_decay_to) if o.lr_decay_round is not None and t > int(o.lr_decay_round) else float(o.lr)


def make_optimizer(cfg, params, lr: float) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=float(o.momentum), weight_decay=float(o.weight_decay), nesterov=bool(o.nesterov)
        )
    extra = {
        k: (tuple(o[k]) if k == "betas" else float(o[k])) for k in ("betas", "eps") if k in o
    }  # else torch's defaults
    return torch.optim.Adam(params, lr=lr, weight_decay=float(o.weight_decay), **extra)


def client_optimizer(fed: Federation, params, lr: float, opt_state: dict | None) -> torch.optim.Optimizer:
    """The run's optimizer over ``params`` at ``lr``, continuing from ``opt_state`` (a state_dict) if given."""
    opt = make_optimizer(fed.cfg, params, lr)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
        for g in opt.param_groups:
            g["lr"] = lr
    return opt


class Stats:
    clipped = 0  # steps whose gradient norm was clipped (so a test can check clipping was exercised)


def local_sgd(
    fed: Federation,
    model: torch.nn.Module,
    batches: list[torch.Tensor],
    lr: float,
    *,
    penalty=None,
    grad_hook=None,
    opt_state: dict | None = None,
) -> tuple[float, dict]:
    """A client's local solver: for every mini-batch b in order,
    ``zero_grad; loss = CE(model(x_b), y_b) [+ penalty(model)]; backward; [grad_hook]; [clip]; step``.

    ``opt_state``: an ``optimizer.state_dict()`` to continue from (persistent optimizer state), else fresh.
    Returns (mean loss over the steps, the optimizer's state_dict after them).
    """
    params = list(model.parameters())
    opt = client_optimizer(fed, params, lr, opt_state)
    clip = fed.cfg.optim.clip_grad_norm
    model.train()
    total = 0.0
    for idx in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(fed.x[idx]), fed.y[idx])
        if penalty is not None:
            loss = loss + penalty(model)
        loss.backward()
        if grad_hook is not None:
            grad_hook(model)
        if clip:
            if torch.nn.utils.clip_grad_norm_(params, float(clip)) > float(clip):
                Stats.clipped += 1
        opt.step()
        total += loss.item()
    return total / max(1, len(batches)), copy.deepcopy(opt.state_dict())


def weighted_average(states: list[dict], weights: list[float]) -> dict:
    """Σ_k (w_k / Σ_j w_j) · state_k for every floating-point entry (FedAvg's aggregation).

    Integer entries (BatchNorm's ``num_batches_tracked``) are not averaged: the first client's is kept (the
    counter is unused by BN layers with a momentum, and fedbench keeps row 0); comparisons skip them.
    """
    total = sum(weights)
    out = {}
    for k, v in states[0].items():
        out[k] = sum((w / total) * s[k] for w, s in zip(weights, states)) if v.is_floating_point() else v.clone()
    return out


def fedavg_round(
    fed: Federation, w: dict, t: int, *, penalty=None, opt_state: dict | None = None
) -> tuple[dict, float]:
    """One FedAvg round (McMahan et al. 2017, Alg. 1) from global state ``w``: every sampled client k runs
    ``local_sgd`` from a copy of w (with ``penalty``; continuing ``opt_state[k]`` when a dict is given, which is
    updated), then w ← Σ_k n_k w_k / Σ_k n_k. Returns (new w, mean of the clients' mean losses)."""
    S = fed.participants(t)
    states, losses = [], []
    for k, batches in zip(S, fed.batches(S, "train", t)):
        model = fed.new_model(w)
        loss, state = local_sgd(
            fed, model, batches, fed.lr(t), penalty=penalty, opt_state=None if opt_state is None else opt_state.get(k)
        )
        if opt_state is not None:
            opt_state[k] = state
        states.append(model.state_dict())
        losses.append(loss)
    return weighted_average(states, [fed.n[k] for k in S]), float(np.mean(losses))


@torch.no_grad()
def correct(model: torch.nn.Module, fed: Federation, idx: torch.Tensor) -> int:
    model.eval()
    return int((model(fed.x[idx]).argmax(1) == fed.y[idx]).sum())


def evaluate(fed: Federation, client_model, global_model: torch.nn.Module | None) -> dict:
    """fedbench's reported accuracies: ``pers/acc`` (all clients' test samples pooled), ``pers/acc_mean``
    (mean of the clients' accuracies), ``global/acc`` (the global model on the official test split);
    ``client_model(k)`` is client k's personalized model."""
    hits = np.array([correct(client_model(k), fed, fed.test[k]) for k in range(fed.K)])
    sizes = np.array([len(i) for i in fed.test])
    acc = hits / sizes
    out = {
        "pers/acc": float(hits.sum() / sizes.sum()),
        "pers/acc_mean": float(acc.mean()),
        "pers_client_acc": acc.tolist(),
    }
    if global_model is not None:
        out["global/acc"] = correct(global_model, fed, fed.global_test) / len(fed.global_test)
    return out


def assert_same_models(got: dict, want: dict, names=None, what: str = "") -> None:
    """max |Δ| <= TOL on every floating entry of ``want`` (or of ``names``); ``got`` may hold fedbench stacks."""
    worst, where = 0.0, None
    for k in names if names is not None else want:
        if not want[k].is_floating_point():
            continue
        assert got[k].shape == want[k].shape, (
            f"{what}: {k} has shape {tuple(got[k].shape)}, oracle {tuple(want[k].shape)}"
        )
        d = (got[k].to(torch.float64) - want[k].to(torch.float64)).abs().max().item()
        if d > worst:
            worst, where = d, k
    assert worst <= TOL, f"{what}: max |fedbench - oracle| = {worst:.3g} at {where}"


def assert_same_history(
    history: list[dict],
    oracle: list[dict],
    loss_tol: float = TOL,
    keys=("pers/acc", "pers/acc_mean", "global/acc"),
    loss_keys=("train/loss",),
) -> None:
    """Per round: the accuracies equal, the logged training losses to ``loss_tol``."""
    assert [h["round"] for h in history] == [o["round"] for o in oracle]
    for h, o in zip(history, oracle):
        for k in keys:
            if k in o:
                assert h[k] == o[k], f"round {o['round']}: {k} fedbench {h[k]} vs oracle {o[k]}"
        for k in loss_keys:
            if k in o:
                assert math.isclose(h[k], o[k], rel_tol=0, abs_tol=loss_tol), (
                    f"round {o['round']}: {k} {h[k]} vs {o[k]}"
                )


def assert_global_run_equal(executor: str, expected: tuple, runs):
    """For methods with one global model (FedAvg-shaped): ``expected = (fed, w, history)`` of the oracle; fedbench's
    final global model (parameters + buffers) and its logged metrics under ``executor`` equal them. Returns the run."""
    fed, w, history = expected
    assert moved(w, fed.initial_state()) > 1e-2  # it trained: the comparison is not vacuous
    run = runs(executor)
    assert_same_models({**run.algorithm.w, **run.algorithm.bn}, w, what="global model")
    assert_same_history(run.history, history, LOSS_TOL[executor])
    assert run.evaluator.last["pers_client_acc"] == history[-1]["pers_client_acc"]
    return run


def moved(state: dict, start: dict) -> float:
    """max |state − start| over floating entries: > 0 shows the run trained (a comparison can't pass vacuously)."""
    return max((state[k] - start[k]).abs().max().item() for k in state if state[k].is_floating_point())


def stacked(states: list[dict]) -> dict:
    """Per-client state_dicts -> {name: [K, ...]} (to compare with fedbench's client stacks)."""
    return {k: torch.stack([s[k] for s in states]) for k in states[0]}


__all__ = [
    "BASE",
    "EXECUTORS",
    "LOSS_TOL",
    "TOL",
    "Federation",
    "Runs",
    "Stats",
    "assert_global_run_equal",
    "assert_same_history",
    "assert_same_models",
    "config",
    "evaluate",
    "fedavg_round",
    "fedbench_run",
    "fixtures",
    "local_sgd",
    "make_optimizer",
    "moved",
    "stacked",
    "weighted_average",
]
