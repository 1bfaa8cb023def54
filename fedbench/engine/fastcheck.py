"""The fast steps of fedbench/engine/fast.py checked against the eager vectorized step on a device (the first-GPU
command's equality section, scripts/gpu_check.py; on the CPU in tests/test_fast_path.py): two rounds of the same
training by both, their results compared in fp64 to round-off and in fp32 by the executors' agreement rule
(fedbench/engine/agreement.py). Apart from fast.py because it runs the executor, which runs the fast steps."""

from __future__ import annotations

import numpy as np
import torch

from . import optim
from .stack import Stack


def _check_rounds(device, dtype, compile: bool = False, graphs: bool = False):
    """Two rounds of four ragged clients (padding, BatchNorm, momentum, weight decay, clipping; two clients per call,
    buckets 2 and 1) on ``device`` in ``dtype``, by the eager vectorized step (neither option) or a fast one: its
    result (parameters, buffers, optimizer state, losses) and the executor."""
    from omegaconf import OmegaConf

    from ..models import build_model
    from .executor import LocalJob, VectorizedExecutor
    from .functional import FModel
    from .schedule import make_schedule
    from .stack import broadcast

    torch.manual_seed(0)
    cfg = {"name": "cnn", "channels": [4, 8], "kernel_size": 3, "padding": 1, "hidden": [16], "batch_norm": True}
    fm = FModel(build_model(OmegaConf.create(cfg), (1, 8, 8), 10).to(device, dtype))
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 1, 8, 8, dtype=torch.float64, generator=g).to(device, dtype)
    Y = torch.randint(0, 10, (400,), generator=g).to(device)
    idx = [np.arange(0, 40), np.arange(40, 140), np.arange(140, 200), np.arange(200, 400)]
    spec = optim.OptimSpec(lr=0.05, momentum=0.9, weight_decay=1e-3, clip_grad_norm=1.0)
    p, b = fm.init_state(dtype, device)
    ex, res = VectorizedExecutor(compile=compile, cuda_graphs=graphs), None
    for t in (1, 2):
        sched = make_schedule(idx, [0, 1, 2, 3], 32, 0, "check", t, epochs=2, device=device)
        params = (broadcast(p, 4), broadcast(b, 4)) if res is None else (res.params, res.buffers)
        job = LocalJob(fm, *params, fm.param_names, sched, X, Y, spec, None if res is None else res.opt_state)
        if t == 1:  # two clients per call (the executor's own probe step)
            probe = VectorizedExecutor()
            ex.max_memory = probe.bytes_in_use(job) + 2.5 * probe.client_step_bytes(job)
        res = ex.train(job)
    return {"params": res.params, "buffers": res.buffers, "opt_state": res.opt_state, "loss": res.loss}, ex


def eager_vs_fast(device, dtype, compile: bool, graphs: bool) -> dict:
    """:func:`_check_rounds` by the eager step and by a fast one: per part (parameters, buffers, optimizer state,
    losses) the max |difference| relative to the state's scale, and ``ok``. fp64: every difference <= 1e-12 (the CPU
    tests' bound, tests/test_fast_path.py). fp32: the fast result as close to the eager fp64 answer as the eager fp32
    one, within 3x — the rule the two executors are held to (engine/agreement.py; ``agreement`` says the numbers).
    Also the buckets visited and the graphs captured."""
    from .agreement import fp32_agreement

    eager, _ = _check_rounds(device, dtype)
    fast, fx = _check_rounds(device, dtype, compile, graphs)

    def diff(x: Stack, y: Stack) -> float:
        return max(
            (x[k].double() - y[k].double()).abs().max().item() / max(1.0, x[k].double().abs().max().item()) for k in x
        )

    out = {k: diff(eager[k], fast[k]) for k in ("params", "buffers", "opt_state")}
    out["loss"] = (eager["loss"] - fast["loss"]).abs().max().item()
    if dtype == torch.float64:
        out["bound"] = 1e-12
        out["ok"] = all(out[k] <= out["bound"] for k in ("params", "buffers", "opt_state", "loss"))
    else:
        ref, _ = _check_rounds(device, torch.float64)
        checks = [fp32_agreement(eager[k], fast[k], ref[k]) for k in ("params", "buffers", "opt_state", "loss")]
        out["ok"], out["agreement"] = all(ok for ok, _ in checks), "; ".join(why for _, why in checks)
    out["buckets"] = sorted({nb for prog in fx.fast.programs.values() for nb in prog.calls})
    out["captures"] = sum(prog.captures for prog in fx.fast.programs.values())
    return out


def device_check(device: str = "cuda", compile: bool = True, precisions=("fp64", "fp32")) -> dict:
    """The fast paths against the eager step on ``device`` (the first-GPU command's equality section): per case —
    ``graphs``, ``compile``, ``compile+graphs``, each in fp64 and fp32 — what :func:`eager_vs_fast` returns and
    ``ok`` (every difference within its bound); ``ok`` overall. On a device other than CUDA the graphs cases run
    without the capture call (``captures`` counts the warm-ups, ``captured`` says false): a rehearsal of the code
    path, not of the capture. ``compile=False`` leaves the compiled cases out (inductor compiles each bucket:
    ~1-2 min per case on a 2-core CPU, to be measured on the device); ``precisions``: a subset of fp64, fp32."""
    dev = torch.device(device)
    cases = {}
    for precision, dtype in (("fp64", torch.float64), ("fp32", torch.float32)):
        if precision not in precisions:
            continue
        for name, comp, graphs in (("graphs", False, True), ("compile", True, False), ("compile+graphs", True, True)):
            if comp and not compile:
                continue
            try:
                r = eager_vs_fast(dev, dtype, comp, graphs)
                r["captured"] = graphs and dev.type == "cuda"
            except Exception as e:  # a path that cannot run on this device is a result, not a crash of the check
                r = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
            cases[f"{name}/{precision}"] = r
    return {"device": str(dev), "cases": cases, "ok": all(c["ok"] for c in cases.values())}


__all__ = ["device_check", "eager_vs_fast"]
