"""Runs that survive: kill -9 + resume, SIGTERM, corrupted checkpoints, sweeps that skip finished work,
launchers, guarded failure, secrets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO
from test_faults import fedbench_here  # the real entry point in this process, where no signal or W&B is involved
from wandb_files import read_run

from fedbench import checkpoint as ckpt

# ~0.3-1 s per round on digits, so a run can be caught mid-way
SLOW = [
    "rounds=8",
    "clients=6",
    "local_epochs=25",
    "checkpoint.every=2",
    "logger=offline",
    "logger.console=false",
    "hardware.threads=1",
]


def env(tmp_path, **extra):
    return {
        **os.environ,
        "WANDB_MODE": "offline",
        "FEDBENCH_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def fedbench(*args, tmp_path, check=True, **kw):
    p = subprocess.run(
        [sys.executable, "-m", "fedbench.cli", *args],
        cwd=tmp_path,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
        **kw,
    )
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def start(*args, tmp_path):
    return subprocess.Popen(
        [sys.executable, "-m", "fedbench.cli", *args],
        cwd=tmp_path,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(cond, proc, timeout=600):
    t0 = time.time()
    while not cond():
        assert proc.poll() is None, "the run ended before it could be interrupted: " + proc.stderr.read()[-2000:]
        assert time.time() - t0 < timeout
        time.sleep(0.02)


def rounds_logged(run_dir: Path) -> int:
    f = run_dir / "metrics.jsonl"
    if not f.exists():
        return 0
    return max((json.loads(ln)["round"] for ln in f.read_text().splitlines() if ln.strip()), default=0)


def status(run_dir: Path) -> str:
    return json.loads((run_dir / "status.json").read_text())["status"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every interrupted one must reproduce."""
    tmp = tmp_path_factory.mktemp("reference")
    fedbench(*SLOW, f"hydra.run.dir={tmp / 'run'}", tmp_path=tmp)
    return json.loads((tmp / "run" / "summary.json").read_text())


def test_kill_9_then_rerun_equals_uninterrupted(tmp_path, reference):
    run_dir = tmp_path / "run"
    args = [*SLOW, f"hydra.run.dir={run_dir}"]
    proc = start(*args, tmp_path=tmp_path)
    wait_for(lambda: (run_dir / "checkpoints" / "round_000004.sha256").exists(), proc)
    proc.kill()  # SIGKILL: no handler runs
    proc.wait()
    assert status(run_dir) == "running" and not (run_dir / "summary.json").exists()
    p = fedbench(*args, tmp_path=tmp_path)  # the same command again
    assert "resuming" in p.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metrics"] == reference["metrics"]
    assert summary["final"] == reference["final"]
    assert summary["communication"] == reference["communication"] and reference["communication"]["MB"] > 0
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows if "pers/acc" in r] == list(range(9))  # each round once, none lost or doubled
    wb = read_run(run_dir)
    assert len(wb["ids"]) == 1 and len(wb["files"]) == 2  # W&B resumed the same run id
    # the resumed segment carries every round after the checkpoint (what W&B had not flushed before
    # the SIGKILL exists only in metrics.jsonl, the run's source of truth)
    assert {h["_step"] for h in wb["history"] if "pers/acc" in h} >= set(range(5, 9))


