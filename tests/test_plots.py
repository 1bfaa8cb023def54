"""Publication-ready pictures (issue #20 item 12): every PNG of a report and every heatmap is >= 1000 px wide (read
back from the file), round/client/class axes have integer ticks, legends name the swept key (δ=0.1), titles and axes
use words, not config keys, the paper's numbers are points that no line joins, and heatmap labels keep a readable
contrast on every cell colour."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest
from test_report import write_run

from fedbench.plots import heatmap, heatmap_figure
from fedbench.report import Report, collect, group_tables, report
from fedbench.report.figures import curve_figures, vs_key_figures

DELTA = {
    "paper": "fedrema",
    "id": "table3",
    "title": "FedReMa Table 3: δ sensitivity",
    "rows": "algorithm.delta",
    "cols": None,
    "percent": True,
    "metrics": {"Best Acc": "pers/acc.best", "Final Acc": "pers/acc.final", "Rounds in CCP": "ccp_rounds"},
    # the paper's numbers at 0.1 and 0.9 only (its runtime column), so nothing may be drawn in between
    "reference": {0.1: {"Best Acc": 63.36, "Rounds in CCP": 500}, 0.9: {"Best Acc": 65.06, "Rounds in CCP": 7}},
}
INTERNAL = ("pers/acc", "global/acc", "choice:", "table:", "algorithm.delta", "_")


def _delta_sweep(root, rounds=7):
    for i, d in enumerate([0.1, 0.5, 0.9]):
        for seed in (0, 1):
            acc = [0.1 + 0.05 * t + d / 20 + seed / 100 for t in range(rounds + 1)]
            run = write_run(root, "fedrema", seed, DELTA, acc, num=i, extra={"ccp_rounds": 3 + i}, delta=d)
            run = run.rename(root / f"delta={d},seed={seed}")
            summary = (run / "summary.json").read_text().replace('"global/acc"', '"pers/acc"')
            (run / "summary.json").write_text(summary)
            (run / "metrics.jsonl").write_text(
                (run / "metrics.jsonl").read_text().replace('"global/acc"', '"pers/acc"')
            )
    return root


def _width_px(png) -> int:
    return mpimg.imread(png).shape[1]


def test_report_pictures_are_wide_with_integer_round_ticks_and_named_legends(tmp_path):
    root = _delta_sweep(tmp_path / "sweep", rounds=3)  # 3 rounds: matplotlib's own ticks would be 0, 0.5, ..., 3
    [(rep, pictures)] = report([root], out=tmp_path / "out", wandb="disabled")
    assert sorted(p.name for p in pictures) == ["fedrema_table3_curves_pers_acc.png", "fedrema_table3_vs_delta.png"]
    assert all(_width_px(p) >= 1000 for p in pictures)

    [(metric, fig)] = curve_figures(rep)
    ax = fig.axes[0]
    assert metric == "pers/acc" and ax.get_xlabel() == "round"
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["δ=0.1 (n=2)", "δ=0.5 (n=2)", "δ=0.9 (n=2)"]
    words = [ax.get_title(), ax.get_ylabel(), fig._suptitle.get_text()]
    assert "personalized accuracy (%)" == ax.get_ylabel()
    assert not any(w in text for text in words for w in INTERNAL), words

    [(xkey, fig)] = vs_key_figures(rep)
    acc, ccp = fig.axes[:2]
    assert xkey == "delta" and acc.get_xlabel() == "CCP threshold δ"
    paper = [ln for ln in acc.lines if ln.get_label().endswith("(paper)")]
    assert paper and all(ln.get_linestyle() == "None" for ln in paper)  # points, never joined
    assert [list(ln.get_xdata()) for ln in paper] == [[0.1, 0.9]]  # only where the paper has a number
    assert all(ln.get_linestyle() == "None" for ln in ccp.lines if ln.get_label().endswith("(paper)"))


def _contrast(a, b) -> float:
    """WCAG contrast ratio of two colours (1 = none, 21 = black on white)."""

    def lum(c):
        c = np.asarray(c[:3], dtype=float)
        c = np.where(c <= 0.03928, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]

    hi, lo = sorted([lum(a), lum(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("cmap", ["Blues", "viridis", "RdBu_r"])
def test_heatmap_labels_read_on_every_cell_and_ticks_are_integers(cmap, tmp_path):
    """A 20 clients x 10 classes count matrix (the partition picture): every cell label has a contrast of at least 3
    against its cell's colour (light cells of Blues used to get white text), integer ticks, >= 1000 px."""
    from matplotlib.colors import to_rgba

    m = np.arange(200).reshape(20, 10) % 37
    fig = heatmap_figure(m, "partition", "class", "client", cmap=cmap)
    ax = fig.axes[0]
    im = ax.images[0]
    assert len(ax.texts) == 200
    for text in ax.texts:
        j, i = (int(round(v)) for v in text.get_position())
        assert _contrast(to_rgba(text.get_color()), im.cmap(im.norm(m[i, j]))) >= 3, (cmap, i, j, text.get_color())
    for axis in (ax.get_xticks(), ax.get_yticks()):
        assert all(float(t).is_integer() for t in axis)
    png = heatmap(np.eye(3), tmp_path / "small.png", "S", "client", "client")
    assert _width_px(png) >= 1000


