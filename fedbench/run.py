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
from . import rundir, seeding
from .algorithms import ALGORITHMS
from .config import validate
from .console import header_lines
from .context import Context
from .data.datasets import load_dataset
from .data.federated import FederatedData
from .data.partitions import make_partition
from .data.schedule import DataSchedule
from .engine import numerics
from .engine.augment import build_augment
from .engine.executor import make_executor
from .engine.functional import FModel
from .errors import ConfigError, Diverged, RunFailed
from .evaluation import Evaluator, summarize
from .forgetting import ForgettingMonitor
from .loggers import build_loggers
from .models import build_model
from .newclients import NewClients
from .plots import heatmap
from .preemption import Preempted, PreemptionGuard
from .similarity import SimilarityMonitor


def host_copy(o):
    """A deep copy of ``o`` whose tensors are copied to the CPU."""
    if torch.is_tensor(o):
        return o.detach().to("cpu", copy=True)
    if isinstance(o, dict):
        return {k: host_copy(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)) and type(o) in (list, tuple):
        return type(o)(host_copy(v) for v in o)
    return copy.deepcopy(o)


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


def check_writable(run_dir: Path, min_free_mb: float = 0) -> None:
    """Fail before training if the run dir cannot be written or its disk is (nearly) full."""
    import shutil

    probe = run_dir / ".write_probe"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as e:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
        raise ConfigError("hydra.run.dir", str(run_dir), f"an existing or creatable, writable directory with free space ({e.strerror})") from None
    free = shutil.disk_usage(run_dir).free / 2**20
    if free < min_free_mb:
        raise ConfigError("hydra.run.dir", str(run_dir), f"a disk with at least checkpoint.min_free_mb={min_free_mb:g} MB free "
                          f"(only {free:.0f} MB left)")


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


def describe(e: BaseException) -> str:
    """One line for an error: a config error or a failed write as they say, an OSError as its path and cause."""
    if isinstance(e, (ConfigError, RunFailed)):
        return str(e)
    if isinstance(e, Preempted):
        return f"{signal_name(e.signum)} received"
    if isinstance(e, OSError) and e.filename:
        return f"cannot use {e.filename}: {e.strerror or e}"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"


