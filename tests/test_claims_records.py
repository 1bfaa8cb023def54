"""Committed run records (fedbench/claims/records.py): the page's runs as docs/results/<paper>/runs.jsonl, judged the
same as the run dirs they come from, so that a page can be rebuilt where the runs are not."""

import json
import math
import shutil
from pathlib import Path

import pytest
from scipy import stats
from test_claims import CLAIM, NO_PICTURES, _claims_file, _write_run

from fedbench.claims import main, record
from fedbench.claims.records import load, records_path
from fedbench.claims.results import RunSet, evaluate_claim
from fedbench.claims.spec import ClaimsError, load_file


def test_record_command_writes_nothing_for_a_paper_without_runs(tmp_path, capsys):
    (tmp_path / "none").mkdir()
    assert main(["record", "fedka", "--scale", "smoke", "--runs", str(tmp_path / "none"), "--out", str(tmp_path)]) == 0
    assert records_path(tmp_path, "fedka").read_text() == ""
    assert "fedka smoke: 0 ended runs recorded" in capsys.readouterr().err


def _outcome(res):
    tests = [(t.label, t.at, t.per_seed) for t in res.outcome.tests]
    return (
        res.outcome.verdict,
        res.outcome.reason,
        tests,
        res.data,
        res.n_complete,
        res.n_runs,
        res.seconds,
        res.status,
    )


def test_records_are_judged_as_the_run_dirs_they_come_from(tmp_path):
    pc = load_file(_claims_file(tmp_path, [CLAIM]))
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    runs, out = tmp_path / "runs", tmp_path / "results"
    sweep = runs / "smoke" / "toy"
    acc = {"local": [0.50, 0.40, 0.60], "fedavg": [0.52, 0.41, 0.67]}
    for i, job in enumerate(jobs):
        _write_run(sweep, job, i, acc[job["algorithm"]][int(job["seed"])])
    shutil.rmtree(sweep / "local_seed2")  # never started: no record
    where = f"{sweep.resolve()}/fedavg_seed1"
    error = f"diverged in round 8: non-finite loss on client(s) [9]; run dir {where} (status.json)"
    (sweep / "fedavg_seed1" / "status.json").write_text(json.dumps({"status": "failed", "error": error}))
    made_by = {"status": "complete", "commit": "abc123def456", "machine": "CPU X (2 cores)", "host": "vm"}
    (sweep / "local_seed0" / "status.json").write_text(json.dumps(made_by))
    from_dirs = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", runs))

    assert record(pc, "smoke", runs, out) == (5, 5)  # 4 complete + 1 failed; the missing one has none
    lines = [json.loads(ln) for ln in records_path(out, "toy").read_text().splitlines()]
    assert sorted((r["overrides"]["algorithm"], r["overrides"]["seed"], r["status"]) for r in lines) == [
        ("fedavg", "0", "complete"),
        ("fedavg", "1", "failed"),
        ("fedavg", "2", "complete"),
        ("local", "0", "complete"),
        ("local", "1", "complete"),
    ]
    assert all(r["rounds"]["1"]["time/round"] == 2.0 for r in lines)  # per-round numbers
    # no path of this machine in a committed file: the runs dir of a run's error is written as <runs>
    assert [r["error"] for r in lines if r["status"] == "failed"] == [
        "diverged in round 8: non-finite loss on client(s) [9]; run dir <runs>/smoke/toy/fedavg_seed1 (status.json)"
    ]
    # where it was made: from its status.json, else unknown (never the writer's own commit)
    assert {(r["overrides"]["algorithm"], r["overrides"]["seed"]): r["commit"] for r in lines} == {
        ("fedavg", "0"): None,
        ("fedavg", "1"): None,
        ("fedavg", "2"): None,
        ("local", "0"): "abc123def456",
        ("local", "1"): None,
    }
    from_records = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", runs, found=load(records_path(out, "toy"))))
    assert _outcome(from_records) == _outcome(from_dirs)
    assert from_records.data["fedavg"][None] == {0: 52.0, 2: 67.0}  # seed 1 failed: no value
    assert from_records.outcome.verdict.startswith("not run")  # seed 2 has no Local run, seed 1 no FedAvg one
    assert from_records.status == {"failed": 1, "missing": 1} and from_records.seconds == 4 * 2.5

    # the run dirs gone (another machine): writing again keeps every record; a run finished there is added
    shutil.rmtree(runs)
    assert record(pc, "smoke", runs, out) == (0, 5)
    _write_run(sweep, next(j for j in jobs if j["algorithm"] == "local" and j["seed"] == "2"), 9, 0.60)
    assert record(pc, "smoke", runs, out) == (1, 6)
    again = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", runs, found=load(records_path(out, "toy"))))
    assert again.data["local"][None] == {0: 50.0, 1: 40.0, 2: 60.0} and again.status == {"failed": 1}


