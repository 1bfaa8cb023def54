"""Oracle: Local (every client trains its own model on its own data, no communication; the "Local" rows of the
PFL papers) vs fedbench.

Line by line:
  every client k owns a model v_k (all start from the same initial model) and an optimizer whose state (Adam's
      moments and step count) persists across the rounds it trains in (optim.persistent_state=true)
  round t: each sampled client runs E epochs of its optimizer on CE from ITS OWN v_k  -> local_sgd from V[k]
      nothing is sent, averaged or shared; unsampled clients keep their models
  personalized accuracy: v_k on client k's test split; no global model (no global accuracy is reported).
Setting: MLP, Adam (lr 0.005) with persistent state, gradient-norm clipping at 2.0, 3 of 5 uneven clients per
round. (No BatchNorm here: the bias of a layer feeding a BN has a zero gradient up to ~1e-17 rounding noise, which
Adam divides by eps = 1e-8, so with Adam a BN net agrees with any other implementation only to ~1e-8.)
"""

from __future__ import annotations

import numpy as np
import pytest

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
)

OVERRIDES = (
    "algorithm=local",
    "model=mlp",
    "participation=0.6",
    "optim.name=adam",
    "lr=0.005",
    "optim.persistent_state=true",
    "optim.clip_grad_norm=2.0",
)


def oracle():
    fed = Federation(config(*OVERRIDES))
    V = [fed.initial_state() for _ in range(fed.K)]
    opt_state = {}

    def metrics():
        return evaluate(fed, lambda k: fed.new_model(V[k]), None)

    history = [{"round": 0, **metrics()}]
    clipped = Stats.clipped
    for t in range(1, fed.rounds + 1):
        S = fed.participants(t)
        losses = []
        for k, batches in zip(S, fed.batches(S, "train", t)):
            model = fed.new_model(V[k])
            loss, opt_state[k] = local_sgd(fed, model, batches, fed.lr(t), opt_state=opt_state.get(k))
            V[k] = model.state_dict()
            losses.append(loss)
        history.append({"round": t, "train/loss": float(np.mean(losses)), **metrics()})
    assert Stats.clipped > clipped
    return fed, V, history


expected, runs = fixtures("local", oracle, OVERRIDES)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_local_rounds_equal_the_plain_pytorch_oracle(executor, expected, runs):
    fed, V, history = expected
    assert moved(stacked(V), stacked([fed.initial_state()] * fed.K)) > 1e-2
    run = runs(executor)
    assert_same_models({**run.algorithm.P, **run.algorithm.B}, stacked(V), what="clients' models")
    assert_same_history(run.history, history, LOSS_TOL[executor])
    assert run.evaluator.last["pers_client_acc"] == history[-1]["pers_client_acc"]
    assert all("global/acc" not in h for h in run.history)
