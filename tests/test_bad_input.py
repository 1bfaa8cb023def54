"""Bad input: one line naming the key, the value and what is allowed, a non-zero exit, no traceback, and no run dir
(issue 19). A table over every top-level key (conf/config.yaml with its hardware and logger groups) and every group:
a wrong type, an out-of-range value and a missing value each, through the real ``fedbench`` entry point (in-process:
the pre-check, and Hydra's run of the job where the check needs the data)."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import CONF
from omegaconf import OmegaConf

from fedbench import checkpoint as ckpt
from fedbench import cli
from fedbench.config import CHECKS
from fedbench.errors import ConfigError

FAST = ["rounds=1", "clients=4", "local_epochs=1", "logger=none", "hardware.threads=1"]
NAME_MAX, PATH_MAX = os.pathconf(".", "PC_NAME_MAX"), os.pathconf(".", "PC_PATH_MAX")  # the system's path limits


def leaves(node: dict, prefix: str = ""):
    for k, v in node.items():
        if isinstance(v, dict) and v:
            yield from leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def top_level_keys() -> dict:
    """Every leaf of conf/config.yaml plus its default hardware and logger groups, with its resolved default."""
    node = yaml.safe_load((CONF / "config.yaml").read_text())
    for k in ("defaults", "hydra"):
        node.pop(k)
    for group, option in (("hardware", "auto"), ("logger", "default")):
        node[group] = yaml.safe_load((CONF / group / f"{option}.yaml").read_text())
    node.pop("data_root")  # ${oc.env:...}: a string
    node["eval"]["protocol"]["test_split"] = "local"  # ${partition.test_split}: the default partition's
    resolved = OmegaConf.to_container(OmegaConf.create(node), resolve=True)
    return {**dict(leaves(resolved)), "data_root": "data"}


# keys whose bad values are not the generic ones below: key -> (wrong type, out of range); None = no such value
SPECIAL = {
    "logger.wandb.tags": ("5", "[1]"),  # a list of strings
    "eval.similarity.save_rounds": ("5", "[0]"),  # a list of rounds >= 1
    "hardware.workers": ("abc", "0"),  # auto or an integer >= 1
    "optim.lr_decay_round": ("abc", "-1"),
    "eval.protocol.model": ("7", "nope"),
    "eval.protocol.clients": ("7", "nope"),
    "eval.protocol.statistic": ("7", "median"),
    "eval.protocol.test_split": ("7", "global"),  # follows partition.test_split (local by default)
}
FREE_TEXT = (
    "data_root",
    "cache_dir",
    "logger.wandb.project",
    "logger.wandb.entity",
    "logger.wandb.group",
    "eval.protocol.source",
)


def cases():
    out = []
    for key, default in top_level_keys().items():
        choice = key in CHECKS and CHECKS[key][1].startswith(("one of", "auto, cpu"))
        if key in SPECIAL:
            wrong, out_of_range = SPECIAL[key]
        elif key in FREE_TEXT:
            wrong, out_of_range = "7", "''"  # any non-empty string is a valid path or name
        elif isinstance(default, bool):
            wrong, out_of_range = "maybe", None  # true/false has no range
        elif isinstance(default, (int, float)) or default is None:
            wrong, out_of_range = "abc", "-1"
        elif choice:
            wrong, out_of_range = "7", "nope"
        else:
            raise AssertionError(f"no bad values defined for {key}={default!r}")
        out += [(f"{key}={wrong}", key, wrong.strip("'")), (f"~{key}", key, "<removed>")]
        if out_of_range is not None:
            out.append((f"{key}={out_of_range}", key, out_of_range.strip("'")))
    for group in cli.GROUPS:
        add = "+" if group == "experiment" else ""
        out += [
            (f"{add}{group}=[a,b]", group, "[a,b]"),
            (f"{add}{group}=nope", group, "nope"),
            (f"~{group}" if group != "experiment" else "+experiment=", group, "" if group == "experiment" else "~"),
        ]
    return out


# the issue's own list, and values that only the data or the partition can refute (checked when the job starts)
EXTRA = [
    ("dataset.test_fraction=1.5", "dataset.test_fraction", "1.5"),
    ("dataset.test_fraction=0", "dataset.test_fraction", "0"),
    ("partition.test_fraction=0", "partition.test_fraction", "0"),
    ("dataset=synthetic dataset.num_classes=0", "dataset.num_classes", "0"),
    ("dataset=synthetic dataset.shape=[0,8,8]", "dataset.shape", "[0, 8, 8]"),
    ("dataset=synthetic dataset.noise=-1", "dataset.noise", "-1"),
    ("lr=1e300", "lr", "1e+300"),
    ("lr=${nope}", "lr", "${nope}"),
    ("optim.lr=${oc.env:FEDBENCH_SURELY_UNSET}", "optim.lr", "FEDBENCH_SURELY_UNSET"),
    ("dataset=imagefolder", "dataset.root", "???"),
    ("algorithm=fedprox algorithm.mu=abc", "algorithm.mu", "abc"),
    ("model.hidden=5", "model.hidden", "5"),
    ("partition=dominant_groups partition.samples_per_client=100000", "partition.samples_per_client", "100000"),
    ("model=tcnn", "model", "tcnn"),  # its internal name is "cnn": the message names what the user typed
    # issue #37: values that were accepted silently, or blamed on another key
    ("model.hidden=[0]", "model.hidden", "[0]"),
    ("model=tiny_cnn model.kernel_size=0", "model.kernel_size", "0"),
    ("dataset=synthetic dataset.augment={rotate:30}", "dataset.augment", "rotate"),
    ("dataset=synthetic dataset.augment={crop_padding:-1}", "dataset.augment", "-1"),
    ("rounds=99999999999999999999999", "rounds", "99999999999999999999999"),
    ("partition=shards partition.shards_per_client=1000", "partition.shards_per_client", "1000"),
    ("batch_size=100000 drop_last=true", "batch_size", "100000"),
    ("dataset.normalize={mean:[0.5],std:[0]}", "dataset.normalize", "'std': [0]"),
    # issue #54: a traceback after the run dir was made, and values that passed the checks and failed late
    ("dataset.name=mnist", "dataset.name", "'mnist' — use dataset=mnist to choose it"),
    ("dataset.normalize={mean:[nan],std:[1]}", "dataset.normalize", "'mean': [nan]"),  # was "diverged in round 1"
    ("algorithm=ifca algorithm.clusters=5", "algorithm.clusters", "5 — an integer in [1, clients=4]"),  # FAST: 4
    ("algorithm=fedprox algorithm.mu=inf", "algorithm.mu", "inf — a number in [0, inf)"),  # was "[0, inf]"
    ("model.hidden=[1000000000000]", "model", "'mlp' — too large for this machine's memory"),
]


def fedbench_in_process(args: list[str], capsys) -> tuple[int, str]:
    from hydra.core.global_hydra import GlobalHydra

    argv = sys.argv
    sys.argv = ["fedbench", *args]
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
        GlobalHydra.instance().clear()
    return code, capsys.readouterr().err


@pytest.mark.parametrize("override,key,value", cases() + EXTRA, ids=[c[0] for c in cases() + EXTRA])
def test_bad_input_gives_one_line_and_no_run_dir(override, key, value, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDBENCH_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    code, err = fedbench_in_process([*FAST, *override.split(), f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert line.startswith("fedbench: invalid config: ") and key in line and value in line, line
    assert line.split(" — ", 1)[1].strip(), line  # ... — what is allowed
    assert not run_dir.exists() and not (tmp_path / "outputs").exists()  # no run dir, complete or not


def test_a_run_dir_under_an_existing_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a dir")
    code, err = fedbench_in_process([*FAST, f"hydra.run.dir={tmp_path / 'file' / 'run'}"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"hydra.run.dir='{tmp_path / 'file' / 'run'}'" in err and f"{tmp_path / 'file'} is an existing file" in err


# ---- minor items: shared caches, truncated caches, warnings on stderr ----------------------------------------------
@pytest.fixture
def image_tree(tmp_path):
    from torchvision.io import write_png

    g = torch.Generator().manual_seed(0)
    for split in ("train", "test"):
        for c in ("a", "b"):
            for i in range(3):
                p = tmp_path / "tree" / split / c / f"{i}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                with warnings.catch_warnings():  # torchvision 0.29: image codecs deprecated in favour of torchcodec
                    warnings.simplefilter("ignore", DeprecationWarning)
                    write_png(torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8, generator=g), str(p))
    return tmp_path / "tree"


def imagefolder_cfg(root):
    return OmegaConf.create(
        {"dataset": {**yaml.safe_load((CONF / "dataset" / "imagefolder.yaml").read_text()), "root": str(root)}}
    ).dataset


def test_a_truncated_dataset_cache_is_decoded_again_with_a_warning(image_tree, tmp_path, capsys):
    from fedbench.data.datasets import load_dataset

    cache = tmp_path / "cache"
    first = load_dataset(imagefolder_cfg(image_tree), cache)
    (f,) = cache.glob("imagefolder-*.pt")
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # a crash while copying it
    capsys.readouterr()
    again = load_dataset(imagefolder_cfg(image_tree), cache)
    out = capsys.readouterr()
    assert torch.equal(again.x, first.x) and torch.equal(again.y, first.y)
    assert "cannot be read" in out.err and str(f) in out.err and out.out == ""
    assert torch.load(f, weights_only=True)["n_train"] == first.n_train  # rewritten whole


def test_dataset_cache_files_follow_the_umask(image_tree, tmp_path):
    from fedbench.data.datasets import load_dataset

    old = os.umask(0o002)  # a group that shares a cache dir
    try:
        load_dataset(imagefolder_cfg(image_tree), tmp_path / "cache")
    finally:
        os.umask(old)
    (f,) = (tmp_path / "cache").glob("imagefolder-*.pt")
    assert f.stat().st_mode & 0o777 == 0o664


def test_warnings_go_to_stderr(tmp_path, capfd):
    """The checkpoint fallback message, and library/algorithm warnings under Hydra's job logging (conf/hydra)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log

    ckpt.save(tmp_path, 1, {"algorithm": {}}, keep=2)
    newest = ckpt.save(tmp_path, 2, {"algorithm": {}}, keep=2)
    newest.write_bytes(newest.read_bytes()[:10])
    assert ckpt.load_latest(tmp_path, "cpu")["round"] == 1
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        hcfg = compose("config", return_hydra_config=True)
    GlobalHydra.instance().clear()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_log(hcfg.hydra.job_logging, hcfg.hydra.verbose)
        logging.getLogger("fedbench.algorithms.fedafa").warning("FedAFA: a fallback")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    out = capfd.readouterr()
    assert out.out == ""
    assert "checkpoint round_000002.pt is corrupted" in out.err and "fedbench: FedAFA: a fallback" in out.err


