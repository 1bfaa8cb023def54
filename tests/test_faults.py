"""Runs that never lose or corrupt a result (issue 19): each fault is made for real (subprocesses, real signals,
real files, the real wandb library offline) and the test checks what the user sees and what the run dir holds.
Faults that need no second process and no signal (a torn file, a full disk, a refused re-run, divergence) go through
the real ``fedbench`` entry point in the test's own process: the same code, without a Python + torch start each."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from wandb_files import read_run

from fedbench import checkpoint as ckpt
from fedbench.report.runs import load_run

FAST = ["rounds=3", "clients=4", "local_epochs=1", "logger=none", "hardware.threads=1"]
# ~0.2-1 s per round on digits: a run that is still going when the test acts on it
SLOW = ["rounds=60", "clients=6", "local_epochs=25", "logger=none", "hardware.threads=1", "checkpoint.every=0"]
FAKE_KEY = "fakekey0123456789abcdef0123456789abcdef01"
NO_WANDB_SERVER = {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": "http://127.0.0.1:9"}  # nothing listens there


def env(tmp_path, **extra) -> dict:
    e = {**os.environ, "WANDB_MODE": "offline", "FEDBENCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    e.pop("WANDB_API_KEY", None)
    return {**e, **extra}


def fedbench(*args, tmp_path, env_extra=None, check=True, timeout=600, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "fedbench.cli", *args],
        cwd=tmp_path,
        env=env(tmp_path, **(env_extra or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def fedbench_here(*args, tmp_path, fsize: int | None = None) -> tuple[int, str]:
    """``fedbench *args`` run by its real entry point in this process, from ``tmp_path``, with files limited to
    ``fsize`` bytes if given (a real RLIMIT_FSIZE: a full disk); returns (exit code, stderr)."""
    from hydra.core.global_hydra import GlobalHydra

    from fedbench import cli

    argv, cwd, cache = sys.argv, os.getcwd(), os.environ.get("FEDBENCH_CACHE")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    sys.argv = ["fedbench", *args]
    os.chdir(tmp_path)
    os.environ["FEDBENCH_CACHE"] = str(tmp_path / "cache")
    err, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stderr(err):
            if fsize is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, hard))
            try:
                cli.main()
            except SystemExit as e:
                code = e.code or 0
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        sys.argv = argv
        os.chdir(cwd)
        if cache is None:
            os.environ.pop("FEDBENCH_CACHE", None)
        else:
            os.environ["FEDBENCH_CACHE"] = cache
        GlobalHydra.instance().clear()
    return code, err.getvalue()


def start(*args, tmp_path, env_extra=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedbench.cli", *args],
        cwd=tmp_path,
        env=env(tmp_path, **(env_extra or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(cond, proc, timeout=600, poll=0.02):
    t0 = time.time()
    while not cond():
        assert proc.poll() is None, "the run ended before the test could act on it: " + proc.stderr.read()[-3000:]
        assert time.time() - t0 < timeout
        time.sleep(poll)


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def rows(run_dir: Path) -> list[dict]:
    f = run_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in f.read_text().splitlines()] if f.exists() else []  # every line must parse


def evaluated_rounds(run_dir: Path) -> list[int]:
    try:
        return [r["round"] for r in rows(run_dir) if "pers/acc" in r]
    except ValueError:  # a line being written right now
        return []


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("fedbench: ") and "Traceback" not in stderr
    return lines[0]


def snapshot(d: Path) -> dict:
    return {
        str(p.relative_to(d)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def done_run(tmp_path_factory):
    """A complete 3-round run with a checkpoint after every round (rounds 1 and 2; none after the last), kept after
    completion (checkpoint.keep_complete) so that a test can make the run look interrupted."""
    tmp = tmp_path_factory.mktemp("done")
    args = [*FAST, "checkpoint.every=1", "checkpoint.keep=5", "checkpoint.keep_complete=5"]
    code, err = fedbench_here(*args, f"hydra.run.dir={tmp / 'run'}", tmp_path=tmp)
    assert code == 0, err[-3000:]
    return args, tmp / "run", json.loads((tmp / "run" / "summary.json").read_text())


def copy_of(done_run, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(done_run[1], run_dir)
    return run_dir


# ---- 1. two runs in one run directory -----------------------------------------------------------------
def test_a_second_run_in_a_busy_run_dir_stops_at_once_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    first = start(*SLOW, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    try:
        wait_for(lambda: len(evaluated_rounds(run_dir)) >= 3, first)  # the first run is training
        running = status(run_dir)  # minor item: the status is current while the run goes
        assert running["status"] == "running" and running["round"] >= 1 and running["eta_s"] > 0 and running["eta"]
        second = fedbench(*SLOW, f"hydra.run.dir={run_dir}", tmp_path=tmp_path, check=False, timeout=300)
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=300)
    assert second.returncode != 0
    line = one_line(second.stderr)
    assert str(run_dir) in line and f"pid {first.pid}" in line and socket.gethostname() in line
    assert first.returncode == 128 + signal.SIGTERM and status(run_dir)["status"] == "preempted"
    r = evaluated_rounds(run_dir)
    assert r == list(range(len(r)))  # one writer: every round once, in order


# ---- 2. the status is true whatever fails ----------------------------------------------------------------
def test_a_signal_before_the_first_round_marks_the_run_preempted(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "rounds=2",
        "clients=4",
        "local_epochs=1",
        "logger=offline",
        "logger.console=false",
        "hardware.threads=1",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start(*args, tmp_path=tmp_path)
    wait_for(lambda: (run_dir / "status.json").exists(), proc, poll=0.002)  # setup / plot / W&B init under way
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "re-run the same command" in err and status(run_dir)["status"] == "preempted"


def test_a_failure_outside_the_rounds_marks_the_run_failed_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "partition.png").mkdir(parents=True)  # the partition picture cannot be written
    code, err = fedbench_here(*FAST, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 1
    line = one_line(err)
    assert "partition.png" in line and "Is a directory" in line
    st = status(run_dir)
    assert st["status"] == "failed" and "partition.png" in st["error"]
    assert not (run_dir / "summary.json").exists()


def test_a_signal_whose_exception_library_code_swallowed_still_stops_the_run(tmp_path):
    """A signal's exception raised inside library code with a broad ``except BaseException`` (a ``__del__``, a
    retry loop) is lost; the run must still stop as preempted, with the last finished round saved, not finish rc 0."""
    from conftest import make_cfg

    from fedbench.preemption import Preempted
    from fedbench.run import Run

    run_dir = tmp_path / "run"
    run = Run(make_cfg("rounds=3", "clients=4", "checkpoint.every=0", cache_dir=tmp_path / "cache"), run_dir)
    one_round = run._one_round

    def round_then_swallow(t):
        one_round(t)
        if t == 1:
            try:  # what such library code does when the signal lands in it
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except BaseException:
                pass

    run._one_round = round_then_swallow
    with pytest.raises(Preempted):
        run.execute()
    st = status(run_dir)
    assert st["status"] == "preempted" and st["round"] == 1 and "SIGINT" in st["error"]
    assert ckpt.load_latest(run_dir, "cpu")["round"] == 1 and not (run_dir / "summary.json").exists()


# ---- 3. W&B respects the environment, and its failures never fail or hang a run ---------------------------
def test_wandb_auto_honours_WANDB_MODE_and_a_wandb_crash_mid_run_does_not_stop_the_run(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "rounds=5",
        "clients=4",
        "local_epochs=15",
        "logger.console=false",
        "hardware.threads=1",
        f"hydra.run.dir={run_dir}",
    ]  # logger.wandb.mode=auto with an API key set, but WANDB_MODE=offline
    proc = start(*args, tmp_path=tmp_path, env_extra=NO_WANDB_SERVER)
    wait_for(lambda: len(evaluated_rounds(run_dir)) >= 2, proc, timeout=120)
    service = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert service, "no W&B service process"
    for pid in service:  # the W&B service dies mid-run
        os.kill(int(pid), signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    warnings = [ln for ln in err.splitlines() if "W&B" in ln]
    assert len(warnings) == 1 and "local logs" in warnings[0] and "Traceback" not in err
    st = status(run_dir)
    assert st["status"] == "complete" and st["wandb"].startswith("failed")
    assert evaluated_rounds(run_dir) == list(range(6))
    assert list(run_dir.glob("wandb/offline-run-*"))  # it ran offline (no online attempt) until the crash


@pytest.mark.parametrize(
    "given,mode",
    [
        ({"WANDB_DISABLED": "true"}, "disabled"),
        ({"WANDB_MODE": "disabled"}, "disabled"),
        ({"WANDB_MODE": "offline"}, "offline"),
        ({}, "online"),
    ],
)
def test_wandb_auto_follows_WANDB_DISABLED_and_WANDB_MODE_over_an_api_key(monkeypatch, given, mode):
    from fedbench.loggers import wandb_mode

    for k in ("WANDB_MODE", "WANDB_DISABLED"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    for k, v in given.items():
        monkeypatch.setenv(k, v)
    assert wandb_mode("auto") == mode


def test_wandb_unreachable_at_init_warns_once_and_the_run_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    t0 = time.time()
    p = fedbench(
        *FAST,
        "logger.wandb.mode=online",
        f"hydra.run.dir={run_dir}",
        tmp_path=tmp_path,
        check=False,
        env_extra={**NO_WANDB_SERVER, "WANDB_INIT_TIMEOUT": "3"},
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert time.time() - t0 < 100
    line = one_line(p.stderr)
    assert "W&B" in line and "local logs" in line
    st = status(run_dir)
    assert st["status"] == "complete" and st["wandb"].startswith("failed")
    assert evaluated_rounds(run_dir) == [0, 1, 2, 3]


# ---- 4. resume tolerates a torn write --------------------------------------------------------------------
def test_resume_after_a_torn_metrics_line_and_a_corrupt_status(tmp_path, done_run):
    args, _, summary = done_run
    run_dir = copy_of(done_run, tmp_path)
    (run_dir / "summary.json").unlink()
    (run_dir / "checkpoints" / "round_000002.pt").unlink()  # crashed in round 3 ... after checkpoint 1
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["round"] <= 2]
    torn = '{"round": 3, "pers/acc": 0.4'
    (run_dir / "metrics.jsonl").write_text("\n".join(kept) + "\n" + torn)  # ... while writing round 3's line
    (run_dir / "status.json").write_text('{"status": "running", "rou')  # and while rewriting its status
    code, err = fedbench_here(*args, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and "resuming" in err and "after round 1" in err, err[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["metrics"] == summary["metrics"]
    assert evaluated_rounds(run_dir) == [0, 1, 2, 3]
    assert status(run_dir)["status"] == "complete"
    copies = [f for f in run_dir.iterdir() if f.name.startswith("metrics.jsonl.")]
    assert len(copies) == 1 and copies[0].read_text().endswith(torn)  # the torn file is kept


def test_resume_after_a_torn_config_and_a_torn_status_trusts_the_checkpoint(tmp_path, done_run):
    """config.yaml cut by a crash can still parse (half a mapping is a mapping): the checkpoint's fingerprint, which
    its checksum vouches for, decides whether the run dir holds this config, not the torn file's."""
    args, _, summary = done_run
    run_dir = copy_of(done_run, tmp_path)
    (run_dir / "summary.json").unlink()  # crashed after checkpoint 2, while rewriting its config and status
    lines = (run_dir / "config.yaml").read_text().splitlines()
    (run_dir / "config.yaml").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    assert isinstance(yaml.safe_load((run_dir / "config.yaml").read_text()), dict)  # torn, yet YAML
    (run_dir / "status.json").write_text('{"status": "running", "conf')
    code, err = fedbench_here(*args, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and "after round 2" in err, err[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["metrics"] == summary["metrics"]
    whole = yaml.safe_load((done_run[1] / "config.yaml").read_text())
    assert yaml.safe_load((run_dir / "config.yaml").read_text()) == {**whole, "cache_dir": str(tmp_path / "cache")}


def test_a_complete_run_killed_before_it_tidied_up_is_finished_by_the_next_command(tmp_path, done_run):
    """kill -9 right after status.json said complete: its checkpoints not pruned, metrics.csv / curves.png not
    written, a temporary file of a cut write left; the same command (skipping the run) does what was left."""
    args, _, summary = done_run
    run_dir = copy_of(done_run, tmp_path)
    (run_dir / "metrics.csv").unlink()
    (run_dir / "curves.png").unlink()
    (run_dir / "checkpoints" / "round_000003.pt.tmp4242").write_bytes(b"cut")
    (run_dir / "summary.json.tmp4243").write_text("{")
    same = [a for a in args if not a.startswith("checkpoint.keep_complete=")]  # the default: keep none
    code, err = fedbench_here(*same, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and "already complete; skipped" in err, err[-3000:]
    assert not (run_dir / "checkpoints").exists()
    assert (run_dir / "metrics.csv").read_text().startswith("round,") and (run_dir / "curves.png").stat().st_size
    assert not [f for f in run_dir.rglob("*") if ".tmp" in f.name]
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert status(run_dir)["status"] == "complete"
    before = snapshot(run_dir)
    code, err = fedbench_here(*same, f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 0 and snapshot(run_dir) == before  # nothing left to do: nothing touched


# ---- 5. no duplicate rounds ------------------------------------------------------------------------------
def test_kill_9_before_the_first_checkpoint_then_rerun_logs_every_round_once(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "rounds=4",
        "clients=4",
        "local_epochs=20",
        "checkpoint.every=0",
        "logger=offline",
        "logger.console=false",
        "hardware.threads=1",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start(*args, tmp_path=tmp_path)
    wait_for(lambda: len(evaluated_rounds(run_dir)) >= 2, proc)
    proc.kill()
    proc.wait()
    assert not list(run_dir.glob("checkpoints/*.pt"))
    assert status(run_dir)["status"] == "running"  # the killed process's last word; a report reads it as lost:
    read = load_run(run_dir, 0, set())
    assert read.status == "lost" and f"pid {proc.pid}" in read.error and "resumes" in read.error, read.error
    p = fedbench(*args, tmp_path=tmp_path)
    assert evaluated_rounds(run_dir) == [0, 1, 2, 3, 4]
    assert [r["round"] for r in rows(run_dir) if "image/partition" in r] == [0]
    wb = read_run(run_dir)
    assert len(wb["ids"]) == 1  # one W&B run, resumed
    assert {h["_step"] for h in wb["history"] if "pers/acc" in h} == {0, 1, 2, 3, 4}
    assert "stale lock" in p.stderr and f"pid {proc.pid}" in p.stderr  # the dead run's lock was taken over


# ---- 6. disk full ----------------------------------------------------------------------------------------
def test_a_full_disk_fails_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, done_run):
    args, done_dir, summary = done_run
    s1, s2 = ((done_dir / "checkpoints" / f"round_00000{t}.pt").stat().st_size for t in (1, 2))
    assert s2 > s1  # round 2's checkpoint holds one more round of history
    limit = (s1 + s2) // 2  # a file may grow to this many bytes: checkpoint 1 fits, checkpoint 2 does not

    run_dir = tmp_path / "run"
    full = [*(a for a in args if not a.startswith("checkpoint.keep=")), "checkpoint.keep=1", f"hydra.run.dir={run_dir}"]
    code, err = fedbench_here(*full, tmp_path=tmp_path, fsize=limit)
    assert code == 1
    line = one_line(err)
    assert str(run_dir / "checkpoints") in line and "File too large" in line
    assert not [f for f in run_dir.rglob("*") if "tmp" in f.name]  # no stray temporary files
    assert ckpt.load_latest(run_dir, "cpu")["round"] == 1  # the last good checkpoint is intact
    assert evaluated_rounds(run_dir) == [0, 1, 2]
    assert status(run_dir)["status"] == "failed" and "File too large" in status(run_dir)["error"]
    code, err = fedbench_here(*full, tmp_path=tmp_path)  # space freed: the same command resumes
    assert code == 0 and "after round 1" in err, err[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["metrics"] == summary["metrics"]


def test_a_disk_that_fills_up_mid_run_ends_in_one_line_and_a_true_status(tmp_path):
    """A real full disk (a 2 MB tmpfs filled while the run is in round 3, W&B offline writing to it too): the error
    names the file, W&B's logger prints no traceback per record, and status.json still says ``failed`` (rewritten in
    its own blocks: there is no room for a temporary copy)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root); the other disk tests limit the file size instead")
    try:
        run_dir = disk / "run"
        args = ["rounds=60", "clients=6", "local_epochs=25", "logger=offline", "hardware.threads=1"]
        proc = start(
            *args, "checkpoint.every=5", "checkpoint.min_free_mb=0", f"hydra.run.dir={run_dir}", tmp_path=tmp_path
        )
        wait_for(lambda: 2 in evaluated_rounds(run_dir), proc)
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as f:
            while True:
                f.write(bytes(4096))
                f.flush()
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 1, err[-3000:]
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert "Traceback" not in err and "Logging error" not in err and len(lines) <= 2, err[-3000:]
        assert lines[-1].startswith(f"fedbench: cannot write {run_dir}/") and "No space left on device" in lines[-1]
        st = status(run_dir)
        assert st["status"] == "failed" and "No space left on device" in st["error"], st
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_a_checkpoint_past_the_file_size_limit_is_named_not_torchs_enforce_fail(tmp_path):
    """``ulimit -f``: torch.save into a file fails as "[enforce fail at inline_container.cc:672]", naming nothing;
    serialized in memory first, the write fails as an OSError naming the checkpoint, and no temporary file stays."""
    import torch

    from fedbench.errors import WriteFailed

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, hard))
    try:
        with pytest.raises(WriteFailed) as e:
            ckpt.save(tmp_path, 1, {"w": torch.zeros(100_000)})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(tmp_path / "checkpoints" / "round_000001.pt") in str(e.value) and "File too large" in str(e.value)
    assert not [f for f in tmp_path.rglob("*") if f.is_file()]


def test_a_picture_the_full_disk_cuts_is_named_with_its_path_and_removed(tmp_path):
    """matplotlib's own writes (partition.png, before the first round) fail without naming their file."""
    run_dir = tmp_path / "run"
    code, err = fedbench_here(*FAST, f"hydra.run.dir={run_dir}", tmp_path=tmp_path, fsize=10_000)  # .hydra/*.yaml fit
    assert code == 1
    line = one_line(err)
    assert str(run_dir / "partition.png") in line and "File too large" in line
    assert not (run_dir / "partition.png").exists() and not [f for f in run_dir.rglob("*") if "tmp" in f.name]
    st = status(run_dir)
    assert st["status"] == "failed" and str(run_dir / "partition.png") in st["error"]


# ---- 7. a refused re-run does not touch a complete run -----------------------------------------------------
def test_re_running_a_complete_run_changes_nothing_in_its_dir(tmp_path, done_run):
    args = done_run[0]
    run_dir = copy_of(done_run, tmp_path)
    before = snapshot(run_dir)  # (a skipped re-run: tests/test_resume.py)
    code, err = fedbench_here(*args, "lr=0.2", f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 2 and "different config" in one_line(err) and "resume=True" in err
    assert snapshot(run_dir) == before
    assert sorted(p.name for p in run_dir.iterdir()) == sorted({k.split("/")[0] for k in before})


# ---- 8. divergence ---------------------------------------------------------------------------------------
def test_a_diverging_run_stops_as_diverged_naming_round_clients_metric_and_what_to_try(tmp_path):
    run_dir = tmp_path / "run"
    code, err = fedbench_here(*FAST, "lr=1e6", f"hydra.run.dir={run_dir}", tmp_path=tmp_path)
    assert code == 1
    line = one_line(err)
    assert "diverged in round 1" in line and "client(s) [" in line and "loss" in line
    assert str(run_dir) in line and "lr" in line and "divergence.factor" in line
    st = status(run_dir)
    assert st["status"] == "diverged" and st["round"] == 0 and "round 1" in st["error"]
    assert not (run_dir / "summary.json").exists()


def test_the_divergence_guard_stops_above_factor_times_the_first_rounds_mean_loss(tmp_path):
    """Reference = ln(#classes) in round 1, then max(round 1's mean loss, ln(#classes)); non-finite always stops."""
    from types import SimpleNamespace

    import torch
    from conftest import make_cfg

    from fedbench.errors import Diverged
    from fedbench.run import Run

    run = Run(make_cfg("divergence.factor=2"), tmp_path)
    run.data = SimpleNamespace(num_classes=10)  # the uniform guess's loss ln 10 = 2.303: threshold 4.605 in round 1
    res = lambda *loss, w=(0.0, 0.0): SimpleNamespace(loss=torch.tensor(loss), params={"w": torch.tensor(w)[:, None]})  # noqa: E731
    with pytest.raises(
        Diverged, match=r"round 1: training loss 4.7 above divergence.factor=2 x the reference 2.3 on client\(s\) \[7\]"
    ):
        run.check_finite(1, [3, 7], res(1.0, 4.7))
    run.check_finite(1, [3, 7], res(1.0, 4.0))  # passes; the reference becomes the mean 2.5 (> 2.303)
    assert run.check_finite.reference == pytest.approx(2.5)
    run.check_finite(2, [3, 7], res(4.9, 1.0))  # < 2 x 2.5 (but > 2 x 2.303)
    with pytest.raises(Diverged, match=r"round 3: .* on client\(s\) \[3\]"):
        run.check_finite(3, [3, 7], res(5.1, 1.0))
    with pytest.raises(Diverged, match=r"non-finite loss or parameters on client\(s\) \[7\]"):
        run.check_finite(4, [3, 7], res(1.0, 1.0, w=(0.0, float("nan"))))
    run.cfg.divergence.factor = None  # null: only non-finite values stop a run
    run.check_finite(5, [3, 7], res(1e30, 1.0))
    # one value among many (each client's row is checked through its sum: inf and -inf sum to nan, still caught)
    big = lambda *rows: SimpleNamespace(loss=torch.ones(len(rows)), params={"w": torch.tensor(rows)})  # noqa: E731
    run.check_finite(6, [3, 7], big([3e37, 3e37, -1.0], [1e30, -1e30, 2.0]))  # large but finite: goes on
    with pytest.raises(Diverged, match=r"non-finite loss or parameters on client\(s\) \[3\]"):
        run.check_finite(7, [3, 7], big([1.0, float("inf"), float("-inf")], [0.5, 0.25, 2.0]))
    with pytest.raises(Diverged, match=r"non-finite loss or parameters on client\(s\) \[7\]"):
        run.check_finite(8, [3, 7], big([1.0, 2.0, 3.0], [0.5, float("-inf"), 2.0]))


# ---- 9. sweeps -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("launcher", ["basic", "parallel"])
def test_a_sweep_goes_on_past_failed_jobs_and_ends_with_one_summary_line(tmp_path, launcher):
    sweep = tmp_path / "sweep"
    job = lambda lr: f"clients=4,local_epochs=1,lr={lr},rounds=3"  # noqa: E731  (Hydra's job dirs)
    (sweep / job("0.1") / "partition.png").mkdir(parents=True)  # this job fails writing its picture
    extra = ["hydra/launcher=parallel", "hydra.launcher.n_jobs=2"] if launcher == "parallel" else []
    p = fedbench("-m", *extra, "lr=0.05,0.1,1e6", *FAST, f"hydra.sweep.dir={sweep}", tmp_path=tmp_path, check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    last = [ln for ln in p.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith("fedbench: 2 of 3 runs failed")
    jobs = {d.name: status(d) for d in sweep.iterdir() if d.is_dir()}
    assert {n: s["status"] for n, s in jobs.items()} == {
        job("0.05"): "complete",
        job("0.1"): "failed",
        job("1000000.0"): "diverged",
    }
    for name, s in jobs.items():
        if s["status"] != "complete":
            assert name in last and s["error"]


def test_a_parallel_sweep_whose_worker_is_killed_says_so_in_one_line_and_no_status_stays_running(tmp_path):
    """kill -9 of one joblib worker (as the out-of-memory killer does): joblib stops the pool, the sibling job with
    it. The sweep says so in one line (no joblib traceback) with its summary line; the two status.json files still
    say ``running`` (their processes were killed) and every reader takes them as lost; the same command resumes."""
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "seed=0,1", *SLOW, f"hydra.sweep.dir={sweep}"]
    proc = start(*args, tmp_path=tmp_path)
    dirs = lambda: [d for d in sweep.iterdir() if d.is_dir() and d.name != ".hydra"] if sweep.exists() else []  # noqa: E731
    wait_for(lambda: len(dirs()) == 2 and all(evaluated_rounds(d)[-1:] >= [1] for d in dirs()), proc)
    victim = status(dirs()[0])["pid"]
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert "a worker process of hydra/launcher=parallel died" in err and "resumes them" in err, err[-3000:]
    for d in dirs():
        read = load_run(d, 0, set())
        assert read.status in ("lost", "preempted") and read.status != "running", (d, read.status)
    assert any(
        load_run(d, 0, set()).status == "lost" and f"pid {victim}" in load_run(d, 0, set()).error for d in dirs()
    )


def test_a_diagnostic_the_full_disk_cuts_is_named_with_its_path_and_removed(tmp_path):
    """Files written during the rounds by NumPy or matplotlib (an algorithm's per-round matrix and its heatmap) fail on
    a full disk naming the file — a failed write() names none — and the cut file is removed."""
    import numpy as np
    from conftest import make_cfg

    from fedbench.errors import WriteFailed
    from fedbench.run import Run

    run = Run(make_cfg(*FAST), tmp_path / "run")
    run.setup()
    d = tmp_path / "run" / "diagnostics" / "probe"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    cases = [
        (np.arange(8000.0).reshape(80, 100), d / "round_00001.npy"),  # 64 kB of .npy: cut
        (np.eye(3), d / "round_00002.png"),
    ]  # the .npy fits, its heatmap does not
    for t, (matrix, cut) in enumerate(cases, start=1):
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
        try:
            with pytest.raises(WriteFailed) as e:
                run.algorithm.publish_matrix("probe", t, matrix)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        assert str(e.value).startswith(f"cannot write {cut}: ")  # (NumPy says "N requested and M written")
        assert not cut.exists()
    assert (d / "round_00002.npy").exists()
