"""The new-client protocol: held-out clients never train, fine-tuning reads only their train split,
the curve's points equal a hand computation, and which algorithms fine-tune."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import build_context, make_cfg, run_cfg

from fedbench import build, seeding
from fedbench.algorithms import ALGORITHMS
from fedbench.engine.schedule import client_batches
from fedbench.engine.stack import broadcast, clone, row
from fedbench.errors import ConfigError
from fedbench.newclients import NewClients
from fedbench.run import Run

NC = ["eval.new_clients.enabled=true", "eval.new_clients.fraction=0.3", "clients=10", "hardware.precision=fp64"]


def _run(tmp_path, *overrides) -> Run:
    run = Run(make_cfg(*NC, *overrides), tmp_path)
    run.setup()
    return run


def test_held_out_clients_never_take_part_in_training(tmp_path):
    """They are never sampled, and scrambling all their data leaves the trained global model bit-identical."""
    runs = [_run(tmp_path / str(i), "algorithm=fedavg", "participation=0.5") for i in range(2)]
    ids = runs[0].new_clients.ids
    assert len(ids) == 3 and np.array_equal(ids, runs[1].new_clients.ids)
    for t in range(1, 40):
        assert not set(runs[0].sample_clients(t).tolist()) & set(ids.tolist())
        assert len(runs[0].sample_clients(t)) == 5
    data = runs[1].data
    for k in ids:
        for idx in (data.train_idx[k], data.test_idx[k]):
            i = data.tensor(idx)
            data.x[i] = torch.randn_like(data.x[i])
            data.y[i] = (data.y[i] + 3) % 10
    for t in (1, 2):
        for r in runs:
            r.algorithm.round(t, r.sample_clients(t))
    for n, v in runs[0].algorithm.w.items():
        assert torch.equal(v, runs[1].algorithm.w[n]), n


def test_finetuning_never_reads_the_test_split(tmp_path):
    """Replacing the new clients' test images and labels changes their scores but not one fine-tuned weight."""
    run = _run(tmp_path, "algorithm=fedavg_ft", "eval.new_clients.steps=3")
    nc, algo, data = run.new_clients, run.algorithm, run.data
    algo.round(1, run.sample_clients(1))
    curves = nc.curves(algo, 1)
    models = clone(nc.final_models[0])
    for k in nc.ids:
        i = data.tensor(data.test_idx[k])
        data.x[i] = torch.randn_like(data.x[i])
        data.y[i] = (data.y[i] + 1) % 10
    curves2 = nc.curves(algo, 1)
    for n, v in models.items():
        assert torch.equal(v, nc.final_models[0][n]), n
    assert not np.array_equal(curves, curves2)  # the test split is what is scored
    for m, k in enumerate(nc.ids):  # and what is trained on is the train split
        used = torch.cat([b for b in nc.schedule(1, 3)[m]]).cpu().numpy()
        assert set(used) <= set(data.train_idx[k]) and not set(used) & set(data.test_idx[k])


def test_new_clients_built_from_the_data_score_the_mean_of_their_test_batch_accuracies_without_a_run(tmp_path):
    """Built from the federated data, the ``eval.new_clients`` node, the seed and the rounds: after one FedAvg round of
    the other clients, newclients/acc (FedAvg: no fine-tuning) is the mean over the new clients of the mean accuracy
    of their shuffled test batches of B = 7, counted here batch by batch; the curves' picture goes to ``publish``."""
    B = 7
    cfg = make_cfg(*NC, "algorithm=fedavg", "model=tiny_cnn", "partition=iid", f"eval.new_clients.batch_size={B}")
    ctx = build_context(cfg, tmp_path)
    published = []
    nc = NewClients(ctx.data, cfg.eval.new_clients, cfg.seed, cfg.rounds, lambda *a: published.append(a))
    algo = ALGORITHMS["fedavg"](ctx)
    algo.setup()
    clients = build.sample_clients(cfg, ctx.data.num_clients, nc, 1)
    assert len(nc.ids) == 3 and not set(clients.tolist()) & set(nc.ids.tolist())
    algo.round(1, clients)
    out = nc(algo, 1)

    data, fm = ctx.data, ctx.fm
    fm.set_mode(False)
    per_client, pooled = [], []
    with torch.no_grad():
        for k in nc.ids.tolist():
            test = data.test_idx[k]
            order = data.tensor(test[seeding.rng(cfg.seed, "new_clients_test", 1, 0, k).permutation(len(test))])
            right = (fm(algo.w, algo.bn, data.x[order]).argmax(1) == data.y[order]).double()
            per_client.append(np.mean([float(right[i : i + B].mean()) for i in range(0, len(right), B)
                                       if len(right[i : i + B]) > 1]))  # fmt: skip
            pooled.append(float(right.mean()))
    fm.set_mode(True)
    assert not np.allclose(per_client, pooled)  # batch means differ from the pooled accuracy here
    assert out["newclients/acc"] == pytest.approx(np.mean(per_client), abs=1e-12)
    nc.summary(tmp_path)
    assert published == [("newclients/curves", tmp_path / "newclients_curves.png", 1)]


