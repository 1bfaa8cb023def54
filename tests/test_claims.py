"""fedbench-claims (fedbench/claims/, docs/claims.md): the predicates' seed-paired rule on hand-made numbers, the
claims files (every one loads, composes with Hydra's compose API and is true of its own paper numbers), a claim
judged from hand-written run dirs, and `fedbench-claims run/report` end to end at the smoke scale for every paper."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from fedbench.claims import main, papers
from fedbench.claims.predicates import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    NOT_RUN,
    PredicateError,
    decide,
    evaluate,
    paper_data,
    parse,
)
from fedbench.claims.results import RunSet, evaluate_claim
from fedbench.claims.runner import check_extra
from fedbench.claims.spec import ClaimsError, check, load, load_file

PAPERS = ["cafeme", "ecl", "fedcom", "fedka", "fedrema"]


def judge(text: str, data: dict, cols=(None,), tolerance=0.5, min_seeds=3, paper=None, paper_scale=True):
    return evaluate(parse(text), data, list(cols), tolerance, min_seeds, paper=paper, paper_scale=paper_scale)


# ---- the decision rule --------------------------------------------------------------------------------------------


def test_rule_holds_fails_inconclusive_on_hand_made_differences():
    """holds: every paired difference on the claimed side and the mean beyond the tolerance; fails: every one on the
    other side and the mean beyond the tolerance there; anything else is inconclusive."""
    assert decide({0: 2.0, 1: 0.7, 2: 3.0}, ">", 0.0, 0.5, 3)[0] == HOLDS  # mean 1.9
    assert decide({0: -2.0, 1: -0.7, 2: -3.0}, ">", 0.0, 0.5, 3)[0] == FAILS
    assert decide({0: 2.0, 1: -0.1, 2: 3.0}, ">", 0.0, 0.5, 3)[0] == INCONCLUSIVE  # one seed on the other side
    assert decide({0: 0.1, 1: 0.2, 2: 0.3}, ">", 0.0, 0.5, 3)[0] == INCONCLUSIVE  # right side, within tolerance
    assert decide({0: -0.1, 1: -0.2, 2: -0.3}, ">", 0.0, 0.5, 3)[0] == INCONCLUSIVE  # wrong side, within tolerance
    assert decide({0: 2.0, 1: 0.0, 2: 3.0}, ">", 0.0, 0.5, 3)[0] == INCONCLUSIVE  # a tie is on neither side
    assert decide({0: 2.0, 1: 3.0}, ">", 0.0, 0.5, 3)[0] == INCONCLUSIVE  # fewer seeds than min_seeds
    assert decide({0: 2.0, 1: 3.0}, ">", 0.0, 0.5, 2)[0] == HOLDS
    # "<" and a bound: q < 1.5 with q = 1.0, 0.8, 0.6 (mean margin 0.7 > 0.5) holds; q = 1.2, 1.4, 1.3 is too close
    assert decide({0: 1.0, 1: 0.8, 2: 0.6}, "<", 1.5, 0.5, 3)[0] == HOLDS
    assert decide({0: 1.2, 1: 1.4, 2: 1.3}, "<", 1.5, 0.5, 3)[0] == INCONCLUSIVE
    assert decide({0: 2.2, 1: 2.4, 2: 2.3}, "<", 1.5, 0.5, 3)[0] == FAILS


def test_pairs_by_seed_not_by_position():
    """FedReMa's seeds arrive in another order than FedAvg's; paired by seed every difference is +1 (holds), paired by
    position they would be -19, +11, +11 (inconclusive)."""
    data = {"fedrema": {None: {0: 10.0, 1: 20.0, 2: 30.0}}, "fedavg": {None: {2: 29.0, 0: 9.0, 1: 19.0}}}
    out = judge("fedrema > fedavg", data)
    assert out.verdict == HOLDS
    assert out.tests[0].per_seed == {0: 1.0, 1: 1.0, 2: 1.0}
    # a seed only one side has drops out of the pair; the other three still decide
    data["fedrema"][None][3] = 0.0
    assert judge("fedrema > fedavg", data).tests[0].per_seed == {0: 1.0, 1: 1.0, 2: 1.0}


def test_a_name_without_values_is_not_run_not_judged_on_the_others():
    """`fedrema > local > fedavg` with FedReMa's runs not there yet: the one test that can be made (local > fedavg,
    +11 on every seed) must not decide the claim alone — it is `not run`, naming what is missing. The same for a
    margin, a trend and a sweep column without values."""
    data = {"local": {None: {0: 49.0, 1: 50.0, 2: 48.0}}, "fedavg": {None: {0: 38.0, 1: 39.0, 2: 37.0}}}
    out = judge("fedrema > local > fedavg", data)
    assert out.verdict == NOT_RUN and "fedrema" in out.reason
    assert judge("local > fedavg", data).verdict == HOLDS  # with every name present it is judged
    assert judge("fedrema - fedavg > 1", data).verdict == NOT_RUN
    trend = {"fedrema": {0.2: {0: 50.0, 1: 51.0, 2: 52.0}, 0.4: {0: 45.0, 1: 46.0, 2: 47.0}, 0.6: {}}}
    out = judge("fedrema decreasing", trend, cols=(0.2, 0.4, 0.6))
    assert out.verdict == NOT_RUN and "0.6" in out.reason
    trend["fedrema"][0.6] = {0: 40.0, 1: 41.0, 2: 42.0}
    assert judge("fedrema decreasing", trend, cols=(0.2, 0.4, 0.6)).verdict == HOLDS


def test_direction_of_a_comparison_matters():
    """A > B holds exactly where B > A fails, and A < B is the same claim as B > A (asymmetric values)."""
    data = {"a": {None: {0: 61.0, 1: 63.5, 2: 62.0}}, "b": {None: {0: 58.0, 1: 60.0, 2: 59.5}}}
    assert judge("a > b", data).verdict == HOLDS
    assert judge("b > a", data).verdict == FAILS
    assert judge("b < a", data).verdict == HOLDS
    assert judge("a - b > 3", data).verdict == INCONCLUSIVE  # differences 3.0, 3.5, 2.5: mean 3.0, within 0.5
    assert judge("a - b > 1", data).verdict == HOLDS
    assert judge("a - b < 5", data).verdict == HOLDS
    assert judge("|a - b| < 1.5", data).verdict == FAILS
    assert judge("a > 60", data).tests[0].per_seed == {0: 1.0, 1: 3.5, 2: 2.0}  # a number is a constant


def test_chains_lists_and_sweeps_combine_their_tests():
    """`a > b > c` is two tests, `a > b, c` two tests, and with a swept key every test is made at every value; the
    claim fails if one test fails, holds if all hold."""
    data = {
        "a": {None: {0: 5.0, 1: 6.0, 2: 7.0}},
        "b": {None: {0: 3.0, 1: 4.0, 2: 5.0}},
        "c": {None: {0: 4.0, 1: 5.0, 2: 6.0}},
    }
    chain = judge("a > b > c", data)
    assert [(t.label, t.verdict) for t in chain.tests] == [
        ("a − b", HOLDS),
        ("b − c", FAILS),
    ] and chain.verdict == FAILS
    both = judge("a > b, c", data)
    assert [t.label for t in both.tests] == ["a − b", "a − c"] and both.verdict == HOLDS
    swept = {
        "a": {"0.1": {0: 5.0, 1: 6.0, 2: 7.0}, "0.5": {0: 5.0, 1: 5.1, 2: 4.0}},
        "b": {"0.1": {0: 3.0, 1: 4.0, 2: 5.0}, "0.5": {0: 4.0, 1: 5.0, 2: 6.0}},
    }
    out = judge("a > b", swept, cols=["0.1", "0.5"])
    assert [(t.at, t.verdict) for t in out.tests] == [("0.1", HOLDS), ("0.5", INCONCLUSIVE)]
    assert out.verdict == INCONCLUSIVE


def test_trend_is_the_fitted_change_per_seed_and_flat_the_range():
    """decreasing: per seed, the least-squares slope over the swept values times their span; x = 10, 50, 100 and
    y = 86, 79, 76 give slope -443.33/4066.67 (hand-computed), change -9.81."""
    y = {"10": {0: 86.0, 1: 78.0}, "50": {0: 79.0, 1: 81.0}, "100": {0: 76.0, 1: 80.0}}
    data = {"ecl": {x: dict(v) for x, v in y.items()}}
    out = judge("ecl decreasing", data, cols=["10", "50", "100"], min_seeds=2)
    xm, ym = 160 / 3, 241 / 3
    sxy = (10 - xm) * (86 - ym) + (50 - xm) * (79 - ym) + (100 - xm) * (76 - ym)
    sxx = (10 - xm) ** 2 + (50 - xm) ** 2 + (100 - xm) ** 2
    assert out.tests[0].per_seed[0] == pytest.approx(sxy / sxx * 90)
    assert out.tests[0].per_seed[0] == pytest.approx(-9.8115, abs=1e-3)
    assert out.verdict == INCONCLUSIVE  # seed 1 (78, 81, 80) rises: mixed
    assert judge("ecl increasing", data, cols=["10", "50", "100"], min_seeds=2).verdict == INCONCLUSIVE
    data["ecl"]["100"][1] = 70.0
    assert judge("ecl decreasing", data, cols=["10", "50", "100"], min_seeds=2).verdict == HOLDS
    assert judge("ecl increasing", data, cols=["10", "50", "100"], min_seeds=2).verdict == FAILS
    flat = judge("ecl flat within 12", data, cols=["10", "50", "100"], min_seeds=2)
    assert flat.tests[0].per_seed == {0: 10.0, 1: 11.0} and flat.verdict == HOLDS  # ranges 10 and 11, mean margin 1.5
    # a trend of a difference: gains 8, 5, 4 over α = 0.2, 0.8, 1.0 fall
    gain = {
        "e": {"0.2": {0: 89.0}, "0.8": {0: 90.0}, "1": {0: 91.0}},
        "f": {"0.2": {0: 81.0}, "0.8": {0: 85.0}, "1": {0: 87.0}},
    }
    assert judge("e - f decreasing", gain, cols=["0.2", "0.8", "1"], min_seeds=1).verdict == HOLDS


def test_closeness_only_at_paper_scale():
    data = {"fedrema": {None: {0: 98.3, 1: 98.6, 2: 98.4}}, "local": {None: {0: 93.0, 1: 92.8, 2: 93.1}}}
    paper = {"fedrema": {None: 98.5}, "local": {None: 94.3}}
    out = judge("close within 0.5", data, paper=paper, tolerance=0.0)
    assert [(t.label, t.verdict) for t in out.tests] == [
        ("|fedrema − paper 98.5|", HOLDS),
        ("|local − paper 94.3|", FAILS),
    ]
    assert out.verdict == FAILS
    assert judge("close within 0.5", data, paper=paper, paper_scale=False).verdict == NOT_COMPARABLE
    assert judge("fedrema > local", {}).verdict == NOT_RUN


def test_predicate_texts():
    assert parse("fedrema > local > fedavg").terms == (("fedrema",), ("local",), ("fedavg",))
    assert parse("ecl - fedavg_ft >= 0").kind == "diff"
    assert parse("|ecl - ecl_m3| < 1.5").bound == 1.5
    assert parse("ecl - fedavg_ft decreasing").terms == ("ecl", "fedavg_ft")
    assert parse("fedavg < 0").names == ["fedavg"]
    for bad in ("fedrema >> fedavg", "a > b < c", "1 > 2", "fedrema beats fedavg", "flat within 2"):
        with pytest.raises(PredicateError):
            parse(bad)


# ---- the claims files ----------------------------------------------------------------------------------------------


def test_every_claims_file_loads_composes_and_holds_on_its_paper_numbers():
    """Five papers, 3-6 claims each, every scale's experiments compose (Hydra's compose API) and validate, every name
    a predicate uses is a value its runs take, and each predicate is true of the numbers it was transcribed from."""
    assert papers() == PAPERS
    for paper in PAPERS:
        pc = load(paper)
        assert 3 <= len(pc.claims) <= 6, paper
        assert set(pc.scales) == {"paper", "cpu", "smoke"}
        assert check(pc) == [], paper


def _claims_file(tmp_path: Path, claims: list, name="toy") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "paper": name,
                "scales": {"smoke": {"seeds": [0, 1, 2], "overrides": ["rounds=1", "clients=4"]}},
                "experiments": {
                    "grid": {"smoke": {"experiment": "smoke", "sweep": {"algorithm": ["local", "fedavg"]}}}
                },
                "claims": claims,
            }
        )
    )
    return path


CLAIM = {
    "id": "c",
    "claim": "FedAvg beats Local.",
    "source": "nowhere",
    "experiment": "grid",
    "metric": "pers/acc.best",
    "holds_if": "fedavg > local",
    "paper": {"fedavg": 60.0, "local": 50.0},
}


def test_bad_claims_files_are_refused_with_the_place_and_the_reason(tmp_path):
    cases = [
        ({**CLAIM, "holds_iff": "x"}, "unknown field 'holds_iff'"),
        ({k: v for k, v in CLAIM.items() if k != "metric"}, "missing 'metric'"),
        ({**CLAIM, "holds_if": "fedavg beats local"}, "is none of"),
        ({**CLAIM, "experiment": "nope"}, "experiment 'nope'"),
        ({**CLAIM, "holds_if": "fedavg decreasing"}, "needs 'over: <swept key>'"),
        ({**CLAIM, "metric": "pers/acc.top"}, "needs one of .best"),
    ]
    for claim, message in cases:
        with pytest.raises(ClaimsError, match="claims\\[0\\]") as e:
            load_file(_claims_file(tmp_path, [claim]))
        assert message in str(e.value)
    # names and paper numbers are checked against the composed experiment
    pc = load_file(
        _claims_file(
            tmp_path, [{**CLAIM, "holds_if": "fedavg > fedprox"}, {**CLAIM, "id": "d", "holds_if": "local > fedavg"}]
        )
    )
    problems = check(pc)
    assert any("'fedprox' is not a value of choice:algorithm" in p for p in problems)
    assert any("d: 'local > fedavg' is fails on the paper's own numbers" in p for p in problems)
    # an experiment config that still sweeps a key the claims file leaves open (smoke.yaml sweeps algorithm)
    path = _claims_file(tmp_path, [CLAIM])
    node = yaml.safe_load(path.read_text())
    node["experiments"]["grid"]["smoke"]["sweep"] = {"local_epochs": [1, 2]}
    path.write_text(yaml.safe_dump(node))
    assert any(
        "smoke sweeps algorithm over local,fedavg,fedavg_ft and no override" in p for p in check(load_file(path))
    )


def test_extra_overrides_must_not_change_results():
    check_extra(["data_root=../shared/data", "hardware.threads=1", "hydra/launcher=parallel", "logger=offline"])
    with pytest.raises(ClaimsError, match="rounds=3"):
        check_extra(["rounds=3"])


# ---- a claim judged from hand-written run dirs -----------------------------------------------------------------------


def _write_run(sweep: Path, job: dict, num: int, value: float | None, status="complete"):
    """A run dir as fedbench writes it, for one job of the experiment."""
    algo, seed = job["algorithm"], int(job["seed"])
    d = sweep / f"{algo}_seed{seed}"
    (d / ".hydra").mkdir(parents=True)
    plain = {k: yaml.safe_load(v) for k, v in job.items() if k not in ("algorithm", "experiment", "seed")}
    (d / "config.yaml").write_text(yaml.safe_dump({**plain, "seed": seed, "algorithm": {"name": algo}}))
    (d / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump(
            {
                "hydra": {
                    "runtime": {"choices": {"algorithm": algo}},
                    "job": {"num": num},
                    "overrides": {"task": [f"{'+' if k == 'experiment' else ''}{k}={v}" for k, v in job.items()]},
                }
            }
        )
    )
    (d / "metrics.jsonl").write_text(
        json.dumps({"round": 1, "pers/acc": value, "time/round": 2.0, "time/eval": 0.5}) + "\n"
    )
    (d / "status.json").write_text(json.dumps({"status": status}))
    if status == "complete":
        (d / "summary.json").write_text(json.dumps({"metrics": {"pers/acc": {"best": value}}}))


def test_claim_from_run_dirs_pairs_seeds_across_runs_and_counts_missing_ones(tmp_path):
    """The runs of the experiment's jobs are found by their overrides; FedAvg's seeds are written in another order
    than Local's (paired by seed: +2, +3, +4; by position they would not all be positive); a failed run and a
    never-started one are counted, not averaged."""
    pc = load_file(_claims_file(tmp_path, [CLAIM]))
    exp = pc.experiments["grid"]["smoke"]
    jobs, _ = exp.jobs()
    sweep = tmp_path / "runs" / "smoke" / "toy"
    acc = {
        ("local", "0"): 0.50,
        ("local", "1"): 0.40,
        ("local", "2"): 0.60,
        ("fedavg", "2"): 0.64,
        ("fedavg", "0"): 0.52,
        ("fedavg", "1"): 0.43,
    }
    order = sorted(
        jobs,
        key=lambda j: (
            j["algorithm"],
            {"2": 0, "0": 1, "1": 2}[j["seed"]] if j["algorithm"] == "fedavg" else int(j["seed"]),
        ),
    )
    for i, job in enumerate(order):
        _write_run(sweep, job, i, acc[(job["algorithm"], job["seed"])])
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    assert res.outcome.verdict == HOLDS
    assert res.outcome.tests[0].per_seed == pytest.approx({0: 2.0, 1: 3.0, 2: 4.0})
    assert res.data["fedavg"][None] == pytest.approx({2: 64.0, 0: 52.0, 1: 43.0})  # percent, as the report
    assert (res.n_complete, res.n_runs, res.seconds) == (6, 6, 15.0)
    # FedAvg seed 1 failed, Local seed 2 never started: two pairs left, fewer than min_seeds (3)
    shutil.rmtree(sweep / "local_seed2")
    (sweep / "fedavg_seed1" / "status.json").write_text(json.dumps({"status": "failed", "error": "RunFailed: test"}))
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    assert res.outcome.tests[0].per_seed == pytest.approx({0: 2.0})
    assert res.outcome.verdict == INCONCLUSIVE
    assert res.status == {"failed": 1, "missing": 1} and (res.n_complete, res.n_runs) == (4, 6)


def test_a_run_made_by_another_command_is_found_by_its_config(tmp_path):
    """A run whose recorded overrides lack one of its job's (`rounds=1`: e.g. a single run of an experiment whose
    defaults select that value anyway) and add a results-neutral one (`checkpoint.every=10`) is the job's run when its
    config.yaml has the job's values; the page names it. A run whose config differs (5 clients, not 4) is not taken,
    and neither is one whose overrides name another value (algorithm local for FedAvg's job)."""
    from fedbench.claims.render import to_markdown

    pc = load_file(_claims_file(tmp_path, [CLAIM]))
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    sweep = tmp_path / "runs" / "smoke" / "toy"
    for i, job in enumerate(jobs):
        _write_run(sweep, job, i, 0.5 + 0.02 * (job["algorithm"] == "fedavg") + 0.01 * int(job["seed"]))
    hydra = sweep / "fedavg_seed1" / ".hydra" / "hydra.yaml"
    node = yaml.safe_load(hydra.read_text())
    task = node["hydra"]["overrides"]["task"]
    assert "rounds=1" in task
    node["hydra"]["overrides"]["task"] = [o for o in task if o != "rounds=1"] + ["checkpoint.every=10"]
    hydra.write_text(yaml.safe_dump(node))
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    assert (res.n_complete, res.n_runs) == (6, 6) and res.outcome.tests[0].per_seed == pytest.approx({0: 2, 1: 2, 2: 2})
    assert list(res.adopted) == ["fedavg_seed1"] and "local_epochs" in res.adopted["fedavg_seed1"]
    page = to_markdown(pc, [res], ["smoke"], tmp_path / "runs", {}, {})
    assert "Run `fedavg_seed1` was made by another command" in page and "`local_epochs`" in page
    config = sweep / "fedavg_seed1" / "config.yaml"
    config.write_text(config.read_text().replace("clients: 4", "clients: 5"))
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    assert res.status == {"missing": 1} and not res.adopted and set(res.outcome.tests[0].per_seed) == {0, 2}
    config.write_text(config.read_text().replace("clients: 5", "clients: 4"))
    node["hydra"]["overrides"]["task"] = [
        o.replace("algorithm=fedavg", "algorithm=local") for o in node["hydra"]["overrides"]["task"]
    ]
    hydra.write_text(yaml.safe_dump(node))
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    assert res.status == {"missing": 1} and not res.adopted


def test_where_picks_the_runs_of_one_swept_value(tmp_path):
    """A claim with `where: {local_epochs: 2}` reads only those runs: there FedAvg beats Local (+5 each seed); at
    local_epochs = 1 it loses (−5), so a claim that read both would be inconclusive."""
    path = _claims_file(tmp_path, [{**CLAIM, "where": {"local_epochs": 2}}])
    node = yaml.safe_load(path.read_text())
    node["experiments"]["grid"]["smoke"]["sweep"]["local_epochs"] = [1, 2]
    path.write_text(yaml.safe_dump(node))
    pc = load_file(path)
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    sweep = tmp_path / "runs" / "smoke" / "toy"
    for i, job in enumerate(jobs):
        sign = (1 if job["algorithm"] == "fedavg" else -1) * (1 if job["local_epochs"] == "2" else -1)
        _write_run(sweep / f"e{job['local_epochs']}", job, i, 0.5 + 0.025 * sign + 0.01 * int(job["seed"]))
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    assert res.outcome.tests[0].per_seed == pytest.approx({0: 5.0, 1: 5.0, 2: 5.0}) and res.outcome.verdict == HOLDS
    assert res.n_runs == 6


def test_metric_at_mean_is_the_mean_over_the_logged_rounds(tmp_path):
    """`<metric>@mean` (FedKA's forgetting degree over the rounds it was computed): rounds 0..3 log τ at 1 and 3
    only (0.2, 0.6) -> 0.4; a run that never logged it has no value."""
    from fedbench.report import Report, Table, collect

    d = tmp_path / "run"
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"runtime": {"choices": {"algorithm": "fedavg"}}, "overrides": {"task": ["seed=0"]}}})
    )
    (d / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "algorithm": {"name": "fedavg"}}))
    rows = [
        {"round": 0, "global/acc": 0.1},
        {"round": 1, "forgetting/missing": 0.2},
        {"round": 2, "global/acc": 0.3},
        {"round": 3, "forgetting/missing": 0.6},
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "status.json").write_text(json.dumps({"status": "complete"}))
    (d / "summary.json").write_text(json.dumps({"metrics": {}}))
    spec = {
        "paper": "p",
        "id": "t",
        "rows": "choice:algorithm",
        "cols": None,
        "metrics": {"tau": "forgetting/missing@mean", "none": "forgetting/dominant@mean"},
    }
    [run] = collect([tmp_path])
    rep = Report(Table(spec, [(run, spec)]))
    assert rep.cells[("fedavg", "tau")].values == pytest.approx([0.4])
    assert rep.cells[("fedavg", "none")].other == {"no value": 1}


