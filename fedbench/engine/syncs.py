"""Counting the calls that make the host wait for the device (a diagnostic; engine/executor.py's step loops have none).

On a GPU every call that reads a tensor's value on the host (``.item()``, ``.tolist()``, ``bool(t)``, ``.cpu()``,
``.numpy()``), builds an index from host data (a Python list or NumPy array as an index, ``torch.tensor([...])``),
copies between the host and the device (``.to(<other device>)``, ``.cuda()``, ``copy_`` from another device, an index
or a value on another device: torch waits for a blocking copy to finish), or makes a tensor whose SIZE depends on
the data (a boolean mask as an index — a ``nonzero`` inside —, ``nonzero``, ``bincount``, ``unique``,
``masked_select``, ``repeat_interleave`` without ``output_size``: the host must learn the size to allocate the
result) stops the host until the device has caught up, so the next kernels cannot be queued behind the running
ones. The same calls are visible on the CPU, so :class:`HostSyncCounter` proves on a CPU that a step loop makes none
(a copy between devices shows on a CPU machine with the ``meta`` device):

    counter = HostSyncCounter()
    executor.loop_mode = lambda: counter         # the executor enters it around every step loop
    executor.train(job); assert counter.count == 0, counter.calls

(on CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` is the device's own check; scripts/gpu_check.sh runs both).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
}
# outputs whose size depends on the values: the host reads that size before it can allocate them
_DATA_SIZED = {
    torch.nonzero,
    torch.Tensor.nonzero,
    torch.argwhere,
    torch.Tensor.argwhere,
    torch.bincount,
    torch.Tensor.bincount,
    torch.unique,
    torch.Tensor.unique,
    torch.unique_consecutive,
    torch.Tensor.unique_consecutive,
    torch.masked_select,
    torch.Tensor.masked_select,
}
_REPEAT = {torch.repeat_interleave, torch.Tensor.repeat_interleave}
_FROM_HOST = {torch.tensor, torch.as_tensor}
_MOVES = {torch.Tensor.to, torch.Tensor.cuda}
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_, torch.Tensor.index_put}


def _items(index) -> tuple:
    return index if isinstance(index, (tuple, list)) and not _is_host_list(index) else (index,)


def _is_host_list(index) -> bool:
    """A list of numbers (an index of host data), as opposed to a tuple/list of per-dimension indices."""
    return isinstance(index, list) and all(isinstance(i, (int, bool, float)) for i in index)


def _index_problem(t: torch.Tensor, index) -> str | None:
    """Why indexing ``t`` with ``index`` waits for the host: host data, a boolean mask, another device's tensor."""
    for i in _items(index):
        if isinstance(i, (list, np.ndarray, bool)):
            return "a host index"
        if torch.is_tensor(i):
            if i.dtype in (torch.bool, torch.uint8):
                return "a boolean mask"
            if i.device != t.device and i.dim() > 0:
                return "an index on another device"
    return None


def _data_sized_repeat(func, args, kwargs) -> bool:
    """``repeat_interleave`` with tensor repeats and no ``output_size``: the host sums the repeats first."""
    if kwargs.get("output_size") is not None:
        return False
    repeats = kwargs.get("repeats", args[1] if len(args) > 1 else None)
    return torch.is_tensor(repeats) or (func is torch.repeat_interleave and len(args) == 1 and not kwargs)


class HostSyncCounter(TorchFunctionMode):
    """While active, counts host-waiting calls by name in :attr:`calls` (``count`` = their total)."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    @property
    def count(self) -> int:
        return sum(self.calls.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        why = None  # counted before the call: a read refused under vmap still shows
        if func in _READS or func in _DATA_SIZED:
            why = name
        elif func in _REPEAT and _data_sized_repeat(func, args, kwargs):
            why = f"{name} without output_size"
        elif func in _FROM_HOST and args and not torch.is_tensor(args[0]):
            why = name
        elif func is torch.where and len(args) + len(kwargs) == 1:
            why = "where(condition)"  # = nonzero
        elif func is torch.Tensor.copy_ and args[1].device != args[0].device:
            why = f"copy_ from {args[1].device.type} to {args[0].device.type}"
        elif func in _INDEXING and len(args) > 1:
            problem = _index_problem(args[0], args[1])
            value = args[2] if len(args) > 2 else None
            if problem is None and torch.is_tensor(value) and value.device != args[0].device and value.dim() > 0:
                problem = "a value on another device"
            why = problem and f"{name} with {problem}"
        if why:
            self.calls[why] += 1
        out = func(*args, **kwargs)
        if func in _MOVES or (func in _FROM_HOST and args and torch.is_tensor(args[0])):
            # a copy to another device, or to the CPU (on a CPU machine the tensors stand for device tensors)
            if torch.is_tensor(out) and (
                out.device != args[0].device or out.device.type == "cpu" and _to_cpu(args, kwargs)
            ):
                self.calls[f"{name}({out.device.type})"] += 1
        return out


def _to_cpu(args, kwargs) -> bool:
    """``.to`` asked for the CPU by name (``"cpu"``, ``torch.device("cpu")``)."""
    return any(str(a) == "cpu" for a in (*args[1:], *kwargs.values()))


__all__ = ["HostSyncCounter"]