def test_sigterm_saves_a_checkpoint_exits_cleanly_and_resumes(tmp_path, reference):
    run_dir = tmp_path / "run"
    args = [*SLOW, "checkpoint.every=0", f"hydra.run.dir={run_dir}"]  # only the signal writes a checkpoint
    proc = start(*args, tmp_path=tmp_path)
    wait_for(lambda: rounds_logged(run_dir) >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "checkpoint saved" in err and "Traceback" not in err
    assert status(run_dir) == "preempted"
    saved = sorted((run_dir / "checkpoints").glob("round_*.pt"))
    assert (
        len(saved) == 1 and int(saved[0].stem.split("_")[1]) >= 2
    )  # the last finished round (3, or 2 if caught mid-snapshot)
    fedbench(*args, tmp_path=tmp_path)
    assert json.loads((run_dir / "summary.json").read_text())["metrics"] == reference["metrics"]


def test_second_signal_exits_at_once(tmp_path):
    script = textwrap.dedent("""
        import os, signal, time
        from fedbench.preemption import Preempted, PreemptionGuard
        with PreemptionGuard():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except Preempted:
                print("saving...", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)   # a second signal while "saving"
                time.sleep(30)
                print("not reached")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 128 + signal.SIGTERM
    assert "saving..." in p.stdout and "not reached" not in p.stdout and "second SIGTERM" in p.stderr


def test_a_signal_landing_in_a_finalizer_prints_no_traceback_and_still_stops_the_run():
    # CI once saw SIGTERM arrive inside a WeakValueDictionary callback: Python printed "Exception ignored in ..."
    # with a traceback; the guard notes the signal, stays quiet, and check() raises it at the next safe point
    script = textwrap.dedent("""
        import gc, signal, sys
        from fedbench.preemption import Preempted, PreemptionGuard
        class Finalized:
            def __del__(self):
                signal.raise_signal(signal.SIGTERM)
                sum(range(1000))  # the handler runs here, inside __del__
        with PreemptionGuard() as guard:
            Finalized()
            gc.collect()
            print("swallowed", flush=True)
            try:
                guard.check()
            except Preempted as e:
                print("stopped by", e, flush=True)
        class Other:
            def __del__(self):
                raise ValueError("not a signal")
        Other()  # other unraisable errors still print, and the hook is Python's own again
        print(sys.unraisablehook is sys.__unraisablehook__, flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:3] == ["swallowed", "stopped by SIGTERM", "True"]
    assert "Preempted" not in p.stderr and "ValueError: not a signal" in p.stderr


def test_corrupted_checkpoint_falls_back_to_the_previous_one(tmp_path):
    state = lambda v: {"algorithm": {"w": torch.full((3,), float(v))}, "history": [{"round": v}]}
    ckpt.save(tmp_path, 2, state(2), keep=2)
    newest = ckpt.save(tmp_path, 4, state(4), keep=2)
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # truncated, e.g. a crash during a copy
    messages = []
    got = ckpt.load_latest(tmp_path, "cpu", warn=messages.append)
    assert got["round"] == 2 and torch.equal(got["algorithm"]["w"], torch.full((3,), 2.0))
    assert len(messages) == 1 and "round_000004.pt" in messages[0] and "corrupted" in messages[0]


def test_checkpoints_never_execute_code(tmp_path):
    import hashlib
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    d = tmp_path / "checkpoints"
    d.mkdir()
    bad = d / "round_000009.pt"
    bad.write_bytes(pickle.dumps(Evil()))
    (d / "round_000009.sha256").write_text(hashlib.sha256(bad.read_bytes()).hexdigest())  # checksum even matches
    ckpt.save(tmp_path, 3, {"algorithm": {}}, keep=5)
    messages = []
    got = ckpt.load_latest(tmp_path, "cpu", warn=messages.append)
    assert got["round"] == 3 and not marker.exists() and "cannot be read" in messages[0]


def test_keeps_only_the_newest_checkpoints(tmp_path):
    for t in (1, 2, 3, 4):
        ckpt.save(tmp_path, t, {"algorithm": {}}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "round_000003.pt",
        "round_000003.sha256",
        "round_000004.pt",
        "round_000004.sha256",
    ]


def test_relaunched_sweep_skips_complete_runs_and_resumes_partial_ones(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "seed=0,1",
        "rounds=4",
        "clients=4",
        "checkpoint.every=1",
        "checkpoint.keep_complete=2",
        "logger=none",
        f"hydra.sweep.dir={sweep}",
    ]
    fedbench(*args, tmp_path=tmp_path)
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    done, crashed = runs
    before = json.loads((crashed / "summary.json").read_text())
    # make the second run look like it crashed during round 4 (its round-3 checkpoint is on disk)
    fp = json.loads((crashed / "status.json").read_text())["config_fingerprint"]
    (crashed / "summary.json").unlink()
    (crashed / "status.json").write_text(json.dumps({"status": "running", "round": 3, "config_fingerprint": fp}))
    mtime = (done / "summary.json").stat().st_mtime
    p = fedbench(*args, tmp_path=tmp_path)
    assert f"{done} is already complete; skipped" in p.stderr
    assert f"resuming {crashed} after round 3" in p.stderr
    assert (done / "summary.json").stat().st_mtime == mtime
    assert json.loads((crashed / "summary.json").read_text())["metrics"] == before["metrics"]


def test_same_command_same_dir_and_resume_false_keeps_the_old_files(tmp_path):
    assert fedbench_here("rounds=2", "clients=4", "logger=none", tmp_path=tmp_path)[0] == 0
    run_dir = tmp_path / "outputs" / "runs" / "clients=4,rounds=2"
    assert status(run_dir) == "complete"
    code, err = fedbench_here("rounds=2", "clients=4", "logger=none", tmp_path=tmp_path)
    assert code == 0 and "already complete; skipped" in err
    assert fedbench_here("rounds=2", "clients=4", "logger=none", "resume=false", tmp_path=tmp_path)[0] == 0
    archived = list((run_dir / "previous").glob("*/summary.json"))
    assert len(archived) == 1 and status(run_dir) == "complete"


def test_non_finite_loss_stops_the_run_and_marks_it_diverged(tmp_path):
    run_dir = tmp_path / "run"
    code, err = fedbench_here(
        "rounds=5",
        "clients=4",
        "lr=1e30",
        "optim.momentum=0",
        "divergence.factor=null",
        "logger=none",
        "checkpoint.every=1",
        f"hydra.run.dir={run_dir}",
        tmp_path=tmp_path,
    )
    assert code == 1
    line = [ln for ln in err.splitlines() if ln.startswith("fedbench:")][-1]
    assert "non-finite" in line and "diverged in round" in line and "client(s) [" in line
    assert status(run_dir) == "diverged" and not (run_dir / "summary.json").exists()
    failed_round = int(line.split("diverged in round ")[1].split(":")[0])
    assert all(int(c.stem.split("_")[1]) < failed_round for c in (run_dir / "checkpoints").glob("round_*.pt"))


def test_disk_space_guard(tmp_path):
    code, err = fedbench_here(
        "logger=none", "checkpoint.min_free_mb=1e12", f"hydra.run.dir={tmp_path / 'run'}", tmp_path=tmp_path
    )
    assert code == 2 and "checkpoint.min_free_mb" in err and "MB left" in err


def test_secrets_never_reach_outputs(tmp_path):
    secret = "fakekey0123456789abcdef0123456789abcdef01"
    run_dir = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedbench.cli",
            "rounds=2",
            "clients=4",
            "logger=offline",
            "logger.console=false",
            "checkpoint.every=1",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env={**env(tmp_path), "WANDB_API_KEY": secret},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert secret not in p.stdout + p.stderr
    files = [f for f in run_dir.rglob("*") if f.is_file()]
    assert any(f.suffix == ".wandb" for f in files) and any(f.suffix == ".pt" for f in files)
    for f in files:
        assert secret.encode() not in f.read_bytes(), f


@pytest.mark.parametrize("launcher", ["parallel", "submitit_local"])
def test_multirun_through_launchers(tmp_path, launcher):
    pytest.importorskip(
        "hydra_plugins.hydra_joblib_launcher" if launcher == "parallel" else "hydra_plugins.hydra_submitit_launcher"
    )
    sweep = tmp_path / "sweep"
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "parallel" else ["hydra.launcher.timeout_min=20"]
    fedbench(
        "-m",
        f"hydra/launcher={launcher}",
        *extra,
        "seed=0,1",
        "rounds=2",
        "clients=4",
        "logger=none",
        f"hydra.sweep.dir={sweep}",
        tmp_path=tmp_path,
    )
    done = [json.loads(p.read_text())["status"] for p in sweep.glob("*/status.json")]
    assert done == ["complete", "complete"]


def test_a_failed_job_of_an_earlier_sweep_in_this_process_does_not_fail_the_next_run(tmp_path):
    """`fedbench` called again in one process (tests, a notebook) after a sweep with a failed job: the new, good run
    exits 0 (the sweep's failure mark is per call)."""
    from fedbench.sweep import SWEEP_FAILED

    SWEEP_FAILED.append(1)
    try:
        code, err = fedbench_here("rounds=1", "clients=3", "logger=none", tmp_path=tmp_path)
    finally:
        SWEEP_FAILED.clear()
    assert code == 0, err
    assert status(tmp_path / "outputs" / "runs" / "clients=3,rounds=1") == "complete"


def test_a_complete_run_is_skipped_whatever_threads_or_processes_it_was_made_with(tmp_path):
    """hardware.distributed (and its timeout) change how a run is made, not what it computes (test_distributed.py), so
    like hardware.threads they leave its fingerprint and run dir alone: a run made before they existed (its
    fingerprint hashed without them), one made while fedbench hashed them (ee065f2..0f18d28) and one made with
    other values of them are all skipped when complete — the old code refused the first kind ("holds a run with a
    different config"), which stopped the claims reruns of runs made before #33. A real difference (lr) refuses."""
    from omegaconf import OmegaConf

    run_dir = tmp_path / "run"
    args = ["rounds=1", "clients=3", "hardware.threads=1", "logger=none", f"hydra.run.dir={run_dir}"]
    assert fedbench_here(*args, tmp_path=tmp_path)[0] == 0
    cfg = OmegaConf.load(run_dir / "config.yaml")
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "complete" and status["config_fingerprint"] == ckpt.fingerprint(cfg)
    before = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hardware"])  # the config as made before #33
    before.hardware = {k: v for k, v in cfg.hardware.items() if k not in ("distributed", "distributed_timeout")}
    hashed = ckpt.fingerprint(cfg, counted=("distributed", "distributed_timeout"))
    assert len({ckpt.fingerprint(before), hashed, ckpt.fingerprint(cfg)}) == 2  # before == now != while hashed
    for recorded, extra in (
        (ckpt.fingerprint(before), []),
        (hashed, []),
        (status["config_fingerprint"], ["hardware.distributed=off", "hardware.distributed_timeout=60"]),
    ):
        (run_dir / "status.json").write_text(json.dumps({**status, "config_fingerprint": recorded}))
        code, err = fedbench_here(*args, *extra, tmp_path=tmp_path)
        assert code == 0 and "is already complete; skipped" in err, (recorded, extra, err)
    code, err = fedbench_here(*args, "lr=0.0123", tmp_path=tmp_path)
    assert code == 2 and "holds a run with a different config" in err, err
