"""Counter-based randomness: every random draw is keyed by (seed, purpose, round, client).

Nothing depends on how many draws happened before, so a resumed run, a different
executor, or a different participation pattern draws exactly the same numbers.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


def _key(seed: int, *parts) -> list[int]:
    out = [int(seed)]
    for p in parts:
        out.append(zlib.crc32(p.encode()) if isinstance(p, str) else int(p))
    return out


def rng(seed: int, *parts) -> np.random.Generator:
    """A numpy generator for one purpose, e.g. ``rng(seed, "partition")``."""
    return np.random.default_rng(_key(seed, *parts))


def torch_generator(seed: int, *parts, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator for one purpose (derived from the same key as :func:`rng`)."""
    s = int(np.random.SeedSequence(_key(seed, *parts)).generate_state(1, dtype=np.uint64)[0] >> 1)
    g = torch.Generator(device=device)
    g.manual_seed(s)
    return g


def key31(seed: int, *parts) -> int:
    """A 31-bit integer key for one purpose (keys the integer hashes of fedbench.models.dropout)."""
    return int(np.random.SeedSequence(_key(seed, *parts)).generate_state(1, dtype=np.uint32)[0] >> 1)


def seed_everything(seed: int, *parts) -> None:
    """Seed torch's global generator (used by module initialisation)."""
    g = torch_generator(seed, *parts)
    torch.manual_seed(int(g.initial_seed()))
