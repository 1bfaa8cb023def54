"""The first-GPU command (scripts/gpu_check.sh -> scripts/gpu_check.py), rehearsed on the CPU as the GPU machine
would run it: in a venv holding only the GPU image's packages (scripts/device_kit.py), with the travel kit unzipped
from wheels, in --cpu-smoke mode. `make gpu-rehearsal` does the same with the wheels pip downloads for Python 3.12."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch
from test_machine_paths import machine_paths_in

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def image_env(tmp_path_factory):
    """A venv like the GPU image: torch and its neighbours, no hydra / omegaconf / antlr4 / wandb."""
    target = tmp_path_factory.mktemp("image") / "venv"
    _module("device_kit").rehearsal_env(target)
    return target / "bin" / "python"


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """The travel kit as wheels (zips of the installed hydra-core, omegaconf and antlr4 files: what a pure-Python
    wheel holds), so that this test needs no package index; device_prep.sh downloads the real ones."""
    d = tmp_path_factory.mktemp("kit")
    for name in _module("device_kit").KIT:
        dist = metadata.distribution(name)
        with zipfile.ZipFile(d / f"{name.replace('-', '_')}-{dist.version}-py3-none-any.whl", "w") as z:
            for f in dist.files or []:
                p = Path(dist.locate_file(f))
                if p.is_file() and not str(f).startswith(".."):
                    z.write(p, str(f))
    return d


def test_the_image_env_lacks_what_the_gpu_image_lacks(image_env):
    ok = subprocess.run([str(image_env), "-c", "import torch, numpy, scipy, matplotlib, rich, sklearn, yaml"])
    assert ok.returncode == 0
    for missing in ("hydra", "omegaconf", "wandb"):
        p = subprocess.run([str(image_env), "-c", f"import {missing}"], capture_output=True, text=True)
        assert p.returncode != 0 and "ModuleNotFoundError" in p.stderr, missing


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the command runs its full checks (minutes)")
def test_without_a_gpu_the_command_fails_and_says_why(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), "--out", str(out), "--budget", "60"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "FEDBENCH_DATA": str(tmp_path)},
    )
    assert p.returncode == 3, p.stdout + p.stderr
    report = (out / "report.txt").read_text()
    line = next(ln for ln in report.splitlines() if ln.startswith("FAIL  a CUDA device: "))
    assert f"(torch {torch.__version__}, CUDA build {torch.version.cuda})" in line  # and torch's own reason before it
    assert json.loads((out / "bench.json").read_text())["failed"] == ["a CUDA device"]
    assert report.startswith("fedbench gpu_check ") and ", out $OUT\n" in report  # not this machine's path
    console = (out / "console.txt").read_text()  # the shell's and Python's lines, through the same placeholders
    assert "gpu_check.sh: " in console and not machine_paths_in(console + report), console


@pytest.mark.slow
def test_the_gpu_command_rehearsed_in_the_image_env(image_env, kit, tmp_path):
    """The exact GPU command, --cpu-smoke, in the image-like venv with the kit unzipped: every section completes and
    passes whatever the machine's load (the budget, 900 s, leaves room for every section; the smoke work is bounded),
    its files are what the device tool brings back (<= 8 files, <= 16 MiB each), the claim runs' archive holds
    no checkpoint and reads back (the command checks that itself: a PASS line)."""
    out = tmp_path / "out"
    p = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), "--out", str(out), "--cpu-smoke", "--budget", "900"],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "PYTHON": str(image_env),
            "PATH": "/usr/bin:/bin",
            "FEDBENCH_KIT": str(kit),
            "FEDBENCH_DATA": str(tmp_path),
        },
    )
    report = (out / "report.txt").read_text()
    assert p.returncode == 0, report[-4000:] + p.stderr[-2000:]
    assert "the travel kit from" in (out / "console.txt").read_text()
    for n in range(1, 8):
        assert f"\n-- {n}. " in report, f"section {n} did not complete:\n{report[-3000:]}"
    assert "FAIL" not in report and "0 check(s) failed" in report
    files = sorted(f for f in out.rglob("*") if f.is_file())
    assert {f.name for f in files} == {"report.txt", "console.txt", "bench.json", "clients.png", "claims.tar.gz"}
    assert len(files) <= 8 and all(f.stat().st_size <= 16 * 2**20 for f in files)
    bench = json.loads((out / "bench.json").read_text())
    assert {"env", "equality", "syncs", "settings", "clients", "memory", "claims", "time"} <= set(bench["sections"])
    with tarfile.open(out / "claims.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("summary.json") for n in names) and not any(n.endswith(".pt") for n in names)
    assert "PASS  fedka table1: the archive reads back with fedbench-claims" in report


def test_a_report_writes_this_machines_paths_as_placeholders(tmp_path, monkeypatch, capsys):
    """report.txt, the console and the JSON as they come back can be committed: the out dir is $OUT, the data
    $FEDBENCH_DATA, the repository <repo>, the temporary dir <tmp>, the home dir ~ (the 2026-11-26 H200 report held
    /root/out, /tmp/tmp.k0POm1wWRT and /work/main); a longer name that only starts like one of them is not cut."""
    import tempfile

    gc = _module("gpu_check")
    out, data = tmp_path / "out", tmp_path / "data"
    monkeypatch.setenv("FEDBENCH_DATA", str(data))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # Path.home(); a container's may be /, which stays as it is
    rep = gc.Report(out, budget=1.0)
    lines = [
        f"files in {out.resolve()}: {out}/report.txt, {out}-old/x",
        f"data: {data}; fedbench from {gc.REPO}; unpacked into {tempfile.gettempdir()}/tmp.k0P/y; {Path.home()}/z",
    ]
    for line in lines:
        rep.say(line)
    rep.check("a path in a failure's detail", False, f"File {gc.REPO / 'fedbench' / 'run.py'}, line 3")
    rep.put("section", "where", str(out / "claims"))
    old = str(out.resolve().parent / "out-old").replace(str(Path(tempfile.gettempdir()).resolve()), "<tmp>", 1)
    want = [
        f"files in $OUT: $OUT/report.txt, {old}/x",
        "data: $FEDBENCH_DATA; fedbench from <repo>; unpacked into <tmp>/tmp.k0P/y; ~/z",
        "FAIL  a path in a failure's detail: File <repo>/fedbench/run.py, line 3",
    ]
    assert (out / "report.txt").read_text().splitlines() == want
    assert capsys.readouterr().out.splitlines() == want
    saved = json.loads((out / "bench.json").read_text())
    assert saved["sections"]["section"]["where"] == "$OUT/claims" and not machine_paths_in(json.dumps(saved))


def test_paper_run_seconds_counts_evaluations_every_eval_every():
    """100 rounds of 2 s training, evaluation (3 s) every 5th round: 100 x 2 + 20 x 3 = 260 s."""
    gc = _module("gpu_check")
    cfg = type("C", (), {"rounds": 100, "eval_every": 5})()
    assert gc.paper_run_seconds(cfg, {"train_s": 2.0, "eval_s": 3.0}) == 260.0
    cfg.eval_every = 3  # 34 evaluations (rounds 3, 6, ..., 99 and the ceiling)
    assert gc.paper_run_seconds(cfg, {"train_s": 2.0, "eval_s": 3.0}) == 200.0 + 34 * 3.0


def test_a_claim_run_that_would_not_finish_is_not_started(tmp_path, capsys):
    """The planner starts a pair of arms only if both fit in the time left (estimate x 1.3 + 15 s each)."""
    gc = _module("gpu_check")
    rep = gc.Report(tmp_path / "out", budget=100.0)  # 100 s, 20 s kept: 80 s for runs
    size = {**gc.SIZES["smoke"], "claims": [("fedka", "table1", ["fedavg", "fedka_0.01"])]}
    est = {("fedka", "table1", a): {"paper_run_s": 30.0} for a in ("fedavg", "fedka_0.01")}  # 2 x (39 + 15) = 108 s
    gc.claims(rep, torch.device("cpu"), size, None, est, tmp_path / "work")
    out = capsys.readouterr().out
    said = re.search(
        r"fedka table1 seed 0 \(fedavg vs fedka_0.01\): est\. 1\.8 min, (\d+\.\d) min left: not started", out
    )
    assert said and float(said[1]) <= 1.3, out  # 80 s less the time this took (a loaded machine: a little less)
    assert not (tmp_path / "out" / "claims.tar.gz").exists() and not (tmp_path / "work").exists()


def test_any_command_on_the_image_with_device_run(image_env, kit, tmp_path):
    """scripts/device_run.sh (README "Any other command on that machine"): in the image-like venv with the kit, a
    claims pilot runs from this checkout, says which commit it is when told (FEDBENCH_COMMIT: the image's .git is
    stale), and its runs record; a missing command is one line and exit 2."""
    out = tmp_path / "out"
    env = {"PYTHON": str(image_env), "PATH": "/usr/bin:/bin", "FEDBENCH_KIT": str(kit), "FEDBENCH_DATA": str(tmp_path)}
    runs = tmp_path / "claims"
    p = subprocess.run(
        ["bash", str(SCRIPTS / "device_run.sh"), "--out", str(out), "--", "fedbench-claims", "run", "fedrema",
         "--scale", "smoke", "--only", "table1", "--seeds", "1", "--runs", str(runs), "checkpoint.final_model=false"],
        capture_output=True, text=True, timeout=600, env={**env, "FEDBENCH_COMMIT": "abc1234-test"},
    )  # fmt: skip
    console = (out / "console.txt").read_text()
    assert p.returncode == 0, console[-3000:]
    assert "the travel kit from" in console and "table1: 4/4 complete" in console
    import torchvision

    assert f"device_run.sh: torch {torch.__version__}, torchvision {torchvision.__version__}, numpy" in console
    statuses = [json.loads(f.read_text()) for f in (runs / "smoke" / "fedrema").glob("*/status.json")]
    assert len(statuses) == 4 and {(s["status"], s["commit"]) for s in statuses} == {("complete", "abc1234-test")}
    assert all("\nseed: 1\n" in f.read_text() for f in (runs / "smoke" / "fedrema").glob("*/config.yaml"))
    bad = subprocess.run(["bash", str(SCRIPTS / "device_run.sh"), "--out", str(out)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no command" in bad.stderr


def test_parallel_claim_runs_to_a_deadline_with_device_claims(image_env, kit, tmp_path):
    """scripts/device_claims.py in the image-like venv through device_run.sh: one process per run, two at a time;
    what finished comes back as claims.tar.gz that fedbench-claims reads here, and its records leave nothing to make
    (a run the records lack is the only job). A SIGTERM (as the budget's end) while a run is under way stops every job
    and its fedbench process: no status is left saying running, no process is left behind, the archive is written."""
    env = {"PYTHON": str(image_env), "PATH": "/usr/bin:/bin", "FEDBENCH_KIT": str(kit), "FEDBENCH_DATA": str(tmp_path)}

    def device_claims(out: Path, budget: str) -> list[str]:
        cmd = ["bash", str(SCRIPTS / "device_run.sh"), "--out", str(out), "--", "python", "scripts/device_claims.py"]
        return cmd + ["--scale", "smoke", "fedka:table1", "--parallel", "2", "--out", str(out), "--budget", budget]

    out = tmp_path / "out"
    p = subprocess.run(device_claims(out, "300"), capture_output=True, text=True, timeout=600, env=env)
    report = (out / "report.txt").read_text()
    assert p.returncode == 0, (out / "console.txt").read_text()[-3000:]
    assert report.count(": exit 0 after") == 4 and "fedka table1: 4 of 4 runs complete here" in report, report
    from fedbench.claims.results import RunSet
    from fedbench.claims.spec import load

    back = tmp_path / "back"
    with tarfile.open(out / "claims.tar.gz") as tar:
        tar.extractall(back, filter="data")
        assert not [n for n in tar.getnames() if n.endswith(".pt")]  # no checkpoints travel back
    pc = load("fedka")
    runs = RunSet(pc, "smoke", back / "claims").runs(pc.experiments["table1"]["smoke"])
    assert sorted((r.status, r.seed) for r in runs) == [("complete", 0)] * 2 + [("complete", 1)] * 2

    record = [
        sys.executable,
        "-m",
        "fedbench.claims",
        "record",
        "fedka",
        "--scale",
        "smoke",
        "--runs",
        str(back / "claims"),
    ]
    assert subprocess.run([*record + ["--out", str(tmp_path / "rec")]], capture_output=True).returncode == 0
    dc = _module("device_claims")
    recs = tmp_path / "rec" / "fedka" / "runs.jsonl"
    lines = recs.read_text().splitlines()
    assert len(lines) == 4 and dc.plan(["fedka:table1"], "smoke", tmp_path / "none", None, [], lambda p: recs)[0] == []
    dropped = next(x for x in lines if '"fedka_0.01"' in x and '"seed": "1"' in x)
    recs.write_text("".join(x + "\n" for x in lines if x != dropped))
    jobs = dc.plan(["fedka:table1"], "smoke", tmp_path / "none", None, [], lambda p: recs)[0]
    assert [j[2] for j in jobs] == ["experiment/fedka/arm@_global_=fedka_0.01 seed=1"], jobs

    late = tmp_path / "late"
    # in a session of its own at autogroup nice 7 (as runs beside other work are started): its jobs keep that nice
    lowered = ["setsid", "bash", "-c", 'echo 7 > /proc/self/autogroup 2>/dev/null; exec "$@"', "-"]
    proc = subprocess.Popen(
        lowered + device_claims(late, "600"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    work = late / "work" / "claims" / "smoke" / "fedka"
    for _ in range(3000):  # until a run is under way (on a loaded 2-core machine the image venv starts slowly)
        if any('"running"' in f.read_text() for f in work.glob("*/status.json")):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"no run under way after 300 s:\n{(late / 'console.txt').read_text()[-3000:]}")
    jobs = subprocess.run(["pgrep", "-f", r"python\S* -m fedbench\.cli .*" + str(late)], capture_output=True, text=True)
    groups = [Path(f"/proc/{pid}/autogroup").read_text() for pid in jobs.stdout.split()]
    if "nice 7" in Path(f"/proc/{proc.pid}/autogroup").read_text():  # autogroup scheduling is on here
        assert groups and all(g.strip().endswith("nice 7") for g in groups), (jobs.stdout, groups)
    script = subprocess.run(
        ["pgrep", "-f", r"^\S*python\S* scripts/device_claims.py .*" + str(late)], capture_output=True, text=True
    )
    os.kill(int(script.stdout.split()[0]), signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    report = (late / "report.txt").read_text()
    assert "SIGTERM, stopping 2 job(s)" in report and (late / "claims.tar.gz").exists(), report
    statuses = [json.loads(f.read_text())["status"] for f in work.glob("*/status.json")]
    assert statuses and "running" not in statuses, statuses
    assert subprocess.run(["pgrep", "-f", str(late)], capture_output=True).returncode == 1  # nothing left behind


def test_device_claims_plans_each_run_once_seed_by_seed_and_refuses_a_bad_item(tmp_path):
    """Several papers and experiments in one call: a run two experiments share (ECL's if_sweep at IF = 100 is table1's
    ECL run) is one job; jobs go seed by seed within an experiment (a deadline leaves whole seeds); an experiment the
    paper lacks at the scale, a seed it does not run and an override that changes results are refused, exit 2."""
    dc = _module("device_claims")
    jobs, asked = dc.plan(["fedka:table1", "ecl:table1,if_sweep"], "smoke", tmp_path, None, [], lambda p: tmp_path)
    assert [(pc.paper, e.name) for pc, e in asked] == [("fedka", "table1"), ("ecl", "table1"), ("ecl", "if_sweep")]
    ecl = [j for j in jobs if j[0] == "ecl"]
    assert len(jobs) == 4 + 10 and len(ecl) == 8 + 4 - 2 and len({j[3] for j in jobs}) == len(jobs)
    assert [j[2] for j in ecl if j[1] == "if_sweep"] == [
        "algorithm=ecl partition.imbalance_factor=10 seed=0",
        "algorithm=ecl partition.imbalance_factor=10 seed=1",
    ]
    for name in ("table1", "if_sweep"):
        seeds = [int(j[2].rsplit("seed=", 1)[1]) for j in ecl if j[1] == name]
        assert seeds == sorted(seeds) and seeds[0] < seeds[-1], seeds
    assert all(f"hydra.sweep.dir={tmp_path / 'smoke' / j[0]}" in j[3] for j in jobs)
    script = [sys.executable, str(SCRIPTS / "device_claims.py"), "--scale", "smoke", "--out", str(tmp_path / "o")]
    for bad, says in [
        (
            ["fedka:table9"],
            "fedka:table9: 'table9' is not an experiment of fedka at smoke (tuned, alpha, table1, sampling)",
        ),
        (["fedka:table1", "--seeds", "7"], "--seeds [7] — fedka smoke table1 runs seeds [0, 1]"),
        (["fedka:table1", "--budget", "5", "lr=0.5"], "override 'lr=0.5' would change the runs"),  # after an option
    ]:
        p = subprocess.run([*script, *bad], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and p.stderr.startswith("device_claims: ") and says in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_the_peers_kit_adds_pfl_research_and_what_it_imports_that_the_image_lacks(tmp_path):
    """`device_prep.sh --peers` (pfl-research's side-by-side on the GPU): the pins are the kit's plus pfl 0.6 and the
    packages the side-by-side imports (measured with pfl installed: absl, attr, dill, dp_accounting, multiprocess,
    prv_accountant), none of them one the image already has; an unknown option is refused before any download."""
    kit = _module("device_kit")
    pins = [sys.executable, str(SCRIPTS / "device_kit.py"), "pins"]
    plain = subprocess.run(pins, capture_output=True, text=True).stdout.split()
    assert subprocess.run([*pins, "peers"], capture_output=True, text=True).stdout.split() == plain + kit.PEERS
    names = {pin.split("==")[0] for pin in kit.PEERS}
    assert names == {"pfl", "dp-accounting", "prv-accountant", "multiprocess", "dill", "absl-py", "attrs"}
    assert not names & {kit._norm(n) for n in kit.IMAGE} and "pfl==0.6.0" in kit.PEERS
    bad = subprocess.run(
        ["bash", str(SCRIPTS / "device_prep.sh"), "--peer"], capture_output=True, text=True, cwd=tmp_path
    )
    assert bad.returncode == 2 and "unknown option --peer (allowed: --no-data, --peers)" in bad.stderr, bad.stderr
