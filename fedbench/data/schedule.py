"""Data schedule: from a given round on, a client keeps only part of its training samples of one class.

FedKA §3.2 / Fig. 3 (Chen et al. 2023): after 50 rounds of FedAvg, client 0's samples of one class are discarded step
by step (a non-dominant class to 10, 5, 0 samples at rounds 50, 60, 70; a dominant class by ~1 % of the client's data
every 10 rounds) while the class's forgetting degree is traced. Config (top-level ``data_schedule``, a list)::

    data_schedule:
      - {round: 60, client: 0, class: 5, keep: 5}              # from round 60 on: 5 samples of class 5 on client 0
      - {round: 70, client: 0, class: 5, keep: 0}              # from round 70 on: none
      - {round: 50, client: 0, class: 1, keep_fraction: 0.5}   # or a fraction of the class's original samples

``round`` r: the first round whose local training sees the reduced data. For a (client, class) the step with the
largest ``round`` <= t is in effect. The kept samples are the first ones of a fixed random order of the class's
original samples (seeded by (seed, client, class)), so a later, smaller step keeps a subset of the earlier one.
Only training data change: the test splits, the other classes and the other clients stay as partitioned; FedAvg's
aggregation weights |D_i| follow the current sizes.
"""

from __future__ import annotations

import math

import numpy as np
from omegaconf import OmegaConf

from .. import seeding
from ..errors import ConfigError

# methods whose state does not depend on the class counts beyond |D_i| (or that refresh it: FedKA's data_changed)
FOLLOWS_SCHEDULE = ("fedavg", "fedprox", "moon", "fedntd", "fedka")
KEYS = ("round", "client", "class", "keep", "keep_fraction")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class DataSchedule:
    def __init__(self, steps: list[dict], train_idx: list[np.ndarray], labels: np.ndarray, num_classes: int, seed: int):
        self.steps = steps
        self.labels = labels
        self.num_classes = num_classes
        self.original = [np.asarray(i).copy() for i in train_idx]
        cells = {(s["client"], s["class"]) for s in steps}
        # (client, class) -> its original samples of the class in a fixed random order (keep = a prefix)
        self.order = {
            (k, c): seeding.rng(seed, "data_schedule", k, c).permutation(
                self.original[k][labels[self.original[k]] == c]
            )
            for k, c in sorted(cells)
        }
        self.in_effect: dict = {}

    @classmethod
    def from_cfg(cls, cfg, data) -> "DataSchedule | None":
        """The run's schedule (None when ``data_schedule`` is absent or empty), checked before any training."""
        node = OmegaConf.select(cfg, "data_schedule", default=None)
        if node is None or (OmegaConf.is_list(node) and len(node) == 0):
            return None
        if not OmegaConf.is_list(node):
            raise ConfigError("data_schedule", node, "a list of {round, client, class, keep | keep_fraction}")
        if cfg.algorithm.name not in FOLLOWS_SCHEDULE:
            raise ConfigError(
                "data_schedule",
                "[...]",
                f"only with {', '.join(FOLLOWS_SCHEDULE)} (algorithm.name="
                f"{cfg.algorithm.name} keeps state computed from the initial class counts)",
            )
        labels = data.y.cpu().numpy()
        steps = []
        for i, raw in enumerate(node):
            s = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw
            key = f"data_schedule[{i}]"
            if not isinstance(s, dict) or set(s) - set(KEYS) or not {"round", "client", "class"} <= set(s):
                raise ConfigError(key, s, "a mapping with round, client, class and one of keep / keep_fraction")
            if ("keep" in s) == ("keep_fraction" in s):
                raise ConfigError(key, s, "exactly one of keep (samples) or keep_fraction (of the class's samples)")
            checks = (
                ("round", lambda v: _int(v) and v >= 1, "an integer >= 1 (the first round with the reduced data)"),
                ("client", lambda v: _int(v) and 0 <= v < data.num_clients, f"a client id in [0, {data.num_clients})"),
                ("class", lambda v: _int(v) and 0 <= v < data.num_classes, f"a class id in [0, {data.num_classes})"),
            )
            for k, ok, allowed in checks:
                if not ok(s[k]):
                    raise ConfigError(f"{key}.{k}", s[k], allowed)
            have = int((labels[data.train_idx[s["client"]]] == s["class"]).sum())
            if "keep" in s and not (_int(s["keep"]) and 0 <= s["keep"] <= have):
                raise ConfigError(
                    f"{key}.keep",
                    s["keep"],
                    f"an integer in [0, {have}] (client {s['client']} has {have} "
                    f"training samples of class {s['class']})",
                )
            if "keep_fraction" in s:
                f = s["keep_fraction"]
                if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
                    raise ConfigError(f"{key}.keep_fraction", f, "a number in [0, 1]")
                s = {**s, "keep": math.floor(f * have + 0.5)}
            steps.append({k: s[k] for k in ("round", "client", "class", "keep")})
        return cls(steps, data.train_idx, labels, data.num_classes, int(cfg.seed))

    def kept(self, t: int) -> dict:
        """{(client, class): samples kept} of the steps in effect in round t."""
        out, latest = {}, {}
        for s in self.steps:
            cell = (s["client"], s["class"])
            if s["round"] <= t and s["round"] >= latest.get(cell, 0):
                latest[cell], out[cell] = s["round"], s["keep"]
        return out

    def size(self, client: int, cls: int, t: int) -> int:
        """Samples of class ``cls`` that ``client`` trains on in round t."""
        return int(self.kept(t).get((client, cls), (self.labels[self.original[client]] == cls).sum()))

    def train_idx(self, t: int) -> list[np.ndarray]:
        """Each client's training indices in round t (the original order, scheduled samples removed)."""
        idx = [i.copy() for i in self.original]
        for (k, c), n in self.kept(t).items():
            idx[k] = idx[k][~np.isin(idx[k], self.order[k, c][n:])]
        return idx

    def apply(self, run, t: int) -> dict:
        """Put round t's data in place (when it changed): client indices, class counts, FedAvg weights |D_i|, and the
        class-count-derived state of the algorithm (``data_changed``) and of the forgetting monitor. Returns the
        scheduled cells' current sizes as metrics."""
        kept = self.kept(t)
        if kept != self.in_effect:
            data = run.data
            data.train_idx = self.train_idx(t)
            data.counts = np.stack([np.bincount(self.labels[i], minlength=self.num_classes) for i in data.train_idx])
            run.algorithm.n = data.train_sizes()  # Algorithm.n: the aggregation weights |D_i|
            if hasattr(run.algorithm, "data_changed"):
                run.algorithm.data_changed()
            if getattr(run, "forgetting", None) is not None:
                run.forgetting.data_changed(t)
            self.in_effect = kept
        return {f"data_schedule/client{k}_class{c}": int(run.data.counts[k, c]) for k, c in sorted(self.order)}


__all__ = ["DataSchedule", "FOLLOWS_SCHEDULE"]
