"""A run's components from its config (the wiring, in the manner of lightning-hydra-template's ``src/train.py``).

Data flows one way (DESIGN.md): cfg -> Dataset -> Partition -> FederatedData; cfg -> model; cfg -> Algorithm ->
Executor -> round results -> Evaluator -> Loggers. Everything that can be checked is checked before the first round.
The order of :func:`setup` is part of a run's result: every random draw is keyed by (seed, purpose, ...) except the
model's initial weights, drawn after ``seed_everything(seed, "init")`` right before the model is built.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from omegaconf import OmegaConf

from . import seeding
from .algorithms import ALGORITHMS
from .callbacks import Evaluation, FirstSteps, LocalModelMonitors, Logging, NewClientsEvaluation, say
from .context import Context
from .data.datasets import load_dataset
from .data.federated import FederatedData
from .data.partitions import make_partition
from .data.schedule import DataSchedule
from .engine import numerics
from .engine.augment import build_augment
from .engine.executor import make_executor
from .engine.functional import FModel
from .errors import ConfigError
from .evaluation import Evaluator
from .forgetting import ForgettingMonitor
from .models import build_model
from .newclients import NewClients
from .rundir import check_writable
from .similarity import SimilarityMonitor


def pick_device(requested: str, local_rank: int | None = None) -> torch.device:
    """``auto``: CUDA if present (in a multirun on a multi-GPU box, GPU = job number mod #GPUs), else CPU. A run over
    several processes (``local_rank`` given): ``auto`` / ``cuda`` = GPU local rank mod #GPUs."""
    if local_rank is not None and requested in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    if requested == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        n = torch.cuda.device_count()
        if n > 1:
            from hydra.core.hydra_config import HydraConfig

            if HydraConfig.initialized() and HydraConfig.get().job.get("num") is not None:
                return torch.device(f"cuda:{int(HydraConfig.get().job.num) % n}")
        return torch.device("cuda")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            "hardware.device", requested, "CUDA is not available on this machine; use hardware=cpu or hardware=auto"
        )
    return torch.device(requested)


def hardware(hw, world=None) -> tuple[torch.device, torch.dtype]:
    """The device and dtype of a run (``hardware``); sets the thread pools and the numerics."""
    device = pick_device(hw.device, world.local_rank if world is not None and world.size > 1 else None)
    check_fast_paths(hw, device)
    if hw.threads:  # torch's and NumPy/SciPy's BLAS pools alike (server-side solvers use the latter)
        torch.set_num_threads(int(hw.threads))
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=int(hw.threads))
    # TF32 off unless asked; strict determinism
    numerics.configure(hw.get("tf32", False), bool(hw.deterministic), device)
    return device, torch.float64 if hw.precision == "fp64" else torch.float32


def check_fast_paths(hw, device: torch.device) -> None:
    """``hardware.compile`` / ``hardware.cuda_graphs`` (docs/fast_paths.md) apply to the vectorized executor, CUDA
    graphs to a CUDA device: asked for elsewhere, the run fails here, before its data is loaded."""
    executor = hw.executor if hw.executor != "auto" else ("vectorized" if device.type == "cuda" else "sequential")
    for key in ("compile", "cuda_graphs"):
        if hw.get(key, False) and executor != "vectorized":
            raise ConfigError(
                f"hardware.{key}", True, f"true only with the vectorized executor (this run's is {executor}: "
                "hardware.executor=vectorized)"
            )  # fmt: skip
    if hw.get("cuda_graphs", False) and device.type != "cuda":
        raise ConfigError("hardware.cuda_graphs", True, f"true only on a CUDA device (this run's is {device.type})")


def federated_data(cfg, device: torch.device, dtype: torch.dtype) -> FederatedData:
    """The dataset, split over ``clients`` clients by the partition (``partition.seed``: ``${seed}`` by default)."""
    dataset = load_dataset(cfg.dataset, cache_dir=cfg.cache_dir)
    part = make_partition(
        cfg.partition,
        dataset.y.numpy(),
        dataset.n_train,
        dataset.num_classes,
        int(cfg.clients),
        seeding.rng(int(cfg.partition.seed), "partition"),
        attrs=dataset.attrs,
    )
    data = FederatedData.build(dataset, part, device, dtype, pin_memory=bool(cfg.hardware.pin_memory))
    if cfg.drop_last:  # a client with fewer samples than a batch takes no step (its batches are all dropped)
        sizes, b = data.train_sizes(), int(cfg.batch_size)
        idle = int((sizes < b).sum())
        if idle == len(sizes):
            raise ConfigError(
                "batch_size", b, f"at most {int(sizes.max())} with drop_last=true (the largest client's training "
                "samples): every batch would be dropped and no client would train"
            )  # fmt: skip
        if idle:
            print(f"fedbench: {idle} of {len(sizes)} clients hold fewer than batch_size={b} training samples: with "
                  "drop_last=true they take no local step", file=sys.stderr)  # fmt: skip
    return data


