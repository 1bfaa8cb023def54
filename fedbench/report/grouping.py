"""Which runs make which table: a run's ``table:`` node read into a :class:`Table`, runs grouped into tables (configs
that split one paper table merged, ``also:`` and ``split``), the default table of runs without a node, and the tables
made from one (``--comm``'s communication columns, a swept key as an axis)."""

from __future__ import annotations

from dataclasses import dataclass

from .runs import RunRecord, _number, canon
from .words import _slug, metric_words, path_words, window_words

DERIVED = ("rounds_to_target", "speedup")  # metrics computed from metrics.jsonl (FedKA Table 2)

# --spread: the spread of the per-client personalized accuracies (fedbench/metrics.py), final values
SPREAD = {"Worst 10 %": "pers/acc_worst10", "P10": "pers/acc_p10", "P50": "pers/acc_p50", "P90": "pers/acc_p90"}
SHOTS = {"Many-shot": "pers/many_acc", "Medium-shot": "pers/medium_acc", "Few-shot": "pers/few_acc"}  # long tail only


def comm_tables(table: "Table", percent: float) -> list["Table"]:
    """``--comm X`` (docs/communication.md): "MB to X %" (cumulative MB, both directions, at the first round the table's
    accuracy reached X %) and "MB total" (summary.json ``communication.MB``). A table with metric columns gets them as
    two more columns; a table with ``cols`` (one metric per column value) gets one companion table per measure."""
    acc = next((p for p in table.metrics.values() if "acc" in p.split("@")[0] and p not in DERIVED), None)
    if acc is None:
        return []
    curve = acc.split("@")[0] if "@" in acc else acc.rsplit(".", 1)[0]
    comm = {f"MB to {percent:g} %": f"comm/MB_cum@reach:{curve}>={percent / 100:g}", "MB total": "communication.MB"}
    if not table.cols:  # every run has the two columns (a cell's runs are those whose table names its metric)
        table.metrics.update(comm)
        table.members = [(r, {**s, "metrics": {**(s.get("metrics") or {}), **comm}}) for r, s in table.members]
        return []
    return [
        Table(
            {
                **table.spec,
                "id": f"{table.id}_{_slug(name)}",
                "title": f"{table.title} — {name}",
                "metrics": {name: path},
                "reference": {},
                "percent": False,
                "comm_of": table.id,
            },
            table.members,
        )  # fmt: skip
        for name, path in comm.items()
    ]


def default_table(runs: list[RunRecord], metric: str | None, spread: bool = False) -> dict:
    """For runs without a ``table:`` node: methods x best/final of one accuracy metric; ``spread``: and the final
    worst-10 % and 10th/50th/90th-percentile client accuracy (many/medium/few-shot too where a run has them)."""
    present = {m for r in runs for m in r.summary.get("metrics", {})}
    if metric is None:
        metric = next((m for m in ("pers/acc", "global/acc") if m in present), "pers/acc")
    metrics = {"Best": f"{metric}.best", "Final": f"{metric}.final"}
    if spread:
        shots = {k: m for k, m in SHOTS.items() if m in present}
        metrics.update({k: f"{m}.final" for k, m in {**SPREAD, **shots}.items()})
    return {
        "paper": "runs",
        "id": metric.replace("/", "_") + ("_spread" if spread else ""),
        "title": f"{metric_words(metric).capitalize()}: best and final"
        + ("; the spread over clients (final)" if spread else ""),
        "rows": "choice:algorithm",
        "cols": None,
        "metrics": metrics,
        "percent": True,
    }


# config keys that never make two runs incomparable (where and how a run ran, not what it computed)
RUN_ONLY = (
    "seed",
    "hydra",
    "logger",
    "checkpoint",
    "resume",
    "data_root",
    "cache_dir",
    "dataset.root",
    "dataset.download",
    "hardware.threads",
    "hardware.device",
    "hardware.executor",
    "hardware.workers",
    "hardware.max_memory",
)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, f"{key}."))
        else:
            out[key] = v
    return out