class Run:
    def __init__(self, cfg, run_dir: str | Path, group: str | None = None, provenance: dict | None = None):
        """``group``: the sweep's name when this run is a job of a multirun (then a run that fails before training keeps
        its dir and status.json, for the sweep's summary and report); ``provenance``: Hydra's files for ``.hydra/``
        (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``), written once this run owns the dir."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.group = group
        self.provenance = provenance or {}
        self.guard: PreemptionGuard | None = None
        self.loggers = None
        self.loss_reference: float | None = None   # the divergence guard's reference loss (see check_finite)

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
        numerics.configure(hw.get("tf32", False), bool(hw.deterministic), self.device)   # TF32 off unless asked; strict determinism
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
        self.executor = make_executor(hw.executor, self.device, hw.precision, bool(hw.channels_last), int(hw.eval_batch),
                                      workers=hw.get("workers", 1), max_memory=hw.get("max_memory"))
        if self.executor.channels_last:   # the sequential executor on the CPU only (never under vmap)
            net = net.to(memory_format=torch.channels_last)
        fm = FModel(net)
        self.augment = build_augment(cfg.dataset)   # training-time augmentation (dataset.augment), or None
        # all an algorithm may use of the run (fedbench/context.py); fm and the initial model are read through it
        self.ctx = Context(cfg, self.data, fm, self.executor, fm.init_state(self.dtype, self.device), self.augment,
                           self.run_dir, publish=self.image, say=self.say,
                           observers=[lambda t, ids, res, phase: self.check_finite(t, ids, res)])
        self.algorithm = ALGORITHMS[cfg.algorithm.name](self.ctx)
        self.algorithm.setup()
        self.evaluator = Evaluator(self)
        # class-wise forgetting degree (FedKA Eq. 1) of the round's local models, for any method; off by default
        self.forgetting = ForgettingMonitor(self) if OmegaConf.select(cfg, "eval.forgetting.enabled", default=False) else None
        # FedReMa's S / MDS / Δs̄ (Eq. 5, Alg. 1, Eq. 8) of the round's local heads, for any method; off by default
        self.similarity = SimilarityMonitor(self) if OmegaConf.select(cfg, "eval.similarity.enabled", default=False) else None

    def _save_partition(self) -> None:
        counts = self.data.counts
        with rundir.atomic(self.run_dir / "partition_counts.csv") as f:
            np.savetxt(f, counts, fmt="%d", delimiter=",", header=",".join(self.data.classes), comments="")
        with rundir.written(self.run_dir / "partition.png") as png:   # a full disk: one line naming the file
            self.partition_png = heatmap(counts, png, f"partition: {self.cfg.partition.name}", "class", "client",
                                         cmap="Blues")

    # ---- services for algorithms ---------------------------------------------------------------------
    fm = property(lambda self: self.ctx.fm)
    initial_params = property(lambda self: self.ctx.initial[0])
    initial_buffers = property(lambda self: self.ctx.initial[1])

    def predict(self, params, buffers, idx: list[np.ndarray]) -> list[torch.Tensor]:
        return self.ctx.predict(params, buffers, idx)

    def say(self, line: str) -> None:
        """One line for the console and run.log (the loggers' console sink), or stderr before the loggers exist."""
        from .console import ConsoleSink

        sink = next((s for s in getattr(self.loggers, "sinks", []) if isinstance(s, ConsoleSink)), None)
        if sink is not None:
            sink.note(line)
        else:
            print(line, file=sys.stderr, flush=True)

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
        """The divergence guard, after every local training call: stop (status ``diverged``) on a non-finite loss or
        parameter, or on a client's round loss above ``divergence.factor`` x the reference loss, naming the round, the
        clients and the metric. The reference is ln(#classes), the cross-entropy of an untrained model's uniform guess
        (so a run that blows up within its first round is caught), or the first round's mean loss if that is higher."""
        loss = res.loss.detach().to(torch.float64).cpu()
        bad = ~torch.isfinite(loss)
        for v in res.params.values():
            bad |= ~torch.isfinite(v.flatten(1)).all(1).cpu()
        what = "non-finite loss or parameters"
        factor = OmegaConf.select(self.cfg, "divergence.factor", default=None)
        if not bad.any() and factor is not None:
            uniform = math.log(max(self.data.num_classes, 2))
            reference = uniform if self.loss_reference is None else self.loss_reference
            bad = loss > float(factor) * reference
            what = (f"training loss {float(loss[bad].max()) if bad.any() else 0:.3g} above divergence.factor={factor:g} "
                    f"x the reference {reference:.3g}")
            if self.loss_reference is None and not bad.any():
                self.loss_reference = max(float(loss.mean()), uniform)
        if bad.any():
            who = [clients[i] for i in torch.nonzero(bad).flatten().tolist()]
            raise Diverged(f"diverged in round {t}: {what} on client(s) {who}; run dir {self.run_dir} (status.json: "
                           f"diverged). Try a lower lr (now {self.cfg.lr}), optim.clip_grad_norm=10, or "
                           "divergence.factor=null to stop only on non-finite values")

    def image(self, key: str, path: Path, t: int) -> None:
        self.loggers.image(key, path, t)

    # ---- the rounds --------------------------------------------------------------------------------------
    def execute(self) -> dict:
        """Run this run in its run dir, resume it, or skip it if it is complete.

        Nothing in a complete run's dir changes (unless resume=false asks to start over). From the first write to the
        summary the run holds the dir's lock (:class:`~fedbench.rundir.RunDirLock`) and runs under one guard: any
        exception or signal ends with status.json ``failed`` / ``diverged`` / ``preempted`` and the reason, and only a
        run whose summary is written is ``complete``. A bad config found before training leaves no new run dir behind
        (a sweep's job keeps its dir, with status.json saying why)."""
        cfg = self.cfg
        try:
            validate(cfg)
        except ConfigError as e:
            self._refused(e)
            raise
        done = self._previous_run(owner=False)   # read-only: skip a complete run, refuse a different config
        if done is not None:
            return done
        fresh = not self.run_dir.is_dir() or not any(self.run_dir.iterdir())
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            lock = rundir.RunDirLock(self.run_dir)
            lock.acquire()
        except OSError as e:
            raise ConfigError("hydra.run.dir", str(self.run_dir), f"an existing or creatable, writable directory ({e.strerror})") from None
        remove_dir = False
        try:
            done = self._previous_run(owner=True)   # again, under the lock: archive (resume=false), skip or refuse
            if done is not None:
                return done
            with PreemptionGuard() as self.guard:
                try:
                    return self._guarded()
                except BaseException as e:
                    remove_dir = fresh and self.group is None and isinstance(e, ConfigError)
                    if remove_dir:   # a bad config leaves no run dir behind
                        self._remove_own_files()
                    else:
                        self._record_failure(e)
                    raise
        finally:
            lock.release()
            if remove_dir:
                try:
                    self.run_dir.rmdir()
                except OSError:
                    pass

    def _guarded(self) -> dict:
        cfg = self.cfg
        rounds = int(cfg.rounds)
        self.status = rundir.Status(self.run_dir, rounds=rounds, config_fingerprint=self.fingerprint)
        self.status.set()   # status "running": the first write
        for name, node in self.provenance.items():   # what Hydra would have written (hydra.output_subdir: null)
            (self.run_dir / ".hydra").mkdir(exist_ok=True)
            with rundir.atomic(self.run_dir / ".hydra" / name) as f:
                f.write(OmegaConf.to_yaml(node))
        self.setup()  # every check happens here (the run dir's free space first), before any training
        resumed = ckpt.load_latest(self.run_dir, self.device) if cfg.resume else None
        t0 = self._restore(resumed) if resumed else self._start_over()
        self.status.set(round=t0)
        self._save_partition()
        with rundir.atomic(self.run_dir / "config.yaml") as f:
            f.write(OmegaConf.to_yaml(cfg, resolve=True))
        title = f"{cfg.algorithm.name} | {cfg.dataset.name} | {cfg.partition.name}"
        # the W&B run of this run dir (a restart without a checkpoint resumes it too: no second W&B run)
        wandb_id = (resumed or {}).get("wandb_id") or self.previous_status.get("wandb_id")
        self.loggers = build_loggers(cfg, self.run_dir, title, start_round=t0, group=self.group, wandb_id=wandb_id,
                                     on_wandb_state=lambda state: self.status.set(wandb=state))
        self.status.set(wandb=self.loggers.wandb_state, wandb_id=self.loggers.wandb_id)
        self.loggers.header(*header_lines(self, t0))   # run dir, what runs, on what (console and run.log)
        if resumed:
            print(f"fedbench: resuming {self.run_dir} after round {t0}", file=sys.stderr)
        else:
            self.loggers.image("partition", self.partition_png, 0)
            first = self.evaluator(self.algorithm, 0)
            self.history.append({"round": 0, **first})
            self.loggers.log(0, first)
        self.boundary = self._snapshot(t0) if cfg.checkpoint.on_signal else None
        self.status.start_rounds(t0)
        for t in range(t0 + 1, rounds + 1):
            self.guard.check()   # a signal whose exception a library swallowed still stops the run here
            self._one_round(t)
            if cfg.checkpoint.every and t % int(cfg.checkpoint.every) == 0 and t < rounds:
                ckpt.save(self.run_dir, t, self._state(t), keep=int(cfg.checkpoint.keep))
            if cfg.checkpoint.on_signal:
                self.boundary = self._snapshot(t)
            self.status.progress(t, rounds)
        self.guard.check()
        return self._complete()

    def _refused(self, e: ConfigError) -> None:
        """A config refused before the run began: the empty dir Hydra made for it goes (a sweep's job keeps it, with
        status.json saying why, for the sweep's summary and report: an empty dir would read as "pending")."""
        try:
            if not self.run_dir.is_dir() or any(self.run_dir.iterdir()):
                return
            if self.group is None:
                self.run_dir.rmdir()
            else:
                rundir.Status(self.run_dir).set(status="failed", error=describe(e))
        except OSError:   # the config error is what the caller reports
            pass

    def _record_failure(self, e: BaseException) -> None:
        """status.json says how the run ended (and a signal saves the last finished round first)."""
        state = "preempted" if isinstance(e, Preempted) else "diverged" if isinstance(e, Diverged) else "failed"
        try:
            if isinstance(e, Preempted) and getattr(self, "boundary", None) is not None:
                e.checkpoint = ckpt.save(self.run_dir, self.boundary["round"], self.boundary["state"],
                                         keep=int(self.cfg.checkpoint.keep))
            if getattr(self, "status", None) is not None:
                self.status.set(status=state, error=describe(e))
        except Exception as again:   # e.g. the disk is full: say so, the original error is reported by the caller
            print(f"fedbench: could not record the failure in {self.run_dir}: {describe(again)}", file=sys.stderr)
        if self.loggers is not None:
            try:
                self.loggers.finish(state)
            except Exception:
                pass
        if state == "failed" and not isinstance(e, (ConfigError, RunFailed, OSError, Preempted)):
            import traceback

            try:   # an unexpected error: its traceback is kept for a bug report (the console gets one line)
                (self.run_dir / "traceback.txt").write_text("".join(traceback.format_exception(e)))
                e.traceback_file = self.run_dir / "traceback.txt"
            except OSError:
                pass

    def _remove_own_files(self) -> None:
        """Everything this run wrote in its (fresh) dir, but the lock file (released last)."""
        import shutil

        for p in self.run_dir.iterdir():
            if p.name != rundir.LOCK_NAME:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

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
        summary = {"status": "complete", "rounds": int(cfg.rounds), "config_fingerprint": self.fingerprint,
                   "metrics": summarize(self.history, int(cfg.eval.final_window)),
                   "time_per_round": float(np.mean(times)) if times else math.nan,
                   "wall_time": float(np.sum(times)),
                   "final": {k: v for k, v in self.evaluator.last.items()},
                   **self.algorithm.finish(self.run_dir),
                   **(self.new_clients.summary(self.run_dir) if self.new_clients else {})}
        if cfg.checkpoint.final_model:   # model.pt: the final global and personalized weights (fedbench.checkpoint)
            ckpt.save_final(self.run_dir, int(cfg.rounds), self.algorithm, self.fingerprint)
        with self.guard.deferred():   # the result is recorded whole: a signal now waits until it is
            rundir.write_json(self.run_dir / "summary.json", summary)
            self.status.set(status="complete", round=int(cfg.rounds), eta_s=0)
        ckpt.prune(self.run_dir, int(cfg.checkpoint.keep_complete))   # a complete run is never resumed
        self.loggers.summary(summary)
        self.loggers.finish("complete")
        if self.guard.received:
            print(f"fedbench: {signal_name(self.guard.received)} received while finishing; {self.run_dir} is complete",
                  file=sys.stderr)
        return summary

    # ---- surviving: resume, skip, checkpoints -------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return ckpt.fingerprint(self.cfg)

    def _previous_run(self, owner: bool) -> dict | None:
        """What the run dir already holds: a complete run with this config is skipped (resume=true), a run with another
        config refused; as the dir's ``owner`` (under its lock) resume=false moves the old files to previous/<time>/.
        A status.json cut by a crash is rebuilt from the summary, the saved config and the checkpoint."""
        self.previous_status = {}
        if not self.run_dir.is_dir():
            return None
        old, problem = rundir.read_json(self.run_dir / "status.json")
        if problem:
            if owner:
                print(f"fedbench: {self.run_dir}/status.json is unreadable ({problem}); rebuilding it from the run's "
                      "files", file=sys.stderr)
            old = None
        old = old if isinstance(old, dict) else {}
        summary, _ = rundir.read_json(self.run_dir / "summary.json")
        summary = summary if isinstance(summary, dict) else None
        if not self.cfg.resume:
            if owner and any(p.name not in (rundir.LOCK_NAME, "previous") for p in self.run_dir.iterdir()):
                archive = self.run_dir / "previous" / time.strftime("%Y%m%d-%H%M%S")
                archive.mkdir(parents=True, exist_ok=True)
                for p in list(self.run_dir.iterdir()):
                    if p.name not in (rundir.LOCK_NAME, "previous"):
                        os.replace(p, archive / p.name)
                print(f"fedbench: resume=false: previous files of {self.run_dir} moved to {archive}", file=sys.stderr)
            return None
        recorded = old.get("config_fingerprint") or (summary or {}).get("config_fingerprint") or self._saved_fingerprint()
        if recorded not in (None, self.fingerprint):
            raise ConfigError("resume", True, f"{self.run_dir} holds a run with a different config; use another "
                              "hydra.run.dir, or resume=false to start over there (old files are kept in previous/)")
        complete = old.get("status") == "complete" or (problem is not None and (summary or {}).get("status") == "complete")
        if complete and summary is not None:
            print(f"fedbench: {self.run_dir} is already complete; skipped (resume=false starts it over)", file=sys.stderr)
            return summary
        self.previous_status = old
        return None

    def _saved_fingerprint(self) -> str | None:
        """The fingerprint of the run dir's resolved config.yaml (for a run whose status.json is gone)."""
        try:
            return ckpt.fingerprint(OmegaConf.load(self.run_dir / "config.yaml"))
        except Exception:
            return None

    def _monitors(self) -> dict:
        return {n: m for n in ("forgetting", "new_clients") if (m := getattr(self, n, None)) is not None
                and hasattr(m, "state_dict")}

    def _state(self, t: int) -> dict:
        return {"algorithm": self.algorithm.state_dict(), "history": self.history, "times": self.times,
                "evaluator_last": self.evaluator.last, "wandb_id": self.loggers.wandb_id,
                "loss_reference": self.loss_reference,
                "config_fingerprint": self.fingerprint,
                "monitors": {n: m.state_dict() for n, m in self._monitors().items()}}

    def _snapshot(self, t: int) -> dict:
        """A private copy of the state at a round boundary (saved if a signal interrupts the next round), in host
        memory: a GPU run keeps no second copy of its whole state on the device."""
        return {"round": t, "state": host_copy(self._state(t))}

    def _restore(self, saved: dict) -> int:
        if saved.get("config_fingerprint") != self.fingerprint:
            raise ConfigError("resume", True, f"the checkpoint in {self.run_dir} was written by a different config; "
                              "use another hydra.run.dir or resume=false")
        self.algorithm.load_state_dict(saved["algorithm"])
        self.history, self.times = saved["history"], saved["times"]
        self.evaluator.last = saved["evaluator_last"]
        for n, m in self._monitors().items():
            m.load_state_dict(saved["monitors"].get(n, {}))
        self.loss_reference = saved.get("loss_reference")
        t0 = int(saved["round"])
        self._trim_metrics(t0)
        return t0

    def _start_over(self) -> int:
        """No checkpoint: the run starts at round 0 (rows a killed earlier attempt logged are redone, not repeated)."""
        self.history, self.times = [], []
        self._trim_metrics(-1)
        return 0

    def _trim_metrics(self, t0: int) -> None:
        """metrics.jsonl keeps the rows of rounds <= t0: later ones are logged again by this session, so every round
        appears once. A line cut by a kill or a full disk is dropped, and the file as it was kept next to it."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return
        text = path.read_text(errors="replace")
        keep, torn = [], False
        for ln in text.splitlines():
            try:
                row = json.loads(ln)
            except ValueError:
                torn = torn or bool(ln.strip())
                continue
            if isinstance(row, dict) and isinstance(row.get("round"), int) and row["round"] <= t0:
                keep.append(ln)
        if torn:
            copy_path = path.with_name(f"metrics.jsonl.torn-{time.strftime('%Y%m%d-%H%M%S')}")
            with rundir.atomic(copy_path) as f:
                f.write(text)
            print(f"fedbench: {path} ended with a cut line (a crash while writing); dropped it, the file as it was is "
                  f"kept as {copy_path.name}", file=sys.stderr)
        with rundir.atomic(path) as f:
            f.write("".join(ln + "\n" for ln in keep))
