"""Oracle: FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, Algorithm 1) vs fedbench.

Line by line (Alg. 1):
  client k trains its whole model (shared layers + its OWN BatchNorm layers) with CE from
      {w^t for non-BN layers} ∪ {its BN layers as it left them} (all clients' BN start from the initial model)
                                                           -> local_sgd from {**shared, **bn[k]}
  server: w^{t+1}_l = Σ_k n_k w_{k,l} / Σ_k n_k for every NON-BN layer l; BN affine weights and running
      statistics are never averaged and stay with their client  -> weighted_average over the non-BN entries
  personalized accuracy: client k's model = shared layers + its BN layers.
  global accuracy (fedbench's convention, FedBN has no single model): shared layers + the n_k-weighted mean of
      all K clients' BN layers.
Setting: tiny CNN with BatchNorm (2-d and 1-d), 3 of 5 uneven clients per round, momentum 0.9, gradient-norm
clipping at 1.0.
"""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from .common import (
    EXECUTORS,
    LOSS_TOL,
    Federation,
    Stats,
    assert_same_history,
    assert_same_models,
    config,
    evaluate,
    fixtures,
    local_sgd,
    moved,
    stacked,
    weighted_average,
)

OVERRIDES = ("algorithm=fedbn", "model=tiny_cnn", "participation=0.6", "optim.clip_grad_norm=1.0")


def bn_entries(model: nn.Module) -> set[str]:
    """state_dict names of every BatchNorm layer (affine weight/bias, running mean/var, counter)."""
    return {
        f"{m_name}.{n}"
        for m_name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        for n in m.state_dict()
    }


def oracle():
    fed = Federation(config(*OVERRIDES))
    init = fed.initial_state()
    local = bn_entries(fed.model)
    assert local  # the model has BN layers
    shared = {n: v for n, v in init.items() if n not in local}
    bn = [{n: init[n].clone() for n in local} for _ in range(fed.K)]  # each client's own BN layers

    def metrics():
        glob = fed.new_model({**shared, **weighted_average(bn, fed.n)})
        return evaluate(fed, lambda k: fed.new_model({**shared, **bn[k]}), glob)

    history = [{"round": 0, **metrics()}]
    clipped = Stats.clipped
    for t in range(1, fed.rounds + 1):
        S = fed.participants(t)
        states, losses = [], []
        for k, batches in zip(S, fed.batches(S, "train", t)):
            model = fed.new_model({**shared, **bn[k]})
            loss, _ = local_sgd(fed, model, batches, fed.lr(t))
            state = model.state_dict()
            bn[k] = {n: state[n] for n in local}  # BN stays with its client
            states.append({n: v for n, v in state.items() if n not in local})
            losses.append(loss)
        shared = weighted_average(states, [fed.n[k] for k in S])  # non-BN layers only
        history.append({"round": t, "train/loss": float(np.mean(losses)), **metrics()})
    assert Stats.clipped > clipped
    return fed, shared, bn, history


expected, runs = fixtures("fedbn", oracle, OVERRIDES)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedbn_rounds_equal_the_plain_pytorch_oracle(executor, expected, runs):
    fed, shared, bn, history = expected
    init = fed.initial_state()
    assert moved(shared, init) > 1e-2 and moved(stacked(bn), stacked([{n: init[n] for n in bn[0]}] * fed.K)) > 1e-2
    run = runs(executor)
    algo = run.algorithm
    assert_same_models({**algo.w, **algo.bn}, shared, what="shared (non-BN) layers")
    assert_same_models({**algo.local_w, **algo.local_bn}, stacked(bn), what="clients' BN layers")
    assert_same_history(run.history, history, LOSS_TOL[executor])
    assert run.evaluator.last["pers_client_acc"] == history[-1]["pers_client_acc"]
