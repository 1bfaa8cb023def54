"""A run's numerics on its device, set explicitly (``hardware.tf32``, ``hardware.deterministic``).

* TF32: off by default, so an fp32 run on a GPU computes what fp32 means on the CPU (and the two executors agree to
  fp32 round-off); ``hardware.tf32=true`` lets matmuls and convolutions use TF32 tensor cores (faster on Ampere and
  later, ~1e-3 relative error per product). torch's own defaults differ (convolutions TF32, matmuls not).
* ``hardware.deterministic=true``: ``torch.use_deterministic_algorithms(True)`` (strict: an op without a deterministic
  implementation raises), cuDNN deterministic and not benchmarking, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS's
  requirement for reproducible matmuls; it must be set before the first cuBLAS call of the process, which setup
  does). Otherwise cuDNN benchmarks its convolution algorithms (faster; the choice may vary run to run on a GPU).
"""

from __future__ import annotations

import os

import torch


def set_tf32(on: bool) -> None:
    """TF32 for fp32 matmuls and cuDNN convolutions, both on or both off."""
    mode = "tf32" if on else "ieee"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
    else:
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def tf32_flags() -> dict:
    """The TF32 settings torch uses now (printed by scripts/gpu_check.sh and scripts/bench.py)."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        return {
            "matmul": torch.backends.cuda.matmul.fp32_precision,
            "cudnn_conv": torch.backends.cudnn.conv.fp32_precision,
        }
    return {
        "matmul": "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee",
        "cudnn_conv": "tf32" if torch.backends.cudnn.allow_tf32 else "ieee",
    }


def configure(tf32: bool, deterministic: bool, device: torch.device) -> None:
    """Apply ``hardware.tf32`` and ``hardware.deterministic`` (called by Run.setup before any model exists)."""
    set_tf32(bool(tf32))
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(bool(deterministic))
    torch.backends.cudnn.deterministic = bool(deterministic)
    torch.backends.cudnn.benchmark = not deterministic and device.type == "cuda"


__all__ = ["configure", "set_tf32", "tf32_flags"]