def test_run_makes_only_the_jobs_the_records_lack(tmp_path, cache_dir):
    """Four of the six jobs recorded on "another machine": `run` launches the other two, one `fedbench -m` each, and
    afterwards every job is complete (the two as run dirs, the four as records)."""
    from fedbench.claims.runner import run

    pc = load_file(_claims_file(tmp_path, [CLAIM]))
    exp = pc.experiments["grid"]["smoke"]
    jobs, _ = exp.jobs()
    elsewhere, runs, out = tmp_path / "elsewhere", tmp_path / "runs", tmp_path / "results"
    recorded = [j for j in jobs if not (j["algorithm"] == "fedavg" and j["seed"] in ("1", "2"))]
    for i, job in enumerate(recorded):
        _write_run(elsewhere / "smoke" / "toy", job, i, 0.5)
    assert record(pc, "smoke", elsewhere, out) == (4, 4)
    records = records_path(out, "toy")
    assert run(pc, "smoke", runs, [*NO_PICTURES, f"cache_dir={cache_dir}"], records=records) == 0
    made = sorted(d.name for d in (runs / "smoke" / "toy").iterdir() if (d / "summary.json").exists())
    assert len(made) == 2 and all("algorithm=fedavg" in d and "seed=0" not in d for d in made), made
    launch = json.loads((runs / "smoke" / "toy" / "claims_launches.jsonl").read_text().splitlines()[-1])
    assert launch["command"].count("fedbench -m") == 2 and (launch["complete_before"], launch["complete_after"]) == (
        4,
        6,
    )
    assert [r.status for r in RunSet(pc, "smoke", runs, records=records).runs(exp)] == ["complete"] * 6


def test_run_never_makes_a_diverged_run_again_but_makes_the_missing_one(tmp_path, cache_dir, capsys):
    """A diverged run is an outcome (the same config and seed diverge again): `run` launches neither the one recorded
    elsewhere nor the one whose run dir is here, only the missing job; the old code relaunched both."""
    from fedbench.claims.runner import run

    pc = load_file(_claims_file(tmp_path, [CLAIM]))
    exp = pc.experiments["grid"]["smoke"]
    jobs, _ = exp.jobs()
    elsewhere, runs, out = tmp_path / "elsewhere", tmp_path / "runs", tmp_path / "results"
    key = {(j["algorithm"], j["seed"]): j for j in jobs}
    for i, seed in enumerate("012"):
        _write_run(elsewhere / "smoke" / "toy", key["local", seed], i, 0.5)
    _write_run(elsewhere / "smoke" / "toy", key["fedavg", "0"], 3, float("nan"), status="diverged")
    assert record(pc, "smoke", elsewhere, out) == (4, 4)
    _write_run(runs / "smoke" / "toy", key["fedavg", "1"], 4, float("nan"), status="diverged")  # a run dir here
    records = records_path(out, "toy")
    assert run(pc, "smoke", runs, [*NO_PICTURES, f"cache_dir={cache_dir}"], records=records) == 0
    launch = json.loads((runs / "smoke" / "toy" / "claims_launches.jsonl").read_text().splitlines()[-1])
    assert launch["command"].count("fedbench -m") == 1 and "algorithm=fedavg" in launch["command"], launch["command"]
    assert "seed=2" in launch["command"] and "seed=0" not in launch["command"] and "seed=1" not in launch["command"]
    assert (launch["complete_before"], launch["complete_after"]) == (5, 6)
    assert "5/6 runs complete (2 of them diverged: an outcome, not made again)" in capsys.readouterr().err
    statuses = [r.status for r in RunSet(pc, "smoke", runs, records=records).runs(exp)]
    assert sorted(statuses) == ["complete"] * 4 + ["diverged"] * 2