def test_paper_data_is_one_pseudo_seed():
    assert paper_data({"a": 1.0, "b": {"0.2": 3.0}}, [None]) == {"a": {None: {0: 1.0}}}
    assert paper_data({"b": {"0.2": 3.0}}, ["0.2"]) == {"b": {"0.2": {0: 3.0}}}


# ---- end to end at the smoke scale -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("paper", PAPERS)
def test_smoke_scale_runs_and_reports_every_claim(paper, tmp_path, cache_dir, capsys):
    """`fedbench-claims run <paper> --scale smoke` runs every experiment (digits, seconds); every claim then has
    values at that scale (its metric exists), the page, CSV and pictures are written, and a second `run` reuses the
    finished runs (nothing is launched again)."""
    runs, out = tmp_path / "runs", tmp_path / "results"
    common = ["--runs", str(runs)]
    assert main(["run", paper, "--scale", "smoke", *common, "hardware.threads=1", f"cache_dir={cache_dir}"]) == 0
    launches = (runs / "smoke" / paper / "claims_launches.jsonl").read_text().splitlines()
    assert launches and all(json.loads(ln)["exit"] == 0 for ln in launches)
    assert main(["report", paper, "--scale", "smoke", *common, "--out", str(out)]) == 0
    pc = load(paper)
    lines = list(csv.DictReader((out / f"{paper}.csv").open()))
    verdicts = {ln["claim"]: ln["verdict"] for ln in lines}
    assert set(verdicts) == {c.id for c in pc.claims}
    for c in pc.claims:
        if c.predicate.kind == "close":
            assert verdicts[c.id] == NOT_COMPARABLE
        else:  # every test has its n = 2 seeds: the metric exists and both seeds paired
            assert verdicts[c.id] in (HOLDS, FAILS, INCONCLUSIVE), (c.id, verdicts[c.id])
            assert all(ln["n"] == "2" for ln in lines if ln["claim"] == c.id), c.id
            assert (out / paper / f"{c.id}_smoke.png").stat().st_size > 1000
    md = (out / f"{paper}.md").read_text()
    assert md.count("| smoke |") == len(pc.claims) + 1 and f"fedbench-claims run {paper} --scale smoke" in md
    printed = capsys.readouterr().out
    assert all(c.id in printed for c in pc.claims)
    before = sorted(p.name for p in (runs / "smoke" / paper).iterdir())
    assert main(["run", paper, "--scale", "smoke", *common, "hardware.threads=1", f"cache_dir={cache_dir}"]) == 0
    assert sorted(p.name for p in (runs / "smoke" / paper).iterdir()) == before
    assert (runs / "smoke" / paper / "claims_launches.jsonl").read_text().splitlines() == launches
    assert main(["report", paper, "--scale", "smoke", *common, "--out", str(out), "--no-plots"]) == 0
    again = (out / f"{paper}.md").read_text()  # the same runs give the same page (but pictures)
    assert "![" not in again and [ln for ln in again.splitlines() if "| smoke |" in ln] == [
        ln for ln in md.splitlines() if "| smoke |" in ln
    ]


