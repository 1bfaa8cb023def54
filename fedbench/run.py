"""One run = one simulated federation: cfg -> components (fedbench/build.py) -> rounds with callbacks around them
(fedbench/callbacks.py), in the run dir's lifecycle (fedbench/rundir.py), with checkpoints (fedbench/checkpoint.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from . import build, communication, rundir
from . import checkpoint as ckpt
from .callbacks import DivergenceGuard
from .config import validate
from .errors import ConfigError
from .preemption import PreemptionGuard


class Run:
    def __init__(self, cfg, run_dir: str | Path, group: str | None = None, provenance=None, callbacks=()):
        """``group``: the sweep's name when this run is a job of a multirun (then a run that fails before training keeps
        its dir and status.json, for the sweep's summary and report); ``provenance``: Hydra's files for ``.hydra/``
        (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``), written once this run owns the dir; ``callbacks``: extra
        callbacks (fedbench/callbacks.py), called after the run's own."""
        self.cfg, self.run_dir, self.group, self.provenance = cfg, Path(run_dir), group, provenance or {}
        self.rundir, self.checkpointer = rundir.RunDir(run_dir, cfg, group), ckpt.Checkpointer(self)
        self.extra_callbacks, self.validated = list(callbacks), False
        self.guard = self.loggers = self.status = None
        self.check_finite = DivergenceGuard(self)  # after every local training call (algorithms call it)

    loss_reference = property(lambda self: self.check_finite.reference)  # the divergence guard's (in checkpoints)
    boundary = property(lambda self: self.checkpointer.boundary)
    fm = property(lambda self: self.ctx.fm)  # the algorithm's context holds the model (MOON may replace it)
    initial_params = property(lambda self: self.ctx.initial[0])
    initial_buffers = property(lambda self: self.ctx.initial[1])
    predict = property(lambda self: self.ctx.predict)  # (params, buffers, idx) -> logits, as algorithms get it

    def setup(self) -> None:
        """Everything before the first round (fedbench/build.py), the config validated first (once per run)."""
        self.validated = self.validated or validate(self.cfg) or True
        build.setup(self)

    def sample_clients(self, t: int):
        return build.sample_clients(self.cfg, self.data.num_clients, getattr(self, "new_clients", None), t)

    def image(self, key: str, path: Path, t: int) -> None:
        self.loggers.image(key, path, t)

    def execute(self) -> dict:
        """Run this run in its run dir, resume it, or skip it if it is complete (resume=false starts it over). From the
        first write to the summary the run holds the dir's lock and runs under one guard: any exception or signal ends
        with status.json ``failed`` / ``diverged`` / ``preempted`` and the reason; only a run whose summary is written
        is ``complete``. A bad config leaves no new run dir behind (a sweep's job keeps its dir, saying why)."""
        try:
            self.validated = validate(self.cfg) or True
        except ConfigError as e:
            self.rundir.refused(e)
            raise
        done = self.rundir.previous(owner=False)  # read-only: skip a complete run, refuse a different config
        self.skipped = done is not None
        if done is not None:
            self.rundir.finish_complete()  # what a run killed right after it completed left undone
            return done
        with self.rundir.locked():
            done = self.rundir.previous(owner=True)  # again, under the lock: archive (resume=false), skip or refuse
            if done is not None:
                return done
            record = lambda e: self.rundir.record_failure(e, self.status, self.boundary, self.loggers)  # noqa: E731
            with PreemptionGuard() as self.guard, self.rundir.failures(record):
                return self._guarded()

    def _guarded(self) -> dict:
        cfg = self.cfg
        self.status = rundir.Status(self.run_dir, rounds=int(cfg.rounds), config_fingerprint=self.rundir.fingerprint)
        self.rundir.start(self.status, self.provenance)  # status.json "running": the first write
        self.setup()  # every check happens here (the run dir's free space first), before any training
        resumed = ckpt.load_latest(self.run_dir, self.device) if cfg.resume else None
        t0 = self.checkpointer.restore(resumed) if resumed else self.checkpointer.start_over()
        self.status.set(round=t0)
        self.partition_png = self.rundir.write_inputs(self.data)
        return self.loop(t0)

    def loop(self, t0: int) -> dict:
        """Rounds t0+1 .. cfg.rounds, with the callbacks around each (fedbench/callbacks.py), then the summary."""
        rounds = int(self.cfg.rounds)
        for cb in self.callbacks:
            cb.on_start(self, t0)
        self.status.start_rounds(t0)
        for t in range(t0 + 1, rounds + 1):
            self.guard.check()  # a signal whose exception a library swallowed still stops the run here
            self._one_round(t)
            self.status.progress(t, rounds)
        self.guard.check()
        return self._complete()

    def _one_round(self, t: int) -> None:
        scheduled = self.data_schedule.apply(self, t) if self.data_schedule else {}  # round t's client data
        clients = self.sample_clients(t)
        for cb in self.callbacks:
            cb.before_round(self, t)
        tic = time.perf_counter()
        metrics = {**self.algorithm.round(t, clients), **scheduled}
        metrics["time/round"] = time.perf_counter() - tic  # the algorithm's round only (not the callbacks)
        metrics.update(communication.round_metrics(self.algorithm.traffic(t, clients), self.history))
        self.times.append(metrics["time/round"])
        for cb in self.callbacks:
            cb.after_round(self, t, metrics)

    def _complete(self) -> dict:
        summary = rundir.summary(self)
        self.checkpointer.save_final()  # model.pt (checkpoint.final_model)
        self.rundir.record_complete(summary, self.status, self.guard)  # summary.json, status.json "complete"
        ckpt.prune(self.run_dir, int(self.cfg.checkpoint.keep_complete))  # a complete run is never resumed
        for cb in self.callbacks:
            cb.on_end(self, summary)
        if self.guard.received:
            sig = rundir.signal_name(self.guard.received)
            print(f"fedbench: {sig} received while finishing; {self.run_dir} is complete", file=sys.stderr)
        return summary
