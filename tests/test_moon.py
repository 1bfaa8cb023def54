"""MOON: ℓ_con on hand-made vectors, the full local loss against an independent nn.Module computation
(references in eval mode, untouched), the previous-model bookkeeping, executor equivalence."""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from baseline_checks import batch, executors_agree_and_it_learns, perturbed, setup_run

from fedbench.algorithms.moon import model_contrastive
from fedbench.engine.stack import row, tagged


def test_model_contrastive_loss_by_hand():
    """z=(1,0): cos with z_glob=(1,1) is 1/√2, with z_prev=(0,2) is 0; second sample: z=(0,1), z_glob=(0,3)
    (cos 1), z_prev=(1,0) (cos 0). τ=0.5 → ℓ = mean(log(1+e^{−√2}), log(1+e^{−2}))."""
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    zg = torch.tensor([[1.0, 1.0], [0.0, 3.0]], dtype=torch.float64)
    zp = torch.tensor([[0.0, 2.0], [1.0, 0.0]], dtype=torch.float64)
    expected = (math.log(1 + math.exp(-math.sqrt(2))) + math.log(1 + math.exp(-2))) / 2
    assert abs(model_contrastive(z, zg, zp, 0.5).item() - expected) < 1e-15
    # previous == global: the term is the constant log 2 (no gradient), MOON's first round
    assert abs(model_contrastive(z, zg, zg, 0.5).item() - math.log(2)) < 1e-15


def test_local_loss_is_ce_plus_mu_contrastive_with_eval_mode_references(tmp_path):
    """On the tiny CNN with BatchNorm: loss = CE(local logits, train mode) + μ·ℓ_con(z, z_glob, z_prev) where
    z_glob, z_prev are body outputs of the global / previous models in eval mode (MOON's code); computed
    here independently with nn.Module copies. The references' BN statistics are not modified."""
    mu, tau = 2.0, 0.3
    run = setup_run(tmp_path, "moon", "model=tiny_cnn", f"algorithm.mu={mu}", f"algorithm.tau={tau}")
    algo, fm = run.algorithm, run.fm
    w_loc, w_prev = perturbed(algo.w, 0.05, 1), perturbed(algo.w, 0.05, 2)
    bn_prev = {k: (v + 0.1 if v.is_floating_point() else v) for k, v in algo.bn.items()}   # distinct running stats
    x, y = batch(run, n=12)
    ctx = {"w_global": algo.w, "bn_global": algo.bn, **tagged(w_prev, "w_prev"), **tagged(bn_prev, "bn_prev")}
    before = [{k: v.clone() for k, v in d.items()} for d in (algo.bn, bn_prev)]
    bn_loc = {k: v.clone() for k, v in algo.bn.items()}            # the local model's own statistics (updated)
    got = algo.loss(fm, w_loc, bn_loc, x, y, ctx)

    def module(p, b, train):
        net = copy.deepcopy(fm.net)
        net.load_state_dict({**p, **b})
        return net.train(train)

    local = module(w_loc, before[0], True)
    z = local.body(x)
    with torch.no_grad():
        zg = module(algo.w, algo.bn, False).body(x)
        zp = module(w_prev, bn_prev, False).body(x)
    pos, neg = F.cosine_similarity(z, zg), F.cosine_similarity(z, zp)
    l_con = (-(pos / tau) + torch.logsumexp(torch.stack([pos, neg], 1) / tau, 1)).mean()
    expected = F.cross_entropy(local.head(z), y) + mu * l_con
    assert torch.allclose(got, expected, atol=1e-12, rtol=0)
    assert abs(l_con.item() - math.log(2)) > 1e-3                 # the contrastive term is non-trivial here
    for now, then in zip((algo.bn, bn_prev), before):
        assert all(torch.equal(now[k], then[k]) for k in now)


def test_previous_model_is_the_clients_last_trained_model(tmp_path):
    """After a round, participants' previous models are exactly their trained models; others keep the
    initial global model (MOON initialises every previous model as the global model)."""
    run = setup_run(tmp_path, "moon", "model=tiny_cnn")
    algo = run.algorithm
    w0 = {k: v.clone() for k, v in algo.w.items()}
    clients = torch.tensor([1, 3])
    algo.round(1, clients)
    for k in w0:
        assert torch.equal(algo.prev_w[k][0], w0[k]) and torch.equal(algo.prev_w[k][2], w0[k])
    # the global model is the n_k-weighted average of the two previous (= trained) models
    n = algo.n[clients].to(torch.float64)
    for k in w0:
        avg = (n[0] * algo.prev_w[k][1] + n[1] * algo.prev_w[k][3]) / n.sum()
        assert torch.allclose(algo.w[k], avg, atol=1e-12), k
    assert not torch.equal(row(algo.prev_w, 1)["head.0.weight"], w0["head.0.weight"])


def test_sequential_equals_vectorized_and_it_learns(tmp_path):
    executors_agree_and_it_learns(tmp_path, "moon", "algorithm.mu=1")
