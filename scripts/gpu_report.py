"""The report a device script writes as it goes (scripts/gpu_check.py, scripts/device_bench.py): every line to the
console and to ``report.txt``, every measurement to a JSON file rewritten after each one (a killed run keeps what it
had), and each section's planned vs taken time; this machine's paths written as placeholders in both, so that what
comes back can be committed as it is (docs/results/gpu/)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def machine_paths(out: Path | None) -> list[tuple[re.Pattern, str]]:
    """(this machine's path, its placeholder), the longest path first (an out dir under the temporary dir is $OUT):
    the out dir ``$OUT``, the data ``$FEDBENCH_DATA``, the repository ``<repo>``, the temporary dir ``<tmp>``, the
    home dir ``~``; each as given and without links (/tmp -> /private/tmp)."""
    named = [(out, "$OUT")] if out is not None else []
    named += [(REPO, "<repo>"), (Path(tempfile.gettempdir()), "<tmp>"), (Path.home(), "~")]
    if os.environ.get("FEDBENCH_DATA"):
        named.append((Path(os.environ["FEDBENCH_DATA"]), "$FEDBENCH_DATA"))
    pairs: dict[str, str] = {}
    for path, name in named:
        for spelling in (str(path.absolute()), str(path.resolve())):
            if spelling != "/":
                pairs.setdefault(spelling, name)
    ordered = sorted(pairs.items(), key=lambda pair: -len(pair[0]))
    return [(re.compile(re.escape(path) + r"(?![\w.-])"), name) for path, name in ordered]


def placeholders(text: str, paths: list[tuple[re.Pattern, str]]) -> str:
    """``text`` with the paths of :func:`machine_paths` as their placeholders (a project file holds no machine path)."""
    for pattern, name in paths:
        text = pattern.sub(lambda _, name=name: name, text)
    return text


class Report:
    """Lines to the console and report.txt as they come; measurements to bench.json after each one."""

    json_name = "bench.json"

    def __init__(self, out: Path | None, budget: float):
        """``out`` None (a ``--plan``, which runs nothing): the lines go to the console only, no file is written."""
        self.out = out
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        self.txt = (out / "report.txt").open("a", buffering=1) if out is not None else None
        self.data: dict = {"sections": {}, "failed": []}
        self.t0, self.budget = time.monotonic(), budget
        self.paths = machine_paths(out)

    def say(self, line: str = "") -> None:
        line = placeholders(line, self.paths)
        print(line, flush=True)
        if self.txt is not None:
            self.txt.write(line + "\n")

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        if not ok:
            self.data["failed"].append(name)
        self.say(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}")
        self.save()
        return ok

    def put(self, section: str, key: str, value) -> None:
        self.data["sections"].setdefault(section, {})[key] = value
        self.save()

    def save(self) -> None:
        if self.out is None:
            return
        tmp = self.out / f"{self.json_name}.tmp"
        tmp.write_text(placeholders(json.dumps(self.data, indent=1, default=str), self.paths))
        tmp.replace(self.out / self.json_name)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed()

    @contextlib.contextmanager
    def section(self, title: str, planned: str, est_s: float):
        """A section: its plan first; an exception is a FAIL with its traceback's tail, and the next section runs."""
        self.say("")
        self.say(f"== {title}  [planned: {planned}; est. {est_s:.0f} s; {self.elapsed():.0f} s elapsed]")
        tic = time.monotonic()
        try:
            yield
        except Exception as e:  # noqa: BLE001  (a section's failure is reported, the others still run)
            tail = "".join(traceback.format_exception(e)[-6:]).rstrip()
            self.check(f"{title}: completed", False, f"{type(e).__name__}: {e}\n{tail}")
        took = time.monotonic() - tic
        self.say(f"-- {title}: took {took:.1f} s (est. {est_s:.0f} s)")
        self.put("time", title, {"est_s": round(est_s, 1), "took_s": round(took, 1)})


if __name__ == "__main__":  # a filter, stdin to stdout, for console.txt (scripts/gpu_check.sh, scripts/device_run.sh)
    import sys

    sys.stdin.reconfigure(errors="replace")
    paths = machine_paths(Path(sys.argv[1]))
    for line in sys.stdin:
        sys.stdout.write(placeholders(line, paths))
        sys.stdout.flush()