def test_a_report_never_replaces_a_page_with_less_evidence(tmp_path, capsys):
    """A page made from 6 complete runs is not rewritten from 5 (one run dir gone): one
    line naming what would be lost and the command that makes it; page, CSV and pictures unchanged. --force rewrites."""
    pc_file = _claims_file(tmp_path, [CLAIM])
    pc = load_file(pc_file)
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    runs, out = tmp_path / "runs", tmp_path / "results"
    for i, job in enumerate(jobs):
        _write_run(runs / "smoke" / "toy", job, i, {"local": 0.5, "fedavg": 0.6}[job["algorithm"]] + 0.01 * i)
    from fedbench.claims import report

    report(pc, ["smoke"], runs, out)
    page = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert any(p.suffix == ".png" for p in page)
    shutil.rmtree(runs / "smoke" / "toy" / "local_seed1")
    with pytest.raises(ClaimsError) as e:
        report(pc, ["smoke"], runs, out)
    assert "smoke c: 5 of the page's 6 complete runs" in str(
        e.value
    ) and "fedbench-claims run toy --scale smoke" in str(e.value)
    assert "fedbench-claims record toy --scale smoke --runs <their dir>" in str(e.value)
    assert "\n" not in str(e.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == page
    report(pc, ["smoke"], runs, out, force=True)
    assert (out / "toy.csv").read_bytes() != page[out / "toy.csv"]


def _timed(sweep, job, num, seconds, machine):
    _write_run(sweep, job, num, 0.5)
    d = sweep / f"{job['algorithm']}_seed{job['seed']}"
    (d / "summary.json").write_text(json.dumps({"metrics": {"pers/acc": {"best": 0.5}}, "wall_time": seconds}))
    (d / "status.json").write_text(json.dumps({"status": "complete", "machine": machine}))


def test_a_time_claim_compares_the_runs_of_one_machine_only(tmp_path):
    """Compute times from a GPU and a CPU are not paired evidence: the claim is "not comparable", never a verdict."""
    claim = {**CLAIM, "metric": "wall_time", "holds_if": "fedavg < local", "percent": False, "worst": 1e5,
             "tolerance": 1.0, "tolerance_why": "one second"}  # fmt: skip
    claim.update(paper={"fedavg": 10.0, "local": 20.0}, tolerance=0.0)
    pc = load_file(_claims_file(tmp_path, [claim]))
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    secs = {"fedavg": [10.0, 11.0, 12.5], "local": [20.0, 23.0, 21.0]}
    for where, other in (("one", "CPU X (2 cores)"), ("two", "CPU X (16 cores), NVIDIA H200")):
        sweep = tmp_path / where / "smoke" / "toy"
        for i, job in enumerate(jobs):
            gpu = where == "two" and job["algorithm"] == "fedavg" and job["seed"] == "2"
            _timed(sweep, job, i, secs[job["algorithm"]][int(job["seed"])], other if gpu else "CPU X (2 cores)")
    same = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "one"))
    assert same.outcome.verdict == "holds"
    mixed = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "two"))
    assert mixed.outcome.verdict == "not comparable (scale)" and "from 2 machines" in mixed.outcome.reason


def test_a_pilot_prints_what_the_full_set_of_seeds_could_detect(tmp_path):
    """Issue #31: with 2 of 5 seeds in, no verdict, but the tests' paired sds and the gap 5 seeds would detect (in
    the two looks of issue #51: a little more than one look of 5 seeds at α)."""
    from fedbench.claims.predicates import mde, seq_mde
    from fedbench.claims.render import _pilot_line
    from fedbench.claims.results import pilot_mde

    pc = load_file(_claims_file(tmp_path, [CLAIM], seeds=(0, 1, 2, 3, 4)))
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    sweep = tmp_path / "runs" / "smoke" / "toy"
    acc = {("fedavg", "0"): 0.56, ("fedavg", "1"): 0.61, ("local", "0"): 0.50, ("local", "1"): 0.52}
    acc[("local", "2")] = 0.40
    for i, job in enumerate(jobs):
        if (job["algorithm"], job["seed"]) in acc:
            _write_run(sweep, job, i, acc[(job["algorithm"], job["seed"])])
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    assert res.outcome.verdict == "not run"
    (t,) = res.pilot.tests
    assert sorted(t.per_seed) == [0, 1]  # seed 2 lacks FedAvg
    assert t.per_seed == pytest.approx({0: 6.0, 1: 9.0}) and t.sd == pytest.approx(3 / 2**0.5)
    # issue #52: σ from 2 seeds is its 80 % upper confidence bound, sd·√(1/χ²₀.₂(1)) = 2.1213 · 3.9472 = 8.373
    upper = 3 / 2**0.5 / math.sqrt(stats.chi2.ppf(0.2, 1))
    assert upper == pytest.approx(8.373, abs=1e-3)
    assert t.bound == 0 and pilot_mde(t, 5) == pytest.approx(seq_mde(">", 0.0, 10.0, upper, 0.5))  # two looks
    optimistic = pilot_mde(t, 5, optimistic=True)
    assert optimistic == pytest.approx(seq_mde(">", 0.0, 10.0, 3 / 2**0.5, 0.5)) and optimistic < pilot_mde(t, 5) / 3
    assert optimistic > mde(">", 0.0, 10.0, 3 / 2**0.5, 5)  # stopping early costs a little power
    assert pilot_mde(t, 5) < pilot_mde(t, 3)  # more seeds detect less
    line = _pilot_line(res)
    assert "seeds 0, 1 have every run" in line and f"detects ≥ {pilot_mde(t, 5):.2f}" in line
    assert f"(≥ {optimistic:.2f} if σ were the sd)" in line and "σ ≤ 8.37" in line
    assert "mean 7.50, paired sd 2.12" in line and "the paper's gap 10.00" in line  # 60 − 50


