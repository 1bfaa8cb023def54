"""When do two fp32 runs of the same training agree? Relative to the fp64 answer, not to a constant.

The sequential and the vectorized executor sum the same numbers in different orders (a batched call, padded and
masked batches, grouped convolutions), so in fp32 their results differ by round-off — amplified by every later
step (momentum, BatchNorm statistics, a few epochs of SGD). How large that gets depends on the CPU's or GPU's
kernels: a test that held the executors to 1e-5 passed on the AMD EPYC it was written on and measured 1.4e-5 on an
Intel Xeon with AVX-512 (issue 29, item 4), so no constant tolerance between them is right on every machine.

The rule (:func:`fp32_agreement`): run the same training a third time in fp64 (round-off ~1e-16: "the answer"),
then the vectorized fp32 result must be as close to that answer as the sequential fp32 one, within ``factor``:

    |vec32 - ref64| <= factor * max(|seq32 - ref64|, FLOOR_EPS * eps32 * scale)

(|.| the max absolute difference over all tensors, :func:`max_diff`; ``scale`` the largest |value| of the
reference). The sequential executor is the reference implementation, so its distance to fp64 is what fp32 costs on
this machine for this training; a bug in the vectorized one (a wrong mask, a missed update) puts it orders of
magnitude further away than fp32 round-off does. The floor keeps the rule meaningful where the sequential result
happens to be (nearly) exact: a few fp32 ulps of the state's scale is as close as fp32 can be asked to get.
``factor`` = 3: the ratio of two independent round-offs' amplified effects is heavy-tailed, not near 1. Measured on
tests/test_vectorized.py's setting (6 Dir(0.3) clients, BN CNN, 2 rounds x 2 epochs of momentum SGD at lr 0.05) over
80 draws of its Gaussian inputs on an Intel Xeon: worst ratio over params/buffers/momentum/loss median 1.0, 90 % of
draws <= 3.1, 95 % <= 7.8; in ~4 % of draws one fp32 run (either executor, equally often) took the other branch of a
max-pool/ReLU near-tie and ended ~1e-2 away (ratio 1e2-1e5) — chaos that no tolerance tells from a bug. The test's
own draw gives 0.4-1.9 there. At lr 0.01 (30 draws) all ratios were <= 2.7. So a failure at 3 is worth a second
look, not proof of a bug: rerun on other data before believing it.
"""

from __future__ import annotations

import torch

FLOOR_EPS = 4  # the floor in fp32 machine epsilons (x the reference's scale): a few roundings of the largest value
EPS32 = torch.finfo(torch.float32).eps


def _leaves(x):
    """The tensors of a nested dict/list/tuple, in order."""
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)


def _pairs(a, b):
    """(a's tensor, b's tensor) at the same place of two nested structures (b indexed by a's keys)."""
    if torch.is_tensor(a):
        yield a, b
    elif isinstance(a, dict):
        for k, v in a.items():
            yield from _pairs(v, b[k])
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise ValueError(f"different lengths: {len(a)} and {len(b)}")
        for u, v in zip(a, b):
            yield from _pairs(u, v)


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def max_diff(a, b) -> float:
    """max |a - b| over nested dicts/lists/tuples of tensors (b's keys: a's), in float64 on the CPU; 0.0 if empty."""
    return max(((_f64(u) - _f64(v)).abs().max().item() for u, v in _pairs(a, b) if u.numel()), default=0.0)


def _scale(x) -> float:
    """The largest |value| of the floating-point tensors of a nested structure (0.0 if none): integer ones (BatchNorm's
    step counters) are compared exactly by any tolerance, and are no measure of fp32's resolution."""
    return max((_f64(t).abs().max().item() for t in _leaves(x) if t.numel() and t.is_floating_point()), default=0.0)


def fp32_agreement(seq32, vec32, ref64, factor: float = 3.0) -> tuple[bool, str]:
    """(ok, one line with the numbers): the vectorized fp32 state ``vec32`` is within ``factor`` x the sequential
    fp32 state's distance to the fp64 reference ``ref64`` (floored at FLOOR_EPS fp32 eps x the reference's scale)
    from ``ref64`` — the rule of this module's docstring. States: nested dicts/lists/tuples of tensors."""
    d_vec, d_seq = max_diff(ref64, vec32), max_diff(ref64, seq32)
    floor = FLOOR_EPS * EPS32 * _scale(ref64)
    base = max(d_seq, floor)
    ratio = d_vec / base if base > 0 else (0.0 if d_vec == 0 else float("inf"))
    why = f"vectorized {d_vec:.2g} from fp64, sequential {d_seq:.2g} (ratio {ratio:.2g}, allowed {factor:g}"
    if d_seq < floor:
        why += f"; floored at {floor:.2g} = {FLOOR_EPS} fp32 eps x scale {_scale(ref64):.2g}"
    return ratio <= factor, why + ")"


__all__ = ["fp32_agreement", "max_diff"]
