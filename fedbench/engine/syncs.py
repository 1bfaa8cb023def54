"""Counting the calls that make the host wait for the device (a diagnostic; engine/executor.py's step loops have none).

On a GPU every call that reads a tensor's value on the host (``.item()``, ``.tolist()``, ``bool(t)``, ``.cpu()``,
``.numpy()``) or builds an index from host data (a Python list or NumPy array as an index, ``torch.tensor([...])``)
stops the host until the device has caught up, so the next kernels cannot be queued behind the running ones. The
same calls are visible on the CPU, so :class:`HostSyncCounter` proves on a CPU that a step loop makes none:

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
    torch.Tensor.nonzero,
    torch.nonzero,
}
_FROM_HOST = {torch.tensor, torch.as_tensor}


def _host_index(index) -> bool:
    """An index holding host data (a list, a NumPy array, a bool) that must be copied to the device."""
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (list, np.ndarray, bool)) for i in items)


class HostSyncCounter(TorchFunctionMode):
    """While active, counts host-reading calls by name in :attr:`calls` (``count`` = their total)."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    @property
    def count(self) -> int:
        return sum(self.calls.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func in _READS:
            self.calls[name] += 1
        elif func in _FROM_HOST and args and not torch.is_tensor(args[0]):
            self.calls[name] += 1
        elif func is torch.Tensor.to and any(str(a) == "cpu" for a in (*args[1:], *kwargs.values())):
            self.calls["to(cpu)"] += 1
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1 and _host_index(args[1]):
            self.calls[f"{name} with a host index"] += 1
        return func(*args, **kwargs)


__all__ = ["HostSyncCounter"]