def test_an_impossible_dominant_groups_request_names_what_is_available():
    from sklearn.datasets import load_digits

    from fedbench.data.partitions import make_partition
    from fedbench.errors import ConfigError

    y = load_digits().target  # 1797 samples, ~180 per label, train+test pool
    cfg = OmegaConf.load(CONF / "partition" / "dominant_groups.yaml")
    cfg.seed = 0
    cfg.samples_per_client = 1000
    with pytest.raises(ConfigError) as e:
        make_partition(cfg, y, 1437, 10, 6, np.random.default_rng(0))
    counts = np.bincount(y)
    # the first client's group {0, 1, 2}: label 0 gets ⌊200/10⌋ + ⌊800/3⌋ = 20 + 266 = 286 > 178 samples of label 0
    assert "partition.samples_per_client=1000" in str(e.value) and f"the pool has {counts[0]}" in str(e.value)
    assert "needs 286 distinct samples of label 0" in str(e.value)
    cfg.samples_per_client = 600  # 12 + 160 = 172 <= 178: possible (clients share samples only across clients)
    p = make_partition(cfg, y, 1437, 10, 6, np.random.default_rng(0))
    assert all(len(np.unique(np.concatenate([tr, te]))) == len(tr) + len(te) for tr, te in zip(p.train, p.test))


