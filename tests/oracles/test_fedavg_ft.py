"""Oracle: FedAvg-FT (FedAvg + local fine-tuning before the personalized evaluation; the "FedAvg-FT" baseline
row of the PFL papers) vs fedbench.

Line by line:
  training: FedAvg, McMahan et al. 2017 Alg. 1 (see test_fedavg.py)   -> fedavg_round
  evaluation after round t (and at t = 0): every client k fine-tunes a copy of the global model w^t on its own
      training data — ft_steps mini-batches, the run's optimizer at lr = ft_lr, fresh optimizer state — and its
      personalized accuracy is that fine-tuned model's on its test split; the fine-tuned copies are discarded
      (the next round starts from w^t)                                -> local_sgd(lr=FT_LR) from w, per client
  global accuracy: w^t, not fine-tuned.
Setting: tiny CNN with BatchNorm (fine-tuning also moves the copy's running statistics), 3 of 5 uneven clients per
round, momentum 0.9, ft_lr 0.02 (≠ lr 0.05), 5 fine-tuning steps.
"""

from __future__ import annotations

import pytest

from .common import EXECUTORS, Federation, assert_global_run_equal, config, evaluate, fedavg_round, fixtures, local_sgd

FT_LR, FT_STEPS = 0.02, 5
OVERRIDES = (
    "algorithm=fedavg_ft",
    f"algorithm.ft_lr={FT_LR}",
    f"algorithm.ft_steps={FT_STEPS}",
    "model=tiny_cnn",
    "participation=0.6",
    "lr=0.05",
)


def oracle():
    fed = Federation(config(*OVERRIDES))

    def metrics(w, t):
        tuned = []
        for batches in fed.batches(list(range(fed.K)), "finetune", t, steps=FT_STEPS):
            model = fed.new_model(w)  # a copy of w^t
            local_sgd(fed, model, batches, FT_LR)
            tuned.append(model)
        return evaluate(fed, lambda k: tuned[k], fed.new_model(w))

    w = fed.initial_state()
    history = [{"round": 0, **metrics(w, 0)}]
    for t in range(1, fed.rounds + 1):
        w, loss = fedavg_round(fed, w, t)
        history.append({"round": t, "train/loss": loss, **metrics(w, t)})
    return fed, w, history


expected, runs = fixtures("fedavg_ft", oracle, OVERRIDES)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedavg_ft_rounds_equal_the_plain_pytorch_oracle(executor, expected, runs):
    assert_global_run_equal(executor, expected, runs)
    # fine-tuning changed what is evaluated (else the comparison would not test it)
    assert any(h["pers/acc"] != h["global/acc"] for h in expected[2])
