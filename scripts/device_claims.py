"""Claim runs on a borrowed GPU, several processes at once, stopped at a deadline, packed for the way back.

    bash scripts/device_run.sh --out $OUT -- python scripts/device_claims.py fedka --scale medium \
        --only table1,ablation --parallel 8 --budget 540 --out $OUT

Small models leave a GPU idle between kernel launches (FedKA's quarter-width t-CNN: one process uses a fraction of
an H100), so one ``fedbench-claims run PAPER --only EXP --seeds K`` per (experiment, seed) runs in a process of its
own, ``--parallel`` at a time, in the order of ``--only`` then the seeds (the first experiment's seeds first).
At ``--budget`` seconds, or at a SIGTERM to this script, every job still running gets SIGTERM, its fedbench
process too (a run checkpoints, its status says ``preempted``; not resumed here: the next device call or a CPU
starts it again; a job still there 30 s later is killed), and what finished is packed:

    claims.tar.gz  the runs without checkpoints: ``tar xzf claims.tar.gz -C outputs`` then
                   ``fedbench-claims record PAPER --scale S --runs outputs/claims`` here
    report.txt     one line per job: experiment, seed, exit, seconds; the runs complete per experiment
    console.txt    every process's output, each line prefixed with its job
    smi.csv        nvidia-smi's utilisation and memory every 5 s (when there is an nvidia-smi)

Rehearsed on the CPU at smoke scale by tests/test_gpu_check.py.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import pack  # noqa: E402

from fedbench.claims.results import RunSet  # noqa: E402
from fedbench.claims.spec import load  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paper")
    ap.add_argument("--scale", required=True)
    ap.add_argument("--only", required=True, help="comma list of experiments, in the order they start")
    ap.add_argument("--seeds", default=None, help="comma list (default: the scale's seeds)")
    ap.add_argument("--parallel", type=int, default=4, help="processes at once")
    ap.add_argument("--threads", type=int, default=1, help="hardware.threads of each process")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds until the processes still running stop")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--work", type=Path, default=None, help="where the runs go (default OUT/work; outside $OUT on a GPU)"
    )
    ap.add_argument("overrides", nargs="*", help="results-neutral overrides for every run (fedbench-claims run's)")
    args = ap.parse_args()
    start = time.monotonic()
    pc = load(args.paper)
    exps = args.only.split(",")
    for name in exps:
        if name not in pc.experiments or args.scale not in pc.experiments[name]:
            print(f"device_claims: --only {name}: not an experiment of {args.paper} at {args.scale}", file=sys.stderr)
            return 2
    seeds = args.seeds.split(",") if args.seeds else None
    jobs = [
        (name, str(s))
        for name in exps
        for s in (seeds or [str(x) for x in pc.experiments[name][args.scale].scale.seeds])
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    runs = (args.work or args.out / "work") / "claims"
    console = (args.out / "console.txt").open("a")
    report = (args.out / "report.txt").open("a")
    lock = threading.Lock()

    def say(line: str, file=report) -> None:
        with lock:
            for f in {file, console}:
                f.write(line + "\n")
                f.flush()
            if file is report:  # the jobs' own lines only in console.txt
                print(line, flush=True)

    smi = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used", "--format=csv", "-l", "5"],
            stdout=(args.out / "smi.csv").open("w"),
            stderr=subprocess.DEVNULL,
        )
    say(
        f"device_claims: {args.paper} {args.scale}, {len(jobs)} jobs ({', '.join(exps)}), {args.parallel} at a "
        f"time, {args.threads} thread(s) each, budget {args.budget:.0f} s"
    )

    def pipe(proc: subprocess.Popen, tag: str) -> None:
        for line in proc.stdout:
            say(f"[{tag}] {line.rstrip()}", file=console)

    running: dict[tuple, tuple] = {}  # job -> (process, started, reader)
    queue = list(jobs)
    stop_at = [start + args.budget]
    signal.signal(signal.SIGTERM, lambda *_: stop_at.__setitem__(0, time.monotonic()))
    stopping = False
    while queue or running:
        if time.monotonic() >= stop_at[0] and not stopping:
            stopping, queue = True, []
            say(f"device_claims: budget reached or SIGTERM, stopping {len(running)} job(s)")
            for proc, _, _ in running.values():
                signal_group(proc, signal.SIGTERM)
        while queue and len(running) < args.parallel:
            exp, seed = job = queue.pop(0)
            cmd = [sys.executable, "-m", "fedbench.claims", "run", args.paper, "--scale", args.scale]
            cmd += ["--only", exp, "--seeds", seed, "--runs", str(runs), f"hardware.threads={args.threads}"]
            proc = subprocess.Popen(  # a session of its own: a stop reaches its fedbench process too
                cmd + args.overrides,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
            reader = threading.Thread(target=pipe, args=(proc, f"{exp} s{seed}"), daemon=True)
            reader.start()
            running[job] = (proc, time.monotonic(), reader)
        for job, (proc, t0, reader) in list(running.items()):
            code = proc.poll()
            if code is not None and group_alive(proc):
                code = None  # its fedbench process is still saving its checkpoint
            if stopping and time.monotonic() - stop_at[0] > 30 and (code is None):
                signal_group(proc, signal.SIGKILL)  # a job that did not stop within 30 s of SIGTERM
                code = proc.wait()
            if code is not None:
                reader.join(timeout=5)
                del running[job]
                say(f"job {job[0]} seed {job[1]}: exit {code} after {time.monotonic() - t0:.0f} s")
        time.sleep(0.5)
    if smi:
        smi.terminate()
    if runs.exists():
        pack(runs, args.out / "claims.tar.gz")
        for name in exps:
            got = RunSet(pc, args.scale, runs).runs(pc.experiments[name][args.scale])
            n = sum(r.status == "complete" for r in got)
            say(f"{args.paper} {name}: {n} of {len(got)} runs complete")
    say(f"device_claims: done after {time.monotonic() - start:.0f} s")
    return 0


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def group_alive(proc: subprocess.Popen) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    sys.exit(main())
