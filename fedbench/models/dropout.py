"""Dropout whose masks are a function of a key, so both executors (and a resumed run) drop the same units.

torch's ``nn.Dropout`` draws from the global generator: the sequential executor would consume it client after
client, and under ``vmap`` it is refused (or shared across clients). :class:`KeyedDropout` instead hashes
(step key, call number, element index) to a uniform number with integer arithmetic that runs under ``vmap``:

* the executors set the step key of each client-step (:func:`step_key`: (job key, client id, step index)) with
  :func:`keyed` around the local objective; under ``vmap`` the key is the batched per-client tensor;
* the call number counts the dropout layers called since the key was set, so two layers (or two forward passes
  of one step) draw independent masks;
* the element index is the position in the client's batch, so a padded batch (vectorized) and the unpadded one
  (sequential) give the real samples the same masks.

Outside an executor (no key set) the key is 0: deterministic, the same masks on every call. In eval mode and with
``p = 0`` the layer is the identity.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn

_M = 0x7FFFFFFF  # 31-bit words: every product below stays under 2**62, so int64 arithmetic never overflows
_state = threading.local()


def mix(h: torch.Tensor) -> torch.Tensor:
    """A bijective integer hash of 31-bit words (xorshift-multiply rounds, odd multipliers below 2**31)."""
    h = ((h ^ (h >> 15)) * 0x2C1B3C6D) & _M
    h = ((h ^ (h >> 12)) * 0x297A2D39) & _M
    h = ((h ^ (h >> 15)) * 0x4B1D2F63) & _M
    return h ^ (h >> 16)


def step_key(base: int, client: torch.Tensor | int, step: int) -> torch.Tensor:
    """The key of client ``client``'s local step ``step`` in a job keyed ``base`` (int64, 31 bits)."""
    c = torch.as_tensor(client, dtype=torch.int64)
    h = mix((c * 0x3C6EF35F + (base & _M)) & _M)
    return mix((h + step * 0x1B873593 + 1) & _M)


@contextlib.contextmanager
def keyed(key: torch.Tensor):
    """Dropout layers called inside draw their masks from ``key`` (a 0-dim int64 tensor, batched under vmap)."""
    before = getattr(_state, "key", None), getattr(_state, "calls", 0)
    _state.key, _state.calls = key, 0
    try:
        yield
    finally:
        _state.key, _state.calls = before


_positions: dict = {}  # (numel, device) -> mix(arange(numel)): the element hashes, computed once per shape


def bits_like(x: torch.Tensor) -> torch.Tensor:
    """31 random bits per element of ``x`` (int64, shaped like it), from (current key, call number, element index):
    the element's hash (cached per size) mixed with the call's key by two multiply-xorshift rounds."""
    key = getattr(_state, "key", None)
    calls = getattr(_state, "calls", 0)
    _state.calls = calls + 1
    if key is None:
        key = torch.zeros((), dtype=torch.int64, device=x.device)
    base = mix((key + calls * 0x61C88647) & _M)
    at = (x.numel(), x.device)
    if at not in _positions:
        _positions[at] = mix(torch.arange(x.numel(), dtype=torch.int64, device=x.device))
    h = _positions[at].view(x.shape) ^ base  # the one new tensor; the rounds below work in place (fresh memory
    h.bitwise_xor_(h >> 15).mul_(0x2C1B3C6D).bitwise_and_(_M)  # costs page faults on the CPU: measured ~2x slower)
    h.bitwise_xor_(h >> 12).mul_(0x297A2D39).bitwise_and_(_M)
    return h.bitwise_xor_(h >> 15)


def uniform_like(x: torch.Tensor) -> torch.Tensor:
    """Uniform numbers in [0, 1) shaped like ``x`` (:func:`bits_like` / 2**31)."""
    return bits_like(x).to(torch.float32) * (1.0 / 2**31)


class KeyedDropout(nn.Module):
    """Inverted dropout with rate ``p`` (as ``nn.Dropout``: kept units scaled by 1/(1-p)), masks from the key."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout rate p={p}: allowed 0 <= p < 1")
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = bits_like(x) >= int(self.p * 2**31)  # P(keep) = 1 - p (to 2**-31), compared as integers
        return torch.where(keep, x * (1.0 / (1.0 - self.p)), 0.0)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def has_dropout(net: nn.Module) -> bool:
    return any(isinstance(m, KeyedDropout) for m in net.modules())
