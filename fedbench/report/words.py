"""How a report writes what it shows: a metric or a metric path in words (titles, axes, the claims' pages), the
evaluations a final value averages, a number to a column's decimals, and a name as a file name's slug."""

from __future__ import annotations

import re

METRIC_WORDS = {
    "pers/acc": "personalized accuracy",
    "pers/acc_mean": "personalized accuracy (client mean)",
    "pers/acc_present_classes": "personalized accuracy (present classes)",
    "pers/acc_worst10": "worst-10 % client accuracy",
    "pers/acc_p10": "10th-percentile client accuracy",
    "pers/acc_p50": "median client accuracy",
    "pers/acc_p90": "90th-percentile client accuracy",
    "pers/many_acc": "many-shot class accuracy",
    "pers/medium_acc": "medium-shot class accuracy",
    "pers/few_acc": "few-shot class accuracy",
    "global/acc": "global-model accuracy",
    "train/loss": "training loss",
    "ccp_rounds": "rounds in the CCP",
    "wall_time": "wall time (s)",
    "time_per_round": "time per round (s)",
    "newclients/step5_acc": "new-client accuracy after 5 steps",
}


def metric_words(metric: str) -> str:
    """A metric as a picture or a title writes it: ``pers/acc`` -> ``personalized accuracy``."""
    return METRIC_WORDS.get(metric, metric.replace("/", " ").replace("_", " "))


STAT_WORDS = {"best": "best round", "final": "final", "last": "last round", "best_round": "round of its best"}


def path_words(path: str) -> str:
    """A metric path (a table's or a claim's) as an axis writes it: ``pers/acc.best`` -> ``personalized accuracy,
    best round``; ``forgetting/missing@mean`` -> ``forgetting missing, mean over rounds``; ``global/acc@10`` ->
    ``global-model accuracy, round 10``."""
    if "@" in path:
        metric, at = path.split("@", 1)
        return f"{metric_words(metric)}, {'mean over rounds' if at == 'mean' else f'round {at}'}"
    metric, _, stat = path.rpartition(".")
    if metric and stat in STAT_WORDS:
        return f"{metric_words(metric)}, {STAT_WORDS[stat]}"
    return metric_words(path)


def window_words(members: list, path: str) -> str | None:
    """The evaluations a ``<metric>.final`` value of these runs averages (summary.json ``final_n``): ``last 5 evals``,
    or ``all 3 evals`` when that is every evaluation after round 0 (a run shorter than ``eval.final_window``); None
    for another path and for runs made before ``final_n``."""
    from ..protocol import evaluations

    metric, _, stat = path.rpartition(".")
    spans = set()
    for run, _ in members if stat == "final" else []:
        n = (run.summary.get("metrics", {}).get(metric) or {}).get("final_n")
        rounds, every = run.config.get("rounds"), run.config.get("eval_every", 1)
        if run.status == "complete" and isinstance(n, int) and isinstance(rounds, int) and isinstance(every, int):
            spans.add((n, n >= evaluations(rounds, every)))
    if not spans:
        return None
    ns = sorted({n for n, _ in spans})
    n = str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    return "last eval" if n == "1" else f"{'all' if all(whole for _, whole in spans) else 'last'} {n} evals"


def fmt(x, decimals: int = 2, sign: bool = False) -> str:
    if x is None:
        return ""
    s = f"{float(x):.{decimals}f}"
    return "+" + s if sign and float(x) > 0 else s


def decimals(numbers: list, percent: bool) -> int:
    """Digits of a column: 2 for percentages; 0 when every number is whole (rounds, CCP lengths); 4 for fractions."""
    if percent or not numbers:
        return 2
    if all(float(x).is_integer() for x in numbers):
        return 0
    return 4 if max(abs(x) for x in numbers) < 1 else 2


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_") or "x"
