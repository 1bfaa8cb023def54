"""docs/extending.md's FedProx example is real code: executed as written, it registers `my_fedprox`, which gives
exactly the numbers of the built-in `fedprox` (fp64, two rounds) — the example once computed μ/4 instead of μ/2."""

from __future__ import annotations

import re

from conftest import REPO, make_cfg

from fedbench.algorithms import ALGORITHMS
from fedbench.run import Run


def _docs_example() -> type:
    text = (REPO / "docs" / "extending.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    ALGORITHMS.pop("my_fedprox", None)
    exec(compile(code, "docs/extending.md", "exec"), {"__name__": "docs_extending_example"})
    return ALGORITHMS["my_fedprox"]


def test_the_docs_fedprox_example_runs_and_equals_fedprox(tmp_path):
    cls = _docs_example()
    assert cls.__name__ == "MyFedProx" and "round" not in vars(cls)  # FedAvg's hooks, no copied round
    out = {}
    for name in ("fedprox", "my_fedprox"):  # μ = 0.3: large enough that μ/4 or 2μ would change the numbers
        cfg = make_cfg(
            "algorithm=fedprox",
            f"algorithm.name={name}",
            "algorithm.mu=0.3",
            "hardware.precision=fp64",
            "rounds=2",
            "lr=0.1",
        )
        out[name] = Run(cfg, tmp_path / name).execute()
    assert out["my_fedprox"]["metrics"] == out["fedprox"]["metrics"]
    assert out["fedprox"]["metrics"]["pers/acc"]["best"] > 0.2  # it learned (chance 0.1)
