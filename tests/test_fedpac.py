"""FedPAC: the classifier-combination QP (closed forms, exhaustive check), feature statistics, the
alignment loss, and the server rule inside a real round (docs/pfl_baselines_b.md)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_cfg

from fedbench.algorithms.fedpac import (
    bias_matrix,
    combination_weights,
    feature_statistics,
    simplex_qp,
    weighted_centroids,
)
from fedbench.engine.stack import broadcast, mix, rows, select, weighted_mean
from fedbench.run import Run

FP64 = ["hardware.precision=fp64", "hardware.threads=1"]


def _setup(tmp_path, *overrides) -> Run:
    run = Run(make_cfg("algorithm=fedpac", *FP64, *overrides), tmp_path)
    run.setup()
    return run


def test_fedpac_qp_without_bias_weights_clients_by_inverse_variance():
    """Identical feature statistics (no bias term): the QP min Σ α_j² V_j on the simplex has α_j ∝ 1/V_j
    (KKT), and equal variances give the uniform combination."""
    H = torch.ones(4, 3, 2, dtype=torch.float64)
    V = torch.tensor([1.0, 2.0, 4.0, 4.0], dtype=torch.float64)
    A, failed = combination_weights(V, H)
    expected = (1 / V) / (1 / V).sum()
    assert failed == 0
    assert torch.allclose(A, expected.expand(4, 4), atol=1e-6)
    A_eq, _ = combination_weights(torch.full((3,), 0.5, dtype=torch.float64), torch.ones(3, 2, 2, dtype=torch.float64))
    assert torch.allclose(A_eq, torch.full((3, 3), 1 / 3, dtype=torch.float64), atol=1e-6)


def test_fedpac_qp_gives_the_weight_to_the_client_with_matching_statistics():
    """Clients 0 and 1 have the same class-conditional feature statistics, client 2 a very different one:
    P_0 = diag(V) + diag(0, 0, ‖H_0 − H_2‖²), so α_0 ∝ (1/v, 1/v, 1/(v + b²)) and the tiny last weight is pruned."""
    H = torch.zeros(3, 2, 2, dtype=torch.float64)
    H[0, 0] = H[1, 0] = torch.tensor([0.5, 0.0])
    H[2, 1] = torch.tensor([0.0, 30.0])
    v = 0.1
    A, _ = combination_weights(torch.full((3,), v, dtype=torch.float64), H)
    assert torch.allclose(A[0], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(A[1], torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), atol=1e-6)
    # client 2: P_2 = diag(V) + b²·[[1,1,0],[1,1,0],[0,0,0]] -> α = (a, a, 1 − 2a), a = v / (3v + 2b²) < prune
    b2 = float(((H[2] - H[0]) ** 2).sum())
    assert v / (3 * v + 2 * b2) < 1e-3
    assert torch.allclose(A[2], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), atol=1e-6)


def test_fedpac_qp_solver_matches_exhaustive_active_set_solution():
    """simplex_qp solves the QP exactly: compare with enumerating every support set S and solving its KKT system."""
    g = np.random.default_rng(3)
    for trial in range(5):
        X = g.normal(size=(5, 3))
        P = X @ X.T + np.diag(g.uniform(0.01, 0.5, size=5))
        best, best_val = None, np.inf
        for r in range(1, 6):
            for S in itertools.combinations(range(5), r):
                S = list(S)
                kkt = np.zeros((r + 1, r + 1))
                kkt[:r, :r], kkt[:r, r], kkt[r, :r] = 2 * P[np.ix_(S, S)], 1.0, 1.0
                sol = np.linalg.solve(kkt, np.r_[np.zeros(r), 1.0])
                if (sol[:r] >= -1e-12).all():
                    a = np.zeros(5)
                    a[S] = sol[:r]
                    if a @ P @ a < best_val:
                        best, best_val = a, a @ P @ a
        alpha = simplex_qp(P)
        assert alpha is not None and abs(alpha.sum() - 1) < 1e-9
        assert alpha @ P @ alpha == pytest.approx(best_val, rel=1e-7), trial
        assert np.allclose(alpha, best, atol=1e-5), trial


def test_fedpac_bias_matrix_official_outer_products_equal_the_gram_matrix():
    """D_i[j, j'] = Σ_c ⟨H_i(c) − H_j(c), H_i(c) − H_j'(c)⟩ both ways (the code's d×d outer products and one Gram)."""
    H = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for i in range(4):
        D = bias_matrix(H, i)
        assert torch.allclose(D, bias_matrix(H, i, outer=True), atol=1e-12)
        assert D[1, 2].item() == pytest.approx(float(((H[i] - H[1]) * (H[i] - H[2])).sum()))
        assert torch.all(D[i] == 0) and torch.all(D[:, i] == 0)


def test_fedpac_feature_statistics_and_centroids_by_hand():
    """V = (Σ_c π_c E‖f‖²|c − Σ_c ‖π_c μ_c‖²)/n, H = π μ (code statistics_extraction); c_y = count-weighted means."""
    means = torch.tensor([[[1.0, 0.0], [0.0, 2.0]], [[3.0, 1.0], [0.0, 0.0]]], dtype=torch.float64)
    counts = torch.tensor([[1.0, 3.0], [2.0, 0.0]], dtype=torch.float64)
    sq = torch.tensor([[1.0, 5.0], [11.0, 0.0]], dtype=torch.float64)
    V, H = feature_statistics(means, counts, sq)
    assert torch.allclose(H[0], torch.tensor([[0.25, 0.0], [0.0, 1.5]], dtype=torch.float64))
    assert V[0].item() == pytest.approx((0.25 * 1 + 0.75 * 5 - (0.25**2 * 1 + 0.75**2 * 4)) / 4)
    assert V[1].item() == pytest.approx((1.0 * 11 - 10.0) / 2)
    c, has = weighted_centroids(means, counts)
    assert torch.allclose(c, torch.tensor([[7 / 3, 2 / 3], [0.0, 2.0]], dtype=torch.float64))
    assert has.tolist() == [True, True]


def test_fedpac_alignment_loss_is_ce_plus_lambda_mse_to_centroids(tmp_path):
    run = _setup(tmp_path, "algorithm.lam=0.7")
    algo = run.algorithm
    w, bn = run.initial_params, run.initial_buffers
    idx = run.data.tensor(run.data.train_idx[0][:20])
    x, y = run.data.x[idx], run.data.y[idx]
    g = torch.Generator().manual_seed(0)
    h = run.fm.features(w, bn, x)
    T = torch.randn(10, h.shape[1], generator=g, dtype=h.dtype)
    loss = algo.aligned_loss(run.fm, w, bn, x, y, {"targets": T, "has_target": torch.ones(10, dtype=torch.bool)})
    expected = F.cross_entropy(run.fm(w, bn, x), y) + 0.7 * ((h - T[y]) ** 2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)


def test_fedpac_round_server_rule(tmp_path):
    """One real round: θ = n_k-average of the trained representations, c = count-weighted class means of the
    trained features, φ_k = Σ_j α_kj φ̂_j with α from the QP on the round-start statistics; the head phase
    moved the heads (with head_epochs=0 the body phase leaves them untouched)."""
    run = _setup(tmp_path)
    algo, clients = run.algorithm, torch.arange(5)
    seen = {}  # the round's last phase-"train" result, as the monitors keep it (Context.observers)
    run.ctx.observers.append(lambda t, ids, res, phase: seen.update({phase: res}))
    params = {**broadcast(algo.theta, 5), **rows(algo.phi, clients)}
    buffers = {**broadcast(algo.theta_buf, 5), **rows(algo.phi_buf, clients)}
    means, counts, sq = algo.class_statistics(clients, params, buffers)
    A, _ = combination_weights(*feature_statistics(means, counts, sq))
    phi0 = {k: v.clone() for k, v in algo.phi.items()}
    metrics = algo.round(1, clients)
    trained = seen["train"]
    heads = select(trained.params, algo.personal)
    assert not torch.allclose(heads["head.0.weight"], phi0["head.0.weight"])  # head phase trained them
    for k, v in mix(heads, A).items():
        assert torch.allclose(algo.phi[k], v, atol=1e-12), k
    for k, v in weighted_mean(select(trained.params, algo.shared), algo.n).items():
        assert torch.allclose(algo.theta[k], v, atol=1e-12), k
    m1, c1, _ = algo.class_statistics(clients, trained.params, trained.buffers)
    assert torch.allclose(algo.centroids, weighted_centroids(m1, c1)[0], atol=1e-12)
    assert metrics["fedpac/qp_failed"] == 0 and metrics["fedpac/self_weight"] < 1.0  # heads were combined
    run0 = _setup(tmp_path / "h0", "algorithm.head_epochs=0")
    run0.ctx.observers.append(lambda t, ids, res, phase: seen.update({phase: res}))
    run0.algorithm.round(1, clients)
    assert torch.equal(
        select(seen["train"].params, run0.algorithm.personal)["head.0.weight"],
        run0.initial_params["head.0.weight"].expand(5, -1, -1),
    )


def test_fedpac_classifier_scope_features_are_the_last_linear_input(tmp_path):
    """head_scope=classifier on a model whose head has two Linear layers: f(x) = input of the last Linear."""
    run = _setup(tmp_path, "algorithm.head_scope=classifier", "model.head_hidden=[16]")
    algo, w, bn = run.algorithm, run.initial_params, run.initial_buffers
    x = run.data.x[:7]
    h = algo.split.features(w, bn, x)
    assert h.shape == (7, 16)
    assert algo.personal == ["head.2.weight", "head.2.bias"]
    assert torch.allclose(algo.split.head(w, bn, h), run.fm(w, bn, x), atol=1e-12)
