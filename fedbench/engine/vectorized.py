"""The vectorized executor trains all of a round's clients at once: parameters stacked on a leading client axis,
the per-client loss mapped with ``torch.func.vmap``, the summed loss differentiated, one elementwise optimizer step on
the stacks.

It makes exactly ONE batched call per local step index, whatever the clients' sizes: the clients are ordered by their
number of steps, so those still training at step t are a prefix of the stacks (a view: a client that has finished is
not computed and nothing of it changes), and batches shorter than the step's longest are padded and masked
(fedbench/engine/masking.py: the padding has zero weight in the loss and in BatchNorm statistics). Everything a
round's step loop reads — sample indices, padding masks, augmentation parameters — is laid out on the device before
the loop (schedule.plan, augment.draw_job); losses accumulate on the device; the loop never waits for the host. With
``max_memory`` the clients are trained in chunks that fit (a probe step measures one client-step's working memory
once); an out-of-memory error halves the chunk. Its step compiled (``hardware.compile``) or captured as CUDA graphs
(``hardware.cuda_graphs``): fedbench/engine/fast.py, off by default. A job it cannot pad runs on the sequential
executor (fedbench/engine/sequential.py), the reference it is tested equal to.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch.func import vmap

from ..models.dropout import keyed, step_key
from . import optim
from .fast import FastSteps
from .functional import FModel
from .masking import IGNORE, is_pad_aware, padded_batch
from .schedule import Plan
from .sequential import Executor, LocalJob, LocalResult
from .stack import Stack


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
