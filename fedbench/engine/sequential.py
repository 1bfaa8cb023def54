"""What an executor is, by its reference: the sequential executor trains a round's clients one after another.

A :class:`LocalJob` (M clients' local training: stacked models, step schedules, the loss, the optimizer) goes in, a
:class:`LocalResult` (the trained stacks, the mean losses) comes out. :class:`Executor` holds what every executor
shares so that they train the same steps — the step plan laid out on the device, steps of one sample a BatchNorm
model cannot train dropped, the dropout keys, the optimizer state, per-client prediction — and
:class:`SequentialExecutor` is the reference the vectorized executor (fedbench/engine/vectorized.py) is tested equal
to. ``make_executor`` (fedbench/engine/executor.py) picks one by name.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..models.dropout import keyed, step_key
from . import optim
from .augment import draw_job
from .functional import FModel, cross_entropy
from .schedule import Plan, plan
from .stack import Stack, clone, row

log = logging.getLogger("fedbench.engine.executor")  # the executors' logger (one name for all of them, as before)


@dataclass
class LocalJob:
    """Local training of M clients. Every stack has a leading client axis of size M."""

    fm: FModel
    params: Stack
    buffers: Stack
    trainable: list[str]
    schedule: list[list[torch.Tensor]]  # per client: index arrays/tensors (into x/y) of its steps
    x: torch.Tensor
    y: torch.Tensor
    opt: optim.OptimSpec
    opt_state: Stack | None = None  # persisted optimizer state (or None: fresh)
    loss: Callable = cross_entropy  # loss(fm, params, buffers, x, y, ctx) -> scalar, for ONE client
    ctx: Stack = field(default_factory=dict)  # per-client constants [M, ...]
    shared: dict = field(default_factory=dict)  # constants common to all clients
    augment: object | None = None  # training-time augmentation (augment.RandomCropFlip: draw + apply)
    aug_key: tuple = ()  # (seed, purpose, round, ...) + (client id,) keys a client's augmentation draws
    client_ids: list[int] | None = None
    pack: int = 1  # batches per step (a step's indices = ``pack`` equal sub-batches)


@dataclass
class LocalResult:
    params: Stack
    buffers: Stack
    opt_state: Stack
    loss: torch.Tensor  # [M] mean training loss per client
    steps: torch.Tensor  # [M] number of local steps


class Executor:
    name = "base"
    vectorized = False

    def __init__(
        self,
        precision: str = "fp32",
        channels_last: bool = False,
        eval_batch: int = 1000,
        workers: int = 1,
        max_memory=None,
    ):
        self.precision = precision
        self.channels_last = channels_last
        self.eval_batch = eval_batch
        self.workers = workers
        self.max_memory = max_memory
        self.loop_mode: Callable | None = None  # a context entered around every step loop (diagnostics: syncs.py)
        self.dropped_samples = 0  # in steps of one sample that BatchNorm cannot train on (_steps_to_train)
        self._said: set = set()
        self.root: Executor = self  # the run's executor; a twin (sequential_twin) counts and speaks through it
        # told of local training as it goes, (client-steps done, client-steps planned): the run's first-steps estimate
        # (fedbench.callbacks.FirstSteps); a Python call per step, never a read of the device
        self.on_steps: Callable[[int, int], None] | None = None

    def sequential_twin(self, **kw) -> "SequentialExecutor":
        """A sequential executor for the jobs a method cannot vectorize, counting its dropped samples in this one and
        saying each note once for both."""
        twin = SequentialExecutor(precision=self.precision, eval_batch=self.eval_batch, **kw)
        twin.root, twin._said, twin.loop_mode = self.root, self.root._said, self.loop_mode
        return twin

    def autocast(self, device: torch.device):
        if self.precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _say_once(self, key, msg: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(msg)

    def _loop(self):
        return self.loop_mode() if self.loop_mode is not None else contextlib.nullcontext()

    def _steps_to_train(self, job: LocalJob) -> list[list]:
        """The job's schedule less its steps of ONE sample (per sub-batch of a pack) when the model cannot normalise
        one sample in training mode (:meth:`FModel.batch_of_one_fails`: BatchNorm on one value per channel): torch
        raises there, so such a step is dropped as ``drop_last`` would drop it — here, the one place both executors
        read every schedule from (make_schedule's or an algorithm's own), so they train the same steps. A client
        left without steps keeps its model. Said once, with the count."""
        single = [[len(b) == job.pack for b in s] for s in job.schedule]
        steps = sum(map(sum, single))
        if not steps or not job.fm.batch_of_one_fails(job.x):
            return job.schedule
        self.root.dropped_samples += steps * job.pack
        self._say_once(
            "one sample",
            f"fedbench: dropped {steps} local step(s) of a single sample ({steps * job.pack} sample(s), "
            f"{sum(all(s) and len(s) > 0 for s in single)} client(s) left without a step): the model's BatchNorm "
            "cannot normalise one sample in training mode, so such a batch is dropped as drop_last would drop it "
            "(said once; executor.dropped_samples counts them all)",
        )
        return [[b for b, one in zip(s, ones) if not one] for s, ones in zip(job.schedule, single)]

    def _steps_done(self, done: int, planned: int = 0) -> None:
        if self.root.on_steps is not None:
            self.root.on_steps(done, planned)

    def _plan(self, job: LocalJob, padded: bool) -> tuple[Plan, torch.Tensor | None]:
        """The job's batches (and augmentation parameters, per sample of ``plan.flat``) on the device."""
        p = plan(self._steps_to_train(job), job.x.device, pack=job.pack, padded=padded)
        ids = job.client_ids if job.client_ids is not None else list(range(len(job.schedule)))
        aug = draw_job(job.augment, p, job.aug_key, ids, job.x[:1]) if job.augment is not None else None
        return p, aug

    @staticmethod
    def _dropout_base(job: LocalJob) -> int | None:
        """The key of the job's dropout masks ((seed, purpose, phase, round) of ``aug_key``); None: no dropout."""
        if not job.fm.has_dropout:
            return None
        from .. import seeding

        return seeding.key31(*job.aug_key, "dropout") if job.aug_key else 0

    def _state0(self, job: LocalJob) -> Stack:
        """A copy of the job's optimizer state to update (fresh zeros when it has none)."""
        if job.opt_state is not None:
            return clone(job.opt_state)
        return optim.init_state(job.opt, job.params, job.trainable, lead=(len(job.schedule),))

    def train(self, job: LocalJob) -> LocalResult:
        raise NotImplementedError

    def _fmt(self, t: torch.Tensor) -> torch.Tensor:
        return t

    @torch.no_grad()
    def predict(
        self, fm: FModel, params: Stack, buffers: Stack, x: torch.Tensor, idx: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Eval-mode logits of client m's model on samples ``x[idx[m]]``, for every m."""
        fm.set_mode(False)
        out = []
        for m, ids in enumerate(idx):
            p = {k: self._fmt(v[m]) for k, v in params.items()}
            b = row(buffers, m)
            out.append(
                torch.cat(
                    [
                        fm(p, b, self._fmt(x.index_select(0, ids[i : i + self.eval_batch])))
                        for i in range(0, max(1, len(ids)), self.eval_batch)
                    ]
                )
            )
        fm.set_mode(True)
        return out


class SequentialExecutor(Executor):
    """The reference: each client's local steps, one client after another."""

    name = "sequential"

    def _fmt(self, t: torch.Tensor) -> torch.Tensor:
        if self.channels_last and t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
        return t

    def train(self, job: LocalJob, laid_out: tuple | None = None) -> LocalResult:
        pl, aug = laid_out or self._plan(job, padded=False)
        self._steps_done(0, int(sum(pl.steps)))
        P, B, S = clone(job.params), clone(job.buffers), self._state0(job)
        m_count = len(job.schedule)
        losses = torch.zeros(m_count, dtype=torch.float64, device=job.x.device)
        job.fm.set_mode(True)
        workers = min(self.workers, m_count)
        if workers <= 1:
            for m in range(m_count):
                self._client(job, pl, aug, m, P, B, S, losses)
        else:
            # clients in parallel threads, one intra-op thread each (hardware.workers; scripts/bench.py measured
            # 0.98-1.1x vs one client on 2 intra-op threads on a 2-core CPU, more cores may gain more); the
            # results do not depend on the number of workers (tested)
            queue = iter(range(m_count))
            lock = threading.Lock()

            def work(i: int) -> None:
                with job.fm.worker(i):
                    while True:
                        with lock:
                            m = next(queue, None)
                        if m is None:
                            return
                        self._client(job, pl, aug, m, P, B, S, losses)

            threads_before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                with ThreadPoolExecutor(workers) as pool:
                    for f in [pool.submit(work, i) for i in range(workers)]:
                        f.result()
            finally:
                torch.set_num_threads(threads_before)
        return LocalResult(P, B, S, losses.cpu(), torch.tensor(pl.steps))

    def _client(self, job: LocalJob, pl: Plan, aug, m: int, P, B, S, losses) -> None:
        """Client m's local steps; writes row m of the output stacks."""
        device = job.x.device
        p = {k: self._fmt(v[m].clone()) for k, v in P.items()}
        leaves = [p[k].requires_grad_(True) for k in job.trainable]
        b = {k: v[m].clone() for k, v in B.items()}
        s = {k: v[m].clone() for k, v in S.items()}
        ctx = {**job.shared, **row(job.ctx, m)}
        total = torch.zeros((), dtype=torch.float64, device=device)  # the sum of the step losses, as the vectorized one
        o = pl.offsets[m]
        base = self._dropout_base(job)
        cid = job.client_ids[m] if job.client_ids is not None else m
        with self._loop():
            for step in range(pl.steps[m]):
                idx = pl.flat[o[step] : o[step + 1]]
                x = job.x.index_select(0, idx)
                if aug is not None:
                    x = job.augment.apply(x, aug[o[step] : o[step + 1]])
                x = self._fmt(x)
                y = job.y.index_select(0, idx)
                drop = keyed(step_key(base, cid, step).to(device)) if base is not None else contextlib.nullcontext()
                with self.autocast(device), drop:
                    loss = job.loss(job.fm, p, b, x, y, ctx)
                grads = list(torch.autograd.grad(loss, leaves))
                optim.step(job.opt, leaves, grads, job.trainable, s, batched=False)
                total += loss.detach().to(torch.float64)
                self._steps_done(1)
        for k in P:
            P[k][m] = p[k].detach()
        for k in B:
            B[k][m] = b[k]
        for k in S:
            S[k][m] = s[k]
        losses[m] = total / max(1, pl.steps[m])
