"""fedbench-report (issue #20 item 9): no difference against the paper for numbers that cannot be compared — seconds
(this machine vs the paper's GPU) always, counts of rounds (CCP length, rounds to target, speedup) when the runs ran
fewer rounds than the paper — shown and flagged instead; a table wider than the terminal is printed in parts, never
with a number cut or wrapped; ``--format markdown`` prints the Markdown table."""

from __future__ import annotations

import csv
import io

import yaml
from rich.console import Console
from test_report import write_run

from fedbench.report import Report, collect, group_tables, main

TABLE = {
    "paper": "fedrema",
    "id": "table3",
    "title": "FedReMa Table 3 (test)",
    "rows": "algorithm.delta",
    "cols": None,
    "percent": True,
    "metrics": {"Best Acc": "global/acc.best", "Rounds in CCP": "ccp_rounds", "Runtime (s)": "wall_time"},
    "reference": {
        0.1: {"Best Acc": 63.36, "Rounds in CCP": 500, "Runtime (s)": 1403.08},
        0.9: {"Best Acc": 65.06, "Rounds in CCP": 7, "Runtime (s)": 760.89},
    },
}


def _sweep(root, scale, rounds=4, set_rounds=False):
    for i, d in enumerate([0.1, 0.9]):
        run = write_run(
            root,
            "fedrema",
            0,
            TABLE,
            [0.1, 0.3, 0.5, 0.6, 0.62][: rounds + 1],
            [2.0] * rounds,
            num=i,
            extra={"ccp_rounds": 4 - 3 * i},
            delta=d,
        )
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "scale": scale}))
        if set_rounds:
            hydra = yaml.safe_load((run / ".hydra" / "hydra.yaml").read_text())
            hydra["hydra"]["overrides"]["task"].append(f"rounds={rounds}")
            (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
        run.rename(root / f"delta={d}")
    return Report(group_tables(collect([root]))[0])


def test_seconds_and_reduced_round_counts_get_no_delta(tmp_path):
    rep = _sweep(tmp_path / "reduced", scale=0.008)  # 4 of the paper's 500 rounds
    best, ccp, wall = rep.columns
    assert rep.diff("0.1", best) == 62.0 - 63.36  # accuracies: compared (the gap is the budget)
    assert rep.diff("0.1", ccp) is None and rep.diff("0.1", wall) is None
    assert rep.cells[("0.1", "Rounds in CCP")].values == [4.0] and rep.paper_text("0.1", ccp) == "500"
    assert rep.lines()[0] == ["0.1", "62.00", "63.36", "-1.36", "4", "500", "n/c", "8.00", "1403.08", "n/c"]
    notes = rep.comparison_notes()
    assert notes == [
        "Rounds in CCP: no Δ — counts rounds; these runs ran 4 of 500 rounds (scale=0.008)",
        "Runtime (s): no Δ — seconds on this machine, not on the paper's hardware",
    ]
    out = tmp_path / "out"
    assert main([str(tmp_path / "reduced"), "--out", str(out), "--no-plots"]) == 0
    rows = {(r["row"], r["column"]): r for r in csv.DictReader((out / "fedrema_table3.csv").open())}
    assert rows[("0.9", "Rounds in CCP")]["diff"] == "" and rows[("0.9", "Rounds in CCP")]["paper"] == "7"
    assert rows[("0.9", "Rounds in CCP")]["not_compared"].startswith("counts rounds")
    assert rows[("0.9", "Best Acc")]["diff"] != "" and rows[("0.9", "Best Acc")]["not_compared"] == ""
    md = (out / "fedrema_table3.md").read_text()
    assert "| 0.9 | 62.00 | 65.06 | -3.06 | 1 | 7 | n/c | 8.00 | 760.89 | n/c |" in md and notes[0] in md

    from fedbench.report.figures import vs_key_figures

    [(_, fig)] = vs_key_figures(rep)  # the δ picture flags the CCP panel, not accuracy
    assert fig.axes[0].get_title() == "" and fig.axes[1].get_title().startswith("not comparable with the paper: counts")

    # the paper's rounds (scale 1, rounds not set): the CCP length is compared; seconds never are
    rep = _sweep(tmp_path / "paper", scale=1.0)
    assert rep.diff("0.9", rep.columns[1]) == 1 - 7 and rep.diff("0.9", rep.columns[2]) is None
    # rounds set on the command line at scale 1: fewer rounds than the paper's, no Δ
    rep = _sweep(tmp_path / "set", scale=1.0, set_rounds=True)
    assert rep.diff("0.9", rep.columns[1]) is None
    assert (
        rep.comparison_notes()[0]
        == "Rounds in CCP: no Δ — counts rounds; these runs ran 4 rounds (set on the command line)"
    )


def test_a_wide_table_is_printed_in_parts_never_cutting_a_number(tmp_path, capsys):
    """Twelve metric columns with the paper's numbers and Δ (37 columns) on a 120-column terminal: every line fits,
    every cell's text is printed whole, the row names are repeated in each part."""
    metrics = {f"Acc {k}": "global/acc.best" for k in range(12)}
    wide = dict(
        TABLE,
        metrics=metrics,
        reference={0.1: {m: 61.234 + k for k, m in enumerate(metrics)}, 0.9: {m: 62.5 for m in metrics}},
    )
    root = tmp_path / "wide"
    for i, d in enumerate([0.1, 0.9]):
        write_run(root, "fedrema", 0, wide, [0.1, 0.5], num=i, delta=d).rename(root / f"delta={d}")
    rep = Report(group_tables(collect([root]))[0])
    from fedbench.report import print_rich

    buf = io.StringIO()
    print_rich(rep, Console(file=buf, width=120, color_system=None))
    text = buf.getvalue()
    assert max(map(len, text.splitlines())) <= 120
    assert text.count("(1/") == 1 and "FedReMa Table 3 (test) (2/" in text
    printed = [line.split("│") for line in text.splitlines()]
    cells = {c.strip() for parts in printed for c in parts}
    for line in rep.lines():
        assert set(line) <= cells, set(line) - cells  # each number whole, in one cell
    assert sum(1 for parts in printed if parts[1:2] and parts[1].strip() == "0.1") >= 2

    assert main([str(root), "--out", str(tmp_path / "o"), "--no-plots", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| delta | Acc 0 | paper | Δ |" in out and "| 0.1 | 50.00 | 61.23 | -11.23 |" in out
