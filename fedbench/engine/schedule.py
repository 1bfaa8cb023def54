"""Mini-batch schedules: which samples each client sees at each local step.

Schedules are drawn from a generator keyed by (seed, round, client, purpose), so both executors
(and a resumed run) see exactly the same batches.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import seeding


def client_batches(indices: np.ndarray, batch_size: int, rng: np.random.Generator, *, epochs: int | None = None,
                   steps: int | None = None, drop_last: bool = False, weights: np.ndarray | None = None) -> list[np.ndarray]:
    """Batches for one client: ``epochs`` shuffled passes (or ``steps`` batches, cycling through passes).

    ``weights`` switches to sampling with replacement proportional to the weights (class-balanced
    sampling): each epoch then draws ``len(indices)`` samples.
    """
    n = len(indices)
    if n == 0:
        return []
    b = min(batch_size, n) if not drop_last else batch_size
    per_epoch = n // b if drop_last else math.ceil(n / b)
    if per_epoch == 0:
        return []
    want = steps if steps is not None else epochs * per_epoch
    out: list[np.ndarray] = []
    while len(out) < want:
        if weights is None:
            order = indices[rng.permutation(n)]
        else:
            p = weights / weights.sum()
            order = indices[rng.choice(n, size=n, replace=True, p=p)]
        for s in range(per_epoch):
            out.append(order[s * b:(s + 1) * b])
            if len(out) == want:
                break
    return out


def make_schedule(client_indices: list[np.ndarray], clients: list[int], batch_size: int, seed: int, *key,
                  epochs: int | None = None, steps: int | None = None, drop_last: bool = False,
                  weights: list[np.ndarray] | None = None, device="cpu", batches_per_step: int = 1) -> list[list[torch.Tensor]]:
    """Per client (in ``clients`` order) the list of index tensors of its local steps.

    ``batches_per_step`` = k > 1 makes every step a *pack* of k consecutive mini-batches of equal size
    b = min(batch_size, n_k) (incomplete batches dropped), their indices concatenated (k·b samples):
    for local objectives that consume several batches per optimizer step, e.g. a MAML inner loop
    (CAFeMe, Per-FedAvg), which split the pack back with ``x.unflatten(0, (k, -1))``. ``steps`` then
    counts packs; ``epochs`` gives ⌊epochs·batches per epoch / k⌋ packs.
    """
    sched = []
    k_pack = int(batches_per_step)
    for m, k in enumerate(clients):
        g = seeding.rng(seed, "batches", *key, int(k))
        w = None if weights is None else weights[m]
        if k_pack == 1:
            bs = client_batches(client_indices[m], batch_size, g, epochs=epochs, steps=steps, drop_last=drop_last, weights=w)
        else:
            b = min(batch_size, max(1, len(client_indices[m])))
            bs = client_batches(client_indices[m], b, g, epochs=epochs, steps=None if steps is None else steps * k_pack,
                                drop_last=True, weights=w)
            bs = [np.concatenate(bs[i:i + k_pack]) for i in range(0, len(bs) - k_pack + 1, k_pack)]
        sched.append([torch.as_tensor(b, dtype=torch.long, device=device) for b in bs])
    return sched