def test_report_page_csv_and_wandb_table_from_hand_written_runs(tmp_path):
    """The page (summary, claim line, per-seed details, picture), the CSV (one line per test) and, with --wandb
    offline, a W&B run holding the table — read back from W&B's own files."""
    import wandb
    from wandb_files import read_run

    from fedbench.claims import report

    pc = load_file(_claims_file(tmp_path, [CLAIM]))
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    acc = {"local": [0.50, 0.40, 0.60], "fedavg": [0.52, 0.43, 0.64]}
    for i, job in enumerate(jobs):
        _write_run(tmp_path / "runs" / "smoke" / "toy", job, i, acc[job["algorithm"]][int(job["seed"])])
    out = tmp_path / "results"
    [res] = report(pc, ["smoke"], tmp_path / "runs", out, wandb="offline")
    wandb.teardown()  # flushes the offline files
    assert res.outcome.verdict == HOLDS
    md = (out / "toy.md").read_text()
    assert (
        "| **c**: FedAvg beats Local. | FedAvg 60, Local 50 | FedAvg 53.00 ± 8.60, Local 50.00 ± 8.16 (n = 3 seeds) "
        "| **holds** | smoke |" in md
    )
    assert "| fedavg − local > 0 |  | 0: +2.00, 1: +3.00, 2: +4.00 | +3.00 ± 0.82 | holds |" in md
    assert "![c (smoke)](toy/c_smoke.png)" in md and (out / "toy" / "c_smoke.png").stat().st_size > 1000
    assert (
        str(tmp_path) not in md and "hydra.sweep.dir=<runs>/smoke/toy`" in md
    )  # a committed page names no machine path
    [line] = list(csv.DictReader((out / "toy.csv").open()))
    assert (line["claim"], line["verdict"], line["n"], line["bound"]) == ("c", "holds", "3", "> 0")
    assert {int(k): float(v) for k, v in (x.split(":") for x in line["per_seed"].split(";"))} == pytest.approx(
        {0: 2.0, 1: 3.0, 2: 4.0}
    )
    [logged] = [row for row in read_run(out / "toy")["history"] if "claims/toy/_type" in row]
    assert logged["claims/toy/_type"] == "table-file" and logged["claims/toy/nrows"] == 1


def test_claim_ids_are_never_cut_in_the_printed_table(tmp_path):
    """However narrow the terminal (COLUMNS=60 under CI), the printed table keeps each claim id whole."""
    import io

    from rich.console import Console

    from fedbench.claims.render import print_rich

    pc = load_file(_claims_file(tmp_path, [{**CLAIM, "id": "a_rather_long_claim_identifier"}]))
    jobs, _ = pc.experiments["grid"]["smoke"].jobs()
    for i, job in enumerate(jobs):
        _write_run(tmp_path / "runs" / "smoke" / "toy", job, i, 0.5 + 0.01 * i)
    res = evaluate_claim(pc, pc.claims[0], RunSet(pc, "smoke", tmp_path / "runs"))
    buf = io.StringIO()
    print_rich(pc, [res], Console(width=60, file=buf))
    assert "a_rather_long_claim_identifier" in buf.getvalue()
