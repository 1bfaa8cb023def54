"""ECL (spec ecl.md): data grouping, BSCE, Eq. 5–6 arithmetic, phase-II mechanics, executors, tail accuracy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_cfg

from fedbench.algorithms.ecl import ECL, expert_of_class, logit_scales, mixing_weights
from fedbench.algorithms.fedprox import FedProx
from fedbench.algorithms.local import LocalInputs, LocalSpec
from fedbench.algorithms.oneshot import (
    class_set_accuracy,
    classifier_names,
    combine_logits,
    expert_groups,
    head_tail_accuracy,
)
from fedbench.engine.stack import broadcast, rows
from fedbench.errors import ConfigError
from fedbench.losses import balanced_softmax_ce
from fedbench.metrics import present_class_accuracy
from fedbench.run import Run

# a 1-block-per-stage ResNet with BatchNorm and a declared last block, small enough for the 8x8 digits
TINY_RESNET = ["model=resnet32", "model.blocks_per_stage=1", "model.widths=[4,8,16]"]
LONGTAIL = ["partition=longtail", "partition.imbalance_factor=10", "partition.alpha=0.3"]


def _run(tmp_path, *overrides):
    run = Run(make_cfg(*LONGTAIL, *overrides), tmp_path)
    return run, run.execute()


# ---------------------------------------------------------------------------- pure math
def test_expert_groups_sort_present_classes_by_count_and_cut_contiguously():
    counts = np.array([0, 5, 100, 7, 7, 1, 0, 30])
    # present classes by descending count (ties: lower index first): 2, 7, 3, 4, 1, 5
    assert [g.tolist() for g in expert_groups(counts, 2)] == [[2, 7, 3], [4, 1, 5]]
    assert [g.tolist() for g in expert_groups(counts, 1)] == [[2, 7, 3, 4, 1, 5]]
    # ⌈6/4⌉ = 2 classes per group (ECL §3.1: ⌈|C_k|/M⌉ per group): the last expert gets nothing; `even` keeps every
    # expert busy
    assert [g.tolist() for g in expert_groups(counts, 4)] == [[2, 7], [3, 4], [1, 5], []]
    assert [g.tolist() for g in expert_groups(counts, 4, "even")] == [[2, 7], [3, 4], [1], [5]]
    owner = expert_of_class([expert_groups(counts, 2)], 8)
    assert owner.tolist() == [[0, 2, 1, 1, 2, 2, 0, 1]]


def test_balanced_softmax_ce_is_ce_for_uniform_counts_and_masks_absent_classes():
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 1, 0])
    assert torch.allclose(balanced_softmax_ce(z, y, torch.full((4,), 7.0)), F.cross_entropy(z, y), atol=1e-12)
    # Eq. 3 by hand: -log(n_y e^{z_y} / Σ_j n_j e^{z_j})
    n = torch.tensor([50.0, 5.0, 1.0, 20.0], dtype=torch.float64)
    hand = -(torch.log(n[y] * z[torch.arange(6), y].exp()) - torch.log((n * z.exp()).sum(1))).mean()
    assert torch.allclose(balanced_softmax_ce(z, y, n), hand, atol=1e-12)
    # a class with n = 0 is (effectively) out of the softmax
    n0, keep = torch.tensor([3.0, 3.0, 0.0, 3.0], dtype=torch.float64), [0, 1, 3]
    sub_y = torch.tensor([keep.index(int(c)) for c in y[y != 2]])
    assert torch.allclose(
        balanced_softmax_ce(z[y != 2], y[y != 2], n0), F.cross_entropy(z[y != 2][:, keep], sub_y), atol=1e-5
    )


def test_logit_scales_eq5_norm_ratio_squared_per_class_and_none():
    u0 = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # K=1, C=2, d=2: ‖u0‖² = 5, rows 1 and 4
    ue = torch.tensor([[[[2.0, 0.0], [0.0, 1.0]]], [[[0.0, 3.0], [4.0, 0.0]]]])  # M=2: ‖u1‖² = 5, ‖u2‖² = 25
    s = logit_scales(u0, ue, "norm")
    assert s.shape == (1, 2, 2) and torch.allclose(s, torch.tensor([[[1.0, 1.0], [5.0, 5.0]]]))
    assert torch.allclose(logit_scales(u0, ue, "class_norm"), torch.tensor([[[4.0, 0.25], [9.0, 4.0]]]))
    assert torch.equal(logit_scales(u0, ue, "none"), torch.ones(1, 2, 2))


def test_mixing_weights_and_combined_logits_eq6_by_hand():
    # one client, C=4: expert 1 owns classes {0, 2}, expert 2 owns {1}, class 3 absent; λ = 0.25
    owner = torch.tensor([[1, 2, 1, 0]])
    scales = torch.tensor([[[2.0] * 4, [0.5] * 4]])
    A = mixing_weights(owner, scales, 0.25)
    assert torch.allclose(
        A[0],
        torch.tensor(
            [
                [0.75, 0.75, 0.75, 1.0],  # calibrated global: 1−λ, absent → 1
                [0.5, 0.0, 0.5, 0.0],  # expert 1: λ·2 on its classes
                [0.0, 0.125, 0.0, 0.0],
            ]
        ),
    )  # expert 2: λ·0.5 on class 1
    z0, z1 = torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[10.0, 20.0, 30.0, 40.0]])
    z2 = torch.tensor([[-8.0, 8.0, 0.0, 0.0]])
    o = combine_logits(torch.stack([z0, z1, z2]), A[0])
    hand = [0.25 * 2 * 10 + 0.75 * 1, 0.25 * 0.5 * 8 + 0.75 * 2, 0.25 * 2 * 30 + 0.75 * 3, 4.0]
    assert torch.allclose(o, torch.tensor([hand]))


def test_class_set_accuracy_leaves_out_unmeasured_classes_and_clients():
    acc = np.array([[1.0, np.nan, 0.5], [0.2, 0.4, np.nan]])
    assert class_set_accuracy(acc, [np.array([0, 1]), np.array([2])]) == pytest.approx(
        1.0
    )  # client 1: nothing measured
    assert class_set_accuracy(acc, [np.array([0, 2]), np.array([0, 1])]) == pytest.approx((0.75 + 0.3) / 2)
    assert np.isnan(class_set_accuracy(acc, [np.array([1]), np.array([], dtype=int)]))


def test_present_class_accuracy_averages_the_classes_a_client_trains_on_and_is_tested_on():
    """ECL's reported metric (``pers/acc_present_classes``): per client, its class accuracies averaged over the classes
    with training samples AND test samples; a class seen only in test, or only in training, does not count."""
    class_acc = np.array([[1.0, 0.5, 0.0, 0.25], [0.2, 0.5, 0.6, 0.8], [0.9, 0.0, 0.0, 0.3]])
    train = np.array([[5, 0, 3, 1], [0, 2, 0, 0], [0, 0, 0, 3]])
    test = np.array([[2, 4, 0, 1], [1, 3, 2, 0], [1, 0, 0, 0]])
    got = present_class_accuracy(class_acc, train, test)
    # client 0: classes 0 and 3 (1 is test-only, 2 train-only) -> (1.0 + 0.25) / 2; client 1: class 1 -> 0.5;
    # client 2: its one training class has no test sample -> NaN (left out of the run's mean)
    assert got[:2].tolist() == [0.625, 0.5] and np.isnan(got[2])


def test_head_tail_accuracy_uses_local_groups_and_global_halves():
    counts = np.array([[10, 5, 1, 0], [0, 8, 0, 2]])
    acc = np.array([[1.0, 0.5, 0.0, 0.9], [0.3, 0.6, 0.3, 0.2]])
    out = head_tail_accuracy(counts, acc)
    # client 0: head {0, 1} → 0.75, tail {2} → 0; client 1: head {1} → 0.6, tail {3} → 0.2
    assert out["head_acc"] == pytest.approx((0.75 + 0.6) / 2) and out["tail_acc"] == pytest.approx(0.1)
    # totals 10, 13, 1, 2 → global head = {1, 0}: client 0 → 0.75, client 1 → 0.6; tail {2, 3} present: 0.0, 0.2
    assert out["global_head_acc"] == pytest.approx(0.675) and out["global_tail_acc"] == pytest.approx(0.1)


# ---------------------------------------------------------------------------- phase II on a real federation
def test_phase_two_trains_the_named_layers_and_predicts_with_eq6(tmp_path):
    run, summary = _run(
        tmp_path,
        *TINY_RESNET,
        "algorithm=ecl",
        "rounds=2",
        "algorithm.phase2_epochs=1",
        "optim.lr_decay_round=1",
        "optim.lr_decay_to=0.01",
        "lr=0.05",
    )
    algo: ECL = run.algorithm
    w, bn = algo.global_model()
    calibrated, head_expert, tail_expert = algo.components
    last = set(run.fm.names("last_block"))
    cls = set(run.fm.names("classifier"))
    assert last and cls

    def changed(P):
        return {k for k in run.fm.param_names if not torch.equal(P[k], w[k].expand_as(P[k]))}

    assert changed(calibrated[0]) == cls  # Eq. 3: classifier only
    assert changed(head_expert[0]) == last | cls  # m < M: last residual block + classifier
    assert changed(tail_expert[0]) == cls  # m = M: classifier only
    # frozen layers keep the global BatchNorm statistics; the head expert's last block has its own
    assert all(torch.equal(calibrated[1][k], bn[k].expand_as(calibrated[1][k])) for k in bn)
    moved = {k for k in bn if not torch.equal(head_expert[1][k], bn[k].expand_as(head_expert[1][k]))}
    assert moved and all(k.startswith(next(iter(last)).rsplit(".", 2)[0]) for k in moved)
    # experts trained on their own groups: every client's expert 1 owns its most frequent class
    counts = run.data.counts
    assert all(algo.owner[k, int(np.argmax(counts[k]))] == 1 for k in range(algo.K))
    # Eq. 5: the scale is the squared classifier-norm ratio
    wname = "head.0.weight"
    ratio = head_expert[0][wname].pow(2).sum((1, 2)) / calibrated[0][wname].pow(2).sum((1, 2))
    owned = algo.owner == 1
    assert torch.allclose(algo.mix[:, 1][owned], (0.5 * ratio.unsqueeze(1).expand_as(owned))[owned], rtol=1e-5)
    # the evaluator's logits (shared trunk) == Eq. 6 on each component's plain full-model predictions
    clients = torch.arange(algo.K)
    idx = [run.data.test_idx[k] for k in range(algo.K)]
    mixed = algo.client_logits(clients, idx, 2)
    zs = [run.predict(rows(P, clients), rows(B, clients), idx) for P, B in algo.components]
    for k in range(algo.K):
        assert torch.allclose(mixed[k], combine_logits(torch.stack([z[k] for z in zs]), algo.mix[k]), atol=1e-4)
    # issue 16.9: head/tail accuracy of each component alone and of the mixture, in the metrics and the summary
    y = run.data.y[run.data.tensor(idx[0])]
    C = run.data.num_classes

    def class_acc(logits):
        return np.array(
            [[((z.argmax(1) == y) & (y == c)).sum().item() / (y == c).sum().item() for c in range(C)] for z in logits]
        )

    for name, logits in (("calibrated", zs[0]), ("expert1", zs[1]), ("expert2", zs[2]), (None, mixed)):
        ht = head_tail_accuracy(run.data.counts, class_acc(logits))
        for part in ("head_acc", "tail_acc"):
            key = f"lt/{name}/{part}" if name else f"lt/{part}"
            assert summary["metrics"][key]["last"] == pytest.approx(ht[part]) == summary[key], key
    # the predictors are self-contained: a later change of the phase-I model does not leak into them
    algo.phase1.w = {k: torch.zeros_like(v) for k, v in algo.phase1.w.items()}
    assert all(torch.equal(a, b) for a, b in zip(mixed, algo.client_logits(clients, idx, 2)))
    # the last evaluation scored those predictors; the phase-I lr schedule was applied
    y = run.data.y[run.data.tensor(idx[0])]
    acc = [(mixed[k].argmax(1) == y).float().mean().item() for k in range(algo.K)]
    assert summary["final"]["pers_client_acc"] == pytest.approx(acc)
    lrs = [json.loads(line).get("train/lr") for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [v for v in lrs if v is not None] == [0.05, 0.01]
    assert {"lt/head_acc", "lt/tail_acc", "lt/component_acc_present_classes"} <= set(summary)
    # the reported present-class accuracy: per client over the classes it trains on and is tested on (this long-tail
    # federation has test samples of classes a client never trains on, so a metric that ignores training fails)
    test_counts = [np.bincount(run.data.y[run.data.tensor(i)].numpy(), minlength=C) for i in idx]
    pairs = [(k, c) for k in range(algo.K) for c in range(C) if test_counts[k][c] > 0]
    assert any(counts[k][c] == 0 for k, c in pairs)
    per_client = [
        np.mean(
            [
                acc_kc
                for c, acc_kc in enumerate(run.evaluator.last["pers_client_class_acc"][k])
                if (k, c) in pairs and counts[k][c] > 0
            ]
        )
        for k in range(algo.K)
    ]
    assert summary["metrics"]["pers/acc_present_classes"]["last"] == pytest.approx(np.mean(per_client), abs=1e-12)
    assert (tmp_path / "diagnostics" / "ecl_expert_of_class").is_dir()


def test_phase_two_sequential_equals_vectorized_fp64(tmp_path):
    out = {}
    for ex in ("sequential", "vectorized"):
        run, summary = _run(
            tmp_path / ex,
            *TINY_RESNET,
            "algorithm=ecl",
            "rounds=1",
            "clients=4",
            "algorithm.phase2_epochs=1",
            f"hardware.executor={ex}",
            "hardware.precision=fp64",
        )
        out[ex] = (run.algorithm, summary)
    (a, sa), (b, sb) = out["sequential"], out["vectorized"]
    for (Pa, Ba), (Pb, Bb) in zip(a.components, b.components):
        for k in Pa:
            assert torch.allclose(Pa[k], Pb[k], atol=1e-10, rtol=0), k
        for k in Ba:
            assert torch.allclose(Ba[k].double(), Bb[k].double(), atol=1e-10, rtol=0), k
    assert torch.allclose(a.mix, b.mix, atol=1e-10)
    assert sa["final"]["pers_client_class_acc"] == sb["final"]["pers_client_class_acc"]


def test_resumed_run_equals_uninterrupted(tmp_path):
    """The checkpoint holds the phase-I method's state: resumed from round 1, phase II ends in the same predictors."""
    args = [
        *LONGTAIL,
        *TINY_RESNET,
        "algorithm=ecl",
        "rounds=2",
        "checkpoint.every=1",
        "checkpoint.keep_complete=1",
        "algorithm.phase2_epochs=1",
        "hardware.precision=fp64",
    ]
    full = Run(make_cfg(*args), tmp_path)
    full.execute()  # leaves the round-1 checkpoint
    assert (tmp_path / "checkpoints" / "round_000001.pt").exists()  # kept (checkpoint.keep_complete=1)
    (tmp_path / "summary.json").unlink()  # as if it had been killed during round 2
    status = json.loads((tmp_path / "status.json").read_text())
    (tmp_path / "status.json").write_text(json.dumps({**status, "status": "running"}))
    resumed = Run(make_cfg(*args, "resume=true"), tmp_path)
    summary = resumed.execute()
    first = [next(h["time/round"] for h in r.history if h["round"] == 1) for r in (full, resumed)]
    assert first[0] == first[1]  # round 1 came from the checkpoint
    for (Pa, Ba), (Pb, Bb) in zip(full.algorithm.components, resumed.algorithm.components):
        assert all(torch.equal(Pa[k], Pb[k]) for k in Pa) and all(torch.equal(Ba[k], Bb[k]) for k in Ba)
    assert "lt/tail_acc" in summary