def pooled_keys(table: "Table") -> dict[str, list[str]]:
    """The config keys in which complete runs of one cell and one seed differ (a default table would average them):
    {key: the values}; keys of :data:`RUN_ONLY` (and below them) and values not resolved (``${...}``: a run that never
    started, read from its sweep's config) do not count."""
    cells: dict = {}
    for run, _ in table.members:
        if run.status == "complete":
            cells.setdefault((canon(run.key(table.rows)), canon(run.seed)), []).append(run)
    out: dict = {}
    for runs in cells.values():
        if len(runs) < 2:
            continue
        flats = [_flat(r.config) for r in runs]
        for k in sorted(set().union(*flats)):
            if any(k == p or k.startswith(p + ".") for p in RUN_ONLY):
                continue
            values = sorted({str(f.get(k)) for f in flats if "${" not in str(f.get(k))})
            if len(values) > 1:
                out.setdefault(k, set()).update(values)
    return {k: sorted(v) for k, v in out.items()}


def swept_tables(table: "Table", clash: dict) -> list["Table"] | None:
    """A default table whose runs of one method and seed differ in config keys (:func:`pooled_keys`: a sensitivity
    sweep, e.g. ``algorithm.delta=0.3,0.7``) laid out with the swept key as an axis instead of averaged (issue #53):
    keys that change together (a key and what is derived from it) are one swept key, named by the one the sweep set.
    One method, one swept key: the key's values are the rows, the metrics the columns (FedReMa Table 3's δ layout).
    Two axes (several methods and one swept key, or one method and two): rows x columns, one table per metric. None
    when that does not fit (three axes, or a run without the key): the caller refuses."""
    runs = [r for r, _ in table.members]
    done = [r for r in runs if r.status == "complete"]
    dims: dict = {}  # the partition of the complete runs a key makes -> the keys making it
    for k in clash:
        values = [canon(r.key(k)) for r in done]
        dims.setdefault(frozenset(frozenset(i for i, v in enumerate(values) if v == x) for x in values), []).append(k)
    typed = [k for r in runs for k in r.overrides]  # the keys as the command lines set them, in their order
    rank = {k: typed.index(k) if k in typed else len(typed) for k in clash}
    keys = sorted((min(ks, key=lambda k: (rank[k], k)) for ks in dims.values()), key=lambda k: (rank[k], k))
    several = len({canon(r.key(table.rows)) for r in runs}) > 1
    axes = ([table.rows] if several else []) + keys
    if len(axes) > 2 or any(r.key(k) is None for r in runs for k in keys):
        return None
    base = table.spec
    if len(axes) == 1:
        spec = {
            **base,
            "rows": keys[0],
            "id": f"{base['id']}_by_{_slug(keys[0])}",
            "title": f"{base['title']}, by {keys[0]}",
        }
        return [Table(spec, [(r, spec) for r in runs])]
    rows, cols = axes
    out = []
    for name, path in base["metrics"].items():
        spec = {
            **base,
            "rows": rows,
            "cols": cols,
            "metrics": {name: path},
            "id": f"{base['id']}_{_slug(name.lower())}_by_{_slug(cols)}",  # name: Best, Final, Worst 10 %, ...
            "title": f"{path_words(path).capitalize()}"
            + (f" ({words})" if (words := window_words(table.members, path)) else "")
            + f", by {cols}"
            + (f" and {rows}" if not several else ""),
        }
        out.append(Table(spec, [(r, spec) for r in runs]))
    return out


@dataclass
class Table:
    spec: dict  # the table node (merged when several configs make one paper table)
    members: list  # [(run, its own table node)]
    stem: str = ""
    merged: bool = False  # several configs, one metric column each (FedKA Table 1's datasets)

    def __post_init__(self):
        s = self.spec
        self.paper, self.id, self.title = (
            str(s.get("paper", "runs")),
            str(s.get("id", "table")),
            str(s.get("title", "")),
        )
        self.rows, self.cols = s.get("rows") or "choice:algorithm", s.get("cols")
        self.metrics = {str(k): str(v) for k, v in (s.get("metrics") or {}).items()}
        self.target = s.get("target") or {}
        if "rounds_to_target" in self.metrics.values() and "speedup" not in self.metrics.values() and not self.cols:
            items = list(self.metrics.items())
            at = next(i for i, (_, p) in enumerate(items) if p == "rounds_to_target") + 1
            self.metrics = dict(items[:at] + [("Speedup", "speedup")] + items[at:])  # the paper's Table 2 column
        self.labels = {canon(k): str(v) for k, v in (s.get("labels") or {}).items()}
        self.reference = {
            canon(r): {canon(c): v for c, v in (cells or {}).items()} for r, cells in (s.get("reference") or {}).items()
        }
        self._derive_reference_speedup()
        self.stem = self.stem or f"{self.paper}_{self.id}"

    def _derive_reference_speedup(self):
        """Paper speedup = paper rounds of the target row / paper rounds of the row (FedKA Table 2)."""
        name = next((n for n, p in self.metrics.items() if p == "rounds_to_target"), None)
        if name is None or "Speedup" not in self.metrics:
            return
        base = _number(self.reference.get(canon(self.target.get("row")), {}).get(canon(name)))
        for cells in self.reference.values():
            if canon(name) in cells and "Speedup" not in cells:
                r = _number(cells[canon(name)])
                cells["Speedup"] = base / r if base and r else None

    def percent(self, name: str) -> bool:
        """``percent: true`` shows accuracies x100 (metrics whose name contains ``acc``); a list names the columns."""
        p = self.spec.get("percent", False)
        if isinstance(p, (list, tuple)):
            return name in map(str, p)
        path = self.metrics.get(name, "")
        return bool(p) and "acc" in path.split("@")[0].lower() and path not in DERIVED


