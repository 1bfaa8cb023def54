"""fedbench/engine/syncs.py: every kind of call that makes the host wait for a GPU is counted, on the CPU (a copy
between devices with the ``meta`` device), and the calls that queue work without waiting are not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_cfg

from fedbench.engine.syncs import HostSyncCounter
from fedbench.metrics import class_counts
from fedbench.run import Run

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


def test_class_counts_on_the_device_by_hand():
    """Labels [2, 0, 2, 1, 2], predictions [2, 1, 0, 1, 2]: class 0 has 1 sample (missed), class 1 one (hit),
    class 2 three (two hits); a class with no sample counts 0 — without a host read."""
    y = torch.tensor([2, 0, 2, 1, 2])
    logits = torch.nn.functional.one_hot(torch.tensor([2, 1, 0, 1, 2]), 4).double()
    counter = HostSyncCounter()
    with counter:
        counts = class_counts(logits, y, 4)
    assert counter.count == 0, dict(counter.calls)
    assert counts.tolist() == [[0, 1, 2, 0], [1, 1, 3, 0]]


@pytest.mark.parametrize("algorithm", ["fedavg", "local", "fedrod"])  # one shared model, client models, own logits
def test_an_evaluation_reads_the_host_a_fixed_number_of_times_whatever_the_number_of_clients(tmp_path, algorithm):
    """Personalized and global accuracy of every client: the test indices go to the device in one copy, the
    per-class counts stay there and come back in one transfer (before: ~9 counted calls per client, 51 for 5
    clients and 171 for 20 with FedAvg)."""
    counts = {}
    for clients in (4, 12):
        run = Run(make_cfg(f"algorithm={algorithm}", f"clients={clients}", "model=tiny_cnn"), tmp_path / f"{clients}")
        run.setup()
        counter = HostSyncCounter()
        with counter:
            out = run.evaluator(run.algorithm, 1)
        assert len(run.evaluator.last["pers_client_acc"]) == clients and 0 < out["pers/acc"] < 1
        counts[clients] = dict(counter.calls)
    assert counts[4] == counts[12] and sum(counts[4].values()) <= 10, counts
