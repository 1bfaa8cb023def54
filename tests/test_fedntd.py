"""FedNTD: the not-true distillation term against a by-hand computation, the τ² option, executors agree."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from baseline_checks import batch, executors_agree_and_it_learns, perturbed, setup_run

from fedbench.losses import kd_kl, not_true_logits


def _hand_ntd(local: torch.Tensor, glob: torch.Tensor, y: torch.Tensor, tau: float) -> float:
    """Σ_i KL(q̃_g ‖ q̃_l)/B with q̃ = softmax over the not-true classes at temperature τ, written out."""
    total = 0.0
    for zl, zg, t in zip(local.tolist(), glob.tolist(), y.tolist()):
        keep = [c for c in range(len(zl)) if c != t]
        el = [math.exp(zl[c] / tau) for c in keep]
        eg = [math.exp(zg[c] / tau) for c in keep]
        ql = [e / sum(el) for e in el]
        qg = [e / sum(eg) for e in eg]
        total += sum(g * math.log(g / l) for g, l in zip(qg, ql))
    return total / len(y)


def test_not_true_kl_by_hand():
    """local logits (2,1,0), global (0,1,3), y=0 → not-true local (1,0), global (1,3); τ=2."""
    zl = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    zg = torch.tensor([[0.0, 1.0, 3.0]], dtype=torch.float64)
    y = torch.tensor([0])
    ql = [math.exp(0.5) / (math.exp(0.5) + 1), 1 / (math.exp(0.5) + 1)]
    qg = [math.exp(0.5) / (math.exp(0.5) + math.exp(1.5)), math.exp(1.5) / (math.exp(0.5) + math.exp(1.5))]
    kl = sum(g * math.log(g / l) for g, l in zip(qg, ql))
    assert abs(kd_kl(not_true_logits(zl, y), not_true_logits(zg, y), 2.0).item() - 4 * kl) < 1e-14
    assert abs(_hand_ntd(zl, zg, y, 2.0) - kl) < 1e-14


def test_local_loss_is_ce_plus_beta_tau2_not_true_kl_to_global(tmp_path):
    """On the tiny CNN with BatchNorm: loss = CE + β·τ²·KL(not-true global ‖ not-true local); the global
    model's logits come from its eval-mode module (independent nn.Module computation). tau_squared=false
    (official criterion.py) drops τ²."""
    beta, tau = 0.7, 2.0
    run = setup_run(tmp_path, "fedntd", "model=tiny_cnn", f"algorithm.beta={beta}", f"algorithm.tau={tau}")
    algo, fm = run.algorithm, run.fm
    w_loc = perturbed(algo.w, 0.1, 3)
    x, y = batch(run, n=12)
    ctx = {"w_global": algo.w, "bn_global": algo.bn}
    got = algo.local_loss(fm, w_loc, {k: v.clone() for k, v in algo.bn.items()}, x, y, ctx)

    def module(p, train):
        net = copy.deepcopy(fm.net)
        net.load_state_dict({**p, **algo.bn})
        return net.train(train)

    zl = module(w_loc, True)(x)
    with torch.no_grad():
        zg = module(algo.w, False)(x)
    ntd = _hand_ntd(zl.detach(), zg, y, tau)
    assert ntd > 1e-3
    assert abs(got.item() - (F.cross_entropy(zl, y).item() + beta * tau**2 * ntd)) < 1e-10
    plain = setup_run(
        tmp_path / "plain",
        "fedntd",
        "model=tiny_cnn",
        f"algorithm.beta={beta}",
        f"algorithm.tau={tau}",
        "algorithm.tau_squared=false",
    ).algorithm
    got_plain = plain.local_loss(fm, w_loc, {k: v.clone() for k, v in algo.bn.items()}, x, y, ctx)
    assert abs(got_plain.item() - (F.cross_entropy(zl, y).item() + beta * ntd)) < 1e-10


def test_sequential_equals_vectorized_and_it_learns(tmp_path):
    executors_agree_and_it_learns(tmp_path, "fedntd")
