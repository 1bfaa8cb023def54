#!/usr/bin/env python
"""Methods side by side from a multirun — now an alias of `fedbench-report` (fedbench/report/, docs/report.md),
kept because docs/baselines.md and conf/experiment/fedka/baselines_reduced.yaml cite it.

    python scripts/compare.py outputs/multirun/<date>/<time> [--metric global/acc]

Runs with a `table:` node get their table (mean ± std over seeds, paper numbers, Markdown/CSV/PNG in
<dir>/report/); `--metric` picks the accuracy shown (best, final) for runs without one.
"""

import sys

from fedbench.report import main

if __name__ == "__main__":
    sys.exit(main())
