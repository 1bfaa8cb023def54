"""FEMNIST from LEAF's per-writer JSON files (fedbench/data/leaf.py) on a small fixture written in LEAF's format by
the test, the natural one-writer-per-client partition, CAFeMe Table 2's config on it, and the one-line error when
the data is absent."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_cfg
from omegaconf import OmegaConf

from fedbench.data.datasets import load_dataset
from fedbench.data.partitions import make_partition
from fedbench.errors import ConfigError
from fedbench.seeding import rng

REPO = Path(__file__).resolve().parent.parent
# writer -> (train samples, test samples); names out of order, spread over two files per split as LEAF does
WRITERS = {"f0042_17": (9, 3), "f0003_41": (6, 2), "f1010_02": (12, 4), "f0500_33": (7, 2), "f0777_08": (10, 3)}
FILES = [["f0042_17", "f0003_41", "f1010_02"], ["f0500_33", "f0777_08"]]


def _images(writer: str, split: str, n: int) -> tuple[list, list]:
    """Pixels k/255 (LEAF: grey/255, background 1.0) and labels in 0..61, distinct per writer and split."""
    g = np.random.default_rng(zlib.crc32(f"{writer}/{split}".encode()))
    k = g.integers(0, 256, size=(n, 784))
    k[:, :300] = 255  # white background rows
    return (k / 255).tolist(), g.integers(0, 62, size=n).tolist()


def write_leaf(root: Path) -> dict:
    """LEAF's tree root/femnist/data/{train,test}/*.json; returns {writer: {split: (x float [n, 784], y)}}."""
    truth = {}
    for split, at in (("train", 0), ("test", 1)):
        folder = root / "femnist" / "data" / split
        folder.mkdir(parents=True)
        for i, users in enumerate(FILES):
            data = {}
            for w in users:
                x, y = _images(w, split, WRITERS[w][at])
                data[w] = {"x": x, "y": y}
                truth.setdefault(w, {})[split] = (np.array(x), np.array(y))
            node = {"users": users, "num_samples": [len(data[w]["y"]) for w in users], "user_data": data}
            (folder / f"all_data_{i}_niid_1_keep_0_{split}_9.json").write_text(json.dumps(node))
    return truth


def _dataset_cfg(root, **over):
    top = OmegaConf.create(
        {"data_root": str(root), "dataset": OmegaConf.load(REPO / "conf" / "dataset" / "femnist.yaml")}
    )
    for k, v in over.items():
        OmegaConf.update(top, f"dataset.{k}", v, force_add=True)
    return top.dataset


def test_loads_leaf_json_as_the_code_feeds_it(tmp_path):
    """The pool = every writer's train samples (writers in sorted-name order), then their test samples; pixel
    v becomes (0.5 − v)/0.5 as in the CAFeMe code (ink positive); labels and writers kept; 62 classes."""
    truth = write_leaf(tmp_path)
    d = load_dataset(_dataset_cfg(tmp_path), tmp_path / "cache")
    names = sorted(WRITERS)
    n_train = sum(t for t, _ in WRITERS.values())
    assert d.n_train == n_train and len(d.y) == n_train + sum(t for _, t in WRITERS.values())
    assert d.x.shape[1:] == (1, 28, 28) and d.num_classes == 62 and d.classes[10] == "A" and d.classes[36] == "a"
    x = torch.cat([torch.as_tensor(truth[w][s][0]) for s in ("train", "test") for w in names]).view(-1, 1, 28, 28)
    y = torch.cat([torch.as_tensor(truth[w][s][1]) for s in ("train", "test") for w in names])
    assert torch.allclose(d.x.double(), (0.5 - x) / 0.5, atol=1e-6, rtol=0)
    assert torch.equal(d.y, y)
    who = torch.cat([torch.full((WRITERS[w][s],), i) for s in (0, 1) for i, w in enumerate(names)])
    assert torch.equal(d.attrs["writer"], who)
    cached = load_dataset(_dataset_cfg(tmp_path), tmp_path / "cache")  # the decode is cached, same result
    assert torch.equal(cached.x, d.x) and torch.equal(cached.attrs["writer"], who)


def _natural(d, k, seed, **over):
    cfg = OmegaConf.merge(OmegaConf.load(REPO / "conf" / "partition" / "natural.yaml"), {"seed": seed, **over})
    return make_partition(cfg, d.y.numpy(), d.n_train, d.num_classes, k, rng(seed, "partition"), attrs=d.attrs)


