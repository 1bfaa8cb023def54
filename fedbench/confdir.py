"""Where the configuration lives: ``conf/`` (or ``$FEDBENCH_CONF``), the folders ``--config-dir`` adds, the config
groups a command line chooses from and their options. Every entry point reads it (cli, report, claims), so it lives
at the bottom of the house and imports nothing of fedbench."""

from __future__ import annotations

import os
from pathlib import Path

CONF_DIR = Path(os.environ.get("FEDBENCH_CONF", Path(__file__).resolve().parent.parent / "conf"))
GROUPS = ("algorithm", "dataset", "partition", "model", "hardware", "logger", "experiment")

CONFIG_DIRS: list[
    Path
] = []  # --config-dir: more config groups, searched with conf/ (filled in by fedbench.overrides.check_config_files)


def options(group: str) -> list[str]:
    """Options of a config group: yaml files under conf/<group>/ (and <--config-dir>/<group>/), nested paths
    included."""
    roots = [d / group for d in (CONF_DIR, *CONFIG_DIRS) if (d / group).is_dir()]
    return sorted({str(p.relative_to(root).with_suffix("")) for root in roots for p in root.rglob("*.yaml")})


def experiments() -> list[str]:
    """The experiment configs a user runs (`+experiment=...`): the paper tables and figures, smoke. Not the parts the
    tables include or sweep over (``<paper>/setting``, ``<paper>/setting/*``, ``<paper>/column/*``,
    ``<paper>/arm/*``)."""
    return [o for o in options("experiment") if len(Path(o).parts) <= 2 and Path(o).name != "setting"]


def help_groups() -> str:
    """The config groups of ``fedbench --help`` (conf/hydra/help/fedbench.yaml's ``${fb_help_groups:}``, registered
    with the other resolvers in fedbench/config.py): the ones a user chooses, not fedbench's internal ones (claims,
    dataset_defaults, the tables' parts)."""
    return "\n".join(
        [
            *(f"{g}: {', '.join(options(g))}" for g in GROUPS if g != "experiment"),
            f"+experiment (paper tables and figures; add -m for the sweep): {', '.join(experiments())}",
        ]
    )
