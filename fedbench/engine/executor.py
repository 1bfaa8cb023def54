"""Executors run the local objectives of a round's clients.

``sequential`` (the reference) trains one client after another; ``vectorized`` trains all of them
at once: parameters stacked on a leading client axis, the per-client loss mapped with
``torch.func.vmap``, the summed loss differentiated, one elementwise optimizer step on the stacks.
Clients whose schedules differ in length or batch size are grouped per step (never padded), so BatchNorm
statistics and optimizer states match the sequential run exactly.
On a 2-core CPU the sequential loop is about 2x faster (vmapped convolutions become grouped
convolutions); on a GPU stacking removes launch overhead. ``executor=auto`` picks accordingly.
"""
from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.func import vmap

from .. import seeding
from . import optim
from .functional import FModel, cross_entropy
from .stack import Stack, clone, row, rows, set_rows


@dataclass
class LocalJob:
    """Local training of M clients. Every stack has a leading client axis of size M."""

    fm: FModel
    params: Stack
    buffers: Stack
    trainable: list[str]
    schedule: list[list[torch.Tensor]]   # per client: index tensors (into x/y) of its steps
    x: torch.Tensor
    y: torch.Tensor
    opt: optim.OptimSpec
    opt_state: Stack | None = None      # persisted optimizer state (or None: fresh)
    loss: Callable = cross_entropy      # loss(fm, params, buffers, x, y, ctx) -> scalar, for ONE client
    ctx: Stack = field(default_factory=dict)      # per-client constants [M, ...]
    shared: dict = field(default_factory=dict)    # constants common to all clients
    augment: Callable | None = None     # augment(x_batch, generator) -> x_batch (training-time augmentation)
    aug_key: tuple = ()                 # (seed, purpose, round, ...) + (client id, step) keys the augmentation draws
    client_ids: list[int] | None = None

    def augmented(self, x: torch.Tensor, m: int, step: int) -> torch.Tensor:
        """Client m's batch at ``step``, augmented with draws keyed by (aug_key, client id, step)."""
        if self.augment is None:
            return x
        k = self.client_ids[m] if self.client_ids is not None else m
        return self.augment(x, seeding.torch_generator(*self.aug_key, k, step))


@dataclass
class LocalResult:
    params: Stack
    buffers: Stack
    opt_state: Stack
    loss: torch.Tensor     # [M] mean training loss per client
    steps: torch.Tensor    # [M] number of local steps


class Executor:
    name = "base"
    vectorized = False

    def __init__(self, precision: str = "fp32", channels_last: bool = False, eval_batch: int = 1000, workers: int = 1):
        self.precision = precision
        self.channels_last = channels_last
        self.eval_batch = eval_batch
        self.workers = workers

    def autocast(self, device: torch.device):
        if self.precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _init(self, job: LocalJob):
        m = len(job.schedule)
        st = clone(job.opt_state) if job.opt_state is not None else optim.init_state(job.opt, job.params, job.trainable, lead=(m,))
        return clone(job.params), clone(job.buffers), st

    def train(self, job: LocalJob) -> LocalResult:
        raise NotImplementedError

    def _fmt(self, t: torch.Tensor) -> torch.Tensor:
        return t

    @torch.no_grad()
    def predict(self, fm: FModel, params: Stack, buffers: Stack, x: torch.Tensor, idx: list[torch.Tensor]) -> list[torch.Tensor]:
        """Eval-mode logits of client m's model on samples ``x[idx[m]]``, for every m."""
        fm.set_mode(False)
        out = []
        for m, ids in enumerate(idx):
            p = {k: self._fmt(v[m]) for k, v in params.items()}
            b = row(buffers, m)
            out.append(torch.cat([fm(p, b, self._fmt(x.index_select(0, ids[i:i + self.eval_batch])))
                                  for i in range(0, max(1, len(ids)), self.eval_batch)]))
        fm.set_mode(True)
        return out


class SequentialExecutor(Executor):
    """The reference: each client's local steps, one client after another."""

    name = "sequential"

    def _fmt(self, t: torch.Tensor) -> torch.Tensor:
        if self.channels_last and t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
        return t

    def train(self, job: LocalJob) -> LocalResult:
        P, B, S = self._init(job)
        m_count = len(job.schedule)
        losses = torch.zeros(m_count, dtype=torch.float64)
        job.fm.set_mode(True)
        workers = min(self.workers, m_count)
        if workers <= 1:
            for m in range(m_count):
                self._client(job, m, P, B, S, losses)
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
                        self._client(job, m, P, B, S, losses)

            threads_before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                with ThreadPoolExecutor(workers) as pool:
                    for f in [pool.submit(work, i) for i in range(workers)]:
                        f.result()
            finally:
                torch.set_num_threads(threads_before)
        return LocalResult(P, B, S, losses, torch.tensor([len(s) for s in job.schedule]))

    def _client(self, job: LocalJob, m: int, P, B, S, losses) -> None:
        """Client m's local steps; writes row m of the output stacks."""
        device = job.x.device
        p = {k: self._fmt(v[m].clone()) for k, v in P.items()}
        leaves = [p[k].requires_grad_(True) for k in job.trainable]
        b = {k: v[m].clone() for k, v in B.items()}
        s = {k: v[m].clone() for k, v in S.items()}
        ctx = {**job.shared, **row(job.ctx, m)}
        total = torch.zeros((), device=device)
        for step, idx in enumerate(job.schedule[m]):
            x = self._fmt(job.augmented(job.x.index_select(0, idx), m, step))
            y = job.y.index_select(0, idx)
            with self.autocast(device):
                loss = job.loss(job.fm, p, b, x, y, ctx)
            grads = list(torch.autograd.grad(loss, leaves))
            optim.step(job.opt, leaves, grads, job.trainable, s, batched=False)
            total += loss.detach()
        for k in P:
            P[k][m] = p[k].detach()
        for k in B:
            B[k][m] = b[k]
        for k in S:
            S[k][m] = s[k]
        losses[m] = total.item() / max(1, len(job.schedule[m]))


