"""IFCA: clusters start from different initialisations, each client joins its lowest-loss cluster,
and each cluster model becomes the mean of the models trained from it."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from conftest import make_cfg

from fedbench.engine.stack import rows
from fedbench.run import Run

BASE = [
    "algorithm=ifca",
    "algorithm.clusters=3",
    "model=mlp",
    "hardware.precision=fp64",
    "clients=6",
    "batch_size=8",
    "partition=shards",
    "partition.num_shards=6",
    "partition.shards_per_client=1",
]  # one class-sorted shard per client


def _run(tmp_path, *overrides) -> Run:
    run = Run(make_cfg(*BASE, *overrides), tmp_path)
    run.setup()
    return run


def _favour(algo, j, k):
    """Turn cluster j into the best constant predictor of client k's labels (zero classifier weights, bias =
    log of k's class shares): its loss is the entropy of k's label distribution, far below a random model's."""
    share = algo.data.counts[k] / algo.data.counts[k].sum()
    algo.W["head.0.weight"][j] = 0.0
    algo.W["head.0.bias"][j] = torch.log(torch.as_tensor(share) + 1e-6)


def test_each_client_joins_its_lowest_loss_cluster(tmp_path):
    run = _run(tmp_path)
    algo, data = run.algorithm, run.data
    assert not torch.allclose(algo.W["head.0.weight"][0], algo.W["head.0.weight"][1])  # independent inits
    _favour(algo, 0, 0)
    _favour(algo, 2, 5)
    for k in range(6):  # hand-computed F_k(θ_j): sum of the mini-batch cross-entropies on the train split
        idx = data.tensor(data.train_idx[k])
        losses = [
            sum(
                F.cross_entropy(
                    run.fm({n: v[j] for n, v in algo.W.items()}, {}, data.x[idx[i : i + 8]]), data.y[idx[i : i + 8]]
                ).item()
                for i in range(0, len(idx), 8)
            )
            for j in range(3)
        ]
        assert algo.cluster_losses(torch.tensor([k]))[0].tolist() == losses
    assign = algo.assign(torch.arange(6)).tolist()
    assert assign[0] == 0 and assign[5] == 2
    assert assign == [int(np.argmin(r)) for r in algo.cluster_losses(torch.arange(6)).tolist()]


def test_cluster_models_are_the_means_of_their_clients(tmp_path):
    run = _run(tmp_path, "optim.momentum=0.0")
    algo = run.algorithm
    _favour(algo, 0, 1)
    _favour(algo, 1, 3)
    clients = torch.tensor([1, 3, 4])
    j = algo.assign(clients)
    before = {n: v.clone() for n, v in algo.W.items()}
    local = algo.local_train(1, clients, (rows(before, j), rows(algo.WB, j)), algo.train_spec)  # what the round trains
    algo.round(1, clients)
    for c in range(3):
        members = (j == c).nonzero().flatten()
        for n in algo.W:
            expected = local.params[n][members].mean(0) if len(members) else before[n][c]
            assert torch.allclose(algo.W[n][c], expected, atol=1e-12, rtol=0), (c, n)
    assert j[0] == 0 and j[1] == 1


def test_new_clients_start_from_their_lowest_loss_cluster(tmp_path):
    run = _run(tmp_path, "eval.new_clients.enabled=true", "eval.new_clients.fraction=0.34")
    algo = run.algorithm
    ids = torch.as_tensor(run.new_clients.ids)
    P, _ = algo.new_client_model(ids)
    j = algo.assign(ids)
    for n in P:
        assert torch.equal(P[n], algo.W[n][j])


def test_a_cluster_nobody_chose_keeps_its_model(tmp_path):
    """IFCA Alg. 2: θ_j is replaced by the mean of its clients' models only when some client chose j."""
    run = _run(tmp_path)
    algo = run.algorithm
    _favour(algo, 1, 2)
    before = {n: v.clone() for n, v in algo.W.items()}
    j = int(algo.assign(torch.tensor([2]))[0])
    algo.round(1, torch.tensor([2]))
    assert j == 1
    for n in algo.W:
        assert not torch.equal(algo.W[n][1], before[n][1]), n
        assert torch.equal(algo.W[n][0], before[n][0]) and torch.equal(algo.W[n][2], before[n][2]), n
