"""One interface, several sinks: the rich console, ``metrics.jsonl`` in the run dir, Weights & Biases.

Algorithms publish metrics and pictures by name through :class:`Loggers`; none talks to wandb directly.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from omegaconf import OmegaConf


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
        self.f = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict) -> None:
        self.f.write(json.dumps({"round": step, **{k: _jsonable(v) for k, v in metrics.items()}}) + "\n")
        self.f.flush()

    def image(self, key: str, path: Path, step: int) -> None:
        self.log(step, {f"image/{key}": str(path)})

    def summary(self, summary: dict) -> None:
        pass

    def finish(self, status: str) -> None:
        self.f.close()


class ConsoleSink:
    """A rich progress bar over rounds with live accuracy/loss, and a summary table at the end."""

    def __init__(self, total_rounds: int, title: str, start_round: int = 0):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=self.console, transient=False)
        self.task = self.progress.add_task(title, total=total_rounds, completed=start_round, stats="")
        self.progress.start()

    def log(self, step: int, metrics: dict) -> None:
        shown = [(k, metrics[k]) for k in ("pers/acc", "global/acc", "train/loss") if k in metrics and metrics[k] is not None]
        stats = "  ".join(f"{k}={float(v):.4f}" for k, v in shown)
        self.progress.update(self.task, completed=step, **({"stats": stats} if stats else {}))

    def image(self, key, path, step) -> None:
        pass

    def summary(self, summary: dict) -> None:
        from rich.table import Table

        self.progress.stop()
        table = Table(title="fedbench summary")
        table.add_column("metric")
        for col in ("best", "final", "last"):
            table.add_column(col, justify="right")
        for name, s in summary.get("metrics", {}).items():
            table.add_row(name, *(f"{s[c]:.4f}" if isinstance(s.get(c), (int, float)) else "-" for c in ("best", "final", "last")))
        self.console.print(table)

    def finish(self, status: str) -> None:
        self.progress.stop()


def wandb_mode(requested: str) -> str:
    """``auto`` means online when an API key is configured, otherwise offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


class WandbSink:
    """The real ``wandb`` library: config, per-round history, summary, images; resumable by run id."""

    def __init__(self, cfg, run_dir: Path, config: dict, run_id: str | None, group: str | None, name: str):
        import wandb

        self.wandb = wandb
        wcfg = cfg.logger.wandb
        self.mode = wandb_mode(wcfg.mode)
        self.run = wandb.init(project=wcfg.project, entity=wcfg.entity, group=group, name=name, tags=list(wcfg.tags or []),
                              dir=str(run_dir), mode=self.mode, config=config, id=run_id, resume="allow" if run_id else None,
                              reinit="finish_previous",
                              settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
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


class Loggers:
    """Fan-out to the configured sinks."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, step: int, metrics: dict) -> None:
        for s in self.sinks:
            s.log(step, metrics)

    def image(self, key: str, path: Path, step: int) -> None:
        for s in self.sinks:
            s.image(key, path, step)

    def summary(self, summary: dict) -> None:
        for s in self.sinks:
            s.summary(summary)

    def finish(self, status: str) -> None:
        for s in self.sinks:
            s.finish(status)

    @property
    def wandb_id(self) -> str | None:
        return next((s.id for s in self.sinks if isinstance(s, WandbSink)), None)


def build_loggers(cfg, run_dir: Path, title: str, start_round: int = 0, wandb_id: str | None = None,
                  group: str | None = None) -> Loggers:
    lc = cfg.logger
    sinks: list = []
    if lc.jsonl:
        sinks.append(JsonlSink(run_dir))
    if lc.console:
        sinks.append(ConsoleSink(cfg.rounds, title, start_round))
    if lc.wandb.mode != "disabled":
        config = OmegaConf.to_container(cfg, resolve=True)
        sinks.append(WandbSink(cfg, run_dir, config, wandb_id, lc.wandb.group or group, title))
    return Loggers(sinks)
