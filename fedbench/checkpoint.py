"""Checkpoints: the full state of a run, written atomically, loaded without executing code.

A checkpoint holds everything a run needs to continue exactly: the algorithm state (all client
and server stacks, optimizer states), the round counter, the metrics so far (and every line of
``metrics.jsonl`` up to its round, which a resume writes back: fedbench/rundir.py), the W&B run id
and a fingerprint of the config. Randomness needs no state: every draw is keyed by (seed, purpose,
round, client) (fedbench.seeding). Files: ``checkpoints/round_<t>.pt`` plus ``.sha256``; written
to a temporary file, fsynced, then renamed; loaded with ``torch.load(weights_only=True)``; a
file whose checksum does not match is skipped in favour of the previous one.

Once a run is complete its checkpoints are deleted (``checkpoint.keep_complete`` keeps the newest N): a complete run is
never resumed, and what it trained is kept, compact, in ``model.pt`` (:func:`save_final`, :func:`load_final`).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from .callbacks import Callback
from .errors import ConfigError, WriteFailed
from .files import atomic

# keys that do not change a run's results (so changing them still resumes the same run)
NEUTRAL = ("hydra", "resume", "logger", "checkpoint", "cache_dir", "data_root")


# How a run is made, not what it computes: the same metrics with any threads or number of processes (tests/
# test_distributed.py), so a run resumes or is skipped whatever they are now.
NEUTRAL_HARDWARE = ("threads", "distributed", "distributed_timeout")


def fingerprint(cfg, counted: tuple = ()) -> str:
    """A hash of the config but its results-neutral keys (``counted``: hardware keys of ``NEUTRAL_HARDWARE`` to hash
    all the same, see :func:`fingerprints`)."""
    d = OmegaConf.to_container(cfg, resolve=True)
    for k in NEUTRAL:
        d.pop(k, None)
    d.get("dataset", {}).pop("root", None)
    for k in NEUTRAL_HARDWARE:
        if k not in counted:
            d.get("hardware", {}).pop(k, None)
    d.get("eval", {}).pop("protocol", None)  # what a table reports of the run, not what it computes (docs/protocol.md)
    if (d.get("partition") or {}).get("samples_per_client", 0) is None:  # added by #53; null = the runs made before it
        d["partition"].pop("samples_per_client")  # (so they resume and are skipped as before)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprints(cfg) -> tuple[str, str]:
    """The fingerprints a run dir of this config may record: :func:`fingerprint`, and the one fedbench recorded from
    commit ee065f2 (hardware.distributed added) to 0f18d28, which hashed hardware.distributed and its timeout too —
    so the runs made then resume or are skipped as well as those made before and after."""
    return fingerprint(cfg), fingerprint(cfg, counted=("distributed", "distributed_timeout"))


def _pack(o):
    """Make ``o`` loadable with ``weights_only=True``: numpy -> tensors, tuples marked."""
    if isinstance(o, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(o))}
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, tuple):
        return {"__tuple__": [_pack(v) for v in o]}
    if isinstance(o, list):
        return [_pack(v) for v in o]
    if isinstance(o, dict):
        return {k: _pack(v) for k, v in o.items()}
    if torch.is_tensor(o):
        return o.detach().cpu()
    return o


def unpack(o, device):
    """A saved state (:func:`_pack`'s) on ``device``."""
    if isinstance(o, dict):
        if set(o) == {"__ndarray__"}:
            return o["__ndarray__"].numpy()
        if set(o) == {"__tuple__"}:
            return tuple(unpack(v, device) for v in o["__tuple__"])
        return {k: unpack(v, device) for k, v in o.items()}
    if isinstance(o, list):
        return [unpack(v, device) for v in o]
    if torch.is_tensor(o):
        return o.to(device)
    return o


def _serialized(obj) -> memoryview:
    """``torch.save`` into memory: the file write that follows then fails as an OSError naming the file (torch's own
    file writer says only "enforce fail at inline_container.cc" on a full disk or past ``ulimit -f``)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getbuffer()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def directory(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: Path, t: int, state: dict, keep: int = 2) -> Path:
    """Write ``state`` for round ``t`` atomically; keep the newest ``keep`` checkpoints.

    A failed write (disk full, quota, ...) leaves no temporary file and no half checkpoint; the older checkpoints are
    only removed after the new one is complete. It raises :class:`~fedbench.errors.WriteFailed` (path and cause)."""
    d = directory(run_dir)
    path = d / f"round_{t:06d}.pt"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteFailed(d, e) from None
    data = _serialized(_pack({"round": t, **state}))
    with atomic(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        with atomic(path.with_suffix(".sha256")) as side:  # before the checkpoint appears (it is never loaded without)
            side.write(_sha256(Path(f.name)))
    for old in sorted(d.glob("round_*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
        old.with_suffix(".sha256").unlink(missing_ok=True)
    return path


FINAL = "model.pt"


def save_final(run_dir: Path, t: int, algorithm, fingerprint: str) -> Path:
    """The final model in ``<run dir>/model.pt``, atomically (read it with :func:`load_final`):

    ``global``: (params, buffers) of the algorithm's global model (``Algorithm.global_model``; None if it has none);
    ``state``: the algorithm's state as a checkpoint stores it (``Algorithm.state_dict``: every client and server stack,
    personalized weights included) without the per-client optimizer state, the bulk of a checkpoint — so
    ``algorithm.load_state_dict(state)`` after ``Run(cfg, dir).setup()`` with the run's config gives back the final
    global and personalized models; plus ``round``, ``algorithm`` (its name) and ``config_fingerprint``."""
    state = {k: v for k, v in algorithm.state_dict().items() if k != "opt_state"}
    path = Path(run_dir) / FINAL
    data = _serialized(
        _pack(
            {
                "round": t,
                "algorithm": algorithm.name,
                "config_fingerprint": fingerprint,
                "global": algorithm.global_model(),
                "state": state,
            }
        )
    )
    with atomic(path, "wb") as f:
        f.write(data)
    return path


def load_final(run_dir: Path, device="cpu") -> dict:
    """``model.pt`` of a complete run (see :func:`save_final`), loaded without executing code."""
    return unpack(torch.load(Path(run_dir) / FINAL, map_location="cpu", weights_only=True), device)


def prune(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (a complete run: ``checkpoint.keep_complete``); the checkpoints
    directory goes when it is empty."""
    d = directory(run_dir)
    saved = sorted(d.glob("round_*.pt"))
    for old in saved[: max(len(saved) - keep, 0)]:
        old.unlink(missing_ok=True)
        old.with_suffix(".sha256").unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:  # not empty (kept checkpoints) or absent
        pass


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr)


