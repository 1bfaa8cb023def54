"""The evaluator is built from what the algorithm sees (its Context) and the ``eval`` config node, not from a Run."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from conftest import build_context, make_cfg

from fedbench.algorithms import ALGORITHMS
from fedbench.evaluation import Evaluator

OVER = ("algorithm=fedavg", "model=tiny_cnn", "hardware.precision=fp64", "hardware.executor=sequential")


def test_the_evaluator_scores_the_pooled_and_the_per_client_accuracy_without_a_run(tmp_path):
    """After one FedAvg round on the digits: pers/acc pools every client's test samples (Σ correct / Σ n), pers/acc_mean
    averages the clients' accuracies, global/acc is the global model on the global test set — each counted here one
    client at a time with the plain model."""
    cfg = make_cfg(*OVER, "partition=dirichlet", "partition.alpha=0.3")
    ctx = build_context(cfg, tmp_path)
    algo = ALGORITHMS["fedavg"](ctx)
    algo.setup()
    algo.round(1, torch.arange(ctx.data.num_clients))
    out = Evaluator(ctx, cfg.eval)(algo, 1)

    (p, b), data, fm = algo.global_model(), ctx.data, ctx.fm
    fm.set_mode(False)
    with torch.no_grad():
        right = lambda idx: int((fm(p, b, data.x[idx]).argmax(1) == data.y[idx]).sum())  # noqa: E731
        correct = np.array([right(torch.as_tensor(i)) for i in data.test_idx])
        global_right = right(torch.as_tensor(data.global_test_idx))
    fm.set_mode(True)
    n = np.array([len(i) for i in data.test_idx])
    assert n.min() > 0 and correct.sum() / n.sum() != pytest.approx(np.mean(correct / n))  # the two rules differ here
    assert out["pers/acc"] == pytest.approx(correct.sum() / n.sum(), abs=1e-12)
    assert out["pers/acc_mean"] == pytest.approx(np.mean(correct / n), abs=1e-12)
    assert out["global/acc"] == pytest.approx(global_right / len(data.global_test_idx), abs=1e-12)


def test_no_monitor_takes_the_run():
    """The evaluator and the monitors take their inputs, not a Run to reach into (issue #55)."""
    from fedbench.forgetting import ForgettingMonitor
    from fedbench.newclients import NewClients
    from fedbench.similarity import SimilarityMonitor

    for cls in (Evaluator, ForgettingMonitor, NewClients, SimilarityMonitor):
        assert "run" not in inspect.signature(cls).parameters, cls
        assert "self.run" not in inspect.getsource(cls), cls
