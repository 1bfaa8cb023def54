"""Every shell command written in README.md and docs/*.md works as written (issue #20 item 2).

The commands are read from the fenced code blocks: a line (joined over ``\\`` continuations) whose first word is
``fedbench``, ``fedbench-report``, ``fedbench-tables``, ``fedbench-claims`` or ``make`` — split as the shell splits it
(quotes, ``# comments``, ``$FEDBENCH_DATA``). To stay cheap (the whole file in well under a minute on 2 cores) most
commands are checked, not run; a few representative ones run for real:

* ``fedbench``: every command goes through the CLI's own pre-check (``fedbench.overrides.precheck``: every group option,
  key and value, every value of a sweep, the data root of a real dataset) exactly as the console script does, and its
  first job is composed (a sweep's keys — on the command line or in the experiment's ``hydra.sweeper.params`` — at their
  first value); a job on generated data (digits, synthetic) is also set up (data, partition, model, algorithm, which
  checks the algorithm's options). The README's quick-start runs on digits (``RUN``) really run, in this process, with
  ``rounds=1 logger=none logger.pictures=false hardware.threads=1`` and a run/sweep dir under ``tmp_path`` (a sweep: its
  first job).
* ``fedbench-report``: runs on a real (digits, one job, one round) sweep made here — a placeholder (``<sweep>``) or a
  sweep dir that only a paper-scale command would make stands for it; ``[...]`` parts are optional and left out;
  ``--wandb`` becomes ``--no-wandb`` (W&B logging has its own tests in test_report.py).
* ``fedbench-tables``: runs as written (``--markdown`` writes under ``tmp_path``, never docs/tables.md).
* ``fedbench-claims``: its subcommand, paper and scale are checked here; what they do is tests/test_claims.py's.
* ``make <target>``: ``make -n`` (the target exists), then the recipe's ``fedbench`` line is pre-checked as above.
* ``torchrun ... -m fedbench <args>`` and ``srun ... fedbench <args>``: every launcher flag is one the launcher has
  (torchrun's own ``--help``; srun's flags are not checked: there is no SLURM here), then ``fedbench <args>`` is
  pre-checked as above (tests/test_distributed.py runs torchrun for real).

A command that needs ``../shared/data`` (or ``$FEDBENCH_DATA``) skips with the reason when the data is absent, and
one on a dataset that is not there (CIFAR-100, Tiny-ImageNet, FEMNIST, Fashion-MNIST) skips naming it.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, shared_data_dir

PROGRAMS = ("fedbench", "fedbench-report", "fedbench-tables", "fedbench-claims", "make", "torchrun", "srun")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PLACEHOLDER = "@SWEEP@"
# where each dataset lives under the data root (the ones a checkout's ../shared/data may hold)
DATA_DIRS = {"cifar10": "cifar10", "mnist": "MNIST", "rmnist": "MNIST"}
GENERATED = {"digits", "synthetic"}  # embedded / procedural: no data root needed
SMOKE = ["rounds=1", "logger=none", "logger.pictures=false", "hardware.threads=1"]


@dataclass
class DocCommand:
    source: str  # file:line
    text: str  # as written (continuations joined)

    @property
    def id(self) -> str:
        return f"{self.source} {self.text[:70]}"


def doc_commands(files=DOCS) -> list[DocCommand]:
    """The commands of the fenced code blocks of ``files``, in order."""
    out = []
    for f in files:
        lines, fenced, i = f.read_text().splitlines(), False, 0
        while i < len(lines):
            start, line = i, lines[i]
            i += 1
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            while fenced and line.rstrip().endswith("\\") and i < len(lines):
                line, i = line.rstrip()[:-1] + " " + lines[i].strip(), i + 1
            words = line.split()
            if fenced and words and words[0] in PROGRAMS:
                out.append(DocCommand(f"{f.relative_to(REPO)}:{start + 1}", line.strip()))
    return out


def shell_words(text: str, data: Path | None) -> list[str]:
    """argv as the shell gives it: optional ``[...]`` parts left out, ``<placeholder>`` words marked, ``$VAR`` expanded
    (``$FEDBENCH_DATA`` = the data dir), quotes removed, ``# comment`` dropped."""
    text = re.sub(r"\s\[[^\]]*\]", "", text)
    text = re.sub(r"[^\s'\"]*<[^>]*>[^\s'\"]*", PLACEHOLDER, text)
    env = {**os.environ, "FEDBENCH_DATA": str(data) if data else "../shared/data"}
    text = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), text)
    return shlex.split(text, comments=True)


