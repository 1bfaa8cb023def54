"""The class-wise forgetting degree τ (FedKA Eq. 1), a diagnostic for any method with a global model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build_context, make_cfg, run_cfg

from fedbench.algorithms import ALGORITHMS
from fedbench.engine.stack import clone, row
from fedbench.errors import ConfigError
from fedbench.forgetting import (
    DOMINANT,
    MISSING,
    NON_DOMINANT,
    ForgettingMonitor,
    class_groups,
    forgetting_degree,
    group_forgetting,
    group_means,
)
from fedbench.run import Run


def test_class_groups_on_hand_made_counts():
    """Def. 1–2: dominant if n^k/n ≥ γ (boundary included), non-dominant if 0 < n^k/n < γ, missing if n^k = 0."""
    counts = np.array(
        [
            [50, 30, 10, 9, 1, 0],  # n = 100, γ = 0.1: 0.5 0.3 0.1 0.09 0.01 0
            [0, 0, 0, 4, 0, 0],  # a single class: dominant, the rest missing
            [0, 0, 0, 0, 0, 0],
        ]
    )  # no data at all: everything missing
    D, N, M = DOMINANT, NON_DOMINANT, MISSING
    assert class_groups(counts, 0.1).tolist() == [[D, D, D, N, N, M], [M, M, M, D, M, M], [M] * 6]
    assert class_groups(counts, 0.35).tolist()[0] == [D, N, N, N, N, M]


def test_forgetting_degree_on_scripted_accuracies():
    acc_g = np.array([0.8, 0.5, 0.0, 1.0])
    acc_l = np.array([[0.4, 0.5, 0.3, 0.0], [0.8, 0.75, 0.0, 1.0]])
    tau = forgetting_degree(acc_g, acc_l, xi=1e-8)
    expected = [[0.4 / 0.8, 0.0, -0.3 / 1e-8, 1.0], [0.0, -0.25 / 0.5, 0.0, 0.0]]
    assert np.allclose(tau, expected, rtol=1e-6)  # τ ≤ 1; 1 = complete forgetting; < 0 = improvement


def test_forgetting_per_class_type_on_a_hand_made_confusion_history():
    """Eq. 1 per (client, class) cell, and per class type Eq. 1 applied to the type's mean class accuracy:
    τ_type = (mean acc_g − mean acc_l) / (mean acc_g + ξ) over the type's cells of the participants. A class the global
    model gets wholly wrong (acc_g = 0: denominator ξ) has τ = −acc_l/ξ ≈ −10⁷ per cell; it must not swamp its type
    (a plain mean of τ did: dominant ≈ −5·10⁶ in round 1 below)."""
    D, N, M, xi = DOMINANT, NON_DOMINANT, MISSING, 1e-8
    total = np.array([10, 20, 5, 4])  # test samples per class
    groups = np.array([[N, D, D, M], [D, M, N, D]])
    history = {  # round: (global model's correct per class, each client's local model's correct per class;
        # None = absent)
        1: ([5, 0, 5, 2], [[1, 4, 5, 0], [10, 0, 1, 2]]),
        2: ([10, 10, 0, 4], [[2, 20, 0, 0], None]),
    }
    expected_tau = {1: [[0.8, -0.2 / xi, 0.0, 1.0], [-1.0, 0.0, 0.8, 0.0]], 2: [[0.8, -1.0, 0.0, 1.0], [np.nan] * 4]}
    # round 1: dominant cells (0,1) (0,2) (1,0) (1,3): acc_g 0, 1, .5, .5 (mean .5), acc_l .2, 1, 1, .5 (mean .675)
    #          non-dominant (0,0) (1,2): acc_g .5, 1 -> .75, acc_l .1, .2 -> .15;
    #          missing (0,3) (1,1): .5, 0 -> .25 vs 0, 0
    # round 2 (client 1 absent): dominant (0,1) (0,2): acc_g .5, 0 -> .25, acc_l 1, 0 -> .5; non-dominant .8; missing 1
    expected_type = {
        1: {"dominant": (0.5 - 0.675) / 0.5, "non_dominant": 0.6 / 0.75, "missing": 1.0},
        2: {"dominant": -1.0, "non_dominant": 0.8, "missing": 1.0},
    }
    for t, (glob, local) in history.items():
        acc_g = np.array(glob) / total
        acc_l = np.array([np.array(c) / total if c is not None else [np.nan] * 4 for c in local])
        tau = forgetting_degree(acc_g, acc_l, xi)
        assert np.allclose(tau, expected_tau[t], rtol=1e-6, equal_nan=True)
        got = group_forgetting(acc_g, acc_l, groups, xi)
        if t == 1:  # the means behind τ_type (hand values above)
            means = group_means(acc_g, acc_l, groups)
            assert means["dominant"] == pytest.approx((0.5, 0.675)) and means["non_dominant"] == pytest.approx(
                (0.75, 0.15)
            )
            assert means["missing"] == pytest.approx((0.25, 0.0))
        assert got.keys() == expected_type[t].keys()
        for name, v in expected_type[t].items():
            assert got[name] == pytest.approx(v, rel=1e-7), (t, name)
    # a type without cells among the participants is left out; all-zero global accuracy gives (0 − l)/ξ, as Eq. 1
    only_d = group_forgetting(np.array([0.5, 0.0]), np.array([[0.25, 0.0]]), np.array([[D, D]]), xi)
    assert only_d == {"dominant": pytest.approx(0.125 / (0.25 + xi))}


def test_the_monitor_built_from_a_context_gives_eq1_of_the_rounds_local_models_without_a_run(tmp_path):
    """Built from the algorithm's Context and the ``eval.forgetting`` node: τ_non-dominant of one FedAvg round of
    clients 0, 2, 3 equals Eq. 1 on the mean class accuracies over their non-dominant cells (0 < n_i^k/n_i < γ),
    counted here class by class with the plain model; ξ = 0.25 so that its place in the formula shows."""
    gamma, xi = 0.2, 0.25
    cfg = make_cfg(
        "algorithm=fedavg",
        "model=tiny_cnn",
        "hardware.precision=fp64",
        "hardware.executor=sequential",
        "partition.alpha=0.3",
        "eval.forgetting.enabled=true",
        f"eval.forgetting.gamma={gamma}",
        f"eval.forgetting.xi={xi}",
        "eval.forgetting.draw_every=0",
    )
    ctx = build_context(cfg, tmp_path)
    algo = ALGORITHMS["fedavg"](ctx)
    algo.setup()
    monitor = ForgettingMonitor(ctx, cfg.eval.forgetting)
    trained = []  # the round's local models, as the monitor hears them
    ctx.observers.append(lambda t, ids, res, phase: trained.append((ids, res)) if phase == "train" else None)
    start = tuple(clone(s) for s in algo.global_model())  # θ_g^1
    monitor.before_round(algo, 1)
    algo.round(1, torch.tensor([0, 2, 3]))
    out = monitor.after_round(algo, 1)

    data, fm, C = ctx.data, ctx.fm, ctx.data.num_classes
    idx = torch.as_tensor(data.global_test_idx)
    y = data.y[idx]

    def class_acc(p, b) -> np.ndarray:
        with torch.no_grad():
            pred = fm(p, b, data.x[idx]).argmax(1)
        return np.array([float((pred[y == c] == c).double().mean()) if (y == c).any() else 0.0 for c in range(C)])

    fm.set_mode(False)
    acc_g = class_acc(*start)
    ids, res = trained[-1]
    share = data.counts / data.counts.sum(1, keepdims=True)
    cells = [
        (acc_g[c], acc_l[c])
        for m, k in enumerate(ids)
        for acc_l in [class_acc(row(res.params, m), row(res.buffers, m))]
        for c in range(C)
        if 0 < share[k, c] < gamma
    ]
    fm.set_mode(True)
    assert ids == [0, 2, 3] and len(cells) >= 2
    mg, ml = np.mean(cells, axis=0)
    assert mg != ml and out["forgetting/non_dominant"] == pytest.approx((mg - ml) / (mg + xi), abs=1e-12)
    tau = np.load(tmp_path / "diagnostics" / "forgetting" / "round_00001.npy")  # in the context's run dir
    assert np.isnan(tau[[1, 4]]).all() and np.isfinite(tau[[0, 2, 3]]).all()


def test_tau_compares_round_start_global_model_with_the_trained_local_model(tmp_path):
    """One client: its trained local model IS the next global model, so τ of round t must equal Eq. 1
    applied to the evaluator's global class accuracies of rounds t−1 and t."""
    s = run_cfg(
        make_cfg(
            "algorithm=fedavg",
            "logger.pictures=true",
            "clients=1",
            "rounds=2",
            "eval.forgetting.enabled=true",
            "eval.forgetting.draw_every=1",
            "hardware.precision=fp64",
        ),
        tmp_path,
    )
    assert s["status"] == "complete"
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    class_acc = {r["round"]: np.array(r["global/class_acc"]) for r in rows if "global/class_acc" in r}
    for t in (1, 2):
        tau = np.load(tmp_path / "diagnostics" / "forgetting" / f"round_{t:05d}.npy")
        assert tau.shape == (1, 10)
        assert np.allclose(tau[0], forgetting_degree(class_acc[t - 1], class_acc[t][None], 1e-8)[0], rtol=1e-9)
        assert (tmp_path / "diagnostics" / "forgetting" / f"round_{t:05d}.png").exists()
    logged = next(r for r in rows if r["round"] == 2 and "forgetting/dominant" in r)
    g, local = class_acc[1], class_acc[2]  # one client: every class dominant
    assert logged["forgetting/dominant"] == pytest.approx((g.mean() - local.mean()) / (g.mean() + 1e-8), rel=1e-9)
    # the absolute accuracies behind τ: the round-start global model's and the trained local model's
    assert logged["forgetting/dominant_global_acc"] == pytest.approx(g.mean(), rel=1e-12)
    assert logged["forgetting/dominant_local_acc"] == pytest.approx(local.mean(), rel=1e-12)