class VectorizedExecutor(Executor):
    """All clients at once: vmap over the client axis, one optimizer step on the stacks."""

    name = "vectorized"
    vectorized = True

    def train(self, job: LocalJob) -> LocalResult:
        P, B, S = self._init(job)
        m_count = len(job.schedule)
        lengths = [len(s) for s in job.schedule]
        losses = torch.zeros(m_count, dtype=torch.float64, device=job.x.device)
        job.fm.set_mode(True)
        trainable = set(job.trainable)

        def one_client(p, b, x, y, ctx, shared):
            return job.loss(job.fm, p, b, x, y, {**shared, **ctx})

        mapped = vmap(one_client, in_dims=(0, 0, 0, 0, 0, None))
        for t in range(max(lengths, default=0)):
            groups: dict[int, list[int]] = defaultdict(list)
            for m in range(m_count):
                if t < lengths[m]:
                    groups[len(job.schedule[m][t])].append(m)
            for ids in groups.values():
                full = len(ids) == m_count
                sel = None if full else torch.tensor(ids, device=job.x.device)
                p = P if full else rows(P, sel)
                b = B if full else rows(B, sel)
                s = S if full else rows(S, sel)
                ctx = job.ctx if full else rows(job.ctx, sel)
                leaves = {k: (v.detach().requires_grad_(True) if k in trainable else v) for k, v in p.items()}
                idx = torch.stack([job.schedule[m][t] for m in ids])
                x, y = job.x[idx], job.y[idx]
                if job.augment is not None:
                    x = torch.stack([job.augmented(x[i], m, t) for i, m in enumerate(ids)])
                with self.autocast(job.x.device):
                    loss = mapped(leaves, b, x, y, ctx, job.shared)
                tl = [leaves[k] for k in job.trainable]
                grads = list(torch.autograd.grad(loss.sum(), tl))
                optim.step(job.opt, tl, grads, job.trainable, s, batched=True)
                if full:
                    for k in job.trainable:   # leaves are views of P's storage: already updated
                        P[k] = leaves[k].detach()
                    S.update(s)
                else:
                    set_rows(P, sel, {k: leaves[k].detach() for k in job.trainable})
                    set_rows(B, sel, b)
                    set_rows(S, sel, s)
                losses[ids] += loss.detach().to(torch.float64)
        steps = torch.tensor(lengths)
        return LocalResult(P, B, S, (losses.cpu() / steps.clamp(min=1)), steps)

    @torch.no_grad()
    def predict(self, fm: FModel, params: Stack, buffers: Stack, x: torch.Tensor, idx: list[torch.Tensor]) -> list[torch.Tensor]:
        """Clients stacked, samples padded to the longest client (eval mode: no cross-sample interaction)."""
        if fm.eval_uses_batch_stats:   # padding would enter the batch statistics: evaluate client by client
            return super().predict(fm, params, buffers, x, idx)
        fm.set_mode(False)
        n = max((len(i) for i in idx), default=0)
        f = vmap(fm)
        chunks = []
        size = max(16, self.eval_batch // max(1, len(idx)))  # about eval_batch samples per call in total
        for i in range(0, n, size):
            j = min(n, i + size)
            pad = torch.stack([torch.nn.functional.pad(ids[i:j], (0, (j - i) - len(ids[i:j]))) for ids in idx])
            chunks.append(f(params, buffers, x[pad]))
        fm.set_mode(True)
        logits = torch.cat(chunks, dim=1) if chunks else None
        return [logits[m, : len(ids)] if logits is not None else x.new_zeros((0,)) for m, ids in enumerate(idx)]


def make_executor(name: str, device: torch.device, precision: str = "fp32", channels_last: bool = False,
                  eval_batch: int = 1000, workers: int | str = 1) -> Executor:
    """``auto``: sequential on CPU (measured faster there), vectorized on CUDA. ``workers`` (sequential on CPU):
    clients trained in parallel threads; ``auto`` = one per intra-op thread torch would use."""
    if name == "auto":
        name = "vectorized" if device.type == "cuda" else "sequential"
    cls = {"sequential": SequentialExecutor, "vectorized": VectorizedExecutor}[name]
    if workers == "auto":
        workers = torch.get_num_threads() if device.type == "cpu" else 1
    return cls(precision=precision, channels_last=channels_last and name == "sequential", eval_batch=eval_batch,
               workers=int(workers) if name == "sequential" else 1)
