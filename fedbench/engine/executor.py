"""Executors run the local objectives of a round's clients; :func:`make_executor` picks one by name.

``sequential`` (the reference, fedbench/engine/sequential.py, with what every executor shares: ``LocalJob`` in,
``LocalResult`` out, the ``Executor`` base) trains one client after another; ``vectorized``
(fedbench/engine/vectorized.py) trains all of them at once: parameters stacked on a leading client axis, the
per-client loss mapped with ``torch.func.vmap``, one batched call per local step index, in chunks that fit
``hardware.max_memory``. On a 2-core CPU the sequential loop is about 2x faster (vmapped convolutions become grouped
convolutions); on a GPU stacking removes launch overhead. ``executor=auto`` picks accordingly. The names of both
modules are importable from here.
"""

from __future__ import annotations

import torch

from .sequential import Executor, LocalJob, LocalResult, SequentialExecutor  # noqa: F401  (re-exported)
from .vectorized import VectorizedExecutor, memory_budget  # noqa: F401  (re-exported)


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
