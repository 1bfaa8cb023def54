"""conf/hardware: explicit numerics (tf32, deterministic), channels_last only where it helps, the memory budget
wired through a run, and the per-round state snapshot kept in host memory."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import make_cfg, run_cfg

from fedbench.checkpoint import host_copy
from fedbench.engine import numerics
from fedbench.errors import ConfigError
from fedbench.run import Run


@pytest.fixture
def restore_numerics(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    yield
    numerics.configure(False, False, torch.device("cpu"))


def _setup(tmp_path, *overrides):
    run = Run(make_cfg(*overrides), tmp_path)
    run.setup()
    return run


def test_deterministic_is_strict_and_sets_cublas_workspace(tmp_path, restore_numerics):
    _setup(tmp_path / "a", "hardware.deterministic=true")
    assert torch.are_deterministic_algorithms_enabled()
    assert (
        not torch.is_deterministic_algorithms_warn_only_enabled()
    )  # strict: an op without a deterministic kernel raises
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    _setup(tmp_path / "b", "hardware.deterministic=false")
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.benchmark  # cuDNN benchmarking only on a GPU


def test_tf32_is_off_unless_asked(tmp_path, restore_numerics):
    numerics.set_tf32(True)
    _setup(tmp_path / "a")
    assert numerics.tf32_flags() == {"matmul": "ieee", "cudnn_conv": "ieee"}  # torch's default has TF32 convolutions
    _setup(tmp_path / "b", "hardware.tf32=true")
    assert numerics.tf32_flags() == {"matmul": "tf32", "cudnn_conv": "tf32"}


@pytest.mark.parametrize("executor,expected", [("sequential", True), ("vectorized", False)])
def test_channels_last_only_for_the_sequential_executor_on_the_cpu(tmp_path, executor, expected):
    run = _setup(tmp_path, "model=tiny_cnn", f"hardware.executor={executor}", "hardware.channels_last=true")
    w = next(p for p in run.fm.net.parameters() if p.dim() == 4 and p.shape[1] > 1)  # a conv with >1 input channel
    assert run.executor.channels_last is expected
    assert w.is_contiguous(memory_format=torch.channels_last) is expected and w.is_contiguous() is not expected


@pytest.mark.parametrize(
    "key,value", [("hardware.tf32", "yes"), ("hardware.max_memory", -1), ("hardware.max_memory", "lots")]
)
def test_bad_hardware_values_fail_before_training(tmp_path, key, value):
    with pytest.raises(ConfigError, match=key):
        Run(make_cfg(f"{key}={value}"), tmp_path).setup()


def test_a_memory_budget_changes_no_result(tmp_path):
    """hardware.max_memory=2 (bytes): every client alone in its call; the run equals the unchunked one."""
    base = ("hardware.executor=vectorized", "model=tiny_cnn", "rounds=2", "hardware.precision=fp64")
    whole = run_cfg(make_cfg(*base), tmp_path / "whole")
    chunked = run_cfg(make_cfg(*base, "hardware.max_memory=2"), tmp_path / "chunked")
    for k, v in whole["metrics"].items():
        assert chunked["metrics"][k]["last"] == pytest.approx(v["last"], abs=1e-12), k


def test_round_snapshots_are_private_host_copies(tmp_path):
    """The state kept at each round boundary (saved if a signal cuts the next round) is a copy in host memory: its
    tensors are on the CPU and share no storage with the live state; containers and other values are copied too."""
    state = {"w": {"a": torch.ones(3)}, "hist": [{"round": 1, "acc": 0.5}], "pair": (torch.zeros(2), 7)}
    snap = host_copy(state)
    state["w"]["a"].add_(1)
    state["pair"][0].add_(1)
    state["hist"][0]["acc"] = 0.9
    assert snap["w"]["a"].device.type == "cpu" and torch.equal(snap["w"]["a"], torch.ones(3))
    assert torch.equal(snap["pair"][0], torch.zeros(2)) and snap["pair"][1] == 7 and isinstance(snap["pair"], tuple)
    assert snap["hist"][0]["acc"] == 0.5
    run = _setup(tmp_path, "rounds=1")
    run.history, run.times, run.evaluator.last = [], [], {}

    class _Loggers:
        wandb_id = None

    run.loggers = _Loggers()
    snap = run.checkpointer.snapshot(0)["state"]["algorithm"]
    live = run.algorithm.state_dict()
    assert all(
        v.device.type == "cpu" and v.untyped_storage().data_ptr() != live["w"][k].untyped_storage().data_ptr()
        for k, v in snap["w"].items()
    )
