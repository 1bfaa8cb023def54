"""Oracle: FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020, Algorithm 2) vs fedbench.

Line by line:
  S_t = random set of clients                                   -> fed.participants(t)
  client k: w_k^{t+1} ≈ argmin_w h_k(w; w^t) = F_k(w) + (μ/2)‖w − w^t‖²   (Eq. 2), solved by E epochs of the
            local optimizer from w^t, the penalty over every parameter  -> fedavg_round(penalty=prox)
  w^{t+1} = Σ_k n_k w_k^{t+1} / Σ_k n_k  (FedAvg's weighting, as fedbench and the FedProx code use;
            Alg. 2 writes the plain mean over the sampled devices)      (inside fedavg_round)
  logged train/loss = the mean of h_k over each client's steps.
Setting: MLP (no BatchNorm), μ = 0.5, 3 of 5 uneven clients per round, momentum 0.9 (fresh each round),
gradient-norm clipping at 1.0 (applied to ∇h_k).
"""

from __future__ import annotations

import pytest

from .common import EXECUTORS, Federation, Stats, assert_global_run_equal, config, evaluate, fedavg_round, fixtures

MU = 0.5
OVERRIDES = ("algorithm=fedprox", f"algorithm.mu={MU}", "model=mlp", "participation=0.6", "optim.clip_grad_norm=1.0")


def oracle():
    fed = Federation(config(*OVERRIDES))
    w = fed.initial_state()
    glob = fed.new_model(w)
    history = [{"round": 0, **evaluate(fed, lambda k: glob, glob)}]
    clipped = Stats.clipped
    for t in range(1, fed.rounds + 1):
        anchor = {k: v.clone() for k, v in w.items()}  # w^t

        def prox(model):  # (μ/2)‖w − w^t‖²  (Eq. 2)
            return MU / 2 * sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())

        w, loss = fedavg_round(fed, w, t, penalty=prox)  # h_k from w^t; Σ n_k w_k / n
        glob = fed.new_model(w)
        history.append({"round": t, "train/loss": loss, **evaluate(fed, lambda k: glob, glob)})
    assert Stats.clipped > clipped  # clipping was exercised
    return fed, w, history


expected, runs = fixtures("fedprox", oracle, OVERRIDES)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedprox_rounds_equal_the_plain_pytorch_oracle(executor, expected, runs):
    assert_global_run_equal(executor, expected, runs)
