"""Golden runs: every algorithm config, 2 rounds on the embedded digits, CPU, fp64 and fp32 — every logged number.

The regression net for refactors (issue 22): ``tests/test_golden.py`` re-runs each and compares with
``tests/golden/runs.json``, bit for bit on the machine that wrote it. Rewrite the file only for a change that is
meant to change numbers, and say so in the commit:

    python scripts/golden.py --write            # all algorithms (about 2 min on one core)
    python scripts/golden.py fedavg pfedme      # print the differences of some, write nothing
    python scripts/golden.py --write my_method  # add a new method's runs (recorded as made on this machine)

Each run remembers the machine that recorded it (``machines``; default: the file's ``machine``), so runs added on
another machine are compared bit for bit there and to 1e-7 (fp64) elsewhere, like the rest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "golden" / "runs.json"
PRECISIONS = ("fp64", "fp32")
# what every golden run shares: tiny and fast, 2 rounds, partial participation (sampling is exercised), eval each round
COMMON = [
    "logger=none",
    "hardware=cpu",
    "hardware.threads=1",
    "hardware.executor=sequential",
    "dataset=digits",
    "model=tiny_cnn",  # BatchNorm in body and head
    "rounds=2",
    "eval_every=1",
    "clients=6",
    "participation=0.5",
    "local_epochs=1",
    "batch_size=32",
    "seed=3",
    "checkpoint.final_model=false",
]
# per algorithm, what it needs on digits to run in seconds (nothing for most)
EXTRA = {
    "cafeme": [
        "model=cafeme_mnist",
        "model.channels=[4,8]",
        "model.kernel_size=3",
        "model.padding=1",
        "model.hidden=[16]",
        "model.modulator_hidden=[8]",
        "model.modulator_post=[8]",
    ],
    "fedcom": ["partition=complementary_pairs", "clients=10"],  # needs each client's minority class
    "ecl_m3": ["drop_last=true"],
}  # a 1-sample last batch would reach the head's BatchNorm


def algorithms() -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / "algorithm").glob("*.yaml"))


def machine() -> str:
    """What decides the exact floating-point results: the CPU (model and vector extensions) and torch's version."""
    import torch

    cpu = ""
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
        flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
        cpu = (
            model
            + " "
            + hashlib.sha256(" ".join(sorted(f for f in flags if f.startswith("avx"))).encode()).hexdigest()[:8]
        )
    except OSError:
        cpu = platform.processor()
    return f"{cpu} | torch {torch.__version__} | {platform.machine()}"


def record(algorithm: str, precision: str, workdir: Path) -> dict:
    """The run's numbers: every metrics.jsonl row and the summary's metrics, without wall-clock times."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import make_cfg

    from fedbench.run import Run

    cfg = make_cfg(f"algorithm={algorithm}", f"hardware.precision={precision}", *COMMON, *EXTRA.get(algorithm, []))
    run_dir = workdir / f"{algorithm}_{precision}"
    summary = Run(cfg, run_dir).execute()
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not _clock_or_path(k)} for r in rows]
    rows = [r for r in rows if set(r) != {"round"}]  # a picture's row (none with logger.pictures=false)
    return {"rows": rows, "metrics": summary["metrics"], "final": summary["final"]}


def _clock_or_path(key: str) -> bool:
    """Logged keys that are not results: wall-clock times and picture paths."""
    return key.startswith(("time/", "image/")) or key.endswith("seconds")


def diff(want, got, path="", rel: float = 0.0) -> list[str]:
    """Every place where ``got`` differs from ``want``: numbers exactly, or with ``rel`` > 0 beyond
    ``rel * max(1, |want|)``."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}/{k}: missing" for k in want if k not in got] + [
            f"{path}/{k}: new" for k in got if k not in want
        ]
        return out + [d for k in want if k in got for d in diff(want[k], got[k], f"{path}/{k}", rel)]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} items, now {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in diff(a, b, f"{path}[{i}]", rel)]
    same = want == got or (want != want and got != got)  # NaN == NaN here
    if not same and rel and _number(want) and _number(got):
        same = abs(want - got) <= rel * max(1.0, abs(want))
    return [] if same else [f"{path}: {want!r} -> {got!r}"]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def recorded_on(fixture: dict, key: str) -> str | None:
    """The machine that recorded run ``key`` of the fixture."""
    return fixture.get("machines", {}).get(key, fixture.get("machine"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("algorithms", nargs="*", help="default: every conf/algorithm config")
    ap.add_argument("--write", action="store_true", help=f"(re)write {os.path.relpath(FIXTURE, REPO)}")
    a = ap.parse_args(argv)
    names = a.algorithms or algorithms()
    old = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {"runs": {}}
    here = machine()
    new = {
        "machine": old.get("machine", here),
        "machines": dict(old.get("machines", {})),
        "common": COMMON,
        "runs": dict(old.get("runs", {})),
    }
    changed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for precision in PRECISIONS:
                key = f"{name}/{precision}"
                try:
                    got = record(name, precision, Path(tmp))
                except Exception as e:  # say which, go on: one pass shows every config that cannot run here
                    print(f"{key}: FAILED {type(e).__name__}: {e}", flush=True)
                    failed += 1
                    continue
                d = diff(old["runs"][key], got) if key in old["runs"] else ["(not in the fixture)"]
                changed += bool(d)
                print(f"{key}: {'identical' if not d else f'{len(d)} differences, e.g. ' + d[0]}", flush=True)
                new["runs"][key] = got
                new["machines"][key] = here
    if a.write:
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(json.dumps(new, indent=0, sort_keys=True) + "\n")
        print(f"wrote {os.path.relpath(FIXTURE, REPO)} ({len(new['runs'])} runs, machine: {new['machine']})")
    return 1 if failed or (changed and not a.write) else 0


if __name__ == "__main__":
    sys.exit(main())
