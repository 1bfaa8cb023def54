"""FedLC: the calibration margins τ·n^{−1/4} (incl. absent classes), the calibrated CE by hand, executors agree."""

from __future__ import annotations

import math

import torch
from baseline_checks import batch, executors_agree_and_it_learns, setup_run

from fedbench.algorithms.fedlc import calibration_margin


def test_margins_by_hand_and_absent_class():
    """counts (16, 1, 0), τ=2: margins 2·16^{−1/4} = 1, 2·1 = 2, and 2·(1e-8)^{−1/4} = 200 for the absent class."""
    m = calibration_margin(torch.tensor([[16.0, 1.0, 0.0]], dtype=torch.float64), 2.0, 1e-8)
    assert torch.allclose(m, torch.tensor([[1.0, 2.0, 200.0]], dtype=torch.float64), atol=1e-12, rtol=0)


def test_local_loss_is_ce_of_calibrated_logits(tmp_path):
    """loss = mean_i −log( e^{z_{i,y} − τ n_y^{−1/4}} / Σ_c e^{z_{i,c} − τ n_c^{−1/4}} ) with client 0's counts, written
    out per sample; a class client 0 lacks gets (almost) no probability mass."""
    tau = 1.5
    run = setup_run(tmp_path, "fedlc", f"algorithm.tau={tau}", "partition.alpha=0.1")
    algo, fm = run.algorithm, run.fm
    counts = run.data.counts[0]
    assert (counts == 0).any() and (counts > 0).any()
    assert torch.allclose(algo.margin[0], torch.as_tensor(tau * (counts.clip(min=1e-8) ** -0.25)), atol=1e-12)
    x, y = batch(run)
    z = fm(algo.w, algo.bn, x).detach()
    total = 0.0
    for zi, yi in zip(z.tolist(), y.tolist()):
        cal = [zi[c] - tau * (counts[c] if counts[c] > 0 else 1e-8) ** -0.25 for c in range(len(zi))]
        total += -cal[yi] + math.log(sum(math.exp(v) for v in cal))
    got = algo.local_loss(fm, algo.w, {k: v.clone() for k, v in algo.bn.items()}, x, y, {"margin": algo.margin[0]})
    assert abs(got.item() - total / len(y)) < 1e-10
    p_absent = torch.softmax(z - algo.margin[0], dim=1)[:, torch.as_tensor(counts == 0)]
    assert p_absent.max() < 1e-40


def test_sequential_equals_vectorized_and_it_learns(tmp_path):
    executors_agree_and_it_learns(tmp_path, "fedlc")
