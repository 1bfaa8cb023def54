#!/usr/bin/env python
"""Paper tables from multirun directories, printed and plotted next to the papers' numbers.

Same as the `fedbench-report` command (fedbench/report/; docs/report.md):

    python scripts/report.py outputs/multirun/<sweep> [<more sweeps>] [--out DIR] [--wandb [MODE]] [--no-plots]
"""

import sys

from fedbench.report import main

if __name__ == "__main__":
    sys.exit(main())
