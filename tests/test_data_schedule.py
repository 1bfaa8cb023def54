"""The data schedule (FedKA §3.2, Fig. 3): from a round on, a client keeps only part of one class's training samples."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_cfg

from fedbench.errors import ConfigError
from fedbench.forgetting import MISSING, class_groups
from fedbench.run import Run

BASE = ["partition.alpha=0.5", "clients=4", "hardware.precision=fp64"]


def _cells(tmp_path) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Two (client, class, samples) cells of the partition with >= 6 samples, on different clients."""
    run = Run(make_cfg(*BASE), tmp_path / "probe")
    run.setup()
    counts = run.data.counts
    a = next((1, c, int(counts[1, c])) for c in np.argsort(-counts[1]) if counts[1, c] >= 6)
    b = next((2, c, int(counts[2, c])) for c in np.argsort(-counts[2]) if counts[2, c] >= 6)
    return a, b


def _schedule(*steps: dict) -> str:
    return "+data_schedule=[" + ",".join("{" + ",".join(f"{k}:{v}" for k, v in s.items()) + "}" for s in steps) + "]"


def test_schedule_changes_exactly_the_scheduled_samples_from_their_round_on(tmp_path):
    """Round < r: every client's indices as partitioned (same order). From round r: the scheduled (client, class) keeps
    `keep` of its samples (a subset of what it had), a later smaller step keeps a subset of the earlier one; other
    classes, other clients and the test splits never change; keep_fraction = round(f · n) of the original n."""
    (k1, c1, n1), (k2, c2, n2) = _cells(tmp_path)
    run = Run(
        make_cfg(
            *BASE,
            _schedule(
                {"round": 2, "client": k1, "class": c1, "keep": 3},
                {"round": 4, "client": k1, "class": c1, "keep": 1},
                {"round": 3, "client": k2, "class": c2, "keep_fraction": 0.5},
            ),
        ),
        tmp_path / "s",
    )
    run.setup()
    sched, y = run.data_schedule, run.data.y.numpy()
    orig = [i.copy() for i in run.data.train_idx]
    test = [i.copy() for i in run.data.test_idx]

    def of(idx, c):
        return set(idx[y[idx] == c].tolist())

    prev = None
    for t, (want1, want2) in {
        1: (n1, n2),
        2: (3, n2),
        3: (3, int(np.floor(0.5 * n2 + 0.5))),
        4: (1, int(np.floor(0.5 * n2 + 0.5))),
        9: (1, int(np.floor(0.5 * n2 + 0.5))),
    }.items():
        idx = sched.train_idx(t)
        for k in range(len(orig)):
            cells = [(c1, want1)] if k == k1 else [(c2, want2)] if k == k2 else []
            rest = ~np.isin(orig[k], [i for c, _ in cells for i in of(orig[k], c)])
            assert np.array_equal(
                idx[k][~np.isin(idx[k], [i for c, _ in cells for i in of(orig[k], c)])], orig[k][rest]
            )
            for c, want in cells:
                assert len(of(idx[k], c)) == want and of(idx[k], c) <= of(orig[k], c), (t, k, c)
        if prev is not None:
            assert of(idx[k1], c1) <= of(prev[k1], c1) and of(idx[k2], c2) <= of(prev[k2], c2)  # nested
        prev = idx
    assert all(np.array_equal(a, b) for a, b in zip(sched.train_idx(1), orig))
    assert all(np.array_equal(a, b) for a, b in zip(run.data.test_idx, test))


