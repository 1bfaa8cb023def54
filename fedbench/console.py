"""What a run says while it runs, and the plain record of it in its run dir.

* On a terminal: a start header, a live ``rich`` progress bar over the rounds, and at the end a summary table and the
  end lines (run dir, wall time, best/final).
* Redirected (``nohup``, SLURM, CI: stdout is not a terminal): the same header, then one plain line per evaluated
  round (``round t/T``, accuracy, loss, elapsed, ETA), printed whole and flushed at once, then the end lines.
* Always (also with ``logger.console=false``): the same lines appended to ``<run dir>/run.log``, and at the end of the
  run (complete, failed or preempted) the per-round table ``metrics.csv`` and the curves ``curves.png``, rebuilt from
  ``metrics.jsonl`` (one row per round, as that file holds them after a resume).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from . import files
from .engine.numerics import bf16_hardware

LOG_NAME = "run.log"
ROUND_METRICS = ("pers/acc", "global/acc", "train/loss")  # what a round's line shows, when the round has them
HEADLINE = ("pers/acc", "global/acc")  # best/final of these at the end
LABELS = {
    "pers/acc": "personalized (pers/acc)",
    "global/acc": "global model (global/acc)",
    "train/loss": "local training (train/loss)",
}


def clock(seconds: float) -> str:
    """``12.3s`` under a minute, else ``h:mm:ss``."""
    if seconds < 59.95:
        return f"{max(seconds, 0):.1f}s"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def evaluated(metrics: dict) -> bool:
    return any(metrics.get(k) is not None for k in HEADLINE)


def round_line(t: int, rounds: int, metrics: dict, elapsed: float, eta: float | None) -> str:
    """``round 3/20  pers/acc 0.8123  train/loss 0.4123  elapsed 0:00:12  eta 0:01:05``."""
    shown = [f"{k} {float(metrics[k]):.4f}" for k in ROUND_METRICS if isinstance(metrics.get(k), (int, float))]
    return "  ".join(
        [f"round {t}/{rounds}", *shown, f"elapsed {clock(elapsed)}", f"eta {clock(eta) if eta is not None else '-'}"]
    )


def header_lines(run, start_round: int) -> list[str]:
    """Where the run is and what it runs (printed before round 0, or before the first round of a resumed run)."""
    from hydra.core.hydra_config import HydraConfig

    cfg = run.cfg
    executor = type(run.executor).__name__.removesuffix("Executor").lower()
    chosen = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    model = chosen.get("model") or cfg.model.name  # the option given (model=tiny_cnn), not its builder's name (cnn)
    what = (
        f"{cfg.algorithm.name} on {cfg.dataset.name}, partition {cfg.partition.name}, model {model}, "
        f"seed {cfg.seed}, {cfg.rounds} round{'s' * (int(cfg.rounds) != 1)}, {cfg.clients} clients"
    )
    lines = [
        f"fedbench: run dir {run.run_dir}",
        f"fedbench: {what}",
        f"fedbench: device {run.device}, executor {executor}, precision {cfg.hardware.precision}"
        + (
            f" (no bf16 hardware on this {'CPU (AMX, AVX512-BF16)' if run.device.type == 'cpu' else 'GPU'}: "
            "bf16 autocast is slower than fp32 here)"
            if cfg.hardware.precision == "bf16" and bf16_hardware(run.device) is False
            else ""
        )
        + (
            f"; {run.world.size} processes ({run.world.backend}): clients split, rank 0 writes"
            if run.world.size > 1
            else ""
        ),
    ]
    if OmegaConf.select(cfg, "eval.protocol", default=None) is not None:
        from .protocol import line

        lines.append(f"fedbench: protocol: {line(cfg)}")
    if start_round:
        lines.append(f"fedbench: resumed after round {start_round}")
    return lines


def end_lines(run_dir: Path, summary: dict, rounds: int, wall: float) -> list[str]:
    """How it ended, the wall time of this session's ``rounds`` (with their evaluations; setup excluded), best/final of
    the headline accuracies, the run dir."""
    parts = []
    for k in HEADLINE:
        s = summary.get("metrics", {}).get(k)
        if s:
            parts.append(
                f"{k} best {s['best']:.4f} (round {s['best_round']}), last {s['last']:.4f}, "
                f"final {s['final']:.4f} (mean of the last {s['final_n']} evaluation{'s' * (s['final_n'] != 1)} after "
                "round 0, eval.final_window)"
            )
    return [
        f"fedbench: {summary.get('status', 'done')}, {rounds} round{'s' * (rounds != 1)} in {clock(wall)}; "
        + ("; ".join(parts) or "no accuracy recorded"),
        f"fedbench: run dir {run_dir}",
    ]


class ConsoleSink:
    """The run's console output and ``run.log`` (see the module docstring); a sink of :class:`fedbench.loggers.Loggers`.

    ``console`` is the ``rich`` console while a live bar is shown, else None (algorithms print their notes with it)."""

    def __init__(self, cfg, run_dir: Path, title: str, start_round: int = 0):
        self.rounds = int(cfg.rounds)
        self.run_dir = Path(run_dir)
        self.start_round = start_round
        self.t0 = time.perf_counter()
        self.show = bool(cfg.logger.console)
        self.live = self.show and sys.stdout.isatty()
        self.log_file = None
        try:
            self.log_file = open(self.run_dir / LOG_NAME, "a", encoding="utf-8")
        except OSError:  # a run dir that cannot be written fails the run with its own line (metrics.jsonl, status.json)
            pass
        self.console = self.progress = None
        if self.live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.console = Console()
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self.task = self.progress.add_task(title, total=self.rounds, completed=start_round, stats="")

    def note(self, *lines: str) -> None:
        """Plain lines: run.log, and the console (above the live bar on a terminal)."""
        for line in lines:
            self._write(line)
            if self.live:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            elif self.show:
                print(line, flush=True)

    def header(self, *lines: str) -> None:
        """The start header; elapsed and ETA count from here (W&B's start excluded)."""
        self.note(*lines)
        self.t0 = time.perf_counter()

    def _write(self, line: str) -> None:
        if self.log_file is not None:
            try:
                self.log_file.write(line + "\n")
                self.log_file.flush()
            except OSError:
                pass  # the run's record is metrics.jsonl (whose write failure fails the run); the log is a copy

    def log(self, step: int, metrics: dict) -> None:
        if self.live and not self.progress.live.is_started:
            self.progress.start()
        if evaluated(metrics):
            elapsed = time.perf_counter() - self.t0
            done = step - self.start_round
            eta = elapsed / done * (self.rounds - step) if done > 0 else None
            line = round_line(step, self.rounds, metrics, elapsed, eta)
            self._write(line)
            if self.show and not self.live:
                print(line, flush=True)
        if self.live:
            stats = "  ".join(
                f"{k}={float(metrics[k]):.4f}" for k in ROUND_METRICS if isinstance(metrics.get(k), (int, float))
            )
            self.progress.update(self.task, completed=step, **({"stats": stats} if stats else {}))

    def image(self, key, path, step) -> None:
        pass

    def summary(self, summary: dict) -> None:
        if self.live:
            from rich.table import Table

            self.progress.stop()
            table = Table(title="fedbench summary")
            table.add_column("metric")
            for col in ("best", "final", "last"):
                table.add_column(col, justify="right")
            for name, s in summary.get("metrics", {}).items():
                table.add_row(
                    name,
                    *(f"{s[c]:.4f}" if isinstance(s.get(c), (int, float)) else "-" for c in ("best", "final", "last")),
                )
            self.console.print(table)
        self.note(*end_lines(self.run_dir, summary, self.rounds - self.start_round, time.perf_counter() - self.t0))

    def finish(self, status: str) -> None:
        if self.live:
            self.progress.stop()
        try:
            round_table(self.run_dir)
        except (
            Exception
        ) as e:  # a convenience: the run's record is metrics.jsonl (a failed run's one line is its error)
            if status == "complete":
                print(
                    f"fedbench: could not write metrics.csv / curves.png in {self.run_dir}: {type(e).__name__}: {e}",
                    file=sys.stderr,
                )
        if self.log_file is not None:
            try:
                self.log_file.close()
            except OSError:
                pass


def read_rounds(path: Path) -> list[dict]:
    """The rows of ``metrics.jsonl``, one per round (a round logged twice: its last row), by round."""
    rows: dict[int, dict] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("round"), int):
            rows[row["round"]] = {**rows.get(row["round"], {}), **row}
    return [rows[t] for t in sorted(rows)]


