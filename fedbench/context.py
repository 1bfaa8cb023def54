"""What an algorithm may use of its run, and all it may use: the :class:`Context`.

The run builds one context after the data, the model and the executor, before the algorithm
(``ALGORITHMS[name](ctx)``); a test can build one without a run (tests/test_context.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import DictConfig

from . import distributed
from .data.federated import FederatedData
from .distributed import World
from .engine.executor import Executor, LocalResult
from .engine.functional import FModel
from .engine.stack import Stack


def _no_publish(key: str, path: Path, t: int) -> None:
    """A picture with nowhere to go (a context without loggers)."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(eq=False)
class Context:
    cfg: DictConfig  # the resolved run config (algorithm hyperparameters: cfg.algorithm)
    data: FederatedData
    fm: FModel  # the model every part of the run evaluates with (MOON may replace it in setup)
    executor: Executor
    initial: tuple[Stack, Stack]  # the initial global model (params, buffers), shared by all algorithms of a run
    augment: object | None  # training-time augmentation or None
    out_dir: Path  # the run dir: diagnostics/ and finish() artefacts go here
    publish: Callable[[str, Path, int], None] = _no_publish  # log a picture (key, png path, round)
    say: Callable[[str], None] = _stderr  # one line for the console and run.log
    # called after EVERY local_train call with (t, client ids, result, phase): the divergence guard, the
    # forgetting and similarity monitors (which keep the round's phase "train" result)
    observers: list[Callable[[int, list[int], LocalResult, str], None]] = field(default_factory=list)
    # the processes of a run launched by torchrun/srun: local training is split over them (fedbench/distributed.py)
    world: World = field(default_factory=World)

    def predict(self, params: Stack, buffers: Stack, idx: list[np.ndarray]) -> list[torch.Tensor]:
        """Eval-mode logits of stacked model m on the pool samples ``idx[m]``, for every m."""
        x, idx = self.data.x, self.data.tensors(idx)
        return distributed.predict(self.executor, self.fm, params, buffers, x, idx, self.world)  # split over ranks

    @property
    def dtype(self) -> torch.dtype:
        return self.data.x.dtype

    @property
    def device(self) -> torch.device:
        return self.data.x.device


__all__ = ["Context"]