def model(cfg, data: FederatedData, device: torch.device, dtype: torch.dtype):
    """(executor, FModel) of the run; the initial weights are drawn from the global RNG (seeded by the caller)."""
    hw = cfg.hardware
    net = build_model(cfg.model, data.input_shape, data.num_classes)
    if bool(hw.deterministic):  # a layer strict determinism would stop at the first backward: say so now
        numerics.check_deterministic(net, device)
    net = net.to(device, dtype)
    executor = make_executor(
        hw.executor,
        device,
        hw.precision,
        bool(hw.channels_last),
        int(hw.eval_batch),
        workers=hw.get("workers", 1),
        max_memory=hw.get("max_memory"),
        compile=bool(hw.get("compile", False)),
        cuda_graphs=bool(hw.get("cuda_graphs", False)),
    )
    if executor.channels_last:  # the sequential executor on the CPU only (never under vmap)
        net = net.to(memory_format=torch.channels_last)
    return executor, FModel(net)


def enabled(cfg, key: str) -> bool:
    return bool(OmegaConf.select(cfg, f"eval.{key}.enabled", default=False))


def setup(run) -> None:
    """Everything before the first round, on ``run`` (its config validated): the run dir's free space first, the
    hardware, the data, the model, the algorithm, the evaluator and the monitors, the callbacks."""
    cfg = run.cfg
    check_writable(run.run_dir, float(cfg.checkpoint.min_free_mb))
    run.device, run.dtype = hardware(cfg.hardware, run.world)
    run.data = federated_data(cfg, run.device, run.dtype)
    # a class shrinking on a client mid-run (FedKA Fig. 3; fedbench/data/schedule.py); off unless data_schedule is set
    run.data_schedule = DataSchedule.from_cfg(cfg, run.data)
    # held-out new clients (CAFeMe §5): never sampled for training, fine-tuned and scored after it; off by default
    run.new_clients = None
    if enabled(cfg, "new_clients"):
        run.new_clients = NewClients(run.data, cfg.eval.new_clients, cfg.seed, cfg.rounds, run.image)

    seeding.seed_everything(cfg.seed, "init")
    run.executor, fm = model(cfg, run.data, run.device, run.dtype)
    run.augment = build_augment(cfg.dataset)  # training-time augmentation (dataset.augment), or None
    # all an algorithm may use of the run (fedbench/context.py); the run reads fm and the initial model through it
    run.ctx = Context(
        cfg,
        run.data,
        fm,
        run.executor,
        fm.init_state(run.dtype, run.device),
        run.augment,
        run.run_dir,
        publish=run.image,
        say=lambda line: say(run.loggers, line),
        observers=[lambda t, ids, res, phase: run.check_finite(t, ids, res)],
        world=run.world,
    )
    run.algorithm = ALGORITHMS[cfg.algorithm.name](run.ctx)
    run.algorithm.setup()
    # the evaluator and the monitors see what the algorithm sees (its context) and their own config node, not the run
    run.evaluator = Evaluator(run.ctx, cfg.eval)
    # class-wise forgetting degree (FedKA Eq. 1) of the round's local models, for any method; off by default
    run.forgetting = None
    if enabled(cfg, "forgetting"):
        run.forgetting = ForgettingMonitor(run.ctx, cfg.eval.forgetting, run.data_schedule)
    # FedReMa's S / MDS / Δs̄ (Eq. 5, Alg. 1, Eq. 8) of the round's local heads, for any method; off by default
    run.similarity = SimilarityMonitor(run.ctx, cfg.eval.similarity) if enabled(cfg, "similarity") else None
    run.callbacks = callbacks(run)


def callbacks(run) -> list:
    """The round loop's callbacks, in the order they are called (fedbench/callbacks.py)."""
    monitors = [LocalModelMonitors(run.forgetting, run.similarity)] if run.forgetting or run.similarity else []
    new_clients = [NewClientsEvaluation(run.new_clients)] if run.new_clients else []
    first = [FirstSteps()]  # before the others: round 1's clock starts after its data schedule and client sampling
    return [
        *first,
        *monitors,
        Evaluation(run.evaluator),
        *new_clients,
        Logging(),
        run.checkpointer,
        *run.extra_callbacks,
    ]


def sample_clients(cfg, num_clients: int, new_clients: NewClients | None, t: int) -> torch.Tensor:
    """The round's participants: a fraction ``participation`` of the K clients, uniformly without replacement
    (drawn from the training clients only when new clients are held out, eval.new_clients)."""
    m = max(1, int(round(float(cfg.participation) * num_clients)))
    if new_clients is not None:
        pool = new_clients.participants
        if m >= len(pool):
            return torch.as_tensor(pool)
        return torch.as_tensor(np.sort(pool[seeding.rng(cfg.seed, "sample", t).choice(len(pool), m, replace=False)]))
    if m >= num_clients:
        return torch.arange(num_clients)
    return torch.as_tensor(np.sort(seeding.rng(cfg.seed, "sample", t).choice(num_clients, m, replace=False)))