def test_bad_config_values_fail_in_setup(tmp_path):
    for bad, key in (
        ("algorithm.num_experts=0", "algorithm.num_experts"),
        ("algorithm.phase_one=ecl", "algorithm.phase_one"),
        ("algorithm.mix_lambda=1.5", "algorithm.mix_lambda"),
        ("algorithm.logit_scaling=l1", "algorithm.logit_scaling"),
    ):
        with pytest.raises(ConfigError) as e:
            Run(make_cfg(*LONGTAIL, "algorithm=ecl", bad), tmp_path).setup()
        assert e.value.key == key


def test_table4_phase_one_is_resolved_by_name(tmp_path):
    run, summary = _run(tmp_path, "algorithm=ecl_fedprox", "rounds=1", "algorithm.phase2_epochs=1")
    assert isinstance(run.algorithm.phase1, FedProx) and run.algorithm.phase1.mu == run.cfg.algorithm.mu
    assert summary["status"] == "complete" and run.algorithm.components is not None


# ---------------------------------------------------------------------------- the point of ECL
def test_tail_class_accuracy_beats_fedavg_ft(tmp_path):
    """Same phase I (FedAvg, same seed, constant lr); ECL's experts vs fine-tuning the whole model.
    Measured on seeds 0/1/2 (digits, IF=10, α=0.3, 10 clients, 5 rounds): ECL tail 0.10/0.21/0.21 vs
    FedAvg-FT 0.00/0.00/0.12; the test asserts the direction on seeds 0 and 1."""
    common = [
        "model=mlp",
        "model.head_hidden=[64]",
        "clients=10",
        "rounds=5",
        "local_epochs=2",
        "eval_every=5",
        "lr=0.1",
    ]
    for seed in (0, 1):
        tails = {}
        for alg, extra in (
            ("ecl", ["algorithm.phase2_epochs=5"]),
            ("fedavg_ft", ["algorithm.ft_epochs=5", "algorithm.ft_lr=0.01"]),
        ):
            run, summary = _run(tmp_path / f"{alg}{seed}", *common, f"algorithm={alg}", f"seed={seed}", *extra)
            tails[alg] = head_tail_accuracy(run.data.counts, summary["final"]["pers_client_class_acc"])["tail_acc"]
        assert tails["ecl"] > tails["fedavg_ft"], (seed, tails)


