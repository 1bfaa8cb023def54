"""Model registry: ``build_model(cfg.model, input_shape, num_classes)``."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from ..errors import ConfigError
from .base import SplitNet
from .cafeme import cafeme_cnn
from .nets import alexnet, cnn, lenet, mlp, pfl_cnn
from .resnet import resnet32, resnet50

MODELS = {
    "mlp": mlp,
    "cnn": cnn,
    "alexnet": alexnet,
    "lenet": lenet,
    "pfl_cnn": pfl_cnn,
    "resnet32": resnet32,
    "resnet50": resnet50,
    "cafeme_cnn": cafeme_cnn,  # CAFeMe's base network with its modulator (models/cafeme.py)
}


def register(name: str):
    """Decorator to add a model builder ``fn(input_shape, num_classes, **options) -> SplitNet``."""

    def deco(fn):
        MODELS[name] = fn
        return fn

    return deco


def build_model(cfg, input_shape, num_classes: int) -> SplitNet:
    """Build the configured model and check that the dataset's input shape fits it."""
    if cfg.name not in MODELS:
        raise ConfigError("model", cfg.name, f"one of {sorted(MODELS)}")
    options = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "name"}
    shape = "x".join(map(str, input_shape))
    try:
        net = MODELS[cfg.name](tuple(input_shape), num_classes, **options)
        net.eval()
        with torch.no_grad():
            out = net(torch.zeros(2, *input_shape))
        net.train()
    except TypeError as e:
        raise ConfigError("model", cfg.name, f"unknown option for this model ({e})") from None
    except (RuntimeError, MemoryError) as e:
        first = str(e).splitlines()[0]
        if isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in first:
            size = _size(MODELS[cfg.name], input_shape, num_classes, options)
            raise ConfigError(
                "model", cfg.name, f"too large for this machine's memory: {size}, with {options}"
            ) from None
        raise ConfigError("model", cfg.name, f"does not fit the dataset's {shape} inputs ({first})") from None
    plain = [n for n, m in net.named_modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    if plain:  # torch's dropout draws from the global generator: under vmap it raises, sequentially it is unkeyed
        raise ConfigError(
            "model", cfg.name, f"uses torch.nn.Dropout ({', '.join(plain)}): build it with "
            "fedbench.models.dropout.KeyedDropout (masks keyed by client and step, the same in both executors)"
        )  # fmt: skip
    if tuple(out.shape) != (2, num_classes):
        raise ConfigError(
            "model", cfg.name, f"gives outputs {tuple(out.shape)} for {shape} inputs, expected (2, {num_classes})"
        )
    return net


def _size(builder, input_shape, num_classes: int, options: dict) -> str:
    """The size of a model too large to allocate: its parameters counted on the meta device (no memory)."""
    try:
        with torch.device("meta"):
            n = sum(p.numel() for p in builder(tuple(input_shape), num_classes, **options).parameters())
    except Exception:  # a builder that needs real tensors
        return "its size is unknown"
    return f"{n:,} parameters, {n * 4 / 2**30:,.1f} GiB in float32 (each client's copy and the optimizer's state more)"


__all__ = ["MODELS", "SplitNet", "build_model", "register"]
