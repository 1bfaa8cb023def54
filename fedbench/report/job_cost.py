"""What one job costs per round on this machine, the unit of every estimate (runtime.py, estimate_check.py):

    training sample-passes per round x s per training sample  +  evaluated samples per round x s per evaluated sample

where the sample-passes come from the job's config composed and partitioned for real (participating clients x local
epochs x their mean train size; every client's test split and the global test set at each evaluation), and the two
per-sample costs are measured here on the job's model, input size and batch size (one thread, CPU seconds:
``time.process_time`` of SGD steps and of forward passes of random inputs, so that other load on the machine does not
count).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np


def _sig3(x: float) -> float:
    """Three significant digits: as conf/runtimes.yaml stores a per-sample cost (an estimate from a cost measured now
    is the one from the same cost stored)."""
    return float(f"{x:.3g}")


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _per_sample(net, x_shape, num_classes: int, batch: int, channels_last: bool) -> tuple[float, float]:
    """CPU seconds per training sample (forward, backward, SGD step at ``batch``) and per evaluated sample (256)."""
    import torch

    net = net.to(memory_format=torch.channels_last) if channels_last else net
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *x_shape, generator=g)
    y = torch.randint(0, num_classes, (batch,), generator=g)
    x = x.to(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    def timed(fn, n):
        fn()  # warm-up
        t = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - t) / n

    train = _sig3(timed(step, 5) / batch)
    xe = torch.randn(256, *x_shape, generator=g)
    xe = xe.to(memory_format=torch.channels_last) if channels_last and xe.dim() == 4 else xe
    net.eval()
    with torch.no_grad():
        evaluate = _sig3(timed(lambda: net(xe), 3) / 256)
    net.train()
    return train, evaluate


def cost_key(cfg, input_shape, num_classes: int) -> tuple:
    """The per-sample cost's key: the model's name and parameter count (two configs of one name, e.g. ``model=cnn``
    and ``model=tiny_cnn``, cost differently), the input shape, the classes and the batch size."""
    from ..models import build_model

    net = build_model(cfg.model, input_shape, num_classes)
    params = sum(p.numel() for p in net.parameters())
    return (f"{cfg.model.name}/{params}", tuple(input_shape), int(num_classes), int(cfg.batch_size)), net


def _cell(cfg, costs: dict) -> dict:
    """One job's rounds and seconds per round (see the module docstring); ``costs`` caches per-sample costs."""
    from omegaconf import OmegaConf

    from ..run import Run

    with tempfile.TemporaryDirectory() as tmp:
        run = Run(cfg, Path(tmp) / "run")
        run.setup()
        data = run.data
        k = len(data.train_idx)
        nc = getattr(run, "new_clients", None)  # CAFeMe's held-out new clients never train
        train_clients = [int(i) for i in nc.participants] if nc is not None else list(range(k))
        m = max(1, int(round(float(cfg.participation) * len(train_clients))))
        n_train = float(np.mean([len(data.train_idx[i]) for i in train_clients]))
        evaluated = sum(len(t) for t in data.test_idx) * bool(cfg.eval.personalized) + (  # what one evaluation scores
            len(data.global_test_idx) if cfg.eval.global_model else 0
        )
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            key, net = cost_key(cfg, data.input_shape, data.num_classes)
            if key not in costs:
                costs[key] = _per_sample(
                    net, tuple(data.input_shape), int(data.num_classes), int(cfg.batch_size), len(data.input_shape) == 3
                )
        finally:
            torch.set_num_threads(threads)
        c_train, c_eval = costs[key]
        epochs = OmegaConf.select(cfg, "local_epochs", default=1) or 1
        per_round = m * float(epochs) * n_train * c_train + evaluated * c_eval / max(1, int(cfg.eval_every))
        del run
    return {"rounds": int(cfg.rounds), "s_per_round": per_round}
