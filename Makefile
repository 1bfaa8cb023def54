# Two commands a new user needs (README): `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export WANDB_SILENT := true

.PHONY: setup demo test lint format bench gpu-check clean

$(BIN)/fedbench: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(BIN)/fedbench

demo: setup   ## a default federation on the embedded digits data (no download)
	$(BIN)/fedbench rounds=20

test: lint   ## the linter, then the whole test suite
	$(BIN)/python -m pytest -q -n 2   # two workers: the suite takes about half the time on 2 cores

lint: setup   ## ruff: lint and format check (line length 120, pyproject.toml)
	$(BIN)/ruff check fedbench tests scripts
	$(BIN)/ruff format --check fedbench tests scripts

format: setup   ## ruff: fix what it can, then format
	$(BIN)/ruff check --fix fedbench tests scripts
	$(BIN)/ruff format fedbench tests scripts

bench: setup  ## executor throughput and fraction of the machine's FLOP bound
	$(BIN)/python scripts/bench.py

gpu-check: setup  ## on a GPU machine: equality, syncs, numerics, benchmark, memory -> one report file
	bash scripts/gpu_check.sh

clean:
	rm -rf outputs .cache .pytest_cache
