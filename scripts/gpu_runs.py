"""A fedbench run built from overrides for rounds a device script drives itself (scripts/gpu_check.py,
scripts/device_bench.py): the Hydra compose, the run and its loggers, the device synchronised before a clock is read.
fedbench is imported inside the functions (the GPU image gets hydra from the travel kit: scripts/device_env.sh)."""

from __future__ import annotations

import tempfile

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose

    from fedbench.claims.spec import hydra_context

    with hydra_context():
        return hydra_compose("config", overrides=overrides)


def make_run(overrides: list[str]):
    from fedbench.run import Run

    return Run(compose(overrides), tempfile.mkdtemp(prefix="fedbench-gpucheck-"))


def built(overrides: list[str]):
    """A run set up for rounds driven here (not by Run.execute): its components and its loggers (an algorithm may
    publish a picture, as ECL does)."""
    from fedbench.loggers import build_loggers

    r = make_run(overrides)
    r.setup()
    r.loggers = build_loggers(r.cfg, r.run_dir, "gpu_check")
    return r
