"""Executors, optimizer and aggregation math."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_cfg, run_cfg
from omegaconf import OmegaConf

from fedbench.engine import optim
from fedbench.engine.agreement import fp32_agreement, max_diff
from fedbench.engine.executor import LocalJob, SequentialExecutor, VectorizedExecutor
from fedbench.engine.functional import FModel
from fedbench.engine.schedule import make_schedule
from fedbench.engine.stack import broadcast, mix, weighted_mean
from fedbench.models import build_model


def _tiny(dtype):
    torch.manual_seed(0)
    net = build_model(
        OmegaConf.create(
            {"name": "cnn", "channels": [4, 8], "kernel_size": 3, "padding": 1, "hidden": [16], "batch_norm": True}
        ),
        (1, 8, 8),
        10,
    ).to(dtype)
    return FModel(net)


def _ragged_local_training(E, dtype):
    """Ragged clients (different sizes, last batches of different sizes), BN, momentum, wd and clipping."""
    fm = _tiny(dtype)
    p, b = fm.init_state(dtype)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 1, 8, 8, dtype=torch.float64, generator=g).to(dtype)
    Y = torch.randint(0, 10, (300,), generator=g)
    idx = [np.arange(0, 50), np.arange(50, 130), np.arange(130, 300)]
    sched = make_schedule(idx, [0, 1, 2], 32, 0, "t", 1, epochs=2)
    spec = optim.OptimSpec(lr=0.05, momentum=0.9, weight_decay=1e-4, clip_grad_norm=1.0)
    res = E.train(LocalJob(fm, broadcast(p, 3), broadcast(b, 3), fm.param_names, sched, X, Y, spec))
    assert not torch.allclose(res.params["head.0.weight"], p["head.0.weight"])  # it did train
    return {"params": res.params, "buffers": res.buffers, "loss": res.loss}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sequential_equals_vectorized_local_training(dtype):
    """fp64: equal to 1e-12. fp32: the vectorized result as close to the fp64 answer as the sequential one
    (fedbench/engine/agreement.py; the fp32 round-off of either depends on the machine's kernels)."""
    seq, vec = (_ragged_local_training(E, dtype) for E in (SequentialExecutor(), VectorizedExecutor()))
    if dtype == torch.float64:
        for part in seq:
            assert max_diff(seq[part], vec[part]) <= 1e-12, part
        return
    ref = _ragged_local_training(SequentialExecutor(), torch.float64)
    for part in ref:
        ok, why = fp32_agreement(seq[part], vec[part], ref[part])
        assert ok, f"{part}: {why}"


@pytest.mark.parametrize("model", ["tiny_cnn", "mlp"])
def test_fedavg_rounds_identical_across_executors(tmp_path, model):
    """Whole FedAvg rounds (sampling, training, aggregation, evaluation) match across executors."""
    res = {}
    for ex in ("sequential", "vectorized"):
        cfg = make_cfg(
            f"model={model}", f"hardware.executor={ex}", "rounds=3", "participation=0.6", "hardware.precision=fp64"
        )
        res[ex] = run_cfg(cfg, tmp_path / ex)
    a, b = res["sequential"]["metrics"], res["vectorized"]["metrics"]
    for k in a:
        assert a[k]["last"] == pytest.approx(b[k]["last"], abs=1e-9), k
    assert res["sequential"]["final"]["pers_client_acc"] == res["vectorized"]["final"]["pers_client_acc"]


@pytest.mark.parametrize("algorithm", ["fedavg", "fedrema", "scaffold", "ditto"])
def test_parallel_client_workers_give_identical_runs(tmp_path, algorithm):
    """hardware.workers=2 (clients in two threads, one intra-op thread each) reproduces workers=1 exactly:
    per-client state (optimizer/control variates, personal models, BN buffers) lands in the right rows."""
    res = {}
    for w in (1, 2):
        cfg = make_cfg(f"algorithm={algorithm}", "model=tiny_cnn", f"hardware.workers={w}", "rounds=2", "clients=5")
        res[w] = run_cfg(cfg, tmp_path / str(w))
    assert res[1]["metrics"] == res[2]["metrics"]
    assert res[1]["final"]["pers_client_acc"] == res[2]["final"]["pers_client_acc"]


def test_adam_matches_torch():
    torch.manual_seed(0)
    w = torch.randn(3, 4)
    grads = [torch.randn(3, 4) for _ in range(5)]
    ref = w.clone().requires_grad_()
    opt = torch.optim.Adam([ref], lr=0.01, weight_decay=0.1)
    spec = optim.OptimSpec(name="adam", lr=0.01, weight_decay=0.1)
    mine = w.clone().unsqueeze(0).repeat(2, 1, 1)  # two stacked clients, identical
    st = optim.init_state(spec, {"w": mine}, ["w"], lead=(2,))
    for g in grads:
        ref.grad = g.clone()
        opt.step()
        optim.step(spec, [mine], [g.unsqueeze(0).repeat(2, 1, 1)], ["w"], st, batched=True)
    assert torch.allclose(mine[0], ref.detach(), atol=1e-6) and torch.allclose(mine[1], ref.detach(), atol=1e-6)


def test_sgd_matches_torch_with_per_client_clipping():
    torch.manual_seed(1)
    w = torch.randn(2, 5)
    g = torch.randn(2, 5) * torch.tensor([[10.0], [0.01]])  # client 0 clipped, client 1 not
    spec = optim.OptimSpec(lr=0.1, momentum=0.9, weight_decay=0.01, clip_grad_norm=1.0)
    stacked = w.clone()
    st = optim.init_state(spec, {"w": stacked}, ["w"])
    optim.step(spec, [stacked], [g.clone()], ["w"], st, batched=True)
    for m in range(2):
        ref = w[m].clone().requires_grad_()
        ref.grad = g[m].clone()
        torch.nn.utils.clip_grad_norm_([ref], 1.0)
        torch.optim.SGD([ref], lr=0.1, momentum=0.9, weight_decay=0.01).step()
        assert torch.allclose(stacked[m], ref.detach(), atol=1e-7)


def test_weighted_mean_and_mix():
    s = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), "n": torch.tensor([7, 7, 7])}
    avg = weighted_mean(s, torch.tensor([1.0, 1.0, 2.0]))
    assert torch.allclose(avg["a"], torch.tensor([(1 + 3 + 10) / 4, (2 + 4 + 12) / 4]))
    assert avg["n"].item() == 7  # integer buffers (BN counters) are not averaged
    W = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0, 0, 1.0]])
    assert torch.allclose(mix(s, W)["a"], torch.tensor([[1.0, 2.0], [2.0, 3.0], [5.0, 6.0]]))


