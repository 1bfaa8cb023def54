"""Config checks made before any data is loaded or any training starts.

Each check names the key, the bad value and what is allowed (one line, exit code 2). Checks that
need the data (more clients than samples, a model that does not fit the input shape, missing
data roots, ...) are made by the dataset, partition and model builders, still before training.
The README's "Config checks" table lists them all.
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf

from .checks import boolean, device, int_at_least, is_int, list_of, number, one_of, text
from .confdir import help_groups
from .errors import ConfigError

MAX_ROUNDS = 10**7  # far beyond any paper (1,500); a larger count is a typo, and overflows the ETA's clock
F32_MAX = 3.4e38  # a larger learning rate is inf in float32: the first step would wipe the model


_finite = number()[0]  # a finite int or float, not a bool


CHECKS: dict[str, tuple] = {
    "seed": int_at_least(0),
    "partition.seed": int_at_least(0),
    "rounds": (lambda v: is_int(v) and 1 <= v <= MAX_ROUNDS, f"an integer >= 1 (at most {MAX_ROUNDS})"),
    "clients": int_at_least(1),
    "participation": number(0, 1, lo_open=True),
    "local_epochs": int_at_least(1),
    "batch_size": int_at_least(1),
    "drop_last": boolean(),
    "lr": number(0, F32_MAX, lo_open=True),
    "eval_every": int_at_least(1),
    "optim.name": one_of("sgd", "adam"),
    "optim.lr": number(0, F32_MAX, lo_open=True),
    "optim.momentum": number(0, 1, hi_open=True),
    "optim.weight_decay": number(0, None),
    "optim.nesterov": boolean(),
    "optim.clip_grad_norm": number(0, None, lo_open=True, optional=True),
    "optim.persistent_state": boolean(),
    "optim.lr_decay_round": (lambda v: v is None or (is_int(v) and v >= 0), "null or a round >= 0"),
    "optim.lr_decay_to": number(0, F32_MAX, lo_open=True, optional=True),
    "eval.final_window": int_at_least(1),
    "eval.personalized": boolean(),
    "eval.global_model": boolean(),
    # optional diagnostics: their values are checked even while they are off (ranges as in forgetting.py, similarity.py)
    "eval.forgetting.enabled": boolean(),
    "eval.forgetting.every": int_at_least(1),
    "eval.forgetting.draw_every": int_at_least(0),
    "eval.forgetting.gamma": number(0, 1, lo_open=True),
    "eval.forgetting.xi": number(0, None, lo_open=True),
    "eval.similarity.enabled": boolean(),
    "eval.similarity.every": int_at_least(1),
    "eval.similarity.temperature": number(0, None, lo_open=True),
    "eval.similarity.probe_scale": number(0, None, lo_open=True),
    "eval.similarity.symmetric_temperature": boolean(),
    "eval.similarity.ignore_self_gap": boolean(),
    "eval.similarity.save_rounds": list_of(
        lambda x: is_int(x) and x >= 1, "a list of rounds >= 1, e.g. [1, 50, 100, 150]"
    ),
    "eval.new_clients.enabled": boolean(),  # its other keys: fedbench.newclients.CHECKS
    "eval.new_clients.lr_pfl": number(0, None, lo_open=True),
    "divergence.factor": number(1, None, lo_open=True, optional=True),
    "scale": number(0, None, lo_open=True),
    "data_root": text(),
    "cache_dir": text(),
    # dataset options (each applies where the dataset has it)
    "dataset.test_fraction": number(0, 1, lo_open=True, hi_open=True),
    "dataset.split_seed": int_at_least(0),
    "dataset.seed": int_at_least(0),
    "dataset.num_classes": int_at_least(2),
    "dataset.train_per_class": int_at_least(1),
    "dataset.test_per_class": int_at_least(1),
    "dataset.shape": list_of(lambda x: is_int(x) and x >= 1, "a list [C, H, W] of 3 integers >= 1", length=3),
    "dataset.noise": number(0, None),
    "dataset.cache": boolean(),
    "dataset.download": boolean(),
    "partition.test_fraction": number(0, 1, lo_open=True, hi_open=True),
    "partition.alpha": (lambda v: number(0, None, lo_open=True)[0](v), "a number with 0 < alpha"),  # Dirichlet
    "partition.shards_per_client": int_at_least(1),
    "partition.samples_per_client": (lambda v: v is None or (is_int(v) and v >= 1), "an integer >= 1 or null"),
    # model widths (each applies where the model has it): a zero-width layer would train nothing
    "model.channels": list_of(lambda x: is_int(x) and x >= 1, "a list of integers >= 1 (one per conv layer)"),
    "model.hidden": list_of(lambda x: is_int(x) and x >= 1, "a list of integers >= 1 (one per hidden layer)"),
    "model.head_hidden": list_of(lambda x: is_int(x) and x >= 1, "a list of integers >= 1 (one per head layer)"),
    "model.modulator_hidden": list_of(lambda x: is_int(x) and x >= 1, "a list of integers >= 1"),
    "model.dropout": list_of(
        lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1,
        "a list [body rate, head rate] of numbers with 0 <= rate < 1",
        length=2,
    ),
    "model.kernel_size": int_at_least(1),
    "model.padding": int_at_least(0),
    "dataset.normalize": (
        lambda v: (
            v is None
            or (
                hasattr(v, "keys")
                and set(v.keys()) == {"mean", "std"}
                and all(_finite(x) for x in [*v["mean"], *v["std"]])
                and all(x > 0 for x in v["std"])
            )
        ),
        "null or {mean: [...], std: [...]} of finite numbers with every std > 0 (one value per channel)",
    ),
    "dataset.augment": (
        lambda v: (
            v is None
            or (
                hasattr(v, "keys")
                and set(v.keys()) <= {"crop_padding", "hflip"}
                and is_int(v.get("crop_padding", 4))
                and v.get("crop_padding", 4) >= 0
                and isinstance(v.get("hflip", True), bool)
            )
        ),
        "null or {crop_padding: an integer >= 0, hflip: true | false} (random crop and horizontal flip)",
    ),
    "checkpoint.every": int_at_least(0),
    "checkpoint.keep": int_at_least(1),
    "checkpoint.keep_complete": int_at_least(0),
    "checkpoint.final_model": boolean(),
    "checkpoint.on_signal": boolean(),
    "checkpoint.min_free_mb": number(0, None),
    "resume": boolean(),
    "hardware.device": device(),
    "hardware.executor": one_of("auto", "sequential", "vectorized"),
    "hardware.precision": one_of("fp32", "bf16", "fp64"),
    "hardware.threads": (lambda v: v is None or (is_int(v) and v >= 1), "null or an integer >= 1"),
    "hardware.deterministic": boolean(),
    "hardware.workers": (lambda v: v == "auto" or (is_int(v) and v >= 1), "auto or an integer >= 1"),
    "hardware.channels_last": boolean(),
    "hardware.tf32": boolean(),
    "hardware.compile": boolean(),  # the vectorized step compiled per shape bucket (engine/fast.py, docs/fast_paths.md)
    "hardware.cuda_graphs": boolean(),  # ... captured as CUDA graphs (CUDA only: build.hardware)
    "hardware.max_memory": number(0, None, lo_open=True, optional=True),  # bytes, or a fraction (<= 1) of the device's
    "hardware.pin_memory": boolean(),
    "hardware.eval_batch": int_at_least(1),
    "hardware.distributed": one_of("auto", "off"),
    "hardware.distributed_timeout": number(0, None, lo_open=True),
    "logger.wandb.mode": one_of("auto", "online", "offline", "disabled"),
    "logger.wandb.project": text(),
    "logger.wandb.entity": text(optional=True),
    "logger.wandb.group": text(optional=True),
    "logger.wandb.tags": list_of(lambda x: isinstance(x, str), "a list of strings"),
    "logger.wandb.init_timeout": number(0, None, lo_open=True, optional=True),
    "logger.console": boolean(),
    "logger.jsonl": boolean(),
    "logger.pictures": boolean(),
}


def _source_key(cfg, key: str) -> str:
    """The key the user set: ``eval.forgetting.gamma: ${oc.select:algorithm.gamma,0.05}`` is reported as
    ``algorithm.gamma``."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if node is None or not OmegaConf.is_interpolation(node, leaf):
        return key
    raw = node._get_node(leaf)._value()
    m = re.fullmatch(r"\$\{(?:oc\.select:)?([\w.]+)(?:,[^}]*)?\}", str(raw))
    if m is None or OmegaConf.select(cfg, m.group(1), default=None) is None:
        return key
    return m.group(1)


