"""An algorithm needs its Context, not a Run (issue #22); local training is one LocalSpec per phase."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import build_context, make_cfg

from fedbench.algorithms import ALGORITHMS
from fedbench.algorithms.base import Algorithm
from fedbench.algorithms.local import LocalInputs, LocalSpec
from fedbench.engine.stack import broadcast
from fedbench.run import Run


@pytest.mark.parametrize("name", ["fedavg", "fedrema"])
def test_an_algorithm_runs_a_round_with_a_context_and_no_run(tmp_path, name):
    """Built from a Context alone, a round gives bit-for-bit the model the same round gives inside a Run."""
    over = (f"algorithm={name}", "model=tiny_cnn", "hardware.precision=fp64", "hardware.executor=sequential")
    ctx = build_context(make_cfg(*over), tmp_path / "ctx")
    seen = []
    ctx.observers.append(lambda t, ids, res, phase: seen.append((t, ids, phase)))
    algo = ALGORITHMS[name](ctx)
    algo.setup()
    clients = torch.tensor([0, 2, 3])
    metrics = algo.round(1, clients)
    assert seen and all(s[:2] == (1, [0, 2, 3]) for s in seen) and "train" in {s[2] for s in seen}
    run = Run(make_cfg(*over), tmp_path / "run")
    run.setup()
    run.ctx.publish = ctx.publish  # no loggers outside execute(): FedReMa's pictures go nowhere, as in ctx
    assert run.algorithm.round(1, clients) == metrics
    for (p, b), (q, c) in zip([algo.client_models(clients, 1)], [run.algorithm.client_models(clients, 1)]):
        assert all(torch.equal(p[k], q[k]) for k in p) and all(torch.equal(b[k], c[k]) for k in b)


def test_local_train_takes_a_frozen_spec_and_at_most_five_arguments():
    params = [p for p in inspect.signature(Algorithm.local_train).parameters if p != "self"]
    assert len(params) <= 5, params
    spec = LocalSpec("finetune", epochs=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.epochs = 3
    assert spec.replace(epochs=3).epochs == 3 and spec.epochs == 2


@pytest.mark.parametrize("persist", [True, False])
def test_optimizer_state_persists_as_the_spec_says_for_any_phase(tmp_path, persist):
    """One SGD step (momentum 0.9, no weight decay) of client 1 in phase "finetune": with persist_opt_state the
    client's momentum buffer is kept, and after a first step it is the gradient of the batch's mean CE (torch's
    SGD); the other clients' rows stay zero. Without it no optimizer state is kept."""
    cfg = make_cfg(
        "model=tiny_cnn",
        "model.batch_norm=false",
        "hardware.precision=fp64",
        "optim.momentum=0.9",
        "optim.weight_decay=0.0",
        "optim.persistent_state=false",
    )
    ctx = build_context(cfg, tmp_path)
    algo = ALGORITHMS["fedavg"](ctx)
    algo.setup()
    w, bn = ctx.initial
    idx = torch.as_tensor(ctx.data.train_idx[1][:8])
    spec = LocalSpec("finetune", persist_opt_state=persist, augment=False)
    algo.local_train(1, torch.tensor([1]), (broadcast(w, 1), broadcast(bn, 1)), spec, LocalInputs(schedule=[[idx]]))
    if not persist:
        assert algo.opt_state is None
        return
    x, y = ctx.data.x[idx], ctx.data.y[idx]
    p = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    grads = torch.autograd.grad(F.cross_entropy(ctx.fm(p, bn, x), y), list(p.values()))
    for k, g in zip(p, grads):
        buf = algo.opt_state[f"momentum_buffer:{k}"]
        assert torch.allclose(buf[1], g, atol=1e-12), k
        assert not buf[[0, 2, 3, 4]].any(), k
