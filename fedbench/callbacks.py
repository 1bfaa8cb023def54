"""The round loop's callbacks (in the manner of pfl-research's ``callback/base.py``): what happens around the rounds of
an algorithm without being part of it — diagnostics, evaluation, logging, checkpoints.

:meth:`fedbench.run.Run.loop` calls every callback of ``run.callbacks``, in list order:

* ``on_start(run, t0)`` once, before the first round of this session (after round 0 is logged, or after round ``t0``
  of a resumed run);
* ``before_round(run, t)`` after the round's data schedule and client sampling, before the algorithm's round;
* ``after_round(run, t, metrics)`` after the algorithm's round (``metrics`` holds its metrics and ``time/round``, which
  counts the algorithm's round only): a callback adds its own metrics to ``metrics``, the loggers' callback then
  records the row, the checkpointer saves;
* ``on_end(run, summary)`` once the run is complete (``summary.json`` is written).

The order of ``run.callbacks`` (built by :func:`fedbench.build.callbacks`): round 1's first-steps estimate, the
local-model monitors (forgetting, similarity), the evaluation, the new clients, the loggers, the checkpointer; extra
callbacks given to ``Run`` last.
"""

from __future__ import annotations

import math
import sys
import time

import torch
from omegaconf import OmegaConf

from .errors import Diverged


class Callback:
    """A no-op for every hook: a callback overrides what it needs."""

    def on_start(self, run, t0: int) -> None:
        pass

    def before_round(self, run, t: int) -> None:
        pass

    def after_round(self, run, t: int, metrics: dict) -> None:
        pass

    def on_end(self, run, summary: dict) -> None:
        pass


class LocalModelMonitors(Callback):
    """The monitors that read a round's trained local models: the class-wise forgetting degree (FedKA Eq. 1,
    ``eval.forgetting``) and FedReMa's head similarity (Eq. 5, Alg. 1, Eq. 8; ``eval.similarity``). Both ask the
    algorithm to keep its local models before the round (similarity after forgetting) and read them after it
    (similarity first: forgetting releases them); neither is counted in ``time/round``."""

    def __init__(self, forgetting, similarity):
        self.forgetting, self.similarity = forgetting, similarity

    def before_round(self, run, t: int) -> None:
        if self.forgetting:  # snapshot the round-start global model θ_g^r
            self.forgetting.before_round(run.algorithm, t)
        if self.similarity:  # after forgetting's: both read the round's local models
            self.similarity.before_round(run.algorithm, t)

    def after_round(self, run, t: int, metrics: dict) -> None:
        if self.similarity:  # S of the trained local heads (before forgetting's after_round, which releases them)
            metrics.update(self.similarity.after_round(run.algorithm, t))
        if self.forgetting:  # τ of each trained local model vs θ_g^r
            metrics.update(self.forgetting.after_round(run.algorithm, t))


class Evaluation(Callback):
    """The evaluator every ``eval_every`` rounds and after the last one (``time/eval``: its wall time); at the end the
    spread of the per-client accuracies at the best and the last round, ``client_spread.png`` (also to the loggers)."""

    def __init__(self, evaluator):
        self.evaluator = evaluator

    def after_round(self, run, t: int, metrics: dict) -> None:
        if t % int(run.cfg.eval_every) == 0 or t == int(run.cfg.rounds):
            tic = time.perf_counter()
            metrics.update(self.evaluator(run.algorithm, t))
            metrics["time/eval"] = time.perf_counter() - tic

    def on_end(self, run, summary: dict) -> None:
        from .console import run_title
        from .plots import off, save

        if off():
            return
        fig = self.evaluator.spread_figure(run_title(run.run_dir))
        if fig is not None:
            run.loggers.image("client_spread", save(fig, run.run_dir / "client_spread.png"), int(run.cfg.rounds))


class NewClientsEvaluation(Callback):
    """Fine-tune and score the held-out new clients (CAFeMe §5, ``eval.new_clients``) when due."""

    def __init__(self, new_clients):
        self.new_clients = new_clients

    def after_round(self, run, t: int, metrics: dict) -> None:
        if self.new_clients.due(t):
            tic = time.perf_counter()
            metrics.update(self.new_clients(run.algorithm, t))
            metrics["time/new_clients"] = time.perf_counter() - tic


class FirstSteps(Callback):
    """A long run's first estimate from its first local steps (issue #36): once round 1's local training has run
    ``AFTER_S`` seconds, one line with the round's client-steps done and planned, the time that makes per round and
    for the run, and status.json's ETA from it (until round 1 ends and the ETA follows the rounds). Counts local
    training only (not evaluation, nor what a method does beside it); said only when round 1 is still under way."""

    AFTER_S = 5.0

    def __init__(self):
        self.run, self.said, self.first = None, False, 1
        self.t0, self.done, self.planned = time.perf_counter(), 0, 0

    def on_start(self, run, t0: int) -> None:
        self.run, self.said, self.first = run, False, t0 + 1
        self.rounds_left = int(run.cfg.rounds) - t0

    def before_round(self, run, t: int) -> None:
        if t == self.first:  # round 1's own local training only (not round 0's evaluation, e.g. FT's fine-tuning)
            self.t0, self.done, self.planned = time.perf_counter(), 0, 0
            run.executor.on_steps = self

    def __call__(self, done: int, planned: int) -> None:
        self.done, self.planned = self.done + done, self.planned + planned
        elapsed = time.perf_counter() - self.t0
        if self.said or elapsed < self.AFTER_S or not self.done or self.done >= self.planned:
            return
        self.said = True
        per_round = elapsed * self.planned / self.done
        total = per_round * self.rounds_left
        pace = (
            f"about {_duration(per_round)} per round, {_duration(total)} for {self.rounds_left} rounds"
            if self.rounds_left > 1
            else f"about {_duration(total)} for its one round"  # (not "0:03:48 for 1 rounds")
        )
        say(
            self.run.loggers,
            f"fedbench: {self.done} of round {self.first}'s {self.planned} local client-steps in {elapsed:.0f} s: "
            f"{pace} (local training only; the ETA follows the rounds from the end of round {self.first})",
        )
        self.run.status.set(eta_s=round(total - elapsed), eta_from=f"round {self.first}'s first steps")

    def after_round(self, run, t: int, metrics: dict) -> None:
        if run.executor.on_steps is self:
            run.executor.on_steps = None  # round 1 only: then the rounds' own pace (Status.progress)
            run.status.data.pop("eta_from", None)