def validate(cfg) -> None:
    """Raise :class:`ConfigError` for the first bad value among the static checks."""
    for key, (ok, allowed) in CHECKS.items():
        value = OmegaConf.select(cfg, key, default="<missing>")
        if value == "<missing>":
            continue  # optional sections (e.g. checkpoint) may be absent in old configs
        if not ok(value):
            source = _source_key(cfg, key)
            raise ConfigError(source, value, allowed if source == key else f"{allowed} (it is also {key})")
    if OmegaConf.select(cfg, "optim.lr_decay_round") is not None and OmegaConf.select(cfg, "optim.lr_decay_to") is None:
        raise ConfigError("optim.lr_decay_to", None, "a learning rate > 0 when optim.lr_decay_round is set")
    if cfg.optim.nesterov and cfg.optim.momentum <= 0:
        raise ConfigError("optim.nesterov", True, "needs optim.momentum > 0")
    ev = cfg.get("eval") or {}
    if ev and not (ev.get("personalized") or ev.get("global_model") or (ev.get("new_clients") or {}).get("enabled")):
        raise ConfigError(
            "eval.personalized",
            ev.get("personalized"),
            "true, or eval.global_model or eval.new_clients.enabled true: the run would measure nothing",
        )
    from .protocol import check as check_protocol

    check_protocol(cfg)
    clients = cfg.get("clients")
    if is_int(clients) and clients >= 1 and float(cfg.participation) * clients < 0.5:  # build.py: max(1, round(.))
        raise ConfigError(
            "participation",
            cfg.participation,
            f"at least {0.5 / clients:g} with clients={clients} (half a client, taken as one): "
            f"{float(cfg.participation) * clients:g} clients per round",
        )
    # imported here, not at the top: every entry point imports this module (fedbench/__init__.py), and these load
    # torch and every algorithm, dataset and model (seconds) that e.g. `fedbench report` never needs. (Not to hide a
    # cycle: nothing they import imports this module, tests/test_layers.py.)
    from .newclients import CHECKS as NEW_CLIENTS

    for key, (ok, allowed) in NEW_CLIENTS.items():
        value = OmegaConf.select(cfg, f"eval.new_clients.{key}", default="<missing>")
        if value != "<missing>" and not ok(value):
            raise ConfigError(f"eval.new_clients.{key}", value, allowed)
    from .algorithms import ALGORITHMS
    from .data.datasets import DATASETS
    from .models import MODELS

    for key, registry in (("algorithm.name", ALGORITHMS), ("dataset.name", DATASETS), ("model.name", MODELS)):
        value = OmegaConf.select(cfg, key)
        if value not in registry:
            raise ConfigError(key, value, "one of " + ", ".join(sorted(registry)))


