"""Where a result was made: the fedbench checkout's commit and the machine (status.json, launches, run records)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def commit() -> str:
    """The fedbench checkout's commit (``-dirty`` when tracked files differ from it), or ``unknown``;
    ``$FEDBENCH_COMMIT`` when set: a copy of the tree whose ``.git`` is absent or not its own (the GPU image's copy,
    scripts/device_run.sh) says which commit it is."""
    if os.environ.get("FEDBENCH_COMMIT"):
        return os.environ["FEDBENCH_COMMIT"]
    repo = str(Path(__file__).resolve().parent.parent)
    try:
        sha = subprocess.run(
            ["git", "-C", repo, "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def machine() -> str:
    """``<CPU model> (<n> cores)``, plus the GPU when there is one."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    text = f"{cpu} ({os.cpu_count()} cores)"
    try:
        import torch

        if torch.cuda.is_available():
            text += f", {torch.cuda.get_device_name(0)}"
    except Exception:  # noqa: BLE001  (a description only)
        pass
    return text


__all__ = ["commit", "machine"]
