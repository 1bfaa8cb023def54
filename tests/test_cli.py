"""End to end through the real CLI, Hydra's compose API, multirun and wandb offline files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_cfg, run_cfg
from wandb_files import read_run

FEDBENCH = [sys.executable, "-m", "fedbench.cli"]


def cli(*args, cwd: Path, check=True):
    env = {**os.environ, "WANDB_MODE": "offline", "FEDBENCH_CACHE": str(cwd / "cache")}
    p = subprocess.run([*FEDBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_three_round_cli_run_with_wandb_offline(tmp_path):
    run_dir = tmp_path / "run"
    cli(
        "rounds=3",
        "clients=6",
        "logger=offline",
        "logger.console=false",
        "logger.wandb.tags=[mine]",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete"
    assert json.loads((run_dir / "status.json").read_text())["status"] == "complete"
    rows = [r for r in jsonl(run_dir / "metrics.jsonl") if "pers/acc" in r]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert (run_dir / "partition.png").stat().st_size > 0
    assert (run_dir / "partition_counts.csv").read_text().count("\n") == 7  # header + 6 clients
    wb = read_run(run_dir)
    logged = {h["_step"] for h in wb["history"] if "pers/acc" in h}
    assert logged == {0, 1, 2, 3}  # every round reached W&B
    accs = {h["_step"]: h["pers/acc"] for h in wb["history"] if "pers/acc" in h}
    assert accs[3] == pytest.approx(rows[-1]["pers/acc"])
    assert any("partition" in k for h in wb["history"] for k in h)  # the partition heatmap as an image
    assert wb["config"]["rounds"] == 3 and wb["config"]["algorithm"]["name"] == "fedavg"
    assert wb["summary"]["pers/acc/best"] == pytest.approx(summary["metrics"]["pers/acc"]["best"])
    # named by method, dataset, the overrides given that change results (not logger.*, hydra.*), seed; tagged
    assert wb["name"] == "fedavg digits rounds=3 clients=6 seed=0" and wb["job_type"] == "run"
    assert wb["tags"] == ["algorithm:fedavg", "dataset:digits", "mine"]


def test_compose_api_run_is_reproducible(tmp_path):
    a = run_cfg(make_cfg("seed=3"), tmp_path / "a")
    b = run_cfg(make_cfg("seed=3"), tmp_path / "b")
    run_cfg(make_cfg("seed=4"), tmp_path / "c")
    assert a["metrics"] == b["metrics"] and a["final"] == b["final"]
    assert (tmp_path / "a" / "partition_counts.csv").read_text() == (
        tmp_path / "b" / "partition_counts.csv"
    ).read_text()
    assert (tmp_path / "a" / "partition_counts.csv").read_text() != (
        tmp_path / "c" / "partition_counts.csv"
    ).read_text()


def test_two_by_two_multirun_shares_a_wandb_group(tmp_path):
    sweep = tmp_path / "sweep"
    cli(
        "-m",
        "algorithm=local,fedavg",
        "seed=0,1",
        "rounds=2",
        "clients=4",
        "logger=offline",
        "logger.console=false",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    runs = sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())
    assert len(runs) == 4
    seen, names = set(), set()
    for r in runs:
        cfg = (r / ".hydra" / "config.yaml").read_text()
        seen.add((cfg.split("algorithm:\n  name: ")[1].split("\n")[0], cfg.split("\nseed: ")[1].split("\n")[0]))
        assert json.loads((r / "status.json").read_text())["status"] == "complete"
        wb = read_run(r)
        assert wb["group"] == sweep.name and wb["job_type"] == "sweep"
        names.add(wb["name"])
    assert seen == {("local", "0"), ("local", "1"), ("fedavg", "0"), ("fedavg", "1")}
    # what varies between the jobs and the seed; not rounds=2 clients=4 (the same for every job)
    assert names == {"local digits seed=0", "local digits seed=1", "fedavg digits seed=0", "fedavg digits seed=1"}
    # the sweep's table of jobs, as a W&B Table in a W&B run of the sweep's own (sweep dir/wandb)
    own = read_run(sweep)
    assert own["job_type"] == "sweep-summary" and own["group"] == sweep.name
    [row] = [h for h in own["history"] if "sweep/jobs/path" in h]
    table = json.loads((next(sweep.glob("wandb/*run-*/files")) / row["sweep/jobs/path"]).read_text())
    metric = table["columns"][3].removesuffix(" best")
    assert table["columns"] == ["job", "overrides", "status", f"{metric} best", "final", "seconds"]
    summaries = {r.name: json.loads((r / "summary.json").read_text())["metrics"][metric] for r in runs}
    assert sorted(d[0] for d in table["data"]) == [1, 2, 3, 4] and {d[2] for d in table["data"]} == {"complete"}
    assert {d[1] for d in table["data"]} == {
        "algorithm=local seed=0",
        "algorithm=local seed=1",
        "algorithm=fedavg seed=0",
        "algorithm=fedavg seed=1",
    }
    assert sorted((d[3], d[4]) for d in table["data"]) == sorted((s["best"], s["final"]) for s in summaries.values())


def test_help_lists_groups(tmp_path):
    out = cli("--help", cwd=tmp_path).stdout
    for group in ("algorithm:", "dataset:", "partition:", "model:", "hardware:", "logger:"):
        assert group in out
    assert "fedavg" in out and "dominant_groups" in out and "alexnet" in out
    groups = out.split("== Config groups")[1].split("== Top-level keys")[0]
    assert "+experiment" in groups and "fedrema/table3" in groups and "cafeme/table1" in groups
    for internal in ("claims", "dataset_defaults", "setting", "column", "arm/"):  # fedbench's own, the tables' parts
        assert internal not in groups, internal


BAD = [
    (["algorithm=fedfoo"], "algorithm='fedfoo'", "one of"),
    (["roundz=3"], "unknown key 'roundz'", "fedbench --cfg job"),
    (["rounds=abc"], "rounds='abc'", "an integer >= 1"),
    (["participation=1.5"], "participation=1.5", "(0, 1]"),
    (["participation=0"], "participation=0", "(0, 1]"),
    # issue #37: inputs that were accepted silently
    (["participation=0.01"], "participation=0.01", "at least 0.025 with clients=20 (half a client, taken as one): 0.2"),
    (["participation=0.024"], "participation=0.024", "at least 0.025 with clients=20"),
    (["eval.personalized=false", "eval.global_model=false"], "eval.personalized=False", "would measure nothing"),
    (["-m", "rounds=2,-1"], "rounds=-1", "an integer >= 1"),
    (["partition.alpha=0"], "partition.alpha=0", "0 < alpha"),
    (
        ["partition=shards", "partition.num_shards=30", "clients=7"],
        "partition.num_shards=30",
        "clients × shards_per_client = 14",
    ),
    (["clients=5000"], "clients=5000", "number of train samples"),
    (["model=cnn"], "model='cnn'", "1x8x8"),
    (["hardware=cuda"], "hardware.device='cuda'", "CUDA is not available"),
    (["dataset=mnist", "dataset.root=/nonexistent"], "dataset.root='/nonexistent'", "looked in"),
    (["optim.name=rmsprop"], "optim.name='rmsprop'", "sgd, adam"),
    (["+experiment=fedrema/nope"], "experiment='fedrema/nope'", "fedrema/table3"),
    (["batch_size=0"], "batch_size=0", "an integer >= 1"),
    (["eval_every=1.5"], "eval_every=1.5", "an integer >= 1"),
    (["hardware.executor=gpu"], "hardware.executor='gpu'", "auto, sequential, vectorized"),
    (["logger.wandb.mode=cloud"], "logger.wandb.mode='cloud'", "offline"),
    (["partition=complementary_pairs", "clients=7"], "clients=7", "2 × number of class pairs"),
    (["algorithm=fedcom"], "partition", "complementary_pairs"),
    (["partition=dominant_groups", "partition.s=1.5"], "partition.s=1.5", "s ≤ 1"),
    (["algorithm=ecl", "algorithm.num_experts=0"], "algorithm.num_experts=0", "an integer >= 1"),
    (["hardware.workers=0"], "hardware.workers=0", "auto or an integer >= 1"),
    # issue #54: a group's name alone ran one option's keys with another's code ("Key 'root' is not in struct")
    (
        ["dataset.name=mnist"],
        "dataset.name='mnist'",
        "use dataset=mnist to choose it; dataset.name is set by the group",
    ),
    (["-m", "model.name=mlp,cnn"], "model.name='cnn'", "use model=cnn to choose it; model.name is set by the group"),
    (["algorithm.name=nosuch"], "algorithm.name='nosuch'", "choose algorithm=<one of cafeme, ditto,"),
]


# found by the run's own checks before training (partition, model, data, hardware, algorithm setup), not the pre-check
AT_SETUP = {
    "partition.alpha=0",
    "partition=shards partition.num_shards=30 clients=7",
    "clients=5000",
    "model=cnn",
    "hardware=cuda",
    "dataset=mnist dataset.root=/nonexistent",
    "partition=complementary_pairs clients=7",
    "algorithm=fedcom",
    "partition=dominant_groups partition.s=1.5",
    "algorithm=ecl algorithm.num_experts=0",
}
PRECHECKED = [b for b in BAD if " ".join(b[0]) not in AT_SETUP]


@pytest.mark.parametrize("args,key,allowed", PRECHECKED, ids=[" ".join(a) for a, _, _ in PRECHECKED])
def test_bad_config_one_line_from_the_precheck(args, key, allowed, capsys):
    """In this process, the pre-check that `fedbench` runs before Hydra: one line naming key, value, what is allowed."""
    line = refused(capsys, *args, "logger=none")
    assert line.startswith("fedbench: ") and key in line and allowed in line


THROUGH_CLI = [b for b in BAD if " ".join(b[0]) in AT_SETUP] + [BAD[0], BAD[5]]  # + a pre-checked run and sweep


@pytest.mark.parametrize("args,key,allowed", THROUGH_CLI, ids=[" ".join(a) for a, _, _ in THROUGH_CLI])
def test_bad_config_one_line_before_training(tmp_path, args, key, allowed):
    run_dir = tmp_path / "run"
    p = cli(
        *args,
        "logger=none",
        f"hydra.run.dir={run_dir}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        check=False,
    )
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("fedbench: ") and key in lines[0] and allowed in lines[0]
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "summary.json").exists()


def test_quoted_values_pass_the_check_as_typed(tmp_path):
    """The pre-check re-composes overrides exactly as typed: quoted strings with spaces or '=' survive."""
    p = cli("data_root='/tmp/a b=c'", "logger.wandb.tags=[x,'y z']", "--cfg", "job", cwd=tmp_path)
    assert "data_root: /tmp/a b=c" in p.stdout and "- y z" in p.stdout


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    p = cli("logger=none", f"hydra.run.dir={blocker / 'run'}", cwd=tmp_path, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == (
        f"fedbench: invalid config: hydra.run.dir='{blocker / 'run'}' — a directory path "
        f"({blocker} is an existing file)"
    )


# ---- the pre-check in-process (fedbench.overrides.precheck: what `fedbench ...` runs before Hydra) -------------------
def refused(capsys, *args) -> str:
    """The one line (exit 2) with which the pre-check refuses ``args``."""
    from fedbench.cli import precheck

    with pytest.raises(SystemExit) as e:
        precheck(list(args))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1, lines
    return lines[0]


TYPOS = [
    (["algorithm=fedrmea"], "algorithm='fedrmea' — did you mean fedrema? one of cafeme,"),
    (["-m", "partition=dirichlet,shrads"], "partition='shrads' — did you mean shards? one of"),
    (["+experiment=fedrema/tabel3"], "experiment='fedrema/tabel3' — did you mean fedrema/table3? one of"),
    (["lrr=0.1"], "unknown key 'lrr' — did you mean lr? (`fedbench --cfg job` lists the keys)"),
    (["optim.lrr=0.1"], "unknown key 'optim.lrr' — did you mean optim.lr?"),
    (["algorithm=fedrema", "delta=0.3"], "unknown key 'delta' — did you mean algorithm.delta?"),  # issue #36
    (["partition=dirichlet", "alpha=0.3"], "unknown key 'alpha' — did you mean partition.alpha?"),
    (["algoritm=fedavg"], "unknown key 'algoritm' — did you mean algorithm?"),
    # + or ++ adds a key to the config, but no part of fedbench would read it: refused too, not silently ignored
    (["+lrr=0.1"], "unknown key 'lrr' — +lrr=... adds a key that nothing reads; did you mean lr?"),
    (["++lrr=0.1"], "unknown key 'lrr' — ++lrr=... adds a key that nothing reads; did you mean lr?"),
    (
        ["+algorithm.muu=0.1", "algorithm=fedprox"],
        "unknown key 'algorithm.muu' — +algorithm.muu=... adds a key that nothing reads; did you mean algorithm.mu?",
    ),
]


@pytest.mark.parametrize("args,expected", TYPOS, ids=[" ".join(a) for a, _ in TYPOS])
def test_a_typo_gets_did_you_mean(capsys, args, expected):
    line = refused(capsys, *args, "logger=none")
    assert line.startswith("fedbench: invalid config: ") and expected in line, line


def test_force_add_and_extension_keys_pass_the_check_as_typed(capsys):
    """``++key=v`` reaches the compose as ``++key=v`` (it was rewritten to ``key=v``, so Hydra refused a key that is
    not in the defaults: "Could not override 'data_schedule'"); ``+``/``++`` may add the keys a run reads without a
    default (cli.EXTENSIONS) and a nested experiment group (docs/fedrema.md)."""
    from fedbench.cli import precheck

    schedule = "[{round:2,client:0,class:6,keep:5}]"
    for args in (
        ["++rounds=2"],
        [f"++data_schedule={schedule}"],
        [f"+data_schedule={schedule}"],
        ["+experiment=fedrema/table1", "+experiment/fedrema/setting@_global_=mnist"],
    ):
        precheck([*args, "logger=none"])  # accepted: no exit
        assert capsys.readouterr().err == "", args
    assert "rounds='abc' — an integer >= 1" in refused(capsys, "++rounds=abc")  # ++ on a known key is still checked


def test_experiment_offers_the_real_tables_not_their_parts(capsys):
    from fedbench.cli import experiments, options
    from fedbench.report.catalog import experiment_tables

    public = experiments()
    assert {t["name"] for t in experiment_tables()} <= set(public) and "fedka/figure3" in public and "smoke" in public
    parts = set(options("experiment")) - set(public)
    assert {"fedka/setting", "fedrema/setting/mnist", "cafeme/column/rmnist_shards", "fedka/arm/fedavg"} <= parts
    line = refused(capsys, "+experiment=fedrema/setting/mnist")
    assert "not an experiment of its own" in line and "fedrema/table3" in line
    assert "setting" not in line.split("one of")[1] and "/arm/" not in line and "column" not in line
    line = refused(capsys, "+experiment=nope")
    assert "fedrema/table3" in line and "setting" not in line.split("one of")[1]


def test_no_did_you_mean_when_nothing_is_close(capsys):
    line = refused(capsys, "algorithm=xyzzy")
    assert "did you mean" not in line and "algorithm='xyzzy' — one of cafeme, ditto" in line
    assert "did you mean" not in refused(capsys, "qqqq=1")


def test_a_key_given_twice_is_said_and_the_last_one_used(capsys):
    """Issue #37: `rounds=3 rounds=4` kept the last silently; now one line says so (scripts append overrides to
    replace earlier ones, so it is not refused). Half a client per round (0.025 × 20) is taken as one: accepted."""
    from fedbench.cli import precheck

    precheck(["rounds=3", "rounds=4", "participation=0.025", "logger=none"])
    err = capsys.readouterr().err
    assert err == "fedbench: rounds is given twice (rounds=3, rounds=4); the last one is used\n"
    from hydra import compose, initialize_config_dir

    from fedbench.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        assert compose("config", overrides=["rounds=3", "rounds=4"]).rounds == 4


def test_a_group_name_that_the_group_has_passes(capsys):
    """``dataset.name=digits`` with dataset=digits (the default) changes nothing: accepted without a word."""
    from fedbench.cli import precheck

    precheck(["dataset.name=digits", "model=tcnn", "model.name=cnn", "logger=none"])  # tcnn's own name is cnn
    assert capsys.readouterr().err == ""


def test_a_signal_with_checkpoints_on_signal_off_names_the_newest_checkpoint(tmp_path):
    """Issue #54: with checkpoint.on_signal=false a SIGTERM said "nothing to save yet" although periodic checkpoints
    were there (and a re-run resumed from them)."""
    import signal
    import time

    from fedbench import checkpoint as ckpt

    run_dir = tmp_path / "run"
    env = {**os.environ, "FEDBENCH_CACHE": str(tmp_path / "cache")}
    args = ["rounds=100000", "clients=4", "local_epochs=1", "logger=none", "hardware.threads=1"]
    args += ["checkpoint.every=1", "checkpoint.on_signal=false", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([*FEDBENCH, *args], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not (ckpt.directory(run_dir) / "round_000002.pt").exists() and proc.poll() is None:
            assert time.time() < deadline, "no checkpoint of round 2 in 300 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    newest = ckpt.read_latest(run_dir)["round"]
    assert proc.returncode == 128 + signal.SIGTERM and newest >= 2, err[-3000:]
    assert err == (
        f"fedbench: SIGTERM received: not saved now (checkpoint.on_signal=false); the newest checkpoint is of round "
        f"{newest}, in {run_dir}; re-run the same command to resume\n"
    )


def test_a_glob_sweep_is_checked_over_the_options_it_matches(capsys):
    """``-m algorithm=glob(fedavg_l*)`` was a traceback in the pre-check (Hydra's "ConfigLoader is not set"); it picks
    the options it matches, as Hydra's sweep does."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from fedbench.overrides import _values, precheck

    (o,) = OverridesParser.create().parse_overrides(["algorithm=glob([fedavg_l*,fedpro*],exclude=fedproto)"])
    assert _values(o) == ["fedavg_lws", "fedprox", "fedprox_rema"]
    precheck(["-m", "algorithm=glob(fedavg_l*)", "logger=none"])  # accepted
    assert capsys.readouterr().err == ""


def test_help_resolver_is_registered_wherever_fedbench_is_imported():
    """``fb_help_groups`` (conf/hydra/help/fedbench.yaml) was registered by fedbench.cli only: a command that resolves
    a run's whole config, hydra node included, without importing cli (fedbench-claims finding a run made by another
    command) failed with UnsupportedInterpolationType. Any fedbench entry point registers it now."""
    code = (
        "import fedbench.claims.results\n"
        "from omegaconf import OmegaConf\n"
        "cfg = OmegaConf.create({'help': '${fb_help_groups:}'})\n"
        "text = cfg.help\n"
        "assert text.startswith('algorithm: ') and '+experiment (' in text, text\n"
        "import sys; assert 'fedbench.cli' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
