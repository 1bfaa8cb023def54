"""The run-time estimate's measured error (issue #53): the estimate of each CPU setting of the committed run records
against the time its runs spent in their rounds.

    python scripts/estimate_error.py            # print the table (the stored estimates, the records' times)
    python scripts/estimate_error.py --write    # estimate each setting again (needs its data: ../shared/data),
                                                # store the figures in conf/runtimes.yaml and the table in
                                                # docs/estimates.md (between its markers)

The estimate is fedbench/report/runtime.py's (``fedbench --estimate``, ``fedbench-tables``, ``fedbench-claims run
--estimate``, the paper-scale plan's CPU figures), from the per-sample costs stored in conf/runtimes.yaml; the
measurement is each run's own ``time/round`` + ``time/eval`` in docs/results/<paper>/runs.jsonl
(:func:`fedbench.report.estimate_check.checked_rows` says which runs). tests/test_estimate.py checks that the docs'
table is this script's output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "estimates.md"
BEGIN = "<!-- estimate-error: python scripts/estimate_error.py --write -->"
END = "<!-- /estimate-error -->"


def records(repo: Path = REPO) -> list[dict]:
    """Every committed run record (docs/results/<paper>/runs.jsonl)."""
    out = []
    for path in sorted((repo / "docs" / "results").glob("*/runs.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def data_root() -> str:
    """``$FEDBENCH_DATA``, else ../shared/data next to the repository."""
    return os.environ.get("FEDBENCH_DATA") or str(REPO.parent / "shared" / "data")


def estimates(root: str | None = None) -> dict:
    """The estimate of each checked setting, measured now (:func:`fedbench.report.estimate_check.checked_estimates`,
    from the stored per-sample costs; one that conf/runtimes.yaml lacks is measured here and stored with them)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fedbench.report.estimate_check import checked_estimates
    from fedbench.report.stored_runtimes import cost_name, stored_costs, update

    conf = REPO / "conf"
    costs = stored_costs(conf)
    before = set(costs)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            got = checked_estimates(records(), costs, lambda o: compose("config", overrides=o), root or data_root())
    finally:
        GlobalHydra.instance().clear()
    if set(costs) - before:
        import yaml

        stored = (yaml.safe_load((conf / "runtimes.yaml").read_text()) or {}).get("per_sample_cpu_seconds") or {}
        new = {cost_name(k): list(costs[k]) for k in set(costs) - before}
        update(conf, "per_sample_cpu_seconds", {**stored, **new})
    return got


def table(stored: dict | None = None) -> str:
    """The Markdown table from the estimates stored in conf/runtimes.yaml's ``checked`` (or ``stored``) and the
    records' measured times."""
    import yaml

    from fedbench.report.estimate_check import checked_rows, error_table

    if stored is None:
        stored = (yaml.safe_load((REPO / "conf" / "runtimes.yaml").read_text()) or {}).get("checked") or {}
    return error_table(checked_rows(records(), stored))


def block(text: str) -> str:
    """The table between the markers of docs/estimates.md."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="put the table into docs/estimates.md")
    args = ap.parse_args(argv)
    if args.write:
        from fedbench.report.stored_runtimes import update

        update(REPO / "conf", "checked", estimates())
    got = table()
    print(got, end="")
    if args.write:
        text = DOC.read_text()
        head, rest = text.split(BEGIN, 1)
        DOC.write_text(head + BEGIN + "\n" + got + END + rest.split(END, 1)[1])
        print(f"estimate_error: wrote {DOC.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