def load_latest(run_dir: Path, device, warn=_warn) -> dict | None:
    """The newest intact checkpoint (checksum verified), falling back to older ones; None if none."""
    saved = read_latest(run_dir, warn)
    return None if saved is None else unpack(saved, device)


def read_latest(run_dir: Path, warn=_warn) -> dict | None:
    """:func:`load_latest` in host memory, as saved (:func:`unpack` puts it on a device)."""
    for path in sorted(directory(run_dir).glob("round_*.pt"), reverse=True):
        side = path.with_suffix(".sha256")
        if not side.exists() or side.read_text().strip() != _sha256(path):
            warn(
                f"fedbench: checkpoint {path.name} is corrupted or incomplete (checksum mismatch); "
                "trying the previous one"
            )
            continue
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated file that happens to match is still rejected, never executed
            warn(f"fedbench: checkpoint {path.name} cannot be read ({type(e).__name__}); trying the previous one")
    return None


def host_copy(o):
    """A deep copy of ``o`` whose tensors are copied to the CPU."""
    if torch.is_tensor(o):
        return o.detach().to("cpu", copy=True)
    if isinstance(o, dict):
        return {k: host_copy(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)) and type(o) in (list, tuple):
        return type(o)(host_copy(v) for v in o)
    return copy.deepcopy(o)