COMMANDS = doc_commands()


def test_the_docs_have_commands():
    """The extraction finds the README's quick-start lines (so an empty list cannot pass silently)."""
    texts = [c.text for c in COMMANDS if c.source.startswith("README.md")]
    assert any(t.startswith("fedbench-report") for t in texts) and any(t.startswith("make demo") for t in texts)
    assert len(COMMANDS) > 20


# ---- running one command ---------------------------------------------------------------------------------------

# the commands that really run (file, their text up to the first comment): the README's quick start on digits
RUN = {
    ("README.md", "fedbench algorithm=fedrema partition=shards"),
    ("README.md", "fedbench -m algorithm=local,fedavg seed=0,1"),
}


class Session:
    """State across the commands of one test session: where the real runs went, and the sweep the reports read."""

    def __init__(self, root: Path):
        self.root = root
        self.sweep: Path | None = None
        self.no_sweep = ""  # why the sweep could not be made here (make test-fast skips runs): not tried again
        self.n = 0

    def fresh(self, kind: str) -> Path:
        self.n += 1
        return self.root / f"{kind}{self.n}"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return Session(tmp_path_factory.mktemp("docs"))


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~") if "=" in arg else ""


def _first_values(args: list[str]) -> list[str]:
    """Each sweep override of the command line (``a=x,y``, ``choice``, ``range``) given its first value only."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for a in args:
        if "=" in a and not a.startswith("-"):
            [o] = parser.parse_overrides([a])
            if o.is_sweep_override():
                a = f"{a.split('=', 1)[0]}={next(iter(o.sweep_string_iterator()))}"
        out.append(a)
    return out


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import fedbench.cli  # noqa: F401  (registers fedbench's resolvers)

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return compose("config", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def _sweeper_firsts(cfg, overrides: list[str]) -> list[str]:
    """``key=<first value>`` for every key of the composed ``hydra.sweeper.params`` the command does not set."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    params = cfg.hydra.sweeper.params
    given = {_key(a) for a in overrides}
    out = []
    for k, v in (OmegaConf.to_container(params) if params is not None else {}).items():
        if k.lstrip("+~") not in given:
            [o] = OverridesParser.create().parse_overrides([f"{k}={v}"])
            out.append(f"{k}={next(iter(o.sweep_string_iterator())) if o.is_sweep_override() else v}")
    return out


def _needs(cfg, data: Path | None) -> str | None:
    """Why this job cannot run here (a dataset that is not present), or None."""
    name = cfg.dataset.name
    if name in GENERATED:
        return None
    if data is None:
        return f"needs {name} from ../shared/data (or $FEDBENCH_DATA), which is absent"
    if name not in DATA_DIRS or not (data / DATA_DIRS[name]).exists():
        return f"needs {name}, which {data} does not hold"
    return None


def _call(fn, argv0: str, args: list[str]) -> int:
    saved = sys.argv
    sys.argv = [argv0, *args]
    try:
        code = fn()
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved
    return 0 if code is None else code if isinstance(code, int) else 1


def check_fedbench(args: list[str], session: Session, data: Path | None, run: bool) -> int:
    """The CLI's pre-check of the command as written, its first job composed (and set up on generated data); ``run``:
    the command itself, one round of its first job, through the console script's ``main``."""
    from omegaconf import OmegaConf

    from fedbench import cli
    from fedbench.run import Run
    from fedbench.sweep import SWEEP_FAILED

    if any(a in ("--help", "-h", "--shell-completion", "-sc") for a in args):
        return _call(cli.main, "fedbench", args)
    multirun = any(a in ("-m", "--multirun") for a in args)
    args = [
        a
        for a in args
        if _key(a) not in {"rounds", "logger", "hardware.threads", "hydra.run.dir", "hydra.sweep.dir"} or not run
    ]
    code = _call(lambda: cli.precheck(args), "fedbench", args)  # exits 2 with one line on a bad command
    if code:
        return code
    first = _first_values([a for a in args if "=" in a and not a.startswith("-")])
    first += _sweeper_firsts(_compose(first), first) if multirun else []
    cfg = _compose([*first, *SMOKE])
    if reason := _needs(cfg, data):
        pytest.skip(reason)
    if not run:
        if cfg.dataset.name in GENERATED:
            job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            Run(job, session.fresh("setup")).setup()  # data, partition, model, the algorithm's own checks
        return 0
    where = session.fresh("sweep" if multirun else "run")
    SWEEP_FAILED.clear()
    code = _call(
        cli.main,
        "fedbench",
        [*(_first_values(args) if multirun else args), *SMOKE, f"hydra.{'sweep' if multirun else 'run'}.dir={where}"],
    )
    if multirun and code == 0:
        session.sweep = where
    return code


