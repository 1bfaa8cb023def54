"""fedbench/engine/syncs.py: every kind of call that makes the host wait for a GPU is counted, on the CPU (a copy
between devices with the ``meta`` device), and the calls that queue work without waiting are not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedbench.engine.syncs import HostSyncCounter

t = torch.arange(6.0)
mask = t > 2
idx = torch.tensor([0, 2])
meta = torch.empty(6, device="meta")

MASKED = "__getitem__ with a boolean mask"
SIZED = "repeat_interleave without output_size"
WAITS = {  # what -> (call, the name it is counted under)
    "boolean mask read": (lambda: t[mask], MASKED),
    "boolean mask write": (lambda: t.clone().__setitem__(~mask, 0.0), "__setitem__ with a boolean mask"),
    "index_put_ with a mask": (
        lambda: t.clone().index_put_((mask,), torch.zeros(())),
        "index_put_ with a boolean mask",
    ),
    "host list index": (lambda: t[[0, 2]], "__getitem__ with a host index"),
    "numpy index": (lambda: t[np.array([0, 2])], "__getitem__ with a host index"),
    "bincount": (lambda: torch.bincount(idx), "bincount"),
    "Tensor.bincount": (lambda: idx.bincount(minlength=4), "bincount"),
    "unique": (lambda: torch.unique(idx), "unique"),
    "Tensor.unique": (lambda: idx.unique(), "unique"),
    "unique_consecutive": (lambda: torch.unique_consecutive(idx), "unique_consecutive"),
    "masked_select": (lambda: torch.masked_select(t, mask), "masked_select"),
    "nonzero": (lambda: mask.nonzero(), "nonzero"),
    "argwhere": (lambda: torch.argwhere(mask), "argwhere"),
    "where(cond)": (lambda: torch.where(mask), "where(condition)"),
    "repeat_interleave by a tensor": (lambda: t.repeat_interleave(idx[:1] + 1), SIZED),
    "repeat_interleave(repeats)": (lambda: torch.repeat_interleave(idx), SIZED),
    "item": (lambda: t[0].item(), "item"),
    "cpu": (lambda: t.cpu(), "cpu"),
    "to(cpu)": (lambda: t.to("cpu"), "to(cpu)"),
    "upload": (lambda: t.to("meta"), "to(meta)"),
    "upload by keyword": (lambda: t.to(device=torch.device("meta")), "to(meta)"),
    "as_tensor to a device": (lambda: torch.as_tensor(t, device="meta"), "as_tensor(meta)"),
    "copy_ across devices": (lambda: torch.empty(6, device="meta").copy_(t), "copy_ from cpu to meta"),
    "an index on another device": (lambda: meta[idx], "__getitem__ with an index on another device"),
    "a value on another device": (lambda: meta.__setitem__(slice(6), t), "__setitem__ with a value on another device"),
    "tensor from host data": (lambda: torch.tensor([1, 2]), "tensor"),
}

QUEUED = {  # calls that only queue device work
    "long index": lambda: t[idx],
    "slice": lambda: t[1:4],
    "masked_fill": lambda: t.masked_fill(mask, 0.0),
    "where(cond, a, b)": lambda: torch.where(mask, t, 0.0),
    "repeat_interleave by an int": lambda: t.repeat_interleave(2),
    "repeat_interleave with output_size": lambda: t.repeat_interleave(idx[1:] + 1, output_size=18),
    "index_add_": lambda: torch.zeros(4).index_add_(0, idx, torch.ones(2)),
    "to a dtype": lambda: t.to(torch.float64),
    "to the same device": lambda: meta.to("meta"),
    "copy_ on one device": lambda: torch.empty(6).copy_(t),
    "split by host sizes": lambda: torch.split(t, [2, 4]),
}


@pytest.mark.parametrize("what", WAITS)
def test_a_call_that_waits_for_the_device_is_counted_once_by_name(what):
    call, name = WAITS[what]
    counter = HostSyncCounter()
    with counter:
        call()
    assert dict(counter.calls) == {name: 1}


@pytest.mark.parametrize("what", QUEUED)
def test_a_call_that_only_queues_work_is_not_counted(what):
    counter = HostSyncCounter()
    with counter:
        QUEUED[what]()
    assert counter.count == 0, dict(counter.calls)
