"""Mini-batch schedules: which samples each client sees at each local step, and their layout on the device.

Schedules are drawn from a generator keyed by (seed, round, client, purpose), so both executors
(and a resumed run) see exactly the same batches. :func:`plan` lays a job's schedule out on the device once,
before its step loop (one host-to-device copy), so the loop itself never waits for the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import seeding


def client_batches(
    indices: np.ndarray,
    batch_size: int,
    rng: np.random.Generator,
    *,
    epochs: int | None = None,
    steps: int | None = None,
    drop_last: bool = False,
    weights: np.ndarray | None = None,
) -> list[np.ndarray]:
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
            out.append(order[s * b : (s + 1) * b])
            if len(out) == want:
                break
    return out


def make_schedule(
    client_indices: list[np.ndarray],
    clients: list[int],
    batch_size: int,
    seed: int,
    *key,
    epochs: int | None = None,
    steps: int | None = None,
    drop_last: bool = False,
    weights: list[np.ndarray] | None = None,
    device="cpu",
    batches_per_step: int = 1,
) -> list[list[torch.Tensor]]:
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
            bs = client_batches(
                client_indices[m], batch_size, g, epochs=epochs, steps=steps, drop_last=drop_last, weights=w
            )
        else:
            b = min(batch_size, max(1, len(client_indices[m])))
            bs = client_batches(
                client_indices[m],
                b,
                g,
                epochs=epochs,
                steps=None if steps is None else steps * k_pack,
                drop_last=True,
                weights=w,
            )
            bs = [np.concatenate(bs[i : i + k_pack]) for i in range(0, len(bs) - k_pack + 1, k_pack)]
        sched.append([torch.as_tensor(b, dtype=torch.long, device=device) for b in bs])
    return sched


@dataclass
class Plan:
    """A job's mini-batches on the device, built once before its step loop.

    Compact layout (both executors): ``flat`` holds every client-step's sample indices, client by client; client
    m's step t is ``flat[offsets[m][t]:offsets[m][t + 1]]``. Padded layout (vectorized executor): the clients
    sorted by descending number of steps (``order``), so the clients that still train at step t are a prefix of
    that order (``active[t]`` of them); row ``row0[t] + i`` of ``index``/``real`` is the batch of the i-th of
    them, padded to ``L`` = ``pack`` sub-batches of ``L // pack`` samples each. A padding position repeats the
    first sample of its sub-batch (``real`` False there). ``rows`` are the positions in ``flat`` of ``index``.
    """

    steps: list[int]
    offsets: list[list[int]]
    flat: torch.Tensor
    pack: int = 1
    order: list[int] | None = None
    active: list[int] | None = None
    row0: list[int] | None = None
    L: int = 0
    rows: torch.Tensor | None = None
    index: torch.Tensor | None = None
    real: torch.Tensor | None = None
    padded: list[bool] | None = None

    @property
    def has_padding(self) -> bool:
        return bool(self.padded) and any(self.padded)

    def step(self, m: int, t: int) -> torch.Tensor:
        """Client m's sample indices at step t (a view of ``flat``)."""
        return self.flat[self.offsets[m][t] : self.offsets[m][t + 1]]

    def span(self, m: int) -> slice:
        """Client m's positions in ``flat`` (all its steps)."""
        return slice(self.offsets[m][0], self.offsets[m][-1])


def _host(schedule: list[list]) -> list[list[np.ndarray]]:
    """The schedule as host arrays; index tensors already on a device come back in ONE copy."""
    on_dev = [b for s in schedule for b in s if torch.is_tensor(b) and b.device.type != "cpu"]
    back = iter(torch.cat(on_dev).cpu().split([len(b) for b in on_dev]) if on_dev else [])
    return [
        [np.asarray(next(back) if torch.is_tensor(b) and b.device.type != "cpu" else b, dtype=np.int64) for b in s]
        for s in schedule
    ]


def plan(schedule: list[list], device, pack: int = 1, padded: bool = False) -> Plan:
    """Lay ``schedule`` (per client: index arrays/tensors of its steps; a step of a pack = ``pack`` equal
    sub-batches concatenated) out on ``device``: the compact layout, and with ``padded`` the padded one."""
    host = _host(schedule)
    steps = [len(s) for s in host]
    offsets, pos = [], 0
    for s in host:
        o = [pos]
        for b in s:
            pos += len(b)
            o.append(pos)
        offsets.append(o)
    flat_np = np.concatenate([b for s in host for b in s]) if pos else np.zeros(0, dtype=np.int64)
    out = Plan(steps, offsets, torch.from_numpy(flat_np).to(device), pack=int(pack))
    if not padded:
        return out
    k = out.pack
    order = sorted(range(len(host)), key=lambda m: -steps[m])
    T = max(steps, default=0)
    lb = max((len(b) // k for s in host for b in s), default=0)
    active = [sum(1 for m in order if steps[m] > t) for t in range(T)]
    row0 = list(np.cumsum([0] + active[:-1])) if T else []
    R, L = sum(active), k * lb
    rows = np.zeros((R, L), dtype=np.int64)
    real = np.zeros((R, L), dtype=bool)
    padded_steps = [False] * T
    for t in range(T):
        for i in range(active[t]):
            m = order[i]
            start, size = offsets[m][t], offsets[m][t + 1] - offsets[m][t]
            if size % k:
                raise ValueError(f"a step of {size} samples is not a pack of {k} equal batches")
            b = size // k
            j = np.arange(lb)
            r = row0[t] + i
            for p in range(k):
                rows[r, p * lb : (p + 1) * lb] = start + p * b + np.where(j < b, j, 0)
                real[r, p * lb : (p + 1) * lb] = j < b
            padded_steps[t] = padded_steps[t] or b < lb
    out.order, out.active, out.row0, out.L, out.padded = order, active, [int(r) for r in row0], L, padded_steps
    out.rows = torch.from_numpy(rows).to(device)
    out.index = out.flat[out.rows] if R else out.rows
    out.real = torch.from_numpy(real).to(device)
    return out