def _sweep(session: Session) -> Path:
    """A real sweep for the report commands: the README's, else one job of the smoke table on digits made here."""
    if session.no_sweep:
        pytest.skip(session.no_sweep)
    if session.sweep is None:
        try:
            assert check_fedbench(["-m", "+experiment=smoke"], session, None, run=True) == 0
        except pytest.skip.Exception as e:
            session.no_sweep = e.msg
            raise
    return session.sweep


def run_report(args: list[str], session: Session) -> int:
    from fedbench.report import main

    dirs = [a for a in args if not a.startswith("-") and (a == PLACEHOLDER or a.startswith("outputs/"))]
    args = [str(_sweep(session)) if a in dirs else a for a in args]
    if "--wandb" in args:  # W&B logging: test_report.py; here no wandb process
        i = args.index("--wandb")
        args[i : i + (2 if i + 1 < len(args) and not args[i + 1].startswith("-") else 1)] = ["--no-wandb"]
    return main([*args, "--out", str(session.fresh("report"))])


def run_tables(args: list[str], session: Session) -> int:
    from fedbench.report import list_tables

    if "--markdown" in args:  # never rewrite the repository's docs/tables.md from a test
        i = args.index("--markdown")
        if i + 1 >= len(args) or args[i + 1].startswith("-"):
            args.insert(i + 1, str(session.fresh("tables") / "tables.md"))
            Path(args[i + 1]).parent.mkdir(parents=True)
    return list_tables(args)


def check_claims(args: list[str]) -> int:
    """The subcommand, the paper and the scale exist (running them: tests/test_claims.py)."""
    from fedbench.claims import SCALES, main, papers

    command, *rest = args
    assert command in ("run", "report", "record", "check", "summary", "plan"), command
    if command == "summary":  # reads the committed pages only: run it
        return main(["summary", *rest])
    named = [a for a in rest if not a.startswith("-") and "=" not in a]
    scale = rest[rest.index("--scale") + 1] if "--scale" in rest else None
    if scale:
        named.remove(scale)
        assert set(scale.split(",")) <= set(SCALES), scale
    assert set(named) <= {"all", *papers()}, named
    return 0


def check_make(args: list[str], session: Session, data: Path | None) -> int:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    p = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    for line in p.stdout.splitlines():  # the recipe's fedbench line (make test's pytest would run this test again)
        words = shlex.split(line)
        if words and Path(words[0]).name == "fedbench":
            return check_fedbench(words[1:], session, data, run=False)
    return 0


@functools.cache
def torchrun_help() -> str:
    """torchrun's ``--help`` (a Python that imports torch: seconds), read once for all the documented commands."""
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--help"], capture_output=True, text=True)
    return p.stdout


def check_launcher(program: str, args: list[str], session: Session, data: Path | None) -> int:
    """``torchrun [flags] -m fedbench <args>`` / ``srun [flags] fedbench <args>``: the launcher's flags, then fedbench's
    command pre-checked."""
    at = args.index("fedbench")
    flags, rest = args[: at - (program == "torchrun")], args[at + 1 :]
    if program == "torchrun":
        assert args[at - 1] == "-m", f"torchrun runs fedbench as a module: `torchrun ... -m fedbench`, not {args}"
        known = torchrun_help()
        for f in flags:
            if f.startswith("--"):
                assert f.split("=")[0] in known, f"torchrun has no flag {f}"
    return check_fedbench(rest, session, data, run=False)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command_works(cmd: DocCommand, session, monkeypatch, capfd):
    data = shared_data_dir()
    if data is None and ("shared/data" in cmd.text or "FEDBENCH_DATA" in cmd.text):
        pytest.skip("needs ../shared/data (or $FEDBENCH_DATA), which is absent")
    monkeypatch.chdir(REPO)  # ../shared/data is relative to the checkout
    monkeypatch.setenv("WANDB_MODE", "offline")
    if data is not None:
        monkeypatch.setenv("FEDBENCH_DATA", str(data))  # as the README asks: export FEDBENCH_DATA=../shared/data
    text = cmd.text
    if data is not None and not (REPO.parent / "shared" / "data").exists():  # a checkout elsewhere, data elsewhere:
        text = text.replace("../shared/data", str(data))  # the folder the command means
    program, *args = shell_words(text, data)
    if program == "fedbench":
        run = (cmd.source.split(":")[0], cmd.text.split("#")[0].strip()) in RUN
        code = check_fedbench(args, session, data, run)
    elif program == "fedbench-report":
        code = run_report(args, session)
    elif program == "fedbench-tables":
        code = run_tables(args, session)
    elif program == "fedbench-claims":
        code = check_claims(args)
    elif program in ("torchrun", "srun"):
        code = check_launcher(program, args, session, data)
    else:
        code = check_make(args, session, data)
    err = capfd.readouterr().err
    assert code == 0, f"{cmd.source}: `{cmd.text}` exited {code}:\n{err[-3000:]}"


