"""Executors run the local objectives of a round's clients.

``sequential`` (the reference) trains one client after another; ``vectorized`` trains all of them
at once: parameters stacked on a leading client axis, the per-client loss mapped with
``torch.func.vmap``, the summed loss differentiated, one elementwise optimizer step on the stacks.

The vectorized executor makes exactly ONE batched call per local step index, whatever the clients' sizes: the
clients are ordered by their number of steps, so those still training at step t are a prefix of the stacks (a
view: a client that has finished is not computed and nothing of it changes), and batches shorter than the step's
longest are padded and masked (fedbench/engine/masking.py: the padding has zero weight in the loss and in
BatchNorm statistics). Everything a round's step loop reads — sample indices, padding masks, augmentation
parameters — is laid out on the device before the loop (schedule.plan, augment.draw_job); losses accumulate on
the device; the loop never waits for the host. With ``max_memory`` the clients are trained in chunks that fit
(a probe step measures one client-step's working memory once); an out-of-memory error halves the chunk.
On a 2-core CPU the sequential loop is about 2x faster (vmapped convolutions become grouped
convolutions); on a GPU stacking removes launch overhead. ``executor=auto`` picks accordingly. Its step compiled
(``hardware.compile``) or captured as CUDA graphs (``hardware.cuda_graphs``): fedbench/engine/fast.py, off by default.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.func import vmap

from ..models.dropout import keyed, step_key
from . import optim
from .augment import draw_job
from .fast import FastSteps
from .functional import FModel, cross_entropy
from .masking import IGNORE, is_pad_aware, padded_batch
from .schedule import Plan, plan
from .stack import Stack, clone, row

log = logging.getLogger(__name__)


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


def memory_budget(max_memory, device: torch.device) -> float | None:
    """``hardware.max_memory`` in bytes: null -> None (no budget), a number <= 1 -> that fraction of the device's
    memory (a GPU's total memory; on the CPU the machine's physical memory), a larger number -> bytes."""
    if max_memory is None:
        return None
    v = float(max_memory)
    if v > 1:
        return v
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return v * total


def _nbytes(d: dict) -> int:
    return sum(v.numel() * v.element_size() for v in d.values() if torch.is_tensor(v))


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


class VectorizedExecutor(Executor):
    """All clients at once: vmap over the client axis, one optimizer step on the stacks, one call per step."""

    name = "vectorized"
    vectorized = True

    def __init__(self, *a, compile: bool = False, cuda_graphs: bool = False, **kw):
        super().__init__(*a, **kw)
        self._probed: dict = {}  # job signature -> bytes of one client-step's working memory (probe step)
        # hardware.compile / hardware.cuda_graphs: the step compiled and/or captured per shape bucket (engine/fast.py)
        self.fast = FastSteps(compile, cuda_graphs) if compile or cuda_graphs else None

    def train(self, job: LocalJob) -> LocalResult:
        pl, aug = self._plan(job, padded=True)
        if pl.has_padding and not (is_pad_aware(job.loss) and job.fm.pads_ok):
            what = getattr(job.loss, "__qualname__", repr(job.loss))
            self._say_once(
                ("sequential", what),
                f"fedbench: the local objective {what} is not marked pad-aware (or the "
                "model has a layer that reads the whole batch), and its clients' batches differ in size: "
                "those jobs run on the sequential executor (same results, slower); see fedbench/engine/masking.py",
            )
            return self.sequential_twin().train(job, (pl, aug))
        self._steps_done(0, int(sum(pl.steps)))
        m_count, dev = len(job.schedule), job.x.device
        order = pl.order
        perm = None if order == list(range(m_count)) else torch.tensor(order)

        def take(d: Stack, rows=slice(None)) -> Stack:  # rows of the stacks in `order`
            if perm is None:
                return {k: v[rows].clone() for k, v in d.items()}
            return {k: v[perm[rows].to(v.device)] for k, v in d.items()}

        state0 = (
            job.opt_state
            if job.opt_state is not None
            else optim.init_state(job.opt, job.params, job.trainable, lead=(m_count,))
        )
        P, B, S, C = take(job.params), take(job.buffers), take(state0), take(job.ctx)
        aug_rows = aug[pl.rows] if aug is not None else None
        losses = torch.zeros(m_count, dtype=torch.float64, device=dev)
        job.fm.set_mode(True)

        calls = self._mapped(job)
        chunk = self._chunk(job, pl, calls)
        ids = self.order_ids(job, pl)
        a = 0
        while a < m_count:
            b = min(m_count, a + chunk)
            try:
                if self.fast is not None:
                    self.fast.run(self, job, pl, aug_rows, calls, P, B, S, C, losses, a, b, chunk)
                else:
                    with self._loop():
                        self._steps(job, pl, aug_rows, calls, P, B, S, C, losses, a, b, ids)
                a = b
            except torch.OutOfMemoryError:
                if b - a == 1:
                    raise
                chunk = (b - a) // 2
                self._say_once(
                    "oom",
                    f"fedbench: out of memory training {b - a} clients in one call; retrying with "
                    f"{chunk} per call (hardware.max_memory sets the budget)",
                )
                for d, src in ((P, job.params), (B, job.buffers), (S, state0)):  # this block starts over
                    for k, v in take(src, slice(a, b)).items():
                        d[k][a:b] = v
                losses[a:b] = 0
                if self.fast is not None:  # the programs of the larger chunk (buffers, graphs' memory) go too
                    self.fast.programs.clear()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        if perm is not None:  # back to the job's client order
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(m_count)
            P, B, S = ({k: v[inv.to(v.device)] for k, v in d.items()} for d in (P, B, S))
            losses = losses[inv.to(dev)]
        steps = torch.tensor(pl.steps)
        return LocalResult(P, B, S, losses.cpu() / steps.clamp(min=1), steps)

    @staticmethod
    def _mapped(job: LocalJob) -> tuple:
        """The job's loss over a batch of clients (vmap), for plain and for padded batches."""

        def one_client(p, b, x, y, ctx, shared, key):
            with keyed(key) if key is not None else contextlib.nullcontext():  # the client-step's dropout masks
                return job.loss(job.fm, p, b, x, y, {**shared, **ctx})

        def one_padded(p, b, x, y, ctx, shared, key, real_sub):
            with padded_batch(real_sub):
                return one_client(p, b, x, y, ctx, shared, key)

        kd = 0 if job.fm.has_dropout else None  # the per-client dropout keys (None without dropout)
        return (
            vmap(one_client, in_dims=(0, 0, 0, 0, 0, None, kd)),
            vmap(one_padded, in_dims=(0, 0, 0, 0, 0, None, kd, 0)),
        )

    def order_ids(self, job: LocalJob, pl: Plan, pad: int = 0) -> torch.Tensor | None:
        """The client ids in ``pl.order`` (and ``pad`` zeros) on the job's device, for the dropout keys of a step loop
        (one copy before the loop, not one per step); None without dropout."""
        if self._dropout_base(job) is None:
            return None
        ids = job.client_ids if job.client_ids is not None else list(range(len(job.schedule)))
        return torch.tensor([ids[m] for m in pl.order] + [0] * pad, device=job.x.device)

    def _keys(self, job: LocalJob, pl: Plan, a: int, n: int, t: int, ids=None) -> torch.Tensor | None:
        """The dropout keys of step ``t`` of the clients at positions [a, a + n) of ``pl.order`` (None: no dropout);
        ``ids``: :meth:`order_ids`, laid out before the loop."""
        base = self._dropout_base(job)
        if base is None:
            return None
        ids = self.order_ids(job, pl) if ids is None else ids
        return step_key(base, ids[a : a + n], t)

    def _steps(self, job: LocalJob, pl: Plan, aug_rows, calls, P, B, S, C, losses, a: int, b: int, ids=None) -> None:
        """Local training of the clients at positions [a, b) of ``pl.order``: one batched call per step index."""
        trainable = set(job.trainable)
        mapped, mapped_padded = calls
        lb = pl.L // max(1, pl.pack)
        for t in range(pl.steps[pl.order[a]]):
            n = min(b, pl.active[t]) - a  # the clients still training are a prefix: views, no copies
            r = pl.row0[t] + a
            idx = pl.index[r : r + n]
            x, y = job.x[idx], job.y[idx]
            if aug_rows is not None:
                x = job.augment.apply(x.flatten(0, 1), aug_rows[r : r + n].flatten(0, 1)).unflatten(0, (n, pl.L))
            leaves = {
                k: (v[a : a + n].detach().requires_grad_(True) if k in trainable else v[a : a + n])
                for k, v in P.items()
            }
            bufs = {k: v[a : a + n] for k, v in B.items()}  # BatchNorm updates them in place
            state = {k: v[a : a + n] for k, v in S.items()}
            ctx = {k: v[a : a + n] for k, v in C.items()}
            key = self._keys(job, pl, a, n, t, ids)
            with self.autocast(job.x.device):
                if pl.padded[t]:
                    real = pl.real[r : r + n]
                    y = torch.where(real, y, IGNORE)
                    loss = mapped_padded(leaves, bufs, x, y, ctx, job.shared, key, real[:, :lb])
                else:
                    loss = mapped(leaves, bufs, x, y, ctx, job.shared, key)
            tl = [leaves[k] for k in job.trainable]
            grads = list(torch.autograd.grad(loss.sum(), tl))
            optim.step(job.opt, tl, grads, job.trainable, state, batched=True)  # in place: the leaves view P
            losses[a : a + n] += loss.detach().to(torch.float64)
            self._steps_done(int(n))

    # ---- memory ---------------------------------------------------------------------------------------------
    def chunk_size(self, job: LocalJob) -> int:
        """Clients per batched call for ``job`` (all of them unless ``max_memory`` asks for less)."""
        return self._chunk(job, self._plan(job, padded=True)[0], self._mapped(job))

    def _chunk(self, job: LocalJob, pl: Plan, calls) -> int:
        m_count = len(pl.steps)
        budget = memory_budget(self.max_memory, job.x.device)
        if budget is None or m_count <= 1 or not any(pl.steps):
            return max(1, m_count)
        per = self._client_step_bytes(job, pl, calls)
        return max(1, min(m_count, int((budget - self.bytes_in_use(job)) // per)))

    @staticmethod
    def bytes_in_use(job: LocalJob) -> int:
        """Memory already taken on the job's device: the allocator's count on a GPU; on the CPU the data and the
        job's stacks (twice: the executor's working copies)."""
        if job.x.device.type == "cuda":
            return torch.cuda.memory_allocated(job.x.device)
        return job.x.numel() * job.x.element_size() + 2 * sum(_nbytes(d) for d in (job.params, job.buffers, job.ctx))

    def client_step_bytes(self, job: LocalJob) -> int:
        """Working memory of one client in one batched step (see :meth:`_client_step_bytes`)."""
        pl, _ = self._plan(job, padded=True)
        return self._client_step_bytes(job, pl, self._mapped(job))

    def _client_step_bytes(self, job: LocalJob, pl: Plan, calls) -> int:
        """Measured once per kind of job with a probe step (the longest client's first batch, on copies): on a GPU
        the allocator's peak, on the CPU the tensors autograd saves (twice: their gradients are as large) — plus
        the batch (and its augmented copy), the gradients and the optimizer's temporaries (3x the trained
        parameters)."""
        key = (
            getattr(job.loss, "__qualname__", id(job.loss)),
            tuple(job.trainable),
            pl.L,
            tuple(job.x.shape[1:]),
            job.x.dtype,
            self.precision,
        )
        if key in self._probed:
            return self._probed[key]
        dev, m0 = job.x.device, pl.order[0]
        trainable = set(job.trainable)
        p = {
            k: (v[m0 : m0 + 1].detach().clone().requires_grad_(True) if k in trainable else v[m0 : m0 + 1])
            for k, v in job.params.items()
        }
        b = {k: v[m0 : m0 + 1].clone() for k, v in job.buffers.items()}
        ctx = {k: v[m0 : m0 + 1] for k, v in job.ctx.items()}
        x, y = job.x[pl.index[:1]], job.y[pl.index[:1]]  # row 0: client m0's first step
        drop = self._keys(job, pl, 0, 1, 0)
        saved: dict = {}

        def keep(t):
            st = t.untyped_storage()
            saved[st.data_ptr()] = st.nbytes()
            return t

        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), self.autocast(dev):
            if pl.padded[0]:
                real = pl.real[:1]
                loss = calls[1](
                    p, b, x, torch.where(real, y, IGNORE), ctx, job.shared, drop, real[:, : pl.L // max(1, pl.pack)]
                )
            else:
                loss = calls[0](p, b, x, y, ctx, job.shared, drop)
        torch.autograd.grad(loss.sum(), [p[k] for k in job.trainable])
        act = 2 * sum(saved.values())
        if dev.type == "cuda":
            act = max(act, torch.cuda.max_memory_allocated(dev) - before)
        per = (
            act + 2 * x.numel() * x.element_size() + 3 * sum(p[k].numel() * p[k].element_size() for k in job.trainable)
        )
        self._probed[key] = int(per)
        return int(per)

    @torch.no_grad()
    def predict(
        self, fm: FModel, params: Stack, buffers: Stack, x: torch.Tensor, idx: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """Clients stacked, samples padded to the longest client (eval mode: no cross-sample interaction)."""
        if fm.eval_uses_batch_stats:  # padding would enter the batch statistics: evaluate client by client
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


def make_executor(
    name: str,
    device: torch.device,
    precision: str = "fp32",
    channels_last: bool = False,
    eval_batch: int = 1000,
    workers: int | str = 1,
    max_memory=None,
    compile: bool = False,
    cuda_graphs: bool = False,
) -> Executor:
    """``auto``: sequential on CPU (measured faster there), vectorized on CUDA. ``workers`` (sequential on CPU):
    clients trained in parallel threads; ``auto`` = one per intra-op thread torch would use. ``channels_last``
    applies to the sequential executor on the CPU only (measured faster there; under vmap it falls back to slow
    strided copies). ``max_memory`` (vectorized): the memory budget that sizes the client chunks. ``compile`` and
    ``cuda_graphs`` (vectorized): the fast paths of fedbench/engine/fast.py (build.hardware refuses them elsewhere)."""
    if name == "auto":
        name = "vectorized" if device.type == "cuda" else "sequential"
    cls = {"sequential": SequentialExecutor, "vectorized": VectorizedExecutor}[name]
    if workers == "auto":
        workers = torch.get_num_threads() if device.type == "cpu" else 1
    fast = {"compile": bool(compile), "cuda_graphs": bool(cuda_graphs)} if name == "vectorized" else {}
    return cls(
        precision=precision,
        channels_last=channels_last and name == "sequential" and device.type == "cpu",
        eval_batch=eval_batch,
        workers=int(workers) if name == "sequential" else 1,
        max_memory=max_memory,
        **fast,
    )
