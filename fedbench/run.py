"""One run = one simulated federation: data -> partition -> model -> algorithm -> rounds -> summary.

Data flows one way (DESIGN.md): cfg -> Dataset -> Partition -> FederatedData; cfg -> model; cfg ->
Algorithm -> Executor -> round results -> Evaluator -> Loggers. Everything that can be checked is
checked before the first round.
"""
from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from . import checkpoint as ckpt
from . import seeding
from .algorithms import ALGORITHMS
from .config import validate
from .data.datasets import load_dataset
from .data.federated import FederatedData
from .data.partitions import make_partition
from .data.schedule import DataSchedule
from .engine.augment import build_augment
from .engine.executor import make_executor
from .engine.functional import FModel
from .errors import ConfigError, RunFailed
from .evaluation import Evaluator, summarize
from .forgetting import ForgettingMonitor
from .loggers import build_loggers
from .models import build_model
from .newclients import NewClients
from .plots import heatmap
from .preemption import Preempted, PreemptionGuard
from .similarity import SimilarityMonitor


def pick_device(requested: str) -> torch.device:
    """``auto``: CUDA if present (in a multirun on a multi-GPU box, GPU = job number mod #GPUs), else CPU."""
    if requested == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        n = torch.cuda.device_count()
        if n > 1:
            from hydra.core.hydra_config import HydraConfig

            if HydraConfig.initialized() and HydraConfig.get().job.get("num") is not None:
                return torch.device(f"cuda:{int(HydraConfig.get().job.num) % n}")
        return torch.device("cuda")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("hardware.device", requested, "CUDA is not available on this machine; use hardware=cpu or hardware=auto")
    return torch.device(requested)