def round_table(run_dir: Path) -> None:
    """``metrics.csv`` (one row per round, one column per scalar metric) and ``curves.png`` from ``metrics.jsonl``."""
    run_dir = Path(run_dir)
    rows = read_rounds(run_dir / "metrics.jsonl")
    if not rows:
        return
    columns: list[str] = []
    for row in rows:
        columns += [
            k
            for k, v in row.items()
            if k not in columns and not k.startswith("image/") and (v is None or isinstance(v, (int, float)))
        ]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow(["" if not isinstance(row.get(k), (int, float)) else row[k] for k in columns])
    with files.atomic(run_dir / "metrics.csv") as f:
        f.write(buf.getvalue())
    curves(rows, run_dir / "curves.png", run_title(run_dir))


def run_title(run_dir: Path) -> str:
    """``fedavg on digits, seed 0 (<run dir name>)`` from the run's config.yaml (the dir's name alone without it)."""
    import yaml

    try:
        cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}
        what = f"{cfg['algorithm']['name']} on {cfg['dataset']['name']}, seed {cfg['seed']} "
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        what = ""
    return f"{what}({Path(run_dir).name})" if what else Path(run_dir).name


def curves(rows: list[dict], path: Path, title: str | None = None) -> Path | None:
    """``curves.png``: :func:`curves_figure`, saved."""
    from .plots import off, save

    return None if off() else save(curves_figure(rows, title), path)


def curves_figure(rows: list[dict], title: str | None = None):
    """Accuracy in % (left) and training loss (right) against the round, the run named in the title."""
    from .plots import figure, integer_ticks

    fig, (acc, loss) = figure(ncols=2, width=5.2)
    if title:
        fig.suptitle(title)
    first, last = rows[0]["round"], rows[-1]["round"]
    for ax, keys, label in ((acc, HEADLINE, "accuracy (%)"), (loss, ("train/loss",), "training loss")):
        scale = 100.0 if ax is acc else 1.0
        for k in keys:
            pts = [
                (r["round"], scale * r[k]) for r in rows if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])
            ]
            if pts:
                ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, markersize=3, label=LABELS[k])
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.set_xlim(first - max(0.5, (last - first) / 40), last + max(0.5, (last - first) / 40))  # all rounds
        integer_ticks(ax)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    return fig
