"""Class prototypes: per-client, per-class means of any model output, and their server-side average.

One place for "class means": FedProto's feature prototypes and FedDistill's per-class mean logits (and meant for
the prototypes of FedReMa+F / FedPAC too). Outputs are computed by the run's executor in eval mode, so both
executors give the same numbers; the means themselves are matrix operations.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .engine.stack import Stack


class _Outputs:
    """``fn(params, buffers, x)`` dressed as an FModel (call + ``set_mode``), so the executor's ``predict`` runs it."""

    def __init__(self, fm, fn: Callable):
        self.fm, self.fn = fm, fn
        self.eval_uses_batch_stats = fm.eval_uses_batch_stats

    def __call__(self, params, buffers, x):
        return self.fn(params, buffers, x)

    def set_mode(self, train: bool) -> None:
        self.fm.set_mode(train)


def client_outputs(ctx, fn: Callable, params: Stack, buffers: Stack, idx: list[np.ndarray]) -> list[torch.Tensor]:
    """Eval-mode, no-grad ``fn(p_m, b_m, x)`` of stacked client model m on the pool samples ``idx[m]``, for every m.

    ``ctx``: the algorithm's :class:`~fedbench.context.Context`. ``fn`` is any pure function of one client's (params,
    buffers, inputs), e.g. ``ctx.fm.features`` or a predictor that combines several heads; it runs under ``vmap``
    with the vectorized executor.
    """
    return ctx.executor.predict(_Outputs(ctx.fm, fn), params, buffers, ctx.data.x, ctx.data.tensors(idx))


def class_means(
    values: list[torch.Tensor], labels: list[torch.Tensor], num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per client m: the mean of ``values[m]`` ([n_m, ...], flattened to [n_m, d]) over its samples of each class.

    Returns (means [M, C, d], counts [M, C]); a class the client lacks gets a zero row and count 0.
    FedProto Eq. 4 (C_k^(j) = mean of f(x) over the client's class-j samples); FedDistill's per-class logits.
    """
    means, counts = [], []
    for v, y in zip(values, labels):
        v = v.flatten(1)
        onehot = F.one_hot(y, num_classes).to(v.dtype)  # [n, C]
        c = onehot.sum(0)
        means.append((onehot.T @ v) / c.clamp(min=1).unsqueeze(1))
        counts.append(c)
    return torch.stack(means), torch.stack(counts)


def global_prototypes(means: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Server: P̄_c = unweighted mean of the class-c means of the clients that have class c (FedProto Eq. 6,
    PFLlib ``proto_aggregation``). ``means`` [M, C, d], ``counts`` [M, C] -> (P̄ [C, d], has [C] bool)."""
    has = counts > 0
    total = (has.unsqueeze(-1) * means).sum(0)
    return total / has.sum(0).clamp(min=1).unsqueeze(1).to(means.dtype), has.any(0)


def nearest_prototype_logits(h: torch.Tensor, protos: torch.Tensor, has: torch.Tensor) -> torch.Tensor:
    """Scores for nearest-prototype classification: −MSE(h_i, P̄_c) per sample and class (PFLlib FedProto
    ``test_metrics``: argmin of ``nn.MSELoss()(rep, proto)``); classes without a prototype get the lowest
    finite score. ``h`` [B, d], ``protos`` [C, d], ``has`` [C] -> [B, C]. Pure (runs under vmap)."""
    d2 = ((h.flatten(1).unsqueeze(1) - protos.unsqueeze(0)) ** 2).mean(-1)
    return torch.where(has.unsqueeze(0), -d2, torch.full_like(d2, torch.finfo(d2.dtype).min))


__all__ = ["client_outputs", "class_means", "global_prototypes", "nearest_prototype_logits"]