def test_a_run_trains_on_the_scheduled_data_from_that_round_on(tmp_path):
    """FedAvg and FedKA: round 1 is bitwise the unscheduled run; from round 2 client k keeps no sample of class c:
    the logged size, the class counts, FedAvg's weights |D_i| and FedKA's class groups follow;
    the global model differs."""
    (k, c, n), _ = _cells(tmp_path)
    for algo in ("fedavg", "fedka"):
        out = {}
        for name, extra in (("plain", []), ("sched", [_schedule({"round": 2, "client": k, "class": c, "keep": 0})])):
            run = Run(
                make_cfg(*BASE, f"algorithm={algo}", "rounds=2", "eval.forgetting.enabled=true", *extra),
                tmp_path / algo / name,
            )
            run.setup()
            before = run.algorithm.n.clone()
            rows = [run.data_schedule.apply(run, t) if run.data_schedule else {} for t in (1,)]
            run.algorithm.round(1, torch.arange(4))
            w1 = {key: v.clone() for key, v in run.algorithm.global_model()[0].items()}
            rows.append(run.data_schedule.apply(run, 2) if run.data_schedule else {})
            run.algorithm.round(2, torch.arange(4))
            out[name] = (w1, run.algorithm.global_model()[0], rows, before, run)
        w1p, w2p, _, _, _ = out["plain"]
        w1s, w2s, rows, before, run = out["sched"]
        assert all(torch.equal(w1p[key], w1s[key]) for key in w1p)  # round 1: untouched
        assert any(not torch.equal(w2p[key], w2s[key]) for key in w2p)  # round 2: other data
        assert [r[f"data_schedule/client{k}_class{c}"] for r in rows] == [n, 0]
        assert run.data.counts[k, c] == 0 and run.algorithm.n[k] == before[k] - n
        assert all(run.algorithm.n[j] == before[j] for j in range(4) if j != k)
        assert run.forgetting.groups[k, c] == MISSING
        if algo == "fedka":
            assert run.algorithm.groups[k, c] == MISSING and run.algorithm.kept[k, c] == 1
            assert c not in run.algorithm.candidates[k]


def test_scheduled_run_logs_sizes_and_the_forgetting_trace(tmp_path):
    (k, c, n), _ = _cells(tmp_path)
    run = Run(
        make_cfg(
            *BASE,
            "logger.pictures=true",
            "rounds=3",
            "eval.forgetting.enabled=true",
            "eval.forgetting.draw_every=0",
            _schedule({"round": 2, "client": k, "class": c, "keep": 2}),
        ),
        tmp_path / "r",
    )
    run.execute()
    rows = [json.loads(line) for line in open(tmp_path / "r" / "metrics.jsonl")]
    assert [r[f"data_schedule/client{k}_class{c}"] for r in rows if "train/loss" in r] == [n, 2, 2]
    trace = np.loadtxt(tmp_path / "r" / "diagnostics" / "forgetting" / "trace.csv", delimiter=",", skiprows=1)
    taus = [np.load(tmp_path / "r" / "diagnostics" / "forgetting" / f"round_{t:05d}.npy")[k, c] for t in (1, 2, 3)]
    assert trace[:, :4].tolist() == [[t, k, c, s] for t, s in ((1, n), (2, 2), (3, 2))]
    assert np.allclose(trace[:, 4], taus, equal_nan=True)
    groups = np.load(tmp_path / "r" / "diagnostics" / "forgetting" / "class_groups_round_00002.npy")
    assert np.array_equal(groups, class_groups(run.data.counts, run.forgetting.gamma)) and run.data.counts[k, c] == 2
    assert (tmp_path / "r" / "diagnostics" / "forgetting" / "trace.png").exists()


@pytest.mark.parametrize(
    "step,key",
    [
        ({"round": 0, "client": 0, "class": 0, "keep": 0}, "data_schedule[0].round"),
        ({"round": 2, "client": 9, "class": 0, "keep": 0}, "data_schedule[0].client"),
        ({"round": 2, "client": 0, "class": 10, "keep": 0}, "data_schedule[0].class"),
        ({"round": 2, "client": 0, "class": 0, "keep": 100000}, "data_schedule[0].keep"),
        ({"round": 2, "client": 0, "class": 0, "keep_fraction": 1.5}, "data_schedule[0].keep_fraction"),
        ({"round": 2, "client": 0, "class": 0}, "data_schedule[0]"),
        ({"round": 2, "client": 0, "class": 0, "keep": 1, "keep_fraction": 0.5}, "data_schedule[0]"),
    ],
)
def test_bad_schedules_fail_before_training(tmp_path, step, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        Run(make_cfg(*BASE, _schedule(step)), tmp_path).setup()


def test_schedule_refuses_methods_with_count_derived_state(tmp_path):
    with pytest.raises(ConfigError, match="data_schedule"):
        Run(
            make_cfg(*BASE, "algorithm=feddyn", _schedule({"round": 2, "client": 0, "class": 0, "keep": 0})), tmp_path
        ).setup()
