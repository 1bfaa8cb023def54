"""The evaluation protocol (issue #34, docs/protocol.md): what a reported accuracy is — which model, on which clients,
on which test data, summarized by which statistic of the run — declared in one block, ``eval.protocol``
(conf/config.yaml; the papers' experiment configs set theirs with the place in the paper it comes from), printed in
one line in the run header and above every report table. ``fedbench-report`` refuses to put runs with different
protocols in one column (``--mixed-protocols`` allows it, naming the difference).

A method's own fine-tuning (FedAvg-FT, FedBABU: ``algorithm.ft_*``) is part of the method, not of the protocol: the
line names it, the report does not compare it (a table puts FedAvg and FedAvg-FT side by side on purpose)."""

from __future__ import annotations

from omegaconf import OmegaConf

from .checks import one_of, text
from .errors import ConfigError

FIELDS = ("model", "clients", "test_split", "statistic")  # what makes two accuracies comparable
CHECKS = {
    "model": one_of("auto", "personalized", "global", "fine-tuned"),
    "clients": one_of("auto", "all", "new"),
    "statistic": one_of("best", "final", "last"),
    "source": text(optional=True),
}
# the metric of the report's tables that each (model, clients) pair reports
METRIC = {("personalized", "all"): "pers/acc", ("global", "all"): "global/acc", ("fine-tuned", "new"): "newclients/acc"}


def fields(cfg) -> dict[str, str] | None:
    """The protocol's comparable fields of a (resolved) config, ``auto`` resolved (:func:`resolve`); None for a run made
    before ``eval.protocol`` existed."""
    if OmegaConf.select(cfg, "eval.protocol", default=None) is None:
        return None
    return {f: str(v) for f, v in resolve(cfg).items() if f in FIELDS}


def resolve(cfg) -> dict:
    """``eval.protocol`` with ``auto`` resolved: model = personalized if the run evaluates personalized models, else
    global if it evaluates a global model, else fine-tuned (new clients only); clients = new with fine-tuned, else
    all."""
    p = dict(OmegaConf.to_container(cfg.eval.protocol, resolve=True))
    ev = cfg.eval
    if p.get("model") == "auto":
        new = bool(OmegaConf.select(cfg, "eval.new_clients.enabled", default=False))
        p["model"] = (
            "personalized" if ev.personalized else "global" if ev.global_model else "fine-tuned" if new else "?"
        )
    if p.get("clients") == "auto":
        p["clients"] = "new" if p["model"] == "fine-tuned" else "all"
    return p


def check(cfg) -> None:
    """ConfigError for a protocol the run cannot deliver (before any training)."""
    if OmegaConf.select(cfg, "eval.protocol", default=None) is None:
        return
    for key, (ok, allowed) in CHECKS.items():
        v = OmegaConf.select(cfg, f"eval.protocol.{key}", default=None)
        if not ok(v):
            raise ConfigError(f"eval.protocol.{key}", v, allowed)
    p = OmegaConf.create(resolve(cfg))
    split = OmegaConf.select(cfg, "partition.test_split", default=None)
    if split is not None and str(p.test_split) != str(split):
        raise ConfigError(
            "eval.protocol.test_split", p.test_split, f"the partition's test split, {split} (set partition.test_split)"
        )
    needs = {
        "personalized": ("eval.personalized", "personalized accuracy"),
        "global": ("eval.global_model", "the global model's accuracy"),
        "fine-tuned": ("eval.new_clients.enabled", "fine-tuned new clients"),
    }[p.model]
    if (p.clients == "new") != (p.model == "fine-tuned"):
        raise ConfigError(
            "eval.protocol.clients", p.clients, "new exactly when eval.protocol.model=fine-tuned (held-out new clients)"
        )
    if not OmegaConf.select(cfg, needs[0], default=False):
        raise ConfigError(
            "eval.protocol.model", p.model, f"a model the run evaluates: {needs[0]}=true to report {needs[1]}"
        )


def line(cfg, counts: bool = True) -> str:
    """The protocol in one line, e.g. ``personalized models · all 20 clients · test split local · final (mean of the
    last 5 evaluations after round 0) · FedReMa §5.1``."""
    p = OmegaConf.create(resolve(cfg))
    model = {"personalized": "personalized models", "global": "the global model", "fine-tuned": "fine-tuned models"}[
        p.model
    ]
    if p.model == "fine-tuned":
        model += f" ({cfg.eval.new_clients.steps} steps)"
    a = cfg.algorithm  # the method's own fine-tuning (ft_steps, if set, replaces ft_epochs: FedAvg-FT, FedBABU)
    ft = f"{a.ft_steps} steps" if a.get("ft_steps") else f"{a.ft_epochs} epochs" if a.get("ft_epochs") else None
    if p.model == "personalized" and ft:
        model += f" (the method fine-tunes {ft})"
    if p.clients == "all":
        clients = f"all {cfg.clients} clients" if counts else "all clients"
    else:
        share = f" ({cfg.eval.new_clients.fraction:g} of {cfg.clients}, never trained)" if counts else ""
        clients = f"held-out new clients{share}"
    split = "the global test set" if p.model == "global" else f"test split {p.test_split}"
    stat = {"best": "best evaluation", "final": final_words(cfg), "last": "last evaluation"}[p.statistic]
    parts = [model, clients, split, stat] + ([str(p.source)] if p.get("source") else [])
    return " · ".join(parts)


def evaluations(rounds: int, every: int) -> int:
    """How many evaluations a run of ``rounds`` makes after round 0: every ``every`` rounds and after the last
    (fedbench/callbacks.py)."""
    return len(set(range(every, rounds + 1, every)) | {rounds})


def final_words(cfg) -> str:
    """What a run's "final" averages, in words: ``final (mean of the last 5 evaluations after round 0)``; when the
    window holds every evaluation after round 0 (a short run: 3 rounds, window 5), ``final (mean of all 3
    evaluations after round 0: the whole run)`` — issue #53: it is no end-of-training value then."""
    window, evals = int(cfg.eval.final_window), evaluations(int(cfg.rounds), int(cfg.eval_every))
    if window >= evals:
        return f"final (mean of all {evals} evaluation{'s' * (evals != 1)} after round 0: the whole run)"
    return f"final (mean of the last {window} evaluations after round 0)"


def differences(protocols: dict[str, dict[str, str]]) -> list[str]:
    """``{run label: fields}`` -> one phrase per field whose value differs, e.g. ``statistic: best (fedavg) vs last
    (ecl)``; [] when they agree."""
    out = []
    for f in FIELDS:
        by_value: dict[str, list[str]] = {}
        for label, p in protocols.items():
            by_value.setdefault(p[f], []).append(label)
        if len(by_value) > 1:
            out.append(f"{f}: " + " vs ".join(f"{v} ({', '.join(sorted(ls)[:2])})" for v, ls in by_value.items()))
    return out


__all__ = ["CHECKS", "FIELDS", "METRIC", "check", "differences", "evaluations", "fields", "final_words", "line"]
