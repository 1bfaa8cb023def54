"""Model registry: shapes, head/feature splits, input-shape checks."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from fedbench.errors import ConfigError
from fedbench.models import build_model

CASES = [
    # name, input shape, feature dim, head param names (the FC layers that form the classifier side)
    ("mlp", (1, 8, 8), 128, ["head.0.weight", "head.0.bias"]),
    ("cnn", (1, 28, 28), 1024, ["head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"]),  # FedReMa MNIST CNN
    (
        "cnn",
        (3, 32, 32),
        1600,
        ["head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias"],
    ),  # FedAvg CIFAR CNN / t-CNN
    (
        "alexnet",
        (3, 32, 32),
        2304,
        ["head.0.weight", "head.0.bias", "head.1.weight", "head.1.bias", "head.2.weight", "head.2.bias"],
    ),
    ("lenet", (1, 28, 28), 84, ["head.0.weight", "head.0.bias"]),
    ("resnet32", (3, 32, 32), 64, ["head.0.weight", "head.0.bias"]),
]


@pytest.mark.parametrize("name,shape,feat,head", CASES)
def test_shapes_and_split(name, shape, feat, head):
    net = build_model(OmegaConf.create({"name": name}), shape, 10)
    assert net(torch.randn(3, *shape)).shape == (3, 10)
    assert net.body(torch.randn(3, *shape)).shape == (3, feat) and net.feature_dim == feat
    assert net.names("head") == head
    body = net.names("body")
    assert body and not set(body) & set(head) and len(body) + len(head) == len(list(net.parameters()))
    assert set(net.names("classifier")) <= set(head)


def test_paper_parameter_counts():
    count = lambda n, s: sum(p.numel() for p in build_model(OmegaConf.create({"name": n}), s, 10).parameters())
    assert count("resnet32", (3, 32, 32)) == 464154  # He et al.'s 0.46M
    assert count("cnn", (1, 28, 28)) == 582026  # FedAvgCNN on MNIST (PFLlib)
    # simplified AlexNet: convs 32-64-128-256-256 (3x3) + 2304-1024-512-10
    convs = 3 * 32 * 9 + 32 + 32 * 64 * 9 + 64 + 64 * 128 * 9 + 128 + 128 * 256 * 9 + 256 + 256 * 256 * 9 + 256
    fcs = 2304 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 10 + 10
    assert count("alexnet", (3, 32, 32)) == convs + fcs


def test_last_block_names():
    net = build_model(OmegaConf.create({"name": "resnet32"}), (3, 32, 32), 10)
    names = net.names("last_block")
    assert names and all(n.startswith("body.5.4.") for n in names)


@pytest.mark.parametrize("name,shape", [("cnn", (1, 8, 8)), ("alexnet", (1, 8, 8))])
def test_model_that_does_not_fit_the_input(name, shape):
    with pytest.raises(ConfigError, match=f"model='{name}'.*1x8x8"):
        build_model(OmegaConf.create({"name": name}), shape, 10)


def test_unknown_model_option():
    with pytest.raises(ConfigError, match="unknown option"):
        build_model(OmegaConf.create({"name": "mlp", "depth": 3}), (1, 8, 8), 10)