# ---------------------------------------------------------------------------- issue 16, items 6, 7, 10
def test_experts_train_from_w_T_on_their_group_tail_balanced_and_empty_experts_take_no_part(tmp_path):
    """Issue 16.6. M = 3, ``ceil`` grouping on the 5-client long-tail digits: clients with 4 present classes get
    groups of 2, 2, 0 (4 < M·⌈4/M⌉ = 6), with 2 classes 1, 1, 0. Their tail expert is expert 2 (the last
    non-empty group): classifier only, class-balanced sampling. Expert 3 is empty for them: untrained, weight 0
    in Eq. 6, left out of the Eq. 5 scale means and of the per-component accuracies."""
    run, summary = _run(
        tmp_path,
        "model=mlp",
        "model.head_hidden=[16]",
        "algorithm=ecl",
        "algorithm.num_experts=3",
        "rounds=1",
        "algorithm.phase2_epochs=2",
        "algorithm.phase2_batch_size=8",
        "hardware.precision=fp64",
    )
    algo: ECL = run.algorithm
    w, bn = algo.global_model()
    counts, labels, K = run.data.counts, run.data.y.cpu().numpy(), algo.K
    groups = [expert_groups(counts[k], 3) for k in range(K)]
    sizes = [[len(g) for g in gs] for gs in groups]
    short = [k for k in range(K) if sizes[k][2] == 0 and sizes[k][1] > 0]
    assert short and any(s[2] > 0 for s in sizes), sizes  # both kinds of client are in this federation
    cls, head_layers = set(run.fm.names("classifier")), set(run.fm.names("head"))
    assert head_layers - cls  # non-tail experts train more than the classifier
    wname = "head.2.weight"
    non_tail = 0
    for k in range(K):
        tail = max(m for m in range(3) if sizes[k][m])
        for m in range(3):
            P = algo.components[m + 1][0]
            changed = {n for n in run.fm.param_names if not torch.equal(P[n][k], w[n])}
            if sizes[k][m] == 0:
                assert not changed, (k, m)  # never trained
                assert torch.count_nonzero(algo.mix[k, m + 1]) == 0, (k, m)  # no part in Eq. 6
                assert np.isnan(algo.component_class_acc[k, m + 1]).all()  # no part in the accuracies
            elif m == tail:
                assert changed == cls, (k, m)
                tr = run.data.train_idx[k]
                idx = tr[np.isin(labels[tr], groups[k][m])]
                _, inv, cnt = np.unique(labels[idx], return_inverse=True, return_counts=True)
                spec = LocalSpec(
                    f"ecl_expert{m + 1}", trainable=sorted(cls), epochs=2, batch_size=8, opt=algo.opt.replace(lr=0.01)
                )
                ref = algo.local_train(
                    1,
                    torch.tensor([k]),
                    (broadcast(w, 1), broadcast(bn, 1)),
                    spec,
                    LocalInputs(indices=[idx], sample_weights=[1.0 / cnt[inv]]),
                )
                assert all(torch.allclose(P[n][k], ref.params[n][0], atol=1e-12) for n in cls), (k, m)
            else:  # Eq. 4: CE from w^T on the samples of its class group only, last block (here: head) + classifier
                assert changed == head_layers, (k, m)
                tr = run.data.train_idx[k]
                idx = tr[np.isin(labels[tr], groups[k][m])]
                assert 0 < len(idx) < len(tr)
                spec = LocalSpec(
                    f"ecl_expert{m + 1}",
                    trainable=tuple(n for n in run.fm.param_names if n in head_layers),
                    epochs=2,
                    batch_size=8,
                    opt=algo.opt.replace(lr=0.01),
                )  # the default loss: plain cross-entropy
                ref = algo.local_train(
                    1, torch.tensor([k]), (broadcast(w, 1), broadcast(bn, 1)), spec, LocalInputs(indices=[idx])
                )
                assert all(torch.allclose(P[n][k], ref.params[n][0], atol=1e-12) for n in head_layers), (k, m)
                non_tail += 1
    assert non_tail >= K  # every client has at least one expert before its tail
    # Eq. 5 diagnostics: the mean scale of expert 3 is over the clients that have an expert 3
    u0 = algo.components[0][0][wname]
    ratio3 = algo.components[3][0][wname].pow(2).sum((1, 2)) / u0.pow(2).sum((1, 2))
    has3 = [k for k in range(K) if sizes[k][2]]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = next(h for h in metrics if "ecl/scale_expert3" in h)
    assert logged["ecl/scale_expert3"] == pytest.approx(float(ratio3[has3].mean()))
    assert logged["ecl/classes_expert3"] == pytest.approx(np.mean([sizes[k][2] for k in has3]))
    published = np.load(tmp_path / "diagnostics" / "ecl_logit_scale" / "round_00001.npy")  # [K, M], 0 = no expert
    assert np.allclose(published[:, 2], np.where([s[2] > 0 for s in sizes], ratio3.numpy(), 0.0))


