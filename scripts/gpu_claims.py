"""Section 7 of the first-GPU check (scripts/gpu_check.py): with the time left of the budget, the paper-scale claim
runs whose estimated time fits (a pair of arms per seed, most informative first; a run that would not finish is not
started), archived as ``claims.tar.gz`` (scripts/device_pack.py) and read back as fedbench-claims will read it."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from device_pack import pack_finished
from gpu_report import Report
from gpu_speed import measure_job, paper_job


def claims(rep: Report, dev: torch.device, size: dict, data: str | None, estimates: dict, work: Path) -> None:
    from fedbench.claims.results import LAUNCHES, RunSet, sweep_dir
    from fedbench.claims.runner import commit, machine
    from fedbench.claims.spec import load

    scale = size["claims_scale"]
    root = work / "claims"
    archive = rep.out / "claims.tar.gz"
    margin = 20.0  # seconds kept for the archive and the report
    done = []
    for paper, exp_name, arms in size["claims"]:
        pc = load(paper)
        seeds = pc.experiments[exp_name][scale].scale.seeds[: size.get("claims_seeds")]
        for seed in seeds:
            pair = [paper_job(paper, exp_name, scale, arm, seed) for arm in arms]
            est = 0.0
            for arm, (exp, job) in zip(arms, pair):  # from section 4, else measured now (2 rounds)
                if (paper, exp_name, arm) not in estimates:
                    estimates[paper, exp_name, arm] = m = measure_job(dev, exp, job, data)
                    rep.put("claims", f"{paper} {exp_name} {arm} probe", m)
                est += 1.3 * estimates[paper, exp_name, arm]["paper_run_s"] + 15
            if est > rep.left() - margin:
                rep.say(
                    f"{paper} {exp_name} seed {seed} ({' vs '.join(arms)}): est. {est / 60:.1f} min, "
                    f"{max(0, rep.left() - margin) / 60:.1f} min left: not started"
                )
                break
            for arm, (exp, job) in zip(arms, pair):
                sweep = sweep_dir(root, scale, paper)
                sweep.mkdir(parents=True, exist_ok=True)
                args = ["-m", *exp.job_args(job), "logger=none", f"hydra.sweep.dir={sweep}"]
                args += [f"data_root={data}"] if data else []
                tic, started = time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
                try:
                    code = subprocess.run(
                        [sys.executable, "-m", "fedbench.cli", *args],
                        timeout=rep.left() - margin,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    ).returncode
                except subprocess.TimeoutExpired:
                    code = "timeout"
                seconds = time.perf_counter() - tic
                with (sweep / LAUNCHES).open("a") as f:
                    f.write(
                        json.dumps(
                            {
                                "experiment": exp_name,
                                "scale": scale,
                                "started": started,
                                "seconds": round(seconds, 1),
                                "exit": code,
                                "runs": 1,
                                "command": "fedbench " + " ".join(args),
                                "invoked": "scripts/gpu_check.py",
                                "commit": commit(),
                                "machine": machine(),
                            }
                        )
                        + "\n"
                    )
                rep.put("claims", f"{paper} {exp_name} {arm} seed {seed}", {"seconds": seconds, "exit": code})
                rep.say(f"{paper} {exp_name} {arm} seed {seed}: exit {code} after {seconds:.0f} s")
                if code == 0:
                    done.append((paper, exp_name))
                pack_finished(root, archive)
    if not done:
        rep.say("no claim run finished")
        return
    with tempfile.TemporaryDirectory() as back:  # read the archive back as fedbench-claims will here
        with tarfile.open(archive) as tar:
            tar.extractall(back, filter="data")
        for paper, exp_name in dict.fromkeys(done):
            pc = load(paper)
            runs = RunSet(pc, scale, Path(back) / "claims").runs(pc.experiments[exp_name][scale])
            n = sum(r.status == "complete" for r in runs)
            rep.check(
                f"{pc.paper} {exp_name}: the archive reads back with fedbench-claims",
                n > 0,
                f"{n} of {len(runs)} runs complete",
            )
