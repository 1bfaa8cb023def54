"""Oracle: FedAvg (McMahan et al., AISTATS 2017, Algorithm 1 "FederatedAveraging") vs fedbench.

Line by line:
  S_t = random set of max(C·K, 1) clients                      -> fed.participants(t)
  ClientUpdate(k, w_t): for each local epoch, for each batch b: w ← w − η ∇ℓ(w; b)
                                                               -> local_sgd (torch.optim.SGD; momentum and weight
                                                                  decay are this config's optimizer, not Alg. 1's)
  w_{t+1} = Σ_{k∈S_t} (n_k / m_t) · w^k_{t+1},  m_t = Σ_{k∈S_t} n_k   -> weighted_average(states, n_k)
BatchNorm running statistics are averaged like the weights (not in the paper, whose nets have no BN).
Setting: tiny CNN with BatchNorm, 3 of 5 uneven clients per round, momentum 0.9 with each client's buffers
kept across rounds (optim.persistent_state=true), weight decay.
"""

from __future__ import annotations

import pytest

from .common import (
    EXECUTORS,
    TOL,
    Federation,
    assert_global_run_equal,
    assert_same_history,
    config,
    evaluate,
    fedavg_round,
    fixtures,
)

OVERRIDES = (
    "algorithm=fedavg",
    "model=tiny_cnn",
    "participation=0.6",
    "optim.persistent_state=true",
    "optim.weight_decay=0.001",
)


def oracle():
    fed = Federation(config(*OVERRIDES))
    w = fed.initial_state()
    opt_state = {}  # client k -> its SGD state (momentum), across rounds
    history = [{"round": 0, **evaluate(fed, lambda k: fed.new_model(w), fed.new_model(w))}]
    for t in range(1, fed.rounds + 1):
        w, loss = fedavg_round(fed, w, t, opt_state=opt_state)  # ClientUpdate from w_t; Σ n_k/m_t · w^k
        glob = fed.new_model(w)
        history.append({"round": t, "train/loss": loss, **evaluate(fed, lambda k: glob, glob)})
    return fed, w, history


expected, runs = fixtures("fedavg", oracle, OVERRIDES)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedavg_rounds_equal_the_plain_pytorch_oracle(executor, expected, runs):
    assert_global_run_equal(executor, expected, runs)


def test_sequential_executor_logs_the_fp64_training_loss(expected, runs):
    """The sequential executor once summed a client's step losses in a float32 tensor (off by ~1e-8 in fp64 runs)."""
    assert_same_history(runs("sequential").history, expected[2], TOL)