def _eval_features(run, w, bn, x):
    run.fm.set_mode(False)
    try:
        return run.fm.features(w, bn, x)
    finally:
        run.fm.set_mode(True)


@pytest.mark.parametrize("frozen_bn", ["global", "local"])
def test_phase_two_freezes_batchnorm_in_eval_mode(tmp_path, frozen_bn):
    """Issue 16.7, on a BatchNorm ResNet. ``frozen_bn: global`` (the paper: frozen backbone) runs the frozen layers in
    eval mode: one full-batch SGD step of the calibrated classifier (momentum 0, wd 0) equals the hand-computed
    BSCE step on the phase-I model's eval-mode features, and no frozen BN statistic moves; ``local`` (FedAFA's
    code) runs them in train mode: the step is on the batch's train-mode features."""
    run, _ = _run(
        tmp_path,
        *TINY_RESNET,
        "algorithm=ecl",
        "rounds=1",
        "algorithm.phase2_epochs=1",
        "algorithm.phase2_batch_size=4096",
        "algorithm.phase2_augment=false",
        "optim.momentum=0",
        "optim.weight_decay=0",
        "hardware.precision=fp64",
        f"algorithm.frozen_bn={frozen_bn}",
    )
    algo: ECL = run.algorithm
    w, bn = algo.global_model()
    wname, bname = classifier_names(run.fm)
    calibrated, head_expert, tail_expert = algo.components
    for k in range(algo.K):
        ids = run.data.tensor(run.data.train_idx[k])
        x, y = run.data.x[ids], run.data.y[ids]
        if frozen_bn == "global":
            h = _eval_features(run, w, bn, x)
        else:
            h = run.fm.features(w, bn, x)  # train mode: the batch's own statistics
        W, b = w[wname].clone().requires_grad_(True), w[bname].clone().requires_grad_(True)
        counts = torch.as_tensor(run.data.counts[k], dtype=h.dtype)
        prior = torch.where(counts > 0, counts.clamp(min=1).log(), torch.full_like(counts, -13.815510557964274))
        gW, gb = torch.autograd.grad(F.cross_entropy(h.detach() @ W.t() + b + prior, y), (W, b))
        assert torch.allclose(calibrated[0][wname][k], w[wname] - 0.01 * gW, atol=1e-10), k
        assert torch.allclose(calibrated[0][bname][k], w[bname] - 0.01 * gb, atol=1e-10), k
    last = set(run.fm.names("last_block"))
    block = next(iter(last)).rsplit(".", 2)[0] + "."

    def moved(B):
        return {n for n in bn if not torch.equal(B[n], bn[n].expand_as(B[n]))}

    if frozen_bn == "global":
        assert moved(calibrated[1]) == set() and moved(tail_expert[1]) == set()  # classifier-only models: no BN moves
        assert moved(head_expert[1]) and all(
            n.startswith(block) for n in moved(head_expert[1])
        )  # only the trained block's
    else:
        assert any(not n.startswith(block) for n in moved(calibrated[1]))  # train mode: frozen statistics follow D_k


