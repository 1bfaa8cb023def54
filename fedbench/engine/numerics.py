"""A run's numerics on its device, set explicitly (``hardware.tf32``, ``hardware.deterministic``).

* TF32: off by default, so an fp32 run on a GPU computes what fp32 means on the CPU (and the two executors agree to
  fp32 round-off); ``hardware.tf32=true`` lets matmuls, cuDNN convolutions and cuDNN RNNs use TF32 tensor cores
  (faster on Ampere and later, ~1e-3 relative error per product). torch's own defaults differ (cuDNN TF32, matmuls
  not). torch >= 2.9 has a per-backend ``fp32_precision`` API and raises RuntimeError when a legacy flag
  (``torch.backends.cudnn.allow_tf32``, ``torch.backends.cuda.matmul.allow_tf32``,
  ``torch.get_float32_matmul_precision()``) is read after the new one was set — so where the new API exists
  fedbench sets and reads only it (torch docs, "TensorFloat-32 (TF32) on Ampere (and later) devices"); older torch
  gets the legacy flags.
* ``hardware.deterministic=true``: ``torch.use_deterministic_algorithms(True)`` (strict: an op without a deterministic
  implementation raises), cuDNN deterministic and not benchmarking, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS's
  requirement for reproducible matmuls; it must be set before the first cuBLAS call of the process, which setup
  does). A model with a layer whose CUDA backward has no deterministic kernel fails before training
  (:func:`check_deterministic`). Otherwise cuDNN benchmarks its convolution algorithms on a GPU (faster; the choice
  may vary run to run).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..errors import ConfigError


def _precision_knobs() -> dict:
    """name -> the torch object whose ``fp32_precision`` sets that backend's TF32 use (torch >= 2.9; {} before)."""
    knobs = {
        "matmul": torch.backends.cuda.matmul,
        "cudnn_conv": getattr(torch.backends.cudnn, "conv", None),
        "cudnn_rnn": getattr(torch.backends.cudnn, "rnn", None),  # a module before 2.9, without the attribute
    }
    return {k: v for k, v in knobs.items() if hasattr(v, "fp32_precision")}


def set_tf32(on: bool) -> None:
    """TF32 for fp32 matmuls, cuDNN convolutions and cuDNN RNNs: all on or all off."""
    knobs = _precision_knobs()
    if knobs:  # only the new API: a legacy write would make torch's later reads raise
        for knob in knobs.values():
            knob.fp32_precision = "tf32" if on else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on  # legacy: one flag for cuDNN convolutions and RNNs


def tf32_flags() -> dict:
    """The TF32 settings torch uses now, ``tf32`` or ``ieee`` per backend (printed by scripts/gpu_check.sh and
    scripts/bench.py); reads no legacy flag where the new API exists."""
    knobs = _precision_knobs()
    if knobs:
        return {k: v.fp32_precision for k, v in knobs.items()}
    cudnn = "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"
    return {
        "matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
        "cudnn_conv": cudnn,
        "cudnn_rnn": cudnn,
    }


def configure(tf32: bool, deterministic: bool, device: torch.device) -> None:
    """Apply ``hardware.tf32`` and ``hardware.deterministic`` (called by Run.setup before any model exists)."""
    set_tf32(bool(tf32))
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if torch.are_deterministic_algorithms_enabled() != bool(deterministic):  # (the call imports torch._inductor:
        torch.use_deterministic_algorithms(bool(deterministic))  # ~2 s per process; torch's default is off)
    torch.backends.cudnn.deterministic = bool(deterministic)
    torch.backends.cudnn.benchmark = not deterministic and device.type == "cuda"


_INTERPOLATING = ("linear", "bilinear", "bicubic", "trilinear")


def _no_deterministic_cuda_backward(m: nn.Module) -> bool:
    """A layer whose backward on CUDA raises under ``torch.use_deterministic_algorithms(True)`` (the list in that
    function's docstring, torch 2.9-2.14, for layers a model can hold). ``AdaptiveAvgPool2d/3d`` to an output of 1
    (ResNets' global pooling) is computed by torch as a ``mean``, whose backward is deterministic: not listed."""
    if isinstance(m, (nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)):
        size = m.output_size if isinstance(m.output_size, tuple) else (m.output_size,)
        return any(s != 1 for s in size)
    if isinstance(m, nn.Upsample):
        return m.mode in _INTERPOLATING
    if isinstance(m, nn.EmbeddingBag):
        return m.mode == "max"
    return isinstance(
        m,
        (
            nn.AvgPool3d,
            nn.AdaptiveMaxPool2d,
            nn.FractionalMaxPool2d,
            nn.FractionalMaxPool3d,
            nn.MaxUnpool1d,
            nn.MaxUnpool2d,
            nn.MaxUnpool3d,
            nn.ReflectionPad1d,
            nn.ReflectionPad2d,
            nn.ReflectionPad3d,
            nn.CTCLoss,
        ),
    )


def check_deterministic(net: nn.Module, device: torch.device) -> None:
    """``hardware.deterministic=true`` on CUDA: fail before training, naming the layers that torch's strict mode
    would stop at the first backward (no deterministic CUDA kernel). A researcher who asks for bitwise
    reproducibility should not get a run that silently is not (a warn-only fallback), nor one that dies after
    setup; CPU kernels are deterministic, so the CPU is always allowed."""
    if device.type != "cuda":
        return
    bad = [f"{name} ({type(m).__name__})" for name, m in net.named_modules() if _no_deterministic_cuda_backward(m)]
    if bad:
        raise ConfigError(
            "hardware.deterministic",
            True,
            f"the model's {', '.join(bad)} has no deterministic CUDA backward in torch; "
            "allowed on CUDA only with hardware.deterministic=false (or run it on the CPU: hardware=cpu)",
        )


__all__ = ["check_deterministic", "configure", "set_tf32", "tf32_flags"]


def bf16_hardware(device: torch.device, cpuinfo: str | None = None) -> bool | None:
    """Whether bf16 autocast has hardware behind it on ``device``: a CUDA GPU with bf16 support, or a CPU whose flags
    (Linux ``/proc/cpuinfo``, or ``cpuinfo`` given) include AMX (``amx_bf16``) or AVX512-BF16 (``avx512_bf16``);
    None where it cannot tell. Without them oneDNN emulates bf16 and autocast is slower than fp32 (measured 1.5x for
    FedCOM's LeNet and 2.2-2.4x for pfl-research's CNN on an Intel Xeon with AVX-512 but neither: README)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return None
    if cpuinfo is None:
        try:
            cpuinfo = open("/proc/cpuinfo").read()
        except OSError:
            return None
    flags = {f for ln in cpuinfo.splitlines() if ln.startswith("flags") for f in ln.split(":", 1)[-1].split()}
    return bool(flags & {"amx_bf16", "avx512_bf16"}) if flags else None
