"""FedDyn: the local gradient (linear term + dynamic regulariser), the client state and server rule on
hand-made values, adaptive α, executors agree."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from baseline_checks import batch, executors_agree_and_it_learns, perturbed, setup_run

from fedbench.engine.stack import tagged


def test_local_gradient_is_ce_minus_linear_state_plus_alpha_pull(tmp_path):
    """∇[L_k(w) − ⟨g_k, w⟩ + (α/2)‖w − w^t‖²] = ∇L_k(w) − g_k + α(w − w^t), hand-made g_k."""
    alpha = 0.3
    run = setup_run(tmp_path, "feddyn", f"algorithm.alpha={alpha}")
    algo, fm = run.algorithm, run.fm
    w = {k: v.requires_grad_(True) for k, v in perturbed(algo.w, 0.1, 0).items()}
    g_k = perturbed({k: torch.zeros_like(v) for k, v in algo.w.items()}, 1.0, 1)
    x, y = batch(run)
    names = list(w)
    ctx = {**tagged(g_k, "lin"), "alpha": torch.tensor(alpha, dtype=torch.float64), "w_global": algo.w}
    got = torch.autograd.grad(algo.loss(fm, w, algo.bn, x, y, ctx), [w[k] for k in names])
    ce = torch.autograd.grad(F.cross_entropy(fm(w, algo.bn, x), y), [w[k] for k in names])
    for k, a, c in zip(names, got, ce):
        assert torch.allclose(a, c - g_k[k] + alpha * (w[k].detach() - algo.w[k]), atol=1e-12, rtol=0), k


def test_client_state_and_server_update_by_hand(tmp_path):
    """N=4, S={0,2}, α=0.5, one scalar parameter, w^t=1, h=0.2, g=(0.1,0.2,0.3,0.4), trained w_0=2, w_2=0:
    g_k ← g_k − α(w_k − w^t);  h ← h − α(1/N)Σ_S(w_k − w^t);  w^{t+1} = mean_S(w_k) − h/α."""
    run = setup_run(tmp_path, "feddyn", "clients=4", "algorithm.alpha=0.5")
    algo = run.algorithm
    f64 = lambda *v: torch.tensor(v if len(v) > 1 else v[0], dtype=torch.float64)  # noqa: E731  (scalar or [M])
    algo.w, algo.h = {"a": f64(1.0)}, {"a": f64(0.2)}
    algo.grad_state = {"a": f64(0.1, 0.2, 0.3, 0.4)}
    algo.server_update(torch.tensor([0, 2]), {"a": f64(2.0, 0.0)}, {})
    assert torch.allclose(algo.grad_state["a"], f64(0.1 - 0.5 * 1, 0.2, 0.3 - 0.5 * (-1), 0.4), atol=1e-12)
    h = 0.2 - 0.5 / 4 * ((2 - 1) + (0 - 1))  # = 0.2 (the two moves cancel)
    assert torch.allclose(algo.h["a"], f64(h), atol=1e-12)
    assert torch.allclose(algo.w["a"], f64((2 + 0) / 2 - h / 0.5), atol=1e-12)
    algo.server_update(torch.tensor([1]), {"a": torch.tensor([1.0], dtype=torch.float64)}, {})  # w^t = 0.6; w_1 = 1
    h2 = h - 0.5 / 4 * (1.0 - 0.6)
    assert torch.allclose(algo.h["a"], f64(h2), atol=1e-12)
    assert torch.allclose(algo.w["a"], f64(1.0 - h2 / 0.5), atol=1e-12)
    assert torch.allclose(algo.grad_state["a"][1], f64(0.2 - 0.5 * 0.4), atol=1e-12)


def test_adaptive_alpha_scales_by_relative_client_size(tmp_path):
    """Official code: α_k = α / (n_k·N/Σn); our default uses α for every client."""
    run = setup_run(tmp_path, "feddyn", "algorithm.alpha=0.1", "algorithm.adaptive_alpha=true")
    n = run.algorithm.n
    assert torch.allclose(run.algorithm.client_alpha, 0.1 * n.sum() / (n * len(n)))
    assert len(set(n.tolist())) > 1
    plain = setup_run(tmp_path / "plain", "feddyn", "algorithm.alpha=0.1").algorithm.client_alpha
    assert torch.equal(plain, torch.full_like(plain, 0.1))


def test_sequential_equals_vectorized_and_it_learns(tmp_path):
    executors_agree_and_it_learns(tmp_path, "feddyn", "algorithm.adaptive_alpha=true")