def test_ecl_mix_lambda_and_ditto_lam_are_separate_keys(tmp_path):
    """Issue 16.10: ECL's λ (Eq. 6) is ``algorithm.mix_lambda``, Ditto's proximal λ is ``algorithm.lam``; in the Table 1
    sweeps Ditto runs at our λ = 0.1 while ECL keeps λ = 1/2, and setting one key leaves the other alone."""
    for table in ("ecl/table1", "ecl/table1_cifar100"):
        ditto = make_cfg(f"+experiment={table}", "partition.imbalance_factor=10", "algorithm=ditto")
        ecl = make_cfg(f"+experiment={table}", "partition.imbalance_factor=10", "algorithm=ecl")
        assert ditto.algorithm.lam == 0.1 and "mix_lambda" not in ditto.algorithm, table
        assert ecl.algorithm.mix_lambda == 0.5, table
    for over, expect in (("++algorithm.lam=0.3", 0.5), ("algorithm.mix_lambda=0.25", 0.25)):
        run = Run(make_cfg(*LONGTAIL, "algorithm=ecl", over), tmp_path / over)
        run.setup()
        assert run.algorithm.lam == expect, over
    run = Run(make_cfg(*LONGTAIL, "algorithm=ditto", "++algorithm.mix_lambda=0.25"), tmp_path / "ditto")
    run.setup()
    assert run.cfg.algorithm.lam == 0.01
