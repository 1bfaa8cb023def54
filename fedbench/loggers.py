"""One interface, several sinks: the console and ``run.log`` (fedbench.console), ``metrics.jsonl`` in the run dir,
Weights & Biases.

Algorithms publish metrics and pictures by name through :class:`Loggers`; none talks to wandb directly.
``metrics.jsonl`` is the run's record; W&B is a mirror: a W&B failure at init or during the run (no network, a bad
key, its service dying) warns once on stderr and the run goes on with the local logs, never failing or hanging.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from .console import ConsoleSink
from .errors import WriteFailed

_WANDB_DOWN: str | None = None   # why W&B online could not start earlier in this process (a sweep's later jobs skip it)


def _warn(msg: str) -> None:
    print(f"fedbench: {msg}", file=sys.stderr, flush=True)


def _reason(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:300]


def _jsonable(v):
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class JsonlSink:
    """Every round's metrics as one JSON line (``metrics.jsonl``), appended and flushed."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        try:
            self.f = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise WriteFailed(self.path, e) from None

    def log(self, step: int, metrics: dict) -> None:
        try:   # a line cut by a full disk or a kill is dropped on resume (fedbench.run)
            self.f.write(json.dumps({"round": step, **{k: _jsonable(v) for k, v in metrics.items()}}) + "\n")
            self.f.flush()
        except OSError as e:
            raise WriteFailed(self.path, e) from None

    def image(self, key: str, path: Path, step: int) -> None:
        self.log(step, {f"image/{key}": str(path)})

    def summary(self, summary: dict) -> None:
        pass

    def finish(self, status: str) -> None:
        try:
            self.f.close()
        except OSError:   # already reported by log()
            pass


def wandb_mode(requested: str) -> str:
    """``auto``: what W&B's own environment says first (``WANDB_DISABLED``, ``WANDB_MODE``), else online when an API
    key is configured, otherwise offline. An explicit online/offline/disabled is used as given."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_DISABLED", "").strip().lower() in ("1", "true", "yes"):
        return "disabled"
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    env = {"dryrun": "offline", "run": "online"}.get(env, env)
    if env in ("online", "offline", "disabled"):
        return env
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


class WandbSink:
    """The real ``wandb`` library: config, per-round history, summary, images; resumable by run id."""

    def __init__(self, cfg, run_dir: Path, config: dict, run_id: str | None, group: str | None, name: str, mode: str):
        import wandb

        self.wandb = wandb
        wcfg = cfg.logger.wandb
        self.mode = mode
        timeout = wcfg.get("init_timeout")   # null: W&B's own (WANDB_INIT_TIMEOUT or 90 s)
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True,
                                  **({"init_timeout": float(timeout)} if timeout is not None else {}))
        self.run = wandb.init(project=wcfg.project, entity=wcfg.entity, group=group, name=name, tags=list(wcfg.tags or []),
                              dir=str(run_dir), mode=self.mode, config=config, id=run_id, resume="allow" if run_id else None,
                              reinit="finish_previous", settings=settings)
        self.id = self.run.id

    def log(self, step: int, metrics: dict) -> None:
        self.run.log({k: _jsonable(v) for k, v in metrics.items() if _jsonable(v) is not None}, step=step)

    def image(self, key: str, path: Path, step: int) -> None:
        self.run.log({key: self.wandb.Image(str(path))}, step=step)

    def table(self, key: str, columns: list[str], rows: list[list]) -> None:
        self.run.log({key: self.wandb.Table(columns=columns, data=rows)})

    def summary(self, summary: dict) -> None:
        for name, s in summary.get("metrics", {}).items():
            for stat, v in s.items():
                if isinstance(v, (int, float)):
                    self.run.summary[f"{name}/{stat}"] = v
        self.run.summary["status"] = summary.get("status")

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "complete" else 1)

    def abandon(self) -> None:
        """After a failure: stop the W&B service quietly (else its exit hook prints a traceback at exit)."""
        try:
            self.wandb.teardown()
        except (Exception, SystemExit):
            pass


class Loggers:
    """Fan-out to the configured sinks. A W&B failure drops the W&B sink with one warning (``wandb_state`` says
    why, ``on_wandb_state`` hears of it); a failure of the local sinks fails the run."""

    def __init__(self, sinks: list, wandb_state: str = "disabled", on_wandb_state=None):
        self.sinks = sinks
        self.wandb_state = wandb_state
        self.on_wandb_state = on_wandb_state

    def _each(self, method: str, *args) -> None:
        for s in list(self.sinks):
            try:
                getattr(s, method)(*args)
            except Exception as e:
                if not isinstance(s, WandbSink):
                    raise
                self.sinks.remove(s)
                s.abandon()
                self.wandb_state = f"failed: {_reason(e)}"
                _warn(f"W&B failed during the run ({_reason(e)}); continuing with the local logs "
                      "(metrics.jsonl, summary.json)")
                if self.on_wandb_state:
                    self.on_wandb_state(self.wandb_state)

    def log(self, step: int, metrics: dict) -> None:
        self._each("log", step, metrics)

    def image(self, key: str, path: Path, step: int) -> None:
        self._each("image", key, path, step)

    def summary(self, summary: dict) -> None:
        self._each("summary", summary)

    def finish(self, status: str) -> None:
        self._each("finish", status)

    def header(self, *lines: str) -> None:
        """The run's start header, for the console and run.log; the rounds' clock (elapsed, ETA) starts now."""
        for s in self.sinks:
            if isinstance(s, ConsoleSink):
                s.header(*lines)

    @property
    def wandb_id(self) -> str | None:
        return next((s.id for s in self.sinks if isinstance(s, WandbSink)), None)


def _wandb_sink(cfg, run_dir: Path, wandb_id: str | None, group: str | None, title: str):
    """(the W&B sink or None, what became of W&B: its mode, or ``failed: <why>``)."""
    global _WANDB_DOWN
    mode = wandb_mode(cfg.logger.wandb.mode)
    if mode == "disabled":
        return None, "disabled"
    if mode == "online" and _WANDB_DOWN:
        _warn(f"W&B skipped: it could not start earlier in this process ({_WANDB_DOWN}); continuing with the local logs")
        return None, f"failed: {_WANDB_DOWN}"
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
        return WandbSink(cfg, run_dir, config, wandb_id, cfg.logger.wandb.group or group, title, mode), mode
    except Exception as e:
        try:
            import wandb

            wandb.teardown()
        except (Exception, SystemExit):
            pass
        if mode == "online":
            _WANDB_DOWN = _reason(e)
        _warn(f"W&B could not start ({_reason(e)}); continuing with the local logs (metrics.jsonl, summary.json); "
              "logger.wandb.mode=offline keeps W&B files for a later `wandb sync`")
        return None, f"failed: {_reason(e)}"


def build_loggers(cfg, run_dir: Path, title: str, start_round: int = 0, wandb_id: str | None = None,
                  group: str | None = None, on_wandb_state=None) -> Loggers:
    lc = cfg.logger
    sinks: list = []
    if lc.jsonl:
        sinks.append(JsonlSink(run_dir))
    sinks.append(ConsoleSink(cfg, run_dir, title, start_round))   # run.log always; the console if logger.console
    wb, state = _wandb_sink(cfg, run_dir, wandb_id, group, title)
    if wb is not None:
        sinks.append(wb)
    return Loggers(sinks, state, on_wandb_state)
