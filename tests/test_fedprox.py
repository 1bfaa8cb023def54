"""FedProx: the local gradient carries μ(w − w^t); executors agree; a few rounds learn."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from baseline_checks import batch, executors_agree_and_it_learns, perturbed, setup_run


def test_local_gradient_is_ce_gradient_plus_mu_times_distance_to_global(tmp_path):
    """∇h_k(w; w^t) = ∇CE(w) + μ(w − w^t) (FedProx Eq. 2), against autograd of plain CE."""
    mu = 0.7
    run = setup_run(tmp_path, "fedprox", f"algorithm.mu={mu}")
    algo, fm = run.algorithm, run.fm
    w_glob = algo.w
    w = {k: v.requires_grad_(True) for k, v in perturbed(w_glob, 0.1, 0).items()}
    x, y = batch(run)
    names = list(w)
    got = torch.autograd.grad(algo.local_loss(fm, w, algo.bn, x, y, {"w_global": w_glob}), [w[k] for k in names])
    ce = torch.autograd.grad(F.cross_entropy(fm(w, algo.bn, x), y), [w[k] for k in names])
    for k, g, c in zip(names, got, ce):
        assert torch.allclose(g, c + mu * (w[k].detach() - w_glob[k]), atol=1e-12, rtol=0), k
        assert not torch.allclose(g, c, atol=1e-4)  # the proximal pull is really there


def test_sequential_equals_vectorized_and_it_learns(tmp_path):
    executors_agree_and_it_learns(tmp_path, "fedprox", "algorithm.mu=0.1")
