"""Keyed dropout (fedbench/models/dropout.py) and pfl-research's simple_cnn (model=pfl_cnn,
+experiment=peers/pfl_cifar10): masks keyed by (job, client id, step), equal in both executors, padding-proof,
identity in eval mode."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import REPO, make_cfg
from omegaconf import OmegaConf

from fedbench.engine import optim
from fedbench.engine.executor import LocalJob, SequentialExecutor, VectorizedExecutor
from fedbench.engine.functional import FModel
from fedbench.engine.stack import broadcast
from fedbench.models import build_model
from fedbench.models.dropout import KeyedDropout, keyed, mix, step_key, uniform_like

SGD = optim.OptimSpec(lr=0.1, momentum=0.0)


def _mask(key: int, shape, p: float = 0.3) -> torch.Tensor:
    with keyed(torch.tensor(key)):
        return KeyedDropout(p)(torch.ones(shape, dtype=torch.float64))


def test_uniform_numbers_and_the_mask_rate():
    """Mean and variance of the hashed uniforms within 5 standard errors of U(0,1)'s (1/2, 1/12); KeyedDropout(0.3)
    keeps 70 % of the units (binomial bound) and scales them by 1/0.7 (as nn.Dropout)."""
    n = 200_000
    with keyed(torch.tensor(987654)):
        u = uniform_like(torch.zeros(n)).double()
    assert 0.0 <= u.min() and u.max() <= 1.0
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var().item() - 1 / 12) < 5 * math.sqrt(1 / 180 / n)  # Var of (U - 1/2)^2 = 1/80 - 1/144 = 1/180
    m = _mask(5, (n,))
    kept = (m > 0).double().mean().item()
    assert abs(kept - 0.7) < 5 * math.sqrt(0.7 * 0.3 / n)
    assert torch.allclose(m[m > 0], torch.full_like(m[m > 0], 1 / 0.7))


def test_masks_depend_on_key_call_and_position_only():
    a, b = _mask(11, (4, 50)), _mask(12, (4, 50))
    assert torch.equal(a, _mask(11, (4, 50)))  # same key: same mask
    assert not torch.equal(a, b)
    # a padded batch (more rows) gives the real rows the same masks: the index is the position in the batch
    assert torch.equal(_mask(11, (9, 50))[:4], a)
    # the second dropout call of a step draws a fresh mask
    with keyed(torch.tensor(11)):
        d = KeyedDropout(0.3)
        first, second = d(torch.ones(4, 50, dtype=torch.float64)), d(torch.ones(4, 50, dtype=torch.float64))
    assert torch.equal(first, a) and not torch.equal(first, second)
    # step keys: distinct per client and per step, and a function of the values (not of a call count)
    keys = {int(step_key(77, c, s)) for c in range(20) for s in range(20)}
    assert len(keys) == 400
    assert int(step_key(77, 3, 4)) == int(step_key(77, torch.tensor([1, 3]), 4)[1])
    assert int(mix(torch.tensor(0))) == 0 and int(mix(torch.tensor(1))) != 1  # a bijection fixing 0, mixing the rest


def test_eval_mode_and_zero_rate_are_the_identity():
    x = torch.randn(3, 7)
    d = KeyedDropout(0.6)
    assert torch.equal(d.eval()(x), x)
    assert torch.equal(KeyedDropout(0.0)(x), x)
    with pytest.raises(ValueError, match="0 <= p < 1"):
        KeyedDropout(1.0)


def _fm(dtype=torch.float64) -> FModel:
    torch.manual_seed(0)
    cfg = OmegaConf.create({"name": "pfl_cnn", "channels": [3, 4], "hidden": [6], "dropout": [0.25, 0.5]})
    return FModel(build_model(cfg, (1, 8, 8), 10).to(dtype))


def _data(n=40):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 10, (n,), generator=g)


def _train(E, fm, sched, ids, key=(0, "augment", "train", 3)):
    x, y = _data()
    p, b = fm.init_state(torch.float64)
    m = len(sched)
    job = LocalJob(fm, broadcast(p, m), broadcast(b, m), fm.param_names, sched, x, y, SGD, aug_key=key, client_ids=ids)
    return E.train(job)


def _sched():
    # three clients, ragged: 3, 1 and 2 steps; short last batches (the vectorized executor pads and masks them)
    a = torch.arange
    return [[a(0, 5), a(5, 10), a(10, 13)], [a(13, 17)], [a(20, 25), a(25, 27)]]


def test_both_executors_drop_the_same_units():
    """Ragged clients with dropout in body and head: every parameter after local training equal to 1e-10 in fp64
    (the masks are keyed by client id and step in both)."""
    fm = _fm()
    s = _train(SequentialExecutor(), fm, _sched(), [4, 9, 2])
    v = _train(VectorizedExecutor(), fm, _sched(), [4, 9, 2])
    for k in s.params:
        assert (s.params[k] - v.params[k]).abs().max().item() < 1e-10, k
    assert torch.allclose(s.loss, v.loss, rtol=0, atol=1e-12)


@pytest.mark.parametrize("E", [SequentialExecutor, VectorizedExecutor])
def test_a_clients_masks_follow_its_id_and_the_round(E):
    """Client 9 trained alone or beside others ends with the same model (its masks are keyed by its id, not its place
    in the job); the same client with another id, or in another round, drops other units (a different model)."""
    fm = _fm()
    full = _train(E(), fm, _sched(), [4, 9, 2])
    alone = _train(E(), fm, [_sched()[1]], [9])
    other_id = _train(E(), fm, [_sched()[1]], [5])
    other_round = _train(E(), fm, [_sched()[1]], [9], key=(0, "augment", "train", 4))
    for k in full.params:  # (fp64: a batched call of 3 clients rounds differently from one of 1)
        assert (full.params[k][1] - alone.params[k][0]).abs().max().item() < 1e-12, k
    w = "head.0.weight"
    assert (alone.params[w] - other_id.params[w]).abs().max().item() > 1e-3
    assert (alone.params[w] - other_round.params[w]).abs().max().item() > 1e-3


def test_pfl_cnn_is_pfl_researchs_simple_cnn():
    """The architecture and its size on 3x32x32 (hand count: conv 3*32*9+32 = 896, conv 32*64*9+64 = 18,496,
    FC 12544*128+128 = 1,605,760 (14x14x64 after the pool), FC 128*10+10 = 1,290: 1,626,442) and Glorot-uniform
    weights: within ±sqrt(6/(fan_in+fan_out)) and reaching 90 % of it."""
    torch.manual_seed(0)
    net = build_model(OmegaConf.load(REPO / "conf" / "model" / "pfl_cnn.yaml"), (3, 32, 32), 10)
    assert sum(p.numel() for p in net.parameters()) == 1_626_442
    assert [type(m).__name__ for m in net.body] == [
        "Conv2d", "ReLU", "Conv2d", "ReLU", "MaxPool2d", "KeyedDropout", "Flatten"
    ]  # fmt: skip
    assert [type(m).__name__ for m in net.head] == ["Linear", "ReLU", "KeyedDropout", "Linear"]
    assert [net.body[5].p, net.head[2].p] == [0.25, 0.5]
    assert net.classifier == "head.3" and net.feature_dim == 12544
    for layer, fan_in, fan_out in [(net.body[0], 27, 288), (net.body[2], 288, 576), (net.head[0], 12544, 128)]:
        bound = math.sqrt(6 / (fan_in + fan_out))
        w = layer.weight.abs().max().item()
        assert 0.9 * bound < w <= bound, (layer, w, bound)


def test_bad_dropout_rate_is_one_line_before_training():
    from fedbench.config import validate
    from fedbench.errors import ConfigError

    cfg = make_cfg("model=pfl_cnn", "model.dropout=[0.25,1.0]")
    with pytest.raises(ConfigError, match=r"model.dropout=\[0.25, 1.0\].*0 <= rate < 1"):
        validate(cfg)


def test_the_pfl_benchmark_experiment_composes_its_setting():
    cfg = make_cfg("+experiment=peers/pfl_cifar10", fast=False)
    assert (cfg.dataset.name, cfg.partition.name, cfg.model.name, cfg.algorithm.name) == (
        "cifar10", "iid", "pfl_cnn", "fedavg"
    )  # fmt: skip
    assert cfg.clients * cfg.participation == 50 and cfg.clients == 1000
    assert (cfg.local_epochs, cfg.batch_size, cfg.lr, cfg.optim.momentum, cfg.eval_every) == (1, 10, 0.1, 0.0, 10)
    assert cfg.partition.test_split == "global" and not cfg.eval.personalized and cfg.eval.global_model


def test_each_step_draws_the_masks_of_its_key():
    """The sequential executor's masks at client 9's steps 0, 1, 2 are those of step_key(job key, 9, step): three
    different masks (a key that ignored the step would repeat one)."""
    from fedbench import seeding

    fm = _fm()
    seen = []
    hook = fm.net.body[5].register_forward_hook(lambda m, a, out: seen.append((a[0] != 0, out == 0)))
    try:
        _train(SequentialExecutor(), fm, [_sched()[0]], [9], key=(0, "augment", "train", 3))
    finally:
        hook.remove()
    base = seeding.key31(0, "augment", "train", 3, "dropout")
    masks = []
    for step, (live, dropped) in enumerate(seen):  # a unit is seen dropped where its input was not 0 already
        with keyed(step_key(base, 9, step)):
            want = KeyedDropout(0.25)(torch.ones(live.shape, dtype=torch.float64)) == 0
        assert live.float().mean() > 0.5 and torch.equal(dropped[live], want[live]), step
        masks.append(want[:3])
    assert len(seen) == 3 and not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])


def test_a_model_with_torchs_dropout_is_refused_naming_the_layer():
    """torch's nn.Dropout would draw from the global generator (unkeyed; refused under vmap): one line naming it."""
    from torch import nn

    from fedbench.errors import ConfigError
    from fedbench.models import MODELS, SplitNet

    MODELS["plain_dropout_net"] = lambda shape, c: SplitNet(
        nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Dropout(0.3)), nn.Sequential(nn.Linear(8, c)), "head.0"
    )
    try:
        with pytest.raises(ConfigError, match=r"model='plain_dropout_net'.*torch.nn.Dropout \(body.2\).*KeyedDropout"):
            build_model(OmegaConf.create({"name": "plain_dropout_net"}), (1, 8, 8), 10)
    finally:
        del MODELS["plain_dropout_net"]
