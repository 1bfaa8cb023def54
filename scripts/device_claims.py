"""Claim runs on a borrowed GPU, several processes at once, stopped at a deadline, packed for the way back.

    bash scripts/device_run.sh --out $OUT -- python scripts/device_claims.py --scale medium \
        fedka:ablation cafeme:table1,heterogeneity ecl --parallel 12 --budget 470 --out $OUT

Small models leave a GPU idle between kernel launches (FedKA's quarter-width t-CNN: one process uses a fraction of
an H100), so every run still to make — not complete or diverged under ``--work``, nor in the committed records
(docs/results/<paper>/runs.jsonl) — is one ``fedbench`` process of its own, ``--parallel`` at a time, in the order
given (``PAPER:EXP,EXP``; a bare ``PAPER``: every experiment its claims need at the scale), a run that two
experiments share made once. A job is one run, so a deadline loses at most the runs under way, never a finished
one waiting behind them. At ``--budget`` seconds, or at a SIGTERM to this script, every job still running gets
SIGTERM (the run checkpoints, its status says ``preempted``; a job still there 30 s later is killed), and what was
done is packed (also after each finished job, so that a call cut short still brings back what was done;
scripts/device_pack.py):

    claims.tar.gz        the runs without checkpoints: here ``python scripts/device_pack.py unpack FROM`` puts them
                         into outputs/claims, then ``fedbench-claims record PAPER --scale S --runs outputs/claims``
    checkpoints.tar.NNN  every unfinished run this call made or resumed, with its newest checkpoint, in the files and
                         bytes the others leave of what a device call returns (8 files of 16 MiB, 64 MiB together,
                         counted over ``$FEDBENCH_DEVICE_OUT``, which scripts/device_run.sh sets to its ``--out``); the
                         same unpack keeps them in .device-runs/, and the next call, carrying ``.device-runs``, resumes
                         them with ``--carried .device-runs``
    report.txt     one line per job: paper, experiment, run, exit, seconds; the runs complete per experiment; the
                   checkpoints packed, and each one left out with its size and why
    console.txt    every process's output, each line prefixed with its job
    smi.csv        nvidia-smi's utilisation and memory every 5 s (when there is an nvidia-smi)

Rehearsed on the CPU at smoke scale by tests/test_gpu_check.py; the window after window by
tests/test_device_travel.py.
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
from device_pack import carry_in, pack_checkpoints, pack_finished, statuses, unfinished  # noqa: E402
from gpu_report import machine_paths, placeholders  # noqa: E402

from fedbench.claims import committed_records  # noqa: E402
from fedbench.claims.results import RunSet, sweep_dir  # noqa: E402
from fedbench.claims.runner import check_extra, run_args, todo  # noqa: E402
from fedbench.claims.spec import ClaimsError, load  # noqa: E402


def plan(
    items: list[str],
    scale: str,
    runs: Path,
    seeds: list[int] | None,
    extra: list[str],
    records=committed_records,
    from_plan: bool = False,
) -> tuple[list, list]:
    """The jobs, in order — (paper, experiment, label, fedbench arguments), one per run still to make — and the
    (paper claims, experiment) pairs asked for. ``records``: paper -> its records file. ``from_plan``: only the runs
    `fedbench-claims plan` plans for the first look, in its order (headline claims first; a tuned row's chosen value
    only; fedbench/claims/plan.py), instead of every run the experiments lack, seed by seed."""
    jobs, asked, seen = [], [], set()
    for item in items:
        paper, _, names = item.partition(":")
        pc = load(paper)
        needed = [e.name for e in pc.needed(scale)]
        order = planned(pc, scale, records(paper)) if from_plan else None
        for name in names.split(",") if names else needed:
            if name not in needed:
                raise ClaimsError(f"{item}: {name!r} is not an experiment of {paper} at {scale} ({', '.join(needed)})")
            exp = pc.experiments[name][scale]
            if seeds is not None and not set(seeds) <= set(exp.seeds):
                raise ClaimsError(f"--seeds {seeds} — {paper} {scale} {name} runs seeds {exp.seeds}")
            asked.append((pc, exp))
            left = todo(pc, scale, exp, runs, records(paper), seeds)[1]
            if order is None:  # seed by seed: a deadline leaves whole seeds
                left = sorted(left, key=lambda j: int(j["seed"]))
            else:
                left = sorted(
                    (j for j in left if frozenset(j.items()) in order), key=lambda j: order[frozenset(j.items())]
                )
            for job in left:
                if (paper, frozenset(job.items())) in seen:
                    continue
                seen.add((paper, frozenset(job.items())))
                label = " ".join(f"{k.lstrip('+~')}={job[k.lstrip('+~')]}" for k in [*exp.sweep, "seed"])
                jobs.append((paper, name, label, tuple(run_args(exp, job, extra, sweep_dir(runs, scale, paper)))))
    return jobs, asked


def planned(pc, scale: str, records: Path) -> dict:
    """{a run's overrides: its place} for the runs `fedbench-claims plan` plans for the first look at ``scale``."""
    from fedbench.claims.plan import plan_paper

    keys = [r.key for p in plan_paper(pc, scale, records) for r in p.runs if r.look == 1]
    return {k: i for i, k in enumerate(dict.fromkeys(keys))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", required=True)
    ap.add_argument("--seeds", default=None, help="comma list (default: the scale's seeds)")
    ap.add_argument("--parallel", type=int, default=4, help="processes at once")
    ap.add_argument("--threads", type=int, default=1, help="hardware.threads of each process")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds until the processes still running stop")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--work", type=Path, default=None, help="where the runs go (default OUT/work; outside $OUT on a GPU)"
    )
    ap.add_argument(
        "--carried", type=Path, default=None, help="run archives an earlier call brought back (.device-runs): resumed"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the runs to make, in order, and stop")
    ap.add_argument(
        "--from-plan",
        action="store_true",
        help="only the runs `fedbench-claims plan` plans for the first look, in its order (docs/paper_scale.md)",
    )
    ap.add_argument(
        "items",
        nargs="+",
        metavar="PAPER[:EXP,...] | KEY=VALUE",
        help="what to run, in order; KEY=VALUE: results-neutral overrides for every run (fedbench-claims run's)",
    )
    args = ap.parse_intermixed_args()  # what to run and the overrides, before and after the options
    start = time.monotonic()
    overrides = [a for a in args.items if "=" in a]
    runs = (args.work or args.out / "work") / "claims"
    extra = ["logger=none", f"hardware.threads={args.threads}", *overrides]
    try:
        check_extra(overrides)
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
        jobs, asked = plan(
            [a for a in args.items if "=" not in a], args.scale, runs, seeds, extra, from_plan=args.from_plan
        )
    except ClaimsError as e:
        print(f"device_claims: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for job in jobs:
            print(f"{' '.join(job[:3])}: fedbench {' '.join(job[3])}")
        print(f"device_claims: {len(jobs)} runs to make", file=sys.stderr)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    console = (args.out / "console.txt").open("a")
    report = (args.out / "report.txt").open("a")
    lock, paths = threading.Lock(), machine_paths(args.out)

    def say(line: str, file=report) -> None:
        line = placeholders(line, paths)  # the report can be committed as it comes back
        with lock:
            for f in {file, console}:
                f.write(line + "\n")
                f.flush()
            if file is report:  # the jobs' own lines only in console.txt
                print(line, flush=True)

    work = runs.parent
    if args.carried and not args.carried.is_dir():  # the first window: nothing was brought back yet
        say(f"device_claims: --carried {args.carried}: no such folder, no runs carried")
    for line in carry_in(args.carried, work) if args.carried and args.carried.is_dir() else []:
        say(f"device_claims: {line}")
    before = statuses(runs)  # the runs this call makes or resumes are those whose status.json changes
    root = Path(os.environ.get("FEDBENCH_DEVICE_OUT") or args.out).resolve()
    root = root if args.out.resolve().is_relative_to(root) else args.out.resolve()

    def pack(final: bool = False) -> None:
        if not runs.exists():
            return
        pack_finished(runs, args.out / "claims.tar.gz")
        lines = pack_checkpoints(unfinished(runs, before), work, args.out, root)
        for line in lines if final else []:
            say(f"device_claims: {line}")

    smi = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used", "--format=csv", "-l", "5"],
            stdout=(args.out / "smi.csv").open("w"),
            stderr=subprocess.DEVNULL,
        )
    say(
        f"device_claims: {args.scale}, {len(jobs)} runs to make ({', '.join(a for a in args.items if '=' not in a)}), "
        f"{args.parallel} at a "
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
            job = queue.pop(0)
            cmd = [sys.executable, "-m", "fedbench.cli", *job[3]]
            proc = subprocess.Popen(  # a session of its own: a stop reaches its fedbench process too
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
            keep_priority(proc.pid)
            reader = threading.Thread(target=pipe, args=(proc, " ".join(job[:3])), daemon=True)
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
                say(f"job {' '.join(job[:3])}: exit {code} after {time.monotonic() - t0:.0f} s")
                pack()
        time.sleep(0.5)
    if smi:
        smi.terminate()
    pack(final=True)
    for pc, exp in asked:
        here = RunSet(pc, args.scale, runs).runs(exp)
        n, m = sum(r.status == "complete" for r in here), len(here)
        left = len(todo(pc, args.scale, exp, runs, committed_records(pc.paper))[1])
        say(f"{pc.paper} {exp.name}: {n} of {m} runs complete here; {m - left} of {m} with the committed records")
    say(f"device_claims: done after {time.monotonic() - start:.0f} s")
    return 0


def keep_priority(pid: int) -> None:
    """A job's session of its own is, under Linux's autogroup scheduling, a scheduling group of its own at nice 0:
    give it this script's autogroup niceness, so that runs started at `echo 19 > /proc/self/autogroup` (docs/claims.md,
    hours of runs beside other work) keep yielding (measured 2026-11-28: without this, two jobs took a CPU each from a
    foreground test suite). Popen returns after the child's setsid, so the write lands on the job's own group."""
    try:
        nice = Path("/proc/self/autogroup").read_text().rsplit("nice", 1)[1].strip()
        if nice != "0":
            Path(f"/proc/{pid}/autogroup").write_text(nice)
    except (OSError, IndexError):  # no autogroup (another OS, or it is disabled): nothing to keep
        pass


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
