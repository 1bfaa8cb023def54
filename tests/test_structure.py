"""How a run is put together (README "How a run is put together"): a short run.py, the config validated once per run,
the callbacks called in the order the round loop documents (fedbench/callbacks.py)."""

from __future__ import annotations

import json
import subprocess
import sys
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


def test_a_run_on_embedded_data_without_pictures_imports_no_torchvision_matplotlib_or_inductor(tmp_path):
    """What a process imports is paid by every run and every job of a sweep: torchvision (~1.5 s: its models import
    torch._dynamo), torch._inductor (~2 s, by torch.use_deterministic_algorithms), pyplot (~0.6 s) and scikit-learn
    (~2 s; the digits are read from its file) are imported only where a run needs them (torchvision's datasets,
    hardware.deterministic=true, pictures; nothing of ours imports scikit-learn)."""
    script = (
        "import sys\n"
        "from fedbench.cli import main\n"
        "sys.argv = ['fedbench', 'logger=none', 'logger.pictures=false', 'dataset=digits', 'model=mlp', 'rounds=1',"
        " 'clients=3', 'algorithm=fedpac', 'hydra.run.dir=run']\n"
        "main()\n"
        "print(sorted({m.split('.')[0] if not m.startswith('torch._') else '.'.join(m.split('.')[:2])"
        " for m in sys.modules"
        " if m.startswith(('torchvision', 'matplotlib', 'torch._inductor', 'torch._dynamo', 'sklearn'))}))\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[]"
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "complete"
