"""Clusters: SLURM's USR2 warning (time limit / preemption) checkpoints the run and lets submitit requeue it, the
requeued job resumes from that round; a sweep whose job dies without a result still ends with the summary line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedbench.preemption import Preempted, PreemptionGuard, hand_over

REPO = Path(__file__).resolve().parent.parent


def test_usr2_preempts_and_is_handed_over_to_the_previous_handler():
    seen = []
    old = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))  # e.g. submitit's requeue handler
    try:
        with pytest.raises(Preempted) as e, PreemptionGuard():
            signal.raise_signal(signal.SIGUSR2)
            time.sleep(1)  # the handler raises at the next bytecode
        assert e.value.signum == signal.SIGUSR2 and seen == []  # fedbench's guard took it first
        hand_over(signal.SIGUSR2)
        assert seen == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, old)
    hand_over(signal.SIGINT)  # Python's own SIGINT handler (KeyboardInterrupt) is not called


def _status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_submitit_sweep_usr2_requeues_and_resumes_a_killed_job_is_reported(tmp_path):
    """Two jobs under submitit_local: job 0 gets SIGUSR2 at round >= 2 (as SLURM sends before a time limit) -> it saves
    that round, submitit requeues it, it resumes from there and completes; job 1 is SIGKILLed (no result) -> the sweep
    ends with exit 1 and the summary line naming it."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    rounds = 40
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedbench.cli",
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=20",
            "seed=0,1",
            f"rounds={rounds}",
            "clients=4",
            "logger=none",
            "hardware.threads=1",
            "checkpoint.every=0",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sent: dict = {}
    deadline = time.time() + 600
    while len(sent) < 2 and time.time() < deadline and p.poll() is None:
        for path in sweep.glob("*/status.json"):
            s, job = _status(path), path.parent.name
            if job not in sent and s.get("status") == "running" and s.get("round", 0) >= 2:
                sig = signal.SIGUSR2 if job.endswith("seed=0") else signal.SIGKILL
                os.kill(s["pid"], sig)
                sent[job] = (sig, s["round"])
        time.sleep(0.02)
    out, err = p.communicate(timeout=900)
    assert len(sent) == 2, (sent, err[-3000:])
    job0 = next(d for d in sweep.iterdir() if d.name.endswith("seed=0"))
    job1 = next(d for d in sweep.iterdir() if d.name.endswith("seed=1"))
    assert p.returncode == 1, err[-3000:]
    last = [ln for ln in err.splitlines() if ln.startswith("fedbench:")][-1]
    assert re.search(r"1 of 2 runs failed \(1 lost\).*seed=1", last), last
    assert _status(job0 / "status.json")["status"] == "complete"
    logs = "".join(f.read_text() for f in sweep.glob(".submitit/*/*_log.err"))
    assert "SIGUSR2 received: checkpoint saved" in logs
    resumed = int(re.search(r"resuming \S+seed=0 after round (\d+)", logs).group(1))
    assert resumed >= sent[job0.name][1] >= 2  # from the round it had finished, not from 0
    rows = [json.loads(ln) for ln in (job0 / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows if "pers/acc" in r] == list(range(rounds + 1))  # every round evaluated once
    assert _status(job1 / "status.json")["status"] == "running"  # SIGKILL: it could not say anything itself
