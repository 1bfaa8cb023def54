"""fedbench/engine/agreement.py: the fp32 agreement rule between executors, on hand-made states whose distances are
known, so that a swapped argument, a flipped comparison or a missing floor changes a verdict."""

from __future__ import annotations

import torch

from fedbench.engine.agreement import fp32_agreement, max_diff

EPS = torch.finfo(torch.float32).eps


def _state(w, v, dtype=torch.float64):
    return {"w": torch.tensor(w, dtype=dtype), "inner": [torch.tensor(v, dtype=dtype), (torch.zeros(0),)]}


def test_max_diff_is_the_largest_absolute_difference_over_nested_tensors_in_float64():
    a = _state([1.0, -2.0], [[0.5, 0.25]])
    b = {"w": torch.tensor([1.0, -2.5], dtype=torch.float32), "inner": [torch.tensor([[0.5, 0.0]]), (torch.zeros(0),)]}
    assert max_diff(a, b) == 0.5 and max_diff(b, a) == 0.5
    tiny = {"w": torch.tensor([1.0 + 1e-12], dtype=torch.float64)}
    assert max_diff(tiny, {"w": torch.tensor([1.0], dtype=torch.float64)}) > 0  # not rounded through fp32
    assert max_diff({}, {}) == 0.0 and max_diff([], []) == 0.0


def test_vectorized_as_close_to_fp64_as_the_sequential_within_the_factor():
    ref = _state([1.0, -2.0], [[0.5]])
    seq = _state([1.0 + 2e-5, -2.0], [[0.5]], torch.float32)  # 2e-5 from fp64 (well above the floor)
    near = _state([1.0, -2.0 - 5e-5], [[0.5]], torch.float32)  # 5e-5: ratio 2.5
    far = _state([1.0, -2.0], [[0.5 + 7e-5]], torch.float32)  # 7e-5: ratio 3.5
    ok, why = fp32_agreement(seq, near, ref)
    assert ok and why.startswith("vectorized 5e-05 from fp64, sequential 2e-05 (ratio 2.5, allowed 3"), why
    ok, why = fp32_agreement(seq, far, ref)
    assert not ok and why == "vectorized 7e-05 from fp64, sequential 2e-05 (ratio 3.5, allowed 3)"
    assert fp32_agreement(seq, far, ref, factor=4.0)[0]
    assert fp32_agreement(far, seq, ref)[0]  # the roles are not symmetric: the sequential one sets the yardstick


def test_the_floor_is_a_few_fp32_eps_of_the_references_scale():
    """The sequential result exactly the fp64 answer: the vectorized one may still be a few fp32 ulps of the state's
    largest value (8 here) away — 3 x 4 eps x 8 — and no more."""
    ref = _state([8.0, -2.0], [[0.5]])
    floor = 4 * EPS * 8.0
    inside = _state([8.0, -2.0 + 2.9 * floor], [[0.5]])
    outside = _state([8.0, -2.0], [[0.5 + 3.1 * floor]])
    ok, why = fp32_agreement(ref, inside, ref)
    assert ok and "floored at 3.8e-06 = 4 fp32 eps x scale 8" in why, why
    assert not fp32_agreement(ref, outside, ref)[0]
    counter = {"n": torch.tensor([1000])}  # an integer buffer (BatchNorm's step count) is no scale of fp32 values
    assert not fp32_agreement({**ref, **counter}, {**outside, **counter}, {**ref, **counter})[0]
    zero = {"w": torch.zeros(3, dtype=torch.float64)}
    assert fp32_agreement(zero, zero, zero)[0] and not fp32_agreement(zero, {"w": torch.full((3,), 1e-30)}, zero)[0]