def test_forgetting_for_partial_participation_and_other_methods(tmp_path):
    """Non-participants get NaN rows; the grouping uses γ; saved every `every` rounds and after the last."""
    run = Run(
        make_cfg(
            "algorithm=fedka",
            "partition.alpha=0.1",
            "participation=0.6",
            "rounds=3",
            "eval.forgetting.enabled=true",
            "eval.forgetting.every=2",
            "eval.forgetting.draw_every=0",
        ),
        tmp_path,
    )
    run.execute()
    d = tmp_path / "diagnostics" / "forgetting"
    assert sorted(p.name for p in d.glob("round_*.npy")) == ["round_00002.npy", "round_00003.npy"]
    assert not list(d.glob("*.png"))
    tau = np.load(d / "round_00003.npy")
    participants = run.sample_clients(3).tolist()
    assert np.isfinite(tau[participants]).all()
    assert np.isnan(np.delete(tau, participants, axis=0)).all()
    groups = np.load(d / "class_groups.npy")
    assert np.array_equal(groups, class_groups(run.data.counts, run.cfg.algorithm.gamma))  # FedKA's γ is reused


def test_methods_without_a_global_model_log_nothing(tmp_path):
    s = run_cfg(make_cfg("algorithm=local", "rounds=1", "eval.forgetting.enabled=true"), tmp_path)
    assert s["status"] == "complete" and not (tmp_path / "diagnostics" / "forgetting").exists()


@pytest.mark.parametrize("key,value", [("every", 0), ("gamma", 0), ("xi", -1)])
def test_bad_forgetting_config_fails_before_training(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"eval.forgetting.{key}"):
        Run(make_cfg("eval.forgetting.enabled=true", f"eval.forgetting.{key}={value}"), tmp_path).setup()
