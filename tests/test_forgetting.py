"""The class-wise forgetting degree τ (FedKA Eq. 1), a diagnostic for any method with a global model."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_cfg, run_cfg

from fedbench.errors import ConfigError
from fedbench.forgetting import DOMINANT, MISSING, NON_DOMINANT, class_groups, forgetting_degree, group_means
from fedbench.run import Run


def test_class_groups_on_hand_made_counts():
    """Def. 1–2: dominant if n^k/n ≥ γ (boundary included), non-dominant if 0 < n^k/n < γ, missing if n^k = 0."""
    counts = np.array([[50, 30, 10, 9, 1, 0],      # n = 100, γ = 0.1: 0.5 0.3 0.1 0.09 0.01 0
                       [0, 0, 0, 4, 0, 0],         # a single class: dominant, the rest missing
                       [0, 0, 0, 0, 0, 0]])        # no data at all: everything missing
    D, N, M = DOMINANT, NON_DOMINANT, MISSING
    assert class_groups(counts, 0.1).tolist() == [[D, D, D, N, N, M], [M, M, M, D, M, M], [M] * 6]
    assert class_groups(counts, 0.35).tolist()[0] == [D, N, N, N, N, M]


def test_forgetting_degree_on_scripted_accuracies():
    acc_g = np.array([0.8, 0.5, 0.0, 1.0])
    acc_l = np.array([[0.4, 0.5, 0.3, 0.0],
                      [0.8, 0.75, 0.0, 1.0]])
    tau = forgetting_degree(acc_g, acc_l, xi=1e-8)
    expected = [[0.4 / 0.8, 0.0, -0.3 / 1e-8, 1.0], [0.0, -0.25 / 0.5, 0.0, 0.0]]
    assert np.allclose(tau, expected, rtol=1e-6)     # τ ≤ 1; 1 = complete forgetting; < 0 = improvement
    groups = np.array([[NON_DOMINANT, DOMINANT, MISSING, MISSING], [DOMINANT, DOMINANT, MISSING, NON_DOMINANT]])
    m = group_means(tau, groups)
    assert m["non_dominant"] == pytest.approx(0.25) and m["dominant"] == pytest.approx(-1 / 6)
    assert m["missing"] == pytest.approx((-0.3e8 + 1 + 0) / 3, rel=1e-6)
    assert m["missing_clipped"] == pytest.approx((-1 + 1 + 0) / 3, abs=1e-6)


def test_tau_compares_round_start_global_model_with_the_trained_local_model(tmp_path):
    """One client: its trained local model IS the next global model, so τ of round t must equal Eq. 1
    applied to the evaluator's global class accuracies of rounds t−1 and t."""
    s = run_cfg(make_cfg("algorithm=fedavg", "clients=1", "rounds=2", "eval.forgetting.enabled=true",
                         "eval.forgetting.draw_every=1", "hardware.precision=fp64"), tmp_path)
    assert s["status"] == "complete"
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    class_acc = {r["round"]: np.array(r["global/class_acc"]) for r in rows if "global/class_acc" in r}
    for t in (1, 2):
        tau = np.load(tmp_path / "diagnostics" / "forgetting" / f"round_{t:05d}.npy")
        assert tau.shape == (1, 10)
        assert np.allclose(tau[0], forgetting_degree(class_acc[t - 1], class_acc[t][None], 1e-8)[0], rtol=1e-9)
        assert (tmp_path / "diagnostics" / "forgetting" / f"round_{t:05d}.png").exists()
    logged = next(r for r in rows if r["round"] == 2 and "forgetting/dominant" in r)
    assert logged["forgetting/dominant"] == pytest.approx(float(np.mean(tau)))   # one client: every class dominant


def test_forgetting_for_partial_participation_and_other_methods(tmp_path):
    """Non-participants get NaN rows; the grouping uses γ; saved every `every` rounds and after the last."""
    run = Run(make_cfg("algorithm=fedka", "partition.alpha=0.1", "participation=0.6", "rounds=3",
                       "eval.forgetting.enabled=true", "eval.forgetting.every=2", "eval.forgetting.draw_every=0"), tmp_path)
    run.execute()
    d = tmp_path / "diagnostics" / "forgetting"
    assert sorted(p.name for p in d.glob("round_*.npy")) == ["round_00002.npy", "round_00003.npy"]
    assert not list(d.glob("*.png"))
    tau = np.load(d / "round_00003.npy")
    participants = run.sample_clients(3).tolist()
    assert np.isfinite(tau[participants]).all()
    assert np.isnan(np.delete(tau, participants, axis=0)).all()
    groups = np.load(d / "class_groups.npy")
    assert np.array_equal(groups, class_groups(run.data.counts, run.cfg.algorithm.gamma))   # FedKA's γ is reused


def test_methods_without_a_global_model_log_nothing(tmp_path):
    s = run_cfg(make_cfg("algorithm=local", "rounds=1", "eval.forgetting.enabled=true"), tmp_path)
    assert s["status"] == "complete" and not (tmp_path / "diagnostics" / "forgetting").exists()


@pytest.mark.parametrize("key,value", [("every", 0), ("gamma", 0), ("xi", -1)])
def test_bad_forgetting_config_fails_before_training(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"eval.forgetting.{key}"):
        Run(make_cfg("eval.forgetting.enabled=true", f"eval.forgetting.{key}={value}"), tmp_path).setup()
