"""Where the configuration lives: ``conf/`` (or ``$FEDBENCH_CONF``), the folders ``--config-dir`` adds, the config
groups a command line chooses from and their options. Every entry point reads it (cli, report, claims), so it lives
at the bottom of the house and imports nothing of fedbench."""

from __future__ import annotations

import os
from pathlib import Path

CONF_DIR = Path(os.environ.get("FEDBENCH_CONF", Path(__file__).resolve().parent.parent / "conf"))
GROUPS = ("algorithm", "dataset", "partition", "model", "hardware", "logger", "experiment")

CONFIG_DIRS: list[Path] = []  # --config-dir: more config groups, searched with conf/ (filled in by fedbench.cli)


def options(group: str) -> list[str]:
    """Options of a config group: yaml files under conf/<group>/ (and <--config-dir>/<group>/), nested paths
    included."""
    roots = [d / group for d in (CONF_DIR, *CONFIG_DIRS) if (d / group).is_dir()]
    return sorted({str(p.relative_to(root).with_suffix("")) for root in roots for p in root.rglob("*.yaml")})