def test_accuracy_vs_personalization_steps_says_so(tmp_path):
    """CAFeMe Fig. 4's table has no cols: its columns are metrics named by numbers (``"5": newclients/step5_acc``);
    the picture's x axis is the personalization step (it said "column"), the y axis the new-client accuracy."""
    import json

    fig4 = {
        "paper": "cafeme",
        "id": "fig4",
        "title": "CAFeMe Fig. 4",
        "rows": "choice:algorithm",
        "cols": None,
        "percent": True,
        "metrics": {str(s): f"newclients/step{s}_acc" for s in (0, 5, 10)},
    }
    for num, algorithm in enumerate(["cafeme", "fedavg"]):
        run = write_run(tmp_path, algorithm, 0, fig4, [0.1, 0.2], num=num)
        summary = json.loads((run / "summary.json").read_text())
        summary.update({f"newclients/step{s}_acc": 0.2 + s / 100 + num / 10 for s in (0, 5, 10)})
        (run / "summary.json").write_text(json.dumps(summary))
    rep = Report(group_tables(collect([tmp_path]))[0])
    [(xkey, fig)] = vs_key_figures(rep)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "personalization step" and ax.get_ylabel() == "new-client accuracy (%)"
    assert [float(x) for x in ax.lines[0].get_xdata()] == [0.0, 5.0, 10.0]


def test_run_pictures_are_wide_and_readable(tmp_path):
    """The run-dir pictures of FedKA's forgetting (heatmap and Fig. 3 trace) and FedReMa's similarity panels: >= 1000 px
    wide; the forgetting heatmap's labels read on its darkest cells (τ = ±1 on RdBu_r, where black text was lost)."""
    from matplotlib.colors import to_rgba

    from fedbench.forgetting import draw_forgetting, draw_trace
    from fedbench.similarity import draw_similarity_panels

    tau = np.array([[-1.0, -0.5, 0.0, 0.6], [1.0, 0.2, -0.9, np.nan], [0.1, 0.95, -0.3, 0.4]])
    groups = np.array([[0, 1, 2, 1], [1, 0, 1, 2], [2, 1, 0, 1]])
    png = draw_forgetting(tau, groups, tmp_path / "tau.png", "forgetting")
    assert _width_px(png) >= 1000
    import matplotlib.pyplot as plt

    import fedbench.plots

    figs = []
    with pytest.MonkeyPatch.context() as mp:  # keep the figure (not written) to read its texts
        mp.setattr(fedbench.plots, "save", lambda fig, path: figs.append(fig) or path)
        draw_forgetting(tau, groups, tmp_path / "tau2.png", "forgetting")
    ax = figs[0].axes[0]
    im = ax.images[0]
    for text in ax.texts:
        j, i = (int(round(v)) for v in text.get_position())
        v = tau[i, j] if np.isfinite(tau[i, j]) else 0.0
        assert _contrast(to_rgba(text.get_color()), im.cmap(im.norm(v))) >= 3, (i, j, text.get_color())
    assert all(float(t).is_integer() for t in ax.get_xticks())
    plt.close(figs[0])
    rows = np.array([[r, 0, 3, 5 - r, 0.2 * r - 0.3] for r in range(1, 6)], dtype=float)
    assert _width_px(draw_trace(rows, tmp_path / "trace.png")) >= 1000
    S = np.eye(3) * 0.5 + 0.5
    assert _width_px(draw_similarity_panels([(1, S)], tmp_path / "s.png", "S")) >= 1000


