"""Client stacks: ``dict[name, Tensor]`` whose tensors carry a leading client axis.

Server-side rules (averaging, FedReMa's head mixing, ...) are matrix operations on stacks.
"""

from __future__ import annotations

import torch

Stack = dict[str, torch.Tensor]


def clone(d: Stack) -> Stack:
    return {k: v.detach().clone() for k, v in d.items()}


def broadcast(d: Stack, m: int) -> Stack:
    """Repeat one model ``d`` for ``m`` clients (a real copy, safe to update in place)."""
    return {k: v.detach().unsqueeze(0).repeat(m, *([1] * v.dim())) for k, v in d.items()}


def rows(d: Stack, idx) -> Stack:
    """The stack restricted to client rows ``idx`` (a copy)."""
    return {k: v[idx] for k, v in d.items()}


def set_rows(d: Stack, idx, value: Stack) -> None:
    """In place: ``d[k][idx] = value[k]`` for every key of ``value``."""
    for k, v in value.items():
        d[k][idx] = v.to(d[k].dtype)


def row(d: Stack, i: int) -> Stack:
    return {k: v[i] for k, v in d.items()}


def weighted_mean(d: Stack, weights: torch.Tensor) -> Stack:
    """``sum_k w_k d[k] / sum_k w_k`` over the client axis. Integer tensors (BN counters) take row 0."""
    w = weights.to(torch.float64)
    w = w / w.sum()
    out = {}
    for k, v in d.items():
        if v.is_floating_point():
            out[k] = torch.tensordot(w.to(v.dtype).to(v.device), v, dims=([0], [0]))
        else:
            out[k] = v[0].clone()
    return out


def mix(d: Stack, weights: torch.Tensor) -> Stack:
    """Per-client mixtures: ``out[i] = sum_j W[i, j] d[j]`` (rows of ``weights`` need not be normalised here)."""
    out = {}
    for k, v in d.items():
        if v.is_floating_point():
            out[k] = torch.tensordot(weights.to(v.dtype).to(v.device), v, dims=([1], [0]))
        else:
            out[k] = v.clone()
    return out


def select(d: Stack, names) -> Stack:
    names = set(names)
    return {k: v for k, v in d.items() if k in names}


def flat(d: Stack, names=None) -> torch.Tensor:
    """Concatenate the (per-client) tensors of ``names`` into a [M, P] matrix."""
    keys = list(d) if names is None else list(names)
    return torch.cat([d[k].flatten(1) for k in keys], dim=1)


def numel(d: Stack, names=None) -> int:
    keys = list(d) if names is None else list(names)
    return sum(d[k][0].numel() for k in keys)


def tagged(d: Stack, tag: str) -> Stack:
    """``d`` with keys ``"<tag>:<name>"``: several models/states in one flat ``ctx`` (e.g. MOON's previous model)."""
    return {f"{tag}:{k}": v for k, v in d.items()}


def untagged(d: dict, tag: str) -> Stack:
    """The ``"<tag>:<name>"`` entries of ``d`` as ``{name: tensor}`` (inverse of :func:`tagged`)."""
    p = tag + ":"
    return {k[len(p) :]: v for k, v in d.items() if k.startswith(p)}