def group_tables(
    runs: list[RunRecord], metric: str | None = None, split: str | None = None, spread: bool = False
) -> list[Table]:
    """Runs -> tables, one per (paper, id, title); configs that split one paper table into one metric column each
    (same paper and id, no ``cols``, disjoint metric names, e.g. FedKA Table 1's datasets) are merged. ``split``: runs
    without a table node make one default table per value of that config key; ``spread``: their tables get the
    spread columns (:func:`default_table`)."""
    plain = [r for r in runs if not isinstance(r.config.get("table"), dict)]
    fallback = default_table(plain, metric, spread) if plain else None
    groups: dict = {}
    for r in runs:
        spec = r.config.get("table") if isinstance(r.config.get("table"), dict) else fallback
        if spec is fallback and split:
            v = r.key(split)
            spec = {
                **fallback,
                "id": f"{fallback['id']}_{_slug(str(v))}",
                "title": f"{fallback['title']} — {split}={v}",
            }
        for s in [spec, *_also(r, spec)]:
            groups.setdefault((str(s.get("paper")), str(s.get("id")), str(s.get("title"))), []).append((r, s))
    by_id: dict = {}
    for (paper, tid, _), members in groups.items():
        by_id.setdefault((paper, tid), []).append(members)
    tables = []
    for (paper, tid), parts in by_id.items():
        specs = [m[0][1] for m in parts]
        names = [set(map(str, s.get("metrics") or {})) for s in specs]
        if (
            len(parts) > 1
            and not any(s.get("cols") for s in specs)
            and sum(map(len, names)) == len(set().union(*names))
        ):
            tables.append(Table(_merge(specs), [m for members in parts for m in members], merged=True))
        elif len(parts) > 1:  # same id, different tables: name the files after the experiment config
            for members in parts:
                exp = members[0][0].choices.get("experiment") or members[0][1].get("title")
                tables.append(Table(members[0][1], members, stem=f"{paper}_{_slug(str(exp).split('/')[-1])}"))
        else:
            tables.append(Table(specs[0], parts[0]))
    return tables


def _also(run: RunRecord, spec: dict) -> list[dict]:
    """More tables from the same runs (a table node's ``also:`` list, e.g. CAFeMe Fig. 4 from the Table 1 runs);
    ``split: <key>`` makes one table per value of that config key (``<id>_<value>``, title ``... — <value>``)."""
    out = []
    for extra in spec.get("also") or []:
        s = {"paper": spec.get("paper"), **extra}
        if s.get("split"):
            v = run.key(str(s["split"]))
            s.update(id=f"{s.get('id')}_{_slug(str(v))}", title=f"{s.get('title', '')} — {v}")
        out.append(s)
    return out


def _merge(specs: list[dict]) -> dict:
    out = dict(specs[0], metrics={}, labels={}, reference={})
    for s in specs:
        out["metrics"].update(s.get("metrics") or {})
        out["labels"].update(s.get("labels") or {})
        for row, cells in (s.get("reference") or {}).items():
            out["reference"].setdefault(row, {}).update(cells or {})
    titles = [str(s.get("title", "")) for s in specs]
    prefix = titles[0][: next((i for i, cs in enumerate(zip(*titles)) if len(set(cs)) > 1), min(map(len, titles)))]
    cut = max(prefix.rfind(" ("), prefix.rfind(" — "))
    out["title"] = (prefix[:cut] if cut > 0 else prefix).rstrip(" :—-(,") if len(set(titles)) > 1 else titles[0]
    return out
