"""Fast paths of the vectorized executor's local step: compiled (``hardware.compile``) and captured as CUDA graphs
(``hardware.cuda_graphs``). Both off by default; the eager step (``VectorizedExecutor._steps``) stays the reference.

A fast step is ONE function of tensors (:func:`make_core`): gather the batch, loss of every client (vmap), gradients
(``torch.autograd.grad``), gradient clipping, the optimizer update, all over the stacked state. Its shapes are
fixed per *bucket*: the stacks shrink as clients finish (one shape per count n of active clients), so a step of n
clients runs on the first ``bucket(n)`` rows — the next power of two, capped at the chunk — and the rows of clients
that have already finished are computed on a copy of a live client's batch and then put back as they were
(``torch.where`` on a per-row ``live`` mask: exact, no arithmetic reaches them). A chunk of K clients thus has at
most ``ceil(log2 K) + 1`` shapes, each compiled (``dynamic=False``: no recompilation per step, no symbolic sizes)
and captured once, then replayed; up to 2x the work of the eager step on a step with few clients (the eager step
computes exactly the n live rows).

Everything the step reads and writes lives in *resident* buffers of the program (:class:`StepProgram`, one per job
signature): the chunk's stacks (parameters, buffers, optimizer state, per-client constants), the job's shared
constants, a loss accumulator and the per-step inputs (sample indices, padding mask, live mask, dropout keys,
augmentation parameters). A bucket of n rows reads and writes the first n rows of them, so every bucket's CUDA
graph sees the same addresses and the programs outlive a job (a round): a chunk is copied in, its steps replayed,
and copied out. Per step the host only copies the step's rows of the job's device tables (laid out before the
loop, as the eager step does) into the per-step buffers and launches the graph: no host read.

The compiled program and the captured one are the same code: :meth:`StepProgram.call` either calls the (compiled)
step or the replay of its capture; on a CPU the capture is skipped — the warm-up calls, the state restored after
them and the resident buffers are exercised all the same (tests/test_fast_path.py), and fedbench/engine/fastcheck.py
compares the captured step with the eager one on CUDA (scripts/gpu_check.py calls it on the device).

Numerics: the compiled and captured steps compute what the eager step computes; where it pads a job's batches it
normalises through ``masked_batch_norm`` on every step (the eager step uses torch's ``F.batch_norm`` on steps
without padding), and inductor may fuse and reorder sums: they agree to round-off (tested in fp64 to 1e-12 of
the state's scale, measured ~1e-15).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..models.dropout import step_key
from . import optim
from .masking import IGNORE
from .stack import Stack


def bucket(n: int, cap: int) -> int:
    """Rows computed for a step of ``n`` active clients in a chunk of ``cap``: the next power of two, at most cap."""
    return min(cap, 1 << max(0, n - 1).bit_length())


def make_core(job, calls: tuple, padded: bool, lb: int, autocast: Callable) -> Callable:
    """The step as a function of tensors, updating ``P``, ``B``, ``S`` and ``acc`` in place (rows where ``live``)."""
    mapped, mapped_padded = calls
    trainable = list(job.trainable)
    spec, augment = job.opt, job.augment

    def core(P, B, S, C, shared, xs, ys, idx, real, live, key, aug, acc):
        n, L = idx.shape
        x, y = xs[idx], ys[idx]
        if aug is not None:
            x = augment.apply(x.flatten(0, 1), aug.flatten(0, 1)).unflatten(0, (n, L))
        leaves = {k: (v.detach().clone().requires_grad_(True) if k in trainable else v) for k, v in P.items()}
        bufs = {k: v.clone() for k, v in B.items()}  # BatchNorm updates them in place
        state = {k: v.clone() for k, v in S.items()}
        with autocast():
            if padded:
                loss = mapped_padded(leaves, bufs, x, torch.where(real, y, IGNORE), C, shared, key, real[:, :lb])
            else:
                loss = mapped(leaves, bufs, x, y, C, shared, key)
        tl = [leaves[k] for k in trainable]
        grads = list(torch.autograd.grad(loss.sum(), tl))
        new, loss = [v.detach() for v in tl], loss.detach()  # nothing that requires grad crosses a graph break
        if spec.clip_grad_norm:
            optim.clip_grad_norm_(grads, spec.clip_grad_norm, batched=True)
            # inductor's C++ code generator fails on the per-client clipping fused with the update (torch 2.14,
            # KeyError in its outer-loop fusion): two graphs, on every device, so the CPU tests compile what a GPU does
            torch._dynamo.graph_break()
        optim.update(spec, new, grads, trainable, state, batched=True)
        with torch.no_grad():
            for dst, src in ((P, dict(zip(trainable, new))), (B, bufs), (S, state)):
                for k, v in src.items():
                    d = dst[k]
                    d.copy_(torch.where(live.view((-1,) + (1,) * (d.dim() - 1)), v.to(d.dtype), d))
            acc.add_(torch.where(live, loss.to(acc.dtype), 0.0))

    return core


def _tensors(tree) -> list[torch.Tensor]:
    return [v for v in tree_flatten(tree)[0] if torch.is_tensor(v)]


def _shape_of(tree) -> tuple:
    """Structure, tensor shapes/dtypes and non-tensor values of a pytree (part of a program's signature)."""
    leaves, spec = tree_flatten(tree)
    return (
        str(spec),
        tuple((tuple(v.shape), v.dtype, v.device) if torch.is_tensor(v) else ("value", repr(v)) for v in leaves),
    )


def _names_read(fn, owner, depth: int = 2) -> set:
    """The attribute names ``fn``'s code reads (``self.mu`` -> ``mu``), and those of the owner's methods it calls."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    names = set(code.co_names) if code is not None else set()
    if depth and owner is not None:
        for n in list(names):
            method = getattr(type(owner), n, None)
            if callable(method) and hasattr(method, "__code__"):
                names |= _names_read(method, owner, depth - 1)
    return names


def _scalars(fn) -> tuple:
    """What a captured step bakes in from the loss's object and closure: the int/float/bool/str values and tensor
    addresses (one level into dicts) of the object's attributes its code reads, and of its closure's cells. A change
    captures again (a compiled step's guards see them by themselves)."""
    owner = getattr(fn, "__self__", None)
    read = _names_read(fn, owner)
    found = [(k, v) for k, v in (vars(owner).items() if hasattr(owner, "__dict__") else ()) if k in read]
    for i, cell in enumerate(getattr(getattr(fn, "__func__", fn), "__closure__", None) or ()):
        try:
            found.append((f"cell{i}", cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    out = []
    for k, v in found:
        if isinstance(v, (bool, int, float, str)):
            out.append((k, v))
        elif torch.is_tensor(v):
            out.append((k, v.data_ptr(), tuple(v.shape)))
        elif isinstance(v, dict) and all(torch.is_tensor(t) for t in v.values()):
            out.append((k, tuple((n, t.data_ptr()) for n, t in v.items())))
    return tuple(out)


def _row_shapes(d: Stack) -> tuple:
    """Per-client shapes and dtypes of a stack (its number of clients is not part of a program)."""
    return tuple((k, tuple(v.shape[1:]), v.dtype, v.device) for k, v in d.items())


def signature(job, pl, padded: bool, cap: int, precision: str, graphs: bool) -> tuple:
    """Everything a program's compiled code or captured graphs depend on, besides the values it copies in."""
    loss = job.loss
    return (
        getattr(loss, "__func__", loss),
        id(getattr(loss, "__self__", None)),
        job.opt,
        tuple(job.trainable),
        padded,
        pl.L,
        pl.pack,
        cap,
        precision,
        id(job.fm),
        id(job.augment),
        job.fm.has_dropout,
        _row_shapes(job.params),
        _row_shapes(job.buffers),
        _row_shapes(job.ctx),
        _shape_of(job.shared),
        (job.x.data_ptr(), tuple(job.x.shape), job.x.dtype, job.y.data_ptr(), tuple(job.y.shape)),
        _scalars(loss) if graphs else (),
    )


def capture(fn: Callable, device: torch.device, pool) -> Callable:
    """``fn`` recorded as a CUDA graph (after two warm-up calls on a side stream, as torch's docs require); returns
    its replay. On another device: the warm-up calls only, and ``fn`` itself (what the CPU tests run)."""
    if device.type != "cuda":
        fn()
        fn()
        return fn
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph.replay


class StepProgram:
    """One job signature's fast step: resident buffers for a chunk of up to ``cap`` clients, and one callable per
    bucket (compiled and/or captured). The graphs of all buckets share one memory pool: each writes only into the
    resident buffers, so no graph's output lives in the pool and they may replay in any order."""

    def __init__(self, job, pl, calls, cap: int, padded: bool, autocast, *, compile: bool, graphs: bool):
        self.cap, self.padded, self.graphs = cap, padded, graphs
        self.device = job.x.device
        core = make_core(job, calls, padded, pl.L // max(1, pl.pack), autocast)
        if compile:
            compiled = torch.compile(core, dynamic=False)

            def core(*a, _c=compiled):  # noqa: F811
                # autograd.grad traced into the graph; one compiled shape per bucket and program
                with torch._dynamo.config.patch(trace_autograd_ops=True, recompile_limit=256):
                    return _c(*a)

        self.core = core

        def rows(d: Stack) -> Stack:
            return {k: torch.zeros((cap, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in d.items()}

        self.P, self.B, self.C = rows(job.params), rows(job.buffers), rows(job.ctx)
        self.S: Stack = {}
        self.shared = tree_map(lambda v: v.clone() if torch.is_tensor(v) else v, job.shared)
        dev, L = self.device, pl.L
        self.acc = torch.zeros(cap, dtype=torch.float64, device=dev)
        self.idx = torch.zeros((cap, L), dtype=torch.long, device=dev)
        self.real = torch.ones((cap, L), dtype=torch.bool, device=dev)
        self.live = torch.zeros(cap, dtype=torch.bool, device=dev)
        self.key = torch.zeros(cap, dtype=torch.int64, device=dev) if job.fm.has_dropout else None
        self.aug = torch.zeros((cap, L, 3), dtype=torch.long, device=dev) if job.augment is not None else None
        self.calls: dict[int, Callable] = {}  # bucket -> its step (compiled call, or a graph's replay)
        self.pool = torch.cuda.graph_pool_handle() if graphs and dev.type == "cuda" else None
        self.captures = 0

    def load(self, job, P: Stack, B: Stack, S: Stack, C: Stack, a: int, b: int) -> None:
        """The chunk [a, b) of the working stacks into the resident buffers, and the job's shared constants."""
        if not self.S:  # the optimizer state's layout is known with the first chunk
            self.S = {k: torch.zeros((self.cap, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in S.items()}
        for dst, src in ((self.P, P), (self.B, B), (self.S, S), (self.C, C)):
            for k, v in src.items():
                dst[k][: b - a].copy_(v[a:b])
        for d, s in zip(_tensors(self.shared), _tensors(job.shared)):
            d.copy_(s)
        self.acc.zero_()

    def store(self, P: Stack, B: Stack, S: Stack, losses: torch.Tensor, a: int, b: int) -> None:
        for dst, src in ((P, self.P), (B, self.B), (S, self.S)):
            for k, v in dst.items():
                v[a:b].copy_(src[k][: b - a])
        losses[a:b] += self.acc[: b - a]

    def _fn(self, job, nb: int) -> Callable:
        views = [{k: v[:nb] for k, v in d.items()} for d in (self.P, self.B, self.S, self.C)]
        step = [self.idx[:nb], self.real[:nb], self.live[:nb]]
        key = self.key[:nb] if self.key is not None else None
        aug = self.aug[:nb] if self.aug is not None else None
        core, shared, xs, ys, acc = self.core, self.shared, job.x, job.y, self.acc[:nb]
        return lambda: core(*views, shared, xs, ys, *step, key, aug, acc)

    def call(self, job, nb: int) -> None:
        """One step on the first ``nb`` resident rows (its inputs already in the per-step buffers)."""
        fn = self.calls.get(nb)
        if fn is None:
            fn = self._fn(job, nb)
            if self.graphs:  # the warm-up calls step the state: keep it, capture, put it back
                kept = [t.clone() for d in (self.P, self.B, self.S) for t in d.values()] + [self.acc.clone()]
                fn = capture(fn, self.device, self.pool)
                for t, k in zip([t for d in (self.P, self.B, self.S) for t in d.values()] + [self.acc], kept):
                    t.copy_(k)
                self.captures += 1
            self.calls[nb] = fn
        fn()


class FastSteps:
    """The vectorized executor's step loop on :class:`StepProgram`s (cached per job signature, at most ``keep``)."""

    def __init__(self, compile: bool, graphs: bool, keep: int = 8):
        self.compile, self.graphs, self.keep = bool(compile), bool(graphs), keep
        self.programs: dict[tuple, StepProgram] = {}

    def program(self, job, pl, calls, cap: int, padded: bool, autocast, precision: str) -> StepProgram:
        sig = signature(job, pl, padded, cap, precision, self.graphs)
        prog = self.programs.pop(sig, None)
        if prog is None:
            prog = StepProgram(job, pl, calls, cap, padded, autocast, compile=self.compile, graphs=self.graphs)
            while len(self.programs) >= self.keep:
                self.programs.pop(next(iter(self.programs)))
        self.programs[sig] = prog  # most recently used last
        return prog

    def run(self, ex, job, pl, aug_rows, calls, P, B, S, C, losses, a: int, b: int, chunk: int) -> None:
        """Local training of the clients at positions [a, b) of ``pl.order`` (as ``VectorizedExecutor._steps``), a
        chunk of at most ``chunk`` clients: every chunk of a job runs on the same program (the rows of a smaller last
        chunk's bucket beyond its clients are masked like finished clients')."""
        T = pl.steps[pl.order[a]]
        if T == 0:
            return
        cap = min(chunk, len(pl.steps))
        prog = self.program(job, pl, calls, cap, pl.has_padding, lambda: ex.autocast(job.x.device), ex.precision)
        # the chunk's per-step rows, laid out before the loop: step t reads rows[s:s + nb] of pl.index/real/aug
        # (rows of finished clients repeat the first client's batch) and live[s:s + nb]
        ns = [min(b, pl.active[t]) - a for t in range(T)]
        nbs = [bucket(n, cap) for n in ns]
        starts = np.cumsum([0] + nbs)
        rows = np.concatenate([pl.row0[t] + a + np.where(np.arange(nb) < n, np.arange(nb), 0) for t, n, nb in
                               zip(range(T), ns, nbs)])  # fmt: skip
        live = np.concatenate([np.arange(nb) < n for n, nb in zip(ns, nbs)])
        dev = job.x.device
        rows_d, live_d = torch.from_numpy(rows).to(dev), torch.from_numpy(live).to(dev)
        base = ex._dropout_base(job)
        ids = ex.order_ids(job, pl, pad=cap)  # (a bucket's masked rows past the last client read the pad)
        prog.load(job, P, B, S, C, a, b)
        with ex._loop():
            for t in range(T):
                s, nb = int(starts[t]), nbs[t]
                r = rows_d[s : s + nb]
                prog.idx[:nb].copy_(pl.index[r])
                prog.real[:nb].copy_(pl.real[r])
                prog.live[:nb].copy_(live_d[s : s + nb])
                if prog.aug is not None:
                    prog.aug[:nb].copy_(aug_rows[r])
                if prog.key is not None:
                    prog.key[:nb].copy_(step_key(base, ids[a : a + nb], t))
                prog.call(job, nb)
                ex._steps_done(ns[t])
        prog.store(P, B, S, losses, a, b)


__all__ = ["FastSteps", "StepProgram", "bucket", "capture", "make_core", "signature"]
