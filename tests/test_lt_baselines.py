"""ECL's long-tail personalization baselines (docs/ecl.md, docs/baselines.md): FedAvg+LWS, FedAvg+τ-norm, FedAFA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_cfg, metrics_by_round

from fedbench import seeding
from fedbench.algorithms.oneshot import run_children, upper_logits
from fedbench.algorithms.tau_norm import select_tau, tau_normalize
from fedbench.errors import ConfigError
from fedbench.run import Run

TINY_RESNET = ["model=resnet32", "model.blocks_per_stage=1", "model.widths=[4,8,16]"]
LONGTAIL = ["partition=longtail", "partition.imbalance_factor=10", "partition.alpha=0.3"]


def _run(tmp_path, *overrides):
    run = Run(make_cfg(*LONGTAIL, *TINY_RESNET, "rounds=2", *overrides), tmp_path)
    return run, run.execute()


def _same(a, b):
    return torch.equal(a, b.expand_as(a))


# ---------------------------------------------------------------------------- τ-norm
def test_tau_normalize_rescales_rows_to_norm_power_one_minus_tau():
    W = torch.tensor([[3.0, 4.0], [0.0, 0.5]], dtype=torch.float64)  # row norms 5, 0.5
    assert torch.equal(tau_normalize(W, 0.0), W)
    assert torch.allclose(tau_normalize(W, 1.0).norm(dim=1), torch.ones(2, dtype=torch.float64))
    assert torch.allclose(tau_normalize(W, 0.5), W / torch.tensor([[5**0.5], [0.5**0.5]], dtype=torch.float64))
    # per-client τ on a stack [K, C, d]
    out = tau_normalize(torch.stack([W, W]), torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert torch.equal(out[0], W) and torch.allclose(out[1].norm(dim=1), torch.ones(2, dtype=torch.float64))


def test_select_tau_maximises_balanced_accuracy_on_local_data():
    # a head class with a 10x larger weight row swallows the tail class unless the rows are equalised
    W = torch.tensor([[10.0, 0.0], [0.0, 1.0]])
    h = torch.tensor([[1.0, 0.2], [1.0, 0.1], [0.5, 1.0]])
    y = torch.tensor([0, 0, 1])
    assert select_tau(h, y, W, None, [0.0, 0.5, 1.0]) == 1.0
    assert select_tau(h, y, W, None, [0.0, 0.5]) == 0.0  # a tie (0.5 each) keeps the first τ


def test_taunorm_personalizes_the_classifier_rows_only(tmp_path):
    run, summary = _run(tmp_path, "algorithm=fedavg_taunorm")
    algo = run.algorithm
    w, _ = algo.global_model()
    P, _ = algo.components[0]
    rows = metrics_by_round(tmp_path)
    taus = torch.tensor(rows[max(rows)]["taunorm/tau_mean"])
    assert 0.0 <= float(taus) <= 1.0
    for k in run.fm.param_names:
        if k not in ("head.0.weight", "head.0.bias"):
            assert _same(P[k], w[k]), k
    assert torch.count_nonzero(P["head.0.bias"]) == 0  # bias: drop (decoupling code)
    # each client's rows = w_c / ‖w_c‖^τ_k for one τ_k of the grid
    grid = run.cfg.algorithm.tau_grid
    for k in range(algo.K):
        assert any(torch.allclose(P["head.0.weight"][k], tau_normalize(w["head.0.weight"], t), atol=1e-6) for t in grid)

    run, _ = _run(tmp_path / "fixed", "algorithm=fedavg_taunorm", "algorithm.tau=1.0")
    rows = run.algorithm.components[0][0]["head.0.weight"]
    assert torch.allclose(rows.norm(dim=-1), torch.ones(rows.shape[:2]), atol=1e-6)


def test_taunorm_selects_tau_on_the_classifier_input_below_hidden_head_layers(tmp_path):
    run = Run(make_cfg(*LONGTAIL, "model=mlp", "model.head_hidden=[16]", "algorithm=fedavg_taunorm"), tmp_path)
    run.setup()
    algo, net = run.algorithm, run.fm.net
    w, bn = algo.global_model()
    seen = []
    hook = net.head[2].register_forward_hook(lambda m, inp, out: seen.append(inp[0].detach()))  # the classifier
    net.eval()
    with torch.no_grad():
        net(run.data.x[run.data.tensor(run.data.train_idx[0])])
    hook.remove()
    assert torch.allclose(algo.classifier_inputs(w, bn)[0], seen[0], atol=1e-6)


# ---------------------------------------------------------------------------- LWS
def test_lws_learns_only_per_class_scales(tmp_path):
    run, _ = _run(tmp_path, "algorithm=fedavg_lws", "algorithm.phase2_epochs=2")
    algo = run.algorithm
    w, bn = algo.global_model()
    P, B = algo.components[0]
    for k in run.fm.param_names:
        if k not in ("head.0.weight", "head.0.bias"):
            assert _same(P[k], w[k]), k
    assert all(_same(B[k], bn[k]) for k in bn)  # backbone statistics frozen too
    # ŵ_c = f_c w_c and b̂_c = f_c b_c with one f_c per (client, class)
    f = P["head.0.weight"].norm(dim=-1) / w["head.0.weight"].norm(dim=-1)
    assert torch.allclose(P["head.0.weight"], f.unsqueeze(-1) * w["head.0.weight"], atol=1e-5)
    assert torch.allclose(P["head.0.bias"], f * w["head.0.bias"], atol=1e-5)
    assert (f - 1).abs().max() > 1e-3  # it learned something


def test_lws_sequential_equals_vectorized_fp64(tmp_path):
    out = {}
    for ex in ("sequential", "vectorized"):
        run, summary = _run(
            tmp_path / ex,
            "algorithm=fedavg_lws",
            "rounds=1",
            "clients=4",
            "algorithm.phase2_epochs=1",
            f"hardware.executor={ex}",
            "hardware.precision=fp64",
        )
        out[ex] = (run.algorithm.components[0][0], summary)
    (Pa, sa), (Pb, sb) = out["sequential"], out["vectorized"]
    for k in Pa:
        assert torch.allclose(Pa[k], Pb[k], atol=1e-10, rtol=0), k
    assert sa["final"]["pers_client_class_acc"] == sb["final"]["pers_client_class_acc"]


# ---------------------------------------------------------------------------- FedAFA
def test_fedafa_generated_features_move_toward_the_target_class(tmp_path):
    run = Run(make_cfg(*LONGTAIL, *TINY_RESNET, "algorithm=fedafa", "algorithm.attack_steps=10"), tmp_path)
    run.setup()
    algo, fm = run.algorithm, run.fm
    w, bn = algo.global_model()
    x = run.data.x[:16]
    targets = (run.data.y[:16] + 1) % run.data.num_classes  # a class other than the true one
    g = seeding.torch_generator(0, "test")
    feats, ok = algo.generate(fm, w, bn, x, targets, g)
    fm.set_mode(False)
    with torch.no_grad():
        start = run_children(fm, "body", w, bn, x, 0, algo.cut)
        before = F.softmax(upper_logits(fm, w, bn, start, algo.cut), -1).gather(1, targets[:, None])
        after = F.softmax(upper_logits(fm, w, bn, feats, algo.cut), -1).gather(1, targets[:, None])
    fm.set_mode(True)
    assert feats.shape == start.shape and (feats >= 0).all()
    assert after.mean() > before.mean() + 0.05
    assert torch.equal(ok, after.squeeze(1) >= algo.p_threshold)


def test_fedafa_trains_only_the_upper_part_and_falls_back_to_sequential(tmp_path):
    out = {}
    for ex in ("sequential", "vectorized"):
        run, summary = _run(
            tmp_path / ex,
            "algorithm=fedafa",
            "rounds=1",
            "clients=4",
            "algorithm.phase2_batch_size=16",
            f"hardware.executor={ex}",
            "hardware.precision=fp64",
        )
        out[ex] = (run, summary)
    run, summary = out["sequential"]
    algo = run.algorithm
    assert algo.cut == 5  # stage 3 and the classifier train (code: first 63 tensors frozen)
    w, _ = algo.global_model()
    P, _ = algo.components[0]
    lower = [k for k in run.fm.param_names if k not in algo.trainable]
    assert lower and all(_same(P[k], w[k]) for k in lower)
    assert all(not _same(P[k], w[k]) for k in algo.fm.names("classifier"))
    rows = metrics_by_round(run.run_dir)
    last = rows[max(rows)]
    assert last["fedafa/slots"] > 0 and 0 <= last["fedafa/accept_rate"] <= 1
    # the vectorized run's phase II ran sequentially (same random draws): the same personalized models
    Pv, _ = out["vectorized"][0].algorithm.components[0]
    assert all(torch.allclose(P[k], Pv[k], atol=1e-10, rtol=0) for k in P)


def test_bad_config_values_fail_in_setup(tmp_path):
    for alg, bad, key in (
        ("fedavg_taunorm", "algorithm.tau=-1", "algorithm.tau"),
        ("fedavg_taunorm", "algorithm.tau_grid=[]", "algorithm.tau_grid"),
        ("fedavg_lws", "algorithm.phase2_lr=0", "algorithm.phase2_lr"),
        ("fedafa", "algorithm.c=2", "algorithm.c"),
        ("fedafa", "algorithm.feature_layer=99", "algorithm.feature_layer"),
    ):
        with pytest.raises(ConfigError) as e:
            Run(make_cfg(*LONGTAIL, *TINY_RESNET, f"algorithm={alg}", bad), tmp_path).setup()
        assert e.value.key == key


def test_lws_scales_are_sgd_on_class_balanced_batches_by_hand(tmp_path):
    """Phase II of LWS on one client, replayed by hand: f = 1, then one plain SGD step of CE(f ⊙ z, y) per batch of a
    class-balanced schedule (samples drawn with probability ∝ 1/n_y, computed here from the client's labels); the
    personalized classifier rows are f_c·w_c. A uniform schedule (no class balancing) gives other scales."""
    from fedbench.engine.schedule import make_schedule

    lr, B = 0.5, 8
    run = Run(
        make_cfg(
            "algorithm=fedavg_lws",
            "hardware.precision=fp64",
            "clients=3",
            "optim.momentum=0.0",
            "algorithm.phase2_epochs=1",
            f"algorithm.phase2_lr={lr}",
            f"algorithm.phase2_batch_size={B}",
        ),
        tmp_path,
    )
    run.setup()
    algo, fm, data = run.algorithm, run.fm, run.data
    w, bn = algo.global_model()
    algo.personalize(1, w, bn)
    P, _ = algo.components[0]
    k = 1
    idx = data.train_idx[k]
    labels = data.y[data.tensor(idx)].cpu().numpy()
    counts = np.bincount(labels, minlength=data.num_classes)
    assert counts[counts > 0].min() < counts.max()  # an imbalanced client
    sched = make_schedule(
        [idx], [k], B, algo.seed, "lws", 1, epochs=1, drop_last=bool(run.cfg.drop_last), weights=[1.0 / counts[labels]]
    )[0]
    f = torch.ones(data.num_classes, dtype=torch.float64)
    with torch.no_grad():
        z_all = {int(i): z for i, z in zip(torch.cat(sched), fm(w, bn, data.x[torch.cat(sched)]))}
    for i in sched:
        z = torch.stack([z_all[int(j)] for j in i])
        g = f.clone().requires_grad_(True)
        f = f - lr * torch.autograd.grad(F.cross_entropy(z * g, data.y[i]), g)[0]
    assert torch.allclose(P["head.0.weight"][k], f.unsqueeze(1) * w["head.0.weight"], atol=1e-10)
    assert torch.allclose(P["head.0.bias"][k], f * w["head.0.bias"], atol=1e-10)


def test_fedafa_loss_weights_augmented_ce_by_c_and_plain_ce_by_one_minus_c(tmp_path):
    """FedAFA's ``train_fea``: c·CE(augmented) + (1 − c)·CE(original). With the same random draws (slots, seeds,
    noise; p = 0 accepts every generated feature), L(c) = c·L(1) + (1 − c)·CE(model(x), y), and L(0) is the plain
    CE computed here by hand."""
    run = Run(
        make_cfg(*LONGTAIL, *TINY_RESNET, "algorithm=fedafa", "hardware.precision=fp64", "algorithm.p=0.0"), tmp_path
    )
    run.setup()
    algo, fm, data = run.algorithm, run.fm, run.data
    w, bn = algo.global_model()
    k = 4  # the client with many minority classes
    i = data.tensor(data.train_idx[k])
    x, y = data.x[i], data.y[i]
    ctx = {"class_counts": algo.client_counts()[k], "client": torch.tensor(k), "w_global": w, "bn_global": bn}

    def loss(c):
        algo.c, algo._t, algo._gen, algo._stats = c, 1, {}, torch.zeros(2)  # the same draws for every c
        return algo.loss(fm, w, {n: v.clone() for n, v in bn.items()}, x, y, ctx)

    plain = F.cross_entropy(fm(w, {n: v.clone() for n, v in bn.items()}, x), y)
    augmented = loss(1.0)
    assert algo._stats[1] > 0  # generated features were used
    assert abs(augmented.item() - plain.item()) > 1e-6
    assert torch.allclose(loss(0.0), plain, atol=1e-12)
    assert torch.allclose(loss(0.6), 0.6 * augmented + 0.4 * plain, atol=1e-12)


def test_fedafa_generates_for_minority_samples_only(tmp_path):
    """A sample of class y becomes a generation slot with probability 1 − n_y / n_max: never for the client's largest
    class (a batch of it is plain CE, no slot), often for a rare class (a batch of those has slots)."""
    run = Run(
        make_cfg(*LONGTAIL, *TINY_RESNET, "algorithm=fedafa", "hardware.precision=fp64", "algorithm.p=0.0"), tmp_path
    )
    run.setup()
    algo, fm, data = run.algorithm, run.fm, run.data
    w, bn = algo.global_model()
    k = 4
    counts = algo.client_counts()[k]
    idx = data.tensor(data.train_idx[k])
    y_all = data.y[idx]
    big, small = int(counts.argmax()), int(torch.where(counts > 0, counts, counts.max() + 1).argmin())
    ctx = {"class_counts": counts, "client": torch.tensor(k), "w_global": w, "bn_global": bn}
    for cls, slots in ((big, 0), (small, None)):
        i = idx[y_all == cls]
        algo.c, algo._t, algo._gen, algo._stats = 0.6, 1, {}, torch.zeros(2)
        got = algo.loss(fm, w, {n: v.clone() for n, v in bn.items()}, data.x[i], data.y[i], ctx)
        if slots == 0:
            assert algo._stats[0] == 0
            assert torch.allclose(
                got, F.cross_entropy(fm(w, {n: v.clone() for n, v in bn.items()}, data.x[i]), data.y[i]), atol=1e-12
            )
        else:
            assert algo._stats[0] > 0
