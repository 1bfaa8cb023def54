"""One run = one simulated federation: cfg -> components (fedbench/build.py) -> rounds with callbacks around them
(fedbench/callbacks.py), in the run dir's lifecycle (fedbench/rundir.py), with checkpoints (fedbench/checkpoint.py)."""

from __future__ import annotations

import time
from pathlib import Path

from . import build, communication, distributed, rundir
from . import checkpoint as ckpt
from .callbacks import DivergenceGuard
from .config import validate
from .errors import ConfigError
from .preemption import PreemptionGuard


class Run:
    def __init__(self, cfg, run_dir: str | Path, group: str | None = None, provenance=None, callbacks=()):
        """``group``: the sweep's name of a multirun's job (a job that fails before training keeps its dir and status);
        ``provenance``: Hydra's files for ``.hydra/``, written once this run owns the dir; ``callbacks``: extra ones."""
        self.cfg, self.run_dir, self.group, self.provenance = cfg, Path(run_dir), group, provenance or {}
        self.rundir, self.checkpointer = rundir.RunDir(run_dir, cfg, group), ckpt.Checkpointer(self)
        self.extra_callbacks, self.validated = list(callbacks), False
        self.guard = self.loggers = self.status = None
        self.check_finite = DivergenceGuard(self)  # after every local training call (algorithms call it)
        self.world = distributed.World()  # one process, unless execute() joins a launched group

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
        """Run, resume or skip (complete) this run in its dir, holding its lock, under one guard: an exception or signal
        ends with status.json ``failed``/``diverged``/``preempted`` and why; only a run whose summary is written is
        ``complete``; a bad config leaves no new dir. Over several processes rank 0 does this, the others follow."""
        try:
            self.validated = validate(self.cfg) or True
        except ConfigError as e:
            self.rundir.refused(e)
            raise
        self.world = distributed.join(self.cfg.hardware)
        if not self.world.leader:
            return rundir.follow(self)
        with self.world.leading():  # if rank 0 stops before the rounds, the ranks waiting for its word stop too
            return self._lead()

    def _lead(self) -> dict:
        self.skipped = (done := self.rundir.previous(owner=False)) is not None  # read-only: skip complete, refuse other
        if self.skipped:  # (finish what a run killed right after it completed left undone)
            return self.world.announce("skip", self.rundir.finish_complete() or done)
        with self.rundir.locked():
            done = self.rundir.previous(owner=True)  # again, under the lock: archive (resume=false), skip or refuse
            if done is not None:
                return self.world.announce("skip", done)
            record = lambda e: self.rundir.record_failure(e, self.status, self.checkpointer.boundary, self.loggers)  # noqa: E731
            with PreemptionGuard() as self.guard, self.rundir.failures(record):
                try:
                    return self._guarded()
                except BaseException as e:
                    raise self.world.explain(e) from None  # another rank's failure that stopped this one, if any

    def _guarded(self) -> dict:
        cfg = self.cfg
        self.status = rundir.Status(self.run_dir, rounds=int(cfg.rounds), config_fingerprint=self.rundir.fingerprint)
        self.rundir.start(self.status, self.provenance)  # status.json "running": the first write
        self.world.announce("go")  # the other ranks set up while this one does
        self.setup()  # every check happens here (the run dir's free space first), before any training
        resumed = self.world.checkpoint(lambda: ckpt.read_latest(self.run_dir) if cfg.resume else None)  # host memory
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
        return summary
