"""A complete run keeps its final model (model.pt) and drops its checkpoints; an interrupted one keeps its checkpoint
and resumes; a config refused before the run began leaves no empty run dir (issue #20 item 6)."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from conftest import make_cfg, run_cfg

from fedbench import checkpoint as ckpt
from fedbench.callbacks import Callback
from fedbench.errors import ConfigError
from fedbench.preemption import Preempted
from fedbench.run import Run

# Ditto: a global model w and personalized models V (one per client), and per-client momentum (optimizer state)
DITTO = ["algorithm=ditto", "rounds=3", "checkpoint.every=1", "checkpoint.keep=5", "optim.persistent_state=true"]


def last_row(run_dir) -> dict:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "pers/acc" in r][-1]


def test_a_complete_run_keeps_its_final_model_not_its_checkpoints(tmp_path, capsys):
    cfg = make_cfg(*DITTO)
    run_dir = tmp_path / "run"
    summary = run_cfg(cfg, run_dir)
    assert not (run_dir / "checkpoints").exists()  # checkpoint.keep_complete: 0 (rounds 1 and 2 were saved)
    final = ckpt.load_final(run_dir)
    assert (
        final["round"] == 3 and final["algorithm"] == "ditto" and final["config_fingerprint"] == ckpt.fingerprint(cfg)
    )
    assert "opt_state" not in final["state"] and set(final["state"]) == {"w", "bn", "V", "VB"}
    # the saved weights ARE the final models: loaded into a fresh run of the same config, they score what the run logged
    fresh = Run(cfg, tmp_path / "fresh")
    fresh.setup()
    fresh.algorithm.load_state_dict(final["state"])
    scored = fresh.evaluator(fresh.algorithm, 3)
    logged = last_row(run_dir)
    assert logged["round"] == 3
    assert scored["pers/acc"] == pytest.approx(logged["pers/acc"]) and scored["global/acc"] == pytest.approx(
        logged["global/acc"]
    )
    g_params, _ = fresh.algorithm.global_model()
    assert all(torch.equal(final["global"][0][k], g_params[k]) for k in g_params)
    assert not all(torch.equal(final["state"]["V"][k][0], g_params[k]) for k in g_params)  # personalized != global
    # the same command again: already complete, nothing to resume, nothing changes
    capsys.readouterr()
    assert run_cfg(cfg, run_dir)["metrics"] == summary["metrics"]
    assert "already complete; skipped" in capsys.readouterr().err


def test_keep_complete_keeps_the_newest_checkpoints_and_model_pt_is_the_smaller_file(tmp_path):
    run_dir = tmp_path / "run"
    run_cfg(make_cfg(*DITTO, "checkpoint.keep_complete=1", "checkpoint.final_model=false"), run_dir)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["round_000002.pt", "round_000002.sha256"]
    assert not (run_dir / "model.pt").exists()
    saved = ckpt.load_latest(run_dir, "cpu")["algorithm"]
    run_dir2 = tmp_path / "run2"
    run_cfg(make_cfg(*DITTO), run_dir2)
    # the momentum of every client (as large as V) is what a final model does not need
    assert saved["opt_state"] is not None
    assert (run_dir2 / "model.pt").stat().st_size < 0.75 * (run_dir / "checkpoints" / "round_000002.pt").stat().st_size


class SignalInRound2(Callback):
    """A real SIGTERM to this process in round 2 (as a scheduler's preemption would send it)."""

    def before_round(self, run, t):
        if t == 2:
            os.kill(os.getpid(), signal.SIGTERM)


def test_an_interrupted_run_keeps_its_checkpoint_and_resumes_to_the_same_result(tmp_path, capsys):
    cfg = make_cfg(*DITTO, "checkpoint.every=0")  # only the signal saves (the last finished round)
    reference = run_cfg(cfg, tmp_path / "reference")
    run_dir = tmp_path / "run"
    with pytest.raises(Preempted):
        Run(cfg, run_dir, callbacks=[SignalInRound2()]).execute()
    assert ckpt.load_latest(run_dir, "cpu")["round"] == 1 and not (run_dir / "model.pt").exists()
    capsys.readouterr()
    resumed = run_cfg(cfg, run_dir)
    assert "resuming" in capsys.readouterr().err
    assert resumed["metrics"] == reference["metrics"]
    assert not (run_dir / "checkpoints").exists() and (run_dir / "model.pt").exists()


def test_a_refused_config_leaves_no_empty_run_dir(tmp_path):
    """Hydra makes the run dir before the job starts; a config refused there must not leave it empty (fedbench-report
    lists an empty dir as "pending"). One run: the dir goes; a sweep's job: status.json says why."""
    from fedbench.report.runs import load_run

    bad = make_cfg("participation=1.5")
    single, job = tmp_path / "single", tmp_path / "sweep" / "participation=1.5"
    for run_dir, group in ((single, None), (job, "sweep")):
        run_dir.mkdir(parents=True)  # as Hydra leaves it
        with pytest.raises(ConfigError, match="participation"):
            Run(bad, run_dir, group=group).execute()
    assert not single.exists()
    record = load_run(job, 0, set())
    assert record.status == "failed" and "participation=1.5" in record.error