def test_schedule_is_deterministic_and_covers_each_epoch():
    idx = [np.arange(10, 47)]
    a = make_schedule(idx, [3], 8, 0, "train", 5, epochs=2)
    b = make_schedule(idx, [3], 8, 0, "train", 5, epochs=2)
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    first_epoch = torch.cat(a[0][:5]).sort().values
    assert torch.equal(first_epoch, torch.arange(10, 47))
    c = make_schedule(idx, [3], 8, 0, "train", 6, epochs=2)  # another round: another order
    assert not all(torch.equal(x, y) for x, y in zip(a[0], c[0]))


def test_augmentation_is_identical_across_executors_and_is_a_crop_flip(tmp_path):
    from fedbench.engine.augment import RandomCropFlip

    fm = _tiny(torch.float64)
    p, b = fm.init_state(torch.float64)
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(120, 1, 8, 8, dtype=torch.float64, generator=g), torch.randint(0, 10, (120,), generator=g)
    idx = [np.arange(0, 40), np.arange(40, 120)]
    sched = make_schedule(idx, [0, 1], 16, 0, "t", 1, epochs=1)
    spec = optim.OptimSpec(lr=0.05)
    aug = RandomCropFlip(2, True, fill=[-1.0])
    out = [
        E.train(
            LocalJob(
                fm,
                broadcast(p, 2),
                broadcast(b, 2),
                fm.param_names,
                sched,
                X,
                Y,
                spec,
                augment=aug,
                aug_key=(0, "augment", "train", 1),
                client_ids=[3, 7],
            )
        )
        for E in (SequentialExecutor(), VectorizedExecutor())
    ]
    for k in p:
        assert torch.allclose(out[0].params[k], out[1].params[k], atol=1e-12), k
    plain = SequentialExecutor().train(
        LocalJob(fm, broadcast(p, 2), broadcast(b, 2), fm.param_names, sched, X, Y, spec)
    )
    assert not torch.allclose(
        plain.params["head.0.weight"], out[0].params["head.0.weight"]
    )  # augmentation changed training
    # every augmented image is a (possibly flipped) 8x8 window of the padded image, padded with `fill`
    x = X[:3]
    y = aug(x, torch.Generator().manual_seed(1))
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2), value=-1.0)
    for i in range(3):
        windows = [padded[i, :, a : a + 8, c : c + 8] for a in range(5) for c in range(5)]
        assert any(torch.equal(y[i], w) or torch.equal(y[i], w.flip(-1)) for w in windows)