def test_logger_pictures_false_draws_nothing_and_changes_no_result(tmp_path):
    """logger.pictures=false (for sweeps of short runs, where drawing is a good part of a run): a FedCOM run — the
    partition, curves, client spread and its matching-score heatmap — writes no PNG and logs no picture, yet the same
    metrics, CSV and diagnostic matrices as with pictures, and the same fingerprint (a neutral key). A complete run
    killed before its round table is finished by the next (skipped) launch, without pictures too."""
    from conftest import make_cfg, metrics_by_round, run_cfg

    from fedbench.checkpoint import fingerprint

    def run(pictures: bool, run_dir):
        cfg = make_cfg("algorithm=fedcom", "model=mlp", "partition=complementary_pairs", "clients=10", "rounds=2")
        cfg.logger.pictures = pictures
        return cfg, run_cfg(cfg, run_dir)

    cfg_on, on = run(True, tmp_path / "on")
    cfg_off, off = run(False, tmp_path / "off")
    drawn = sorted(p.relative_to(tmp_path / "on").as_posix() for p in (tmp_path / "on").rglob("*.png"))
    assert {"partition.png", "curves.png", "client_spread.png"} <= set(drawn), drawn
    assert any(p.startswith("diagnostics/matching_scores/") for p in drawn), drawn
    assert list((tmp_path / "off").rglob("*.png")) == []
    untimed = lambda rows: {t: {k: v for k, v in r.items() if not k.startswith("time/")} for t, r in rows.items()}  # noqa: E731
    with_pictures, without = untimed(metrics_by_round(tmp_path / "on")), untimed(metrics_by_round(tmp_path / "off"))
    assert any(k.startswith("image/") for r in with_pictures.values() for k in r)
    assert without == {t: {k: v for k, v in r.items() if not k.startswith("image/")} for t, r in with_pictures.items()}
    assert off["metrics"] == on["metrics"] and fingerprint(cfg_off) == fingerprint(cfg_on)
    assert (tmp_path / "off" / "metrics.csv").exists() and (tmp_path / "off" / "partition_counts.csv").exists()
    npy = lambda d: sorted(p.relative_to(d).as_posix() for p in d.rglob("*.npy"))  # noqa: E731
    assert npy(tmp_path / "off") == npy(tmp_path / "on") != []
    (tmp_path / "off" / "metrics.csv").unlink()  # as if killed right after status.json said complete
    _, again = run(False, tmp_path / "off")  # the same run: skipped, its round table finished, no curves.png
    assert again["metrics"] == off["metrics"] and (tmp_path / "off" / "metrics.csv").exists()
    assert list((tmp_path / "off").rglob("*.png")) == []


def test_client_spread_with_equal_client_sizes_counts_the_clients_per_accuracy_bin():
    """Issue #53 item 10: with equal-size shards the accuracy-vs-size panel was one column of dots. Every client has
    160 samples: the right panel counts the clients per 10 % accuracy bin, one bar per round, side by side — best
    (5, 20, 50, 50, 90, 95 %): 1 in [0, 10), 1 in [20, 30), 2 in [50, 60), 2 in [90, 100]; last (5, 20, 40, 45, 80,
    90 %): 1, 1, 2 in [40, 50), 1 in [80, 90), 1 in [90, 100]. Unequal sizes keep the scatter."""
    from fedbench.plots import client_spread_figure

    best, last = [0.5, 0.2, 0.9, 0.05, 0.95, 0.5], [0.4, 0.2, 0.8, 0.05, 0.9, 0.45]
    fig = client_spread_figure(best, 3, last, 5, [160] * 6)
    right = fig.axes[1]
    heights = [[r.get_height() for r in bars] for bars in right.containers]
    assert heights == [[1, 0, 1, 0, 0, 2, 0, 0, 0, 2], [1, 0, 1, 0, 2, 0, 0, 0, 1, 1]]
    assert (right.get_xlabel(), right.get_ylabel()) == ("personalized accuracy (%)", "clients")
    assert "each has 160 training samples" in right.get_title() and not right.collections
    unequal = client_spread_figure(best, 3, last, 5, [160, 150, 160, 160, 160, 160]).axes[1]
    assert unequal.get_xlabel() == "training samples of the client" and len(unequal.collections) == 2
