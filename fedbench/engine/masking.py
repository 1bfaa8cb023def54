"""Padded batches: how the vectorized executor trains clients whose batches differ in size in ONE call.

At a local step every client's batch is padded to the longest one. A padding sample repeats a real sample of the
same (sub-)batch and carries the label :data:`IGNORE` (-100, torch's ``ignore_index``), so

* ``F.cross_entropy`` (and anything built on it) averages over the real samples only, unchanged;
* BatchNorm layers that normalise with batch statistics use (and update their running statistics from) the
  real samples only: while :func:`padded_batch` is active, ``F.batch_norm`` calls are replaced by
  :func:`masked_batch_norm` (a ``TorchFunctionMode``);
* any other reduction over the batch in a local objective uses :func:`batch_mean` (mean over ``y != IGNORE``).

A local objective written this way declares it with :func:`pad_aware`; only then does the vectorized executor pad
its batches (an objective that is not pad-aware, or a model with a layer that reads the whole batch, runs on the
sequential executor when its batches differ in size: correct, slower, said once).

Packs (``batches_per_step`` = k, e.g. a MAML step): each of the k sub-batches of a step is padded on its own, so
``x.unflatten(0, (k, -1))`` still splits a padded pack into its sub-batches, every one with the same padding
pattern (the sub-batches of one client-step have equal sizes).
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

IGNORE = -100  # label of a padding sample (torch's default ignore_index)

_local = threading.local()


def pad_aware(loss):
    """Mark a local objective ``loss(fm, p, b, x, y, ctx)`` as correct on padded batches: it reduces over the batch
    only through ``F.cross_entropy``/``F.nll_loss`` (which ignore ``IGNORE`` labels), :func:`batch_mean`, or the
    model's BatchNorm layers, and never indexes with ``y`` without :func:`real_labels`."""
    loss.pad_aware = True
    return loss


def is_pad_aware(loss) -> bool:
    return bool(getattr(loss, "pad_aware", False))


def real(y: torch.Tensor) -> torch.Tensor:
    """Bool mask of the real (not padding) samples of a batch with labels ``y``."""
    return y != IGNORE


def real_labels(y: torch.Tensor) -> torch.Tensor:
    """``y`` with padding labels replaced by class 0 (for indexing class tables; mask the result with :func:`real`)."""
    return y.clamp(min=0)


def batch_mean(v: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of the per-sample values ``v`` [N] over the real samples of a batch with labels ``y`` [N]."""
    if y is None:
        return v.mean()
    w = real(y).to(v.dtype)
    return (v * w).sum() / w.sum().clamp(min=1)


@contextlib.contextmanager
def padded_batch(real_sub: torch.Tensor):
    """While active, BatchNorm layers in training mode normalise with the statistics of the real samples only.

    ``real_sub`` [Lb] bool: which positions of a (sub-)batch are real; a BatchNorm input of j·Lb samples (a
    whole pack, or several sub-batches of it) repeats the pattern j times."""
    prev = getattr(_local, "real", None)
    _local.real = real_sub
    try:
        with _MaskedBatchNorm():
            yield
    finally:
        _local.real = prev


class _MaskedBatchNorm(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.batch_norm:
            return masked_batch_norm(*args, **kwargs)
        return func(*args, **kwargs)


def masked_batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """``F.batch_norm`` over the real samples of the current padded batch (see :func:`padded_batch`): the same
    normalisation (biased variance) and running-statistics update (unbiased variance, ``momentum``) as torch's."""
    mask = getattr(_local, "real", None)
    if not training or mask is None:
        return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    n_in, lb = input.shape[0], mask.shape[0]
    if n_in % lb:
        raise RuntimeError(
            f"a BatchNorm layer saw {n_in} samples, not a multiple of the padded (sub-)batch "
            f"length {lb}: this model cannot be trained on padded batches"
        )
    x = input if input.dtype in (torch.float32, torch.float64) else input.float()
    w = mask.repeat(n_in // lb).to(x.dtype).view((-1,) + (1,) * (x.dim() - 1))
    dims = [0, *range(2, x.dim())]
    shape = (1, -1) + (1,) * (x.dim() - 2)
    count = w.sum() * (x[0, 0].numel())
    n = count.clamp(min=1)
    mean = (x * w).sum(dims) / n
    xc = x - mean.view(shape)
    var = (xc * xc * w).sum(dims) / n
    out = xc * torch.rsqrt(var + eps).view(shape)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    if running_mean is not None:
        with torch.no_grad():
            running_mean.copy_(momentum * mean.detach() + (1 - momentum) * running_mean)
            unbiased = var.detach() * n / (n - 1).clamp(min=1)
            running_var.copy_(momentum * unbiased + (1 - momentum) * running_var)
    return out.to(input.dtype)


def model_pads_ok(net: torch.nn.Module) -> bool:
    """True if padding samples cannot reach the real ones through ``net``: every BatchNorm is torch's own (masked
    by :func:`padded_batch`) and no module declares ``reads_batch = True`` (a layer that mixes the samples of a
    batch some other way, e.g. a set encoder's mean)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    for m in net.modules():
        if getattr(m, "reads_batch", False):
            return False
        if isinstance(m, _BatchNorm) and type(m).forward is not _BatchNorm.forward:
            return False
    return True


__all__ = [
    "IGNORE",
    "batch_mean",
    "is_pad_aware",
    "masked_batch_norm",
    "model_pads_ok",
    "pad_aware",
    "padded_batch",
    "real",
    "real_labels",
]
