"""What a run and a sweep print when their output is redirected (nohup, SLURM, CI), the run's run.log, and the
per-round metrics.csv and curves.png (issue 20, items 3, 4 and 7). Real subprocesses whose stdout is a pipe."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import make_cfg, run_cfg

CLI = [sys.executable, "-m", "fedbench.cli"]


def env(tmp_path: Path) -> dict:
    """Python's default buffering (a block-buffered pipe, as under nohup, SLURM or CI): a line shows only if flushed."""
    return {
        **{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
        "WANDB_MODE": "offline",
        "FEDBENCH_CACHE": str(tmp_path / "cache"),
    }


def csv_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def seconds(shown: str) -> float:
    """``12.3s`` or ``h:mm:ss`` as seconds."""
    if shown.endswith("s"):
        return float(shown[:-1])
    h, m, s = shown.split(":")
    return int(h) * 3600 + int(m) * 60 + int(s)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_redirected_run_prints_each_evaluated_round_at_once_and_logs_it_in_run_log(tmp_path):
    """stdout is a pipe: the header, then one plain line per evaluated round, each readable while the run goes on
    (the process is killed after round 4's line: a buffered line would arrive only when the buffer fills or at exit)."""
    run_dir = tmp_path / "a-long-run-dir-name-so-the-lines-are-wider-than-eighty-columns" / "run"
    p = subprocess.Popen(
        [
            *CLI,
            "rounds=1000",
            "clients=3",
            "local_epochs=1",
            "eval_every=2",
            "logger=none",
            "logger.console=true",
            "hardware=cpu",
            "hardware.threads=1",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen, alive = [], False
    try:
        for line in p.stdout:
            seen.append(line.rstrip("\n"))
            if line.startswith("round 4/"):  # read at once: the run is not far past round 4 (a pipe's 8 KiB buffer
                status = json.loads((run_dir / "status.json").read_text())  # would first fill at round ~190)
                alive = p.poll() is None and status["status"] == "running" and status["round"] < 100
                break
    finally:
        p.kill()
        p.communicate(timeout=60)
    assert seen and alive, (seen, p.stderr)
    assert seen[0] == f"fedbench: run dir {run_dir}" and len(seen[0]) > 80  # whole, not cut to 80 columns
    assert seen[1] == "fedbench: fedavg on digits, partition dirichlet, model mlp, seed 0, 1000 rounds, 3 clients"
    assert seen[2] == "fedbench: device cpu, executor sequential, precision fp32"
    rounds = [ln for ln in seen if ln.startswith("round ")]
    assert [ln.split()[1] for ln in rounds] == ["0/1000", "2/1000", "4/1000"]  # evaluated rounds only (eval_every=2)
    metrics = {r["round"]: r for r in jsonl(run_dir / "metrics.jsonl") if "pers/acc" in r}
    for ln in rounds:  # the round's own numbers, elapsed and ETA
        words = ln.split()
        t = int(words[1].split("/")[0])
        assert words[words.index("pers/acc") + 1] == f"{metrics[t]['pers/acc']:.4f}"
        assert words[words.index("global/acc") + 1] == f"{metrics[t]['global/acc']:.4f}"
        assert ("train/loss" in words) == (t > 0) and "elapsed" in words and "eta" in words
    assert rounds[0].endswith("eta -") and not rounds[2].endswith("eta -")
    log = (run_dir / "run.log").read_text().splitlines()
    assert log[: len(seen)] == seen  # run.log holds the same lines, written as they were printed


@pytest.mark.parametrize("start_round", [0, 2])
def test_a_round_line_eta_is_the_pace_of_this_session_times_the_rounds_left(tmp_path, capsys, start_round):
    """10 rounds, 100 s since the header, round 4 done: 100 s / (4 - start) rounds x 6 rounds left (a resumed run counts
    its own rounds only)."""
    from fedbench.console import ConsoleSink

    sink = ConsoleSink(make_cfg("rounds=10", "logger.console=true"), tmp_path, "t", start_round=start_round)
    sink.header("fedbench: header")
    sink.t0 -= 100
    sink.log(4, {"pers/acc": 0.5, "train/loss": 1.25})
    sink.log(5, {"train/loss": 1.0})  # not evaluated: no line
    sink.finish("failed")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "fedbench: header" and len(out) == 2 and (tmp_path / "run.log").read_text().splitlines() == out
    words = out[1].split()
    assert words[:6] == ["round", "4/10", "pers/acc", "0.5000", "train/loss", "1.2500"]
    elapsed, eta = seconds(words[words.index("elapsed") + 1]), seconds(words[words.index("eta") + 1])
    assert abs(elapsed - 100) < 2 and abs(eta - elapsed / (4 - start_round) * 6) <= 1, out[1]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One cheap sweep, redirected: 2 jobs of the smoke experiment at 1 round, the second one diverging."""
    tmp = tmp_path_factory.mktemp("sweep")
    d = tmp / "sweep"
    p = subprocess.run(
        [
            *CLI,
            "-m",
            "+experiment=smoke",
            "rounds=1",
            "clients=3",
            "algorithm=fedavg",
            "seed=0",
            "lr=0.05,1e6",
            "logger.console=true",
            "hardware=cpu",
            "hardware.threads=1",
            f"hydra.sweep.dir={d}",
        ],
        cwd=tmp,
        env=env(tmp),
        capture_output=True,
        text=True,
        timeout=600,
    )
    jobs = {json.loads(ln)["job"]: json.loads(ln) for ln in (d / "jobs.jsonl").read_text().splitlines()}
    return d, p, jobs


def test_sweep_prints_its_dir_first_then_job_k_of_n_with_an_eta(sweep):
    d, p, jobs = sweep
    out = p.stdout.splitlines()
    assert out[0] == f"fedbench: sweep {d}: 2 jobs", p.stdout[:2000]
    starts = [ln for ln in out if ln.startswith("fedbench: job ")]
    assert [ln.split()[2] for ln in starts] == ["1/2", "2/2"]
    assert "lr=0.05" in starts[0] and "lr=1000000.0" in starts[1]
    assert "eta" not in starts[0] and ", eta " in starts[1]  # an ETA once a job has finished


def test_the_sweep_eta_is_the_mean_time_of_the_finished_jobs_times_the_jobs_left(tmp_path):
    from fedbench.sweep import job_line

    launch = f"1-{time.time_ns() - 600 * 10**9}"  # launched 10 minutes ago
    with open(tmp_path / "jobs.jsonl", "w") as f:  # 2 jobs of this launch done (and one of another launch)
        for job, who in ((0, launch), (1, launch), (0, "2-0")):
            f.write(
                json.dumps({"launch": who, "job": job, "dir": str(tmp_path / str(job)), "status": "complete"}) + "\n"
            )
    line = job_line(tmp_path, launch, 2, 6, ["seed=2"])
    assert line.startswith("fedbench: job 3/6 (seed=2); sweep 0:10:0")
    so_far, eta = line.split("sweep ")[1].split(" so far, eta ")
    assert abs(seconds(eta) - 2 * seconds(so_far)) <= 2, line  # 600 s / 2 jobs * 4 jobs left


def test_each_job_has_its_header_rounds_and_end_lines_also_in_its_run_log(sweep):
    d, p, jobs = sweep
    out = p.stdout.splitlines()
    for job in (jobs[0],):
        run_dir = Path(job["dir"])
        cfg = (run_dir / "config.yaml").read_text()
        summary = json.loads((run_dir / "summary.json").read_text())
        log = (run_dir / "run.log").read_text().splitlines()
        assert log[0] == f"fedbench: run dir {run_dir}" and log[-1] == log[0]
        assert "seed 0, 1 round, 3 clients" in log[1] and "lr: 1000000.0" not in cfg
        best = summary["metrics"]["pers/acc"]
        assert log[-2].startswith("fedbench: complete, 1 round in ")
        assert (
            f"pers/acc best {best['best']:.4f} (round {best['best_round']}), last {best['last']:.4f}, "
            f"final {best['final']:.4f} (mean of the last 1 evaluation after round 0, eval.final_window)"
        ) in log[-2]
        # issue 36.8: the final window (5) leaves out round 0, the untrained model: one round → final = last
        assert best["final"] == best["last"] and best["final_n"] == 1
        assert [ln.split()[1] for ln in log if ln.startswith("round ")] == ["0/1", "1/1"]
        i = out.index(log[0])
        assert out[i : i + len(log)] == log  # the same lines on stdout, in one block


def test_sweep_ends_with_a_table_of_its_jobs_and_the_report_command(sweep):
    d, p, jobs = sweep
    out = p.stdout.splitlines()
    assert out[-1] == f"fedbench-report {d}"
    start = out.index(f"fedbench: sweep {d}: 1 of 2 jobs complete")
    header, *rows = out[start + 1 : -1]
    assert header.split() == ["job", "overrides", "status", "pers/acc", "best", "final", "time"]
    assert len(rows) == 2
    for row, job in zip(rows, (jobs[0], jobs[1])):
        words = row.split()
        lr = next(o for o in job["overrides"] if o.startswith("lr="))
        assert words[:3] == [str(job["job"] + 1), lr, job["status"]]  # only the override that varies
        if job["status"] == "complete":
            s = json.loads((Path(job["dir"]) / "summary.json").read_text())["metrics"]["pers/acc"]
            assert words[3:5] == [f"{s['best']:.4f}", f"{s['final']:.4f}"]
        else:
            assert words[3:5] == ["-", "-"]
        assert words[5] != "-"
    assert jobs[1]["status"] == "diverged" and p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].startswith("fedbench: 1 of 2 runs failed (1 diverged)")


def test_every_run_dir_gets_metrics_csv_and_curves_png(sweep):
    d, p, jobs = sweep
    for job in jobs.values():  # the diverged run too (its rounds so far)
        run_dir = Path(job["dir"])
        assert (run_dir / "curves.png").stat().st_size > 0
        rows = csv_rows(run_dir / "metrics.csv")
        logged = [r for r in jsonl(run_dir / "metrics.jsonl") if "pers/acc" in r]
        assert [int(r["round"]) for r in rows] == [r["round"] for r in logged]  # each evaluated round once
        for r, m in zip(rows, logged):
            assert float(r["pers/acc"]) == m["pers/acc"]
            assert "global/class_acc" not in r  # lists are left to metrics.jsonl


def test_the_curves_have_whole_rounds_on_the_x_axis_and_are_at_least_1000_px_wide(sweep):
    from fedbench.console import curves_figure, read_rounds

    d, p, jobs = sweep
    run_dir = Path(jobs[0]["dir"])
    with open(run_dir / "curves.png", "rb") as f:
        width = int.from_bytes(f.read(24)[16:20], "big")  # the PNG header's width
    assert width >= 1000
    fig = curves_figure(read_rounds(run_dir / "metrics.jsonl"))
    for ax in fig.axes:
        shown = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert shown and all(float(t).is_integer() for t in shown), shown
    assert [line.get_label() for line in fig.axes[0].lines] == ["personalized (pers/acc)", "global model (global/acc)"]
    # issue 36 (plots): accuracy in % as in the reports, the run named in the title
    from fedbench.console import run_title

    rows = read_rounds(run_dir / "metrics.jsonl")
    fig = curves_figure(rows, run_title(run_dir))
    assert fig.axes[0].get_ylabel() == "accuracy (%)"
    assert list(fig.axes[0].lines[0].get_ydata()) == pytest.approx([100 * r["pers/acc"] for r in rows])
    assert fig._suptitle.get_text() == f"fedavg on digits, seed 0 ({run_dir.name})"


def test_metrics_csv_after_a_resume_has_each_round_once_as_metrics_jsonl(tmp_path):
    """A run that failed at its end (its summary could not be written) after round 3, whose later kill had also logged
    a different round 3: the resumed run redoes round 3 from the round-2 checkpoint; the CSV written at its end holds
    rounds 0..3 once each, with the values of metrics.jsonl (the redone round 3)."""
    from fedbench.errors import WriteFailed

    run_dir = tmp_path / "run"
    cfg = make_cfg("rounds=3", "clients=3", "checkpoint.every=1", "checkpoint.keep=5")
    (run_dir / "summary.json").mkdir(parents=True)  # a directory in the way: the summary cannot be written
    with pytest.raises(WriteFailed):
        run_cfg(cfg, run_dir)
    (run_dir / "summary.json").rmdir()
    (run_dir / "metrics.csv").unlink()  # as if killed before its end
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"round": 3, "pers/acc": 0.123, "train/loss": 9.0}) + "\n")
    run_cfg(cfg, run_dir)
    rows = csv_rows(run_dir / "metrics.csv")
    logged = [r for r in jsonl(run_dir / "metrics.jsonl") if "pers/acc" in r]
    assert [int(r["round"]) for r in rows] == [0, 1, 2, 3] == [r["round"] for r in logged]
    assert [float(r["pers/acc"]) for r in rows] == [r["pers/acc"] for r in logged]
    assert float(rows[3]["pers/acc"]) != 0.123 and float(rows[3]["train/loss"]) != 9.0
    assert "fedbench: resumed after round 2" in (run_dir / "run.log").read_text()


def test_a_single_run_under_a_stale_sweep_environment_is_not_a_sweep(tmp_path):
    """A run started with the variables a sweep sets for its jobs still in its environment (a test process or a shell
    that ran a sweep in-process) is one run: a failure prints its one line, not the sweep's "stopped early" line and
    table; and an in-process sweep removes those variables when it ends."""
    stale = {**env(tmp_path), "FEDBENCH_LAUNCH": "1-0", "FEDBENCH_SWEEP_JOBS": "4", "FEDBENCH_SWEPT": "seed"}
    p = subprocess.run(
        [
            *CLI,
            "rounds=1",
            "clients=3",
            "lr=1e6",
            "hardware=cpu",
            "hardware.threads=1",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=stale,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "diverged in round 1" in lines[0], p.stderr[-2000:]
    assert "sweep" not in p.stdout.lower()

    from omegaconf import OmegaConf

    from fedbench.sweep import SweepSummary

    cfg = OmegaConf.create(
        {
            "hydra": {
                "sweep": {"dir": str(tmp_path / "sw")},
                "sweeper": {},
                "overrides": {"task": []},
                "job": {"name": "x"},
            },
            "logger": {"wandb": {"mode": "disabled"}},
        }
    )
    (tmp_path / "sw").mkdir()
    os.environ.update({"FEDBENCH_LAUNCH": "2-0", "FEDBENCH_SWEEP_JOBS": "1", "FEDBENCH_SWEPT": "seed"})
    try:
        SweepSummary().on_multirun_end(cfg)
    finally:
        left = {
            k: os.environ.pop(k)
            for k in ("FEDBENCH_LAUNCH", "FEDBENCH_SWEEP_JOBS", "FEDBENCH_SWEPT")
            if k in os.environ
        }
    assert left == {}


def test_a_sweep_stopped_by_ctrl_c_counts_the_jobs_that_never_started(tmp_path):
    """Issue 36.9: Ctrl-C in job 1 of 3 — the end table counts all 3 jobs and says 2 never started, the summary line
    says how to run them; the stopped job is ``preempted``, not lost."""
    import signal

    d = tmp_path / "sweep"
    p = subprocess.Popen(
        [*CLI, "-m", "seed=0,1,2", "rounds=100000", "clients=3", "logger=none", "hardware.threads=1"]
        + [f"hydra.sweep.dir={d}"],
        cwd=tmp_path,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:  # until job 1 has finished a round (its signal guard is in place)
        states = [json.loads(s.read_text() or "{}") for s in d.glob("*/status.json")] if d.exists() else []
        if any(st.get("round", 0) >= 1 for st in states):
            break
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode != 0
    assert "fedbench: sweep " + str(d) + ": 0 of 3 jobs complete, 2 not started" in out.splitlines()
    # issue #53: a stopped run is no failure, and its job number is read from its run dir (it was "?")
    last = err.strip().splitlines()[-1]
    stopped = next(x.name for x in d.iterdir() if x.name.endswith("seed=0"))
    assert last.startswith(f"fedbench: 1 of 3 runs stopped by a signal ({stopped}): the same command resumes it; ")
    assert "failed" not in last and "2 jobs never started: the same command runs them" in last
    [row] = [ln for ln in out.splitlines() if "preempted" in ln]
    assert row.split()[:2] == ["1", "seed=0"]


def test_quote_dirs_quotes_a_dir_value_hydra_would_parse_as_syntax():
    from fedbench.cli import quote_dirs

    assert quote_dirs(["hydra.sweep.dir=outputs/multirun/seed=0,1", "seed=0,1,2", "hydra.run.dir=a b"]) == [
        "hydra.sweep.dir='outputs/multirun/seed=0,1'",
        "seed=0,1,2",  # a sweep, not a dir
        "hydra.run.dir='a b'",
    ]
    assert quote_dirs(["hydra.sweep.dir=it's=1", "hydra.sweep.dir='x=1'", "hydra.run.dir=plain/dir"]) == [
        'hydra.sweep.dir="it\'s=1"',
        "hydra.sweep.dir='x=1'",
        "hydra.run.dir=plain/dir",
    ]


def test_a_method_added_to_a_sweep_dir_as_printed_skips_the_done_jobs_and_shows_their_own_time(tmp_path):
    """Issue 36.7: the auto sweep dir fedbench printed (``outputs/multirun/seed=0,...``) is given back unquoted with
    one more job: it parses, the complete job is skipped and its row shows the time that run took, not the skip's."""
    first = subprocess.run(
        [*CLI, "-m", "seed=0", "rounds=1", "clients=3", "logger=none", "hardware.threads=1"],
        cwd=tmp_path,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    d = first.stdout.splitlines()[-1].removeprefix("fedbench-report ")
    assert "=" in d and (tmp_path / d).is_dir()
    again = subprocess.run(
        [*CLI, "-m", "seed=0,1", "rounds=1", "clients=3", "logger=none", "hardware.threads=1", f"hydra.sweep.dir={d}"],
        cwd=tmp_path,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr
    rows = [json.loads(ln) for ln in (tmp_path / d / "jobs.jsonl").read_text().splitlines()]
    skipped = rows[-2] if rows[-2]["job"] == 0 else rows[-1]
    wall = json.loads((Path(skipped["dir"]) / "summary.json").read_text())["wall_time"]
    assert skipped["skipped"] and skipped["seconds"] == wall
    assert any(ln.startswith("1 ") and "complete (earlier run)" in ln for ln in again.stdout.splitlines())


def test_the_first_steps_estimate_ignores_local_training_outside_round_1(tmp_path, monkeypatch):
    """FedAvg-FT fine-tunes every client to evaluate round 0 (before round 1 starts): that training is not round 1's,
    and must neither break the run nor count in its estimate."""
    from fedbench.callbacks import FirstSteps

    monkeypatch.setattr(FirstSteps, "AFTER_S", 0.0)
    s = run_cfg(make_cfg("algorithm=fedavg_ft", "rounds=2"), tmp_path / "run")
    assert s["status"] == "complete"
    [line] = [ln for ln in (tmp_path / "run" / "run.log").read_text().splitlines() if "local client-steps" in ln]
    assert line.startswith("fedbench: 1 of round 1's ")


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_round_1_says_its_estimate_from_its_first_local_steps(tmp_path, monkeypatch, executor):
    """Once round 1's local training has run FirstSteps.AFTER_S seconds (0 here: at its first step), one line: the
    client-steps done of those planned (all 5 clients: E x ceil(n_i / B) steps each, n_i from partition_counts.csv),
    and the time per round and for the run. Said once, in round 1 only."""
    import math

    from fedbench.callbacks import FirstSteps

    monkeypatch.setattr(FirstSteps, "AFTER_S", 0.0)
    cfg = make_cfg("local_epochs=2", "batch_size=16", "drop_last=false", f"hardware.executor={executor}")
    run_cfg(cfg, tmp_path / "run")  # logger=none: the console is off, run.log keeps what it would have said
    lines = [ln for ln in (tmp_path / "run" / "run.log").read_text().splitlines() if "local client-steps" in ln]
    counts = np.loadtxt(tmp_path / "run" / "partition_counts.csv", delimiter=",", skiprows=1)
    planned = sum(2 * math.ceil(n / 16) for n in counts.sum(1))
    done = 1 if executor == "sequential" else 5  # one step of one client, or step 1 of every client at once
    assert len(lines) == 1 and lines[0].startswith(f"fedbench: {done} of round 1's {planned} local client-steps in ")
    assert "per round" in lines[0] and "for 3 rounds" in lines[0]


def test_bf16_without_bf16_hardware_says_so_in_the_header(tmp_path):
    """`hardware.precision=bf16` on a CPU whose flags have neither AMX nor AVX512-BF16 (oneDNN emulates bf16: slower
    than fp32, issue #32): the header says it; with either flag, or in fp32, it does not. The flags are read from
    /proc/cpuinfo (hand-written ones here; the run's header follows this machine's own)."""
    import torch

    from fedbench.engine.numerics import bf16_hardware

    cpu = torch.device("cpu")
    assert bf16_hardware(cpu, "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_vnni\n") is False
    assert bf16_hardware(cpu, "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n") is True
    assert bf16_hardware(cpu, "flags\t\t: fpu avx512_bf16\n") is True
    assert bf16_hardware(cpu, "processor\t: 0\n") is None  # no flags line: cannot tell, say nothing
    for precision in ("bf16", "fp32"):
        run_cfg(make_cfg("rounds=1", f"hardware.precision={precision}"), tmp_path / precision)
        header = (tmp_path / precision / "run.log").read_text().splitlines()[2]
        said = "no bf16 hardware on this CPU (AMX, AVX512-BF16): bf16 autocast is slower than fp32 here" in header
        assert said == (precision == "bf16" and bf16_hardware(cpu) is False), header
        assert header.startswith(f"fedbench: device cpu, executor sequential, precision {precision}"), header


def test_a_one_round_run_says_its_first_steps_estimate_for_its_one_round(tmp_path, monkeypatch):
    """Issue #53 item 10: the estimate said "0:03:48 for 1 rounds" (the same time twice, a plural for one)."""
    from fedbench.callbacks import FirstSteps

    monkeypatch.setattr(FirstSteps, "AFTER_S", 0.0)
    run_cfg(make_cfg("rounds=1", "local_epochs=2"), tmp_path / "run")
    [line] = [ln for ln in (tmp_path / "run" / "run.log").read_text().splitlines() if "local client-steps" in ln]
    assert re.search(r" local client-steps in \d+ s: about [\d.:s]+ for its one round \(local training only", line), (
        line
    )


def test_the_header_names_the_model_given_says_w_and_b_is_offline_and_a_resume_once(tmp_path):
    """Issue #53 item 10: `model=tiny_cnn` was shown as "model cnn" (its builder); an offline W&B run did not say so
    (W&B's own line is silenced) nor how to upload it; a resumed run on the console said "resumed after round 1" and
    "resuming <dir> after round 1" (stderr): once now."""
    d = tmp_path / "run"
    args = [*CLI, "model=tiny_cnn", "rounds=2", "clients=3", "checkpoint.every=1", "checkpoint.keep_complete=2"]
    args += ["logger.wandb.mode=offline", "logger.pictures=false", "hardware.threads=1", f"hydra.run.dir={d}"]
    first = subprocess.run(args, cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    log = (d / "run.log").read_text().splitlines()
    assert ", model tiny_cnn, seed 0," in log[1]
    [offline] = [ln for ln in log if "W&B" in ln]
    [synced] = list((d / "wandb").glob("offline-run-*"))
    assert (
        offline
        == f"fedbench: W&B offline (logger.wandb.mode=offline); upload this run later with `wandb sync {synced}`"
    )
    assert offline in first.stdout.splitlines()
    # the run crashed in round 2: its round-1 checkpoint is on disk (as tests/test_resume.py makes it)
    fp = json.loads((d / "status.json").read_text())["config_fingerprint"]
    (d / "summary.json").unlink()
    (d / "status.json").write_text(json.dumps({"status": "running", "round": 1, "config_fingerprint": fp}))
    again = subprocess.run(args, cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    said = [ln for ln in (again.stdout + again.stderr).splitlines() if "resum" in ln and "round 1" in ln]
    assert said == ["fedbench: resumed after round 1"]
