"""One run = one simulated federation: data -> partition -> model -> algorithm -> rounds -> summary.

Data flows one way (DESIGN.md): cfg -> Dataset -> Partition -> FederatedData; cfg -> model; cfg ->
Algorithm -> Executor -> round results -> Evaluator -> Loggers. Everything that can be checked is
checked before the first round.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from . import seeding
from .algorithms import ALGORITHMS
from .config import validate
from .data.datasets import load_dataset
from .data.federated import FederatedData
from .data.partitions import make_partition
from .engine.executor import make_executor
from .engine.functional import FModel
from .errors import ConfigError, RunFailed
from .evaluation import Evaluator, summarize
from .loggers import build_loggers
from .models import build_model
from .plots import heatmap


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("hardware.device", requested, "CUDA is not available on this machine; use hardware=cpu or hardware=auto")
    return torch.device(requested)


def write_json(path: Path, obj) -> None:
    """Atomic write (tmp + rename): a reader never sees a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    os.replace(tmp, path)


def check_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_probe"
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as e:
        raise ConfigError("hydra.run.dir", str(run_dir), f"an existing or creatable, writable directory with free space ({e.strerror})") from None


class Run:
    def __init__(self, cfg, run_dir: str | Path, group: str | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.group = group

    # ---- setup: everything before the first round ---------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        validate(cfg)
        check_writable(self.run_dir)
        hw = cfg.hardware
        self.device = pick_device(hw.device)
        if hw.threads:
            torch.set_num_threads(int(hw.threads))
        torch.use_deterministic_algorithms(bool(hw.deterministic), warn_only=True)
        self.dtype = torch.float64 if hw.precision == "fp64" else torch.float32

        dataset = load_dataset(cfg.dataset, cache_dir=cfg.cache_dir)
        part = make_partition(cfg.partition, dataset.y.numpy(), dataset.n_train, dataset.num_classes, int(cfg.clients),
                              seeding.rng(cfg.seed, "partition"))
        self.data = FederatedData.build(dataset, part, self.device, self.dtype, pin_memory=bool(hw.pin_memory))

        seeding.seed_everything(cfg.seed, "init")
        net = build_model(cfg.model, self.data.input_shape, self.data.num_classes).to(self.device, self.dtype)
        if self.device.type == "cpu" and hw.channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.fm = FModel(net)
        self.initial_params, self.initial_buffers = self.fm.init_state(self.dtype, self.device)
        self.executor = make_executor(hw.executor, self.device, hw.precision, bool(hw.channels_last), int(hw.eval_batch))
        self.algorithm = ALGORITHMS[cfg.algorithm.name](self)
        self.algorithm.setup()
        self.evaluator = Evaluator(self)

    def _save_partition(self) -> None:
        counts = self.data.counts
        np.savetxt(self.run_dir / "partition_counts.csv", counts, fmt="%d", delimiter=",",
                   header=",".join(self.data.classes), comments="")
        self.partition_png = heatmap(counts, self.run_dir / "partition.png", f"partition: {self.cfg.partition.name}",
                                     "class", "client", cmap="Blues")

    # ---- services for algorithms ---------------------------------------------------------------------
    def predict(self, params, buffers, idx: list[np.ndarray]) -> list[torch.Tensor]:
        return self.executor.predict(self.fm, params, buffers, self.data.x, [self.data.tensor(i) for i in idx])

    def sample_clients(self, t: int) -> torch.Tensor:
        """The round's participants: a fraction ``participation`` of the K clients, uniformly without replacement."""
        K = self.data.num_clients
        m = max(1, int(round(float(self.cfg.participation) * K)))
        if m >= K:
            return torch.arange(K)
        return torch.as_tensor(np.sort(seeding.rng(self.cfg.seed, "sample", t).choice(K, m, replace=False)))

    def check_finite(self, t: int, clients: list[int], res) -> None:
        """Stop on a non-finite loss or parameter, naming the round and the clients."""
        bad = ~torch.isfinite(res.loss)
        for v in res.params.values():
            bad |= ~torch.isfinite(v.flatten(1)).all(1).cpu()
        if bad.any():
            who = [clients[i] for i in torch.nonzero(bad).flatten().tolist()]
            raise RunFailed(f"non-finite loss or parameters in round {t} on client(s) {who}")

    def image(self, key: str, path: Path, t: int) -> None:
        self.loggers.image(key, path, t)

    # ---- the rounds --------------------------------------------------------------------------------------
    def execute(self) -> dict:
        cfg = self.cfg
        self.setup()  # every check happens here; nothing is written before it passes
        status = {"status": "running", "round": 0}
        write_json(self.run_dir / "status.json", status)
        self._save_partition()
        OmegaConf.save(cfg, self.run_dir / "config.yaml", resolve=True)
        title = f"{cfg.algorithm.name} | {cfg.dataset.name} | {cfg.partition.name}"
        self.loggers = build_loggers(cfg, self.run_dir, title, group=self.group)
        history: list[dict] = []
        try:
            self.loggers.image("partition", self.partition_png, 0)
            first = self.evaluator(self.algorithm, 0)
            history.append({"round": 0, **first})
            self.loggers.log(0, first)
            times = []
            for t in range(1, int(cfg.rounds) + 1):
                clients = self.sample_clients(t)
                tic = time.perf_counter()
                metrics = self.algorithm.round(t, clients)
                metrics["time/round"] = time.perf_counter() - tic
                times.append(metrics["time/round"])
                if t % int(cfg.eval_every) == 0 or t == int(cfg.rounds):
                    tic = time.perf_counter()
                    metrics.update(self.evaluator(self.algorithm, t))
                    metrics["time/eval"] = time.perf_counter() - tic
                history.append({"round": t, **metrics})
                self.loggers.log(t, metrics)
                status["round"] = t
            summary = {"status": "complete", "rounds": int(cfg.rounds),
                       "metrics": summarize(history, int(cfg.eval.final_window)),
                       "time_per_round": float(np.mean(times)) if times else math.nan,
                       "wall_time": float(np.sum(times)),
                       "final": {k: v for k, v in self.evaluator.last.items()},
                       **self.algorithm.finish(self.run_dir)}
            write_json(self.run_dir / "summary.json", summary)
            self.loggers.summary(summary)
            self.loggers.finish("complete")
            write_json(self.run_dir / "status.json", {"status": "complete", "round": int(cfg.rounds)})
            return summary
        except BaseException as e:
            write_json(self.run_dir / "status.json", {**status, "status": "failed", "error": f"{type(e).__name__}: {e}"})
            self.loggers.finish("failed")
            raise
