"""Oracle: Ditto (Li, Hu, Beirami, Smith, ICML 2021, Algorithm 1) vs fedbench.

Line by line (Alg. 1, round t, every sampled client k):
  line 4-5:  global copy: w_k^t = UPDATE_GLOBAL(w^t, ∇F_k) — FedAvg's local solver from w^t (E epochs of CE)
             -> local_sgd from w^t; its momentum persists across rounds (optim.persistent_state=true)
  line 6-7:  personal model, s local iterations from the client's own v_k (kept across rounds, never reset
             to w^t):  v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w^t))  =  SGD on F_k(v) + (λ/2)‖v − w^t‖² (Eq. 2),
             anchored at the round-start w^t  -> local_sgd(penalty=prox) from V[k], a fresh optimizer each
             round (fedbench: persistent state is the global copy's only)
  line 9:    w^{t+1} = Σ_k n_k w_k^t / Σ_k n_k over the sampled clients (FedAvg)  -> weighted_average
  personalized accuracy: every client's v_k on its test split; global accuracy: w on the global test split.
Setting: tiny CNN with BatchNorm (v_k keeps its own running statistics; the global copies' are averaged), λ = 0.5,
s = one epoch, 3 of 5 uneven clients per round, momentum 0.9.
"""

from __future__ import annotations

import numpy as np
import pytest

from .common import (
    EXECUTORS,
    LOSS_TOL,
    Federation,
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

LAM = 0.5
OVERRIDES = (
    "algorithm=ditto",
    f"algorithm.lam={LAM}",
    "algorithm.personal_epochs=1",
    "model=tiny_cnn",
    "participation=0.6",
    "optim.persistent_state=true",
)


def oracle():
    fed = Federation(config(*OVERRIDES))
    w = fed.initial_state()
    V = [fed.initial_state() for _ in range(fed.K)]  # personal models v_k (all start at w^0)
    opt_state = {}  # global-copy optimizer state per client

    def metrics(w):
        glob = fed.new_model(w)
        return evaluate(fed, lambda k: fed.new_model(V[k]), glob)

    history = [{"round": 0, **metrics(w)}]
    for t in range(1, fed.rounds + 1):
        S = fed.participants(t)
        anchor = {k: v.clone() for k, v in w.items()}  # w^t

        def prox(model):  # (λ/2)‖v − w^t‖²
            return LAM / 2 * sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())

        states, losses, personal_losses = [], [], []
        personal_batches = fed.batches(S, "personal", t, epochs=1)
        for k, batches, pb in zip(S, fed.batches(S, "train", t), personal_batches):
            model = fed.new_model(w)  # lines 4-5
            loss, opt_state[k] = local_sgd(fed, model, batches, fed.lr(t), opt_state=opt_state.get(k))
            states.append(model.state_dict())
            losses.append(loss)
            personal = fed.new_model(V[k])  # lines 6-7
            personal_loss, _ = local_sgd(fed, personal, pb, fed.lr(t), penalty=prox)
            V[k] = personal.state_dict()
            personal_losses.append(personal_loss)
        w = weighted_average(states, [fed.n[k] for k in S])  # line 9
        history.append(
            {
                "round": t,
                "train/loss": float(np.mean(losses)),
                "train/personal_loss": float(np.mean(personal_losses)),
                **metrics(w),
            }
        )
    return fed, w, V, history


expected, runs = fixtures("ditto", oracle, OVERRIDES)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_ditto_rounds_equal_the_plain_pytorch_oracle(executor, expected, runs):
    fed, w, V, history = expected
    assert moved(w, fed.initial_state()) > 1e-2 and moved(stacked(V), stacked([fed.initial_state()] * fed.K)) > 1e-2
    run = runs(executor)
    algo = run.algorithm
    assert_same_models({**algo.w, **algo.bn}, w, what="global model")
    assert_same_models({**algo.V, **algo.VB}, stacked(V), what="personal models v_k")
    assert_same_history(run.history, history, LOSS_TOL[executor], loss_keys=("train/loss", "train/personal_loss"))
    assert run.evaluator.last["pers_client_acc"] == history[-1]["pers_client_acc"]
