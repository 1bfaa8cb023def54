"""What one phase of local training is (:class:`LocalSpec`) and the per-call tensors it reads (:class:`LocalInputs`).

``Algorithm.local_train(t, clients, model, spec, inputs)`` runs a spec for a round's clients with the executor.
An algorithm builds its specs once, in ``setup`` (or where a phase's options become known, e.g. a per-round
learning rate: ``spec.replace(opt=...)``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..engine.functional import cross_entropy
from ..engine.optim import OptimSpec
from ..engine.stack import Stack


@dataclass(frozen=True)
class LocalSpec:
    """One training phase. ``None`` defaults come from the run: all parameters trainable, ``local_epochs`` epochs
    (when neither ``epochs`` nor ``steps`` is set) of ``batch_size`` mini-batches, the run's optimizer in round t."""

    phase: str = "train"  # keys the batch order and augmentation draws of the phase
    loss: Callable = cross_entropy  # loss(fm, params, buffers, x, y, ctx) -> scalar, for ONE client
    trainable: tuple[str, ...] | None = None
    epochs: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    opt: OptimSpec | None = None
    persist_opt_state: bool = False  # keep each client's optimizer state (momentum, Adam moments) across calls
    augment: bool = True  # apply the run's training-time augmentation (if any)
    batches_per_step: int = 1  # > 1: each step's x is a pack of that many consecutive batches

    def __post_init__(self):
        if self.trainable is not None and not isinstance(self.trainable, tuple):
            object.__setattr__(self, "trainable", tuple(self.trainable))

    def replace(self, **kw) -> "LocalSpec":
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True)
class LocalInputs:
    """The tensors one ``local_train`` call reads besides the model: per-client stacks ``ctx`` [M, ...] and
    ``shared`` constants for the loss; ``indices`` (per client, pool indices; default its training set) and
    ``sample_weights`` for the batches; or an explicit ``schedule`` (per client, one index tensor per step)."""

    ctx: Stack = field(default_factory=dict)
    shared: dict = field(default_factory=dict)
    indices: list[np.ndarray] | None = None
    sample_weights: list[np.ndarray] | None = None
    schedule: list[list[torch.Tensor]] | None = None


__all__ = ["LocalSpec", "LocalInputs"]
