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

_WANDB_DOWN: str | None = None  # why W&B online could not start earlier in this process (a sweep's later jobs skip it)


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
    """Every round's metrics as one JSON line (``metrics.jsonl``), appended and flushed. ``lines``: every line of the
    file, those it held when the run (re)started — rewritten from the checkpoint it resumes from
    (:meth:`fedbench.rundir.RunDir.restore_metrics`), or none — and this session's: each checkpoint carries them, so
    that whatever a crash does to the file, a resumed run rewrites every row of the rounds it does not run again."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        try:
            self.lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True) if self.path.exists() else []
            self.f = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise WriteFailed(self.path, e) from None

    def log(self, step: int, metrics: dict) -> None:
        line = json.dumps({"round": step, **{k: _jsonable(v) for k, v in metrics.items()}}) + "\n"
        try:  # a line cut by a full disk or a kill is rewritten from the checkpoint on resume (fedbench.rundir)
            self.f.write(line)
            self.f.flush()
        except OSError as e:
            raise WriteFailed(self.path, e) from None
        self.lines.append(line)

    def image(self, key: str, path: Path, step: int) -> None:
        self.log(step, {f"image/{key}": str(path)})

    def summary(self, summary: dict) -> None:
        pass

    def finish(self, status: str) -> None:
        try:
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
        except OSError:  # already reported by log()
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

    def __init__(
        self,
        cfg,
        run_dir: Path,
        config: dict,
        run_id: str | None,
        group: str | None,
        name: str,
        mode: str,
        job_type: str = "run",
    ):
        import wandb

        self.wandb = wandb
        wcfg = cfg.logger.wandb
        self.mode = mode
        self.run = wandb.init(
            project=wcfg.project,
            entity=wcfg.entity,
            group=group,
            name=name,
            tags=wandb_tags(cfg),
            job_type=job_type,
            dir=str(run_dir),
            mode=self.mode,
            config=config,
            id=run_id,
            resume="allow" if run_id else None,
            reinit="finish_previous",
            settings=_settings(wandb, wcfg),
        )
        self.id = self.run.id
        env = os.environ.get("WANDB_MODE", "").strip().lower()
        self.why = (  # why it is offline (wandb_mode)
            "logger.wandb.mode=offline"
            if wcfg.mode == "offline"
            else f"WANDB_MODE={env}"
            if env in ("offline", "dryrun")
            else "no W&B login found: `wandb login` or WANDB_API_KEY"
        )

    def offline_note(self) -> str | None:
        """For an offline run, one line: that it is offline, why, and how to upload it later (issue #53: W&B's own
        line is silenced); None online."""
        if self.mode != "offline":
            return None
        where = Path(self.run.dir).parent  # <run dir>/wandb/offline-run-<time>-<id> (its files/ is run.dir)
        return f"fedbench: W&B offline ({self.why}); upload this run later with `wandb sync {where}`"

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
                _warn(
                    f"W&B failed during the run ({_reason(e)}); continuing with the local logs "
                    "(metrics.jsonl, summary.json)"
                )
                if self.on_wandb_state:
                    self.on_wandb_state(self.wandb_state)

    def log(self, step: int, metrics: dict) -> None:
        self._each("log", step, metrics)

    def image(self, key: str, path: Path | None, step: int) -> None:
        if path is not None:  # None: not drawn (logger.pictures=false, fedbench.plots.drawing)
            self._each("image", key, path, step)

    def summary(self, summary: dict) -> None:
        self._each("summary", summary)

    def finish(self, status: str) -> None:
        self._each("finish", status)

    def header(self, *lines: str) -> None:
        """The run's start header, for the console and run.log (with how to upload an offline W&B run); the rounds'
        clock (elapsed, ETA) starts now."""
        notes = [n for s in self.sinks if isinstance(s, WandbSink) and (n := s.offline_note())]
        for s in self.sinks:
            if isinstance(s, ConsoleSink):
                s.header(*lines, *notes)

    @property
    def wandb_id(self) -> str | None:
        return next((s.id for s in self.sinks if isinstance(s, WandbSink)), None)

    @property
    def jsonl_lines(self) -> list[str] | None:
        """The lines of metrics.jsonl so far (:class:`JsonlSink`), None without it."""
        return next((list(s.lines) for s in self.sinks if isinstance(s, JsonlSink)), None)


def _settings(wandb, wcfg):
    timeout = wcfg.get("init_timeout")  # null: W&B's own (WANDB_INIT_TIMEOUT or 90 s)
    return wandb.Settings(
        console="off",
        x_disable_stats=True,
        silent=True,
        **({"init_timeout": float(timeout)} if timeout is not None else {}),
    )


SWEPT = (
    "FEDBENCH_SWEPT"  # the keys the running multirun sweeps (set as it starts, fedbench.sweep; its workers inherit it)
)


def _hydra():
    """Hydra's config of this job, or None (a run through the compose API)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def swept_keys(config) -> list[str]:
    """The keys a multirun varies: the sweep params of its config (a paper table's ``hydra.sweeper.params``) and the
    command line's sweeps (``seed=0,1``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = [_key(str(k)) for k in (config.hydra.sweeper.get("params") or {})]
    try:
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    except Exception:  # Hydra reports a bad sweep itself
        parsed = []
    return keys + [_key(o.input_line) for o in parsed if o.is_sweep_override()]


def run_name(cfg, sweep: bool) -> str:
    """A W&B run's name: ``fedrema cifar10 delta=0.1 seed=2`` — the method, the dataset, the overrides that vary (a
    sweep's job: the keys the sweep varies; one run: the overrides given, but those that change no result), the seed."""
    hc = _hydra()
    given = list(hc.overrides.task) if hc is not None else []
    if sweep:
        varying = set(filter(None, os.environ.get(SWEPT, "").split(",")))
        varying |= {_key(str(k)) for k in ((hc.sweeper.get("params") if hc is not None else None) or {})}
    else:
        neutral = tuple(hc.job.config.override_dirname.exclude_keys) if hc is not None else ()  # change no result
        varying = {k for k in map(_key, given) if not (k in neutral or k.startswith(tuple(f"{n}." for n in neutral)))}
    shown = [
        o.lstrip("+~")
        for o in given
        if _key(o) in varying and _key(o) not in ("seed", "algorithm", "dataset", "experiment")
    ]  # experiment: in the tags
    shown = [
        o if "/" not in _key(o) else f"{_key(o).split('@')[0].rsplit('/', 1)[-1]}={o.split('=', 1)[1]}" for o in shown
    ]
    return " ".join([str(cfg.algorithm.name), str(cfg.dataset.name), *shown, f"seed={cfg.seed}"])