def _duration(seconds: float) -> str:
    from .console import clock

    return clock(seconds)


class Logging(Callback):
    """The loggers (console, run.log, metrics.jsonl, W&B; ``run.loggers``, built when the rounds start: a resumed run
    goes on with its W&B run), round 0 (the initial model, unless the run is resumed), each round's row in
    ``run.history`` and the loggers, the summary at the end."""

    def on_start(self, run, t0: int) -> None:
        from .console import header_lines
        from .loggers import build_loggers

        cfg, resumed = run.cfg, run.checkpointer.resumed
        title = f"{cfg.algorithm.name} | {cfg.dataset.name} | {cfg.partition.name}"
        # the W&B run of this run dir (a restart without a checkpoint resumes it too: no second W&B run)
        wandb_id = run.checkpointer.resumed_wandb_id or run.rundir.previous_status.get("wandb_id")
        run.loggers = build_loggers(
            cfg,
            run.run_dir,
            title,
            start_round=t0,
            group=run.group,
            wandb_id=wandb_id,
            on_wandb_state=lambda state: run.status.set(wandb=state),
        )
        run.status.set(wandb=run.loggers.wandb_state, wandb_id=run.loggers.wandb_id)
        run.loggers.header(*header_lines(run, t0))  # run dir, what runs, on what (console and run.log)
        if resumed and run.world.leader:  # (another process of the run says nothing: fedbench/distributed.py)
            if not cfg.logger.console:  # (a console's header says it: once, issue #53)
                print(f"fedbench: resuming {run.run_dir} after round {t0}", file=sys.stderr)
        else:  # round 0: the initial model
            run.loggers.image("partition", run.partition_png, 0)
            first = run.evaluator(run.algorithm, 0)
            run.history.append({"round": 0, **first})
            run.loggers.log(0, first)

    def after_round(self, run, t: int, metrics: dict) -> None:
        run.history.append({"round": t, **metrics})
        run.loggers.log(t, metrics)

    def on_end(self, run, summary: dict) -> None:
        run.loggers.summary(summary)
        run.loggers.finish("complete")


def say(loggers, line: str) -> None:
    """One line for the console and run.log (the loggers' console sink), or stderr before the loggers exist."""
    from .console import ConsoleSink

    sink = next((s for s in getattr(loggers, "sinks", []) if isinstance(s, ConsoleSink)), None)
    if sink is not None:
        sink.note(line)
    else:
        print(line, file=sys.stderr, flush=True)


class DivergenceGuard:
    """The divergence guard, after every local training call (``run.check_finite``): stop (status ``diverged``) on a
    non-finite loss or parameter, or on a client's round loss above ``divergence.factor`` x the reference loss, naming
    the round, the clients and the metric. The reference is ln(#classes), the cross-entropy of an untrained model's
    uniform guess (so a run that blows up within its first round is caught), or the first round's mean loss if that is
    higher."""

    def __init__(self, run):
        self.run = run
        self.reference: float | None = None  # saved in checkpoints (``loss_reference``)

    def __call__(self, t: int, clients: list[int], res) -> None:
        run = self.run
        loss = res.loss.detach().to(torch.float64).cpu()
        bad = ~torch.isfinite(loss)
        for v in res.params.values():  # a client's sum is non-finite iff one of its values is (or they overflow):
            bad |= ~torch.isfinite(v.flatten(1).sum(1)).cpu()  # one pass, where isfinite(v).all() makes four
        what = "non-finite loss or parameters"
        factor = OmegaConf.select(run.cfg, "divergence.factor", default=None)
        if not bad.any() and factor is not None:
            uniform = math.log(max(run.data.num_classes, 2))
            reference = uniform if self.reference is None else self.reference
            bad = loss > float(factor) * reference
            worst = float(loss[bad].max()) if bad.any() else 0
            what = f"training loss {worst:.3g} above divergence.factor={factor:g} x the reference {reference:.3g}"
            if self.reference is None and not bad.any():
                self.reference = max(float(loss.mean()), uniform)
        if bad.any():
            who = [clients[i] for i in torch.nonzero(bad).flatten().tolist()]
            raise Diverged(
                f"diverged in round {t}: {what} on client(s) {who}; run dir {run.run_dir} (status.json: "
                f"diverged). Try a lower lr (now {run.cfg.lr}), optim.clip_grad_norm=10, or "
                "divergence.factor=null to stop only on non-finite values"
            )
