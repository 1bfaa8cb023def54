"""Golden runs (issue 22's regression net): every algorithm config, 2 rounds on the embedded digits with the BatchNorm
tiny CNN, fp64 and fp32, logs exactly the numbers recorded in tests/golden/runs.json — every metrics.jsonl row and
the summary. On the machine that recorded them (same CPU and torch) every number must be bit-identical, so a
refactor that changes one number fails here. On another machine BLAS kernels may sum in another order: fp64 is then
compared to 1e-7 (relative) and fp32 is not compared. `python scripts/golden.py` prints the differences;
`--write` records the file again (only for a change meant to change numbers)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import REPO

_spec = importlib.util.spec_from_file_location("golden", REPO / "scripts" / "golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)
FIXTURE = json.loads(golden.FIXTURE.read_text()) if golden.FIXTURE.exists() else {"runs": {}}
HERE = golden.machine()


def test_every_algorithm_config_has_golden_runs():
    recorded = {k.split("/")[0] for k in FIXTURE["runs"]}
    missing = sorted(set(golden.algorithms()) - recorded)
    assert not missing, f"no golden runs for {missing}: python scripts/golden.py --write {' '.join(missing)}"


@pytest.mark.parametrize("algorithm", golden.algorithms())
def test_golden_runs_are_reproduced(tmp_path, algorithm):
    for precision in golden.PRECISIONS:
        want = FIXTURE["runs"].get(f"{algorithm}/{precision}")
        if want is None:
            pytest.fail(f"{algorithm}/{precision} is not in {golden.FIXTURE.name}")
        same_machine = golden.recorded_on(FIXTURE, f"{algorithm}/{precision}") == HERE
        if not same_machine and precision != "fp64":
            continue
        got = golden.record(algorithm, precision, tmp_path)
        problems = golden.diff(want, got, rel=0.0 if same_machine else 1e-7)
        assert not problems, f"{algorithm}/{precision}: {len(problems)} numbers differ, e.g. {problems[:3]}"
        assert any(k.endswith("/acc") for k in got["metrics"]), "no accuracy logged"


def test_runs_added_on_another_machine_are_marked_as_made_there(tmp_path, monkeypatch):
    """`--write <new method>` on machine B keeps the file's machine (A) for the other runs and records B for the new
    ones, so each run is compared bit for bit only where it was made."""
    fixture = tmp_path / "runs.json"
    fixture.write_text(json.dumps({"machine": "machine A", "runs": {"fedprox/fp64": {"metrics": {}}}}))
    monkeypatch.setattr(golden, "FIXTURE", fixture)
    monkeypatch.setattr(golden, "PRECISIONS", ("fp64",))
    assert golden.main(["--write", "fedavg"]) == 0
    written = json.loads(fixture.read_text())
    assert written["machine"] == "machine A" and set(written["runs"]) == {"fedprox/fp64", "fedavg/fp64"}
    assert golden.recorded_on(written, "fedavg/fp64") == HERE != "machine A"
    assert golden.recorded_on(written, "fedprox/fp64") == "machine A"
