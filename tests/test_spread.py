"""The spread over clients (issue #34 item 3): worst-10 % and 10th/50th/90th-percentile client accuracy per
evaluation, many/medium/few-shot class accuracy on long-tailed data, their best/final/last, ``client_spread.png`` (the
per-client accuracies at the best and the last round, and against the client's data size), and the report's
``--spread`` columns. Rules by hand on asymmetric numbers; then tiny real runs on the embedded digits."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from conftest import make_cfg

from fedbench.evaluation import summarize
from fedbench.metrics import client_spread, shot_accuracy, shot_groups
from fedbench.run import Run

# ---- the rules, by hand ---------------------------------------------------------------------------------------------


def test_worst10_and_percentiles_by_hand():
    """12 clients: ⌈1.2⌉ = 2 worst (floor or round would take 1); linear percentiles at ranks 1.1, 5.5, 9.9 of the
    sorted accuracies (not at a sample: 'lower'/'nearest' would differ)."""
    s = [0.05, 0.1, 0.2, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    got = client_spread(np.array(s)[[7, 2, 11, 0, 5, 9, 3, 10, 1, 6, 4, 8]])  # shuffled: the order must not matter
    assert got == pytest.approx(
        {
            "worst10": (0.05 + 0.1) / 2,  # the two lowest (the best two: 0.925)
            "p10": 0.1 + 0.1 * (0.2 - 0.1),  # 0.11
            "p50": 0.4 + 0.5 * (0.5 - 0.4),  # 0.45
            "p90": 0.8 + 0.9 * (0.9 - 0.8),  # 0.89
        },
        abs=1e-12,
    )
    assert client_spread(np.array([0.6, 0.2, 0.9]))["worst10"] == 0.2  # ⌈0.3⌉ = 1: the worst client alone
    assert all(math.isnan(v) for v in client_spread(np.array([])).values())


def test_shot_groups_by_global_train_count_and_their_boundaries():
    """many-shot > 100, medium-shot 20..100 (both ends), few-shot < 20 (0 included); an empty group is left out."""
    groups = shot_groups(np.array([150, 101, 100, 20, 19, 0, 60]))
    assert {g: c.tolist() for g, c in groups.items()} == {"many": [0, 1], "medium": [2, 3, 6], "few": [4, 5]}
    assert set(shot_groups(np.array([150, 30]))) == {"many", "medium"}


def test_shot_accuracy_pools_the_test_samples_of_the_groups_classes_over_clients():
    """2 clients x 4 classes, global train counts 200/50/10/5: many = class 0, medium = class 1, few = classes 2, 3.
    Pooled over samples: many 24/40 = 0.6 (the clients' mean would be (0.9 + 0.5)/2 = 0.7); few 3/10 (the mean of
    its class accuracies would be (0.5 + 0.25)/2)."""
    total = np.array([[10, 4, 2, 0], [30, 6, 0, 8]])
    correct = np.array([[9, 1, 1, 0], [15, 6, 0, 2]])
    train = np.array([[150, 10, 10, 0], [50, 40, 0, 5]])  # per client: the group is by the sum over clients
    assert shot_accuracy(correct, total, train.sum(0)) == pytest.approx({"many": 0.6, "medium": 0.7, "few": 0.3})
    # a group whose classes have no test sample is left out (classes 2, 3 never tested)
    assert set(shot_accuracy(correct[:, :2], total[:, :2], np.array([200, 50]))) == {"many", "medium"}
    no_test = total.copy()
    no_test[:, 2:] = 0
    assert set(shot_accuracy(correct, no_test, train.sum(0))) == {"many", "medium"}


def test_summary_has_best_final_last_of_the_spread_but_not_of_the_std():
    history = [
        {"round": 0, "pers/acc_worst10": 0.0, "pers/acc_p90": 0.2, "pers/few_acc": 0.1, "pers/acc_std": 0.3},
        {"round": 1, "pers/acc_worst10": 0.3, "pers/acc_p90": 0.6, "pers/few_acc": 0.05, "pers/acc_std": 0.2},
        {"round": 2, "pers/acc_worst10": 0.2, "pers/acc_p90": 0.8, "pers/few_acc": 0.15, "pers/acc_std": 0.1},
        {"round": 3, "pers/acc_worst10": 0.25, "pers/acc_p90": 0.7, "pers/few_acc": 0.2, "pers/acc_std": 0.4},
    ]
    s = summarize(history, final_window=2)
    assert s["pers/acc_worst10"] == {"best": 0.3, "best_round": 1, "final": 0.225, "final_n": 2, "last": 0.25}
    assert s["pers/acc_p90"]["best_round"] == 2 and s["pers/acc_p90"]["final"] == pytest.approx(0.75)
    assert s["pers/few_acc"]["best_round"] == 3 and "pers/acc_std" not in s


# ---- real runs -----------------------------------------------------------------------------------------------------

# 4 rounds, lr 0.5: pers/acc peaks at round 3 and falls at round 4 (best round != last round)
PEAKED = ("rounds=4", "clients=5", "lr=0.5", "checkpoint.final_model=false", "logger.pictures=true")


def hydra_files(algorithm: str) -> dict:
    """What Hydra's CLI writes in .hydra/ (the report reads the chosen algorithm from hydra.yaml)."""
    from omegaconf import OmegaConf

    return {
        "hydra.yaml": OmegaConf.create(
            {
                "hydra": {
                    "runtime": {"choices": {"algorithm": algorithm}},
                    "job": {"num": 0},
                    "overrides": {"task": []},
                }
            }
        )
    }


