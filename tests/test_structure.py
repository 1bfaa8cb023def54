"""How a run is put together (README "How a run is put together"): a short run.py, the config validated once per run,
the callbacks called in the order the round loop documents (fedbench/callbacks.py)."""

from __future__ import annotations

from pathlib import Path

from conftest import make_cfg

import fedbench.run
from fedbench.callbacks import Callback
from fedbench.config import validate
from fedbench.run import Run

REPO = Path(__file__).resolve().parents[1]


def test_run_py_stays_short():
    """The wiring lives in build.py, the run dir in rundir.py, the state in checkpoint.py, the rest in callbacks."""
    lines = (REPO / "fedbench" / "run.py").read_text().splitlines()
    assert len(lines) < 120, f"fedbench/run.py has {len(lines)} lines"


class Recorder(Callback):
    """Records each call with what the run holds at that moment."""

    def __init__(self):
        self.calls = []

    def on_start(self, run, t0):
        self.calls.append(("on_start", t0, [h["round"] for h in run.history]))

    def before_round(self, run, t):
        self.calls.append(("before_round", t, [h["round"] for h in run.history]))

    def after_round(self, run, t, metrics):
        self.calls.append(("after_round", t, [h["round"] for h in run.history]))
        self.keys = list(metrics)

    def on_end(self, run, summary):
        self.calls.append(("on_end", summary["status"], [h["round"] for h in run.history]))


def test_validate_runs_once_and_callbacks_are_called_in_the_documented_order(tmp_path, monkeypatch):
    calls = []

    def counted(cfg):  # the real check, counted
        calls.append(cfg)
        return validate(cfg)

    monkeypatch.setattr(fedbench.run, "validate", counted)
    rec = Recorder()
    cfg = make_cfg("rounds=2", "clients=4", "eval_every=2", cache_dir=tmp_path / "cache")
    summary = Run(cfg, tmp_path / "run", callbacks=[rec]).execute()
    assert summary["status"] == "complete"
    assert len(calls) == 1, f"validate ran {len(calls)} times"
    # an extra callback comes after the run's own: the loggers' callback has recorded the round's row before it
    assert rec.calls == [
        ("on_start", 0, [0]),
        ("before_round", 1, [0]),
        ("after_round", 1, [0, 1]),
        ("before_round", 2, [0, 1]),
        ("after_round", 2, [0, 1, 2]),
        ("on_end", "complete", [0, 1, 2]),
    ]
    # round 2's metrics: the algorithm's, time/round, then the evaluation's, then time/eval
    assert rec.keys.index("time/round") < rec.keys.index("pers/acc") < rec.keys.index("time/eval") == len(rec.keys) - 1