def write_json(path: Path, obj) -> None:
    """Atomic write (tmp + rename): a reader never sees a half-written file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
    os.replace(tmp, path)


def check_writable(run_dir: Path, min_free_mb: float = 0) -> None:
    """Fail before training if the run dir cannot be written or its disk is (nearly) full."""
    import shutil

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_probe"
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as e:
        raise ConfigError("hydra.run.dir", str(run_dir), f"an existing or creatable, writable directory with free space ({e.strerror})") from None
    free = shutil.disk_usage(run_dir).free / 2**20
    if free < min_free_mb:
        raise ConfigError("hydra.run.dir", str(run_dir), f"a disk with at least checkpoint.min_free_mb={min_free_mb:g} MB free "
                          f"(only {free:.0f} MB left)")


class Run:
    def __init__(self, cfg, run_dir: str | Path, group: str | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.group = group

    # ---- setup: everything before the first round ---------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        validate(cfg)
        check_writable(self.run_dir, float(cfg.checkpoint.min_free_mb))
        hw = cfg.hardware
        self.device = pick_device(hw.device)
        if hw.threads:   # torch's and NumPy/SciPy's BLAS pools alike (server-side solvers use the latter)
            torch.set_num_threads(int(hw.threads))
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=int(hw.threads))
        torch.use_deterministic_algorithms(bool(hw.deterministic), warn_only=True)
        self.dtype = torch.float64 if hw.precision == "fp64" else torch.float32

        dataset = load_dataset(cfg.dataset, cache_dir=cfg.cache_dir)
        part = make_partition(cfg.partition, dataset.y.numpy(), dataset.n_train, dataset.num_classes, int(cfg.clients),
                              seeding.rng(int(cfg.partition.seed), "partition"), attrs=dataset.attrs)   # partition.seed: ${seed} by default
        self.data = FederatedData.build(dataset, part, self.device, self.dtype, pin_memory=bool(hw.pin_memory))
        # a class shrinking on a client mid-run (FedKA Fig. 3; fedbench/data/schedule.py); off unless data_schedule is set
        self.data_schedule = DataSchedule.from_cfg(cfg, self.data)
        # held-out new clients (CAFeMe §5): never sampled for training, fine-tuned and scored after it; off by default
        self.new_clients = NewClients(self) if OmegaConf.select(cfg, "eval.new_clients.enabled", default=False) else None

        seeding.seed_everything(cfg.seed, "init")
        net = build_model(cfg.model, self.data.input_shape, self.data.num_classes).to(self.device, self.dtype)
        if self.device.type == "cpu" and hw.channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.fm = FModel(net)
        self.initial_params, self.initial_buffers = self.fm.init_state(self.dtype, self.device)
        self.augment = build_augment(cfg.dataset)   # training-time augmentation (dataset.augment), or None
        self.executor = make_executor(hw.executor, self.device, hw.precision, bool(hw.channels_last), int(hw.eval_batch),
                                      workers=hw.get("workers", 1))
        self.algorithm = ALGORITHMS[cfg.algorithm.name](self)
        self.algorithm.setup()
        self.evaluator = Evaluator(self)
        # class-wise forgetting degree (FedKA Eq. 1) of the round's local models, for any method; off by default
        self.forgetting = ForgettingMonitor(self) if OmegaConf.select(cfg, "eval.forgetting.enabled", default=False) else None
        # FedReMa's S / MDS / Δs̄ (Eq. 5, Alg. 1, Eq. 8) of the round's local heads, for any method; off by default
        self.similarity = SimilarityMonitor(self) if OmegaConf.select(cfg, "eval.similarity.enabled", default=False) else None

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
        """The round's participants: a fraction ``participation`` of the K clients, uniformly without replacement
        (drawn from the training clients only when new clients are held out, eval.new_clients)."""
        K = self.data.num_clients
        m = max(1, int(round(float(self.cfg.participation) * K)))
        if getattr(self, "new_clients", None) is not None:
            pool = self.new_clients.participants
            if m >= len(pool):
                return torch.as_tensor(pool)
            return torch.as_tensor(np.sort(pool[seeding.rng(self.cfg.seed, "sample", t).choice(len(pool), m, replace=False)]))
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
        validate(cfg)
        done = self._previous_run()
        if done is not None:
            return done
        self.setup()  # every check happens here; nothing is written before it passes
        resumed = ckpt.load_latest(self.run_dir, self.device) if cfg.resume else None
        t0 = self._restore(resumed) if resumed else 0
        status = {"status": "running", "round": t0, "config_fingerprint": self.fingerprint}
        write_json(self.run_dir / "status.json", status)
        self._save_partition()
        OmegaConf.save(cfg, self.run_dir / "config.yaml", resolve=True)
        title = f"{cfg.algorithm.name} | {cfg.dataset.name} | {cfg.partition.name}"
        self.loggers = build_loggers(cfg, self.run_dir, title, start_round=t0, group=self.group,
                                     wandb_id=resumed.get("wandb_id") if resumed else None)
        if resumed:
            print(f"fedbench: resuming {self.run_dir} after round {t0}", file=sys.stderr)
        else:
            self.history, self.times = [], []
        boundary = None
        try:
            with PreemptionGuard():
                if not resumed:
                    self.loggers.image("partition", self.partition_png, 0)
                    first = self.evaluator(self.algorithm, 0)
                    self.history.append({"round": 0, **first})
                    self.loggers.log(0, first)
                boundary = self._snapshot(t0) if cfg.checkpoint.on_signal else None
                for t in range(t0 + 1, int(cfg.rounds) + 1):
                    self._one_round(t)
                    status["round"] = t
                    if cfg.checkpoint.every and t % int(cfg.checkpoint.every) == 0 and t < int(cfg.rounds):
                        ckpt.save(self.run_dir, t, self._state(t), keep=int(cfg.checkpoint.keep))
                    if cfg.checkpoint.on_signal:
                        boundary = self._snapshot(t)
                return self._complete()
        except Preempted as e:
            if boundary is not None:
                ckpt.save(self.run_dir, boundary["round"], boundary["state"], keep=int(cfg.checkpoint.keep))
            write_json(self.run_dir / "status.json", {**status, "status": "preempted", "error": str(e)})
            self.loggers.finish("preempted")
            raise
        except BaseException as e:
            write_json(self.run_dir / "status.json", {**status, "status": "failed", "error": f"{type(e).__name__}: {e}"})
            self.loggers.finish("failed")
            raise

    def _one_round(self, t: int) -> None:
        cfg = self.cfg
        scheduled = self.data_schedule.apply(self, t) if self.data_schedule else {}   # round t's client data
        clients = self.sample_clients(t)
        if self.forgetting:   # snapshot the round-start global model θ_g^r
            self.forgetting.before_round(self.algorithm, t)
        if self.similarity:   # after forgetting's: both read the round's local models
            self.similarity.before_round(self.algorithm, t)
        tic = time.perf_counter()
        metrics = {**self.algorithm.round(t, clients), **scheduled}
        metrics["time/round"] = time.perf_counter() - tic
        self.times.append(metrics["time/round"])
        if self.similarity:   # S of the trained local heads (before forgetting's after_round, which releases them)
            metrics.update(self.similarity.after_round(self.algorithm, t))
        if self.forgetting:   # τ of each trained local model vs θ_g^r (not counted in time/round)
            metrics.update(self.forgetting.after_round(self.algorithm, t))
        self.algorithm.keep_local, self.algorithm.last_local = False, None   # the round's local models are not needed
        if t % int(cfg.eval_every) == 0 or t == int(cfg.rounds):
            tic = time.perf_counter()
            metrics.update(self.evaluator(self.algorithm, t))
            metrics["time/eval"] = time.perf_counter() - tic
        if self.new_clients and self.new_clients.due(t):   # fine-tune and score the held-out new clients
            tic = time.perf_counter()
            metrics.update(self.new_clients(self.algorithm, t))
            metrics["time/new_clients"] = time.perf_counter() - tic
        self.history.append({"round": t, **metrics})
        self.loggers.log(t, metrics)

    def _complete(self) -> dict:
        cfg = self.cfg
        times = self.times
        summary = {"status": "complete", "rounds": int(cfg.rounds),
                   "metrics": summarize(self.history, int(cfg.eval.final_window)),
                   "time_per_round": float(np.mean(times)) if times else math.nan,
                   "wall_time": float(np.sum(times)),
                   "final": {k: v for k, v in self.evaluator.last.items()},
                   **self.algorithm.finish(self.run_dir),
                   **(self.new_clients.summary(self.run_dir) if self.new_clients else {})}
        write_json(self.run_dir / "summary.json", summary)
        self.loggers.summary(summary)
        self.loggers.finish("complete")
        write_json(self.run_dir / "status.json", {"status": "complete", "round": int(cfg.rounds),
                                                  "config_fingerprint": self.fingerprint})
        return summary

    # ---- surviving: resume, skip, checkpoints -------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return ckpt.fingerprint(self.cfg)

    def _previous_run(self) -> dict | None:
        """What the run dir already holds: a complete run is skipped (resume=true) or archived (resume=false)."""
        status_file = self.run_dir / "status.json"
        if not status_file.exists():
            return None
        old = json.loads(status_file.read_text())
        if not self.cfg.resume:
            archive = self.run_dir / "previous" / time.strftime("%Y%m%d-%H%M%S")
            archive.mkdir(parents=True, exist_ok=True)
            for name in ("status.json", "summary.json", "metrics.jsonl", "checkpoints", "diagnostics", "wandb",
                         "config.yaml", "partition.png", "partition_counts.csv"):
                if (self.run_dir / name).exists():
                    os.replace(self.run_dir / name, archive / name)
            print(f"fedbench: resume=false: previous files of {self.run_dir} moved to {archive}", file=sys.stderr)
            return None
        if old.get("config_fingerprint") not in (None, self.fingerprint):
            raise ConfigError("resume", True, f"{self.run_dir} holds a run with a different config; use another "
                              "hydra.run.dir, or resume=false to start over there (old files are kept in previous/)")
        if old.get("status") == "complete" and (self.run_dir / "summary.json").exists():
            print(f"fedbench: {self.run_dir} is already complete; skipped (resume=false starts it over)", file=sys.stderr)
            return json.loads((self.run_dir / "summary.json").read_text())
        return None

    def _monitors(self) -> dict:
        return {n: m for n in ("forgetting", "new_clients") if (m := getattr(self, n, None)) is not None
                and hasattr(m, "state_dict")}

    def _state(self, t: int) -> dict:
        return {"algorithm": self.algorithm.state_dict(), "history": self.history, "times": self.times,
                "evaluator_last": self.evaluator.last, "wandb_id": self.loggers.wandb_id,
                "config_fingerprint": self.fingerprint,
                "monitors": {n: m.state_dict() for n, m in self._monitors().items()}}

    def _snapshot(self, t: int) -> dict:
        """A private copy of the state at a round boundary (saved if a signal interrupts the next round)."""
        return {"round": t, "state": copy.deepcopy(self._state(t))}

    def _restore(self, saved: dict) -> int:
        if saved.get("config_fingerprint") != self.fingerprint:
            raise ConfigError("resume", True, f"the checkpoint in {self.run_dir} was written by a different config; "
                              "use another hydra.run.dir or resume=false")
        self.algorithm.load_state_dict(saved["algorithm"])
        self.history, self.times = saved["history"], saved["times"]
        self.evaluator.last = saved["evaluator_last"]
        for n, m in self._monitors().items():
            m.load_state_dict(saved["monitors"].get(n, {}))
        t0 = int(saved["round"])
        metrics = self.run_dir / "metrics.jsonl"   # drop rows logged after the checkpoint
        if metrics.exists():
            keep = [ln for ln in metrics.read_text().splitlines() if ln.strip() and json.loads(ln)["round"] <= t0]
            tmp = metrics.with_suffix(".tmp")
            tmp.write_text("".join(ln + "\n" for ln in keep))
            os.replace(tmp, metrics)
        return t0