class Checkpointer(Callback):
    """The state of a run (algorithm, metrics so far, round times, the evaluator's last result, the W&B run id, the
    divergence guard's reference loss, the config fingerprint, the monitors) and where it goes: a checkpoint every
    ``checkpoint.every`` rounds (the newest ``checkpoint.keep`` kept), a copy in host memory at every round boundary
    (``checkpoint.on_signal``: saved if a signal interrupts the next round), ``model.pt`` (``checkpoint.final_model``),
    and back (:meth:`restore`)."""

    def __init__(self, run):
        self.run = run
        self.boundary: dict | None = None  # {"round", "state"} of the last finished round, in host memory
        self.resumed, self.resumed_wandb_id = False, None  # from a checkpoint, and its W&B run id

    def monitors(self) -> dict:
        run = self.run
        return {
            n: m
            for n in ("forgetting", "new_clients")
            if (m := getattr(run, n, None)) is not None and hasattr(m, "state_dict")
        }

    def state(self) -> dict:
        run = self.run
        return {
            "algorithm": run.algorithm.state_dict(),
            "history": run.history,
            "times": run.times,
            "evaluator_last": run.evaluator.last,
            "wandb_id": run.loggers.wandb_id,
            "metrics_lines": run.loggers.jsonl_lines,  # metrics.jsonl as it is now (the resume rewrites it)
            "loss_reference": run.check_finite.reference,
            "config_fingerprint": fingerprint(run.cfg),
            "monitors": {n: m.state_dict() for n, m in self.monitors().items()},
        }

    def snapshot(self, t: int) -> dict:
        """A private copy of the state at a round boundary (saved if a signal interrupts the next round), in host
        memory: a GPU run keeps no second copy of its whole state on the device."""
        return {"round": t, "state": host_copy(self.state())}

    def restore(self, saved: dict) -> int:
        """Continue from the checkpoint ``saved`` (as read, or already on the run's device; its round is returned)."""
        run = self.run
        saved = unpack(saved, run.device)
        if saved.get("config_fingerprint") not in fingerprints(run.cfg):
            raise ConfigError(
                "resume",
                True,
                f"the checkpoint in {run.run_dir} was written by a different config; "
                "use another hydra.run.dir or resume=false",
            )
        run.algorithm.load_state_dict(saved["algorithm"])
        run.history, run.times = saved["history"], saved["times"]
        run.evaluator.last = saved["evaluator_last"]
        for n, m in self.monitors().items():
            m.load_state_dict(saved["monitors"].get(n, {}))
        run.check_finite.reference = saved.get("loss_reference")
        self.resumed, self.resumed_wandb_id = True, saved.get("wandb_id")
        t0 = int(saved["round"])
        run.rundir.restore_metrics(t0, saved.get("metrics_lines"))
        return t0

    def start_over(self) -> int:
        """No checkpoint: the run starts at round 0 (rows a killed earlier attempt logged are redone, not repeated)."""
        self.run.history, self.run.times = [], []
        self.run.rundir.trim_metrics(-1)
        return 0

    def on_start(self, run, t0: int) -> None:
        self.boundary = self.snapshot(t0) if run.cfg.checkpoint.on_signal else None

    def after_round(self, run, t: int, metrics: dict) -> None:
        c = run.cfg.checkpoint
        if c.every and t % int(c.every) == 0 and t < int(run.cfg.rounds):
            save(run.run_dir, t, self.state(), keep=int(c.keep))
        if c.on_signal:
            self.boundary = self.snapshot(t)

    def save_final(self) -> None:
        """model.pt: the final global and personalized weights (before summary.json: a complete run has its model)."""
        run = self.run
        if run.cfg.checkpoint.final_model:
            save_final(run.run_dir, int(run.cfg.rounds), run.algorithm, fingerprint(run.cfg))
