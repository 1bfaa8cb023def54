"""Oracle: SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020, Algorithm 1, option II —
the option fedbench implements) vs fedbench, with a step decay of the local lr.

Line by line (Alg. 1; x server model, c server control variate, c_i client control variates, all 0 at start):
  S = random set of clients                                       -> fed.participants(t)
  line 7-10:  y_i ← x;  K_i times:  y_i ← y_i − η_l (g_i(y_i) − c_i + c)
              -> local_sgd with grad_hook adding (c − c_i) to every .grad before the plain-SGD step;
                 K_i = the client's number of local steps (uneven clients: uneven K_i), η_l = the lr those steps
                 used in round t (lr, then lr_decay_to after optim.lr_decay_round)
  line 12:    c_i⁺ ← c_i − c + (x − y_i) / (K_i η_l)            (option II)
  line 13:    Δy_i = y_i − x,  Δc_i = c_i⁺ − c_i;  c_i ← c_i⁺
  line 16:    x ← x + η_g · (1/|S|) Σ_{i∈S} Δy_i                  (plain mean: weighted_average=false)
  line 17:    c ← c + (1/N) Σ_{i∈S} Δc_i                          (N = all clients)
Setting: MLP (no BatchNorm), plain SGD as in the paper (momentum 0), η_g = 0.8, 3 of 5 uneven clients per round,
lr 0.05 in round 1 and 0.02 from round 2 (optim.lr_decay_round=1), 3 rounds. fedbench's logged train/loss is
CE + ⟨w, c − c_i⟩ (its surrogate whose gradient is the corrected one), not compared here.
"""

from __future__ import annotations

import pytest
import torch

from .common import (
    EXECUTORS,
    Federation,
    assert_same_history,
    assert_same_models,
    config,
    evaluate,
    fixtures,
    local_sgd,
    moved,
    stacked,
)

ETA_G = 0.8
OVERRIDES = (
    "algorithm=scaffold",
    f"algorithm.server_lr={ETA_G}",
    "model=mlp",
    "participation=0.6",
    "optim.momentum=0",
    "lr=0.05",
    "optim.lr_decay_round=1",
    "optim.lr_decay_to=0.02",
)


def oracle():
    fed = Federation(config(*OVERRIDES))
    x = fed.initial_state()
    zero = {n: torch.zeros_like(v) for n, v in x.items()}
    c, c_i = dict(zero), [dict(zero) for _ in range(fed.K)]
    glob = fed.new_model(x)
    history = [{"round": 0, **evaluate(fed, lambda k: glob, glob)}]
    for t in range(1, fed.rounds + 1):
        S, eta = fed.participants(t), fed.lr(t)
        dy, dc = [], []
        for i, batches in zip(S, fed.batches(S, "train", t)):
            model = fed.new_model(x)  # y_i ← x

            def corrected(model, ci=c_i[i]):  # g_i(y_i) − c_i + c
                for n, p in model.named_parameters():
                    p.grad += c[n] - ci[n]

            local_sgd(fed, model, batches, eta, grad_hook=corrected)
            y = model.state_dict()
            c_plus = {n: c_i[i][n] - c[n] + (x[n] - y[n]) / (len(batches) * eta) for n in x}  # option II
            dy.append({n: y[n] - x[n] for n in x})
            dc.append({n: c_plus[n] - c_i[i][n] for n in x})
            c_i[i] = c_plus
        x = {n: x[n] + ETA_G * sum(d[n] for d in dy) / len(S) for n in x}  # line 16
        c = {n: c[n] + sum(d[n] for d in dc) / fed.K for n in c}  # line 17
        glob = fed.new_model(x)
        history.append({"round": t, **evaluate(fed, lambda k: glob, glob)})
    return fed, x, c, c_i, history


expected, runs = fixtures("scaffold", oracle, OVERRIDES)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_scaffold_rounds_equal_the_plain_pytorch_oracle(executor, expected, runs):
    fed, x, c, c_i, history = expected
    assert moved(x, fed.initial_state()) > 1e-2
    run = runs(executor)
    algo = run.algorithm
    assert_same_models(algo.c_local, stacked(c_i), what="client control variates c_i")
    assert_same_models(algo.c, c, what="server control variate c")
    assert_same_models(algo.w, x, what="global model x")
    assert_same_history(run.history, history)