def wandb_tags(cfg, run: bool = True) -> list[str]:
    """``paper:<p>``, ``table:<id>`` (a paper table's ``table:`` node, else the experiment chosen), and for a run
    ``algorithm:<a>``, ``dataset:<d>``; then logger.wandb.tags."""
    hc = _hydra()
    exp = hc.runtime.choices.get("experiment") if hc is not None else None
    exp = exp.split("/", 1) if exp and "/" in exp else [None, None]
    tags = [
        f"paper:{OmegaConf.select(cfg, 'table.paper', default=None) or exp[0]}",
        f"table:{OmegaConf.select(cfg, 'table.id', default=None) or exp[1]}",
    ]
    tags = [t for t in tags if not t.endswith(":None")]
    if run:
        tags += [f"algorithm:{cfg.algorithm.name}", f"dataset:{cfg.dataset.name}"]
    return list(dict.fromkeys(tags + [str(t) for t in (OmegaConf.select(cfg, "logger.wandb.tags") or [])]))


def log_sweep_table(config, sweep: Path, columns: list[str], rows: list[list]) -> None:
    """A sweep's table of jobs as a W&B Table (``sweep/jobs``) in a W&B run of its own: job_type ``sweep-summary``, in
    the sweep's group, files under ``<sweep dir>/wandb``. Nothing when W&B is off; a W&B failure is one warning."""
    wcfg = OmegaConf.select(config, "logger.wandb")
    mode = wandb_mode(wcfg.mode) if wcfg is not None else "disabled"
    if mode == "disabled" or (mode == "online" and _WANDB_DOWN):
        return
    try:
        import wandb

        run = wandb.init(
            project=wcfg.project,
            entity=wcfg.entity,
            group=wcfg.group or Path(sweep).name,
            name=f"{Path(sweep).name} jobs",
            job_type="sweep-summary",
            tags=wandb_tags(config, run=False),
            dir=str(sweep),
            mode=mode,
            reinit="finish_previous",
            settings=_settings(wandb, wcfg),
        )
        run.log({"sweep/jobs": wandb.Table(columns=columns, data=rows)})
        run.finish()
    except Exception as e:
        try:
            wandb.teardown()
        except (Exception, SystemExit):
            pass
        _warn(f"W&B: the sweep's table was not logged ({_reason(e)}); it is printed above and in {sweep}/jobs.jsonl")


def _wandb_sink(cfg, run_dir: Path, wandb_id: str | None, group: str | None):
    """(the W&B sink or None, what became of W&B: its mode, or ``failed: <why>``)."""
    global _WANDB_DOWN
    mode = wandb_mode(cfg.logger.wandb.mode)
    if mode == "disabled":
        return None, "disabled"
    if mode == "online" and _WANDB_DOWN:
        _warn(
            f"W&B skipped: it could not start earlier in this process ({_WANDB_DOWN}); continuing with the local logs"
        )
        return None, f"failed: {_WANDB_DOWN}"
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
        return WandbSink(
            cfg,
            run_dir,
            config,
            wandb_id,
            cfg.logger.wandb.group or group,
            run_name(cfg, group is not None),
            mode,
            job_type="sweep" if group else "run",
        ), mode
    except Exception as e:
        try:
            import wandb

            wandb.teardown()
        except (Exception, SystemExit):
            pass
        if mode == "online":
            _WANDB_DOWN = _reason(e)
        _warn(
            f"W&B could not start ({_reason(e)}); continuing with the local logs (metrics.jsonl, summary.json); "
            "logger.wandb.mode=offline keeps W&B files for a later `wandb sync`"
        )
        return None, f"failed: {_reason(e)}"


def build_loggers(
    cfg,
    run_dir: Path,
    title: str,
    start_round: int = 0,
    wandb_id: str | None = None,
    group: str | None = None,
    on_wandb_state=None,
) -> Loggers:
    lc = cfg.logger
    sinks: list = []
    if lc.jsonl:
        sinks.append(JsonlSink(run_dir))
    sinks.append(ConsoleSink(cfg, run_dir, title, start_round))  # run.log always; the console if logger.console
    wb, state = _wandb_sink(cfg, run_dir, wandb_id, group)
    if wb is not None:
        sinks.append(wb)
    return Loggers(sinks, state, on_wandb_state)