def rows(run_dir) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for ln in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(ln)
        out.setdefault(r["round"], {}).update(r)
    return out


def spread_of(row: dict) -> dict:
    return {k: row[f"pers/acc_{k}"] for k in ("worst10", "p10", "p50", "p90")}


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    d = tmp_path_factory.mktemp("spread") / "peaked"
    run = Run(make_cfg(*PEAKED), d, provenance=hydra_files("fedavg"))
    return run, run.execute(), d


def test_a_run_logs_the_spread_of_its_clients_at_every_evaluation_and_draws_best_and_last(peaked):
    run, summary, d = peaked
    logged, final = rows(d), summary["final"]
    best = summary["metrics"]["pers/acc"]["best_round"]
    assert (best, final["pers_best_round"], final["pers_round"]) == (3, 3, 4)  # the run peaks before its end
    assert final["pers_best_acc"] == summary["metrics"]["pers/acc"]["best"] == logged[3]["pers/acc"]
    for t in range(5):
        assert set(spread_of(logged[t])) and "pers/many_acc" not in logged[t]  # dirichlet: not long-tailed
    # the kept per-client accuracies are those of their round: their spread is what that round logged
    assert client_spread(np.array(final["pers_client_acc_best"])) == spread_of(logged[3])
    assert client_spread(np.array(final["pers_client_acc"])) == spread_of(logged[4]) != spread_of(logged[3])
    for k in ("worst10", "p10", "p50", "p90"):
        m = summary["metrics"][f"pers/acc_{k}"]
        assert m["last"] == logged[4][f"pers/acc_{k}"] and m["final_n"] == 4

    # client_spread.png: at the end of the run, logged as an image of the last round
    assert (d / "client_spread.png").stat().st_size > 10_000
    assert logged[4]["image/client_spread"] == str(d / "client_spread.png")
    fig = run.evaluator.spread_figure()
    ranked, scatter = fig.axes
    (b, last) = ranked.lines
    assert (b.get_label(), last.get_label()) == ("best round (3)", "last round (4)")
    assert list(b.get_ydata()) == pytest.approx(sorted(100 * np.array(final["pers_client_acc_best"])))
    assert list(last.get_ydata()) == pytest.approx(sorted(100 * np.array(final["pers_client_acc"])))
    sizes = [sum(map(int, r)) for r in list(csv.reader(open(d / "partition_counts.csv")))[1:]]
    assert len(set(sizes)) == 5  # five different data sizes: the points are told apart
    for points, acc in zip(scatter.collections, (final["pers_client_acc_best"], final["pers_client_acc"])):
        np.testing.assert_allclose(points.get_offsets(), [[n, 100 * a] for n, a in zip(sizes, acc)], rtol=1e-12)
    assert ranked.get_ylabel() == scatter.get_ylabel() == "personalized accuracy (%)"
    assert scatter.get_xlabel() == "training samples of the client"


def test_the_picture_draws_one_series_when_the_best_round_is_the_last():
    from fedbench.plots import client_spread_figure

    fig = client_spread_figure([0.5, 0.2, 0.9], 3, [0.5, 0.2, 0.9], 3, [40, 10, 25])
    [line] = fig.axes[0].lines
    assert line.get_label() == "best = last round (3)" and list(line.get_ydata()) == pytest.approx([20, 50, 90])
    [points] = fig.axes[1].collections
    np.testing.assert_allclose(points.get_offsets(), [[40, 50], [10, 20], [25, 90]])


