"""FedFomo: the first-order weights on hand-made losses/distances, ε-greedy peer choice, and a real
round's validation split, mixing matrix and affinity (docs/pfl_baselines_b.md)."""

from __future__ import annotations

import numpy as np
import torch
from conftest import make_cfg

from fedbench.algorithms.fedfomo import epsilon_greedy, fomo_weights, pair_distances
from fedbench.algorithms.local import LocalInputs
from fedbench.run import Run

FP64 = ["hardware.precision=fp64", "hardware.threads=1"]


def _setup(tmp_path, *overrides) -> Run:
    run = Run(make_cfg("algorithm=fedfomo", *FP64, *overrides), tmp_path)
    run.setup()
    return run


def test_fedfomo_weights_by_hand():
    """w = (L(θ_k) − L(θ_j)) / ‖θ_j − θ_k‖; w̃ = max(w, 0) normalised; no positive weight -> all zero."""
    own = torch.tensor([1.0, 1.0], dtype=torch.float64)
    peer = torch.tensor([[0.5, 1.5, 0.8], [1.2, 1.1, 0.0]], dtype=torch.float64)
    dist = torch.tensor([[1.0, 1.0, 2.0], [1.0, 1.0, 5.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True], [True, True, False]])
    w, wn = fomo_weights(own, peer, dist, valid)
    assert torch.allclose(w[0], torch.tensor([0.5, -0.5, 0.1], dtype=torch.float64), atol=1e-5)
    assert torch.allclose(wn[0], torch.tensor([5 / 6, 0.0, 1 / 6], dtype=torch.float64), atol=1e-5)
    assert w[1, 2] == 0 and torch.equal(wn[1], torch.zeros(3, dtype=torch.float64))  # padded slot, no gain


def test_fedfomo_parameter_distance_spans_all_tensors():
    stack = {
        "w": torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 0.0]]),
        "b": torch.tensor([[0.0], [4.0], [1.0]]),
        "count": torch.tensor([1, 2, 3]),
    }
    a, b = torch.tensor([1, 2]), torch.tensor([0, 0])
    assert torch.allclose(pair_distances(stack, a, b), torch.tensor([5.0, 1.0], dtype=torch.float64))
    assert torch.allclose(pair_distances(stack, a, b, "l1"), torch.tensor([7.0, 1.0], dtype=torch.float64))


def test_fedfomo_epsilon_greedy_peer_choice():
    aff = np.array([0.0, 5.0, -1.0, 3.0, 2.0, 9.0])
    cand = [1, 2, 3, 4, 5]
    assert epsilon_greedy(aff, cand, 3, 0.0, np.random.default_rng(0)) == [5, 1, 3]  # greedy: top affinity
    for s in range(5):
        p = epsilon_greedy(aff, cand, 4, 1.0, np.random.default_rng(s))
        assert len(set(p)) == 4 and set(p) <= set(cand)
    assert epsilon_greedy(aff, [2], 5, 0.3, np.random.default_rng(0)) == [2]
    assert epsilon_greedy(aff, [], 5, 0.3, np.random.default_rng(0)) == []


def test_fedfomo_rounds_split_mix_and_affinity(tmp_path):
    """A fixed 20% validation split disjoint from the training part; round 1 has no peer (nobody uploaded) so
    clients start from their own model; in round 2 the start model is A @ θ with the Eq. 7 rows and the
    affinity of the chosen peers moved."""
    run = _setup(tmp_path, "algorithm.M=2")
    algo = run.algorithm
    for k in range(algo.K):
        assert len(np.intersect1d(algo.val_idx[k], algo.fit_idx[k])) == 0
        assert len(algo.val_idx[k]) == int(0.2 * len(run.data.train_idx[k]))
    A1, m1 = algo.first_order_update(torch.arange(5), [[] for _ in range(5)])
    assert torch.equal(A1, torch.eye(5, dtype=torch.float64)) and m1 == {}
    algo.round(1, torch.arange(5))
    assert algo.uploaded.all() and torch.count_nonzero(algo.affinity) == 0
    peers = [[1, 2], [0, 3], [0, 4], [1, 4], [2, 3]]
    A, _ = algo.first_order_update(torch.arange(5), peers)
    assert torch.allclose(A.sum(1), torch.ones(5, dtype=torch.float64), atol=1e-12)  # θ_k + Σ w̃ (θ_j − θ_k)
    for i, p in enumerate(peers):
        outside = [j for j in range(5) if j not in p and j != i]
        assert torch.all(A[i, outside] == 0) and torch.all(A[i, p] >= 0)
        assert torch.count_nonzero(algo.affinity[i, p]) == 2 and torch.all(algo.affinity[i, outside] == 0)


def test_fedfomo_scores_peers_on_the_validation_split_and_trains_on_the_rest(tmp_path):
    """Round 1 (no peers yet): each client trains its own model on its training part only (``fit_idx``, not the
    validation split). Round 2: the affinity gains w_kj = (L_val(θ_k) − L_val(θ_j)) / (‖θ_j − θ_k‖ + 1e-5) with the
    losses computed here by hand on the client's validation split."""
    import torch.nn.functional as F

    run = _setup(tmp_path, "clients=3", "algorithm.M=2")
    algo, fm, data = run.algorithm, run.fm, run.data
    w0 = {n: v.clone() for n, v in algo.P.items()}
    clients = torch.arange(3)
    algo.round(1, clients)
    from fedbench.engine.stack import broadcast

    replay = algo.local_train(
        1,
        clients,
        (broadcast({n: v[0] for n, v in w0.items()}, 3), algo.B),
        algo.train_spec,
        LocalInputs(indices=[algo.fit_idx[k] for k in range(3)]),
    )
    for n in algo.P:
        assert torch.allclose(algo.P[n], replay.params[n], atol=1e-12, rtol=0), n
    P = {n: v.clone() for n, v in algo.P.items()}

    def val_loss(k, j):
        i = data.tensor(algo.val_idx[k])
        fm.set_mode(False)
        with torch.no_grad():
            out = F.cross_entropy(
                fm({n: v[j] for n, v in P.items()}, {n: v[j] for n, v in algo.B.items()}, data.x[i]), data.y[i]
            ).item()
        fm.set_mode(True)
        return out

    peers = [[1, 2], [2, 0], [0, 1]]
    algo.first_order_update(clients, peers)
    for k, ps in enumerate(peers):
        for j in ps:
            dist = sum(((P[n][j] - P[n][k]) ** 2).sum() for n in P).sqrt().item()
            expected = (val_loss(k, k) - val_loss(k, j)) / (dist + 1e-5)
            assert abs(algo.affinity[k, j].item() - expected) < 1e-9, (k, j)