def test_curve_equals_hand_computation(tmp_path):
    """Accuracy = mean over shuffled test batches of size B (size-1 batches skipped) before every step; step s is
    plain SGD at lr·0.8^(s//5) on the s-th train batch, starting from the global model."""
    S, lr, B = 6, 0.2, 8
    run = _run(
        tmp_path,
        "algorithm=fedavg_ft",
        f"eval.new_clients.steps={S}",
        f"eval.new_clients.lr={lr}",
        f"batch_size={B}",
        "eval.new_clients.lr_decay_every=5",
        "eval.new_clients.lr_decay=0.8",
    )
    nc, algo, data, fm = run.new_clients, run.algorithm, run.data, run.fm
    curves = nc.curves(algo, 7)
    m, k = 1, int(nc.ids[1])
    p = {n: v.clone() for n, v in algo.w.items()}
    train = data.train_idx[k]
    batches = client_batches(
        train, min(B, len(train)), seeding.rng(run.cfg.seed, "batches", "new_clients", 7, k), steps=S, drop_last=True
    )
    for s in range(S + 1):
        test = data.test_idx[k]
        order = test[seeding.rng(run.cfg.seed, "new_clients_test", 7, s, k).permutation(len(test))]
        accs = [
            (fm(p, algo.bn, data.x[data.tensor(order[i : i + B])]).argmax(1) == data.y[data.tensor(order[i : i + B])])
            .double()
            .mean()
            .item()
            for i in range(0, len(order), B)
            if len(order[i : i + B]) > 1
        ]
        assert curves[m, s] == pytest.approx(np.mean(accs), abs=1e-12)
        if s < S:
            q = {n: v.clone().requires_grad_(True) for n, v in p.items()}
            i = data.tensor(batches[s])
            g = torch.autograd.grad(F.cross_entropy(fm(q, algo.bn, data.x[i]), data.y[i]), list(q.values()))
            p = {n: p[n] - lr * 0.8 ** (s // 5) * gi for n, gi in zip(p, g)}
    for n in p:
        assert torch.allclose(row(nc.final_models[0], m)[n], p[n], atol=1e-12, rtol=0), n


@pytest.mark.parametrize("algorithm,steps", [("fedavg", 0), ("fedavg_ft", 4), ("ifca", 0), ("ifca_ft", 4)])
def test_which_algorithms_fine_tune(tmp_path, algorithm, steps):
    """Table 1: FedAvg and IFCA are scored on their start model, their -FT rows after S steps; summary has the curve."""
    extra = ["algorithm.clusters=2"] if algorithm.startswith("ifca") else []
    s = run_cfg(
        make_cfg(
            *NC,
            "logger.pictures=true",
            f"algorithm={algorithm}",
            "eval.new_clients.steps=4",
            "rounds=1",
            "eval.personalized=false",
            "eval.global_model=false",
            *extra,
        ),
        tmp_path,
    )
    assert len(s["newclients/curve"]) == steps + 1 and s["newclients/steps"] == steps
    assert s["newclients/acc"] == pytest.approx(s["newclients/curve"][-1])
    assert s["metrics"]["newclients/acc"]["last"] == pytest.approx(s["newclients/acc"])
    assert (tmp_path / "newclients_curves.png").exists()


def test_cafeme_uses_its_own_finetuning_lr(tmp_path):
    run = _run(
        tmp_path,
        "algorithm=cafeme",
        "model=cafeme_mnist",
        "model.channels=[4,8]",
        "model.kernel_size=3",
        "model.padding=1",
        "eval.new_clients.lr=0.001",
        "eval.new_clients.lr_pfl=0.05",
    )
    assert run.new_clients.lr_for(run.algorithm) == 0.05
    base = _run(tmp_path / "b", "algorithm=fedavg_ft", "eval.new_clients.lr=0.001", "eval.new_clients.lr_pfl=0.05")
    assert base.new_clients.lr_for(base.algorithm) == 0.001


@pytest.mark.parametrize(
    "key,value", [("fraction", 0.0), ("fraction", 0.01), ("steps", -1), ("lr", 0), ("lr_decay_every", 0)]
)
def test_bad_values_fail_before_training(tmp_path, key, value):
    with pytest.raises(ConfigError) as e:
        _run(tmp_path, "algorithm=fedavg", f"eval.new_clients.{key}={value}")
    assert e.value.key == f"eval.new_clients.{key}"


def test_a_test_batch_of_one_sample_is_skipped(tmp_path):
    """Code perfl_eval skips test batches of size 1 (BatchNorm needs two samples): with B = n - 1 a new client's test
    split is one batch of n - 1 samples and one of 1 sample, and its accuracy is that of the first batch alone."""
    probe = _run(tmp_path / "probe", "algorithm=fedavg")
    m, k = 0, int(probe.new_clients.ids[0])
    n = len(probe.data.test_idx[k])  # the same split in the run below (seed)
    assert n >= 4
    run = _run(tmp_path, "algorithm=fedavg", f"eval.new_clients.batch_size={n - 1}")
    nc, algo, data, fm = run.new_clients, run.algorithm, run.data, run.fm
    test = data.test_idx[k]
    assert len(test) == n and int(nc.ids[0]) == k
    order = test[seeding.rng(run.cfg.seed, "new_clients_test", 3, 0, k).permutation(n)]
    first, last = data.tensor(order[:-1]), data.tensor(order[-1:])
    correct = [(fm(algo.w, algo.bn, data.x[i]).argmax(1) == data.y[i]).double() for i in (first, last)]
    with_single = (correct[0].mean() + correct[1].mean()).item() / 2
    assert correct[0].mean().item() != pytest.approx(with_single)  # the rule changes the number here
    M = len(nc.ids)  # every new client scores the global model
    support = [data.tensor(data.train_idx[int(j)][:2]) for j in nc.ids]
    acc = nc.accuracy(algo, broadcast(algo.w, M), broadcast(algo.bn, M), support, 3, 0)
    assert float(acc[m]) == pytest.approx(correct[0].mean().item(), abs=1e-12)