def test_the_best_evaluation_is_the_first_with_the_highest_pers_acc(peaked):
    """As summary.json's ``best_round`` (the first of equal bests): a later equal accuracy does not replace it."""
    from fedbench.evaluation import Evaluator

    run = peaked[0]
    ev = Evaluator(run.ctx, run.cfg.eval)  # a fresh evaluator of the real run
    for t, a in enumerate([0.5, 0.7, 0.7, 0.6]):
        ev.keep_best(t, a, np.array([a, t]))
    assert (ev.last["pers_best_round"], ev.last["pers_client_acc_best"]) == (1, [0.7, 1])


def test_the_best_rounds_clients_survive_a_resume_and_the_same_seed_gives_the_same_spread(peaked, tmp_path):
    """The same run killed at its very end (its summary cannot be written) resumes from its round-3 checkpoint: the
    best round's per-client accuracies (round 3, before the resume) come back with the checkpoint; every number is
    the uninterrupted run's."""
    from fedbench.errors import WriteFailed

    _, want, _ = peaked
    d = tmp_path / "resumed"
    cfg = make_cfg(*PEAKED, "checkpoint.every=1", "checkpoint.keep=5")
    (d / "summary.json").mkdir(parents=True)  # in the way: the summary cannot be written
    with pytest.raises(WriteFailed):
        Run(cfg, d).execute()
    (d / "summary.json").rmdir()
    run = Run(cfg, d)
    got = run.execute()
    assert run.checkpointer.resumed  # from round 3: only round 4 evaluated again in this session
    assert got["final"]["pers_best_round"] == 3
    assert got["final"]["pers_client_acc_best"] == want["final"]["pers_client_acc_best"]
    assert got["metrics"] == want["metrics"]


def test_long_tailed_runs_log_many_medium_few_shot_accuracy_and_the_report_shows_the_spread(peaked, tmp_path):
    """ECL's long-tailed partition (IF 10 on digits: class train counts from 113 down to 11 over 5 clients): the
    pooled accuracy of each shot group of the global train counts, at every evaluation; ``fedbench-report --spread``
    shows the final spread (and the shot groups where runs have them) in %."""
    from fedbench.report import main as report_main

    d = tmp_path / "lt"
    run = Run(
        make_cfg(
            "rounds=1",
            "clients=5",
            "partition=longtail",
            "partition.imbalance_factor=10",
            "partition.test_split=local",
            "checkpoint.final_model=false",
        ),
        d,
        provenance=hydra_files("fedavg"),
    )
    summary = run.execute()
    data, last = run.data, run.evaluator.last
    n = data.counts.sum(0)
    assert (n > 100).any() and ((n >= 20) & (n <= 100)).any() and (n < 20).any()  # all three groups
    y = data.y.cpu().numpy()
    total = np.stack([np.bincount(y[i], minlength=data.num_classes) for i in data.test_idx])
    correct = np.array(last["pers_client_class_acc"]) * total
    for g, classes in {"many": n > 100, "medium": (n >= 20) & (n <= 100), "few": n < 20}.items():
        want = correct[:, classes].sum() / total[:, classes].sum()
        assert rows(d)[1][f"pers/{g}_acc"] == pytest.approx(want, abs=1e-12)
        assert summary["metrics"][f"pers/{g}_acc"]["last"] == pytest.approx(want, abs=1e-12)

    def report(run_dir, out) -> dict:
        assert report_main([str(run_dir), "--spread", "--no-plots", "--no-wandb", "--out", str(out)]) == 0
        [csv_file] = out.glob("*.csv")
        return {r["column"]: float(r["ours_mean"]) for r in csv.DictReader(open(csv_file))}

    shown = report(d, tmp_path / "report_lt")
    m = summary["metrics"]
    names = {"Worst 10 %": "acc_worst10", "P10": "acc_p10", "P50": "acc_p50", "P90": "acc_p90"}
    names.update({"Many-shot": "many_acc", "Medium-shot": "medium_acc", "Few-shot": "few_acc"})
    assert list(shown) == ["Best", "Final", *names]
    for col, key in names.items():
        assert shown[col] == pytest.approx(100 * m[f"pers/{key}"]["final"])
    _, plain, plain_dir = peaked
    shown = report(plain_dir, tmp_path / "report_plain")  # not long-tailed: no shot columns
    assert list(shown) == ["Best", "Final", "Worst 10 %", "P10", "P50", "P90"]
    assert shown["P10"] == pytest.approx(100 * plain["metrics"]["pers/acc_p10"]["final"]) != shown["P90"]
