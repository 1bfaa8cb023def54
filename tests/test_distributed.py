"""One run over several processes (issue 33; fedbench/distributed.py): real ``torchrun`` on the CPU (gloo), the real
``fedbench`` command. 1, 2 and 3 processes give the same metrics for FedAvg, SCAFFOLD, Ditto, FedBN and FedReMa; a run
with persistent optimizer state whose rank 1 is killed mid-run stops with a true status.json and, resumed by ONE
process, ends with the uninterrupted run's metrics."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedbench.distributed import first_host, launched, shares

# digits, a BatchNorm CNN (FedBN keeps its BN layers local), 6 of 8 clients per round: every rank trains several
# clients of unequal sizes, so the rank order of the gathered rows differs from the clients' order
SMALL = [
    "rounds=2",
    "clients=8",
    "participation=0.75",
    "local_epochs=1",
    "model=tiny_cnn",
    "logger=none",
    "logger.pictures=false",
    "hardware=cpu",
    "hardware.threads=1",
    "checkpoint.final_model=false",
]
ALGORITHMS = "fedavg,scaffold,ditto,fedbn,fedrema"
# ~0.1-0.3 s per round: rank 1 is killed while the run goes on; persistent momentum (per-client optimizer state); the
# vectorized executor in fp64 (its rows trained in different stacks with 2 processes than with 1)
LONG = [
    "rounds=24",
    "clients=6",
    "local_epochs=8",
    "logger=none",
    "logger.pictures=false",
    "hardware=cpu",
    "hardware.threads=1",
    "optim.persistent_state=true",
    "checkpoint.every=1",
    "checkpoint.final_model=false",
    "hardware.executor=vectorized",
    "hardware.precision=fp64",
]


def _env(tmp_path) -> dict:
    (tmp_path / "tmp").mkdir(exist_ok=True)  # the processes' TMPDIR: the followers' private dirs go there
    e = {**os.environ, "WANDB_MODE": "disabled", "FEDBENCH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    e["TMPDIR"] = str(tmp_path / "tmp")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        e.pop(k, None)
    return e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fedbench(nproc: int, args: list[str]) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "fedbench", *args]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        "-m",
        "fedbench",
        *args,
    ]


def _metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl less the wall-clock times and the pictures' paths (everything a run computes)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "image/"))} for r in rows]


def test_shares_balance_local_steps_and_keep_job_order():
    # hand-run: by steps 8 (row 5), 5 (0), 3 (2), 3 (3), 2 (4), 1 (1); each to the rank with the fewest so far
    assert shares([5, 1, 3, 3, 2, 8], 2) == [[3, 5], [0, 1, 2, 4]]  # loads 11 / 11
    assert shares([5, 1, 3, 3, 2, 8], 3) == [[5], [0, 4], [1, 2, 3]]  # loads 8 / 7 / 7
    assert shares([0, 0, 4], 3) == [[2], [0], [1]]  # a client with no step still counts
    assert shares([2, 7], 4) == [[1], [0], [], []]  # more ranks than clients: some train nothing


def test_launched_reads_torchrun_and_srun_but_not_a_batch_script():
    assert launched({"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1"}) == (1, 3, 1)
    assert launched({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1"}) == (5, 8, 1)
    # sbatch's batch script has SLURM_PROCID and SLURM_NTASKS but is one process: no group to wait for
    assert launched({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) is None
    assert launched({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert launched({}) is None


def test_first_host_of_a_slurm_node_list():
    assert first_host("gpu[07-09,12],cpu1") == "gpu07"
    assert first_host("node3,node1") == "node3"
    assert first_host("a100-[2,5]") == "a100-2"
    assert first_host("localhost") == "localhost"


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The same sweep of five algorithms with 1, 2 and 3 processes."""
    root = tmp_path_factory.mktemp("dist")
    out = {}
    for n in (1, 2, 3):
        sweep = root / f"n{n}"
        args = ["-m", f"algorithm={ALGORITHMS}", *SMALL, f"hydra.sweep.dir={sweep}"]
        p = subprocess.run(_fedbench(n, args), env=_env(root), capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        out[n] = (sweep, p)
    return root, out


@pytest.mark.parametrize("nproc", [2, 3])
def test_same_metrics_with_any_number_of_processes(sweeps, nproc):
    one, many = sweeps[1][1][0], sweeps[1][nproc][0]
    dirs = sorted(d.name for d in one.iterdir() if (d / "metrics.jsonl").exists())
    assert len(dirs) == 5
    assert sorted(d.name for d in many.iterdir() if (d / "metrics.jsonl").exists()) == dirs
    for name in dirs:
        assert json.loads((many / name / "status.json").read_text())["status"] == "complete"
        assert _metrics(many / name) == _metrics(one / name), name  # exact: every client trains as in one process


def test_one_writer(sweeps):
    """Rank 0 alone writes: one journal row per job, one sweep summary, and the header says how the run was split."""
    root, runs = sweeps
    sweep, p = runs[2]
    rows = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(r["status"] == "complete" for r in rows)
    assert p.stdout.count("5 of 5 jobs complete") == 1
    log = next(sweep.glob("algorithm=fedavg*")) / "run.log"
    assert "2 processes (gloo): clients split, rank 0 writes" in log.read_text()
    assert not list((root / "tmp").glob("fedbench-rank*"))  # the followers' private dirs are gone


def test_kill_a_rank_then_resume_with_one_process(tmp_path):
    env = _env(tmp_path)
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = subprocess.run(_fedbench(1, [*LONG, f"hydra.run.dir={ref}"]), env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]

    proc = subprocess.Popen(
        _fedbench(2, [*LONG, f"hydra.run.dir={run}"]),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and len(_rows(run)) < 4:  # round 0 and three rounds: rank 1 is mid-run
        time.sleep(0.05)
    assert len(_rows(run)) < 25, "the run ended before the test could kill a rank"
    leader = json.loads((run / "status.json").read_text())["pid"]
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    follower = next(int(w) for w in workers if int(w) != leader)
    os.kill(follower, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)  # no hang: rank 0 stops too
    assert proc.returncode != 0
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed", status
    assert "rank 1" in status["error"], status["error"]  # names the lost rank, not a signal fedbench never got
    killed_at = status["round"]
    assert 2 <= killed_at < 24  # (status.json says a round after its metrics row)

    p = subprocess.run(_fedbench(1, [*LONG, f"hydra.run.dir={run}"]), env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"resuming {run} after round" in p.stderr
    assert json.loads((run / "status.json").read_text())["status"] == "complete"
    assert _metrics(run) == _metrics(ref)


def _rows(run_dir: Path) -> list[str]:
    try:
        return (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []


def test_a_complete_sweep_is_skipped_by_every_process(sweeps):
    """Rank 0 finds each run complete and tells the others: the relaunched sweep skips all five, none waits."""
    root, runs = sweeps
    sweep = runs[2][0]
    args = ["-m", f"algorithm={ALGORITHMS}", *SMALL, f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(_fedbench(2, args), env=_env(root), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and all(r["skipped"] for r in rows[5:]), rows


def test_a_sweep_goes_on_past_a_job_every_process_refuses(tmp_path):
    """A job whose setup fails on every rank (FedCOM refuses a Dirichlet partition) fails alone: the processes stay in
    step, and the next job trains over both (an unheard word of rank 0 used to be read by the next job instead)."""
    sweep = tmp_path / "s"
    args = ["-m", "algorithm=fedcom,ditto_caf,fedavg", *SMALL, f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(_fedbench(2, args), env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in (sweep / "jobs.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["failed", "complete", "complete"], p.stderr[-3000:]
    assert "partition='dirichlet'" in rows[0]["error"] and p.returncode == 1  # the sweep says a job failed
    assert p.stderr.count("invalid config: partition='dirichlet'") == 1  # said once, by rank 0


def test_a_killed_rank_not_yet_reaped_by_its_launcher_has_vanished():
    """A SIGKILLed rank stays a zombie until torchrun waits for it, and signal 0 still reaches a zombie: rank 0 must
    see it as gone, or it reports "lost another rank" without naming it (CI, 2026-11-28: the kill-a-rank test)."""
    from torch.distributed import HashStore

    from fedbench.distributed import _vanished

    store = HashStore()
    live = subprocess.Popen(["sleep", "30"])
    dead = subprocess.Popen(["sleep", "0"])  # never waited for here: a zombie once it has exited
    try:
        deadline = time.time() + 30
        while time.time() < deadline and "Z" not in Path(f"/proc/{dead.pid}/stat").read_text().rsplit(")", 1)[1][:3]:
            time.sleep(0.05)
        store.set("fedbench/pid/1", f"{socket.gethostname()}:{live.pid}")
        store.set("fedbench/pid/2", f"{socket.gethostname()}:{dead.pid}")
        store.set("fedbench/pid/3", f"another-host-{socket.gethostname()}:{dead.pid}")
        assert [_vanished(store, r) for r in (1, 2, 3)] == [False, True, False]
    finally:
        live.kill()
        live.wait()
        dead.wait()
    store.set("fedbench/pid/2", f"{socket.gethostname()}:{dead.pid}")
    assert _vanished(store, 2)  # reaped: no such process