def _scaled(n, *, _root_):
    """``${scaled:500}``: a paper-scale count multiplied by the top-level ``scale`` (at least 1)."""
    return max(1, int(round(float(n) * float(_root_.get("scale", 1.0)))))


NAME_KEEP = (
    100  # a run dir name longer than NAME_LIMIT keeps the whole key=value items that fit in this many characters
)
NAME_LIMIT = 120


def dirname(text, parent=None) -> str:
    """A file-system-safe, bounded directory name for a run (``default`` when there are no overrides). A name over
    ``NAME_LIMIT`` characters keeps the whole ``key=value`` items that fit in ``NAME_KEEP`` and says how many it left
    out, with a hash of the whole: ``...,partition=shards,+2_more-<hash>`` — never cut inside a value (issue #53: a
    cut ``samples_per_client=1-<hash>`` for 100 read as another setting). ``parent``: the folder the name is for; a
    run made there before issue #53 under the old name (the first 100 characters, then the hash) keeps it, so the same
    command still resumes or skips it."""
    import hashlib

    if not isinstance(text, str):
        text = ",".join(map(str, text))
    text = re.sub(r"[^A-Za-z0-9=,.+_\-]", "_", text.replace("/", "_")).strip("_") or "default"
    if len(text) <= NAME_LIMIT:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    cuts = [0] + [m.start() for m in re.finditer(r",(?=[A-Za-z0-9_.+\-]+=)", text)]  # before each key (not a value's ,)
    keep = max(c for c in cuts if c <= NAME_KEEP)
    name = f"{text[:keep]}{',' if keep else ''}+{len(cuts) - cuts.index(keep)}_more-{digest}"
    old = f"{text[:NAME_KEEP]}-{digest}"
    if parent is not None and (Path(str(parent)) / old).is_dir() and not (Path(str(parent)) / name).exists():
        return old
    return name


if not OmegaConf.has_resolver("scaled"):
    OmegaConf.register_new_resolver("scaled", _scaled)
if not OmegaConf.has_resolver("fb_dirname"):
    OmegaConf.register_new_resolver("fb_dirname", dirname)
if not OmegaConf.has_resolver("fb_help_groups"):  # conf/hydra/help/fedbench.yaml: resolved wherever a config's hydra
    OmegaConf.register_new_resolver("fb_help_groups", help_groups)  # node is (claims read runs made by any command)