def test_report_or_record_from_a_runs_dir_that_does_not_exist_is_refused(tmp_path, capsys):
    """Issue #37: `--runs /nonexistent` (a typo) was a page of "not run"; now one line, exit 2, nothing written."""
    missing = tmp_path / "no" / "runs"
    for argv in (["report", "fedka", "--runs", str(missing), "--out", str(tmp_path / "out")],
                 ["record", "fedka", "--runs=" + str(missing), "--out", str(tmp_path / "out")]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--runs {missing} — no such directory" in err
    assert not (tmp_path / "out").exists()


def test_a_claim_shows_the_mechanisms_own_numbers_per_method(tmp_path):
    """Issue #31 item 5: `diagnose:` metric paths, per named method, over its complete runs (a method that does
    not log the metric shows nothing), on the page."""
    from fedbench.claims.render import _details

    claim = {**CLAIM, "diagnose": ["set_size@mean", "ccp_rounds"]}
    pc = load_file(_claims_file(tmp_path, [claim]))
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    sweep = tmp_path / "runs" / "smoke" / "toy"
    for i, job in enumerate(jobs):
        _write_run(sweep, job, i, 0.5)
        if job["algorithm"] == "fedavg":
            d = sweep / f"fedavg_seed{job['seed']}"
            seed = int(job["seed"])
            rows = [{"round": r, "pers/acc": 0.5, "set_size": 2.0 + seed + r} for r in (1, 2)]  # mean 3.5 + seed
            (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
            summary = {"metrics": {"pers/acc": {"best": 0.5}}, "ccp_rounds": 10 + 2 * seed}
            (d / "summary.json").write_text(json.dumps(summary))
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    assert res.diagnostics == {"set_size@mean": {"fedavg": [3.5, 4.5, 5.5]}, "ccp_rounds": {"fedavg": [10, 12, 14]}}
    page = "\n".join(_details(res, None))
    assert "Diagnostic `set_size@mean` (mean ± std over the complete runs): FedAvg 4.5 ± 1 (n = 3)" in page
    assert "Diagnostic `ccp_rounds` (mean ± std over the complete runs): FedAvg 12 ± 2 (n = 3)" in page


def test_a_record_holds_no_path_of_the_machine_that_made_it():
    """Records are committed: a runs dir written under another --runs (a borrowed GPU's temp dir) becomes <runs>, an
    absolute data folder $FEDBENCH_DATA; a relative one (../shared/data) and the rest stay as they are."""
    from fedbench.claims.records import _portable

    rec = {
        "paper": "toy",
        "error": "diverged in round 3: non-finite loss; run dir /tmp/dc/claims/medium/toy/run_a (status.json)",
        "config": {"data_root": "/tmp/tmp.AcO2", "dataset": {"root": "/tmp/tmp.AcO2", "name": "mnist"}, "lr": 0.01},
    }
    assert _portable(rec, Path("/elsewhere/outputs/claims")) == {
        "paper": "toy",
        "error": "diverged in round 3: non-finite loss; run dir <runs>/medium/toy/run_a (status.json)",
        "config": {"data_root": "$FEDBENCH_DATA", "dataset": {"root": "$FEDBENCH_DATA", "name": "mnist"}, "lr": 0.01},
    }
    kept = {"paper": "toy", "error": None, "config": {"data_root": "../shared/data"}}
    assert _portable(dict(kept), Path("runs")) == kept