def test_natural_partition_gives_each_client_one_whole_writer(tmp_path):
    """One client = all train-file samples of one writer, writers drawn without replacement by the seed (the code:
    random.sample of 100 writers per seed); test: 20% of the writer's samples (code) or its LEAF test samples."""
    write_leaf(tmp_path)
    d = load_dataset(_dataset_cfg(tmp_path), tmp_path / "cache")
    who = d.attrs["writer"].numpy()
    p = _natural(d, 3, seed=0)
    chosen = p.info["writer"]
    assert len(set(chosen.tolist())) == 3
    for tr, te, w in zip(p.train, p.test, chosen):
        own = np.flatnonzero(who[: d.n_train] == w)
        assert np.array_equal(np.sort(np.concatenate([tr, te])), own)  # exactly the writer's train samples
        assert len(te) == int(np.ceil(0.2 * len(own)))
    seeds = {tuple(_natural(d, 3, seed=s).info["writer"]) for s in range(6)}
    assert len(seeds) > 1 and tuple(_natural(d, 3, seed=0).info["writer"]) == tuple(chosen)
    q = _natural(d, 5, seed=1, test_split="official")
    for tr, te, w in zip(q.train, q.test, q.info["writer"]):
        assert np.array_equal(te, d.n_train + np.flatnonzero(who[d.n_train :] == w)) and (who[tr] == w).all()
    with pytest.raises(ConfigError, match="clients=6"):
        _natural(d, 6, seed=0)


def test_natural_partition_needs_the_attribute():
    """A dataset without the attribute (no ``attrs``, e.g. digits or CIFAR-10) is a one-line config error."""
    y = np.arange(40) % 4
    for attrs in (None, {"rotation": torch.zeros(40)}):
        cfg = OmegaConf.merge(OmegaConf.load(REPO / "conf" / "partition" / "natural.yaml"), {"seed": 0})
        with pytest.raises(ConfigError) as e:
            make_partition(cfg, y, 30, 4, 3, rng(0, "partition"), attrs=attrs)
        assert e.value.key == "partition.by"


def test_table2_runs_on_the_fixture(tmp_path):
    """CAFeMe Table 2's config (FEMNIST column: natural partition, B=50, S=8, ...) composes and runs end to end on the
    LEAF fixture with a tiny network: 5 writers = 5 clients, 1 new client, a 2-step fine-tuning curve."""
    from fedbench.run import Run

    write_leaf(tmp_path / "data")
    cfg = make_cfg(
        "+experiment=cafeme/table2",
        f"data_root={tmp_path / 'data'}",
        f"cache_dir={tmp_path / 'cache'}",
        "clients=5",
        "participation=0.4",
        "rounds=1",
        "eval.new_clients.steps=2",
        "model.channels=[4,8]",
        "model.hidden=[16]",
        "model.modulator_hidden=[8,8]",
        "batch_size=4",
    )
    assert (cfg.dataset.name, cfg.partition.name, cfg.algorithm.name, cfg.algorithm.inner_steps, cfg.cafeme_column) == (
        "femnist",
        "natural",
        "cafeme",
        8,
        "FEMNIST",
    )
    s = Run(cfg, tmp_path / "run").execute()
    assert s["status"] == "complete" and len(s["newclients/curve"]) == 3 and len(s["newclients/clients"]) == 1


def test_absent_data_is_one_line_naming_leafs_layout(tmp_path):
    """No LEAF files under data_root: the run stops before training (Run.setup) with one line (a ConfigError: the CLI
    prints it as its single line, tests/test_cli.py) that names the expected layout and LEAF's JSON format."""
    from fedbench.run import Run

    cfg = make_cfg(  # the fast defaults' 4 clients at the table's 5 % would be 0.2 clients per round (refused)
        "+experiment=cafeme/table2", "participation=0.25", f"data_root={tmp_path}", f"cache_dir={tmp_path / 'cache'}"
    )
    with pytest.raises(ConfigError) as e:
        Run(cfg, tmp_path / "run").setup()
    msg = str(e.value)
    assert e.value.key == "dataset.root" and "\n" not in msg
    assert (
        "femnist/data/{train,test}/*.json" in msg and '"user_data"' in msg and str(tmp_path / "femnist" / "data") in msg
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_file_that_is_not_leaf_is_named(tmp_path):
    write_leaf(tmp_path)
    bad = tmp_path / "femnist" / "data" / "train" / "all_data_0_niid_1_keep_0_train_9.json"
    node = json.loads(bad.read_text())
    node["user_data"]["f0042_17"]["x"][0][5] = 0.5  # not a multiple of 1/255
    bad.write_text(json.dumps(node))
    with pytest.raises(ConfigError, match="multiples of 1/255"):
        load_dataset(_dataset_cfg(tmp_path), tmp_path / "cache")
    with pytest.raises(ConfigError, match="dataset.download"):
        load_dataset(_dataset_cfg(tmp_path, download=True), tmp_path / "cache2")