@pytest.mark.parametrize(
    "args, words",
    [
        (["rounds"], "invalid override 'rounds' — key=value"),
        (["algorithm=fedavg,fedprox"], "algorithm=fedavg,fedprox — one value without -m: add -m"),
        (["+algorithm=fedprox"], "+algorithm=fedprox — algorithm is always chosen: algorithm=fedprox"),
        (["--config-name=nosuch"], "--config-name='nosuch' — a config file in"),
        (["hydra.run.dir=/proc/fedbench_run"], "hydra.run.dir='/proc/fedbench_run' — a writable location"),
        (["hydra.run.dir="], "hydra.run.dir='' — a directory path"),  # (the table above adds a run dir after it)
        (["hydra.run.dir=", "hydra.run.dir=run/" + "a" * 300], "has 300"),  # the last one given is the one used
        # issue #54: tracebacks
        (["-m", "lr=interval(0,1)"], "lr=interval(0,1) — values to run, not a continuous range"),
        (["lr=interval(0,1)"], "lr=interval(0,1) — values to run, not a continuous range"),
        (["-m", "algorithm=glob(zzz*)"], "algorithm=glob(zzz*) — a pattern matching options of algorithm: one of cafe"),
        (["-m", "lr=glob(*)"], "lr=glob(*) — glob() picks a config group's options; a key takes its values: lr=a,b,c"),
        (["--config-dir", "/nonexistent/dir"], "--config-dir='/nonexistent/dir' — a directory of config groups"),
        ([f"hydra.run.dir=run/{'a' * 300}"], f"at most {NAME_MAX} bytes each (aaaaaaaaaaaaaaaaaaaa... has 300)"),
        ([f"hydra.run.dir={'/'.join(['b' * 200] * 25)}"], f"a path of at most {PATH_MAX - cli.RUN_DIR_ROOM} bytes"),
        (["-m", "seed=0,1", f"hydra.sweep.dir={'/'.join(['b' * 200] * 25)}"], "hydra.sweep.dir='bbbbbbb"),
    ],
)
def test_command_line_mistakes_hydra_reported_in_many_lines(args, words, tmp_path, capsys, monkeypatch):
    """Issue #37: Hydra's multi-line errors (and a traceback for /proc) become one line, before any run dir."""
    if args[0].startswith("hydra.run.dir=/proc") and not os.path.isdir("/proc"):
        pytest.skip("no /proc on this machine")
    monkeypatch.chdir(tmp_path)
    code, err = fedbench_in_process([*FAST, *args], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and words in lines[0], err
    assert not any(tmp_path.iterdir())  # nothing written: no outputs/, no part of a run dir


def test_a_long_run_dir_within_the_limits_runs(tmp_path, capsys, monkeypatch):
    """The path checks refuse only what the system cannot make: names of NAME_MAX bytes, and a path that leaves
    RUN_DIR_ROOM below PATH_MAX, run."""
    monkeypatch.chdir(tmp_path)
    name = "c" * NAME_MAX
    fill = PATH_MAX - cli.RUN_DIR_ROOM - len(os.fsencode(str(tmp_path))) - 1  # bytes left for "/<names>"
    parts = [name] * (fill // (NAME_MAX + 1))
    rest = fill - len(parts) * (NAME_MAX + 1) - 1
    run_dir = tmp_path.joinpath(*parts, *(["d" * rest] if rest > 0 else []))
    assert len(os.fsencode(str(run_dir))) in (PATH_MAX - cli.RUN_DIR_ROOM, PATH_MAX - cli.RUN_DIR_ROOM - 1)
    code, err = fedbench_in_process([*FAST, "dataset=digits", f"hydra.run.dir={run_dir}"], capsys)
    assert code == 0, err
    assert (run_dir / "summary.json").is_file()


def test_an_unbounded_range_end_is_open():
    """Issue #54: ``algorithm.mu=inf`` was refused with "a number in [0, inf]", which includes it."""
    from fedbench.checks import number

    assert number(0, None)[1] == "a number in [0, inf)" and number(None, 1)[1] == "a number in (-inf, 1]"
    assert number(0, 1, hi_open=True)[1] == "a number in [0, 1)" and not number(0, None)[0](float("inf"))


def test_ifca_takes_as_many_clusters_as_clients(tmp_path, capsys, monkeypatch):
    """Issue #54: 1,000 clusters for 4 clients ran (1,000 models, most trained by nobody); clusters = clients runs."""
    monkeypatch.chdir(tmp_path)
    code, err = fedbench_in_process([*FAST, "algorithm=ifca", "algorithm.clusters=4", "hydra.run.dir=run"], capsys)
    assert code == 0, err


def test_a_model_too_large_for_memory_says_its_size(tmp_path, capsys, monkeypatch):
    """Issue #54: it was "does not fit the dataset's 1x8x8 inputs (... can't allocate)". digits: 64 inputs, 10 classes;
    one hidden layer of 10^12: 64·10^12 + 10^12 (its weights and biases) + 10·10^12 + 10 (the head) parameters."""
    monkeypatch.chdir(tmp_path)
    code, err = fedbench_in_process([*FAST, "model.hidden=[1000000000000]", "hydra.run.dir=run"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "model='mlp' — too large for this machine's memory: 75,000,000,000,010 parameters, " in err
    assert "does not fit" not in err and not (tmp_path / "run").exists()


LIMITED = """
import resource, sys
import numpy, torch  # what a run loads, before the limit
from fedbench import cli
vm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, resource.RLIM_INFINITY))
sys.argv = ["fedbench", *sys.argv[1:]]
cli.main()
"""


def test_more_threads_than_can_be_started_are_refused(tmp_path):
    """Issue #54: hardware.threads=1000 where 1000 threads cannot be started ended the run mid-way (OpenMP's "Thread
    creation failed", a run dir left "running"). Here 1 GiB of address space is left for 8 MiB thread stacks (room
    for about 128): one line naming the key, before any run dir."""
    import resource
    import subprocess

    if not Path("/proc/self/status").is_file():
        pytest.skip("needs /proc (Linux)")
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    stack = 8 * 2**20 if hard == resource.RLIM_INFINITY else min(8 * 2**20, hard)

    def limit_stack():  # read by the C library at start: the default stack of every thread
        resource.setrlimit(resource.RLIMIT_STACK, (stack, hard))

    args = [a for a in FAST if not a.startswith("hardware.threads")]
    p = subprocess.run(
        [sys.executable, "-c", LIMITED, *args, "hardware.threads=1000", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_stack,
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith("fedbench: invalid config: hardware.threads=1000 — at most "), lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("seeds", ["abc", "0,,1", "1.5", "-1", "²"])
def test_claims_seeds_that_are_not_seeds(seeds, capsys):
    """Issue #54: ``fedbench-claims run fedrema --seeds abc`` was a ValueError traceback."""
    from fedbench.claims import _seed_list, main

    assert main(["run", "fedrema", "--seeds", seeds, "--dry-run"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [f"fedbench-claims: --seeds {seeds!r} — a comma list of seeds, integers >= 0 (e.g. --seeds 0,1)"]
    assert _seed_list("3, 1") == [3, 1]


def test_config_dir_group_files_are_options_and_broken_yaml_is_one_line(tmp_path, capsys, monkeypatch):
    """--config-dir adds group options (they were refused as unknown); a file there that is not YAML: one line naming
    the file and line."""
    monkeypatch.chdir(tmp_path)
    extra = tmp_path / "confs"
    (extra / "algorithm").mkdir(parents=True)
    (extra / "algorithm" / "myprox.yaml").write_text("defaults:\n  - fedprox\n  - _self_\nmu: 0.25\n")
    run_dir = tmp_path / "run"
    code, err = fedbench_in_process(
        [*FAST, "--config-dir", str(extra), "algorithm=myprox", "dataset=digits", f"hydra.run.dir={run_dir}"], capsys
    )
    assert code == 0, err
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert (saved.algorithm.name, saved.algorithm.mu) == ("fedprox", 0.25)
    code, err = fedbench_in_process([*FAST, "--config-dir", str(extra), "algorithm=myproxx"], capsys)
    assert code == 2 and "did you mean myprox?" in err
    (extra / "algorithm" / "broken.yaml").write_text("mu: [0.1,\n")
    code, err = fedbench_in_process([*FAST, f"--config-dir={extra}", "algorithm=myprox"], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and f"{extra / 'algorithm' / 'broken.yaml'}, line 2 is not valid YAML" in err


def test_save_rounds_after_the_last_round_are_said_not_silently_dropped(tmp_path, capsys, monkeypatch):
    """Issue #37: eval.similarity.save_rounds=[5] with rounds=1 was accepted without a word."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    args = [*FAST, "dataset=digits", "eval.similarity.enabled=true", "eval.similarity.save_rounds=[1,5,9]"]
    code, err = fedbench_in_process([*args, f"hydra.run.dir={run}"], capsys)
    assert code == 0, err
    assert "eval.similarity.save_rounds [5, 9] are after the last round (rounds=1): never saved" in err
    assert (run / "diagnostics" / "head_similarity" / "round_00001.npz").exists()


# ---- corrupt data files (issue #37): named, before any training ------------------------------------------------
def write_idx(path: Path, array: np.ndarray) -> None:
    """An MNIST idx file (big-endian header: magic 0x08 (uint8) << 8 | ndim, then each dimension)."""
    header = (0x0800 | array.ndim).to_bytes(4, "big") + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def mnist_root(tmp_path):
    """A 12 + 6 image MNIST in torchvision's layout (MNIST/raw/*-ubyte), readable as it is."""
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    g = np.random.default_rng(0)
    for prefix, n in (("train", 12), ("t10k", 6)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", g.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    return tmp_path / "data"


def load_mnist_at(root: Path):
    from fedbench.data.datasets import load_dataset

    cfg = OmegaConf.create(
        {"dataset": {**yaml.safe_load((CONF / "dataset" / "mnist.yaml").read_text()), "root": str(root)}}
    ).dataset
    cfg.cache = False
    return load_dataset(cfg, root / "cache")


@pytest.mark.parametrize(
    "damage, words",
    [
        ("labels_200", "labels in 0..9: sample 3 is labelled 200"),
        ("short_labels", "train images and labels to match: 12 images, 11 labels"),
        ("bad_magic", "train-images-idx3-ubyte"),
        ("empty_test", "t10k-images-idx3-ubyte"),
        ("truncated", "train-images-idx3-ubyte"),
    ],
)
def test_a_corrupt_mnist_file_is_named_not_trained_on_or_called_missing(mnist_root, damage, words):
    assert len(load_mnist_at(mnist_root).y) == 18  # the fixture itself reads
    raw = mnist_root / "MNIST" / "raw"
    if damage == "labels_200":
        labels = np.arange(12) % 10
        labels[3] = 200
        write_idx(raw / "train-labels-idx1-ubyte", labels)
    elif damage == "short_labels":
        write_idx(raw / "train-labels-idx1-ubyte", np.arange(11) % 10)
    elif damage == "bad_magic":
        f = raw / "train-images-idx3-ubyte"
        f.write_bytes(b"\x00\x00\x07\x07" + f.read_bytes()[4:])
    elif damage == "empty_test":
        (raw / "t10k-images-idx3-ubyte").write_bytes(b"")
    else:
        f = raw / "train-images-idx3-ubyte"
        f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ConfigError) as e:
        load_mnist_at(mnist_root)
    assert e.value.key == "dataset.root" and words in str(e.value) and "not found" not in str(e.value)


def test_a_zero_byte_image_is_named(image_tree):
    from fedbench.data.datasets import load_dataset

    bad = image_tree / "test" / "b" / "1.png"
    bad.write_bytes(b"")
    cfg = imagefolder_cfg(image_tree)
    cfg.cache = False
    with pytest.raises(ConfigError) as e:
        load_dataset(cfg, image_tree / "cache")
    assert e.value.key == "dataset.root" and e.value.value == str(bad) and "a readable image file" in str(e.value)


def test_a_missing_test_class_folder_is_refused_and_an_empty_one_said(image_tree, capsys):
    """Issue #37: a test split without a class folder scored that class as nothing (accuracy 0 reported)."""
    import shutil

    from fedbench.data.datasets import load_dataset

    cfg = imagefolder_cfg(image_tree)
    cfg.cache = False
    for f in (image_tree / "test" / "b").iterdir():
        f.unlink()
    load_dataset(cfg, image_tree / "cache")
    assert "class folder(s) ['b'] hold no images in train or test" in capsys.readouterr().err
    shutil.rmtree(image_tree / "test" / "b")
    (image_tree / "test" / "c").mkdir()
    with pytest.raises(ConfigError) as e:
        load_dataset(cfg, image_tree / "cache")
    assert e.value.key == "dataset.root" and "(missing: ['b'], not in train: ['c'])" in str(e.value)


def test_help_into_a_pipe_that_closes_early_is_quiet():
    """``fedbench --help | head -1``: the reader goes after one line; no BrokenPipeError traceback, exit 141 (0 if the
    whole text was in the pipe before ``head`` left: a race this test does not control)."""
    import subprocess

    p = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m fedbench.cli --help | head -1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.stdout.startswith("fedbench") and p.stdout.count("\n") == 1
    assert p.stderr == "" and p.returncode in (0, 141), p.stderr[-2000:]


@pytest.mark.parametrize(
    "override,hint",
    [
        ("delta=0.3", "did you mean algorithm.delta (with algorithm=fedrema, perfedavg)?"),  # another option's key
        ("rounds_=3", "did you mean rounds?"),
        ("algorithm=fedrema delta=0.3", "did you mean algorithm.delta?"),  # the chosen option has it
    ],
)
def test_an_unknown_key_is_matched_to_the_key_it_names(override, hint, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = fedbench_in_process([*FAST, *override.split()], capsys)
    assert code == 2 and hint in err and err.count("\n") == 1, err
