"""FEMNIST from LEAF's per-writer JSON files (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018),
as CAFeMe's Table 2 uses it (its code reads LEAF's ``data/femnist/data/{train,test}``).

LEAF's ``data/femnist/preprocess.sh ... -t sample`` writes ``train/*.json`` and ``test/*.json``, each file
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}}``: one 28×28
grey image per row of ``x`` (PIL grey value / 255, background 1.0), ``y`` in 0..61 (digits, upper-, lower-case
letters); every writer has samples in both folders. The pool is every writer's train samples, then every
writer's test samples; ``attrs["writer"]`` is the writer's index in sorted-name order, so the ``natural``
partition can give one writer to each client (conf/partition/natural.yaml).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import torch

from fedbench.data.pool import from_splits
from fedbench.errors import ConfigError

CLASSES = list(string.digits + string.ascii_uppercase + string.ascii_lowercase)  # LEAF's relabel_class: 0-9, A-Z, a-z
LAYOUT = (
    'LEAF\'s layout femnist/data/{train,test}/*.json, each {"users": [...], "num_samples": [...], '
    '"user_data": {user: {"x": [[784 floats in 0..1]], "y": [0..61]}}} '
    "(LEAF data/femnist: ./preprocess.sh ... -t sample)"
)


def leaf_dirs(root: Path) -> tuple[Path, Path]:
    """``<root>/femnist/data/{train,test}`` (LEAF's tree), or ``<root>/femnist/{train,test}``, or
    ``<root>/{train,test}``."""
    looked = [root / "femnist" / "data", root / "femnist", root]
    for base in looked:
        if any((base / "train").glob("*.json")) and any((base / "test").glob("*.json")):
            return base / "train", base / "test"
    raise ConfigError(
        "dataset.root", str(root), f"femnist not found; looked in {', '.join(str(b) for b in looked)} for {LAYOUT}"
    )


def read_split(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{writer: (uint8 pixels [n, 28, 28] = round(255·x), int64 labels [n])} over the folder's JSON files."""
    out = {}
    for f in sorted(folder.glob("*.json")):
        try:
            node = json.loads(f.read_text())
            for user in node["users"]:
                d = node["user_data"][user]
                x = np.asarray(d["x"], dtype=np.float64).reshape(-1, 28, 28)
                y = np.asarray(d["y"], dtype=np.int64)
                if len(x) != len(y) or (
                    len(x) and (x.min() < 0 or x.max() > 1 or y.min() < 0 or y.max() >= len(CLASSES))
                ):
                    raise ValueError(f"user {user}: {len(x)} images, {len(y)} labels, pixels/labels out of range")
                u8 = np.rint(x * 255)
                if np.abs(u8 - x * 255).max(initial=0) > 1e-3:  # LEAF stores grey/255; anything else would be rounded
                    raise ValueError(f"user {user}: pixel values are not multiples of 1/255")
                if user in out:
                    raise ValueError(f"user {user} appears twice")
                out[user] = (u8.astype(np.uint8), y)
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                "dataset.root", str(f), f"not a LEAF FEMNIST file ({type(e).__name__}: {e}); expected {LAYOUT}"
            ) from None
    return out


def load_femnist(cfg):
    """The pool (train samples of every writer, then test samples) with attrs["writer"]; ``invert`` stores 1 − x
    (the CAFeMe code feeds (0.5 − x)/0.5, i.e. ink positive: invert + normalize 0.5/0.5)."""
    if cfg.download:
        raise ConfigError(
            "dataset.download",
            True,
            f"FEMNIST has no downloader here: run LEAF's data/femnist/preprocess.sh "
            f"where there is internet and copy its data/ folder ({LAYOUT})",
        )
    train_dir, test_dir = leaf_dirs(Path(cfg.root))
    train, test = read_split(train_dir), read_split(test_dir)
    if set(train) != set(test):
        raise ConfigError(
            "dataset.root",
            cfg.root,
            f"the train and test files hold different writers ({len(train)} vs "
            f"{len(test)}): LEAF must split by sample (preprocess.sh -t sample)",
        )
    writers = sorted(train)

    def stack(split):
        xs = [split[w][0] for w in writers]
        x = torch.from_numpy(np.concatenate(xs)).unsqueeze(1) if xs else torch.zeros(0, 1, 28, 28, dtype=torch.uint8)
        y = torch.from_numpy(np.concatenate([split[w][1] for w in writers]))
        who = torch.from_numpy(np.repeat(np.arange(len(writers)), [len(split[w][1]) for w in writers]))
        return (255 - x if cfg.invert else x), y, who

    (tr_x, tr_y, tr_w), (te_x, te_y, te_w) = stack(train), stack(test)
    return from_splits("femnist", tr_x, tr_y, te_x, te_y, CLASSES, {"writer": torch.cat([tr_w, te_w])})