def test_the_real_runs_are_documented():
    """The commands that run for real are still in the README (else this file would only check, never run)."""
    written = {(c.source.split(":")[0], c.text.split("#")[0].strip()) for c in COMMANDS}
    assert RUN <= written, RUN - written


def test_a_bad_command_fails_the_check(session, capfd):
    """The check is the CLI's: a misspelt option and a bad value exit 2 with one line, before anything runs."""
    assert check_fedbench(["algorithm=fedavgg"], session, None, run=False) == 2
    assert check_fedbench(["-m", "lr=0.1,-1"], session, None, run=False) == 2
    err = capfd.readouterr().err
    assert "algorithm='fedavgg'" in err and "lr" in err


def test_shell_completion_install_as_the_readme_says(capfd):
    """README: `eval "$(fedbench --shell-completion install=bash)"` — it prints Hydra's bash completion for fedbench."""
    from fedbench import cli

    assert 'eval "$(fedbench --shell-completion install=bash)"' in (REPO / "README.md").read_text()
    assert _call(cli.main, "fedbench", ["--shell-completion", "install=bash"]) == 0
    assert "complete -o nospace -o default -F hydra_bash_completion fedbench" in capfd.readouterr().out


def test_a_sweep_without_its_data_fails_once_before_any_job(tmp_path, monkeypatch, capfd):
    """README: `fedbench -m +experiment=fedrema/table3 scale=0.1 seed=0` with no data root printed the same 'cifar10
    not found' once per job (five) after launching them; now one line naming dataset.root and no job starts."""
    from fedbench import cli

    monkeypatch.chdir(tmp_path)  # no ./data here
    monkeypatch.delenv("FEDBENCH_DATA", raising=False)
    monkeypatch.setenv("FEDBENCH_CACHE", str(tmp_path / "cache"))  # no decoded copy either
    sweep = tmp_path / "sweep"
    code = _call(
        cli.main,
        "fedbench",
        ["-m", "+experiment=fedrema/table3", "scale=0.1", "seed=0", "logger=none", f"hydra.sweep.dir={sweep}"],
    )
    err = capfd.readouterr().err
    assert code == 2 and not sweep.exists()
    assert err.count("dataset.root='data'") == 1 and "data_root=" in err and "Launching" not in err, err


@pytest.mark.parametrize(
    "word,expected",
    [
        ("+experiment=fedrema/t", [f"+experiment=fedrema/table{i}" for i in range(1, 6)]),
        ("experiment=smo", ["experiment=smoke"]),
    ],
)
def test_experiment_completes_to_the_paper_tables(word, expected, monkeypatch, capfd):
    """`fedbench +experiment=<TAB>` (README): the paper tables one folder down, not only `smoke` (Hydra's own
    completion), and never an internal part (`fedrema/setting/...`)."""
    from fedbench import cli

    monkeypatch.setenv("COMP_LINE", f"fedbench algorithm=fedavg {word}")
    monkeypatch.setenv("COMP_POINT", str(len(f"fedbench algorithm=fedavg {word}")))
    assert _call(cli.main, "fedbench", ["-sc", "query=bash"]) == 0
    assert capfd.readouterr().out.split() == expected
    monkeypatch.setenv("COMP_LINE", "fedbench +experiment=")
    monkeypatch.setenv("COMP_POINT", "21")
    assert _call(cli.main, "fedbench", ["-sc", "query=bash"]) == 0
    listed = capfd.readouterr().out.split()
    assert "+experiment=fedka/table1" in listed and not any("setting" in w or "/arm/" in w for w in listed)
