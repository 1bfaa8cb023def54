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
    # torch's default has TF32 cuDNN convolutions and RNNs
    assert numerics.tf32_flags() == {"matmul": "ieee", "cudnn_conv": "ieee", "cudnn_rnn": "ieee"}
    _setup(tmp_path / "b", "hardware.tf32=true")
    assert numerics.tf32_flags() == {"matmul": "tf32", "cudnn_conv": "tf32", "cudnn_rnn": "tf32"}


@pytest.mark.parametrize("on", [True, False])
def test_tf32_flags_are_set_and_read_back_without_mixing_torchs_two_apis(tmp_path, restore_numerics, on):
    """torch >= 2.9 raises when a legacy TF32 flag is read after the per-backend ``fp32_precision`` API was set
    (on torch 2.14: ``cuda.matmul.allow_tf32`` and ``get_float32_matmul_precision()`` with TF32 on,
    ``cudnn.allow_tf32`` with TF32 off). Every backend starts at the other value (cuDNN RNNs too: the old code left
    them as torch starts, TF32); a whole set-up run and a training round then read what fedbench set."""
    other = "ieee" if on else "tf32"
    numerics.set_tf32(not on)
    assert set(numerics.tf32_flags().values()) == {other}
    run = _setup(tmp_path, "model=tiny_cnn", f"hardware.tf32={str(on).lower()}")
    run.algorithm.round(1, torch.arange(2))
    mode = "tf32" if on else "ieee"
    assert numerics.tf32_flags() == {"matmul": mode, "cudnn_conv": mode, "cudnn_rnn": mode}
    if hasattr(torch.backends.cudnn.rnn, "fp32_precision"):  # the new API: what cuDNN RNNs will use
        assert torch.backends.cudnn.rnn.fp32_precision == mode


@pytest.mark.parametrize(
    "device,deterministic,benchmark", [("cuda", False, True), ("cuda", True, False), ("cpu", False, False)]
)
def test_cudnn_benchmarks_only_on_cuda_and_not_when_deterministic(restore_numerics, device, deterministic, benchmark):
    """cuDNN's algorithm search (faster convolutions, choice may vary run to run): on for a CUDA run unless
    hardware.deterministic; never for the CPU. Each case starts from the opposite setting."""
    torch.backends.cudnn.benchmark = not benchmark
    numerics.configure(False, deterministic, torch.device(device))
    assert torch.backends.cudnn.benchmark is benchmark
    assert torch.backends.cudnn.deterministic is deterministic


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
        jsonl_lines = None  # no metrics.jsonl sink (the checkpoint carries its rows where there is one)

    run.loggers = _Loggers()
    snap = run.checkpointer.snapshot(0)["state"]["algorithm"]
    live = run.algorithm.state_dict()
    assert all(
        v.device.type == "cpu" and v.untyped_storage().data_ptr() != live["w"][k].untyped_storage().data_ptr()
        for k, v in snap["w"].items()
    )


# Ops that torch.use_deterministic_algorithms(True) makes raise on CUDA (its docstring, torch 2.9-2.14): the oracle
# the module list of numerics.check_deterministic is checked against, op by op, on the CPU.
NO_DETERMINISTIC_CUDA = {
    "aten._adaptive_avg_pool2d_backward",
    "aten._adaptive_avg_pool3d_backward",
    "aten.adaptive_max_pool2d_backward",
    "aten.avg_pool3d_backward",
    "aten.fractional_max_pool2d_backward",
    "aten.max_unpool2d",
    "aten.reflection_pad2d_backward",
    "aten.upsample_bilinear2d_backward",
}


def _backward_ops(net: torch.nn.Module, shape) -> set:
    """The aten ops of one forward + backward of ``net`` (training mode, a batch of 2) on the CPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    seen: set = set()
    x = torch.randn(2, *shape)
    with Ops():
        net.train()(x).sum().backward()
    return seen


def _with(layer: torch.nn.Module) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), layer, torch.nn.Flatten(), torch.nn.LazyLinear(5))


NONDETERMINISTIC_LAYERS = {
    "adaptive avg pool to 2x2": torch.nn.AdaptiveAvgPool2d(2),
    "adaptive max pool": torch.nn.AdaptiveMaxPool2d(1),
    "reflection pad": torch.nn.ReflectionPad2d(1),
    "bilinear upsampling": torch.nn.Upsample(scale_factor=2, mode="bilinear"),
}


@pytest.mark.parametrize("name", NONDETERMINISTIC_LAYERS)
def test_deterministic_on_cuda_fails_before_training_for_a_layer_without_a_deterministic_kernel(name):
    net = _with(NONDETERMINISTIC_LAYERS[name])
    assert _backward_ops(net, (3, 8, 8)) & NO_DETERMINISTIC_CUDA  # torch would raise at the first backward
    with pytest.raises(ConfigError) as e:
        numerics.check_deterministic(net, torch.device("cuda"))
    line = str(e.value)
    assert "\n" not in line and line.startswith("invalid config: hardware.deterministic=True — the model's 1 (")
    assert "hardware.deterministic=false" in line
    numerics.check_deterministic(net, torch.device("cpu"))  # CPU kernels are deterministic


@pytest.mark.parametrize(
    "model,shape",
    [("resnet32", (3, 32, 32)), ("resnet50", (3, 32, 32)), ("tiny_cnn", (1, 8, 8)), ("alexnet", (3, 32, 32))],
)
def test_fedbench_models_train_deterministically_on_cuda(model, shape):
    """ResNet-32/50 end in AdaptiveAvgPool2d(1), which torch computes as a mean (deterministic backward): they pass
    the check, and their backward holds no op that strict determinism refuses on CUDA."""
    from fedbench.models import build_model

    cfg = make_cfg(f"model={model}").model
    net = build_model(cfg, shape, 10)
    numerics.check_deterministic(net, torch.device("cuda"))
    assert not _backward_ops(net, shape) & NO_DETERMINISTIC_CUDA


def test_a_run_checks_its_model_before_moving_it_to_the_device(tmp_path, monkeypatch, restore_numerics):
    """build.model: with hardware.deterministic=true the check runs on the built model before anything else."""
    from fedbench import build
    from fedbench.models import MODELS
    from fedbench.models.base import SplitNet

    def reflect_net(input_shape, num_classes, **_):
        body = torch.nn.Sequential(
            torch.nn.ReflectionPad2d(1), torch.nn.Conv2d(input_shape[0], 4, 3), torch.nn.Flatten()
        )
        head = torch.nn.Sequential(torch.nn.Linear(4 * input_shape[1] * input_shape[2], num_classes))
        return SplitNet(body, head, "head.0")

    monkeypatch.setitem(MODELS, "reflect_net", reflect_net)
    run = _setup(tmp_path, "model=mlp", "model.name=reflect_net", "hardware.deterministic=true")  # CPU: fine
    with pytest.raises(ConfigError, match=r"hardware.deterministic=True — the model's body.0 \(ReflectionPad2d\)"):
        build.model(run.cfg, run.data, torch.device("cuda"), torch.float32)
